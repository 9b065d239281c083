/* Shard readers: the pieces the tar and record readers share, and the public
 * sf_shard_reader that picks one of them from the shard's first bytes. */
#include "src/shard_reader.h"

#include "src/record.h"
#include "src/tar_reader.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ common */

void sf__shard_common_init(struct sf__shard_common *c, const char *name)
{
    memset(c, 0, sizeof *c);
    c->name = name ? name : "shard";
    c->err_offset = SF_SIZE_UNKNOWN;
}

__attribute__((format(printf, 4, 0))) static sf_status
shard_vfail(struct sf__shard_common *c, sf_status st, uint64_t offset, const char *fmt, va_list ap)
{
    if (c->err_status != SF_OK)
        return c->err_status;
    int n =
        snprintf(c->err, sizeof c->err, "%s: offset %llu: ", c->name, (unsigned long long)offset);
    if (n >= 0 && (size_t)n < sizeof c->err)
        vsnprintf(c->err + n, sizeof c->err - (size_t)n, fmt, ap);
    c->err_status = st;
    c->err_offset = offset;
    return st;
}

sf_status sf__shard_fail(struct sf__shard_common *c, sf_status st, uint64_t offset, const char *fmt,
                         ...)
{
    va_list ap;
    va_start(ap, fmt);
    st = shard_vfail(c, st, offset, fmt, ap);
    va_end(ap);
    return st;
}

enum sf__shard_need sf__shard_need(struct sf__shard_common *c, const struct sf__shard_input *in,
                                   uint64_t start, uint64_t len)
{
    uint64_t end;
    if (__builtin_add_overflow(start, len, &end))
        return SF__SHARD_PAST_END;
    if (end <= in->avail)
        return SF__SHARD_HAVE;
    if (in->total != SF_SIZE_UNKNOWN && end > in->total)
        return SF__SHARD_PAST_END;
    c->wanted = end;
    return SF__SHARD_NEED;
}

int sf__shard_have(struct sf__shard_common *c, const struct sf__shard_input *in, uint64_t start,
                   uint64_t len, uint64_t fail_at, const char *fmt, ...)
{
    enum sf__shard_need nd = sf__shard_need(c, in, start, len);
    if (nd == SF__SHARD_PAST_END) {
        va_list ap;
        va_start(ap, fmt);
        shard_vfail(c, SF_ERR_CORRUPT, fail_at, fmt, ap);
        va_end(ap);
    }
    return nd == SF__SHARD_HAVE;
}

/* ------------------------------------------------------------ sample builder */

void sf__sample_builder_free(struct sf__sample_builder *b)
{
    free(b->fields);
    free(b->name_at);
    free(b->data_rel);
    free(b->strings);
    memset(b, 0, sizeof *b);
}

static sf_status strings_reserve(struct sf__sample_builder *b, size_t more)
{
    if (more > SIZE_MAX - b->str_len)
        return SF_ERR_NO_MEMORY;
    size_t need = b->str_len + more;
    if (need <= b->str_cap)
        return SF_OK;
    size_t cap = b->str_cap ? b->str_cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->strings, cap);
    if (!p)
        return SF_ERR_NO_MEMORY;
    b->strings = p;
    b->str_cap = cap;
    return SF_OK;
}

sf_status sf__sample_builder_start(struct sf__sample_builder *b, const char *key, size_t key_len)
{
    b->count = 0;
    b->str_len = 0;
    if (strings_reserve(b, key_len + 1) != SF_OK)
        return SF_ERR_NO_MEMORY;
    memcpy(b->strings, key, key_len);
    b->strings[key_len] = '\0';
    b->str_len = key_len + 1;
    b->key_len = key_len;
    return SF_OK;
}

int sf__sample_builder_key_is(const struct sf__sample_builder *b, const char *key, size_t key_len)
{
    return b->strings && b->key_len == key_len && memcmp(b->strings, key, key_len) == 0;
}

static char lower_ascii(char ch)
{
    return (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
}

sf_status sf__sample_builder_add(struct sf__sample_builder *b, const char *name, size_t name_len,
                                 int lower, uint64_t data_rel, size_t size, uint64_t offset)
{
    if (b->count == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        struct sf_sample_field *f = realloc(b->fields, cap * sizeof *f);
        if (!f)
            return SF_ERR_NO_MEMORY;
        b->fields = f;
        size_t *na = realloc(b->name_at, cap * sizeof *na);
        if (!na)
            return SF_ERR_NO_MEMORY;
        b->name_at = na;
        uint64_t *dr = realloc(b->data_rel, cap * sizeof *dr);
        if (!dr)
            return SF_ERR_NO_MEMORY;
        b->data_rel = dr;
        b->cap = cap;
    }
    if (name_len == SIZE_MAX || strings_reserve(b, name_len + 1) != SF_OK)
        return SF_ERR_NO_MEMORY;
    char *dst = b->strings + b->str_len;
    for (size_t i = 0; i < name_len; i++)
        dst[i] = lower ? lower_ascii(name[i]) : name[i];
    dst[name_len] = '\0';
    struct sf_sample_field *f = &b->fields[b->count];
    memset(f, 0, sizeof *f);
    f->name_len = name_len;
    f->size = size;
    f->offset = offset;
    b->name_at[b->count] = b->str_len;
    b->data_rel[b->count] = data_rel;
    b->str_len += name_len + 1;
    b->count++;
    return SF_OK;
}

int sf__sample_builder_has(const struct sf__sample_builder *b, const char *name, size_t name_len,
                           int lower)
{
    for (size_t i = 0; i < b->count; i++) {
        if (b->fields[i].name_len != name_len)
            continue;
        const char *have = b->strings + b->name_at[i];
        size_t j = 0;
        while (j < name_len && have[j] == (lower ? lower_ascii(name[j]) : name[j]))
            j++;
        if (j == name_len)
            return 1;
    }
    return 0;
}

void sf__sample_builder_emit(struct sf__sample_builder *b, const unsigned char *base,
                             struct sf_sample *out)
{
    for (size_t i = 0; i < b->count; i++) {
        b->fields[i].name = b->strings + b->name_at[i];
        b->fields[i].data = base + b->data_rel[i];
    }
    out->key = b->strings;
    out->key_len = b->key_len;
    out->fields = b->fields;
    out->field_count = b->count;
}

/* ------------------------------------------------------------ detection */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int sf__shard_file_name(const char *name)
{
    return strlen(name) > 4 && (ends_with(name, ".tar") || ends_with(name, ".sfr"));
}

int sf__source_is_listing(const char *source)
{
    size_t n = strlen(source);
    if (n && source[n - 1] == '/')
        return 1;
    if (!strncmp(source, "s3://", 5) || !strncmp(source, "http://", 7) ||
        !strncmp(source, "https://", 8))
        return 0;
    struct stat sb;
    const char *path = strncmp(source, "file://", 7) ? source : source + 7;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

enum sf_shard_format sf__shard_detect(const unsigned char *p, uint64_t n, uint64_t total,
                                      const char *name)
{
    if (n >= 8)
        return memcmp(p, SF__RECORD_MAGIC, 8) == 0 ? SF_SHARD_FORMAT_RECORD : SF_SHARD_FORMAT_TAR;
    if (total == SF_SIZE_UNKNOWN || n < total)
        return SF_SHARD_FORMAT_AUTO;
    /* The whole shard is shorter than a magic: only the name can tell. */
    if (name && ends_with(name, ".sfr"))
        return SF_SHARD_FORMAT_RECORD;
    return SF_SHARD_FORMAT_TAR;
}

/* ------------------------------------------------------------ public reader */

struct sf_shard_reader {
    struct sf_shard_reader_options o;
    char *name;
    enum sf_shard_format format; /* AUTO until decided */
    struct sf__shard_input in;
    struct sf__tar_reader *tar;
    struct sf__record_reader *rec;
    struct sf__shard_common own; /* failures before a format reader exists, feed misuse */
};

void sf_shard_reader_options_init_default(struct sf_shard_reader_options *o)
{
    memset(o, 0, sizeof *o);
    o->format = SF_SHARD_FORMAT_AUTO;
    o->max_name_bytes = 4096;
    o->max_pax_bytes = 1u << 20;
    o->max_fields = 1024;
    o->max_record_bytes = 1ull << 30;
    o->zstd_window_log_max = 27;
}

sf_status sf_shard_reader_new(const struct sf_shard_reader_options *o, struct sf_shard_reader **out,
                              char *err, size_t err_len)
{
    if (!out) {
        if (err && err_len)
            snprintf(err, err_len, "sf_shard_reader_new: out is NULL");
        return SF_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    struct sf_shard_reader_options d;
    sf_shard_reader_options_init_default(&d);
    if (o) {
        d.name = o->name;
        d.format = o->format;
        if (o->max_name_bytes)
            d.max_name_bytes = o->max_name_bytes;
        if (o->max_pax_bytes)
            d.max_pax_bytes = o->max_pax_bytes;
        if (o->max_fields)
            d.max_fields = o->max_fields;
        if (o->max_record_bytes)
            d.max_record_bytes = o->max_record_bytes;
        if (o->zstd_window_log_max)
            d.zstd_window_log_max = o->zstd_window_log_max;
        d.require_end_marker = o->require_end_marker;
        d.skip_checksums = o->skip_checksums;
    }
    if (d.format != SF_SHARD_FORMAT_AUTO && d.format != SF_SHARD_FORMAT_TAR &&
        d.format != SF_SHARD_FORMAT_RECORD) {
        if (err && err_len)
            snprintf(err, err_len, "sf_shard_reader_new: unknown format %d", (int)d.format);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (d.zstd_window_log_max < 10 || d.zstd_window_log_max > 31) {
        if (err && err_len)
            snprintf(err, err_len, "sf_shard_reader_new: zstd_window_log_max %u not in 10..31",
                     d.zstd_window_log_max);
        return SF_ERR_INVALID_ARGUMENT;
    }
    struct sf_shard_reader *r = calloc(1, sizeof *r);
    char *name = strdup(d.name ? d.name : "shard");
    if (!r || !name) {
        free(r);
        free(name);
        if (err && err_len)
            snprintf(err, err_len, "sf_shard_reader_new: out of memory");
        return SF_ERR_NO_MEMORY;
    }
    r->o = d;
    r->o.name = name;
    r->name = name;
    r->format = SF_SHARD_FORMAT_AUTO;
    r->in.total = SF_SIZE_UNKNOWN;
    sf__shard_common_init(&r->own, name);
    *out = r;
    return SF_OK;
}

void sf_shard_reader_destroy(struct sf_shard_reader *r)
{
    if (!r)
        return;
    sf__tar_reader_destroy(r->tar);
    sf__record_reader_destroy(r->rec);
    free(r->name);
    free(r);
}

static const struct sf__shard_common *active(const struct sf_shard_reader *r)
{
    if (r->own.err_status != SF_OK)
        return &r->own;
    if (r->tar)
        return sf__tar_reader_common(r->tar);
    if (r->rec)
        return sf__record_reader_common(r->rec);
    return &r->own;
}

sf_status sf_shard_reader_feed(struct sf_shard_reader *r, const void *base,
                               unsigned long long contiguous_bytes, unsigned long long total_bytes)
{
    if (r->own.err_status != SF_OK)
        return r->own.err_status;
    if (contiguous_bytes < r->in.avail)
        return sf__shard_fail(&r->own, SF_ERR_INVALID_ARGUMENT, contiguous_bytes,
                              "feed: contiguous bytes went down from %llu",
                              (unsigned long long)r->in.avail);
    if (r->in.total != SF_SIZE_UNKNOWN && total_bytes != r->in.total)
        return sf__shard_fail(&r->own, SF_ERR_INVALID_ARGUMENT, contiguous_bytes,
                              "feed: total size changed from %llu to %llu",
                              (unsigned long long)r->in.total, total_bytes);
    if (total_bytes != SF_SIZE_UNKNOWN && contiguous_bytes > total_bytes)
        return sf__shard_fail(&r->own, SF_ERR_INVALID_ARGUMENT, contiguous_bytes,
                              "feed: %llu contiguous bytes exceed the total %llu", contiguous_bytes,
                              total_bytes);
    if (!base && contiguous_bytes > 0)
        return sf__shard_fail(&r->own, SF_ERR_INVALID_ARGUMENT, 0, "feed: NULL buffer");
    r->in.base = base;
    r->in.avail = contiguous_bytes;
    r->in.total = total_bytes;
    return SF_OK;
}

static sf_status start_format(struct sf_shard_reader *r)
{
    const unsigned char *p = r->in.base;
    int complete = r->in.total != SF_SIZE_UNKNOWN && r->in.avail == r->in.total;
    if (r->o.format != SF_SHARD_FORMAT_AUTO) {
        /* Forced format: still look at the first bytes for compression. */
        if (r->in.avail < 4 && !complete) {
            r->own.wanted = 4;
            return SF_OK;
        }
        r->format = r->o.format;
    } else {
        enum sf_shard_format f = sf__shard_detect(p, r->in.avail, r->in.total, r->name);
        if (f == SF_SHARD_FORMAT_AUTO) {
            r->own.wanted = 8;
            return SF_OK;
        }
        r->format = f;
    }
    if (r->format == SF_SHARD_FORMAT_TAR && r->in.avail >= 4) {
        /* A compressed tar would otherwise fail as a bad header checksum. */
        if (p[0] == 0x1f && p[1] == 0x8b)
            return sf__shard_fail(&r->own, SF_ERR_UNSUPPORTED, 0,
                                  "gzip-compressed tar is not supported; store shards "
                                  "uncompressed or use record shards with zstd");
        if (p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd)
            return sf__shard_fail(&r->own, SF_ERR_UNSUPPORTED, 0,
                                  "zstd-compressed tar is not supported; store shards "
                                  "uncompressed or use record shards with zstd");
    }
    sf_status st;
    if (r->format == SF_SHARD_FORMAT_TAR) {
        struct sf__tar_options to = {
            .max_name_bytes = r->o.max_name_bytes,
            .max_pax_bytes = r->o.max_pax_bytes,
            .max_fields = r->o.max_fields,
            .require_end_marker = r->o.require_end_marker,
        };
        st = sf__tar_reader_new(&to, r->name, &r->tar);
    } else {
        struct sf__record_reader_options ro = {
            .max_record_bytes = r->o.max_record_bytes,
            .max_key_bytes = r->o.max_name_bytes,
            .max_fields = r->o.max_fields,
            .zstd_window_log_max = r->o.zstd_window_log_max,
            .skip_checksums = r->o.skip_checksums,
        };
        st = sf__record_reader_new(&ro, r->name, &r->rec);
    }
    if (st != SF_OK)
        return sf__shard_fail(&r->own, st, 0, "cannot create the reader: %s", sf_status_str(st));
    return SF_OK;
}

sf_status sf_shard_reader_next(struct sf_shard_reader *r, struct sf_sample *sample,
                               enum sf_shard_event *event)
{
    *event = SF_SHARD_NEED_MORE;
    if (r->own.err_status != SF_OK)
        return r->own.err_status;
    if (!r->tar && !r->rec) {
        sf_status st = start_format(r);
        if (st != SF_OK)
            return st;
        if (!r->tar && !r->rec)
            return SF_OK;
    }
    if (r->tar)
        return sf__tar_reader_next(r->tar, &r->in, sample, event);
    return sf__record_reader_next(r->rec, &r->in, sample, event);
}

unsigned long long sf_shard_reader_wanted(const struct sf_shard_reader *r)
{
    return active(r)->wanted;
}

uint64_t sf__shard_reader_keep_from(const struct sf_shard_reader *r)
{
    if (r->tar)
        return sf__tar_reader_keep_from(r->tar);
    if (r->rec)
        return sf__record_reader_keep_from(r->rec);
    return 0;
}

enum sf_shard_format sf_shard_reader_format(const struct sf_shard_reader *r)
{
    return (r->tar || r->rec) ? r->format : SF_SHARD_FORMAT_AUTO;
}

const char *sf_shard_reader_errmsg(const struct sf_shard_reader *r)
{
    return active(r)->err;
}

unsigned long long sf_shard_reader_error_offset(const struct sf_shard_reader *r)
{
    return active(r)->err_offset;
}

void sf_shard_reader_stats(const struct sf_shard_reader *r, struct sf_shard_stats *out)
{
    if (r->tar)
        *out = sf__tar_reader_common(r->tar)->stats;
    else if (r->rec)
        *out = sf__record_reader_common(r->rec)->stats;
    else
        memset(out, 0, sizeof *out);
}
