/* Record shards: streaming reader, index and random access; the writer is
 * src/record_writer.c. The layout is specified in docs/FORMAT.md. */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_getFrameHeader: window size of a frame */
#include "src/record.h"
#include "src/record_internal.h"

#include "common/strbuf.h"
#include "common/endian.h"
#include "common/grow.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

int sf__record_reserve(unsigned char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : c * 2;
    unsigned char *p = realloc(*buf, c);
    if (!p)
        return -1;
    *buf = p;
    *cap = c;
    return 0;
}

int sf__record_push_entry(struct sf__record_entry **v, size_t *n, size_t *cap, uint64_t off,
                          uint64_t bytes)
{
    struct sf__record_entry *p = sf__grow(*v, *n, cap, sizeof *p, 64);
    if (!p)
        return -1;
    *v = p;
    (*v)[*n].off = off;
    (*v)[*n].bytes = bytes;
    (*n)++;
    return 0;
}

/* ============================================================ reader */

enum rstate { RS_HEADER, RS_RECORDS, RS_TAIL, RS_END };

struct sf__record_reader {
    struct sf__shard_common c;
    char *name;
    struct sf__record_reader_options o;
    enum rstate state;
    uint64_t pos;
    uint64_t nrec;
    struct sf__record_entry *seen;
    size_t seen_n, seen_cap;
    ZSTD_DCtx *dctx;
    unsigned char *dbuf;
    size_t dbuf_cap;
    XXH3_state_t *xxh;
    struct sf__sample_builder sb;
};

sf_status sf__record_reader_new(const struct sf__record_reader_options *o, const char *name,
                                struct sf__record_reader **out)
{
    *out = NULL;
    struct sf__record_reader *rr = calloc(1, sizeof *rr);
    if (!rr)
        return SF_ERR_NO_MEMORY;
    if (o)
        rr->o = *o;
    if (!rr->o.max_record_bytes)
        rr->o.max_record_bytes = DEFAULT_MAX_RECORD;
    if (!rr->o.max_key_bytes)
        rr->o.max_key_bytes = SF__RECORD_MAX_KEY_BYTES;
    if (!rr->o.max_fields)
        rr->o.max_fields = 1024;
    if (!rr->o.zstd_window_log_max)
        rr->o.zstd_window_log_max = 27;
    rr->name = strdup(name ? name : "shard");
    rr->xxh = XXH3_createState();
    if (!rr->name || !rr->xxh) {
        sf__record_reader_destroy(rr);
        return SF_ERR_NO_MEMORY;
    }
    sf__shard_common_init(&rr->c, rr->name);
    *out = rr;
    return SF_OK;
}

void sf__record_reader_destroy(struct sf__record_reader *rr)
{
    if (!rr)
        return;
    sf__sample_builder_free(&rr->sb);
    free(rr->seen);
    free(rr->dbuf);
    ZSTD_freeDCtx(rr->dctx);
    XXH3_freeState(rr->xxh);
    free(rr->name);
    free(rr);
}

const struct sf__shard_common *sf__record_reader_common(const struct sf__record_reader *rr)
{
    return &rr->c;
}

uint64_t sf__record_reader_keep_from(const struct sf__record_reader *rr)
{
    return rr->pos;
}

const char *sf__record_reader_errmsg(const struct sf__record_reader *rr)
{
    return rr->c.err;
}

/* Checks a record header at offset; fills *stored and *raw. */
static sf_status check_rec_header(struct sf__record_reader *rr, const unsigned char *h,
                                  uint64_t offset, uint64_t ordinal, uint64_t *stored,
                                  uint64_t *raw)
{
    unsigned long long ord = (unsigned long long)ordinal;
    if (memcmp(h, TAG_RECORD, 4) != 0)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset, "record %llu: bad record tag", ord);
    uint32_t flags = sf__get_le32(h + 4);
    if (flags & ~SF__RECORD_FLAG_ZSTD)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset, "record %llu: unknown flags 0x%x",
                              ord, flags);
    if (sf__get_le64(h + 8) != ordinal)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                              "record %llu: header says it is record %llu", ord,
                              (unsigned long long)sf__get_le64(h + 8));
    *stored = sf__get_le64(h + 16);
    *raw = sf__get_le64(h + 24);
    if (*stored > rr->o.max_record_bytes || *raw > rr->o.max_record_bytes)
        return sf__shard_fail(&rr->c, SF_ERR_LIMIT, offset,
                              "record %llu: body of %llu bytes (%llu stored) exceeds "
                              "max_record_bytes %llu",
                              ord, (unsigned long long)*raw, (unsigned long long)*stored,
                              (unsigned long long)rr->o.max_record_bytes);
    if (!(flags & SF__RECORD_FLAG_ZSTD) && *stored != *raw)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                              "record %llu: uncompressed but stored %llu != raw %llu bytes", ord,
                              (unsigned long long)*stored, (unsigned long long)*raw);
    if (*raw < 8)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                              "record %llu: body of %llu bytes is too short", ord,
                              (unsigned long long)*raw);
    return SF_OK;
}

/* Decodes a complete record (header checked by check_rec_header) into out. */
static sf_status decode(struct sf__record_reader *rr, const unsigned char *rec, uint64_t offset,
                        uint64_t ordinal, uint64_t stored, uint64_t raw, struct sf_sample *out)
{
    unsigned long long ord = (unsigned long long)ordinal;
    const unsigned char *src = rec + SF__RECORD_REC_HEADER_BYTES;
    if (!rr->o.skip_checksums) {
        XXH3_64bits_reset(rr->xxh);
        XXH3_64bits_update(rr->xxh, rec, 32);
        XXH3_64bits_update(rr->xxh, src, (size_t)stored);
        uint64_t sum = XXH3_64bits_digest(rr->xxh);
        if (sum != sf__get_le64(rec + 32))
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                                  "record %llu: checksum mismatch (stored %016llx, computed "
                                  "%016llx)",
                                  ord, (unsigned long long)sf__get_le64(rec + 32),
                                  (unsigned long long)sum);
    }
    const unsigned char *body = src;
    int owned = 0;
    if (sf__get_le32(rec + 4) & SF__RECORD_FLAG_ZSTD) {
        ZSTD_frameHeader zfh;
        size_t r = ZSTD_getFrameHeader(&zfh, src, (size_t)stored);
        if (ZSTD_isError(r) || r != 0 || zfh.frameType != ZSTD_frame)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                                  "record %llu: body is not a zstd frame", ord);
        if (zfh.windowSize > (1ull << rr->o.zstd_window_log_max))
            return sf__shard_fail(&rr->c, SF_ERR_LIMIT, offset,
                                  "record %llu: zstd window of %llu bytes exceeds 2^%u", ord,
                                  (unsigned long long)zfh.windowSize, rr->o.zstd_window_log_max);
        if (zfh.frameContentSize != ZSTD_CONTENTSIZE_UNKNOWN && zfh.frameContentSize != raw)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                                  "record %llu: zstd frame holds %llu bytes, header says %llu", ord,
                                  (unsigned long long)zfh.frameContentSize,
                                  (unsigned long long)raw);
        size_t fsz = ZSTD_findFrameCompressedSize(src, (size_t)stored);
        if (ZSTD_isError(fsz) || fsz != stored)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                                  "record %llu: the zstd frame does not span the body", ord);
        if (!rr->dctx && !(rr->dctx = ZSTD_createDCtx()))
            return sf__shard_fail(&rr->c, SF_ERR_NO_MEMORY, offset, "out of memory");
        if (sf__record_reserve(&rr->dbuf, &rr->dbuf_cap, (size_t)raw) != 0)
            return sf__shard_fail(&rr->c, SF_ERR_NO_MEMORY, offset,
                                  "record %llu: out of memory for %llu decompressed bytes", ord,
                                  (unsigned long long)raw);
        size_t d = ZSTD_decompressDCtx(rr->dctx, rr->dbuf, (size_t)raw, src, (size_t)stored);
        if (ZSTD_isError(d) || d != raw)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset, "record %llu: zstd: %s", ord,
                                  ZSTD_isError(d) ? ZSTD_getErrorName(d) : "short output");
        rr->c.stats.decompressed_bytes += raw;
        body = rr->dbuf;
        owned = 1;
    }

    /* Body layout: counts, descriptors, key, names, data; sizes must add up. */
    uint32_t klen = sf__get_le32(body), fc = sf__get_le32(body + 4);
    if (fc > rr->o.max_fields)
        return sf__shard_fail(&rr->c, SF_ERR_LIMIT, offset,
                              "record %llu: %u fields exceed max_fields %zu", ord, fc,
                              rr->o.max_fields);
    if (klen > rr->o.max_key_bytes)
        return sf__shard_fail(&rr->c, SF_ERR_LIMIT, offset,
                              "record %llu: key of %u bytes exceeds %zu", ord, klen,
                              rr->o.max_key_bytes);
    uint64_t at = 8 + (uint64_t)SF__RECORD_FIELD_DESC_BYTES * fc;
    if (klen == 0 || at > raw || klen > raw - at)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                              "record %llu: bad body layout (key or field table)", ord);
    uint64_t names_at = at + klen, sum = names_at;
    for (uint32_t i = 0; i < fc; i++) {
        const unsigned char *d = body + 8 + (size_t)SF__RECORD_FIELD_DESC_BYTES * i;
        uint32_t nl = sf__get_le32(d);
        uint64_t dl = sf__get_le64(d + 8);
        if (nl == 0 || nl > SF__RECORD_MAX_NAME_BYTES || sf__get_le32(d + 4) != 0 ||
            __builtin_add_overflow(sum, (uint64_t)nl, &sum) ||
            __builtin_add_overflow(sum, dl, &sum) || sum > raw)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                                  "record %llu: bad descriptor of field %u", ord, i);
    }
    if (sum != raw)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                              "record %llu: fields take %llu of %llu body bytes", ord,
                              (unsigned long long)sum, (unsigned long long)raw);
    const char *key = (const char *)body + at;
    if (memchr(key, '\0', klen))
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset, "record %llu: NUL in key", ord);
    if (sf__sample_builder_start(&rr->sb, key, klen) != SF_OK)
        return sf__shard_fail(&rr->c, SF_ERR_NO_MEMORY, offset, "out of memory");
    uint64_t name_at = names_at;
    uint64_t data_at = names_at;
    for (uint32_t i = 0; i < fc; i++)
        data_at += sf__get_le32(body + 8 + (size_t)SF__RECORD_FIELD_DESC_BYTES * i);
    for (uint32_t i = 0; i < fc; i++) {
        const unsigned char *d = body + 8 + (size_t)SF__RECORD_FIELD_DESC_BYTES * i;
        uint32_t nl = sf__get_le32(d);
        uint64_t dl = sf__get_le64(d + 8);
        const char *nm = (const char *)body + name_at;
        if (memchr(nm, '\0', nl))
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                                  "record %llu: NUL in the name of field %u", ord, i);
        if (sf__sample_builder_has(&rr->sb, nm, nl, 0))
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                                  "record %llu: field '%.*s' appears twice", ord, (int)nl, nm);
        uint64_t foff = owned ? offset : offset + SF__RECORD_REC_HEADER_BYTES + data_at;
        if (sf__sample_builder_add(&rr->sb, nm, nl, 0, data_at, (size_t)dl, foff) != SF_OK)
            return sf__shard_fail(&rr->c, SF_ERR_NO_MEMORY, offset, "out of memory");
        name_at += nl;
        data_at += dl;
    }
    memset(out, 0, sizeof *out);
    sf__sample_builder_emit(&rr->sb, body, out);
    out->index = ordinal;
    out->offset = offset;
    out->end = offset + SF__RECORD_REC_HEADER_BYTES + stored;
    out->reader_owned = owned;
    rr->c.stats.records++;
    rr->c.stats.samples++;
    rr->c.stats.fields += fc;
    return SF_OK;
}

sf_status sf__record_reader_decode(struct sf__record_reader *rr, const void *rec, size_t rec_bytes,
                                   uint64_t offset, uint64_t ordinal, struct sf_sample *out)
{
    /* Random access: each call reports its own failure. */
    rr->c.err_status = SF_OK;
    rr->c.err[0] = '\0';
    rr->c.err_offset = SF_SIZE_UNKNOWN;
    const unsigned char *h = rec;
    if (!rec || rec_bytes < SF__RECORD_REC_HEADER_BYTES)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                              "record %llu: %zu bytes, shorter than a record header",
                              (unsigned long long)ordinal, rec_bytes);
    uint64_t stored = 0, raw = 0;
    sf_status st = check_rec_header(rr, h, offset, ordinal, &stored, &raw);
    if (st != SF_OK)
        return st;
    if (stored != rec_bytes - SF__RECORD_REC_HEADER_BYTES)
        return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, offset,
                              "record %llu: header says %llu body bytes, the index %llu",
                              (unsigned long long)ordinal, (unsigned long long)stored,
                              (unsigned long long)(rec_bytes - SF__RECORD_REC_HEADER_BYTES));
    return decode(rr, h, offset, ordinal, stored, raw, out);
}

/* ------------------------------------------------------------ streaming */

/* Checks a footer against the index it should describe. */
static sf_status check_footer(struct sf__shard_common *c, const unsigned char *ft, uint64_t at,
                              uint64_t *index_off, uint64_t *index_bytes, uint64_t *count)
{
    if (memcmp(ft + 32, SF__RECORD_FOOTER_MAGIC, 8) != 0)
        return sf__shard_fail(c, SF_ERR_CORRUPT, at, "bad record shard footer magic");
    if (XXH3_64bits(ft, 24) != sf__get_le64(ft + 24))
        return sf__shard_fail(c, SF_ERR_CORRUPT, at, "record shard footer checksum mismatch");
    *index_off = sf__get_le64(ft);
    *index_bytes = sf__get_le64(ft + 8);
    *count = sf__get_le64(ft + 16);
    if (*count > (UINT64_MAX - SF__RECORD_INDEX_FIXED_BYTES) / SF__RECORD_INDEX_ENTRY_BYTES ||
        *index_bytes != SF__RECORD_INDEX_FIXED_BYTES + SF__RECORD_INDEX_ENTRY_BYTES * *count)
        return sf__shard_fail(c, SF_ERR_CORRUPT, at,
                              "footer: index of %llu bytes cannot hold %llu records",
                              (unsigned long long)*index_bytes, (unsigned long long)*count);
    return SF_OK;
}

/* Checks an index block's tag, count and checksum (ix holds ibytes bytes). */
static sf_status check_index(struct sf__shard_common *c, const unsigned char *ix, uint64_t ibytes,
                             uint64_t at, uint64_t count)
{
    if (memcmp(ix, TAG_INDEX, 4) != 0 || sf__get_le32(ix + 4) != 0)
        return sf__shard_fail(c, SF_ERR_CORRUPT, at, "bad index block tag");
    if (sf__get_le64(ix + 8) != count)
        return sf__shard_fail(c, SF_ERR_CORRUPT, at,
                              "index block lists %llu records, the footer %llu",
                              (unsigned long long)sf__get_le64(ix + 8), (unsigned long long)count);
    if (XXH3_64bits(ix, (size_t)ibytes - 8) != sf__get_le64(ix + ibytes - 8))
        return sf__shard_fail(c, SF_ERR_CORRUPT, at, "index block checksum mismatch");
    return SF_OK;
}

sf_status sf__record_reader_next(struct sf__record_reader *rr, const struct sf__shard_input *in,
                                 struct sf_sample *out, enum sf_shard_event *event)
{
    *event = SF_SHARD_NEED_MORE;
    if (rr->c.err_status != SF_OK)
        return rr->c.err_status;
    const unsigned char *b = in->base;
    if (rr->state == RS_HEADER) {
        if (!sf__shard_have(&rr->c, in, 0, SF__RECORD_HEADER_BYTES, 0,
                            "truncated: %llu bytes, shorter than the 16-byte record shard "
                            "header",
                            (unsigned long long)in->total))
            return rr->c.err_status;
        if (memcmp(b, SF__RECORD_MAGIC, 8) != 0)
            return sf__shard_fail(&rr->c, SF_ERR_PARSE, 0, "not a record shard (bad magic)");
        if (sf__get_le32(b + 8) != SF__RECORD_VERSION)
            return sf__shard_fail(&rr->c, SF_ERR_PARSE, 8, "unsupported record shard version %u",
                                  sf__get_le32(b + 8));
        if (sf__get_le32(b + 12) != 0)
            return sf__shard_fail(&rr->c, SF_ERR_PARSE, 12, "unknown record shard flags 0x%x",
                                  sf__get_le32(b + 12));
        rr->pos = SF__RECORD_HEADER_BYTES;
        rr->state = RS_RECORDS;
    }
    if (rr->state == RS_RECORDS) {
        const uint64_t at = rr->pos;
        unsigned long long n = (unsigned long long)rr->nrec;
        if (!sf__shard_have(&rr->c, in, at, 4, at,
                            "truncated: the shard ends (%llu bytes) before record %llu or "
                            "the index",
                            (unsigned long long)in->total, n))
            return rr->c.err_status;
        if (memcmp(b + at, TAG_RECORD, 4) == 0) {
            if (!sf__shard_have(&rr->c, in, at, SF__RECORD_REC_HEADER_BYTES, at,
                                "truncated: record %llu header runs past the end of the "
                                "shard (%llu bytes)",
                                n, (unsigned long long)in->total))
                return rr->c.err_status;
            uint64_t stored = 0, raw = 0;
            sf_status st = check_rec_header(rr, b + at, at, rr->nrec, &stored, &raw);
            if (st != SF_OK)
                return st;
            if (!sf__shard_have(&rr->c, in, at, SF__RECORD_REC_HEADER_BYTES + stored, at,
                                "truncated: record %llu of %llu bytes runs past the end of "
                                "the shard (%llu bytes)",
                                n, (unsigned long long)(SF__RECORD_REC_HEADER_BYTES + stored),
                                (unsigned long long)in->total))
                return rr->c.err_status;
            st = decode(rr, b + at, at, rr->nrec, stored, raw, out);
            if (st != SF_OK)
                return st;
            if (sf__record_push_entry(&rr->seen, &rr->seen_n, &rr->seen_cap, at,
                                      SF__RECORD_REC_HEADER_BYTES + stored))
                return sf__shard_fail(&rr->c, SF_ERR_NO_MEMORY, at, "out of memory");
            rr->pos = at + SF__RECORD_REC_HEADER_BYTES + stored;
            rr->nrec++;
            *event = SF_SHARD_SAMPLE;
            return SF_OK;
        }
        if (memcmp(b + at, TAG_INDEX, 4) != 0)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, at,
                                  "expected record %llu or the index block, found neither", n);
        /* The index, then the footer: both must match what was read. */
        uint64_t ibytes = SF__RECORD_INDEX_FIXED_BYTES + SF__RECORD_INDEX_ENTRY_BYTES * rr->nrec;
        if (!sf__shard_have(&rr->c, in, at, ibytes + SF__RECORD_FOOTER_BYTES, at,
                            "truncated: the index of %llu records and the footer run past "
                            "the end of the shard (%llu bytes)",
                            n, (unsigned long long)in->total))
            return rr->c.err_status;
        const unsigned char *ix = b + at;
        sf_status st = check_index(&rr->c, ix, ibytes, at, rr->nrec);
        if (st != SF_OK)
            return st;
        for (size_t i = 0; i < rr->seen_n; i++)
            if (sf__get_le64(ix + 16 + 16 * i) != rr->seen[i].off ||
                sf__get_le64(ix + 24 + 16 * i) != rr->seen[i].bytes)
                return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, at + 16 + 16 * i,
                                      "index entry %zu does not match record %zu", i, i);
        uint64_t fat = at + ibytes, io, ib, cnt;
        st = check_footer(&rr->c, b + fat, fat, &io, &ib, &cnt);
        if (st != SF_OK)
            return st;
        if (io != at || cnt != rr->nrec)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, fat,
                                  "footer points at an index at %llu of %llu records; it is at "
                                  "%llu with %llu",
                                  (unsigned long long)io, (unsigned long long)cnt,
                                  (unsigned long long)at, n);
        rr->pos = fat + SF__RECORD_FOOTER_BYTES;
        rr->state = RS_TAIL;
    }
    if (rr->state == RS_TAIL) {
        /* The footer ends the file: wait until the size is known. */
        if (in->avail > rr->pos)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, rr->pos,
                                  "data after the record shard footer");
        if (in->total == SF_SIZE_UNKNOWN) {
            rr->c.wanted = rr->pos + 1;
            return SF_OK;
        }
        if (in->total != rr->pos)
            return sf__shard_fail(&rr->c, SF_ERR_CORRUPT, rr->pos,
                                  "data after the record shard footer (%llu bytes in all)",
                                  (unsigned long long)in->total);
        rr->state = RS_END;
        rr->c.wanted = rr->pos;
    }
    *event = SF_SHARD_END;
    return SF_OK;
}

/* ------------------------------------------------------------ index */

struct sf__record_index {
    uint64_t count;
    struct sf__record_entry *e;
};

sf_status sf__record_index_from_tail(const void *tail, size_t tail_bytes, uint64_t file_size,
                                     const char *name, struct sf__record_index **out,
                                     uint64_t *need_tail_bytes, char *err, size_t err_len)
{
    *out = NULL;
    if (need_tail_bytes)
        *need_tail_bytes = 0;
    struct sf__shard_common c;
    sf__shard_common_init(&c, name);
    sf_status st;
    const uint64_t min_file =
        SF__RECORD_HEADER_BYTES + SF__RECORD_INDEX_FIXED_BYTES + SF__RECORD_FOOTER_BYTES;
    if (!tail || tail_bytes > file_size) {
        st = sf__shard_fail(&c, SF_ERR_INVALID_ARGUMENT, 0, "tail of %zu bytes, file of %llu",
                            tail_bytes, (unsigned long long)file_size);
        goto fail;
    }
    if (file_size < min_file) {
        st = sf__shard_fail(&c, SF_ERR_CORRUPT, 0,
                            "truncated: %llu bytes cannot hold a record shard (min %llu)",
                            (unsigned long long)file_size, (unsigned long long)min_file);
        goto fail;
    }
    if (tail_bytes < SF__RECORD_FOOTER_BYTES) {
        if (need_tail_bytes)
            *need_tail_bytes = SF__RECORD_FOOTER_BYTES;
        st = sf__shard_fail(&c, SF_ERR_RANGE, file_size - tail_bytes,
                            "the tail must hold the %u-byte footer", SF__RECORD_FOOTER_BYTES);
        goto fail;
    }
    const unsigned char *t = tail;
    const unsigned char *end = t + tail_bytes;
    const uint64_t fat = file_size - SF__RECORD_FOOTER_BYTES;
    uint64_t io, ib, cnt;
    st = check_footer(&c, end - SF__RECORD_FOOTER_BYTES, fat, &io, &ib, &cnt);
    if (st != SF_OK)
        goto fail;
    if (io < SF__RECORD_HEADER_BYTES || io > fat || fat - io != ib) {
        st = sf__shard_fail(&c, SF_ERR_CORRUPT, fat,
                            "footer: index at %llu of %llu bytes does not end at the footer",
                            (unsigned long long)io, (unsigned long long)ib);
        goto fail;
    }
    if (tail_bytes < ib + SF__RECORD_FOOTER_BYTES) {
        if (need_tail_bytes)
            *need_tail_bytes = ib + SF__RECORD_FOOTER_BYTES;
        st = sf__shard_fail(&c, SF_ERR_RANGE, io, "the index needs a tail of %llu bytes",
                            (unsigned long long)(ib + SF__RECORD_FOOTER_BYTES));
        goto fail;
    }
    const unsigned char *ix = end - SF__RECORD_FOOTER_BYTES - ib;
    st = check_index(&c, ix, ib, io, cnt);
    if (st != SF_OK)
        goto fail;
    struct sf__record_index *idx = calloc(1, sizeof *idx);
    if (!idx || (cnt && !(idx->e = malloc((size_t)cnt * sizeof *idx->e)))) {
        free(idx);
        st = sf__shard_fail(&c, SF_ERR_NO_MEMORY, io, "out of memory for the index");
        goto fail;
    }
    idx->count = cnt;
    uint64_t prev_end = SF__RECORD_HEADER_BYTES;
    for (uint64_t i = 0; i < cnt; i++) {
        uint64_t off = sf__get_le64(ix + 16 + 16 * i), bytes = sf__get_le64(ix + 24 + 16 * i);
        if (off < prev_end || bytes < SF__RECORD_REC_HEADER_BYTES || off > io || bytes > io - off) {
            sf__record_index_destroy(idx);
            st = sf__shard_fail(&c, SF_ERR_CORRUPT, io + 16 + 16 * i,
                                "index entry %llu (offset %llu, %llu bytes) is out of order or "
                                "outside the records",
                                (unsigned long long)i, (unsigned long long)off,
                                (unsigned long long)bytes);
            goto fail;
        }
        idx->e[i].off = off;
        idx->e[i].bytes = bytes;
        prev_end = off + bytes;
    }
    *out = idx;
    return SF_OK;
fail:
    return sf__fail(err, err_len, st, "%s", c.err);
}

uint64_t sf__record_index_count(const struct sf__record_index *idx)
{
    return idx->count;
}

sf_status sf__record_index_entry(const struct sf__record_index *idx, uint64_t i, uint64_t *offset,
                                 uint64_t *bytes)
{
    if (i >= idx->count)
        return SF_ERR_INVALID_ARGUMENT;
    *offset = idx->e[i].off;
    *bytes = idx->e[i].bytes;
    return SF_OK;
}

void sf__record_index_destroy(struct sf__record_index *idx)
{
    if (!idx)
        return;
    free(idx->e);
    free(idx);
}
