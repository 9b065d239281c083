/*
 * sf_pack(): a folder of files into tar or record shards plus index.json.
 *
 * Three steps: scan the source (every file becomes an entry with its key and
 * field, see include/shardfeed_pack.h), sort the entries by (key, field) and
 * group them into samples, then write the samples in that order into shards
 * of bounded size. Everything that decides bytes (order, tar header fields,
 * index.json) depends only on the files' names and contents, so the same
 * input gives byte-identical output. docs/pack.md explains the decisions.
 *
 * This file is the driver: the options, the destination, the shard loop and
 * sf_pack(). The jobs it drives: pack_scan.c (finding, grouping and reading
 * the inputs), pack_shard.c (shard files), tar_writer.c and pack_record.c
 * (a sample into a tar or record shard), pack_upload.c (s3:// shards),
 * pack_index.c (index.json), pack_reencode_pool.c (--max-side).
 */
#include "src/pack_internal.h"
#include "src/index_json.h"

#include "s3/endpoint.h"
#include "common/file.h"
#include "common/strv.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_SHARD_BYTES (256ull << 20)

/* ------------------------------------------------------------ errors */

__attribute__((format(printf, 3, 4))) sf_status sf__pack_fail(struct packer *p, sf_status st,
                                                              const char *fmt, ...)
{
    /* the first failure is the one worth reporting */
    if (p->err && p->err_len && !p->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, p->err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

sf_status sf__pack_errno_status(int e)
{
    return e == ENOMEM ? SF_ERR_NO_MEMORY : sf__errno_status(e);
}

/* ------------------------------------------------------------ public helpers */

SF_API void sf_pack_options_init_default(struct sf_pack_options *o)
{
    memset(o, 0, sizeof(*o));
    o->format = SF_PACK_FORMAT_TAR;
    o->layout = SF_PACK_LAYOUT_AUTO;
    o->shard_bytes = DEFAULT_SHARD_BYTES;
}

SF_API const char *sf_pack_format_name(enum sf_pack_format format)
{
    switch (format) {
    case SF_PACK_FORMAT_TAR: return "tar";
    case SF_PACK_FORMAT_RECORD: return "record";
    }
    return "unknown";
}

SF_API const char *sf_pack_layout_name(enum sf_pack_layout layout)
{
    switch (layout) {
    case SF_PACK_LAYOUT_AUTO: return "auto";
    case SF_PACK_LAYOUT_IMAGEFOLDER: return "imagefolder";
    case SF_PACK_LAYOUT_FLAT: return "flat";
    }
    return "unknown";
}

/* ------------------------------------------------------------ small helpers */

char *sf__pack_path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int slash = la > 0 && a[la - 1] != '/';
    char *s = malloc(la + (size_t)slash + lb + 1);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    if (slash)
        s[la] = '/';
    memcpy(s + la + (size_t)slash, b, lb + 1);
    return s;
}

/*
 * Name patterns: exactly one %u / %0Nu / %Nu / %d (N <= 20) and %% for '%'.
 * Checked here rather than handed to printf, so a user's pattern can never be
 * a format string.
 */
static int pattern_expand(const char *pat, unsigned long long idx, char *out, size_t n)
{
    size_t o = 0;
    int convs = 0;
    for (const char *c = pat; *c; c++) {
        char piece[32];
        size_t plen;
        if (*c != '%') {
            piece[0] = *c;
            plen = 1;
        } else if (c[1] == '%') {
            piece[0] = '%';
            plen = 1;
            c++;
        } else {
            const char *d = c + 1;
            int zero = *d == '0';
            if (zero)
                d++;
            unsigned width = 0;
            while (*d >= '0' && *d <= '9') {
                width = width * 10 + (unsigned)(*d - '0');
                if (width > 20)
                    return -1;
                d++;
            }
            if (*d != 'u' && *d != 'd')
                return -1;
            if (zero)
                snprintf(piece, sizeof(piece), "%0*llu", (int)width, idx);
            else
                snprintf(piece, sizeof(piece), "%*llu", (int)width, idx);
            plen = strlen(piece);
            convs++;
            c = d;
        }
        if (o + plen + 1 > n)
            return -1;
        memcpy(out + o, piece, plen);
        o += plen;
    }
    out[o] = '\0';
    return convs == 1 ? 0 : -1;
}

static const char *default_pattern(enum sf_pack_format format)
{
    return format == SF_PACK_FORMAT_RECORD ? "shard-%06u.sfr" : "shard-%06u.tar";
}

SF_API sf_status sf_pack_shard_name(const char *pattern, enum sf_pack_format format,
                                    unsigned long long index, char *out, size_t n)
{
    if (!out || !n)
        return SF_ERR_INVALID_ARGUMENT;
    out[0] = '\0';
    const char *pat = pattern ? pattern : default_pattern(format);
    char name[NAME_MAX + 1];
    if (!*pat || strchr(pat, '/') || pattern_expand(pat, index, name, sizeof(name)) != 0)
        return SF_ERR_INVALID_ARGUMENT;
    if (name[0] == '.' || !strcmp(name, SF__INDEX_JSON_NAME))
        return SF_ERR_INVALID_ARGUMENT;
    if (strlen(name) >= n)
        return SF_ERR_LIMIT;
    memcpy(out, name, strlen(name) + 1);
    return SF_OK;
}

static sf_status check_pattern(struct packer *p, const char *pat)
{
    char name[NAME_MAX + 1];
    if (sf_pack_shard_name(pat, p->o->format, 0, name, sizeof(name)) != SF_OK)
        return sf__pack_fail(
            p, SF_ERR_INVALID_ARGUMENT,
            "name pattern '%s': expected one %%u (or %%06u, %%d) for the shard number, "
            "%%%% for '%%', no '/', not starting with '.', not " SF__INDEX_JSON_NAME,
            pat);
    return SF_OK;
}

/* mkdir -p. The lengths of the prefixes of path it created go to made (one
 * slot per '/' of path, plus one), *n_made of them in order, so that a
 * destination refused afterwards can be taken back (unmake_dirs). */
static sf_status make_dirs(struct packer *p, const char *path, size_t *made, size_t *n_made)
{
    *n_made = 0;
    char *s = strdup(path);
    if (!s)
        return SF_ERR_NO_MEMORY;
    sf_status st = SF_OK;
    for (char *c = s + 1;; c++) {
        if (*c != '/' && *c != '\0')
            continue;
        char saved = *c;
        *c = '\0';
        if (mkdir(s, 0755) == 0) {
            made[(*n_made)++] = (size_t)(c - s);
        } else if (errno != EEXIST) {
            st = sf__pack_fail(p, sf__pack_errno_status(errno), "%s: cannot create the folder: %s",
                               s, strerror(errno));
            break;
        }
        *c = saved;
        if (!saved)
            break;
    }
    free(s);
    if (st == SF_OK) {
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT, "%s: not a folder", path);
    }
    return st;
}

/* Removes the folders make_dirs created, the deepest first (rmdir: only while empty). */
static void unmake_dirs(const char *path, const size_t *made, size_t n_made)
{
    for (size_t i = n_made; i-- > 0;) {
        char *d = strndup(path, made[i]);
        if (d)
            rmdir(d);
        free(d);
    }
}

/* ------------------------------------------------------------ progress */

static unsigned long long shards_done(struct packer *p)
{
    if (!p->to_s3)
        return p->local_done;
    if (!p->up.started)
        return p->up.done; /* the thread is gone */
    pthread_mutex_lock(&p->up.lock);
    unsigned long long n = p->up.done;
    pthread_mutex_unlock(&p->up.lock);
    return n;
}

static sf_status report(struct packer *p)
{
    if (!p->o->progress)
        return SF_OK;
    struct sf_pack_progress pr = {
        .bytes_done = p->bytes_done,
        .bytes_total = p->source_bytes,
        .files_done = p->files_done,
        .files_total = p->n_entries,
        .shards_done = shards_done(p),
    };
    if (p->o->progress(p->o->progress_user, &pr) != 0)
        return sf__pack_fail(p, SF_ERR_CANCELLED, "cancelled by the progress callback");
    return SF_OK;
}

/* ------------------------------------------------------------ the pack */

static sf_status write_shards(struct packer *p)
{
    p->out = malloc(OUT_BUFFER_BYTES);
    if (!p->out)
        return SF_ERR_NO_MEMORY;
    struct shard s;
    memset(&s, 0, sizeof(s));
    s.fd = -1;
    int open_shard = 0;
    /* what a shard costs besides its samples: tar end blocks, or record header + index + footer */
    uint64_t overhead =
        p->o->format == SF_PACK_FORMAT_TAR
            ? 2 * TAR_BLOCK
            : SF__RECORD_HEADER_BYTES + SF__RECORD_INDEX_FIXED_BYTES + SF__RECORD_FOOTER_BYTES;
    uint64_t planned = 0;
    sf_status st = report(p);
    for (size_t i = 0; st == SF_OK && i < p->n_samples; i++) {
        struct sample *smp = &p->samples[i];
        if (p->re) {
            /* The shard boundary depends on the re-encoded sizes. */
            if ((st = sf__pack_reencoder_wait(p, i)) != SF_OK)
                break;
            smp->bytes = sf__pack_sample_bytes(p, smp);
        }
        if (open_shard && planned + smp->bytes + overhead > p->o->shard_bytes) {
            st = sf__pack_shard_close(p, &s);
            sf__pack_shard_discard(&s);
            open_shard = 0;
            if (st != SF_OK)
                break;
        }
        if (!open_shard) {
            st = sf__pack_shard_open(p, &s, p->n_shards);
            if (st != SF_OK) {
                sf__pack_shard_discard(&s);
                break;
            }
            open_shard = 1;
            planned = 0;
        }
        st = p->o->format == SF_PACK_FORMAT_TAR ? sf__tar_sample(p, &s, smp)
                                                : sf__pack_record_sample(p, &s, smp);
        if (p->re)
            sf__pack_free_reencoded(p, smp);
        planned += smp->bytes;
        s.samples++;
        if (st == SF_OK)
            st = report(p);
    }
    if (open_shard) {
        if (st == SF_OK)
            st = sf__pack_shard_close(p, &s);
        sf__pack_shard_discard(&s);
    }
    return st;
}

static sf_status resolve_dest(struct packer *p, const char *dest_url)
{
    struct sf__locator loc;
    char err[512];
    sf_status st = sf__locator_parse(dest_url, &loc, err, sizeof(err));
    if (st != SF_OK)
        return sf__pack_fail(p, st, "%s", err);
    if (loc.kind == SF__LOC_HTTP) {
        st = sf__pack_fail(p, SF_ERR_UNSUPPORTED, "%s: pack writes to a folder or an s3:// prefix",
                           dest_url);
    } else if (loc.kind == SF__LOC_S3) {
        p->to_s3 = 1;
        if (!*loc.bucket)
            st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT, "%s: name a bucket", dest_url);
        else if (!p->o->s3)
            st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                               "%s: an s3:// destination needs a client (s3)", dest_url);
        else if (p->o->shard_bytes > SF_UPLOAD_MAX_BYTES)
            st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                               "shard size %llu: an S3 object holds at most 5 TiB",
                               p->o->shard_bytes);
        else if (p->o->part_bytes && (p->o->part_bytes < SF_UPLOAD_PART_BYTES_MIN ||
                                      p->o->part_bytes > SF_UPLOAD_PART_BYTES_MAX))
            st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                               "part size %llu: S3 parts are 5 MiB to 5 GiB", p->o->part_bytes);
        else {
            /* s3://bucket/prefix without trailing slashes; keys are joined with '/' */
            size_t n = strlen(dest_url);
            while (n > 5 && dest_url[n - 1] == '/')
                n--;
            p->dest_url = strndup(dest_url, n);
            if (!p->dest_url)
                st = SF_ERR_NO_MEMORY;
            const char *t = p->o->tmp_dir;
            if (!t || !*t)
                t = getenv("TMPDIR");
            p->tmp_dir = t && *t ? t : "/tmp";
        }
    } else {
        /* A refused destination is not left behind: made inside SRC, an empty
         * folder would be an empty class of the next ImageFolder pack. */
        size_t slots = 1, n_made = 0;
        for (const char *c = loc.key; *c; c++)
            slots += *c == '/';
        size_t *made = malloc(slots * sizeof(*made));
        st = made ? make_dirs(p, loc.key, made, &n_made) : SF_ERR_NO_MEMORY;
        char *rs = st == SF_OK ? realpath(p->src, NULL) : NULL;
        char *rd = st == SF_OK ? realpath(loc.key, NULL) : NULL;
        if (st == SF_OK && (!rs || !rd))
            st = sf__pack_fail(p, sf__pack_errno_status(errno), "%s: %s", rs ? loc.key : p->src,
                               strerror(errno));
        if (st == SF_OK) {
            size_t ls = strlen(rs);
            if (!strncmp(rs, rd, ls) && (rd[ls] == '\0' || rd[ls] == '/' || ls == 1))
                st = sf__pack_fail(
                    p, SF_ERR_INVALID_ARGUMENT,
                    "%s is inside %s: the shards would be packed into themselves next time",
                    loc.key, p->src);
        }
        free(rs);
        if (st == SF_OK) {
            p->dest_dir = rd;
        } else {
            free(rd);
            unmake_dirs(loc.key, made, n_made);
        }
        free(made);
    }
    sf__locator_free(&loc);
    return st;
}

static void remove_written(struct packer *p)
{
    if (p->to_s3 || !p->dest_dir)
        return;
    for (size_t i = 0; i < p->n_shards; i++) {
        char *path = sf__pack_path_join(p->dest_dir, p->shards[i].name);
        if (path)
            unlink(path);
        free(path);
    }
}

static void packer_free(struct packer *p)
{
    for (size_t i = 0; i < p->n_entries; i++) {
        free(p->entries[i].rel);
        free(p->entries[i].re);
    }
    free(p->entries);
    sf__strv_free(p->classes, p->n_classes);
    free(p->class_counts);
    free(p->samples);
    for (size_t i = 0; i < p->n_shards; i++)
        free(p->shards[i].name);
    free(p->shards);
    free(p->out);
    free(p->sample_buf);
    free(p->dest_dir);
    free(p->dest_url);
}

SF_API sf_status sf_pack(const char *src_dir, const char *dest_url, const struct sf_pack_options *o,
                         struct sf_pack_result *result, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (result)
        memset(result, 0, sizeof(*result));
    struct sf_pack_options def;
    if (!o) {
        sf_pack_options_init_default(&def);
        o = &def;
    }
    struct packer pk;
    memset(&pk, 0, sizeof(pk));
    struct packer *p = &pk;
    p->o = o;
    p->src = src_dir;
    p->err = err;
    p->err_len = err_len;
    if (!src_dir || !*src_dir || !dest_url || !*dest_url)
        return sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                             "pack needs a source folder and a destination");
    sf_status st = SF_OK;
    if (o->format != SF_PACK_FORMAT_TAR && o->format != SF_PACK_FORMAT_RECORD)
        st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT, "unknown shard format %d", (int)o->format);
    else if (o->layout != SF_PACK_LAYOUT_AUTO && o->layout != SF_PACK_LAYOUT_IMAGEFOLDER &&
             o->layout != SF_PACK_LAYOUT_FLAT)
        st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT, "unknown layout %d", (int)o->layout);
    else if (o->shard_bytes == 0)
        st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT, "the shard size must be at least 1 byte");
    else if (o->zstd_level < 0 || o->zstd_level > SF_PACK_ZSTD_LEVEL_MAX)
        st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT, "zstd level %d: expected 0 (off) to %d",
                           o->zstd_level, SF_PACK_ZSTD_LEVEL_MAX);
    else if (o->zstd_level && o->format == SF_PACK_FORMAT_TAR)
        st = sf__pack_fail(
            p, SF_ERR_UNSUPPORTED,
            "zstd compresses record shards only: readers stream plain tar (compressed "
            "tars cannot be read without copies); use the record format");
    else if (o->max_side && o->max_side < SF_PACK_MAX_SIDE_MIN)
        st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                           "max side %u: expected 0 (keep the JPEGs) or at "
                           "least %u pixels",
                           o->max_side, SF_PACK_MAX_SIDE_MIN);
    else if (o->jpeg_quality < 0 || o->jpeg_quality > SF_PACK_JPEG_QUALITY_MAX)
        st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                           "JPEG quality %d: expected 1 to %d (0: the "
                           "default, %d)",
                           o->jpeg_quality, SF_PACK_JPEG_QUALITY_MAX, DEFAULT_QUALITY);
    else if (o->jpeg_quality && !o->max_side)
        st = sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                           "a JPEG quality is for re-encoding: give the "
                           "max side too (JPEGs at most that large are kept as they are)");
    else if (o->name_pattern)
        st = check_pattern(p, o->name_pattern);
    if (st == SF_OK)
        st = sf__pack_check_src(p);
    if (st == SF_OK)
        st = resolve_dest(p, dest_url);
    if (st == SF_OK)
        st = sf__pack_scan(p);
    if (st == SF_OK)
        st = sf__pack_group_samples(p);
    if (st == SF_OK && p->to_s3)
        st = sf__pack_uploader_start(p);
    if (st == SF_OK && o->max_side)
        st = sf__pack_reencoder_start(p);
    if (st == SF_OK)
        st = write_shards(p);
    unsigned long long re_images = 0, re_source = 0, re_bytes = 0;
    if (p->re) {
        re_images = p->re->images;
        re_source = p->re->source_bytes;
        re_bytes = p->re->bytes;
    }
    sf__pack_reencoder_stop(p);
    if (p->to_s3) {
        /* every shard is uploaded before the index names it */
        sf__pack_uploader_stop(p);
        if (st == SF_OK && p->up.status != SF_OK)
            st = sf__pack_fail(p, p->up.status, "%s", p->up.err);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < p->n_shards; i++)
        total += p->shards[i].bytes;
    /* The last call comes before index.json: a cancel there must not leave
     * an index naming the shards the failure path removes. */
    if (st == SF_OK)
        st = report(p);
    if (st == SF_OK)
        st = sf__pack_write_index(p, total);
    if (st != SF_OK) {
        if (st == SF_ERR_NO_MEMORY)
            sf__pack_fail(p, st, "out of memory");
        remove_written(p);
    } else if (result) {
        result->format = o->format;
        result->layout = p->layout;
        result->shards = p->n_shards;
        result->samples = p->n_samples;
        result->files = p->n_entries;
        result->source_bytes = p->source_bytes;
        result->shard_bytes = total;
        result->ignored = p->ignored;
        result->classes = p->n_classes;
        result->reencoded = re_images;
        result->reencoded_source_bytes = re_source;
        result->reencoded_bytes = re_bytes;
    }
    packer_free(p);
    return st;
}
