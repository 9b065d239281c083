/* Tar shard reader: archives written by GNU tar and Python's tarfile, fed
 * at once and in random increments, and a corpus of malformed archives
 * built here byte by byte. Rules under test: docs/FORMAT.md. */
#include <criterion/criterion.h>

#include "shardfeed_shard.h"
#include "src/shard_reader.h"
#include "src/tar_reader.h"
#include "support/bytes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

static void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rng_next(&seed) >> 56);
}

enum feed_mode {
    FEED_ALL,          /* everything at once, size known */
    FEED_RANDOM,       /* random increments, size known from the start */
    FEED_RANDOM_LATE,  /* random increments, size known only at the end */
    FEED_RANDOM_MOVING /* random increments, each in a fresh copy of the prefix */
};

struct parse_result {
    sf_status st;
    unsigned long long err_offset;
    char err[512];
    struct bytes ser; /* serialized samples */
    size_t samples;
    struct sf_shard_stats stats;
    unsigned long long last_end; /* end of the last sample */
};

static void parse_result_free(struct parse_result *r)
{
    bytes_free(&r->ser);
}

/* Parses buf with the public reader, checking on the way what must hold for
 * every sample: zero-copy pointers, offsets, sequential indexes. */
static void parse_with(const unsigned char *buf, size_t len,
                       const struct sf_shard_reader_options *o, enum feed_mode mode, uint64_t seed,
                       size_t max_step, struct parse_result *res)
{
    memset(res, 0, sizeof *res);
    struct sf_shard_reader_options d;
    sf_shard_reader_options_init_default(&d);
    if (!o) {
        d.name = "test.tar";
        o = &d;
    }
    struct sf_shard_reader *r = NULL;
    char err[256];
    cr_assert_eq(sf_shard_reader_new(o, &r, err, sizeof err), SF_OK, "%s", err);
    size_t fed = 0;
    int fed_once = 0;
    unsigned char *copy = NULL;
    const unsigned char *base = buf;
    for (unsigned long iter = 0;; iter++) {
        cr_assert(iter < 100000000ul, "reader does not terminate");
        struct sf_sample s;
        enum sf_shard_event ev;
        sf_status st = sf_shard_reader_next(r, &s, &ev);
        if (st != SF_OK) {
            res->st = st;
            res->err_offset = sf_shard_reader_error_offset(r);
            snprintf(res->err, sizeof res->err, "%s", sf_shard_reader_errmsg(r));
            cr_assert(res->err[0] != '\0', "failure without a message");
            /* Sticky. */
            cr_assert_eq(sf_shard_reader_next(r, &s, &ev), st);
            break;
        }
        if (ev == SF_SHARD_SAMPLE) {
            cr_assert_eq(s.index, res->samples, "sample index %llu, want %zu", s.index,
                         res->samples);
            cr_assert(s.offset < s.end && s.end <= fed, "sample [%llu, %llu) outside %zu", s.offset,
                      s.end, fed);
            cr_assert_eq(strlen(s.key), s.key_len);
            for (size_t i = 0; i < s.field_count; i++) {
                const struct sf_sample_field *f = &s.fields[i];
                cr_assert_not_null(f->data);
                cr_assert_eq(strlen(f->name), f->name_len);
                if (!s.reader_owned) {
                    cr_assert(f->offset + f->size <= fed);
                    cr_assert_eq((const unsigned char *)f->data, base + f->offset,
                                 "field data is not a pointer into the shard");
                }
            }
            serialize_sample(&res->ser, &s);
            res->samples++;
            res->last_end = s.end;
            continue;
        }
        if (ev == SF_SHARD_END) {
            /* Stays ended. */
            cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
            cr_assert_eq(ev, SF_SHARD_END);
            break;
        }
        cr_assert_eq(ev, SF_SHARD_NEED_MORE);
        cr_assert(!fed_once || fed < len, "NEED_MORE after the whole shard (%zu bytes) was fed",
                  len);
        if (fed_once)
            cr_assert(sf_shard_reader_wanted(r) > fed, "wanted %llu <= fed %zu",
                      sf_shard_reader_wanted(r), fed);
        size_t step = len - fed;
        if (mode != FEED_ALL) {
            size_t m = max_step ? max_step : 1500;
            step = 1 + (size_t)(rng_next(&seed) % m);
            /* sometimes jump straight to what the reader wants */
            if (rng_next(&seed) % 4 == 0 && sf_shard_reader_wanted(r) > fed)
                step = (size_t)(sf_shard_reader_wanted(r) - fed);
            if (step > len - fed)
                step = len - fed;
        }
        fed += step;
        fed_once = 1;
        unsigned long long total =
            (mode == FEED_RANDOM_LATE || mode == FEED_RANDOM_MOVING) && fed < len
                ? SF_SIZE_UNKNOWN
                : (unsigned long long)len;
        if (mode == FEED_RANDOM_MOVING) {
            /* Earlier samples were serialized already: the old copy can go. */
            unsigned char *c = malloc(fed ? fed : 1);
            cr_assert_not_null(c);
            memcpy(c, buf, fed);
            cr_assert_eq(sf_shard_reader_feed(r, c, fed, total), SF_OK);
            free(copy);
            copy = c;
            base = c;
        } else {
            cr_assert_eq(sf_shard_reader_feed(r, buf, fed, total), SF_OK);
        }
    }
    sf_shard_reader_stats(r, &res->stats);
    sf_shard_reader_destroy(r);
    free(copy);
}

static void parse(const unsigned char *buf, size_t len, struct parse_result *res)
{
    parse_with(buf, len, NULL, FEED_ALL, 0, 0, res);
}

static void expect_error(const unsigned char *buf, size_t len, sf_status want,
                         unsigned long long want_offset, const char *frag)
{
    struct parse_result r;
    parse(buf, len, &r);
    cr_expect_eq(r.st, want, "status %d (%s), want %d", (int)r.st, r.err, (int)want);
    cr_expect_eq(r.err_offset, want_offset, "error offset %llu, want %llu (%s)", r.err_offset,
                 want_offset, r.err);
    char off[64];
    snprintf(off, sizeof off, "offset %llu", want_offset);
    cr_expect(strstr(r.err, "test.tar") != NULL, "message lacks the shard name: %s", r.err);
    cr_expect(strstr(r.err, off) != NULL, "message lacks '%s': %s", off, r.err);
    if (frag)
        cr_expect(strstr(r.err, frag) != NULL, "message lacks '%s': %s", frag, r.err);
    parse_result_free(&r);
}

/* ------------------------------------------------------------ tar builder */

#define BLK 512

static void tb_checksum(unsigned char *h)
{
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < BLK; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
}

enum tb_magic { TB_POSIX, TB_GNU, TB_V7 };

/* Appends a header; returns its offset. The size field is octal; callers
 * patch it for special cases and call tb_checksum again. */
static size_t tb_header(struct bytes *b, const char *name, char type, uint64_t size,
                        enum tb_magic m)
{
    unsigned char h[BLK];
    memset(h, 0, sizeof h);
    size_t nl = strlen(name);
    memcpy(h, name, nl > 100 ? 100 : nl);
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 108, 8, "%07o", 0);
    snprintf((char *)h + 116, 8, "%07o", 0);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = (unsigned char)type;
    if (m == TB_POSIX)
        memcpy(h + 257,
               "ustar\0"
               "00",
               8);
    else if (m == TB_GNU)
        memcpy(h + 257, "ustar  \0", 8);
    tb_checksum(h);
    size_t at = b->len;
    bytes_put(b, h, BLK);
    return at;
}

static void tb_data(struct bytes *b, const void *d, size_t n)
{
    bytes_put(b, d, n);
    static const unsigned char zero[BLK];
    if (n % BLK)
        bytes_put(b, zero, BLK - n % BLK);
}

static size_t tb_file(struct bytes *b, const char *name, const void *d, size_t n)
{
    size_t at = tb_header(b, name, '0', n, TB_POSIX);
    tb_data(b, d, n);
    return at;
}

static size_t tb_meta(struct bytes *b, char type, const void *d, size_t n)
{
    size_t at = tb_header(b, type == 'L' || type == 'K' ? "././@LongLink" : "PaxHeader", type, n,
                          type == 'L' || type == 'K' ? TB_GNU : TB_POSIX);
    tb_data(b, d, n);
    return at;
}

static void tb_end(struct bytes *b)
{
    static const unsigned char zero[2 * BLK];
    bytes_put(b, zero, sizeof zero);
}

/* A pax record with its correct length prefix. */
static void pax_rec(struct bytes *b, const char *kw, const char *val, size_t val_len)
{
    size_t body = 1 + strlen(kw) + 1 + val_len + 1; /* ' ' kw '=' val '\n' */
    size_t len = body + 1;
    for (;;) {
        char digits[32];
        int d = snprintf(digits, sizeof digits, "%zu", len);
        if ((size_t)d + body == len)
            break;
        len = (size_t)d + body;
    }
    char pre[64];
    int n = snprintf(pre, sizeof pre, "%zu %s=", len, kw);
    bytes_put(b, pre, (size_t)n);
    bytes_put(b, val, val_len);
    bytes_put(b, "\n", 1);
}

/* ------------------------------------------------------------ expected samples */

struct want_field {
    const char *name;
    const void *data;
    size_t size;
};

struct want_sample {
    const char *key;
    size_t nf;
    struct want_field f[8];
};

static void serialize_want(struct bytes *out, const struct want_sample *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(w[i].key);
        bytes_put_u64(out, kl);
        bytes_put(out, w[i].key, kl);
        bytes_put_u64(out, w[i].nf);
        for (size_t j = 0; j < w[i].nf; j++) {
            size_t nl = strlen(w[i].f[j].name);
            bytes_put_u64(out, nl);
            bytes_put(out, w[i].f[j].name, nl);
            bytes_put_u64(out, w[i].f[j].size);
            bytes_put(out, w[i].f[j].data, w[i].f[j].size);
        }
    }
}

static void expect_samples(const struct parse_result *r, const struct want_sample *w, size_t n)
{
    struct bytes want = {0};
    serialize_want(&want, w, n);
    cr_expect_eq(r->st, SF_OK, "parse failed: %s", r->err);
    cr_expect_eq(r->samples, n, "%zu samples, want %zu", r->samples, n);
    cr_expect(bytes_eq(&r->ser, &want), "samples differ from what was written");
    bytes_free(&want);
}

/* ------------------------------------------------------------ numbers */

Test(tar, numbers_octal_and_base256)
{
    uint64_t v;
    cr_expect_eq(sf__tar_parse_number((const unsigned char *)"00000001750\0", 12, &v), SF_OK);
    cr_expect_eq(v, 01750);
    cr_expect_eq(sf__tar_parse_number((const unsigned char *)"   1750 \0   ", 12, &v), SF_OK);
    cr_expect_eq(v, 01750);
    cr_expect_eq(sf__tar_parse_number((const unsigned char *)"\0\0\0\0", 4, &v), SF_OK);
    cr_expect_eq(v, 0);
    cr_expect_eq(sf__tar_parse_number((const unsigned char *)"0000001x750\0", 12, &v),
                 SF_ERR_PARSE);
    cr_expect_eq(sf__tar_parse_number((const unsigned char *)"0000009\0", 8, &v), SF_ERR_PARSE);
    unsigned char b[12] = {0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34};
    cr_expect_eq(sf__tar_parse_number(b, 12, &v), SF_OK);
    cr_expect_eq(v, 0x1234);
    /* 2^63 - 1 fits, 2^63 does not */
    unsigned char m[12] = {0x80, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    cr_expect_eq(sf__tar_parse_number(m, 12, &v), SF_OK);
    cr_expect_eq(v, (uint64_t)INT64_MAX);
    m[4] = 0x80;
    m[5] = m[6] = m[7] = m[8] = m[9] = m[10] = m[11] = 0;
    cr_expect_eq(sf__tar_parse_number(m, 12, &v), SF_ERR_PARSE);
    unsigned char neg[12];
    memset(neg, 0xff, sizeof neg); /* -1 */
    cr_expect_eq(sf__tar_parse_number(neg, 12, &v), SF_ERR_PARSE);
    unsigned char other[12] = {0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    cr_expect_eq(sf__tar_parse_number(other, 12, &v), SF_ERR_PARSE);
}

/* ------------------------------------------------------------ hand-built archives */

Test(tar, webdataset_grouping_keys_fields_and_skips)
{
    struct bytes b = {0};
    unsigned char img[1300], seg[513];
    fill_random(img, sizeof img, 1);
    fill_random(seg, sizeof seg, 2);
    tb_header(&b, "train/", '5', 0, TB_POSIX);
    tb_file(&b, "train/000.JPG", img, sizeof img);
    tb_file(&b, "train/000.cls", "7", 1);
    tb_file(&b, "train/000.seg.png", seg, sizeof seg);
    tb_file(&b, "README", "hi", 2);
    tb_file(&b, "train/.hidden", "x", 1);
    tb_file(&b, "train/a.", "x", 1);
    tb_header(&b, "train/001.lnk", '2', 0, TB_POSIX);
    tb_header(&b, "train/001.hard", '1', 0, TB_POSIX);
    tb_header(&b, "fifo.x", '6', 0, TB_POSIX);
    tb_file(&b, "dir.v2/001.json", "{}", 2);
    tb_file(&b, "dir.v2/001.txt", "", 0);
    /* the key comes back later, not adjacent: a new sample */
    tb_file(&b, "train/000.txt", "again", 5);
    tb_end(&b);

    struct parse_result r;
    parse(b.p, b.len, &r);
    const struct want_sample w[] = {
        {"train/000", 3, {{"jpg", img, sizeof img}, {"cls", "7", 1}, {"seg.png", seg, sizeof seg}}},
        {"dir.v2/001", 2, {{"json", "{}", 2}, {"txt", "", 0}}},
        {"train/000", 1, {{"txt", "again", 5}}},
    };
    expect_samples(&r, w, 3);
    cr_expect_eq(r.stats.samples, 3);
    cr_expect_eq(r.stats.fields, 6);
    cr_expect_eq(r.stats.skipped_dirs, 1);
    cr_expect_eq(r.stats.skipped_links, 2);
    cr_expect_eq(r.stats.skipped_other, 1);
    cr_expect_eq(r.stats.skipped_unnamed, 3);
    cr_expect_eq(r.stats.members, 13);
    cr_expect_eq(r.stats.missing_end_marker, 0);
    parse_result_free(&r);
    bytes_free(&b);
}

Test(tar, sample_offsets_cover_headers_data_and_padding)
{
    struct bytes b = {0};
    unsigned char d[700];
    fill_random(d, sizeof d, 3);
    struct bytes pax = {0};
    pax_rec(&pax, "path", "k1.jpg", 6);
    tb_meta(&b, 'x', pax.p, pax.len);              /* 0..1024 */
    tb_file(&b, "ignored.bin", d, 700);            /* header 1024, data 1536..2236, pad to 2560 */
    tb_file(&b, "k1.cls", "1", 1);                 /* 2560..3584 */
    size_t second = tb_file(&b, "k2.cls", "2", 1); /* 3584..4608 */
    tb_end(&b);
    struct sf_shard_reader *r;
    cr_assert_eq(sf_shard_reader_new(NULL, &r, NULL, 0), SF_OK);
    cr_assert_eq(sf_shard_reader_feed(r, b.p, b.len, b.len), SF_OK);
    struct sf_sample s;
    enum sf_shard_event ev;
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
    cr_assert_eq(ev, SF_SHARD_SAMPLE);
    cr_expect_str_eq(s.key, "k1");
    cr_expect_eq(s.offset, 0);
    cr_expect_eq(s.end, second);
    cr_assert_eq(s.field_count, 2);
    cr_expect_eq(s.fields[0].offset, 1536);
    cr_expect_eq(s.fields[0].data, b.p + 1536);
    cr_expect_eq(s.fields[1].offset, 3072);
    cr_expect_eq(sf_shard_reader_format(r), SF_SHARD_FORMAT_TAR);
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
    cr_assert_eq(ev, SF_SHARD_SAMPLE);
    cr_expect_str_eq(s.key, "k2");
    cr_expect_eq(s.offset, second);
    cr_expect_eq(s.end, second + 1024);
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
    cr_expect_eq(ev, SF_SHARD_END);
    sf_shard_reader_destroy(r);
    bytes_free(&pax);
    bytes_free(&b);
}

Test(tar, ustar_prefix_v7_and_signed_checksum)
{
    struct bytes b = {0};
    /* ustar prefix + name */
    size_t at = tb_header(&b, "n.jpg", '0', 3, TB_POSIX);
    memcpy(b.p + at + 345, "some/prefix", 11);
    tb_checksum(b.p + at);
    tb_data(&b, "abc", 3);
    /* GNU headers have no prefix: bytes at 345 are times, not a path */
    at = tb_header(&b, "g.jpg", '0', 2, TB_GNU);
    memcpy(b.p + at + 345, "00000000000", 11);
    tb_checksum(b.p + at);
    tb_data(&b, "gg", 2);
    /* v7: no magic at all */
    tb_header(&b, "v7.jpg", '\0', 1, TB_V7);
    tb_data(&b, "7", 1);
    tb_header(&b, "v7dir/", '\0', 0, TB_V7);
    /* checksum as the sum of signed bytes (old writers) */
    at = tb_header(&b, "s\xe9.jpg", '0', 1, TB_POSIX);
    {
        unsigned char *h = b.p + at;
        memset(h + 148, ' ', 8);
        int sum = 0;
        for (int i = 0; i < BLK; i++)
            sum += (signed char)h[i];
        snprintf((char *)h + 148, 8, "%06o", sum);
        h[155] = ' ';
    }
    tb_data(&b, "s", 1);
    tb_end(&b);
    struct parse_result r;
    parse(b.p, b.len, &r);
    const struct want_sample w[] = {
        {"some/prefix/n", 1, {{"jpg", "abc", 3}}},
        {"g", 1, {{"jpg", "gg", 2}}},
        {"v7", 1, {{"jpg", "7", 1}}},
        {"s\xe9", 1, {{"jpg", "s", 1}}},
    };
    expect_samples(&r, w, 4);
    cr_expect_eq(r.stats.skipped_dirs, 1);
    parse_result_free(&r);
    bytes_free(&b);
}

Test(tar, gnu_long_name_and_pax_path_size_and_global_header)
{
    char longname[300];
    memset(longname, 'L', sizeof longname);
    memcpy(longname + 280, "/sample.Jpeg", 13); /* 292 chars + NUL */
    unsigned char d[2000];
    fill_random(d, sizeof d, 4);
    struct bytes b = {0};
    /* global header: checked, its path and size ignored */
    struct bytes g = {0};
    pax_rec(&g, "comment", "made by a test", 14);
    pax_rec(&g, "path", "global.jpg", 10);
    pax_rec(&g, "size", "5", 1);
    tb_meta(&b, 'g', g.p, g.len);
    /* GNU long name, with a long link name that is read and ignored */
    tb_meta(&b, 'K', "whatever/target", 16);
    tb_meta(&b, 'L', longname, strlen(longname) + 1);
    tb_file(&b, "truncated-name", d, 100);
    /* pax path and size win over ustar fields: size 0 in ustar, 2000 in pax */
    struct bytes x = {0};
    pax_rec(&x, "path", "p\xc3\xbc/x.NPY", 9);
    pax_rec(&x, "size", "2000", 4);
    pax_rec(&x, "mtime", "1700000000.5", 12);
    tb_meta(&b, 'x', x.p, x.len);
    tb_header(&b, "ustar-name.bin", '0', 0, TB_POSIX);
    tb_data(&b, d, 2000);
    /* pax sparse: skipped */
    struct bytes sp = {0};
    pax_rec(&sp, "GNU.sparse.major", "1", 1);
    tb_meta(&b, 'x', sp.p, sp.len);
    tb_file(&b, "sparse.bin", d, 10);
    tb_file(&b, "after.txt", "t", 1);
    tb_end(&b);

    struct parse_result r;
    parse(b.p, b.len, &r);
    char key[300];
    memcpy(key, longname, 287);
    key[287] = '\0';
    const struct want_sample w[] = {
        {key, 1, {{"jpeg", d, 100}}},
        {"p\xc3\xbc/x", 1, {{"npy", d, 2000}}},
        {"after", 1, {{"txt", "t", 1}}},
    };
    expect_samples(&r, w, 3);
    cr_expect_eq(r.stats.skipped_other, 1);
    parse_result_free(&r);
    bytes_free(&b);
    bytes_free(&g);
    bytes_free(&x);
    bytes_free(&sp);
}

Test(tar, base256_size_is_read)
{
    struct bytes b = {0};
    size_t at = tb_header(&b, "big.bin", '0', 0, TB_GNU);
    unsigned char *h = b.p + at;
    memset(h + 124, 0, 12);
    h[124] = 0x80;
    h[134] = 0x02; /* 0x258 = 600 */
    h[135] = 0x58;
    tb_checksum(h);
    unsigned char d[600];
    fill_random(d, sizeof d, 5);
    tb_data(&b, d, 600);
    tb_end(&b);
    struct parse_result r;
    parse(b.p, b.len, &r);
    const struct want_sample w[] = {{"big", 1, {{"bin", d, 600}}}};
    expect_samples(&r, w, 1);
    parse_result_free(&r);
    bytes_free(&b);
}

Test(tar, end_of_archive_variants)
{
    struct bytes b = {0};
    tb_file(&b, "a.txt", "a", 1);
    tb_file(&b, "b.txt", "b", 1);
    size_t members_end = b.len;
    tb_end(&b);
    /* tar pads to 10 KiB records: bytes after the end are ignored */
    static const unsigned char junk[3000] = {1, 2, 3};
    bytes_put(&b, junk, sizeof junk);
    const struct want_sample w[] = {{"a", 1, {{"txt", "a", 1}}}, {"b", 1, {{"txt", "b", 1}}}};

    struct parse_result r;
    parse(b.p, b.len, &r);
    expect_samples(&r, w, 2);
    cr_expect_eq(r.stats.missing_end_marker, 0);
    cr_expect_eq(r.stats.lone_zero_block, 0);
    parse_result_free(&r);

    /* no zero blocks: accepted and counted */
    parse(b.p, members_end, &r);
    expect_samples(&r, w, 2);
    cr_expect_eq(r.stats.missing_end_marker, 1);
    parse_result_free(&r);

    /* one zero block then the end: accepted and counted */
    parse(b.p, members_end + BLK, &r);
    expect_samples(&r, w, 2);
    cr_expect_eq(r.stats.lone_zero_block, 1);
    parse_result_free(&r);

    /* the same with require_end_marker */
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.name = "test.tar";
    o.require_end_marker = 1;
    parse_with(b.p, members_end, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_ERR_CORRUPT);
    cr_expect_eq(r.err_offset, members_end);
    cr_expect_eq(r.samples, 1, "the complete first sample comes out before the error");
    parse_result_free(&r);
    parse_with(b.p, members_end + BLK, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_ERR_CORRUPT);
    cr_expect_eq(r.err_offset, members_end);
    parse_result_free(&r);

    /* an empty shard is an empty archive without marker */
    parse(b.p, 0, &r);
    cr_expect_eq(r.st, SF_OK);
    cr_expect_eq(r.samples, 0);
    cr_expect_eq(r.stats.missing_end_marker, 1);
    parse_result_free(&r);
    bytes_free(&b);
}

/* Size known, bytes not all fed: a next header that would start exactly at
 * the total is not the end yet, and the pending sample (whose data is not
 * all here) must not come out (issue 17: a one-member tar of 1,024 bytes
 * fed 512 returned a field at base + 512 of 103 bytes). */
Test(tar, size_known_but_not_fed_is_not_the_end)
{
    struct bytes b = {0};
    unsigned char d[103];
    fill_random(d, sizeof d, 17);
    tb_file(&b, "a.txt", d, sizeof d);
    cr_assert_eq(b.len, 1024u);

    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.name = "test.tar";
    struct sf_shard_reader *r = NULL;
    char err[256];
    cr_assert_eq(sf_shard_reader_new(&o, &r, err, sizeof err), SF_OK, "%s", err);
    /* Only the header, in a buffer of exactly those bytes (ASan sees a read
     * past them). */
    unsigned char *head = malloc(BLK);
    cr_assert_not_null(head);
    memcpy(head, b.p, BLK);
    cr_assert_eq(sf_shard_reader_feed(r, head, BLK, b.len), SF_OK);
    struct sf_sample s;
    enum sf_shard_event ev;
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK, "%s", sf_shard_reader_errmsg(r));
    cr_expect_eq(ev, SF_SHARD_NEED_MORE, "event %d before the member's data arrived", (int)ev);
    cr_expect_eq(sf_shard_reader_wanted(r), (unsigned long long)b.len);

    cr_assert_eq(sf_shard_reader_feed(r, b.p, b.len, b.len), SF_OK);
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK, "%s", sf_shard_reader_errmsg(r));
    cr_assert_eq(ev, SF_SHARD_SAMPLE);
    cr_assert_eq(s.field_count, 1u);
    cr_expect_eq(s.fields[0].size, sizeof d);
    cr_expect_eq((const unsigned char *)s.fields[0].data, b.p + BLK);
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
    cr_expect_eq(ev, SF_SHARD_END);
    struct sf_shard_stats st;
    sf_shard_reader_stats(r, &st);
    cr_expect_eq(st.missing_end_marker, 1);
    sf_shard_reader_destroy(r);
    free(head);
    bytes_free(&b);
}

/* ------------------------------------------------------------ malformed corpus */

Test(tar, truncation_at_every_offset_never_crashes_and_names_the_offset)
{
    struct bytes b = {0};
    unsigned char d[3000];
    fill_random(d, sizeof d, 6);
    char longname[200];
    memset(longname, 'n', sizeof longname);
    memcpy(longname + 190, ".jpg", 5);
    tb_meta(&b, 'L', longname, strlen(longname) + 1);
    tb_file(&b, "x", d, 1000);
    tb_file(&b, "nnn.cls", "1", 1);
    struct bytes x = {0};
    pax_rec(&x, "path", "k/2.png", 7);
    tb_meta(&b, 'x', x.p, x.len);
    tb_file(&b, "y", d, 3000);
    tb_file(&b, "k/2.cls", "2", 1);
    tb_end(&b);
    struct parse_result full;
    parse(b.p, b.len, &full);
    cr_assert_eq(full.st, SF_OK, "%s", full.err);
    cr_assert_eq(full.samples, 3);

    /* Layout: L 0..1024, x 1024..2560, nnn.cls 2560..3584, pax 3584..4608,
     * y 4608..8192, k/2.cls 8192..9216, end 9216..10240. A shard may end
     * cleanly only at a member boundary (or inside the end marker). */
    cr_assert_eq(b.len, 10240);
    const size_t clean[] = {0, 2560, 3584, 8192, 9216, 9728};
    for (size_t k = 0; k < b.len; k++) {
        struct parse_result r;
        parse(b.p, k, &r);
        int is_clean = 0;
        for (size_t i = 0; i < sizeof clean / sizeof clean[0]; i++)
            is_clean |= clean[i] == k;
        if (is_clean) {
            cr_assert_eq(r.st, SF_OK, "k=%zu: %s", k, r.err);
            /* the samples are those of the full parse, in order (the last
             * one may lack fields) */
            cr_assert(r.ser.len <= full.ser.len);
        } else {
            cr_assert(r.st == SF_ERR_CORRUPT || r.st == SF_ERR_PARSE, "k=%zu: status %d (%s)", k,
                      (int)r.st, r.err);
            cr_assert(r.err_offset < k, "k=%zu: error offset %llu", k, r.err_offset);
            cr_assert(strstr(r.err, "test.tar: offset ") == r.err, "k=%zu: %s", k, r.err);
        }
        parse_result_free(&r);
    }
    /* specific points */
    expect_error(b.p, 100, SF_ERR_CORRUPT, 0, "inside the header");
    expect_error(b.p, 512, SF_ERR_CORRUPT, 0, "long name data");
    expect_error(b.p, 1024, SF_ERR_PARSE, 0, "not followed by a member");
    expect_error(b.p, 1024 + 1100, SF_ERR_CORRUPT, 1024, "runs past the end");
    expect_error(b.p, 2560 + 511, SF_ERR_CORRUPT, 2560, "inside the header");
    expect_error(b.p, 3584 + 300, SF_ERR_CORRUPT, 3584, "inside the header");
    expect_error(b.p, 4096, SF_ERR_CORRUPT, 3584, "pax header data");
    expect_error(b.p, 4608, SF_ERR_PARSE, 3584, "not followed by a member");
    expect_error(b.p, 8192 - 1, SF_ERR_CORRUPT, 4608, "runs past the end");
    expect_error(b.p, 9216 + 700, SF_ERR_CORRUPT, 9728, "second end-of-archive");
    parse_result_free(&full);
    bytes_free(&x);
    bytes_free(&b);
}

Test(tar, bad_checksums)
{
    struct bytes b = {0};
    tb_file(&b, "a.txt", "a", 1);
    size_t second = tb_file(&b, "b.txt", "b", 1);
    tb_end(&b);
    b.p[second + 140] ^= 0x01; /* mtime */
    expect_error(b.p, b.len, SF_ERR_CORRUPT, second, "bad header checksum");
    b.p[second + 140] ^= 0x01;
    memcpy(b.p + second + 148, "zzzzzz", 6);
    expect_error(b.p, b.len, SF_ERR_CORRUPT, second, "checksum field");
    /* not a tar at all */
    unsigned char jpeg[2048];
    fill_random(jpeg, sizeof jpeg, 7);
    jpeg[0] = 0xff;
    jpeg[1] = 0xd8;
    expect_error(jpeg, sizeof jpeg, SF_ERR_CORRUPT, 0, NULL);
    bytes_free(&b);
}

Test(tar, bad_magic_and_numbers)
{
    struct bytes b = {0};
    tb_file(&b, "a.txt", "a", 1);
    size_t at = tb_file(&b, "b.txt", "b", 1);
    tb_end(&b);
    memcpy(b.p + at + 257,
           "ustar\0"
           "01",
           8);
    tb_checksum(b.p + at);
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "magic");
    memcpy(b.p + at + 257,
           "ustar\0"
           "00",
           8);
    memcpy(b.p + at + 124, "0000000x001", 11);
    tb_checksum(b.p + at);
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "size");
    bytes_free(&b);
}

Test(tar, huge_and_negative_and_overflowing_sizes)
{
    struct bytes b = {0};
    tb_file(&b, "a.txt", "a", 1);
    size_t at = tb_file(&b, "b.txt", "b", 1);
    tb_end(&b);
    unsigned char *h = b.p + at;
    /* 8 GiB - 1 in a 3 KiB shard */
    memcpy(h + 124, "77777777777", 11);
    tb_checksum(h);
    expect_error(b.p, b.len, SF_ERR_CORRUPT, at, "runs past the end");
    /* streaming, size unknown until the end: the reader waits, then fails */
    struct parse_result r;
    parse_with(b.p, b.len, NULL, FEED_RANDOM_LATE, 11, 700, &r);
    cr_expect_eq(r.st, SF_ERR_CORRUPT, "%s", r.err);
    cr_expect_eq(r.err_offset, at, "%s", r.err);
    parse_result_free(&r);
    /* negative base-256 */
    memset(h + 124, 0xff, 12);
    tb_checksum(h);
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "size");
    /* base-256 beyond 2^63 */
    memset(h + 124, 0, 12);
    h[124] = 0x80;
    h[127] = 0x01;
    tb_checksum(h);
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "size");
    /* base-256 below 2^63 but far beyond the shard */
    memset(h + 124, 0, 12);
    h[124] = 0x80;
    h[128] = 0x7f;
    tb_checksum(h);
    expect_error(b.p, b.len, SF_ERR_CORRUPT, at, "runs past the end");
    bytes_free(&b);
}

Test(tar, long_name_without_member_and_over_cap)
{
    struct bytes b = {0};
    tb_file(&b, "a.txt", "a", 1);
    size_t at = tb_meta(&b, 'L', "orphan.jpg", 11);
    size_t end = b.len;
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "not followed by a member");
    expect_error(b.p, end, SF_ERR_PARSE, at, "not followed by a member");
    bytes_free(&b);

    /* over the default cap (4096 + NUL) */
    char big[5000];
    memset(big, 'a', sizeof big);
    memcpy(big + 4990, ".jpg", 5);
    at = tb_meta(&b, 'L', big, sizeof big);
    tb_file(&b, "x", "x", 1);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_LIMIT, at, "max_name_bytes");
    /* and over a configured cap */
    bytes_free(&b);
    char mid[101];
    memset(mid, 'm', 100);
    mid[96] = '.';
    mid[100] = '\0';
    at = tb_meta(&b, 'L', mid, 101);
    tb_file(&b, "x", "x", 1);
    tb_end(&b);
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.max_name_bytes = 64;
    struct parse_result r;
    parse_with(b.p, b.len, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_ERR_LIMIT, "%s", r.err);
    cr_expect_eq(r.err_offset, at);
    parse_result_free(&r);
    o.max_name_bytes = 100;
    parse_with(b.p, b.len, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_OK, "%s", r.err);
    cr_expect_eq(r.samples, 1);
    parse_result_free(&r);
    /* an empty long name */
    bytes_free(&b);
    at = tb_meta(&b, 'L', "\0\0", 2);
    tb_file(&b, "x.txt", "x", 1);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "empty");
    bytes_free(&b);
    /* the cap holds for plain ustar names too */
    char un[100];
    memset(un, 'u', 99);
    un[95] = '.';
    un[99] = '\0';
    tb_file(&b, "a.txt", "a", 1);
    at = tb_file(&b, un, "x", 1);
    tb_end(&b);
    o.max_name_bytes = 64;
    parse_with(b.p, b.len, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_ERR_LIMIT, "%s", r.err);
    cr_expect_eq(r.err_offset, at);
    parse_result_free(&r);
    bytes_free(&b);
}

Test(tar, nul_inside_names)
{
    struct bytes b = {0};
    size_t at = tb_meta(&b, 'L', "abc\0def.jpg", 12);
    tb_file(&b, "x", "x", 1);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "NUL");
    bytes_free(&b);
    /* a long name without its terminating NUL is accepted (GNU tar does) */
    tb_meta(&b, 'L', "noterm.jpg", 10);
    tb_file(&b, "x", "x", 1);
    tb_end(&b);
    struct parse_result r;
    parse(b.p, b.len, &r);
    const struct want_sample w[] = {{"noterm", 1, {{"jpg", "x", 1}}}};
    expect_samples(&r, w, 1);
    parse_result_free(&r);
    bytes_free(&b);
    /* pax path with a NUL */
    struct bytes x = {0};
    pax_rec(&x, "path", "a\0b.jpg", 7);
    at = tb_meta(&b, 'x', x.p, x.len);
    tb_file(&b, "x", "x", 1);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_PARSE, at + BLK, "NUL");
    bytes_free(&x);
    bytes_free(&b);
}

/* A pax header holding text (records written as given) then a member. */
static void pax_case(const char *records, size_t n, sf_status want, size_t want_rel,
                     const char *frag)
{
    struct bytes b = {0};
    tb_file(&b, "first.txt", "1", 1);
    size_t at = tb_meta(&b, 'x', records, n);
    tb_file(&b, "x.txt", "x", 1);
    tb_end(&b);
    expect_error(b.p, b.len, want, at + BLK + want_rel, frag);
    bytes_free(&b);
}

Test(tar, pax_records_with_bad_lengths)
{
    pax_case("99 path=x.jpg\n", 14, SF_ERR_PARSE, 0, "runs past");
    pax_case("10 path=x.jpg\n", 14, SF_ERR_PARSE, 0, "newline");
    pax_case("14 path=x.jpg\n3 a\n", 18, SF_ERR_PARSE, 14, "too small");
    pax_case("path=x.jpg\n", 11, SF_ERR_PARSE, 0, "decimal length");
    pax_case("14_path=x.jpg\n", 14, SF_ERR_PARSE, 0, "space");
    pax_case("14 pathxx.jpg\n", 14, SF_ERR_PARSE, 0, "keyword");
    pax_case("14 =athx.jpg\n\n", 14, SF_ERR_PARSE, 0, "keyword");
    pax_case("99999999999999999999999 a=b\n", 28, SF_ERR_PARSE, 0, "overflows");
    pax_case("14 size=12a45\n", 14, SF_ERR_PARSE, 0, "pax size");
    pax_case("31 size=99999999999999999999\n", 29, SF_ERR_PARSE, 0, "runs past");
    pax_case("29 size=99999999999999999999\n", 29, SF_ERR_PARSE, 0, "pax size");
    /* records followed by NUL padding are fine; data after padding is not */
    pax_case("12 path=a.b\n\0\0x", 15, SF_ERR_PARSE, 14, "after NUL padding");

    /* over max_pax_bytes */
    struct bytes b = {0};
    struct bytes x = {0};
    char v[2000];
    memset(v, 'v', sizeof v);
    pax_rec(&x, "comment", v, sizeof v);
    size_t at = tb_meta(&b, 'x', x.p, x.len);
    tb_file(&b, "x.txt", "x", 1);
    tb_end(&b);
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.max_pax_bytes = 1024;
    struct parse_result r;
    parse_with(b.p, b.len, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_ERR_LIMIT, "%s", r.err);
    cr_expect_eq(r.err_offset, at);
    parse_result_free(&r);
    parse(b.p, b.len, &r); /* the default 1 MiB allows it */
    cr_expect_eq(r.st, SF_OK, "%s", r.err);
    parse_result_free(&r);
    bytes_free(&x);
    bytes_free(&b);
}

Test(tar, pax_size_disagreeing_with_ustar_size)
{
    unsigned char d[1500];
    fill_random(d, sizeof d, 8);
    /* pax says more than ustar: the reader skips by the pax size and finds
     * member data where the next header should be */
    struct bytes b = {0}, x = {0};
    pax_rec(&x, "size", "1034", 4);
    tb_meta(&b, 'x', x.p, x.len);
    size_t hdr = tb_header(&b, "a.bin", '0', 10, TB_POSIX);
    tb_data(&b, d, 10);
    tb_file(&b, "b.bin", d, 1500);
    tb_file(&b, "c.bin", d, 1500);
    tb_end(&b);
    /* pax: 1034 bytes -> 1536 with padding: the next header is read at
     * hdr + 512 + 1536, which is inside b.bin's data */
    expect_error(b.p, b.len, SF_ERR_CORRUPT, hdr + BLK + 1536, "checksum");
    bytes_free(&b);
    bytes_free(&x);

    /* pax says less than ustar: same, earlier */
    pax_rec(&x, "size", "100", 3);
    tb_meta(&b, 'x', x.p, x.len);
    hdr = tb_header(&b, "a.bin", '0', 1500, TB_POSIX);
    tb_data(&b, d, 1500);
    tb_file(&b, "b.bin", d, 10);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_CORRUPT, hdr + BLK + BLK, "checksum");
    bytes_free(&b);
    bytes_free(&x);

    /* pax size beyond the shard */
    pax_rec(&x, "size", "1000000", 7);
    tb_meta(&b, 'x', x.p, x.len);
    hdr = tb_header(&b, "a.bin", '0', 10, TB_POSIX);
    tb_data(&b, d, 10);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_CORRUPT, hdr, "runs past the end");
    bytes_free(&b);
    bytes_free(&x);
}

Test(tar, lone_zero_block_followed_by_data_and_duplicates_and_field_cap)
{
    struct bytes b = {0};
    tb_file(&b, "a.txt", "a", 1);
    size_t z = b.len;
    static const unsigned char zero[BLK];
    bytes_put(&b, zero, BLK);
    tb_file(&b, "b.txt", "b", 1);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_CORRUPT, z, "lone zero block");
    bytes_free(&b);

    tb_file(&b, "a.txt", "a", 1);
    size_t dup = tb_file(&b, "a.TXT", "A", 1);
    tb_end(&b);
    expect_error(b.p, b.len, SF_ERR_PARSE, dup, "twice");
    bytes_free(&b);

    size_t at = 0;
    for (int i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "k.f%d", i);
        at = tb_file(&b, name, "x", 1);
    }
    tb_end(&b);
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.max_fields = 4;
    struct parse_result r;
    parse_with(b.p, b.len, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_ERR_LIMIT, "%s", r.err);
    cr_expect_eq(r.err_offset, at);
    parse_result_free(&r);
    bytes_free(&b);
}

Test(tar, compressed_tar_is_refused)
{
    unsigned char gz[600] = {0x1f, 0x8b, 0x08};
    struct parse_result r;
    parse(gz, sizeof gz, &r);
    cr_expect_eq(r.st, SF_ERR_UNSUPPORTED);
    cr_expect(strstr(r.err, "gzip") != NULL, "%s", r.err);
    parse_result_free(&r);
    unsigned char zs[600] = {0x28, 0xb5, 0x2f, 0xfd};
    parse(zs, sizeof zs, &r);
    cr_expect_eq(r.st, SF_ERR_UNSUPPORTED);
    parse_result_free(&r);
}

Test(tar, feed_rules_are_enforced)
{
    struct bytes b = {0};
    tb_file(&b, "a.txt", "a", 1);
    tb_end(&b);
    struct sf_shard_reader *r;
    cr_assert_eq(sf_shard_reader_new(NULL, &r, NULL, 0), SF_OK);
    struct sf_sample s;
    enum sf_shard_event ev;
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
    cr_expect_eq(ev, SF_SHARD_NEED_MORE);
    cr_expect_eq(sf_shard_reader_format(r), SF_SHARD_FORMAT_AUTO);
    cr_assert_eq(sf_shard_reader_feed(r, b.p, 600, SF_SIZE_UNKNOWN), SF_OK);
    cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
    cr_expect_eq(ev, SF_SHARD_NEED_MORE);
    cr_expect_eq(sf_shard_reader_wanted(r), 1024 + 512, "wanted %llu", sf_shard_reader_wanted(r));
    cr_expect_eq(sf_shard_reader_error_offset(r), SF_SIZE_UNKNOWN);
    cr_expect_str_eq(sf_shard_reader_errmsg(r), "");
    cr_expect_eq(sf_shard_reader_feed(r, b.p, 500, SF_SIZE_UNKNOWN), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_shard_reader_next(r, &s, &ev), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(sf_shard_reader_errmsg(r), "went down") != NULL);
    sf_shard_reader_destroy(r);

    cr_assert_eq(sf_shard_reader_new(NULL, &r, NULL, 0), SF_OK);
    cr_assert_eq(sf_shard_reader_feed(r, b.p, 600, b.len), SF_OK);
    cr_expect_eq(sf_shard_reader_feed(r, b.p, 700, b.len + 1), SF_ERR_INVALID_ARGUMENT);
    sf_shard_reader_destroy(r);
    cr_assert_eq(sf_shard_reader_new(NULL, &r, NULL, 0), SF_OK);
    cr_expect_eq(sf_shard_reader_feed(r, b.p, 700, 600), SF_ERR_INVALID_ARGUMENT);
    sf_shard_reader_destroy(r);
    cr_assert_eq(sf_shard_reader_new(NULL, &r, NULL, 0), SF_OK);
    cr_expect_eq(sf_shard_reader_feed(r, NULL, 7, 600), SF_ERR_INVALID_ARGUMENT);
    sf_shard_reader_destroy(r);
    sf_shard_reader_destroy(NULL);

    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.format = (enum sf_shard_format)9;
    char err[128] = "";
    cr_expect_eq(sf_shard_reader_new(&o, &r, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(r);
    cr_expect(strstr(err, "format") != NULL);
    bytes_free(&b);
}

/* ------------------------------------------------------------ random increments */

static void expect_same_in_all_feed_modes(const unsigned char *buf, size_t len)
{
    struct parse_result all;
    parse(buf, len, &all);
    const enum feed_mode modes[] = {FEED_RANDOM, FEED_RANDOM_LATE, FEED_RANDOM_MOVING};
    for (uint64_t seed = 1; seed <= 12; seed++) {
        struct parse_result r;
        size_t max_step = seed % 3 == 0 ? 7 : seed % 3 == 1 ? 600 : 5000;
        parse_with(buf, len, NULL, modes[seed % 3], seed, max_step, &r);
        cr_assert_eq(r.st, all.st, "seed %llu: status %d (%s) vs %d (%s)", (unsigned long long)seed,
                     (int)r.st, r.err, (int)all.st, all.err);
        cr_assert_eq(r.err_offset, all.err_offset);
        cr_assert_eq(r.samples, all.samples, "seed %llu", (unsigned long long)seed);
        cr_assert(bytes_eq(&r.ser, &all.ser), "seed %llu: samples differ from feeding all at once",
                  (unsigned long long)seed);
        cr_assert_eq(r.stats.members, all.stats.members);
        parse_result_free(&r);
    }
    parse_result_free(&all);
}

Test(tar, random_increments_give_the_same_samples)
{
    struct bytes b = {0};
    unsigned char d[5000];
    fill_random(d, sizeof d, 9);
    char longname[180];
    memset(longname, 'q', sizeof longname);
    memcpy(longname + 170, ".cls", 5);
    for (int i = 0; i < 20; i++) {
        char name[64];
        snprintf(name, sizeof name, "s%03d.jpg", i);
        tb_file(&b, name, d + i, (size_t)(i * 211) % 4000);
        snprintf(name, sizeof name, "s%03d.cls", i);
        tb_file(&b, name, "3", 1);
        if (i % 5 == 0) {
            struct bytes x = {0};
            char p[64];
            int n = snprintf(p, sizeof p, "s%03d.json", i);
            pax_rec(&x, "path", p, (size_t)n);
            tb_meta(&b, 'x', x.p, x.len);
            tb_file(&b, "unused", "{}", 2);
            bytes_free(&x);
        }
        if (i % 7 == 0) {
            tb_meta(&b, 'L', longname, sizeof longname);
            tb_file(&b, "x", "7", 1);
        }
    }
    tb_end(&b);
    expect_same_in_all_feed_modes(b.p, b.len);
    /* errors too: same status and offset whatever the increments */
    b.p[30 * BLK + 3] ^= 0x40;
    expect_same_in_all_feed_modes(b.p, b.len);
    expect_same_in_all_feed_modes(b.p, b.len - 3 * BLK - 100);
    bytes_free(&b);
}

/* ------------------------------------------------------------ real tools */

struct tfile {
    const char *path;
    size_t size;
    const char *content; /* NULL: random bytes */
    int long_base;       /* base name > 100 bytes: GNU and pax only */
    int long_path;       /* path > 100 bytes that ustar can split */
};

static char g_longdir_path[200];
static char g_longbase_path[200];
static char g_split_path[200];

static void init_names(void)
{
    /* 130-char directory, then a short name: GNU 'L' or pax path */
    memset(g_longdir_path, 'd', 130);
    strcpy(g_longdir_path + 130, "/s002.jpg");
    /* base name of 110 chars */
    memset(g_longbase_path, 'k', 110);
    strcpy(g_longbase_path + 110, ".Txt");
    /* 70 + 1 + 40 + 9 = 120 chars, splittable into prefix and name */
    memset(g_split_path, 'p', 70);
    g_split_path[70] = '/';
    memset(g_split_path + 71, 'q', 40);
    strcpy(g_split_path + 111, "/s003.npy");
}

static const struct tfile *tool_files(size_t *n)
{
    static struct tfile files[16];
    init_names();
    size_t i = 0;
    files[i++] = (struct tfile){"s000.jpg", 3000, NULL, 0, 0};
    files[i++] = (struct tfile){"s000.cls", 1, "3", 0, 0};
    files[i++] = (struct tfile){"s000.JSON", 13, "{\"a\": [1, 2]}", 0, 0};
    files[i++] = (struct tfile){"s001.seg.png", 700, NULL, 0, 0};
    files[i++] = (struct tfile){"s001.jpg", 513, NULL, 0, 0};
    files[i++] = (struct tfile){g_longdir_path, 1024, NULL, 0, 1};
    files[i++] = (struct tfile){g_longbase_path, 5, "hello", 1, 0};
    files[i++] = (struct tfile){g_split_path, 2049, NULL, 0, 1};
    files[i++] = (struct tfile){"s004.txt", 0, "", 0, 0};
    files[i++] = (struct tfile){"README", 4, "read", 0, 0};
    files[i++] = (struct tfile){"caf\xc3\xa9-\xc3\xbc.jpg", 77, NULL, 0, 0};
    files[i++] = (struct tfile){"s006.jpg", 10000, NULL, 0, 0};
    *n = i;
    return files;
}

static void file_bytes(const struct tfile *f, size_t i, unsigned char *out)
{
    if (f->content)
        memcpy(out, f->content, f->size);
    else
        fill_random(out, f->size, 1000 + i);
}

static void run(const char *cmd)
{
    int rc = system(cmd);
    cr_assert_eq(rc, 0, "command failed (%d): %s", rc, cmd);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    struct bytes b = {0};
    unsigned char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        bytes_put(&b, tmp, n);
    fclose(f);
    *len = b.len;
    return b.p ? b.p : calloc(1, 1);
}

/* Writes the files into a fresh directory; returns it. */
static char *make_tree(void)
{
    char tmpl[] = "/tmp/sf-test-tar-XXXXXX";
    char *dir = mkdtemp(tmpl);
    cr_assert_not_null(dir);
    dir = strdup(dir);
    size_t n;
    const struct tfile *files = tool_files(&n);
    char path[1024];
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i].path);
        char *slash = strrchr(path, '/');
        *slash = '\0';
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
        run(cmd);
        *slash = '/';
        unsigned char *data = malloc(files[i].size + 1);
        file_bytes(&files[i], i, data);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f, "%s", path);
        cr_assert_eq(fwrite(data, 1, files[i].size, f), files[i].size);
        fclose(f);
        free(data);
    }
    snprintf(path, sizeof path, "%s/subdir", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/link.jpg", dir);
    cr_assert_eq(symlink("s000.jpg", path), 0);
    return dir;
}

static void remove_tree(char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    run(cmd);
    free(dir);
}

enum tool { GNU_TAR, PYTHON };

/* Creates dir/out.tar with the tool in the format; returns the member
 * order used (the file list filtered for the format). */
static void make_tar(const char *dir, enum tool tool, const char *format, int allow_long_base,
                     int allow_long_path)
{
    size_t n;
    const struct tfile *files = tool_files(&n);
    char cmd[8192];
    size_t at = 0;
    if (tool == GNU_TAR)
        at +=
            (size_t)snprintf(cmd + at, sizeof cmd - at,
                             "cd '%s' && tar --format=%s --no-recursion -cf out.tar", dir, format);
    else
        at += (size_t)snprintf(cmd + at, sizeof cmd - at, "cd '%s' && python3 mk.py %s out.tar .",
                               dir, format);
    for (size_t i = 0; i < n; i++) {
        if ((files[i].long_base && !allow_long_base) || (files[i].long_path && !allow_long_path))
            continue;
        at += (size_t)snprintf(cmd + at, sizeof cmd - at, " '%s'", files[i].path);
        if (i == 4) /* a directory and a symlink between samples */
            at += (size_t)snprintf(cmd + at, sizeof cmd - at, " subdir link.jpg");
    }
    cr_assert(at < sizeof cmd);
    if (tool == PYTHON) {
        char py[512];
        snprintf(py, sizeof py, "%s/mk.py", dir);
        FILE *f = fopen(py, "w");
        cr_assert_not_null(f);
        fputs("import sys, tarfile\n"
              "fmt = {'gnu': tarfile.GNU_FORMAT, 'pax': tarfile.PAX_FORMAT,\n"
              "       'ustar': tarfile.USTAR_FORMAT}[sys.argv[1]]\n"
              "kw = {}\n"
              "if sys.argv[1] == 'pax':\n"
              "    kw['pax_headers'] = {'comment': 'test', 'path': 'global-ignored.jpg'}\n"
              "with tarfile.open(sys.argv[2], 'w', format=fmt, **kw) as t:\n"
              "    for n in sys.argv[4:]:\n"
              "        t.add(sys.argv[3] + '/' + n, arcname=n, recursive=False)\n",
              f);
        fclose(f);
    }
    run(cmd);
}

/* The samples the tool's archive must give. */
static void expected_for(int allow_long_base, int allow_long_path, struct bytes *out)
{
    size_t n;
    const struct tfile *files = tool_files(&n);
    unsigned char *data[16];
    for (size_t i = 0; i < n; i++) {
        data[i] = malloc(files[i].size + 1);
        file_bytes(&files[i], i, data[i]);
    }
    static char longbase_key[200];
    memcpy(longbase_key, g_longbase_path, 110);
    longbase_key[110] = '\0';
    static char longdir_key[200], split_key[200];
    snprintf(longdir_key, sizeof longdir_key, "%.*s", 135, g_longdir_path);
    snprintf(split_key, sizeof split_key, "%.*s", 116, g_split_path);
    struct want_sample w[16];
    size_t k = 0;
    w[k++] = (struct want_sample){"s000",
                                  3,
                                  {{"jpg", data[0], files[0].size},
                                   {"cls", data[1], files[1].size},
                                   {"json", data[2], files[2].size}}};
    w[k++] = (struct want_sample){
        "s001", 2, {{"seg.png", data[3], files[3].size}, {"jpg", data[4], files[4].size}}};
    if (allow_long_path)
        w[k++] = (struct want_sample){longdir_key, 1, {{"jpg", data[5], files[5].size}}};
    if (allow_long_base)
        w[k++] = (struct want_sample){longbase_key, 1, {{"txt", data[6], files[6].size}}};
    if (allow_long_path)
        w[k++] = (struct want_sample){split_key, 1, {{"npy", data[7], files[7].size}}};
    w[k++] = (struct want_sample){"s004", 1, {{"txt", data[8], 0}}};
    w[k++] = (struct want_sample){"caf\xc3\xa9-\xc3\xbc", 1, {{"jpg", data[10], files[10].size}}};
    w[k++] = (struct want_sample){"s006", 1, {{"jpg", data[11], files[11].size}}};
    serialize_want(out, w, k);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
}

static void check_tool_archive(enum tool tool, const char *format, int allow_long_base,
                               int allow_long_path)
{
    char *dir = make_tree();
    make_tar(dir, tool, format, allow_long_base, allow_long_path);
    char path[512];
    snprintf(path, sizeof path, "%s/out.tar", dir);
    size_t len;
    unsigned char *buf = slurp(path, &len);
    struct parse_result r;
    parse(buf, len, &r);
    cr_assert_eq(r.st, SF_OK, "%s %s: %s", tool == GNU_TAR ? "tar" : "python", format, r.err);
    struct bytes want = {0};
    expected_for(allow_long_base, allow_long_path, &want);
    cr_expect(bytes_eq(&r.ser, &want), "%s %s: samples differ (%zu samples)",
              tool == GNU_TAR ? "tar" : "python", format, r.samples);
    cr_expect_eq(r.stats.skipped_dirs, 1);
    cr_expect_eq(r.stats.skipped_links, 1);
    cr_expect_eq(r.stats.skipped_unnamed, 1); /* README */
    cr_expect_eq(r.stats.missing_end_marker, 0);
    parse_result_free(&r);
    bytes_free(&want);
    expect_same_in_all_feed_modes(buf, len);
    free(buf);
    remove_tree(dir);
}

Test(tar, gnu_tar_gnu_format)
{
    check_tool_archive(GNU_TAR, "gnu", 1, 1);
}

Test(tar, gnu_tar_pax_format)
{
    check_tool_archive(GNU_TAR, "pax", 1, 1);
}

Test(tar, gnu_tar_ustar_format)
{
    check_tool_archive(GNU_TAR, "ustar", 0, 1);
}

Test(tar, gnu_tar_v7_format)
{
    check_tool_archive(GNU_TAR, "v7", 0, 0);
}

Test(tar, python_tarfile_gnu_format)
{
    check_tool_archive(PYTHON, "gnu", 1, 1);
}

Test(tar, python_tarfile_pax_format_with_global_header)
{
    check_tool_archive(PYTHON, "pax", 1, 1);
}

Test(tar, python_tarfile_ustar_format)
{
    check_tool_archive(PYTHON, "ustar", 0, 1);
}
