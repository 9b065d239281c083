/* The tar reader on malformed archives built byte by byte: truncations,
 * checksums, magic, sizes, long names, pax records, feed rules. Each names
 * the offset. Suite `tar` (test_tar.c). */
#include "tar_fixture.h"

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

/* ------------------------------------------------------------ malformed corpus */

static void expect_error(const unsigned char *buf, size_t len, sf_status want,
                         unsigned long long want_offset, const char *frag)
{
    expect_shard_error(&tar_style, buf, len, want, want_offset, frag, 0);
}

/* b parsed with o fails with SF_ERR_LIMIT at offset at. */
static void expect_over_limit(const struct bytes *b, const struct sf_shard_reader_options *o,
                              size_t at)
{
    struct parse_result r;
    parse_with(b->p, b->len, o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_ERR_LIMIT, "%s", r.err);
    cr_expect_eq(r.err_offset, at);
    parse_result_free(&r);
}

/* a.txt, then a one-byte member name holding data[0], then the end; the
 * second member's header offset (the one the tests break). */
static size_t second_member(struct bytes *b, const char *name, const char *data)
{
    tb_file(b, "a.txt", "a", 1);
    size_t at = tb_file(b, name, data, 1);
    tb_end(b);
    return at;
}

/* A GNU long name or pax header (type) of the n bytes of d, then the
 * one-byte member it describes (ustar name name), then the end; the
 * header's offset. */
static size_t meta_then_member(struct bytes *b, char type, const void *d, size_t n,
                               const char *name)
{
    size_t at = tb_meta(b, type, d, n);
    tb_file(b, name, "x", 1);
    tb_end(b);
    return at;
}

Test(tar, truncation_at_every_offset_never_crashes_and_names_the_offset)
{
    struct bytes b = {0};
    unsigned char d[3000];
    fill_random(d, sizeof d, 6);
    char *longname = long_name(194, 'n', ".jpg");
    tb_meta(&b, 'L', longname, strlen(longname) + 1);
    free(longname);
    tb_file(&b, "x", d, 1000);
    tb_file(&b, "nnn.cls", "1", 1);
    tb_pax(&b, "path", "k/2.png", 7);
    tb_file(&b, "y", d, 3000);
    tb_file(&b, "k/2.cls", "2", 1);
    struct parse_result full;
    tb_end_and_parse(&b, &full);
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
    bytes_free(&b);
}

Test(tar, bad_checksums)
{
    struct bytes b = {0};
    size_t second = second_member(&b, "b.txt", "b");
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
    size_t at = second_member(&b, "b.txt", "b");
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
    size_t at = second_member(&b, "b.txt", "b");
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
    at = meta_then_member(&b, 'L', big, sizeof big, "x");
    expect_error(b.p, b.len, SF_ERR_LIMIT, at, "max_name_bytes");
    /* and over a configured cap */
    bytes_free(&b);
    char *mid = long_name(100, 'm', ".mmm");
    at = meta_then_member(&b, 'L', mid, strlen(mid) + 1, "x");
    free(mid);
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.max_name_bytes = 64;
    struct parse_result r;
    expect_over_limit(&b, &o, at);
    o.max_name_bytes = 100;
    parse_with(b.p, b.len, &o, FEED_ALL, 0, 0, &r);
    cr_expect_eq(r.st, SF_OK, "%s", r.err);
    cr_expect_eq(r.samples, 1);
    parse_result_free(&r);
    /* an empty long name */
    bytes_free(&b);
    at = meta_then_member(&b, 'L', "\0\0", 2, "x.txt");
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "empty");
    bytes_free(&b);
    /* the cap holds for plain ustar names too */
    char *un = long_name(99, 'u', ".uuu");
    at = second_member(&b, un, "x");
    free(un);
    o.max_name_bytes = 64;
    expect_over_limit(&b, &o, at);
    bytes_free(&b);
}

Test(tar, nul_inside_names)
{
    struct bytes b = {0};
    size_t at = meta_then_member(&b, 'L', "abc\0def.jpg", 12, "x");
    expect_error(b.p, b.len, SF_ERR_PARSE, at, "NUL");
    bytes_free(&b);
    /* a long name without its terminating NUL is accepted (GNU tar does) */
    meta_then_member(&b, 'L', "noterm.jpg", 10, "x");
    struct parse_result r;
    parse(b.p, b.len, &r);
    const struct want_sample w[] = {{"noterm", 1, {{"jpg", "x", 1}}}};
    expect_samples(&r, w, 1);
    parse_result_free(&r);
    bytes_free(&b);
    /* pax path with a NUL */
    struct bytes x = {0};
    pax_rec(&x, "path", "a\0b.jpg", 7);
    at = meta_then_member(&b, 'x', x.p, x.len, "x");
    expect_error(b.p, b.len, SF_ERR_PARSE, at + BLK, "NUL");
    bytes_free(&x);
    bytes_free(&b);
}

/* A pax header holding the n bytes of records (written as given) then a
 * member: a parse error at the header's data + want_rel, naming frag. */
static void pax_bytes_case(const char *records, size_t n, size_t want_rel, const char *frag)
{
    struct bytes b = {0};
    tb_file(&b, "first.txt", "1", 1);
    size_t at = meta_then_member(&b, 'x', records, n, "x.txt");
    expect_error(b.p, b.len, SF_ERR_PARSE, at + BLK + want_rel, frag);
    bytes_free(&b);
}

/* pax_bytes_case of records without NUL bytes: strlen counts them. */
static void pax_case(const char *records, size_t want_rel, const char *frag)
{
    pax_bytes_case(records, strlen(records), want_rel, frag);
}

Test(tar, pax_records_with_bad_lengths)
{
    pax_case("99 path=x.jpg\n", 0, "runs past");
    pax_case("10 path=x.jpg\n", 0, "newline");
    pax_case("14 path=x.jpg\n3 a\n", 14, "too small");
    pax_case("path=x.jpg\n", 0, "decimal length");
    pax_case("14_path=x.jpg\n", 0, "space");
    pax_case("14 pathxx.jpg\n", 0, "keyword");
    pax_case("14 =athx.jpg\n\n", 0, "keyword");
    pax_case("99999999999999999999999 a=b\n", 0, "overflows");
    pax_case("14 size=12a45\n", 0, "pax size");
    pax_case("31 size=99999999999999999999\n", 0, "runs past");
    pax_case("29 size=99999999999999999999\n", 0, "pax size");
    /* records followed by NUL padding are fine; data after padding is not */
    pax_bytes_case("12 path=a.b\n\0\0x", 15, 14, "after NUL padding");

    /* over max_pax_bytes */
    struct bytes b = {0};
    struct bytes x = {0};
    char v[2000];
    memset(v, 'v', sizeof v);
    pax_rec(&x, "comment", v, sizeof v);
    size_t at = meta_then_member(&b, 'x', x.p, x.len, "x.txt");
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.max_pax_bytes = 1024;
    struct parse_result r;
    expect_over_limit(&b, &o, at);
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
    /* A pax size, the ustar member a.bin of ustar_size bytes, then members
     * b.bin and c.bin of next[] bytes (0: none): the error is at a.bin's
     * header + at. */
    static const struct {
        const char *pax_size;
        size_t ustar_size, next[2], at;
        const char *frag;
    } cases[] = {
        /* pax says more than ustar: the reader skips by the pax size and
         * finds member data where the next header should be (1034 bytes ->
         * 1536 with padding: the next header is read at hdr + 512 + 1536,
         * which is inside b.bin's data) */
        {"1034", 10, {1500, 1500}, BLK + 1536, "checksum"},
        /* pax says less than ustar: same, earlier */
        {"100", 1500, {10, 0}, BLK + BLK, "checksum"},
        /* pax size beyond the shard */
        {"1000000", 10, {0, 0}, 0, "runs past the end"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct bytes b = {0};
        tb_pax(&b, "size", cases[i].pax_size, strlen(cases[i].pax_size));
        size_t hdr = tb_header(&b, "a.bin", '0', cases[i].ustar_size, TB_POSIX);
        tb_data(&b, d, cases[i].ustar_size);
        if (cases[i].next[0])
            tb_file(&b, "b.bin", d, cases[i].next[0]);
        if (cases[i].next[1])
            tb_file(&b, "c.bin", d, cases[i].next[1]);
        tb_end(&b);
        expect_error(b.p, b.len, SF_ERR_CORRUPT, hdr + cases[i].at, cases[i].frag);
        bytes_free(&b);
    }
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

    size_t dup = second_member(&b, "a.TXT", "A");
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
    expect_over_limit(&b, &o, at);
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
