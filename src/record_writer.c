/* Record shards: the writer. The layout is specified in docs/FORMAT.md. */
#include "src/record.h"
#include "src/record_internal.h"

#include "common/strbuf.h"
#include "common/endian.h"
#include "common/io.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define DEFAULT_MAX_MEMORY ((size_t)4 << 30)

enum dest { DEST_MEMORY, DEST_FD, DEST_FILE };

struct sf__record_writer {
    struct sf__record_writer_options o;
    enum dest dest;
    unsigned char *mem;
    size_t mem_len, mem_cap;
    uint64_t written;
    struct sf__record_entry *ent;
    size_t n, cap;
    unsigned char *pre; /* body without the field data */
    size_t pre_cap;
    unsigned char *raw; /* whole body, when compressing */
    size_t raw_cap;
    unsigned char *z;
    size_t z_cap;
    ZSTD_CCtx *cctx;
    XXH3_state_t *xxh;
    int finished;
    sf_status err_status;
    char err[256];
};

void sf__record_writer_options_init_default(struct sf__record_writer_options *o)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->max_memory_bytes = DEFAULT_MAX_MEMORY;
    o->max_record_bytes = DEFAULT_MAX_RECORD;
}

static sf_status wfail(struct sf__record_writer *w, sf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sf_status wfail(struct sf__record_writer *w, sf_status st, const char *fmt, ...)
{
    if (w->err_status != SF_OK)
        return w->err_status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    w->err_status = st;
    return st;
}

static sf_status emit_bytes(struct sf__record_writer *w, const void *data, size_t n)
{
    if (n == 0)
        return SF_OK;
    switch (w->dest) {
    case DEST_MEMORY:
        if (n > w->o.max_memory_bytes - w->mem_len)
            return wfail(w, SF_ERR_LIMIT, "record shard exceeds max_memory_bytes %zu",
                         w->o.max_memory_bytes);
        if (sf__record_reserve(&w->mem, &w->mem_cap, w->mem_len + n) != 0)
            return wfail(w, SF_ERR_NO_MEMORY, "out of memory growing the shard to %zu bytes",
                         w->mem_len + n);
        memcpy(w->mem + w->mem_len, data, n);
        w->mem_len += n;
        break;
    case DEST_FD: {
        size_t done;
        int rc = sf__write_full(w->o.fd, data, n, &done);
        if (rc)
            return wfail(w, SF_ERR_IO, "write at offset %llu: %s",
                         (unsigned long long)(w->written + done),
                         rc < 0 ? strerror(errno) : "no progress");
        break;
    }
    case DEST_FILE:
        if (fwrite(data, 1, n, w->o.file) != n)
            return wfail(w, SF_ERR_IO, "fwrite at offset %llu: %s", (unsigned long long)w->written,
                         strerror(errno));
        break;
    }
    w->written += n;
    return SF_OK;
}

sf_status sf__record_writer_new(const struct sf__record_writer_options *o,
                                struct sf__record_writer **out, char *err, size_t err_len)
{
    *out = NULL;
    struct sf__record_writer *w = calloc(1, sizeof *w);
    if (!w)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    if (o)
        w->o = *o;
    else
        sf__record_writer_options_init_default(&w->o);
    if (!w->o.max_memory_bytes)
        w->o.max_memory_bytes = DEFAULT_MAX_MEMORY;
    if (!w->o.max_record_bytes)
        w->o.max_record_bytes = DEFAULT_MAX_RECORD;
    if (w->o.zstd_level < 0 || w->o.zstd_level > ZSTD_maxCLevel()) {
        int lvl = w->o.zstd_level;
        free(w);
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "zstd_level %d not in 0..%d", lvl,
                        ZSTD_maxCLevel());
    }
    w->dest = w->o.fd >= 0 ? DEST_FD : w->o.file ? DEST_FILE : DEST_MEMORY;
    w->xxh = XXH3_createState();
    if (w->o.zstd_level > 0)
        w->cctx = ZSTD_createCCtx();
    if (!w->xxh || (w->o.zstd_level > 0 && !w->cctx)) {
        sf__record_writer_destroy(w);
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    }
    if (w->cctx) {
        ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, w->o.zstd_level);
        ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 0); /* ours covers it */
    }
    unsigned char hdr[SF__RECORD_HEADER_BYTES];
    memcpy(hdr, SF__RECORD_MAGIC, 8);
    sf__put_le32(hdr + 8, SF__RECORD_VERSION);
    sf__put_le32(hdr + 12, 0);
    sf_status st = emit_bytes(w, hdr, sizeof hdr);
    if (st != SF_OK) {
        sf__fail(err, err_len, st, "%s", w->err);
        sf__record_writer_destroy(w);
        return st;
    }
    *out = w;
    return SF_OK;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* 1 when two fields share a name. */
static int has_duplicate(const struct sf__record_field_in *f, size_t n)
{
    if (n <= 32) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (strcmp(f[i].name, f[j].name) == 0)
                    return 1;
        return 0;
    }
    const char **v = malloc(n * sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < n; i++)
        v[i] = f[i].name;
    qsort(v, n, sizeof *v, cmp_names);
    int dup = 0;
    for (size_t i = 1; i < n && !dup; i++)
        dup = strcmp(v[i - 1], v[i]) == 0;
    free(v);
    return dup;
}

sf_status sf__record_writer_add(struct sf__record_writer *w, const char *key,
                                const struct sf__record_field_in *fields, size_t n)
{
    if (w->err_status != SF_OK)
        return w->err_status;
    if (w->finished)
        return wfail(w, SF_ERR_INVALID_ARGUMENT, "add after finish");
    size_t klen = key ? strlen(key) : 0;
    if (klen == 0 || klen > SF__RECORD_MAX_KEY_BYTES)
        return wfail(w, SF_ERR_INVALID_ARGUMENT, "record %llu: key must be 1..%u bytes",
                     (unsigned long long)w->n, SF__RECORD_MAX_KEY_BYTES);
    if (n > SF__RECORD_MAX_FIELDS || (n && !fields))
        return wfail(w, SF_ERR_INVALID_ARGUMENT, "record '%s': %zu fields (max %u)", key, n,
                     SF__RECORD_MAX_FIELDS);
    uint64_t pre_len = 8 + (uint64_t)SF__RECORD_FIELD_DESC_BYTES * n + klen;
    uint64_t raw_len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nl = fields[i].name ? strlen(fields[i].name) : 0;
        if (nl == 0 || nl > SF__RECORD_MAX_NAME_BYTES)
            return wfail(w, SF_ERR_INVALID_ARGUMENT,
                         "record '%s': field %zu name must be 1..%u bytes", key, i,
                         SF__RECORD_MAX_NAME_BYTES);
        if (!fields[i].data && fields[i].size)
            return wfail(w, SF_ERR_INVALID_ARGUMENT, "record '%s': field '%s' has no data", key,
                         fields[i].name);
        pre_len += nl;
        if (__builtin_add_overflow(raw_len, (uint64_t)fields[i].size, &raw_len))
            return wfail(w, SF_ERR_LIMIT, "record '%s': size overflows", key);
    }
    int dup = has_duplicate(fields, n);
    if (dup < 0)
        return wfail(w, SF_ERR_NO_MEMORY, "out of memory");
    if (dup)
        return wfail(w, SF_ERR_INVALID_ARGUMENT, "record '%s': two fields share a name", key);
    if (__builtin_add_overflow(raw_len, pre_len, &raw_len) || raw_len > w->o.max_record_bytes)
        return wfail(w, SF_ERR_LIMIT, "record '%s': body of %llu bytes exceeds %llu", key,
                     (unsigned long long)raw_len, (unsigned long long)w->o.max_record_bytes);

    /* The body without the data: counts, descriptors, key, names. */
    if (sf__record_reserve(&w->pre, &w->pre_cap, (size_t)pre_len) != 0)
        return wfail(w, SF_ERR_NO_MEMORY, "out of memory");
    unsigned char *p = w->pre;
    sf__put_le32(p, (uint32_t)klen);
    sf__put_le32(p + 4, (uint32_t)n);
    p += 8;
    for (size_t i = 0; i < n; i++, p += SF__RECORD_FIELD_DESC_BYTES) {
        sf__put_le32(p, (uint32_t)strlen(fields[i].name));
        sf__put_le32(p + 4, 0);
        sf__put_le64(p + 8, fields[i].size);
    }
    memcpy(p, key, klen);
    p += klen;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(fields[i].name);
        memcpy(p, fields[i].name, nl);
        p += nl;
    }

    uint32_t flags = 0;
    size_t stored = (size_t)raw_len;
    if (w->cctx) {
        if (sf__record_reserve(&w->raw, &w->raw_cap, (size_t)raw_len) != 0)
            return wfail(w, SF_ERR_NO_MEMORY, "out of memory");
        memcpy(w->raw, w->pre, (size_t)pre_len);
        size_t at = (size_t)pre_len;
        for (size_t i = 0; i < n; i++) {
            if (fields[i].size)
                memcpy(w->raw + at, fields[i].data, fields[i].size);
            at += fields[i].size;
        }
        size_t bound = ZSTD_compressBound((size_t)raw_len);
        if (sf__record_reserve(&w->z, &w->z_cap, bound) != 0)
            return wfail(w, SF_ERR_NO_MEMORY, "out of memory");
        size_t c = ZSTD_compress2(w->cctx, w->z, bound, w->raw, (size_t)raw_len);
        if (ZSTD_isError(c))
            return wfail(w, SF_ERR_INTERNAL, "record '%s': zstd: %s", key, ZSTD_getErrorName(c));
        if (c < raw_len) {
            flags = SF__RECORD_FLAG_ZSTD;
            stored = c;
        }
    }

    unsigned char hdr[SF__RECORD_REC_HEADER_BYTES];
    memcpy(hdr, TAG_RECORD, 4);
    sf__put_le32(hdr + 4, flags);
    sf__put_le64(hdr + 8, w->n);
    sf__put_le64(hdr + 16, stored);
    sf__put_le64(hdr + 24, raw_len);
    XXH3_64bits_reset(w->xxh);
    XXH3_64bits_update(w->xxh, hdr, 32);
    if (flags & SF__RECORD_FLAG_ZSTD) {
        XXH3_64bits_update(w->xxh, w->z, stored);
    } else {
        XXH3_64bits_update(w->xxh, w->pre, (size_t)pre_len);
        for (size_t i = 0; i < n; i++)
            if (fields[i].size)
                XXH3_64bits_update(w->xxh, fields[i].data, fields[i].size);
    }
    sf__put_le64(hdr + 32, XXH3_64bits_digest(w->xxh));

    uint64_t off = w->written;
    sf_status st = emit_bytes(w, hdr, sizeof hdr);
    if (st == SF_OK && (flags & SF__RECORD_FLAG_ZSTD)) {
        st = emit_bytes(w, w->z, stored);
    } else if (st == SF_OK) {
        st = emit_bytes(w, w->pre, (size_t)pre_len);
        for (size_t i = 0; i < n && st == SF_OK; i++)
            st = emit_bytes(w, fields[i].data, fields[i].size);
    }
    if (st != SF_OK)
        return st;
    if (sf__record_push_entry(&w->ent, &w->n, &w->cap, off,
                              SF__RECORD_REC_HEADER_BYTES + (uint64_t)stored))
        return wfail(w, SF_ERR_NO_MEMORY, "out of memory");
    return SF_OK;
}

sf_status sf__record_writer_finish(struct sf__record_writer *w)
{
    if (w->err_status != SF_OK)
        return w->err_status;
    if (w->finished)
        return wfail(w, SF_ERR_INVALID_ARGUMENT, "finish called twice");
    uint64_t index_off = w->written;
    size_t ibytes = SF__RECORD_INDEX_FIXED_BYTES + SF__RECORD_INDEX_ENTRY_BYTES * w->n;
    unsigned char *ix = malloc(ibytes);
    if (!ix)
        return wfail(w, SF_ERR_NO_MEMORY, "out of memory for the index");
    memcpy(ix, TAG_INDEX, 4);
    sf__put_le32(ix + 4, 0);
    sf__put_le64(ix + 8, w->n);
    for (size_t i = 0; i < w->n; i++) {
        sf__put_le64(ix + 16 + 16 * i, w->ent[i].off);
        sf__put_le64(ix + 24 + 16 * i, w->ent[i].bytes);
    }
    sf__put_le64(ix + ibytes - 8, XXH3_64bits(ix, ibytes - 8));
    sf_status st = emit_bytes(w, ix, ibytes);
    free(ix);
    if (st != SF_OK)
        return st;
    unsigned char ft[SF__RECORD_FOOTER_BYTES];
    sf__put_le64(ft, index_off);
    sf__put_le64(ft + 8, ibytes);
    sf__put_le64(ft + 16, w->n);
    sf__put_le64(ft + 24, XXH3_64bits(ft, 24));
    memcpy(ft + 32, SF__RECORD_FOOTER_MAGIC, 8);
    st = emit_bytes(w, ft, sizeof ft);
    if (st != SF_OK)
        return st;
    w->finished = 1;
    return SF_OK;
}

void *sf__record_writer_take(struct sf__record_writer *w, size_t *size)
{
    if (w->dest != DEST_MEMORY || !w->finished || w->err_status != SF_OK || !w->mem) {
        if (size)
            *size = 0;
        return NULL;
    }
    void *p = w->mem;
    if (size)
        *size = w->mem_len;
    w->mem = NULL;
    w->mem_len = w->mem_cap = 0;
    return p;
}

uint64_t sf__record_writer_count(const struct sf__record_writer *w)
{
    return w->n;
}

uint64_t sf__record_writer_bytes(const struct sf__record_writer *w)
{
    return w->written;
}

const char *sf__record_writer_errmsg(const struct sf__record_writer *w)
{
    return w->err;
}

void sf__record_writer_destroy(struct sf__record_writer *w)
{
    if (!w)
        return;
    free(w->mem);
    free(w->ent);
    free(w->pre);
    free(w->raw);
    free(w->z);
    ZSTD_freeCCtx(w->cctx);
    XXH3_freeState(w->xxh);
    free(w);
}
