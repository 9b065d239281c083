/*
 * _ls and _stat: object listings (brace patterns expanded) and one
 * object's metadata, as dicts. Shared helpers in tools.h.
 */
#include "tools.h"

#include <string.h>

/* {"url", "key", "size", "etag", "last_modified", "is_prefix"}: None where
 * unknown; last_modified in seconds since the epoch. */
static PyObject *info_dict(const struct sf_object_info *in)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int known = !in->is_prefix;
    if (sfpy_set_str(d, "url", in->url) < 0 || sfpy_set_str(d, "key", in->key ? in->key : "") < 0 ||
        (known && in->size != SF_SIZE_UNKNOWN ? sfpy_set_u64(d, "size", in->size)
                                              : sfpy_set_str(d, "size", NULL)) < 0 ||
        sfpy_set_str(d, "etag", known && in->etag[0] ? in->etag : NULL) < 0 ||
        (known && in->last_modified > 0
             ? sfpy_set_item(d, "last_modified", PyLong_FromLongLong(in->last_modified))
             : sfpy_set_str(d, "last_modified", NULL)) < 0 ||
        sfpy_set_item(d, "is_prefix", PyBool_FromLong(in->is_prefix)) < 0) {
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

/* ------------------------------------------------------------ ls, stat */

/* A client for the S3 options of json, whose strings *keep holds (free with
 * sf_loader_options_free_json after the client); NULL with the exception. */
static struct sf_s3 *client_of(const char *json, void **keep)
{
    struct sf_loader_options lo;
    if (sfpy_parse_options(json, &lo, keep) < 0)
        return NULL;
    struct sf_s3 *s3 = sfpy_open_client(&lo);
    if (!s3)
        sf_loader_options_free_json(*keep);
    return s3;
}

/* _ls(url, recursive, options_json) -> list of dict */
PyObject *sfpy_ls(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url, *json;
    int recursive;
    if (!PyArg_ParseTuple(args, "sps:_ls", &url, &recursive, &json))
        return NULL;
    void *keep;
    struct sf_s3 *s3 = client_of(json, &keep);
    if (!s3)
        return NULL;
    struct sf_object_list *l = NULL;
    sf_status st;
    int pattern = sf_s3_is_pattern(url);
    Py_BEGIN_ALLOW_THREADS
        /* a pattern lists the objects it names, each checked to exist */
        st = pattern ? sf_s3_expand_stat(s3, url, 0, &l)
                     : sf_s3_list(s3, url, recursive ? SF_LIST_RECURSIVE : 0, 0, &l);
    Py_END_ALLOW_THREADS PyObject *out = st == SF_OK ? list_of(l) : sfpy_raise_s3(s3, st);
    sf_object_list_destroy(l);
    sf_s3_destroy(s3);
    sf_loader_options_free_json(keep);
    if (sfpy_log_drain() < 0)
        Py_CLEAR(out);
    return out;
}

/* _stat(url, options_json) -> dict */
PyObject *sfpy_stat(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url, *json;
    if (!PyArg_ParseTuple(args, "ss:_stat", &url, &json))
        return NULL;
    if (sf_s3_is_pattern(url)) {
        char msg[512];
        snprintf(msg, sizeof(msg),
                 "stat: '%.400s' is a brace pattern: shardfeed.ls() gives every object it names",
                 url);
        return sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
    }
    void *keep;
    struct sf_s3 *s3 = client_of(json, &keep);
    if (!s3)
        return NULL;
    struct sf_object_info in;
    memset(&in, 0, sizeof(in));
    sf_status st;
    Py_BEGIN_ALLOW_THREADS st = sf_s3_stat(s3, url, &in);
    Py_END_ALLOW_THREADS PyObject *out = st == SF_OK ? info_dict(&in) : sfpy_raise_s3(s3, st);
    sf_object_info_clear(&in);
    sf_s3_destroy(s3);
    sf_loader_options_free_json(keep);
    if (sfpy_log_drain() < 0)
        Py_CLEAR(out);
    return out;
}
