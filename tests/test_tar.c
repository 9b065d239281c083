/* Tar shard reader: archives written by GNU tar and Python's tarfile, fed
 * at once and in random increments, and a corpus of malformed archives
 * built here byte by byte. Rules under test: docs/FORMAT.md.
 *
 * Suite `tar`, one executable: this file (numbers, hand-built archives,
 * random increments), test_tar_malformed.c (the malformed corpus) and
 * test_tar_tools.c (GNU tar and Python's tarfile), over tar_fixture.c. */
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

    struct parse_result r;
    tb_end_and_parse(&b, &r);
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
    tb_pax(&b, "path", "k1.jpg", 6);               /* 0..1024 */
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
    struct parse_result r;
    tb_end_and_parse(&b, &r);
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
    char *longname = long_name(292, 'L', "/sample.Jpeg");
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
    tb_pax(&b, "GNU.sparse.major", "1", 1);
    tb_file(&b, "sparse.bin", d, 10);
    tb_file(&b, "after.txt", "t", 1);

    struct parse_result r;
    tb_end_and_parse(&b, &r);
    char key[300];
    memcpy(key, longname, 287);
    key[287] = '\0';
    free(longname);
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
    struct parse_result r;
    tb_end_and_parse(&b, &r);
    const struct want_sample w[] = {{"big", 1, {{"bin", d, 600}}}};
    expect_samples(&r, w, 1);
    parse_result_free(&r);
    bytes_free(&b);
}

/* The first len bytes of buf parse into the n samples of w (none: an empty
 * archive); the reader's stats. */
static struct sf_shard_stats parse_samples(const unsigned char *buf, size_t len,
                                           const struct want_sample *w, size_t n)
{
    struct parse_result r;
    parse(buf, len, &r);
    expect_samples(&r, w, n);
    struct sf_shard_stats st = r.stats;
    parse_result_free(&r);
    return st;
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

    struct sf_shard_stats st = parse_samples(b.p, b.len, w, 2);
    cr_expect_eq(st.missing_end_marker, 0);
    cr_expect_eq(st.lone_zero_block, 0);

    /* no zero blocks: accepted and counted */
    st = parse_samples(b.p, members_end, w, 2);
    cr_expect_eq(st.missing_end_marker, 1);

    /* one zero block then the end: accepted and counted */
    st = parse_samples(b.p, members_end + BLK, w, 2);
    cr_expect_eq(st.lone_zero_block, 1);

    /* the same with require_end_marker */
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.name = "test.tar";
    o.require_end_marker = 1;
    struct parse_result r;
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
    st = parse_samples(b.p, 0, NULL, 0);
    cr_expect_eq(st.missing_end_marker, 1);
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
            char p[64];
            int n = snprintf(p, sizeof p, "s%03d.json", i);
            tb_pax(&b, "path", p, (size_t)n);
            tb_file(&b, "unused", "{}", 2);
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
