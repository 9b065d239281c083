/*
 * Module-level tools: ls, stat, warm_cache, pack, index (the private
 * functions _ls, _stat, _warm_cache, _pack and _index; shardfeed/_tools.py
 * gives them their documented keyword signatures). This file holds what they
 * share (options, argument conversion, dicts, progress callbacks; declared in
 * tools.h) and the method table; each tool is in tools_<job>.c.
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
#include "tools.h"
#include "common/clock.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ options */

/* Reads the S3 (and cache) options of json into *lo with the loader's
 * parser; the strings point into *keep (free with
 * sf_loader_options_free_json). Sets the log sinks. -1 with ConfigError. */
int sfpy_parse_options(const char *json, struct sf_loader_options *lo, void **keep)
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
struct sf_s3 *sfpy_open_client(const struct sf_loader_options *lo)
{
    struct sf_s3 *s3 = NULL;
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS st = sf_s3_new(&lo->s3, &s3, err, sizeof(err));
    Py_END_ALLOW_THREADS if (st != SF_OK)
    {
        /* A logging handler that raised keeps its exception. */
        if (sfpy_log_drain() == 0)
            sfpy_raise(st, err);
        return NULL;
    }
    return s3;
}

PyObject *sfpy_raise_s3(struct sf_s3 *s3, sf_status st)
{
    char msg[1024];
    sf_s3_errmsg(s3, msg, sizeof(msg));
    return sfpy_raise(st, msg);
}

/* Converts obj (an int, not a bool) into *out in [min, max]; -1 with
 * ConfigError naming the argument otherwise. */
int sfpy_get_uint(PyObject *obj, const char *fn, const char *name, unsigned long long min,
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
int sfpy_get_size(PyObject *obj, const char *fn, const char *name, unsigned long long min,
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
    return sfpy_get_uint(obj, fn, name, min, ULLONG_MAX >> 1, out);
}

int sfpy_strv_from(PyObject *obj, const char *fn, struct strv *out)
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

int sfpy_sources_options(PyObject *sources, const char *json, const char *fn, struct strv *sv,
                         struct sf_loader_options *lo, void **keep)
{
    if (sfpy_strv_from(sources, fn, sv) < 0) {
        sfpy_strv_clear(sv);
        return -1;
    }
    if (sfpy_parse_options(json, lo, keep) < 0) {
        sfpy_strv_clear(sv);
        return -1;
    }
    return 0;
}

int sfpy_sources_options_free(struct strv *sv, void *keep)
{
    sf_loader_options_free_json(keep);
    sfpy_strv_clear(sv);
    return sfpy_log_drain();
}

void sfpy_strv_clear(struct strv *s)
{
    free(s->v);
    Py_XDECREF(s->list);
    memset(s, 0, sizeof(*s));
}

/* ------------------------------------------------------------ dicts */

int sfpy_set_item(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

int sfpy_set_u64(PyObject *d, const char *key, unsigned long long v)
{
    return sfpy_set_item(d, key, PyLong_FromUnsignedLongLong(v));
}

int sfpy_set_str(PyObject *d, const char *key, const char *s)
{
    if (!s) {
        Py_INCREF(Py_None);
        return sfpy_set_item(d, key, Py_None);
    }
    return sfpy_set_item(d, key, PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace"));
}

PyObject *sfpy_dict_filled(PyObject *d, int failed)
{
    if (failed)
        Py_CLEAR(d);
    return d;
}

/* ------------------------------------------------------------ callbacks */

int sfpy_cb_check(PyObject *progress, const char *fn)
{
    if (progress == Py_None || PyCallable_Check(progress))
        return 0;
    char msg[128];
    snprintf(msg, sizeof(msg), "%s: progress: expected a callable", fn);
    sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
    return -1;
}

void sfpy_cb_init(struct pycb *cb, PyObject *progress, enum cb_kind kind)
{
    memset(cb, 0, sizeof(*cb));
    cb->progress = progress && progress != Py_None ? progress : NULL;
    cb->kind = kind;
}

/* A snapshot's counters: the unsigned long long at off, under its C name
 * (U64_AT refuses, at compile time, a member of another type). */
struct u64_field {
    const char *name;
    size_t off;
};
#define U64_AT(type, m) {#m, offsetof(type, m) + 0 * _Generic(((type *)0)->m, unsigned long long: 1)}
#define PACK(m)  U64_AT(struct sf_pack_progress, m)
#define INDEX(m) U64_AT(struct sf_index_progress, m)
#define WARM(m)  U64_AT(struct sf_warm_stats, m)
static const struct u64_field pack_fields[] = {
    PACK(bytes_done), PACK(bytes_total), PACK(files_done), PACK(files_total), PACK(shards_done),
};
static const struct u64_field index_fields[] = {
    INDEX(shards_done), INDEX(shards_total), INDEX(bytes_done), INDEX(bytes_total),
};
static const struct u64_field warm_fields[] = {
    WARM(objects_total), WARM(objects_done), WARM(fetched),        WARM(cached), WARM(peer),
    WARM(failed),        WARM(bytes_total),  WARM(bytes_to_fetch), WARM(bytes_fetched),
};
#undef PACK
#undef INDEX
#undef WARM
#undef U64_AT
#define FIELDS(t) {(t), sizeof(t) / sizeof((t)[0])}
static const struct {
    const struct u64_field *f;
    size_t n;
} snapshot_fields[] = {
    [CB_PACK] = FIELDS(pack_fields),
    [CB_INDEX] = FIELDS(index_fields),
    [CB_WARM] = FIELDS(warm_fields),
};
#undef FIELDS

PyObject *sfpy_snapshot_dict(const struct pycb *cb)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    /* every member of the union starts at cb->last */
    const char *base = (const char *)&cb->last;
    const struct u64_field *f = snapshot_fields[cb->kind].f;
    int rc = 0;
    for (size_t i = 0; !rc && i < snapshot_fields[cb->kind].n; i++) {
        unsigned long long v;
        memcpy(&v, base + f[i].off, sizeof(v));
        rc = sfpy_set_u64(d, f[i].name, v);
    }
    if (!rc && cb->kind == CB_WARM)
        rc = sfpy_set_item(d, "elapsed_s", PyFloat_FromDouble(cb->last.warm.elapsed_s));
    return sfpy_dict_filled(d, rc);
}

/* Calls the user's progress with the newest snapshot (GIL held). */
static int cb_call(struct pycb *cb)
{
    cb->pending = 0;
    PyObject *d = sfpy_snapshot_dict(cb);
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
int sfpy_cb_poll(struct pycb *cb)
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
int sfpy_cb_finish(struct pycb *cb, int succeeded)
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

/* The library's progress callbacks of pack and index: the newest snapshot
 * goes into its member of cb->last, then the poll. */
static int pack_progress_cb(void *user, const struct sf_pack_progress *p)
{
    struct pycb *cb = user;
    cb->last.pack = *p;
    cb->pending = 1;
    return sfpy_cb_poll(cb);
}

static int index_progress_cb(void *user, const struct sf_index_progress *p)
{
    struct pycb *cb = user;
    cb->last.index = *p;
    cb->pending = 1;
    return sfpy_cb_poll(cb);
}

static int cb_start(struct pycb *cb, PyObject *progress, enum cb_kind kind, const char *fn)
{
    if (sfpy_cb_check(progress, fn) < 0)
        return -1;
    sfpy_cb_init(cb, progress, kind);
    return 0;
}

int sfpy_cb_pack(struct pycb *cb, PyObject *progress, struct sf_pack_options *o)
{
    o->progress = pack_progress_cb;
    o->progress_user = cb;
    return cb_start(cb, progress, CB_PACK, "pack");
}

int sfpy_cb_index(struct pycb *cb, PyObject *progress, struct sf_index_options *o)
{
    o->progress = index_progress_cb;
    o->progress_user = cb;
    return cb_start(cb, progress, CB_INDEX, "index");
}

/* ------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"_ls", sfpy_ls, METH_VARARGS, "_ls(url, recursive, options_json) -> list of dict"},
    {"_stat", sfpy_stat, METH_VARARGS, "_stat(url, options_json) -> dict"},
    {"_warm_cache", sfpy_warm_cache, METH_VARARGS,
     "_warm_cache(sources, options_json, verify, dry_run, max_objects, progress) -> dict"},
    {"_pack", sfpy_pack, METH_VARARGS,
     "_pack(src, dest, options_json, format, shard_bytes, zstd_level, name_pattern, layout, "
     "follow_symlinks, tmp_dir, progress, part_bytes) -> dict"},
    {"_index", sfpy_index, METH_VARARGS,
     "_index(sources, options_json, dry_run, output, parallel, window, progress) -> "
     "(json_text, index_url)"},
    {"_doctor_measure", sfpy_doctor_measure, METH_VARARGS,
     "_doctor_measure(sources, options_json, seconds) -> dict (sf_doctor_measure)"},
    {"_tune", sfpy_tune, METH_VARARGS, "_tune(sources, options_json, budget_s) -> dict (sf_tune)"},
    {"_doctor_conclude", sfpy_doctor_conclude, METH_VARARGS,
     "_doctor_conclude(raw, step_per_s, pipeline_per_s, wait_share, data_in_cache) -> dict"},
    {NULL, NULL, 0, NULL},
};

int sfpy_tools_init(PyObject *module)
{
    return PyModule_AddFunctions(module, methods);
}
