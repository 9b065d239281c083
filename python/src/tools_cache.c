/*
 * _warm_cache: fetches objects into the cache tiers (sf_warm), with
 * progress and cancel callbacks, and reports what failed or, in a dry run,
 * what would be fetched. Shared helpers in tools.h.
 */
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ warm_cache */

/* Objects that failed or that a dry run would fetch, collected without the
 * GIL (on_object). */
struct warm_rec {
    char *url;
    char *msg;
    sf_status status;
};

struct warm_ctx {
    struct pycb cb;
    struct warm_rec *failed, *planned;
    size_t n_failed, n_planned, cap_failed, cap_planned;
    int oom;
};

static void warm_progress_cb(void *user, const struct sf_warm_stats *s)
{
    struct warm_ctx *w = user;
    w->cb.last.warm = *s;
    w->cb.pending = 1;
    (void)sfpy_cb_poll(&w->cb);
}

static int warm_cancel_cb(void *user)
{
    struct warm_ctx *w = user;
    return sfpy_cb_poll(&w->cb);
}

static void rec_add(struct warm_rec **v, size_t *n, size_t *cap, int *oom, const char *url,
                    const char *msg, sf_status st)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        struct warm_rec *nv = realloc(*v, nc * sizeof(*nv));
        if (!nv) {
            *oom = 1;
            return;
        }
        *v = nv;
        *cap = nc;
    }
    struct warm_rec *r = &(*v)[*n];
    r->url = strdup(url ? url : "");
    r->msg = strdup(msg ? msg : "");
    r->status = st;
    if (!r->url || !r->msg) {
        free(r->url);
        free(r->msg);
        *oom = 1;
        return;
    }
    (*n)++;
}

static void warm_object_cb(void *user, const struct sf_object_info *obj,
                           enum sf_warm_outcome outcome, sf_status status, const char *msg)
{
    struct warm_ctx *w = user;
    if (outcome == SF_WARM_FAILED)
        rec_add(&w->failed, &w->n_failed, &w->cap_failed, &w->oom, obj->url, msg, status);
    else if (outcome == SF_WARM_WOULD_FETCH)
        rec_add(&w->planned, &w->n_planned, &w->cap_planned, &w->oom, obj->url, "", SF_OK);
}

static void recs_free(struct warm_rec *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].url);
        free(v[i].msg);
    }
    free(v);
}

/* The warm stats as a dict, with cache_dir, failures and (dry run)
 * would_fetch. */
static PyObject *warm_result(struct warm_ctx *w, const struct sf_warm_stats *s,
                             const char *cache_dir, int dry_run)
{
    w->cb.last.warm = *s;
    PyObject *d = sfpy_snapshot_dict(&w->cb);
    if (!d)
        return NULL;
    PyObject *failures = PyList_New(0);
    if (!failures || sfpy_set_str(d, "cache_dir", cache_dir) < 0) {
        Py_XDECREF(failures);
        Py_DECREF(d);
        return NULL;
    }
    for (size_t i = 0; i < w->n_failed; i++) {
        PyObject *f = PyDict_New();
        if (!f || sfpy_set_str(f, "url", w->failed[i].url) < 0 ||
            sfpy_set_str(f, "status", sf_status_name(w->failed[i].status)) < 0 ||
            sfpy_set_str(f, "message", w->failed[i].msg) < 0 || PyList_Append(failures, f) < 0) {
            Py_XDECREF(f);
            Py_DECREF(failures);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(f);
    }
    if (sfpy_set_item(d, "failures", failures) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    if (dry_run) {
        PyObject *planned = PyList_New(0);
        for (size_t i = 0; planned && i < w->n_planned; i++) {
            PyObject *u = PyUnicode_DecodeUTF8(w->planned[i].url,
                                               (Py_ssize_t)strlen(w->planned[i].url), "replace");
            if (!u || PyList_Append(planned, u) < 0) {
                Py_XDECREF(u);
                Py_CLEAR(planned);
                break;
            }
            Py_DECREF(u);
        }
        if (sfpy_set_item(d, "would_fetch", planned) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* Raises the warm failure st: the first failed object's message and how
 * many failed; the exception's .stats is the result dict. */
static PyObject *raise_warm(struct warm_ctx *w, sf_status st, const char *cache_msg,
                            PyObject *stats)
{
    char msg[1400];
    const char *first = w->n_failed && w->failed[0].msg[0] ? w->failed[0].msg : cache_msg;
    if (w->n_failed > 1)
        snprintf(msg, sizeof(msg), "%.1100s (%zu objects failed; see .stats['failures'])", first,
                 w->n_failed);
    else
        snprintf(msg, sizeof(msg), "%.1100s", first);
    sfpy_raise(st, msg);
    if (stats) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (ev && PyObject_SetAttrString(ev, "stats", stats) < 0)
            PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
    return NULL;
}

/* _warm_cache(sources, options_json, verify, dry_run, max_objects, progress) -> dict */
PyObject *sfpy_warm_cache(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *sources, *max_obj, *progress;
    const char *json;
    int verify, dry_run;
    if (!PyArg_ParseTuple(args, "OsppOO:_warm_cache", &sources, &json, &verify, &dry_run, &max_obj,
                          &progress))
        return NULL;
    unsigned long long max_objects = 0;
    if (max_obj != Py_None && sfpy_get_uint(max_obj, "warm_cache", "max_objects", 1,
                                            SF_WARM_MAX_OBJECTS_MAX, &max_objects) < 0)
        return NULL;
    if (sfpy_cb_check(progress, "warm_cache") < 0)
        return NULL;
    struct strv src;
    struct sf_loader_options lo;
    void *keep;
    if (sfpy_sources_options(sources, json, "warm_cache", &src, &lo, &keep) < 0)
        return NULL;
    if (!lo.cache.dir || !lo.cache.dir[0]) {
        sfpy_strv_clear(&src);
        sf_loader_options_free_json(keep);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT,
                          "warm_cache: cache_dir: expected the cache directory the loaders use");
    }
    struct sf_s3 *s3 = sfpy_open_client(&lo);
    struct sf_cache *cache = NULL;
    struct sf_object_info *objs = NULL;
    size_t n = 0, cap = 0;
    PyObject *out = NULL;
    char err[1024] = "";
    sf_status st = SF_OK;
    if (!s3)
        goto done;
    Py_BEGIN_ALLOW_THREADS st = sf_cache_new(&lo.cache, &cache, err, sizeof(err));
    Py_END_ALLOW_THREADS if (st != SF_OK)
    {
        char msg[1200];
        snprintf(msg, sizeof(msg), "cache %.100s: %.1000s", lo.cache.dir,
                 err[0] ? err : sf_status_str(st));
        sfpy_raise(st, msg);
        goto done;
    }

    /* Every source into one list of objects (as `shardfeed warm-cache`). */
    for (size_t a = 0; a < src.n; a++) {
        struct sf_object_list *l = NULL;
        Py_BEGIN_ALLOW_THREADS st = sf_s3_expand(s3, src.v[a], 0, &l);
        Py_END_ALLOW_THREADS if (st != SF_OK)
        {
            sfpy_raise_s3(s3, st);
            goto done;
        }
        size_t k = sf_object_list_count(l);
        if (n + k > cap) {
            size_t nc = (n + k) * 2;
            struct sf_object_info *v = realloc(objs, nc * sizeof(*v));
            if (!v) {
                sf_object_list_destroy(l);
                PyErr_NoMemory();
                goto done;
            }
            objs = v;
            cap = nc;
        }
        for (size_t i = 0; i < k; i++) {
            const struct sf_object_info *in = sf_object_list_get(l, i);
            if (!sf_warm_wants(src.v[a], in))
                continue; /* a prefix, or index.json beside the shards */
            objs[n] = *in;
            objs[n].url = strdup(in->url);
            objs[n].key = strdup(in->key ? in->key : "");
            if (!objs[n].url || !objs[n].key) {
                sf_object_info_clear(&objs[n]);
                sf_object_list_destroy(l);
                PyErr_NoMemory();
                goto done;
            }
            n++;
        }
        sf_object_list_destroy(l);
        if (PyErr_CheckSignals() < 0 || sfpy_log_drain() < 0)
            goto done;
    }
    if (n == 0) {
        char msg[600];
        snprintf(msg, sizeof(msg), "warm_cache: no objects match %.500s", src.v[0]);
        sfpy_raise(SF_ERR_NOT_FOUND, msg);
        goto done;
    }

    struct warm_ctx w;
    memset(&w, 0, sizeof(w));
    sfpy_cb_init(&w.cb, progress, CB_WARM);
    struct sf_warm_options wo;
    sf_warm_options_init_default(&wo);
    if (max_objects)
        wo.max_objects = (unsigned)max_objects;
    wo.verify = verify;
    wo.dry_run = dry_run;
    wo.progress = warm_progress_cb;
    wo.progress_interval_ms = (unsigned)(PROGRESS_S * 1000);
    wo.on_object = warm_object_cb;
    wo.cancel = warm_cancel_cb;
    wo.user = &w;
    struct sf_warm_stats s;
    memset(&s, 0, sizeof(s));
    Py_BEGIN_ALLOW_THREADS st = sf_cache_warm(cache, s3, objs, n, &wo, &s);
    Py_END_ALLOW_THREADS if (sfpy_cb_finish(&w.cb, st == SF_OK) == 0)
    {
        if (w.oom) {
            PyErr_NoMemory();
        } else {
            out = warm_result(&w, &s, sf_cache_dir(cache), dry_run);
            if (out && st != SF_OK) {
                char cmsg[1024];
                sf_cache_errmsg(cache, cmsg, sizeof(cmsg));
                raise_warm(&w, st, cmsg, out);
                Py_CLEAR(out);
            }
        }
    }
    recs_free(w.failed, w.n_failed);
    recs_free(w.planned, w.n_planned);

done:
    for (size_t i = 0; i < n; i++)
        sf_object_info_clear(&objs[i]);
    free(objs);
    sf_cache_destroy(cache);
    sf_s3_destroy(s3);
    if (sfpy_sources_options_free(&src, keep) < 0)
        Py_CLEAR(out);
    return out;
}
