/*
 * _pack: writes a dataset as shards (sf_pack), with progress. Shared
 * helpers in tools.h.
 */
#include "tools.h"

#include <string.h>

/* ------------------------------------------------------------ pack */

/* _pack(src, dest, options_json, format, shard_bytes, zstd_level, name_pattern,
 *       layout, follow_symlinks, tmp_dir, progress, part_bytes) -> dict */
PyObject *sfpy_pack(PyObject *self, PyObject *args)
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
        if (sfpy_get_size(shard_obj, "pack", "shard_bytes", 1024, &u) < 0)
            return NULL;
        o.shard_bytes = u;
    }
    if (part_obj != Py_None) {
        /* sf_pack() checks the upper bound (5 GiB) and names it */
        if (sfpy_get_size(part_obj, "pack", "part_size", SF_UPLOAD_PART_BYTES_MIN, &u) < 0)
            return NULL;
        o.part_bytes = u;
    }
    if (sfpy_get_uint(zstd_obj, "pack", "zstd_level", 0, SF_PACK_ZSTD_LEVEL_MAX, &u) < 0)
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
    struct pycb cb;
    if (sfpy_cb_pack(&cb, progress, &o) < 0)
        return NULL;
    o.name_pattern = pattern;
    o.follow_symlinks = follow;
    o.tmp_dir = tmp_dir;

    struct sf_loader_options lo;
    void *keep;
    if (sfpy_parse_options(json, &lo, &keep) < 0)
        return NULL;
    struct sf_s3 *s3 = NULL;
    if (!strncmp(dest, "s3://", 5)) {
        s3 = sfpy_open_client(&lo);
        if (!s3) {
            sf_loader_options_free_json(keep);
            return NULL;
        }
        o.s3 = s3;
    }
    struct sf_pack_result res;
    memset(&res, 0, sizeof(res));
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS st = sf_pack(src, dest, &o, &res, err, sizeof(err));
    Py_END_ALLOW_THREADS sf_s3_destroy(s3);
    sf_loader_options_free_json(keep);
    if (sfpy_cb_finish(&cb, st == SF_OK) < 0)
        return NULL;
    if (st != SF_OK)
        return sfpy_raise(st, err);
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (sfpy_set_str(d, "format", sf_pack_format_name(res.format)) < 0 ||
        sfpy_set_str(d, "layout", sf_pack_layout_name(res.layout)) < 0 ||
        sfpy_set_u64(d, "shards", res.shards) < 0 || sfpy_set_u64(d, "samples", res.samples) < 0 ||
        sfpy_set_u64(d, "files", res.files) < 0 ||
        sfpy_set_u64(d, "source_bytes", res.source_bytes) < 0 ||
        sfpy_set_u64(d, "shard_bytes", res.shard_bytes) < 0 ||
        sfpy_set_u64(d, "ignored", res.ignored) < 0 ||
        sfpy_set_u64(d, "classes", res.classes) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}
