/*
 * index.json (docs/pack.md, "index.json"): the one owner of its schema. The
 * writers (pack's src/pack_index.c, `shardfeed index`'s src/index.c) describe
 * what they know in struct sf__index_json and call sf__index_json_write();
 * the loader (src/loader.c) reads it through sf__index_json_check() and
 * sf__index_json_counts().
 */
#ifndef SF_SRC_INDEX_JSON_H
#define SF_SRC_INDEX_JSON_H

#include "shardfeed.h"
#include "common/json.h" /* sf__json_nul_where: every JSON reader here asks it */

#include <stddef.h>
#include <stdint.h>

#define SF__INDEX_JSON_NAME    "index.json" /* beside the shards it lists */
#define SF__INDEX_JSON_VERSION 1            /* of the schema, "version" */

/* One entry of "shards". */
struct sf__index_json_shard {
    const char *name; /* relative to the index's folder (or a whole URL) */
    uint64_t bytes, samples;
    uint64_t xxh3; /* XXH3-64 of the whole shard, written as 16 hex digits */
};

/* One entry of "fields": a field name and the samples that have it. */
struct sf__index_json_field {
    const char *name;
    uint64_t samples;
};

/* What pack alone records (how it packed); NULL in struct sf__index_json
 * when the shards were made elsewhere (`shardfeed index`). */
struct sf__index_json_pack {
    const char *layout;         /* "imagefolder" | "flat" */
    int zstd_level;             /* written when compression is zstd */
    unsigned reencode_max_side; /* 0: no "reencode" object */
    int reencode_quality;
    uint64_t shard_size_limit;
    uint64_t file_count, source_bytes;
    const char *const *classes; /* imagefolder: "classes" and "class_counts" */
    const uint64_t *class_counts;
    size_t n_classes;
    int has_classes;
};

/* A whole index. Written in this order, optional members only when given:
 * format, version, layout*, compression, zstd_level*, checksum, reencode*,
 * shard_size_limit*, shards, shard_count, sample_count, file_count*, bytes,
 * source_bytes*, classes* + class_counts*, fields* (* pack only, or fields
 * only when has_fields). */
struct sf__index_json {
    const char *format; /* "tar" | "record" | "mixed" */
    int zstd;           /* "compression": "zstd", else "none" */
    const struct sf__index_json_pack *pack;
    const struct sf__index_json_shard *shards;
    size_t n_shards;
    uint64_t sample_count, bytes;
    const struct sf__index_json_field *fields; /* in the order to write */
    size_t n_fields;
    int has_fields; /* write "fields" (an empty object when n_fields is 0) */
};

/* The index as pretty-printed JSON ending in a newline, NUL-terminated;
 * *len (may be NULL) is its length without the NUL. The caller frees it.
 * NULL when out of memory. Pure: the same description, the same bytes. */
char *sf__index_json_write(const struct sf__index_json *ix, size_t *len);

/* The index's entries against the objects (matched by base name): one whose
 * "bytes" (or "etag", when it records one) differs from the object's is
 * SF_ERR_CHANGED; one missing from objs is SF_ERR_NOT_FOUND when listed (every
 * source was a listed folder, which cannot name what is gone), else skipped.
 * err names the shard and index_url; dir_len is the length of the index's
 * folder in index_url. Text that is not an index is SF_OK (the counts judge
 * it). Any thread. */
sf_status sf__index_json_check(const char *text, const char *index_url, size_t dir_len,
                               const struct sf_object_info *const *objs, size_t n, int listed,
                               char *err, size_t err_len);

/* Sample counts from index.json text (index_name, for messages; NULL
 * means "index.json"): *all = 1 when every object (matched by base name) is
 * listed with its count, else 0 (counts then partial; text that is not JSON
 * is such an index). SF_ERR_CORRUPT, with err naming index_name, the shard
 * and the field, when the entry of one of the objects has a "samples" that
 * is not a finite whole number from 0 to 2^64 - 1. Any thread. */
sf_status sf__index_json_counts(const char *text, const char *index_name,
                                const struct sf_object_info *const *objs, size_t n,
                                uint64_t *counts, int *all, char *err, size_t err_len);

#endif
