/*
 * index.json (docs/pack.md, "index.json"): its one writer and its readers.
 * pack (src/pack_index.c) and `shardfeed index` (src/index.c) describe an
 * index in struct sf__index_json; each writes the fields it knows, in the
 * schema's one order, so the two agree byte for byte where they overlap.
 */
#include "src/index_json.h"
#include "s3/etag.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ writer */

static int add_number(cJSON *o, const char *name, double v)
{
    return cJSON_AddNumberToObject(o, name, v) != NULL;
}

static int add_shards(cJSON *j, const struct sf__index_json *ix)
{
    cJSON *arr = cJSON_AddArrayToObject(j, "shards");
    for (size_t i = 0; arr && i < ix->n_shards; i++) {
        const struct sf__index_json_shard *sh = &ix->shards[i];
        cJSON *s = cJSON_CreateObject();
        if (!s)
            return 0;
        char hex[17];
        snprintf(hex, sizeof(hex), "%016" PRIx64, sh->xxh3);
        int ok = cJSON_AddStringToObject(s, "name", sh->name) &&
                 add_number(s, "bytes", (double)sh->bytes) &&
                 add_number(s, "samples", (double)sh->samples) &&
                 cJSON_AddStringToObject(s, "xxh3_64", hex);
        if (!ok || !cJSON_AddItemToArray(arr, s)) {
            cJSON_Delete(s);
            return 0;
        }
    }
    return arr != NULL;
}

static int add_classes(cJSON *j, const struct sf__index_json_pack *p)
{
    cJSON *c = cJSON_AddArrayToObject(j, "classes");
    cJSON *cc = cJSON_AddArrayToObject(j, "class_counts");
    if (!c || !cc)
        return 0;
    for (size_t i = 0; i < p->n_classes; i++) {
        cJSON *name = cJSON_CreateString(p->classes[i]);
        if (!cJSON_AddItemToArray(c, name)) {
            cJSON_Delete(name);
            return 0;
        }
        cJSON *n = cJSON_CreateNumber((double)p->class_counts[i]);
        if (!cJSON_AddItemToArray(cc, n)) {
            cJSON_Delete(n);
            return 0;
        }
    }
    return 1;
}

static int build(cJSON *j, const struct sf__index_json *ix)
{
    const struct sf__index_json_pack *p = ix->pack;
    int ok = cJSON_AddStringToObject(j, "format", ix->format) &&
             add_number(j, "version", SF__INDEX_JSON_VERSION);
    if (ok && p)
        ok = cJSON_AddStringToObject(j, "layout", p->layout) != NULL;
    if (ok)
        ok = cJSON_AddStringToObject(j, "compression", ix->zstd ? "zstd" : "none") != NULL;
    if (ok && p && ix->zstd)
        ok = add_number(j, "zstd_level", p->zstd_level);
    if (ok)
        ok = cJSON_AddStringToObject(j, "checksum", "xxh3_64") != NULL;
    if (ok && p && p->reencode_max_side) {
        cJSON *re = cJSON_AddObjectToObject(j, "reencode");
        ok = re && add_number(re, "max_side", p->reencode_max_side) &&
             add_number(re, "quality", p->reencode_quality);
    }
    if (ok && p)
        ok = add_number(j, "shard_size_limit", (double)p->shard_size_limit);
    ok = ok && add_shards(j, ix) && add_number(j, "shard_count", (double)ix->n_shards) &&
         add_number(j, "sample_count", (double)ix->sample_count);
    if (ok && p)
        ok = add_number(j, "file_count", (double)p->file_count);
    ok = ok && add_number(j, "bytes", (double)ix->bytes);
    if (ok && p)
        ok = add_number(j, "source_bytes", (double)p->source_bytes);
    if (ok && p && p->has_classes)
        ok = add_classes(j, p);
    if (ok && ix->has_fields) {
        cJSON *fields = cJSON_AddObjectToObject(j, "fields");
        ok = fields != NULL;
        for (size_t i = 0; ok && i < ix->n_fields; i++)
            ok = add_number(fields, ix->fields[i].name, (double)ix->fields[i].samples);
    }
    return ok;
}

char *sf__index_json_write(const struct sf__index_json *ix, size_t *len)
{
    cJSON *j = cJSON_CreateObject();
    char *text = j && build(j, ix) ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *out = realloc(text, n + 2);
    if (!out) {
        free(text);
        return NULL;
    }
    out[n] = '\n';
    out[n + 1] = '\0';
    if (len)
        *len = n + 1;
    return out;
}

/* ------------------------------------------------------------ readers */

static const char *base_name(const char *url)
{
    const char *s = strrchr(url, '/');
    return s ? s + 1 : url;
}

static int cmp_base_name(const void *a, const void *b)
{
    const struct sf_object_info *x = *(const struct sf_object_info *const *)a;
    const struct sf_object_info *y = *(const struct sf_object_info *const *)b;
    return strcmp(base_name(x->url), base_name(y->url));
}

sf_status sf__index_json_check(const char *text, const char *index_url, size_t dir_len,
                               const struct sf_object_info *const *objs, size_t n, int listed,
                               char *err, size_t err_len)
{
    cJSON *j = cJSON_Parse(text);
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "shards");
    const struct sf_object_info **by_name = calloc(n ? n : 1, sizeof(*by_name));
    if (!cJSON_IsArray(arr) || !by_name) {
        cJSON_Delete(j);
        free(by_name);
        return cJSON_IsArray(arr) ? SF_ERR_NO_MEMORY : SF_OK; /* the counts judge it */
    }
    char where[300];
    if (sf__json_nul_where(text, j, where, sizeof(where))) {
        snprintf(err, err_len, "%s: %.160s holds a NUL character (\\u0000)", index_url, where);
        cJSON_Delete(j);
        free(by_name);
        return SF_ERR_CORRUPT;
    }
    memcpy(by_name, objs, n * sizeof(*by_name));
    qsort(by_name, n, sizeof(*by_name), cmp_base_name);
    sf_status st = SF_OK;
    cJSON *s;
    cJSON_ArrayForEach(s, arr)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "name");
        if (!cJSON_IsString(name))
            continue;
        const char *want = base_name(name->valuestring);
        const struct sf_object_info *obj = NULL;
        for (size_t lo = 0, hi = n; lo < hi && !obj;) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(want, base_name(by_name[mid]->url));
            if (c == 0)
                obj = by_name[mid];
            else if (c < 0)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (!obj) {
            if (!listed)
                continue;
            st = SF_ERR_NOT_FOUND;
            snprintf(err, err_len,
                     "%.*s%s: named by %s but not in the listing: a shard of the data set is "
                     "missing",
                     (int)dir_len, index_url, want, index_url);
            break;
        }
        const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(s, "bytes");
        const cJSON *etag = cJSON_GetObjectItemCaseSensitive(s, "etag");
        /* What the object is and what the index says, where they differ. */
        char is[160] = "", says[160] = "";
        if (cJSON_IsNumber(bytes) && obj->size != SF_SIZE_UNKNOWN &&
            bytes->valuedouble != (double)obj->size) {
            snprintf(is, sizeof(is), "%llu bytes", obj->size);
            snprintf(says, sizeof(says), "%.0f", bytes->valuedouble);
        } else if (cJSON_IsString(etag) && obj->etag[0]) {
            /* The object's ETag is in its one form (s3/etag.h); an index
             * written elsewhere, or by an older build, may hold it bare. */
            char canon[sizeof(obj->etag)];
            const char *e = etag->valuestring;
            sf__etag_canon(canon, sizeof(canon), e, strlen(e));
            if (strcmp(canon, obj->etag)) {
                snprintf(is, sizeof(is), "ETag %s", obj->etag);
                snprintf(says, sizeof(says), "%s", e);
            }
        }
        if (is[0]) {
            st = SF_ERR_CHANGED;
            snprintf(err, err_len,
                     "%s: %s, but %s says %s: the shard was replaced or the index is stale "
                     "(shardfeed index writes it again)",
                     obj->url, is, index_url, says);
            break;
        }
    }
    cJSON_Delete(j);
    free(by_name);
    return st;
}

/* A count in index.json: a finite whole number in [0, 2^64). cJSON keeps
 * numbers as doubles: 1e300 or 1e999 (inf) would convert out of range, and
 * 12.5 would be cut silently. */
static int json_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d >= 18446744073709551616.0 || d != floor(d))
        return 0;
    *out = (uint64_t)d;
    return 1;
}

sf_status sf__index_json_counts(const char *text, const char *index_name,
                                const struct sf_object_info *const *objs, size_t n,
                                uint64_t *counts, int *all, char *err, size_t err_len)
{
    *all = 0;
    if (!index_name)
        index_name = SF__INDEX_JSON_NAME;
    cJSON *j = cJSON_Parse(text);
    if (!j)
        return SF_OK;
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "shards");
    int ok = cJSON_IsArray(arr);
    sf_status st = SF_OK;
    char where[300];
    if (ok && sf__json_nul_where(text, j, where, sizeof(where))) {
        if (err && err_len)
            snprintf(err, err_len, "%.512s: %.160s holds a NUL character (\\u0000)", index_name, where);
        cJSON_Delete(j);
        return SF_ERR_CORRUPT;
    }
    for (size_t i = 0; ok && i < n; i++) {
        const char *want = base_name(objs[i]->url);
        int found = 0;
        cJSON *s;
        cJSON_ArrayForEach(s, arr)
        {
            cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "name");
            if (!cJSON_IsString(name) || strcmp(base_name(name->valuestring), want) != 0)
                continue;
            cJSON *samples = cJSON_GetObjectItemCaseSensitive(s, "samples");
            if (!json_count(samples, &counts[i])) {
                char shown[64] = "missing";
                if (cJSON_IsNumber(samples)) {
                    /* Shortest of 15 or 17 digits that reads back the same. */
                    snprintf(shown, sizeof(shown), "%.15g", samples->valuedouble);
                    if (strtod(shown, NULL) != samples->valuedouble)
                        snprintf(shown, sizeof(shown), "%.17g", samples->valuedouble);
                } else if (samples)
                    snprintf(shown, sizeof(shown), "not a number");
                /* The shard's own file name (the entry's may be a longer path
                 * ending in it), capped: the message must still name the
                 * field whatever the bucket put there (fuzz_index). */
                if (err && err_len)
                    snprintf(err, err_len,
                             "%.512s: shard '%.128s%s': \"samples\" is %s, not a whole number "
                             "from 0 to 2^64 - 1",
                             index_name, want, strlen(want) > 128 ? "..." : "", shown);
                st = SF_ERR_CORRUPT;
                ok = 0;
                break;
            }
            found = 1;
            break;
        }
        ok = ok && found;
    }
    cJSON_Delete(j);
    *all = st == SF_OK && ok;
    return st;
}
