/*
 * pack's index.json (docs/pack.md): what was packed, each shard's size,
 * sample count and XXH3-64, written last, once every shard is in place.
 * Its readers: sf__loader_counts_from_index_json() (src/loader.c); the
 * index.json of shards made elsewhere is written by src/index.c.
 */
#include "src/pack_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INDEX_VERSION 1

static cJSON *build_index(struct packer *p, uint64_t total_bytes)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "format", sf_pack_format_name(p->o->format));
    cJSON_AddNumberToObject(j, "version", INDEX_VERSION);
    cJSON_AddStringToObject(j, "layout", sf_pack_layout_name(p->layout));
    cJSON_AddStringToObject(j, "compression", p->o->zstd_level ? "zstd" : "none");
    if (p->o->zstd_level)
        cJSON_AddNumberToObject(j, "zstd_level", p->o->zstd_level);
    cJSON_AddStringToObject(j, "checksum", "xxh3_64");
    if (p->o->max_side) {
        cJSON *re = cJSON_AddObjectToObject(j, "reencode");
        cJSON_AddNumberToObject(re, "max_side", p->o->max_side);
        cJSON_AddNumberToObject(re, "quality",
                                p->o->jpeg_quality ? p->o->jpeg_quality : DEFAULT_QUALITY);
    }
    cJSON_AddNumberToObject(j, "shard_size_limit", (double)p->o->shard_bytes);
    cJSON *arr = cJSON_AddArrayToObject(j, "shards");
    for (size_t i = 0; arr && i < p->n_shards; i++) {
        cJSON *s = cJSON_CreateObject();
        char hex[17];
        snprintf(hex, sizeof(hex), "%016" PRIx64, p->shards[i].xxh3);
        cJSON_AddStringToObject(s, "name", p->shards[i].name);
        cJSON_AddNumberToObject(s, "bytes", (double)p->shards[i].bytes);
        cJSON_AddNumberToObject(s, "samples", (double)p->shards[i].samples);
        cJSON_AddStringToObject(s, "xxh3_64", hex);
        cJSON_AddItemToArray(arr, s);
    }
    cJSON_AddNumberToObject(j, "shard_count", (double)p->n_shards);
    cJSON_AddNumberToObject(j, "sample_count", (double)p->n_samples);
    cJSON_AddNumberToObject(j, "file_count", (double)p->n_entries);
    cJSON_AddNumberToObject(j, "bytes", (double)total_bytes);
    cJSON_AddNumberToObject(j, "source_bytes", (double)p->source_bytes);
    if (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER) {
        cJSON *c = cJSON_AddArrayToObject(j, "classes");
        cJSON *cc = cJSON_AddArrayToObject(j, "class_counts");
        for (size_t i = 0; c && cc && i < p->n_classes; i++) {
            cJSON_AddItemToArray(c, cJSON_CreateString(p->classes[i]));
            cJSON_AddItemToArray(cc, cJSON_CreateNumber((double)p->class_counts[i]));
        }
    }
    /* fields seen: lower-cased name -> samples that have it, sorted by name */
    cJSON *fields = cJSON_AddObjectToObject(j, "fields");
    size_t n = p->n_entries + (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER ? 1 : 0);
    char **names = calloc(n ? n : 1, sizeof(*names));
    size_t k = 0;
    int ok = fields && names;
    for (size_t i = 0; ok && i < p->n_entries; i++) {
        names[k] = strdup(sf__pack_field_of(&p->entries[i]));
        if (!names[k]) {
            ok = 0;
            break;
        }
        for (char *c = names[k]; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c - 'A' + 'a');
        k++;
    }
    if (ok) {
        qsort(names, k, sizeof(*names), sf__pack_cmp_str);
        for (size_t i = 0; i < k;) {
            size_t m = i + 1;
            while (m < k && !strcmp(names[m], names[i]))
                m++;
            cJSON_AddNumberToObject(fields, names[i], (double)(m - i));
            i = m;
        }
        if (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER)
            cJSON_AddNumberToObject(fields, "cls", (double)p->n_samples);
    }
    for (size_t i = 0; names && i < k; i++)
        free(names[i]);
    free(names);
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

sf_status sf__pack_write_index(struct packer *p, uint64_t total_bytes)
{
    cJSON *j = build_index(p, total_bytes);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text)
        return sf__pack_fail(p, SF_ERR_NO_MEMORY, "no memory for " INDEX_NAME);
    size_t len = strlen(text);
    text[len++] = '\n'; /* replaces the NUL; the length is what is written */
    sf_status st = SF_OK;
    if (p->to_s3) {
        char *url = sf__pack_object_url(p, INDEX_NAME);
        if (!url)
            st = SF_ERR_NO_MEMORY;
        else if ((st = sf_s3_put(p->o->s3, url, NULL, text, len, NULL, 0)) != SF_OK) {
            char msg[1024];
            sf_s3_errmsg(p->o->s3, msg, sizeof(msg));
            sf__pack_fail(p, st, "%s", msg[0] ? msg : sf_status_str(st));
        }
        free(url);
    } else {
        char *final = sf__pack_path_join(p->dest_dir, INDEX_NAME);
        size_t n = final ? strlen(final) + 64 : 0;
        char *tmp = final ? malloc(n) : NULL;
        if (!tmp) {
            st = SF_ERR_NO_MEMORY;
        } else {
            snprintf(tmp, n, "%s/." INDEX_NAME ".sfpack-%ld", p->dest_dir, (long)getpid());
            struct shard s = {.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
                              .tmp_path = tmp};
            if (s.fd < 0)
                st = sf__pack_fail(p, sf__pack_errno_status(errno), "%s: cannot create: %s", tmp,
                                   strerror(errno));
            else
                st = sf__pack_write_all(p, &s, text, len);
            if (s.fd >= 0 && close(s.fd) != 0 && st == SF_OK)
                st = sf__pack_fail(p, SF_ERR_IO, "%s: close: %s", tmp, strerror(errno));
            if (st == SF_OK && rename(tmp, final) != 0)
                st = sf__pack_fail(p, SF_ERR_IO, "%s: cannot rename into place: %s", final,
                                   strerror(errno));
            if (st != SF_OK)
                unlink(tmp);
        }
        free(tmp);
        free(final);
    }
    free(text);
    return st;
}
