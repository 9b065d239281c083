/*
 * Module-level tools: ls, stat, warm_cache, pack, index (the private
 * functions _ls, _stat, _warm_cache, _pack and _index; shardfeed/_tools.py
 * gives them their documented keyword signatures).
 *
 * S3 options arrive as a JSON object text and are read by the loader's JSON
 * option parser, so their names, checks and messages are the loader's.
 *
 * Every blocking library call runs with the GIL released. The library calls
 * progress (and, for warm, cancel) on the thread that called it; those
 * callbacks take the GIL back (PyGILState_Ensure) at most every CHECK_S to
 * check for signals (Ctrl-C) and hand queued log lines over, and every
 * PROGRESS_S to call the user's progress callable. An exception from either
 * cancels the call (the callback answers nonzero) and is raised when it has
 * returned.
 */
#include "sfpy.h"
#include "shardfeed_cache.h"
#include "shardfeed_pack.h"
#include "common/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_S 0.2 /* at most 5 progress calls a second (plus the last) */
#define CHECK_S    0.05

/* ------------------------------------------------------------ options */

/* Reads the S3 (and cache) options of json into *lo with the loader's
 * parser; the strings point into *keep (free with
 * sf_loader_options_free_json). Sets the log sinks. -1 with ConfigError. */
static int parse_options(const char *json, struct sf_loader_options *lo, void **keep)
{
    sf_loader_options_init_default(lo);
    *keep = NULL;
    char err[1024] = "";
    sf_status st = sf_loader_options_from_json(lo, json, keep, err, sizeof(err));
    if (st != SF_OK) {
        sf_loader_options_free_json(*keep);
        *keep = NULL;
        sfpy_raise(st, err);
        return -1;
    }
    enum sf_log_level level = sfpy_log_level();
    lo->s3.log = sfpy_log;
    lo->s3.log_level = level;
    lo->cache.log = sfpy_log;
    lo->cache.log_level = level;
    return 0;
}

/* A client for lo->s3, or NULL with the exception of the failure. */
static struct sf_s3 *open_client(const struct sf_loader_options *lo)
{
    struct sf_s3 *s3 = NULL;
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS
    st = sf_s3_new(&lo->s3, &s3, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (st != SF_OK) {
        sfpy_log_drain();
        sfpy_raise(st, err);
        return NULL;
    }
    return s3;
}

static PyObject *raise_s3(struct sf_s3 *s3, sf_status st)
{
    char msg[1024];
    sf_s3_errmsg(s3, msg, sizeof(msg));
    return sfpy_raise(st, msg);
}

/* Converts obj (an int, not a bool) into *out in [min, max]; -1 with
 * ConfigError naming the argument otherwise. */
static int get_uint(PyObject *obj, const char *fn, const char *name, unsigned long long min,
                    unsigned long long max, unsigned long long *out)
{
    char msg[256];
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        snprintf(msg, sizeof(msg), "%s: %s: expected an integer from %llu to %llu", fn, name, min,
                 max);
        sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0 || (unsigned long long)v < min || (unsigned long long)v > max) {
        snprintf(msg, sizeof(msg), "%s: %s: expected an integer from %llu to %llu", fn, name, min,
                 max);
        sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
        return -1;
    }
    *out = (unsigned long long)v;
    return 0;
}

/* A byte size: an int or a string such as "8M" (sf_parse_bytes), at least min. */
static int get_size(PyObject *obj, const char *fn, const char *name, unsigned long long min,
                    unsigned long long *out)
{
    if (PyUnicode_Check(obj)) {
        PyObject *b = PyUnicode_AsUTF8String(obj);
        if (!b)
            return -1;
        const char *s = PyBytes_AsString(b);
        unsigned long long v = 0;
        int ok = s && sf_parse_bytes(s, &v) == SF_OK && v >= min;
        if (ok) {
            *out = v;
            Py_DECREF(b);
            return 0;
        }
        char msg[320];
        snprintf(msg, sizeof(msg),
                 "%s: %s: expected a size of at least %llu bytes such as 256M or 8MiB, got "
                 "'%.64s'",
                 fn, name, min, s ? s : "");
        Py_DECREF(b);
        sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
        return -1;
    }
    return get_uint(obj, fn, name, min, ULLONG_MAX >> 1, out);
}

/* A list of str as C strings; the UTF-8 bytes are kept by list. */
struct strv {
    PyObject *list;
    const char **v;
    size_t n;
};

static int strv_from(PyObject *obj, const char *fn, struct strv *out)
{
    memset(out, 0, sizeof(*out));
    out->list = PySequence_List(obj);
    if (!out->list)
        return -1;
    Py_ssize_t n = PyList_Size(out->list);
    out->v = calloc((size_t)n + 1, sizeof(*out->v));
    if (!out->v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(out->list, i); /* borrowed */
        if (!item || !PyUnicode_Check(item)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "%s: sources[%zd] is not a str", fn, i);
            sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
            return -1;
        }
        PyObject *utf8 = PyUnicode_AsUTF8String(item);
        if (!utf8 || PyList_SetItem(out->list, i, utf8) < 0) /* steals utf8 */
            return -1;
        out->v[i] = PyBytes_AsString(utf8);
        if (!out->v[i])
            return -1;
        if (strlen(out->v[i]) != (size_t)PyBytes_Size(utf8)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "%s: sources[%zd] holds a NUL character", fn, i);
            sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
            return -1;
        }
        out->n++;
    }
    if (out->n == 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%s: no sources: give s3:// URLs, patterns, prefixes or paths",
                 fn);
        sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
        return -1;
    }
    return 0;
}

static void strv_clear(struct strv *s)
{
    free(s->v);
    Py_XDECREF(s->list);
    memset(s, 0, sizeof(*s));
}

/* ------------------------------------------------------------ dicts */

static int set_item(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

static int set_u64(PyObject *d, const char *key, unsigned long long v)
{
    return set_item(d, key, PyLong_FromUnsignedLongLong(v));
}

static int set_str(PyObject *d, const char *key, const char *s)
{
    if (!s) {
        Py_INCREF(Py_None);
        return set_item(d, key, Py_None);
    }
    return set_item(d, key, PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace"));
}

/* {"url", "key", "size", "etag", "last_modified", "is_prefix"}: None where
 * unknown; last_modified in seconds since the epoch. */
static PyObject *info_dict(const struct sf_object_info *in)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int known = !in->is_prefix;
    if (set_str(d, "url", in->url) < 0 || set_str(d, "key", in->key ? in->key : "") < 0 ||
        (known && in->size != SF_SIZE_UNKNOWN ? set_u64(d, "size", in->size)
                                              : set_str(d, "size", NULL)) < 0 ||
        set_str(d, "etag", known && in->etag[0] ? in->etag : NULL) < 0 ||
        (known && in->last_modified > 0
             ? set_item(d, "last_modified", PyLong_FromLongLong(in->last_modified))
             : set_str(d, "last_modified", NULL)) < 0 ||
        set_item(d, "is_prefix", PyBool_FromLong(in->is_prefix)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *list_of(const struct sf_object_list *l)
{
    size_t n = sf_object_list_count(l);
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *d = info_dict(sf_object_list_get(l, i));
        if (!d || PyList_Append(out, d) < 0) {
            Py_XDECREF(d);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(d);
    }
    return out;
}

/* ------------------------------------------------------------ callbacks */

enum cb_kind { CB_PACK, CB_INDEX, CB_WARM };

/* State of the callbacks of one blocking call, on the calling thread. */
struct pycb {
    PyObject *progress; /* the user's callable, borrowed; NULL = none */
    enum cb_kind kind;
    union {
        struct sf_pack_progress pack;
        struct sf_index_progress index;
        struct sf_warm_stats warm;
    } last;                 /* the newest snapshot */
    int pending;            /* last not handed to progress yet */
    double next_call_s;     /* earliest time of the next progress call */
    double next_check_s;    /* earliest time of the next signal check */
    int stop;               /* an exception is saved: cancel */
    PyObject *et, *ev, *tb; /* that exception */
};

static void cb_init(struct pycb *cb, PyObject *progress, enum cb_kind kind)
{
    memset(cb, 0, sizeof(*cb));
    cb->progress = progress && progress != Py_None ? progress : NULL;
    cb->kind = kind;
}

static PyObject *snapshot_dict(const struct pycb *cb)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int rc = 0;
    switch (cb->kind) {
    case CB_PACK: {
        const struct sf_pack_progress *p = &cb->last.pack;
        rc = set_u64(d, "bytes_done", p->bytes_done) || set_u64(d, "bytes_total", p->bytes_total) ||
             set_u64(d, "files_done", p->files_done) || set_u64(d, "files_total", p->files_total) ||
             set_u64(d, "shards_done", p->shards_done);
        break;
    }
    case CB_INDEX: {
        const struct sf_index_progress *p = &cb->last.index;
        rc = set_u64(d, "shards_done", p->shards_done) ||
             set_u64(d, "shards_total", p->shards_total) ||
             set_u64(d, "bytes_done", p->bytes_done) || set_u64(d, "bytes_total", p->bytes_total);
        break;
    }
    case CB_WARM: {
        const struct sf_warm_stats *s = &cb->last.warm;
        rc = set_u64(d, "objects_total", s->objects_total) ||
             set_u64(d, "objects_done", s->objects_done) || set_u64(d, "fetched", s->fetched) ||
             set_u64(d, "cached", s->cached) || set_u64(d, "peer", s->peer) ||
             set_u64(d, "failed", s->failed) || set_u64(d, "bytes_total", s->bytes_total) ||
             set_u64(d, "bytes_to_fetch", s->bytes_to_fetch) ||
             set_u64(d, "bytes_fetched", s->bytes_fetched) ||
             set_item(d, "elapsed_s", PyFloat_FromDouble(s->elapsed_s));
        break;
    }
    }
    if (rc) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Calls the user's progress with the newest snapshot (GIL held). */
static int cb_call(struct pycb *cb)
{
    cb->pending = 0;
    PyObject *d = snapshot_dict(cb);
    if (!d)
        return -1;
    PyObject *r = PyObject_CallFunctionObjArgs(cb->progress, d, NULL);
    Py_DECREF(d);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* From a library callback, without the GIL: checks for signals and hands
 * log lines over (every CHECK_S), calls progress (every PROGRESS_S when a
 * new snapshot is pending). Returns 1 when the call must stop. */
static int cb_poll(struct pycb *cb)
{
    if (cb->stop)
        return 1;
    double now = sf__now_s();
    int check = now >= cb->next_check_s;
    int call = cb->progress && cb->pending && now >= cb->next_call_s;
    if (!check && !call)
        return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    if (check) {
        cb->next_check_s = now + CHECK_S;
        rc = PyErr_CheckSignals();
        if (rc == 0)
            rc = sfpy_log_drain();
    }
    if (rc == 0 && call) {
        cb->next_call_s = now + PROGRESS_S;
        rc = cb_call(cb);
    }
    if (rc < 0) {
        PyErr_Fetch(&cb->et, &cb->ev, &cb->tb);
        cb->stop = 1;
    }
    PyGILState_Release(g);
    return cb->stop;
}

/* After the call returned (GIL held): on success the last snapshot goes to
 * progress when it has not yet. Returns -1 with an exception set when the
 * callbacks stopped the call (their exception) or the last call raised. */
static int cb_finish(struct pycb *cb, int succeeded)
{
    if (cb->stop) {
        PyErr_Restore(cb->et, cb->ev, cb->tb);
        cb->et = cb->ev = cb->tb = NULL;
        return -1;
    }
    if (sfpy_log_drain() < 0)
        return -1;
    if (succeeded && cb->progress && cb->pending)
        return cb_call(cb);
    return 0;
}

static int pack_progress_cb(void *user, const struct sf_pack_progress *p)
{
    struct pycb *cb = user;
    cb->last.pack = *p;
    cb->pending = 1;
    return cb_poll(cb);
}

static int index_progress_cb(void *user, const struct sf_index_progress *p)
{
    struct pycb *cb = user;
    cb->last.index = *p;
    cb->pending = 1;
    return cb_poll(cb);
}

/* ------------------------------------------------------------ ls, stat */

/* 1 when url holds a brace pattern ("{a,b}", "{0..9}") or a brace syntax
 * error the library's expansion would name; "{x}" alone is literal (as
 * `shardfeed ls` decides). */
static int is_pattern(const char *url)
{
    for (const char *s = url; *s; s++) {
        if (*s == '}')
            return 1;
        if (*s != '{')
            continue;
        const char *e = s + 1;
        while (*e && *e != '}' && *e != '{')
            e++;
        if (*e != '}')
            return 1;
        for (const char *x = s + 1; x < e; x++)
            if (*x == ',' || (x[0] == '.' && x[1] == '.' && x + 1 < e))
                return 1;
        s = e;
    }
    return 0;
}

/* _ls(url, recursive, options_json) -> list of dict */
static PyObject *py_ls(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url, *json;
    int recursive;
    if (!PyArg_ParseTuple(args, "sps:_ls", &url, &recursive, &json))
        return NULL;
    struct sf_loader_options lo;
    void *keep;
    if (parse_options(json, &lo, &keep) < 0)
        return NULL;
    struct sf_s3 *s3 = open_client(&lo);
    if (!s3) {
        sf_loader_options_free_json(keep);
        return NULL;
    }
    struct sf_object_list *l = NULL;
    sf_status st;
    int pattern = is_pattern(url);
    Py_BEGIN_ALLOW_THREADS
    /* a pattern lists the objects it names, each checked to exist */
    st = pattern ? sf_s3_expand_stat(s3, url, 0, &l)
                 : sf_s3_list(s3, url, recursive ? SF_LIST_RECURSIVE : 0, 0, &l);
    Py_END_ALLOW_THREADS
    PyObject *out = st == SF_OK ? list_of(l) : raise_s3(s3, st);
    sf_object_list_destroy(l);
    sf_s3_destroy(s3);
    sf_loader_options_free_json(keep);
    if (sfpy_log_drain() < 0)
        Py_CLEAR(out);
    return out;
}

/* _stat(url, options_json) -> dict */
static PyObject *py_stat(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url, *json;
    if (!PyArg_ParseTuple(args, "ss:_stat", &url, &json))
        return NULL;
    if (is_pattern(url)) {
        char msg[512];
        snprintf(msg, sizeof(msg),
                 "stat: '%.400s' is a brace pattern: shardfeed.ls() gives every object it names",
                 url);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
    }
    struct sf_loader_options lo;
    void *keep;
    if (parse_options(json, &lo, &keep) < 0)
        return NULL;
    struct sf_s3 *s3 = open_client(&lo);
    if (!s3) {
        sf_loader_options_free_json(keep);
        return NULL;
    }
    struct sf_object_info in;
    memset(&in, 0, sizeof(in));
    sf_status st;
    Py_BEGIN_ALLOW_THREADS
    st = sf_s3_stat(s3, url, &in);
    Py_END_ALLOW_THREADS
    PyObject *out = st == SF_OK ? info_dict(&in) : raise_s3(s3, st);
    sf_object_info_clear(&in);
    sf_s3_destroy(s3);
    sf_loader_options_free_json(keep);
    if (sfpy_log_drain() < 0)
        Py_CLEAR(out);
    return out;
}

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
    (void)cb_poll(&w->cb);
}

static int warm_cancel_cb(void *user)
{
    struct warm_ctx *w = user;
    return cb_poll(&w->cb);
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
    PyObject *d = snapshot_dict(&w->cb);
    if (!d)
        return NULL;
    PyObject *failures = PyList_New(0);
    if (!failures || set_str(d, "cache_dir", cache_dir) < 0) {
        Py_XDECREF(failures);
        Py_DECREF(d);
        return NULL;
    }
    for (size_t i = 0; i < w->n_failed; i++) {
        PyObject *f = PyDict_New();
        if (!f || set_str(f, "url", w->failed[i].url) < 0 ||
            set_str(f, "status", sf_status_name(w->failed[i].status)) < 0 ||
            set_str(f, "message", w->failed[i].msg) < 0 || PyList_Append(failures, f) < 0) {
            Py_XDECREF(f);
            Py_DECREF(failures);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(f);
    }
    if (set_item(d, "failures", failures) < 0) {
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
        if (set_item(d, "would_fetch", planned) < 0) {
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
static PyObject *py_warm_cache(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *sources, *max_obj, *progress;
    const char *json;
    int verify, dry_run;
    if (!PyArg_ParseTuple(args, "OsppOO:_warm_cache", &sources, &json, &verify, &dry_run, &max_obj,
                          &progress))
        return NULL;
    unsigned long long max_objects = 0;
    if (max_obj != Py_None &&
        get_uint(max_obj, "warm_cache", "max_objects", 1, 256, &max_objects) < 0)
        return NULL;
    if (progress != Py_None && !PyCallable_Check(progress))
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, "warm_cache: progress: expected a callable");
    struct strv src;
    if (strv_from(sources, "warm_cache", &src) < 0) {
        strv_clear(&src);
        return NULL;
    }
    struct sf_loader_options lo;
    void *keep;
    if (parse_options(json, &lo, &keep) < 0) {
        strv_clear(&src);
        return NULL;
    }
    if (!lo.cache.dir || !lo.cache.dir[0]) {
        strv_clear(&src);
        sf_loader_options_free_json(keep);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT,
                          "warm_cache: cache_dir: expected the cache directory the loaders use");
    }
    struct sf_s3 *s3 = open_client(&lo);
    struct sf_cache *cache = NULL;
    struct sf_object_info *objs = NULL;
    size_t n = 0, cap = 0;
    PyObject *out = NULL;
    char err[1024] = "";
    sf_status st = SF_OK;
    if (!s3)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    st = sf_cache_new(&lo.cache, &cache, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (st != SF_OK) {
        char msg[1200];
        snprintf(msg, sizeof(msg), "cache %.100s: %.1000s", lo.cache.dir,
                 err[0] ? err : sf_status_str(st));
        sfpy_raise(st, msg);
        goto done;
    }

    /* Every source into one list of objects (as `shardfeed warm-cache`). */
    for (size_t a = 0; a < src.n; a++) {
        struct sf_object_list *l = NULL;
        Py_BEGIN_ALLOW_THREADS
        st = sf_s3_expand(s3, src.v[a], 0, &l);
        Py_END_ALLOW_THREADS
        if (st != SF_OK) {
            raise_s3(s3, st);
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
            if (in->is_prefix)
                continue;
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
    cb_init(&w.cb, progress, CB_WARM);
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
    Py_BEGIN_ALLOW_THREADS
    st = sf_cache_warm(cache, s3, objs, n, &wo, &s);
    Py_END_ALLOW_THREADS
    if (cb_finish(&w.cb, st == SF_OK) == 0) {
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
    sf_loader_options_free_json(keep);
    strv_clear(&src);
    if (sfpy_log_drain() < 0)
        Py_CLEAR(out);
    return out;
}

/* ------------------------------------------------------------ pack */

/* _pack(src, dest, options_json, format, shard_bytes, zstd_level, name_pattern,
 *       layout, follow_symlinks, tmp_dir, progress, part_bytes) -> dict */
static PyObject *py_pack(PyObject *self, PyObject *args)
{
    (void)self;
    const char *src, *dest, *json, *format, *pattern, *layout, *tmp_dir;
    PyObject *shard_obj, *zstd_obj, *progress, *part_obj;
    int follow;
    if (!PyArg_ParseTuple(args, "ssssOOzspzOO:_pack", &src, &dest, &json, &format, &shard_obj,
                          &zstd_obj, &pattern, &layout, &follow, &tmp_dir, &progress, &part_obj))
        return NULL;
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    char msg[512];
    if (!strcmp(format, "tar"))
        o.format = SF_PACK_FORMAT_TAR;
    else if (!strcmp(format, "record"))
        o.format = SF_PACK_FORMAT_RECORD;
    else {
        snprintf(msg, sizeof(msg), "pack: format: expected 'tar' or 'record', got '%.64s'", format);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
    }
    if (!strcmp(layout, "auto"))
        o.layout = SF_PACK_LAYOUT_AUTO;
    else if (!strcmp(layout, "imagefolder"))
        o.layout = SF_PACK_LAYOUT_IMAGEFOLDER;
    else if (!strcmp(layout, "flat"))
        o.layout = SF_PACK_LAYOUT_FLAT;
    else {
        snprintf(msg, sizeof(msg),
                 "pack: layout: expected 'auto', 'imagefolder' or 'flat', got '%.64s'", layout);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
    }
    unsigned long long u;
    if (shard_obj != Py_None) {
        if (get_size(shard_obj, "pack", "shard_bytes", 1024, &u) < 0)
            return NULL;
        o.shard_bytes = u;
    }
    if (part_obj != Py_None) {
        /* sf_pack() checks the upper bound (5 GiB) and names it */
        if (get_size(part_obj, "pack", "part_size", SF_UPLOAD_PART_BYTES_MIN, &u) < 0)
            return NULL;
        o.part_bytes = u;
    }
    if (get_uint(zstd_obj, "pack", "zstd_level", 0, 22, &u) < 0)
        return NULL;
    o.zstd_level = (int)u;
    if (o.zstd_level && o.format == SF_PACK_FORMAT_TAR)
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT,
                          "pack: zstd_level compresses record shards only (readers stream plain "
                          "tar): add format='record'");
    char name[NAME_MAX + 1];
    if (pattern && sf_pack_shard_name(pattern, o.format, 0, name, sizeof(name)) != SF_OK) {
        snprintf(msg, sizeof(msg),
                 "pack: name_pattern '%.200s': expected one %%u (or %%06u, %%d) for the shard "
                 "number, %%%% for '%%', no '/', not starting with '.'",
                 pattern);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
    }
    if (progress != Py_None && !PyCallable_Check(progress))
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, "pack: progress: expected a callable");
    o.name_pattern = pattern;
    o.follow_symlinks = follow;
    o.tmp_dir = tmp_dir;

    struct sf_loader_options lo;
    void *keep;
    if (parse_options(json, &lo, &keep) < 0)
        return NULL;
    struct sf_s3 *s3 = NULL;
    if (!strncmp(dest, "s3://", 5)) {
        s3 = open_client(&lo);
        if (!s3) {
            sf_loader_options_free_json(keep);
            return NULL;
        }
        o.s3 = s3;
    }
    struct pycb cb;
    cb_init(&cb, progress, CB_PACK);
    o.progress = pack_progress_cb;
    o.progress_user = &cb;
    struct sf_pack_result res;
    memset(&res, 0, sizeof(res));
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS
    st = sf_pack(src, dest, &o, &res, err, sizeof(err));
    Py_END_ALLOW_THREADS
    sf_s3_destroy(s3);
    sf_loader_options_free_json(keep);
    if (cb_finish(&cb, st == SF_OK) < 0)
        return NULL;
    if (st != SF_OK)
        return sfpy_raise(st, err);
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (set_str(d, "format", sf_pack_format_name(res.format)) < 0 ||
        set_str(d, "layout", sf_pack_layout_name(res.layout)) < 0 ||
        set_u64(d, "shards", res.shards) < 0 || set_u64(d, "samples", res.samples) < 0 ||
        set_u64(d, "files", res.files) < 0 || set_u64(d, "source_bytes", res.source_bytes) < 0 ||
        set_u64(d, "shard_bytes", res.shard_bytes) < 0 || set_u64(d, "ignored", res.ignored) < 0 ||
        set_u64(d, "classes", res.classes) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ------------------------------------------------------------ index */

/* Writes text to a local path through a temporary file beside it, renamed
 * over it (as `shardfeed index`). Without the GIL; the failure into msg. */
static sf_status write_local(const char *url, const char *text, size_t len, char *msg, size_t n)
{
    const char *path = !strncmp(url, "file://", 7) ? url + 7 : url;
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    size_t tl = strlen(path) + 64;
    char *tmp = malloc(tl);
    if (!tmp)
        return SF_ERR_NO_MEMORY;
    snprintf(tmp, tl, "%.*s.%s.sfindex-%ld", (int)dl, path, path + dl, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(msg, n, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return errno == ENOENT ? SF_ERR_NOT_FOUND : SF_ERR_IO;
    }
    sf_status st = SF_OK;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(msg, n, "%s: write at byte %zu: %s", tmp, done,
                     w < 0 ? strerror(errno) : "no progress");
            st = SF_ERR_IO;
            break;
        }
        done += (size_t)w;
    }
    if (close(fd) != 0 && st == SF_OK) {
        snprintf(msg, n, "%s: close: %s", tmp, strerror(errno));
        st = SF_ERR_IO;
    }
    if (st == SF_OK && rename(tmp, path) != 0) {
        snprintf(msg, n, "%s: cannot rename into place: %s", path, strerror(errno));
        st = SF_ERR_IO;
    }
    if (st != SF_OK)
        unlink(tmp);
    free(tmp);
    return st;
}

static int is_http(const char *url)
{
    return !strncmp(url, "http://", 7) || !strncmp(url, "https://", 8);
}

/* _index(sources, options_json, dry_run, output, parallel, window, progress)
 *   -> (json_text, index_url) */
static PyObject *py_index(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *sources, *par_obj, *win_obj, *progress;
    const char *json, *output;
    int dry_run;
    if (!PyArg_ParseTuple(args, "OspzOOO:_index", &sources, &json, &dry_run, &output, &par_obj,
                          &win_obj, &progress))
        return NULL;
    struct sf_index_options o;
    sf_index_options_init_default(&o);
    unsigned long long u;
    if (par_obj != Py_None) {
        if (get_uint(par_obj, "index", "parallel", 1, 1024, &u) < 0)
            return NULL;
        o.parallel = (unsigned)u;
    }
    if (win_obj != Py_None) {
        if (get_size(win_obj, "index", "window", 64u << 10, &u) < 0)
            return NULL;
        if (u > (16ull << 30))
            return sfpy_raise(SF_ERR_INVALID_ARGUMENT,
                              "index: window: expected a size from 64K to 16G such as 8M");
        o.window_bytes = u;
    }
    if (output && (!*output || is_http(output))) {
        char msg[512];
        snprintf(msg, sizeof(msg),
                 "index: output: expected a local path or an s3:// URL, got '%.400s'", output);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
    }
    if (progress != Py_None && !PyCallable_Check(progress))
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, "index: progress: expected a callable");
    o.index_url = output;
    struct strv src;
    if (strv_from(sources, "index", &src) < 0) {
        strv_clear(&src);
        return NULL;
    }
    struct sf_loader_options lo;
    void *keep;
    if (parse_options(json, &lo, &keep) < 0) {
        strv_clear(&src);
        return NULL;
    }
    struct sf_s3 *s3 = open_client(&lo);
    if (!s3) {
        sf_loader_options_free_json(keep);
        strv_clear(&src);
        return NULL;
    }
    struct pycb cb;
    cb_init(&cb, progress, CB_INDEX);
    o.progress = index_progress_cb;
    o.progress_user = &cb;
    struct sf_index_result res;
    memset(&res, 0, sizeof(res));
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS
    st = sf_index_shards(s3, src.v, src.n, &o, &res, err, sizeof(err));
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (cb_finish(&cb, st == SF_OK) < 0)
        goto done;
    if (st != SF_OK) {
        sfpy_raise(st, err);
        goto done;
    }
    if (!dry_run) {
        if (!strncmp(res.index_url, "s3://", 5)) {
            Py_BEGIN_ALLOW_THREADS
            st = sf_s3_put(s3, res.index_url, NULL, res.json, res.json_len, NULL, 0);
            Py_END_ALLOW_THREADS
            if (st != SF_OK) {
                raise_s3(s3, st);
                goto done;
            }
        } else if (is_http(res.index_url)) {
            char msg[600];
            snprintf(msg, sizeof(msg),
                     "index: %.400s: cannot write over http(s); name a local path or s3:// URL "
                     "with output=, or use dry_run=True",
                     res.index_url);
            sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
            goto done;
        } else {
            char msg[1024] = "";
            Py_BEGIN_ALLOW_THREADS
            st = write_local(res.index_url, res.json, res.json_len, msg, sizeof(msg));
            Py_END_ALLOW_THREADS
            if (st != SF_OK) {
                sfpy_raise(st, msg);
                goto done;
            }
        }
    }
    out = Py_BuildValue("(s#s)", res.json, (Py_ssize_t)res.json_len, res.index_url);
done:
    sf_index_result_clear(&res);
    sf_s3_destroy(s3);
    sf_loader_options_free_json(keep);
    strv_clear(&src);
    if (sfpy_log_drain() < 0)
        Py_CLEAR(out);
    return out;
}

/* ------------------------------------------------------------ module */

/* ------------------------------------------------------------ doctor */

/* The result as a dict; "_raw" keeps the C struct for _doctor_conclude. */
static PyObject *doctor_dict(const struct sf_doctor_result *r)
{
    static const enum sf_stage stages[] = {SF_STAGE_FETCH, SF_STAGE_READ, SF_STAGE_DECODE,
                                           SF_STAGE_ASSEMBLY, SF_STAGE_DEVICE};
    PyObject *d = PyDict_New(), *st = PyDict_New();
    if (!d || !st) {
        Py_XDECREF(d);
        Py_XDECREF(st);
        return NULL;
    }
    for (size_t i = 0; i < sizeof(stages) / sizeof(stages[0]); i++) {
        PyObject *one = PyDict_New();
        if (!one || set_item(one, "samples_per_s", PyFloat_FromDouble(r->stage_per_s[stages[i]])) ||
            set_str(one, "how", r->stage_note[stages[i]]) ||
            set_item(st, sf_stage_name(stages[i]), one)) {
            Py_DECREF(st);
            Py_DECREF(d);
            return NULL;
        }
    }
#define F(f) set_item(d, #f, PyFloat_FromDouble(r->f))
#define U(f) set_u64(d, #f, (unsigned long long)r->f)
    if (set_item(d, "stages", st) || F(decode_per_thread_per_s) || U(decode_threads) ||
        U(cores) || F(fetch_mib_per_s) || F(fetch_mib_per_s_more) || U(concurrency) ||
        U(concurrency_more) || F(bytes_per_sample) || U(samples_measured) || F(step_per_s) ||
        F(max_side_speedup) || F(max_side_bytes) ||
        F(pipeline_per_s) || F(wait_share) ||
        set_str(d, "bound", r->bound == SF_STAGE_NONE ? "step" : sf_stage_name(r->bound)) ||
        set_str(d, "verdict", r->verdict) ||
        set_item(d, "_raw", PyBytes_FromStringAndSize((const char *)r, sizeof(*r)))) {
        Py_DECREF(d);
        return NULL;
    }
#undef F
#undef U
    return d;
}

/* _doctor_measure(sources, options_json, seconds) -> dict */
static PyObject *py_doctor_measure(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *sources;
    const char *json;
    double seconds;
    if (!PyArg_ParseTuple(args, "Osd:_doctor_measure", &sources, &json, &seconds))
        return NULL;
    struct strv sv;
    if (strv_from(sources, "doctor", &sv) < 0) {
        strv_clear(&sv);
        return NULL;
    }
    struct sf_loader_options lo;
    void *keep = NULL;
    if (parse_options(json, &lo, &keep) < 0) {
        strv_clear(&sv);
        return NULL;
    }
    lo.sources = sv.v;
    lo.source_count = sv.n;
    struct sf_doctor_result r;
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS
    st = sf_doctor_measure(&lo, seconds, &r, err, sizeof(err));
    Py_END_ALLOW_THREADS
    sf_loader_options_free_json(keep);
    strv_clear(&sv);
    if (sfpy_log_drain() < 0)
        return NULL;
    if (st != SF_OK) {
        sfpy_raise(st, err);
        return NULL;
    }
    return doctor_dict(&r);
}

/* _doctor_conclude(raw, step_per_s, pipeline_per_s, wait_share, data_in_cache) -> dict */
static PyObject *py_doctor_conclude(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *raw;
    double step, pipe, wait;
    int in_cache;
    if (!PyArg_ParseTuple(args, "Sdddp:_doctor_conclude", &raw, &step, &pipe, &wait, &in_cache))
        return NULL;
    struct sf_doctor_result r;
    char *buf = NULL;
    Py_ssize_t len = 0;
    if (PyBytes_AsStringAndSize(raw, &buf, &len) < 0)
        return NULL;
    if (len != (Py_ssize_t)sizeof(r)) {
        sfpy_raise(SF_ERR_INVALID_ARGUMENT, "doctor: not a result of _doctor_measure");
        return NULL;
    }
    memcpy(&r, buf, sizeof(r));
    struct sf_loader_report rep;
    memset(&rep, 0, sizeof(rep));
    rep.wait_share = wait;
    sf_doctor_conclude(&r, step, pipe, &rep, in_cache);
    return doctor_dict(&r);
}

/* _tune(sources, options_json, budget_s) -> dict (sf_tune) */
static PyObject *py_tune(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *sources;
    const char *json;
    double budget;
    if (!PyArg_ParseTuple(args, "Osd:_tune", &sources, &json, &budget))
        return NULL;
    struct strv sv;
    if (strv_from(sources, "tune", &sv) < 0) {
        strv_clear(&sv);
        return NULL;
    }
    struct sf_loader_options lo;
    void *keep = NULL;
    if (parse_options(json, &lo, &keep) < 0) {
        strv_clear(&sv);
        return NULL;
    }
    lo.sources = sv.v;
    lo.source_count = sv.n;
    struct sf_tune_result r;
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS
    st = sf_tune(&lo, budget, &r, err, sizeof(err));
    Py_END_ALLOW_THREADS
    sf_loader_options_free_json(keep);
    strv_clear(&sv);
    if (sfpy_log_drain() < 0)
        return NULL;
    if (st != SF_OK) {
        sfpy_raise(st, err);
        return NULL;
    }
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
#define F(f) set_item(d, #f, PyFloat_FromDouble(r.f))
#define U(f) set_u64(d, #f, (unsigned long long)r.f)
    if (set_str(d, "config_json", r.config_json) || U(decode_threads) || U(concurrency) ||
        U(chunk_bytes) || U(prefetch_shards) || U(prefetch_batches) || F(decode_per_s) ||
        F(fetch_mib_per_s) || F(tuned_per_s) || F(given_per_s) ||
        set_item(d, "kept_given", PyBool_FromLong(r.kept_given)) || U(points) || F(seconds) ||
        set_str(d, "trace", r.trace)) {
        Py_DECREF(d);
        return NULL;
    }
#undef F
#undef U
    return d;
}

static PyMethodDef methods[] = {
    {"_ls", py_ls, METH_VARARGS, "_ls(url, recursive, options_json) -> list of dict"},
    {"_stat", py_stat, METH_VARARGS, "_stat(url, options_json) -> dict"},
    {"_warm_cache", py_warm_cache, METH_VARARGS,
     "_warm_cache(sources, options_json, verify, dry_run, max_objects, progress) -> dict"},
    {"_pack", py_pack, METH_VARARGS,
     "_pack(src, dest, options_json, format, shard_bytes, zstd_level, name_pattern, layout, "
     "follow_symlinks, tmp_dir, progress, part_bytes) -> dict"},
    {"_index", py_index, METH_VARARGS,
     "_index(sources, options_json, dry_run, output, parallel, window, progress) -> "
     "(json_text, index_url)"},
    {"_doctor_measure", py_doctor_measure, METH_VARARGS,
     "_doctor_measure(sources, options_json, seconds) -> dict (sf_doctor_measure)"},
    {"_tune", py_tune, METH_VARARGS, "_tune(sources, options_json, budget_s) -> dict (sf_tune)"},
    {"_doctor_conclude", py_doctor_conclude, METH_VARARGS,
     "_doctor_conclude(raw, step_per_s, pipeline_per_s, wait_share, data_in_cache) -> dict"},
    {NULL, NULL, 0, NULL},
};

int sfpy_tools_init(PyObject *module)
{
    return PyModule_AddFunctions(module, methods);
}
