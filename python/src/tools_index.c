/*
 * _index: builds a dataset's index (sf_index) and writes it to a local
 * path or an S3 object, with progress. Shared helpers in tools.h.
 */
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ index */

static int is_http(const char *url)
{
    return !strncmp(url, "http://", 7) || !strncmp(url, "https://", 8);
}

/* _index(sources, options_json, dry_run, output, parallel, window, progress)
 *   -> (json_text, index_url) */
PyObject *sfpy_index(PyObject *self, PyObject *args)
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
        if (sfpy_get_uint(par_obj, "index", "parallel", 1, SF_INDEX_PARALLEL_MAX, &u) < 0)
            return NULL;
        o.parallel = (unsigned)u;
    }
    if (win_obj != Py_None) {
        if (sfpy_get_size(win_obj, "index", "window", SF_INDEX_WINDOW_BYTES_MIN, &u) < 0)
            return NULL;
        if (u > SF_INDEX_WINDOW_BYTES_MAX)
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
    struct pycb cb;
    if (sfpy_cb_index(&cb, progress, &o) < 0)
        return NULL;
    o.index_url = output;
    struct strv src;
    struct sf_loader_options lo;
    void *keep;
    if (sfpy_sources_options(sources, json, "index", &src, &lo, &keep) < 0)
        return NULL;
    struct sf_s3 *s3 = sfpy_open_client(&lo);
    if (!s3) {
        sf_loader_options_free_json(keep);
        sfpy_strv_clear(&src);
        return NULL;
    }
    struct sf_index_result res;
    memset(&res, 0, sizeof(res));
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS st = sf_index_shards(s3, src.v, src.n, &o, &res, err, sizeof(err));
    Py_END_ALLOW_THREADS PyObject *out = NULL;
    if (sfpy_cb_finish(&cb, st == SF_OK) < 0)
        goto done;
    if (st != SF_OK) {
        sfpy_raise(st, err);
        goto done;
    }
    if (!dry_run) {
        if (is_http(res.index_url)) {
            char msg[600];
            snprintf(msg, sizeof(msg),
                     "index: %.400s: cannot write over http(s); name a local path or s3:// URL "
                     "with output=, or use dry_run=True",
                     res.index_url);
            sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS st = sf_index_result_save(s3, &res, err, sizeof(err));
        Py_END_ALLOW_THREADS if (st != SF_OK)
        {
            sfpy_raise(st, err);
            goto done;
        }
    }
    out = Py_BuildValue("(s#s)", res.json, (Py_ssize_t)res.json_len, res.index_url);
done:
    sf_index_result_clear(&res);
    sf_s3_destroy(s3);
    if (sfpy_sources_options_free(&src, keep) < 0)
        Py_CLEAR(out);
    return out;
}
