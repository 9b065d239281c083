/*
 * pack's index.json (docs/pack.md): what was packed, each shard's size,
 * sample count and XXH3-64, written last, once every shard is in place.
 * The schema, its writer and its readers are src/index_json.c's; this file
 * describes the pack and puts the text in place.
 */
#include "src/pack_internal.h"
#include "src/index_json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fields seen: lower-cased name -> samples that have it, sorted by name;
 * then "cls" for every sample of an imagefolder. NULL when out of memory;
 * *names (each freed by the caller, then the array) holds the strings. */
static struct sf__index_json_field *count_fields(struct packer *p, char ***names_out, size_t *n_out)
{
    size_t n = p->n_entries + (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER ? 1 : 0);
    char **names = calloc(n ? n : 1, sizeof(*names));
    struct sf__index_json_field *fields = calloc(n ? n : 1, sizeof(*fields));
    *names_out = names;
    *n_out = 0;
    if (!names || !fields) {
        free(fields);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < p->n_entries; i++) {
        names[k] = strdup(sf__pack_field_of(&p->entries[i]));
        if (!names[k]) {
            free(fields);
            return NULL;
        }
        for (char *c = names[k]; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c - 'A' + 'a');
        k++;
    }
    qsort(names, k, sizeof(*names), sf__pack_cmp_str);
    size_t nf = 0;
    for (size_t i = 0; i < k;) {
        size_t m = i + 1;
        while (m < k && !strcmp(names[m], names[i]))
            m++;
        fields[nf++] = (struct sf__index_json_field){names[i], m - i};
        i = m;
    }
    if (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER)
        fields[nf++] = (struct sf__index_json_field){"cls", p->n_samples};
    *n_out = nf;
    return fields;
}

static char *build_index(struct packer *p, uint64_t total_bytes, size_t *len)
{
    struct sf__index_json_shard *shards = calloc(p->n_shards ? p->n_shards : 1, sizeof(*shards));
    char **names = NULL;
    size_t n_fields = 0;
    struct sf__index_json_field *fields = shards ? count_fields(p, &names, &n_fields) : NULL;
    char *text = NULL;
    if (fields) {
        for (size_t i = 0; i < p->n_shards; i++)
            shards[i] = (struct sf__index_json_shard){p->shards[i].name, p->shards[i].bytes,
                                                      p->shards[i].samples, p->shards[i].xxh3};
        struct sf__index_json_pack pk = {
            .layout = sf_pack_layout_name(p->layout),
            .zstd_level = p->o->zstd_level,
            .reencode_max_side = p->o->max_side,
            .reencode_quality = p->o->jpeg_quality ? p->o->jpeg_quality : DEFAULT_QUALITY,
            .shard_size_limit = p->o->shard_bytes,
            .file_count = p->n_entries,
            .source_bytes = p->source_bytes,
            .classes = (const char *const *)p->classes,
            .class_counts = p->class_counts,
            .n_classes = p->n_classes,
            .has_classes = p->layout == SF_PACK_LAYOUT_IMAGEFOLDER,
        };
        struct sf__index_json ix = {
            .format = sf_pack_format_name(p->o->format),
            .zstd = p->o->zstd_level != 0,
            .pack = &pk,
            .shards = shards,
            .n_shards = p->n_shards,
            .sample_count = p->n_samples,
            .bytes = total_bytes,
            .fields = fields,
            .n_fields = n_fields,
            .has_fields = 1,
        };
        text = sf__index_json_write(&ix, len);
    }
    for (size_t i = 0; names && i < p->n_entries && names[i]; i++)
        free(names[i]);
    free(names);
    free(fields);
    free(shards);
    return text;
}

sf_status sf__pack_write_index(struct packer *p, uint64_t total_bytes)
{
    size_t len = 0;
    char *text = build_index(p, total_bytes, &len);
    if (!text)
        return sf__pack_fail(p, SF_ERR_NO_MEMORY, "no memory for " SF__INDEX_JSON_NAME);
    sf_status st = SF_OK;
    if (p->to_s3) {
        char *url = sf__pack_object_url(p, SF__INDEX_JSON_NAME);
        if (!url)
            st = SF_ERR_NO_MEMORY;
        else if ((st = sf_s3_put(p->o->s3, url, NULL, text, len, NULL, 0)) != SF_OK) {
            char msg[1024];
            sf_s3_errmsg(p->o->s3, msg, sizeof(msg));
            sf__pack_fail(p, st, "%s", msg[0] ? msg : sf_status_str(st));
        }
        free(url);
    } else {
        char *final = sf__pack_path_join(p->dest_dir, SF__INDEX_JSON_NAME);
        size_t n = final ? strlen(final) + 64 : 0;
        char *tmp = final ? malloc(n) : NULL;
        if (!tmp) {
            st = SF_ERR_NO_MEMORY;
        } else {
            snprintf(tmp, n, "%s/." SF__INDEX_JSON_NAME ".sfpack-%ld", p->dest_dir, (long)getpid());
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

/*
 * The S3 side of remove_old_index (pack_shard.c): an index.json left under
 * the prefix by an earlier pack names shards with their old sizes, counts
 * and checksums, and this run's shards go up over some of them. A pack that
 * fails leaves them there (pack deletes no object, and the S3 client has no
 * DELETE), so before the first one goes up the old index is overwritten by
 * an index of no shard: readers do not use an index that does not list the
 * shards (they count them as without one), and the new index, PUT last,
 * replaces it. A HEAD first, so a prefix without an index gets none; a HEAD
 * that fails otherwise than 404 (no s3:GetObject) cannot tell, so the PUT
 * goes anyway. A PUT that fails fails the pack before any shard went up.
 */
sf_status sf__pack_s3_clear_old_index(struct packer *p)
{
    char *url = sf__pack_object_url(p, SF__INDEX_JSON_NAME);
    if (!url)
        return sf__pack_fail(p, SF_ERR_NO_MEMORY, "no memory for " SF__INDEX_JSON_NAME);
    struct sf_object_info info;
    memset(&info, 0, sizeof(info));
    sf_status st = sf_s3_stat(p->o->s3, url, &info);
    sf_object_info_clear(&info);
    if (st == SF_ERR_NOT_FOUND) {
        free(url);
        return SF_OK;
    }
    const struct sf__index_json none = {.format = sf_pack_format_name(p->o->format),
                                        .zstd = p->o->zstd_level != 0};
    size_t len = 0;
    char *text = sf__index_json_write(&none, &len);
    if (!text)
        st = sf__pack_fail(p, SF_ERR_NO_MEMORY, "no memory for " SF__INDEX_JSON_NAME);
    else if ((st = sf_s3_put(p->o->s3, url, NULL, text, len, NULL, 0)) != SF_OK) {
        char msg[1024];
        sf_s3_errmsg(p->o->s3, msg, sizeof(msg));
        sf__pack_fail(p, st,
                      "%s: cannot replace the earlier pack's index before the first shard goes "
                      "up: %s",
                      url, msg[0] ? msg : sf_status_str(st));
    }
    free(text);
    free(url);
    return st;
}
