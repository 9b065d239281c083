/* Streaming tar reader with WebDataset grouping. Rules and decisions:
 * docs/FORMAT.md, "Tar shards". */
#include "src/tar_reader.h"

#include <stdlib.h>
#include <string.h>

#define BLOCK          ((uint64_t)SF__TAR_BLOCK)
#define MAX_SIZE_VALUE ((uint64_t)INT64_MAX)

enum magic_kind { MAGIC_POSIX, MAGIC_GNU, MAGIC_V7 };
/* "ustar", NUL, version "00" (a string literal cannot say NUL then '0'). */
static const char USTAR_MAGIC[8] = {'u', 's', 't', 'a', 'r', '\0', '0', '0'};
enum tar_state { ST_RUN, ST_END };

struct sf__tar_reader {
    struct sf__shard_common c;
    char *name;
    struct sf__tar_options o;
    enum tar_state state;
    uint64_t pos; /* offset of the next header */
    /* Header of the last member stepped over, for "runs past the end". */
    uint64_t last_hdr;
    uint64_t last_size;

    /* Meta headers ('L', 'K', 'x') waiting for their member. Names are
     * kept as shard offsets: the buffer may move between calls. */
    int have_meta;
    uint64_t meta_start;
    int have_long;
    uint64_t long_off;
    size_t long_len;
    int have_ppath;
    uint64_t ppath_off;
    size_t ppath_len;
    int have_psize;
    uint64_t psize;
    int psparse;

    /* The sample being collected. */
    struct sf__sample_builder sb;
    int in_sample;
    uint64_t sample_off, sample_end;
    uint64_t nsamples;

    char path_buf[256]; /* ustar prefix + '/' + name */
};

/* ------------------------------------------------------------ numbers */

sf_status sf__tar_parse_number(const unsigned char *field, size_t len, uint64_t *out)
{
    *out = 0;
    if (len == 0)
        return SF_OK;
    if (field[0] & 0x80) {
        /* Base-256 (GNU, star): 0x80 = positive, 0xff = negative. */
        if (field[0] != 0x80)
            return SF_ERR_PARSE;
        uint64_t v = 0;
        for (size_t i = 1; i < len; i++) {
            if (v > (MAX_SIZE_VALUE >> 8))
                return SF_ERR_PARSE;
            v = (v << 8) | field[i];
        }
        *out = v;
        return SF_OK;
    }
    /* Octal, as Python's tarfile reads it: up to the first NUL, spaces
     * around the digits, an empty field is 0. */
    size_t end = 0;
    while (end < len && field[end] != '\0')
        end++;
    size_t i = 0;
    while (i < end && field[i] == ' ')
        i++;
    uint64_t v = 0;
    while (i < end && field[i] >= '0' && field[i] <= '7') {
        if (v > (MAX_SIZE_VALUE >> 3))
            return SF_ERR_PARSE;
        v = (v << 3) | (uint64_t)(field[i] - '0');
        i++;
    }
    while (i < end && field[i] == ' ')
        i++;
    if (i != end)
        return SF_ERR_PARSE;
    *out = v;
    return SF_OK;
}

/* ------------------------------------------------------------ lifecycle */

sf_status sf__tar_reader_new(const struct sf__tar_options *o, const char *name,
                             struct sf__tar_reader **out)
{
    *out = NULL;
    struct sf__tar_reader *t = calloc(1, sizeof *t);
    if (!t)
        return SF_ERR_NO_MEMORY;
    t->name = strdup(name ? name : "shard");
    if (!t->name) {
        free(t);
        return SF_ERR_NO_MEMORY;
    }
    if (o)
        t->o = *o;
    if (!t->o.max_name_bytes)
        t->o.max_name_bytes = 4096;
    if (!t->o.max_pax_bytes)
        t->o.max_pax_bytes = 1u << 20;
    if (!t->o.max_fields)
        t->o.max_fields = 1024;
    sf__shard_common_init(&t->c, t->name);
    t->last_hdr = SF_SIZE_UNKNOWN;
    *out = t;
    return SF_OK;
}

void sf__tar_reader_destroy(struct sf__tar_reader *t)
{
    if (!t)
        return;
    sf__sample_builder_free(&t->sb);
    free(t->name);
    free(t);
}

const struct sf__shard_common *sf__tar_reader_common(const struct sf__tar_reader *t)
{
    return &t->c;
}

uint64_t sf__tar_reader_keep_from(const struct sf__tar_reader *t)
{
    uint64_t k = t->pos;
    if (t->have_long && t->long_off < k)
        k = t->long_off;
    if (t->have_ppath && t->ppath_off < k)
        k = t->ppath_off;
    return k;
}

/* ------------------------------------------------------------ helpers */

static int is_zero_block(const unsigned char *p)
{
    for (size_t i = 0; i < BLOCK; i++)
        if (p[i])
            return 0;
    return 1;
}

static uint64_t padded(uint64_t n)
{
    return (n + (BLOCK - 1)) & ~(BLOCK - 1); /* n <= 2^63 - 1: no overflow */
}

static size_t field_len(const unsigned char *f, size_t max)
{
    size_t n = 0;
    while (n < max && f[n])
        n++;
    return n;
}

static void clear_meta(struct sf__tar_reader *t)
{
    t->have_meta = 0;
    t->have_long = 0;
    t->have_ppath = 0;
    t->have_psize = 0;
    t->psparse = 0;
}

/* Steps past a meta header of hsize data bytes at hdr; starts_sample when it
 * is the first header of the next member's sample. */
static void skip_meta_header(struct sf__tar_reader *t, uint64_t hdr, uint64_t hsize,
                             int starts_sample)
{
    if (starts_sample && !t->have_meta) {
        t->have_meta = 1;
        t->meta_start = hdr;
    }
    t->last_hdr = hdr;
    t->last_size = hsize;
    t->pos = hdr + BLOCK + padded(hsize);
    t->c.stats.members++;
}

static void emit(struct sf__tar_reader *t, const struct sf__shard_input *in, struct sf_sample *out)
{
    memset(out, 0, sizeof *out);
    sf__sample_builder_emit(&t->sb, in->base, out);
    out->index = t->nsamples++;
    out->offset = t->sample_off;
    out->end = t->sample_end;
    out->reader_owned = 0;
    t->c.stats.samples++;
    t->c.stats.fields += out->field_count;
    t->in_sample = 0;
}

/* The archive ended cleanly at t->pos: hand out the last sample, then END. */
static sf_status finish(struct sf__tar_reader *t, const struct sf__shard_input *in,
                        struct sf_sample *out, enum sf_shard_event *event)
{
    t->state = ST_END;
    t->c.wanted = in->avail;
    if (t->in_sample) {
        emit(t, in, out);
        *event = SF_SHARD_SAMPLE;
    } else {
        *event = SF_SHARD_END;
    }
    return SF_OK;
}

static sf_status meta_without_member(struct sf__tar_reader *t)
{
    return sf__shard_fail(&t->c, SF_ERR_PARSE, t->meta_start,
                          "long name or pax header is not followed by a member");
}

/* The next header at pos does not fit in the shard. */
static sf_status header_past_end(struct sf__tar_reader *t, const struct sf__shard_input *in)
{
    if (t->pos > in->total && t->last_hdr != SF_SIZE_UNKNOWN)
        return sf__shard_fail(&t->c, SF_ERR_CORRUPT, t->last_hdr,
                              "truncated: member data of %llu bytes (padded to %llu) runs past "
                              "the end of the shard (%llu bytes)",
                              (unsigned long long)t->last_size,
                              (unsigned long long)padded(t->last_size),
                              (unsigned long long)in->total);
    return sf__shard_fail(&t->c, SF_ERR_CORRUPT, t->pos,
                          "truncated: the shard ends (%llu bytes) inside the header at this offset",
                          (unsigned long long)in->total);
}

/* ------------------------------------------------------------ pax */

static int has_byte(const unsigned char *p, size_t n, unsigned char b)
{
    return memchr(p, b, n) != NULL;
}

/* Parses the pax records of a header at hdr whose n data bytes start at p
 * (shard offset hdr + 512). Global headers are checked, not applied. */
static sf_status parse_pax(struct sf__tar_reader *t, const unsigned char *p, size_t n, uint64_t hdr,
                           int global)
{
    const uint64_t data = hdr + BLOCK;
    size_t off = 0;
    while (off < n) {
        if (p[off] == '\0') {
            /* NUL padding after the last record (some writers) is fine. */
            for (size_t i = off; i < n; i++)
                if (p[i])
                    return sf__shard_fail(&t->c, SF_ERR_PARSE, data + i,
                                          "pax header: data after NUL padding");
            break;
        }
        size_t len = 0, i = off;
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            if (len > (SIZE_MAX - 9) / 10)
                return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                      "pax record: length overflows");
            len = len * 10 + (size_t)(p[i] - '0');
            i++;
        }
        if (i == off)
            return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                  "pax record: does not start with a decimal length");
        if (i >= n || p[i] != ' ')
            return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                  "pax record: length not followed by a space");
        if (len > n - off)
            return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                  "pax record: length %zu runs past the header data (%zu bytes "
                                  "left)",
                                  len, n - off);
        if (len < (i - off) + 4)
            return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                  "pax record: length %zu too small", len);
        size_t end = off + len;
        if (p[end - 1] != '\n')
            return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                  "pax record: length %zu does not end at a newline", len);
        size_t kw = i + 1;
        const unsigned char *eq = memchr(p + kw, '=', end - 1 - kw);
        if (!eq || eq == p + kw)
            return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off, "pax record: no keyword=value");
        size_t kw_len = (size_t)(eq - (p + kw));
        size_t val = kw + kw_len + 1;
        size_t val_len = end - 1 - val;
        const char *k = (const char *)p + kw;
        if (!global) {
            if (kw_len == 4 && memcmp(k, "path", 4) == 0) {
                if (val_len == 0) {
                    t->have_ppath = 0;
                } else if (has_byte(p + val, val_len, '\0')) {
                    return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                          "pax path contains a NUL byte");
                } else if (val_len > t->o.max_name_bytes) {
                    return sf__shard_fail(&t->c, SF_ERR_LIMIT, data + off,
                                          "pax path of %zu bytes exceeds max_name_bytes %zu",
                                          val_len, t->o.max_name_bytes);
                } else {
                    t->have_ppath = 1;
                    t->ppath_off = data + val;
                    t->ppath_len = val_len;
                }
            } else if (kw_len == 4 && memcmp(k, "size", 4) == 0) {
                if (val_len == 0) {
                    t->have_psize = 0;
                } else {
                    uint64_t v = 0;
                    for (size_t j = 0; j < val_len; j++) {
                        unsigned char ch = p[val + j];
                        if (ch < '0' || ch > '9' || v > (MAX_SIZE_VALUE - 9) / 10)
                            return sf__shard_fail(&t->c, SF_ERR_PARSE, data + off,
                                                  "pax size is not a decimal number below "
                                                  "2^63");
                        v = v * 10 + (uint64_t)(ch - '0');
                    }
                    t->have_psize = 1;
                    t->psize = v;
                }
            } else if (kw_len > 11 && memcmp(k, "GNU.sparse.", 11) == 0) {
                t->psparse = 1;
            }
        }
        off = end;
    }
    return SF_OK;
}

/* ------------------------------------------------------------ main loop */

static sf_status bad_number(struct sf__tar_reader *t, uint64_t hdr, const char *what)
{
    return sf__shard_fail(&t->c, SF_ERR_PARSE, hdr,
                          "header %s field is not a number (octal or positive base-256 below "
                          "2^63)",
                          what);
}

sf_status sf__tar_reader_next(struct sf__tar_reader *t, const struct sf__shard_input *in,
                              struct sf_sample *out, enum sf_shard_event *event)
{
    *event = SF_SHARD_NEED_MORE;
    if (t->c.err_status != SF_OK)
        return t->c.err_status;
    if (t->state == ST_END) {
        *event = SF_SHARD_END;
        return SF_OK;
    }
    for (;;) {
        const uint64_t hdr = t->pos;
        enum sf__shard_need nd = sf__shard_need(&t->c, in, hdr, BLOCK);
        if (nd == SF__SHARD_NEED)
            return SF_OK;
        if (nd == SF__SHARD_PAST_END) {
            if (hdr != in->total)
                return header_past_end(t, in);
            if (in->avail < in->total) {
                /* The archive ends here, but the data of the sample being
                 * collected (up to hdr) has not all arrived yet. */
                t->c.wanted = in->total;
                return SF_OK;
            }
            if (t->have_meta)
                return meta_without_member(t);
            if (t->o.require_end_marker)
                return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr,
                                      "the shard ends without the end-of-archive marker (two "
                                      "zero blocks)");
            t->c.stats.missing_end_marker = 1;
            return finish(t, in, out, event);
        }
        const unsigned char *h = in->base + hdr;

        if (is_zero_block(h)) {
            if (t->have_meta)
                return meta_without_member(t);
            nd = sf__shard_need(&t->c, in, hdr + BLOCK, BLOCK);
            if (nd == SF__SHARD_NEED)
                return SF_OK;
            if (nd == SF__SHARD_PAST_END) {
                if (in->total != hdr + BLOCK)
                    return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr + BLOCK,
                                          "truncated: the shard ends (%llu bytes) inside the "
                                          "second end-of-archive block",
                                          (unsigned long long)in->total);
                if (t->o.require_end_marker)
                    return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr,
                                          "the shard ends after a lone zero block");
                t->c.stats.lone_zero_block = 1;
                return finish(t, in, out, event);
            }
            if (!is_zero_block(h + BLOCK))
                return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr,
                                      "a lone zero block is followed by more data; the "
                                      "members after it would be lost");
            return finish(t, in, out, event);
        }

        /* Checksum: the 8-byte field counts as spaces; GNU tar accepts the
         * sum of unsigned and of signed bytes. */
        uint64_t stored;
        if (sf__tar_parse_number(h + 148, 8, &stored) != SF_OK)
            return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr,
                                  "not a tar header: the checksum field is not a number");
        uint64_t usum = 8 * (uint64_t)' ';
        int64_t ssum = 8 * (int64_t)' ';
        for (size_t i = 0; i < BLOCK; i++) {
            if (i >= 148 && i < 156)
                continue;
            usum += h[i];
            ssum += (signed char)h[i];
        }
        if (stored != usum && (ssum < 0 || stored != (uint64_t)ssum))
            return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr,
                                  "bad header checksum: stored %llo, computed %llo",
                                  (unsigned long long)stored, (unsigned long long)usum);

        enum magic_kind mk;
        if (memcmp(h + 257, USTAR_MAGIC, 8) == 0)
            mk = MAGIC_POSIX;
        else if (memcmp(h + 257, "ustar  \0", 8) == 0)
            mk = MAGIC_GNU;
        else if (memcmp(h + 257, "\0\0\0\0\0\0\0\0", 8) == 0)
            mk = MAGIC_V7;
        else
            return sf__shard_fail(&t->c, SF_ERR_PARSE, hdr,
                                  "unknown tar header magic (not ustar, GNU or v7)");

        const unsigned char type = h[156];
        uint64_t hsize;
        if (sf__tar_parse_number(h + 124, 12, &hsize) != SF_OK)
            return bad_number(t, hdr, "size");

        /* ---- meta headers: they describe the next member */
        if (type == 'L' || type == 'K') {
            if (hsize > 0 && hsize - 1 > t->o.max_name_bytes) /* + its NUL */
                return sf__shard_fail(&t->c, SF_ERR_LIMIT, hdr,
                                      "GNU long %s of %llu bytes exceeds max_name_bytes %zu",
                                      type == 'L' ? "name" : "link name", (unsigned long long)hsize,
                                      t->o.max_name_bytes);
            if (!sf__shard_have(&t->c, in, hdr + BLOCK, hsize, hdr,
                                "truncated: GNU long name data of %llu bytes runs past "
                                "the end of the shard (%llu bytes)",
                                (unsigned long long)hsize, (unsigned long long)in->total))
                return t->c.err_status;
            const unsigned char *d = h + BLOCK;
            size_t n = (size_t)hsize;
            size_t nlen = field_len(d, n);
            for (size_t i = nlen; i < n; i++)
                if (d[i])
                    return sf__shard_fail(&t->c, SF_ERR_PARSE, hdr,
                                          "GNU long name contains a NUL byte");
            if (nlen == 0)
                return sf__shard_fail(&t->c, SF_ERR_PARSE, hdr, "empty GNU long name");
            if (nlen > t->o.max_name_bytes)
                return sf__shard_fail(&t->c, SF_ERR_LIMIT, hdr,
                                      "GNU long name of %zu bytes exceeds max_name_bytes %zu", nlen,
                                      t->o.max_name_bytes);
            if (type == 'L') {
                t->have_long = 1;
                t->long_off = hdr + BLOCK;
                t->long_len = nlen;
            }
            skip_meta_header(t, hdr, hsize, 1);
            continue;
        }
        if (type == 'x' || type == 'g') {
            if (hsize > t->o.max_pax_bytes)
                return sf__shard_fail(&t->c, SF_ERR_LIMIT, hdr,
                                      "pax header data of %llu bytes exceeds max_pax_bytes %zu",
                                      (unsigned long long)hsize, t->o.max_pax_bytes);
            if (!sf__shard_have(&t->c, in, hdr + BLOCK, hsize, hdr,
                                "truncated: pax header data of %llu bytes runs past the "
                                "end of the shard (%llu bytes)",
                                (unsigned long long)hsize, (unsigned long long)in->total))
                return t->c.err_status;
            sf_status st = parse_pax(t, h + BLOCK, (size_t)hsize, hdr, type == 'g');
            if (st != SF_OK)
                return st;
            skip_meta_header(t, hdr, hsize, type == 'x');
            continue;
        }

        /* ---- a member */
        const char *path;
        size_t plen;
        if (t->have_ppath) {
            path = (const char *)in->base + t->ppath_off;
            plen = t->ppath_len;
        } else if (t->have_long) {
            path = (const char *)in->base + t->long_off;
            plen = t->long_len;
        } else {
            size_t nl = field_len(h, 100);
            size_t pl = (mk == MAGIC_POSIX) ? field_len(h + 345, 155) : 0;
            char *b = t->path_buf;
            if (pl) {
                memcpy(b, h + 345, pl);
                b[pl] = '/';
                memcpy(b + pl + 1, h, nl);
                plen = pl + 1 + nl;
            } else {
                memcpy(b, h, nl);
                plen = nl;
            }
            path = b;
        }

        if (plen > t->o.max_name_bytes) /* only a ustar path can get here */
            return sf__shard_fail(&t->c, SF_ERR_LIMIT, hdr,
                                  "member path of %zu bytes exceeds max_name_bytes %zu", plen,
                                  t->o.max_name_bytes);

        int no_data = type >= '1' && type <= '6';
        uint64_t size = no_data ? 0 : (t->have_psize ? t->psize : hsize);
        uint64_t next = hdr + BLOCK + padded(size);
        if (next < hdr)
            return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr, "member size overflows offsets");
#if SIZE_MAX < UINT64_MAX
        if (size > SIZE_MAX)
            return sf__shard_fail(&t->c, SF_ERR_LIMIT, hdr, "member too large for this machine");
#endif

        int is_dir = type == '5' || (type == '\0' && plen > 0 && path[plen - 1] == '/');
        int regular = (type == '0' || type == '\0' || type == '7') && !is_dir && !t->psparse;
        if (!regular) {
            if (is_dir)
                t->c.stats.skipped_dirs++;
            else if (type == '1' || type == '2')
                t->c.stats.skipped_links++;
            else
                t->c.stats.skipped_other++;
            goto consumed;
        }

        /* WebDataset key: up to the first '.' of the base name. */
        size_t base_at = plen;
        while (base_at > 0 && path[base_at - 1] != '/')
            base_at--;
        const char *dot = memchr(path + base_at, '.', plen - base_at);
        size_t key_len = dot ? (size_t)(dot - path) : 0;
        if (!dot || key_len == base_at || key_len + 1 == plen) {
            t->c.stats.skipped_unnamed++;
            goto consumed;
        }
        const char *fname = dot + 1;
        size_t fname_len = plen - key_len - 1;

        if (t->in_sample && !sf__sample_builder_key_is(&t->sb, path, key_len)) {
            /* A new key: the collected sample is complete. This header is
             * read again on the next call (its meta state is kept). */
            emit(t, in, out);
            *event = SF_SHARD_SAMPLE;
            return SF_OK;
        }
        if (!t->in_sample) {
            if (sf__sample_builder_start(&t->sb, path, key_len) != SF_OK)
                return sf__shard_fail(&t->c, SF_ERR_NO_MEMORY, hdr, "out of memory");
            t->in_sample = 1;
            t->sample_off = t->have_meta ? t->meta_start : hdr;
        }
        if (sf__sample_builder_has(&t->sb, fname, fname_len, 1))
            return sf__shard_fail(&t->c, SF_ERR_PARSE, hdr, "sample '%.*s' has field '%.*s' twice",
                                  (int)key_len, path, (int)fname_len, fname);
        if (t->sb.count >= t->o.max_fields)
            return sf__shard_fail(&t->c, SF_ERR_LIMIT, hdr,
                                  "sample '%.*s' has more than max_fields %zu fields", (int)key_len,
                                  path, t->o.max_fields);
        if (sf__sample_builder_add(&t->sb, fname, fname_len, 1, hdr + BLOCK, (size_t)size,
                                   hdr + BLOCK) != SF_OK)
            return sf__shard_fail(&t->c, SF_ERR_NO_MEMORY, hdr, "out of memory");
        t->sample_end = next;

    consumed:
        /* Checked here, not earlier, so that the sample before this member
         * comes out whether or not the shard size is known yet. */
        if (in->total != SF_SIZE_UNKNOWN && next > in->total)
            return sf__shard_fail(&t->c, SF_ERR_CORRUPT, hdr,
                                  "truncated: member data of %llu bytes (padded to %llu) runs "
                                  "past the end of the shard (%llu bytes)",
                                  (unsigned long long)size, (unsigned long long)padded(size),
                                  (unsigned long long)in->total);
        t->last_hdr = hdr;
        t->last_size = size;
        t->c.stats.members++;
        clear_meta(t);
        t->pos = next;
    }
}
