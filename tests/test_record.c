/* Record shards: writer → reader round trips (with and without zstd),
 * random access through the index, and corrupted, truncated and
 * inconsistent shards. Layout under test: docs/FORMAT.md. */
#include <criterion/criterion.h>

#include "shardfeed_shard.h"
#include "src/record.h"
#include "support/bytes.h"
#include "support/shard_parse.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* ------------------------------------------------------------ helpers */

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* ------------------------------------------------------------ test samples */

#define MAX_F 6

struct tsample {
    char key[64];
    size_t nf;
    struct sf__record_field_in f[MAX_F];
    char names[MAX_F][16];
    unsigned char *data[MAX_F];
};

struct corpus {
    struct tsample *s;
    size_t n;
};

/* n samples with 0..5 fields of 0..max_size bytes; compressible = 1 makes
 * every other field text (zstd shrinks it), the rest random. */
static void corpus_make(struct corpus *c, size_t n, size_t max_size, int compressible,
                        uint64_t seed)
{
    static const char *names[] = {"jpg", "cls", "json", "seg.png", "npy", "txt"};
    c->n = n;
    c->s = calloc(n, sizeof *c->s);
    cr_assert_not_null(c->s);
    for (size_t i = 0; i < n; i++) {
        struct tsample *t = &c->s[i];
        snprintf(t->key, sizeof t->key, "train/%06zu", i);
        t->nf = (size_t)(rng_next(&seed) % MAX_F);
        for (size_t j = 0; j < t->nf; j++) {
            size_t sz = (size_t)(rng_next(&seed) % (max_size + 1));
            if (j == 0 && i % 7 == 3)
                sz = 0;
            t->data[j] = malloc(sz ? sz : 1);
            for (size_t k = 0; k < sz; k++)
                t->data[j][k] = compressible && j % 2 == 0
                                    ? (unsigned char)("the quick brown fox "[k % 20])
                                    : (unsigned char)(rng_next(&seed) >> 56);
            snprintf(t->names[j], sizeof t->names[j], "%s", names[j]);
            t->f[j].name = t->names[j];
            t->f[j].data = sz ? t->data[j] : NULL;
            t->f[j].size = sz;
        }
    }
}

static void corpus_free(struct corpus *c)
{
    for (size_t i = 0; i < c->n; i++)
        for (size_t j = 0; j < c->s[i].nf; j++)
            free(c->s[i].data[j]);
    free(c->s);
    memset(c, 0, sizeof *c);
}

/* Makes t a sample of one field "jpg" of size bytes of ch. */
static void set_single_field(struct tsample *t, size_t size, int ch)
{
    for (size_t j = 0; j < t->nf; j++)
        free(t->data[j]);
    t->nf = 1;
    t->data[0] = malloc(size);
    memset(t->data[0], ch, size);
    snprintf(t->names[0], sizeof t->names[0], "jpg");
    t->f[0] = (struct sf__record_field_in){t->names[0], t->data[0], size};
}

static void serialize_tsample(struct bytes *out, const struct tsample *t)
{
    size_t kl = strlen(t->key);
    bytes_put_u64(out, kl);
    bytes_put(out, t->key, kl);
    bytes_put_u64(out, t->nf);
    for (size_t j = 0; j < t->nf; j++) {
        size_t nl = strlen(t->f[j].name);
        bytes_put_u64(out, nl);
        bytes_put(out, t->f[j].name, nl);
        bytes_put_u64(out, t->f[j].size);
        bytes_put(out, t->data[j], t->f[j].size);
    }
}

/* Writes the corpus with the given options (NULL: memory, defaults). */
static unsigned char *write_corpus(const struct corpus *c,
                                   const struct sf__record_writer_options *o, size_t *len)
{
    struct sf__record_writer *w;
    char err[256];
    cr_assert_eq(sf__record_writer_new(o, &w, err, sizeof err), SF_OK, "%s", err);
    for (size_t i = 0; i < c->n; i++)
        cr_assert_eq(sf__record_writer_add(w, c->s[i].key, c->s[i].f, c->s[i].nf), SF_OK, "%s",
                     sf__record_writer_errmsg(w));
    cr_assert_eq(sf__record_writer_finish(w), SF_OK, "%s", sf__record_writer_errmsg(w));
    cr_assert_eq(sf__record_writer_count(w), c->n);
    unsigned char *p = sf__record_writer_take(w, len);
    if (!o || (o->fd < 0 && !o->file)) {
        cr_assert_not_null(p);
        cr_assert_eq(*len, sf__record_writer_bytes(w));
    }
    sf__record_writer_destroy(w);
    return p;
}

static unsigned char *write_mem(const struct corpus *c, int zstd_level, size_t *len)
{
    struct sf__record_writer_options o;
    sf__record_writer_options_init_default(&o);
    o.zstd_level = zstd_level;
    return write_corpus(c, &o, len);
}

/* corpus_make, then write_mem of it: the corpus in *c, the shard returned. */
static unsigned char *corpus_shard(struct corpus *c, size_t n, size_t max_size, int compressible,
                                   uint64_t seed, int zstd_level, size_t *len)
{
    corpus_make(c, n, max_size, compressible, seed);
    return write_mem(c, zstd_level, len);
}

/* ------------------------------------------------------------ parsing */

static const struct feed_style sfr_style = {"test.sfr", 3000, 3};

static void parse_with(const unsigned char *buf, size_t len,
                       const struct sf_shard_reader_options *o, enum feed_mode mode, uint64_t seed,
                       struct parse_result *res)
{
    parse_shard(&sfr_style, buf, len, o, mode, seed, 0, res);
}

static void parse(const unsigned char *buf, size_t len, struct parse_result *res)
{
    parse_with(buf, len, NULL, FEED_ALL, 0, res);
}

/* The reader's defaults, for test.sfr. */
static struct sf_shard_reader_options sfr_options(void)
{
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.name = "test.sfr";
    return o;
}

/* buf[0, len) parsed all at once as a record shard, whatever its first
 * bytes (format forced). */
static void parse_as_record(const unsigned char *buf, size_t len, struct parse_result *res)
{
    struct sf_shard_reader_options o = sfr_options();
    o.format = SF_SHARD_FORMAT_RECORD;
    parse_with(buf, len, &o, FEED_ALL, 0, res);
}

/* buf parsed with o stops at a limit at offset off, the message holding
 * frag unless NULL. */
static void expect_limit(const unsigned char *buf, size_t len,
                         const struct sf_shard_reader_options *o, uint64_t off, const char *frag)
{
    struct parse_result r;
    parse_with(buf, len, o, FEED_ALL, 0, &r);
    cr_expect_eq(r.st, SF_ERR_LIMIT, "%s", r.err);
    cr_expect_eq(r.err_offset, off);
    if (frag)
        cr_expect(strstr(r.err, frag) != NULL, "%s", r.err);
    bytes_free(&r.ser);
}

static void expect_corpus(const struct parse_result *r, const struct corpus *c)
{
    struct bytes want = {0};
    for (size_t i = 0; i < c->n; i++)
        serialize_tsample(&want, &c->s[i]);
    cr_expect_eq(r->st, SF_OK, "%s", r->err);
    cr_expect_eq(r->samples, c->n);
    cr_expect(bytes_eq(&r->ser, &want), "samples differ from what was written");
    bytes_free(&want);
}

static void expect_error(const unsigned char *buf, size_t len, sf_status want,
                         unsigned long long want_offset, const char *frag)
{
    expect_shard_error(&sfr_style, buf, len, want, want_offset, frag, 1);
}

/* Both readers of a shard's tail refuse buf as corrupt: the index read from
 * the tail with a message holding index_frag, the reader with an error at
 * offset at holding reader_frag. */
static void expect_bad_tail(const unsigned char *buf, size_t len, const char *index_frag,
                            unsigned long long at, const char *reader_frag)
{
    struct sf__record_index *idx;
    char err[256];
    cr_expect_eq(sf__record_index_from_tail(buf, len, len, "t", &idx, NULL, err, sizeof err),
                 SF_ERR_CORRUPT);
    cr_expect(strstr(err, index_frag) != NULL, "%s", err);
    expect_error(buf, len, SF_ERR_CORRUPT, at, reader_frag);
}

/* Offset of record i, from the index. */
static uint64_t record_offset(const unsigned char *buf, size_t len, uint64_t i, uint64_t *bytes)
{
    struct sf__record_index *idx;
    char err[256];
    cr_assert_eq(sf__record_index_from_tail(buf, len, len, "t", &idx, NULL, err, sizeof err), SF_OK,
                 "%s", err);
    uint64_t off, b;
    cr_assert_eq(sf__record_index_entry(idx, i, &off, &b), SF_OK);
    sf__record_index_destroy(idx);
    if (bytes)
        *bytes = b;
    return off;
}

/* ------------------------------------------------------------ round trips */

Test(record, round_trip_uncompressed_is_byte_identical_and_zero_copy)
{
    struct corpus c;
    size_t len;
    unsigned char *buf = corpus_shard(&c, 60, 20000, 0, 1, 0, &len);
    struct parse_result r;
    parse(buf, len, &r);
    expect_corpus(&r, &c);
    cr_expect_eq(r.owned, 0);
    cr_expect_eq(r.format, SF_SHARD_FORMAT_RECORD);
    cr_expect_eq(r.stats.records, 60);
    cr_expect_eq(r.stats.decompressed_bytes, 0);
    bytes_free(&r.ser);
    for (uint64_t seed = 1; seed <= 6; seed++) {
        parse_with(buf, len, NULL, seed % 2 ? FEED_RANDOM : FEED_RANDOM_LATE, seed, &r);
        expect_corpus(&r, &c);
        bytes_free(&r.ser);
    }
    free(buf);
    corpus_free(&c);
}

Test(record, round_trip_zstd_is_byte_identical)
{
    struct corpus c;
    size_t plain_len, len;
    unsigned char *plain = corpus_shard(&c, 40, 30000, 1, 2, 0, &plain_len);
    unsigned char *buf = write_mem(&c, 3, &len);
    cr_expect(len < plain_len, "zstd shard %zu bytes, plain %zu", len, plain_len);
    struct parse_result r;
    parse(buf, len, &r);
    expect_corpus(&r, &c);
    cr_expect_gt(r.owned, 0, "no record was stored compressed");
    cr_expect_lt(r.owned, 40, "records that do not shrink are stored plain");
    cr_expect_gt(r.stats.decompressed_bytes, 0);
    bytes_free(&r.ser);
    parse_with(buf, len, NULL, FEED_RANDOM_LATE, 5, &r);
    expect_corpus(&r, &c);
    bytes_free(&r.ser);
    free(plain);
    free(buf);
    corpus_free(&c);
}

Test(record, fd_file_and_memory_destinations_write_the_same_bytes)
{
    struct corpus c;
    size_t len;
    unsigned char *mem = corpus_shard(&c, 25, 5000, 1, 3, 1, &len);

    FILE *f = tmpfile();
    cr_assert_not_null(f);
    struct sf__record_writer_options o;
    sf__record_writer_options_init_default(&o);
    o.zstd_level = 1;
    o.file = f;
    size_t n;
    cr_expect_null(write_corpus(&c, &o, &n), "take() is for memory writers only");
    fflush(f);
    cr_assert_eq((size_t)ftell(f), len);
    rewind(f);
    unsigned char *got = malloc(len);
    cr_assert_eq(fread(got, 1, len, f), len);
    cr_expect(memcmp(got, mem, len) == 0, "FILE* output differs");
    fclose(f);

    f = tmpfile();
    cr_assert_not_null(f);
    o.file = NULL;
    o.fd = fileno(f);
    write_corpus(&c, &o, &n);
    cr_assert_eq(lseek(o.fd, 0, SEEK_END), (off_t)len);
    cr_assert_eq(pread(o.fd, got, len, 0), (ssize_t)len);
    cr_expect(memcmp(got, mem, len) == 0, "fd output differs");
    fclose(f);
    free(got);
    free(mem);
    corpus_free(&c);
}

Test(record, empty_shard)
{
    struct corpus c = {0};
    size_t len;
    unsigned char *buf = write_mem(&c, 0, &len);
    cr_expect_eq(len, 16 + 24 + 40);
    struct parse_result r;
    parse(buf, len, &r);
    cr_expect_eq(r.st, SF_OK, "%s", r.err);
    cr_expect_eq(r.samples, 0);
    cr_expect_eq(r.format, SF_SHARD_FORMAT_RECORD);
    bytes_free(&r.ser);
    struct sf__record_index *idx;
    cr_assert_eq(sf__record_index_from_tail(buf, len, len, NULL, &idx, NULL, NULL, 0), SF_OK);
    cr_expect_eq(sf__record_index_count(idx), 0);
    uint64_t a, b;
    cr_expect_eq(sf__record_index_entry(idx, 0, &a, &b), SF_ERR_INVALID_ARGUMENT);
    sf__record_index_destroy(idx);
    free(buf);
}

/* The bytes follow docs/FORMAT.md, checked by hand here. */
Test(record, layout_matches_the_specification)
{
    struct sf__record_field_in f[2] = {{"jpg", "JPEGDATA", 8}, {"cls", "5", 1}};
    struct sf__record_writer *w;
    cr_assert_eq(sf__record_writer_new(NULL, &w, NULL, 0), SF_OK);
    cr_assert_eq(sf__record_writer_add(w, "k1", f, 2), SF_OK);
    cr_assert_eq(sf__record_writer_finish(w), SF_OK);
    size_t len;
    unsigned char *p = sf__record_writer_take(w, &len);
    sf__record_writer_destroy(w);
    cr_assert_not_null(p);
    /* header */
    cr_expect(memcmp(p, "\x89SFR\r\n\x1a\n", 8) == 0);
    cr_expect_eq(get32(p + 8), 1);
    cr_expect_eq(get32(p + 12), 0);
    /* record 0 */
    const unsigned char *r = p + 16;
    size_t body = 8 + 2 * 16 + 2 + 3 + 3 + 8 + 1;
    cr_expect(memcmp(r, "SFRD", 4) == 0);
    cr_expect_eq(get32(r + 4), 0);
    cr_expect_eq(get64(r + 8), 0);
    cr_expect_eq(get64(r + 16), body);
    cr_expect_eq(get64(r + 24), body);
    const unsigned char *bd = r + 40;
    cr_expect_eq(get32(bd), 2);
    cr_expect_eq(get32(bd + 4), 2);
    cr_expect_eq(get32(bd + 8), 3);
    cr_expect_eq(get32(bd + 12), 0);
    cr_expect_eq(get64(bd + 16), 8);
    cr_expect_eq(get32(bd + 24), 3);
    cr_expect_eq(get64(bd + 32), 1);
    cr_expect(memcmp(bd + 40, "k1jpgclsJPEGDATA5", 17) == 0);
    unsigned char tmp[256];
    memcpy(tmp, r, 32);
    memcpy(tmp + 32, bd, body);
    cr_expect_eq(get64(r + 32), XXH3_64bits(tmp, 32 + body));
    /* index and footer */
    size_t ix = 16 + 40 + body;
    cr_assert_eq(len, ix + 24 + 16 + 40);
    cr_expect(memcmp(p + ix, "SFRX", 4) == 0);
    cr_expect_eq(get64(p + ix + 8), 1);
    cr_expect_eq(get64(p + ix + 16), 16);
    cr_expect_eq(get64(p + ix + 24), 40 + body);
    cr_expect_eq(get64(p + ix + 32), XXH3_64bits(p + ix, 32));
    const unsigned char *ft = p + len - 40;
    cr_expect_eq(get64(ft), ix);
    cr_expect_eq(get64(ft + 8), 40);
    cr_expect_eq(get64(ft + 16), 1);
    cr_expect_eq(get64(ft + 24), XXH3_64bits(ft, 24));
    cr_expect(memcmp(ft + 32, "\x89SFE\r\n\x1a\n", 8) == 0);
    free(p);
}

/* ------------------------------------------------------------ random access */

Test(record, random_access_by_index_matches_sequential_reading)
{
    struct corpus c;
    size_t len;
    unsigned char *buf = corpus_shard(&c, 300, 3000, 1, 4, 3, &len);

    /* the tail: too short for the footer, then for the index */
    struct sf__record_index *idx = NULL;
    uint64_t need = 0;
    char err[256];
    cr_expect_eq(
        sf__record_index_from_tail(buf + len - 10, 10, len, "t.sfr", &idx, &need, err, sizeof err),
        SF_ERR_RANGE);
    cr_expect_eq(need, 40);
    cr_expect_null(idx);
    cr_expect_eq(
        sf__record_index_from_tail(buf + len - 40, 40, len, "t.sfr", &idx, &need, err, sizeof err),
        SF_ERR_RANGE, "%s", err);
    cr_expect_eq(need, 24 + 16 * 300 + 40);
    cr_expect(strstr(err, "t.sfr") != NULL, "%s", err);
    cr_assert_eq(sf__record_index_from_tail(buf + len - need, (size_t)need, len, "t.sfr", &idx,
                                            &need, err, sizeof err),
                 SF_OK, "%s", err);
    cr_assert_eq(sf__record_index_count(idx), 300);

    struct sf__record_reader *rr;
    cr_assert_eq(sf__record_reader_new(NULL, "t.sfr", &rr), SF_OK);
    uint64_t seed = 99;
    for (int k = 0; k < 600; k++) {
        uint64_t i = rng_next(&seed) % 300;
        uint64_t off, bytes;
        cr_assert_eq(sf__record_index_entry(idx, i, &off, &bytes), SF_OK);
        /* a copy, as a ranged GET would give */
        unsigned char *rec = malloc(bytes);
        memcpy(rec, buf + off, bytes);
        struct sf_sample s;
        cr_assert_eq(sf__record_reader_decode(rr, rec, bytes, off, i, &s), SF_OK, "%s",
                     sf__record_reader_errmsg(rr));
        cr_expect_eq(s.index, i);
        cr_expect_eq(s.offset, off);
        struct bytes got = {0}, want = {0};
        serialize_sample(&got, &s);
        serialize_tsample(&want, &c.s[i]);
        cr_assert(bytes_eq(&got, &want), "record %llu differs", (unsigned long long)i);
        for (size_t j = 0; j < s.field_count && !s.reader_owned; j++)
            cr_expect((const unsigned char *)s.fields[j].data >= rec + 40 &&
                          (const unsigned char *)s.fields[j].data + s.fields[j].size <= rec + bytes,
                      "field %zu of record %llu is not inside the record", j,
                      (unsigned long long)i);
        bytes_free(&got);
        bytes_free(&want);
        free(rec);
    }
    /* the wrong record for an ordinal is caught by the header */
    uint64_t off2, b2;
    sf__record_index_entry(idx, 2, &off2, &b2);
    struct sf_sample s;
    cr_expect_eq(sf__record_reader_decode(rr, buf + off2, b2, off2, 3, &s), SF_ERR_CORRUPT);
    cr_expect(strstr(sf__record_reader_errmsg(rr), "record 3") != NULL);
    cr_expect_eq(sf__record_reader_decode(rr, buf + off2, b2 - 1, off2, 2, &s), SF_ERR_CORRUPT);
    /* and the reader is still usable */
    cr_expect_eq(sf__record_reader_decode(rr, buf + off2, b2, off2, 2, &s), SF_OK);
    cr_expect_str_eq(sf__record_reader_errmsg(rr), "");
    sf__record_reader_destroy(rr);
    sf__record_index_destroy(idx);
    free(buf);
    corpus_free(&c);
}

/* ------------------------------------------------------------ corruption */

Test(record, corrupted_byte_names_record_and_offset)
{
    for (int level = 0; level <= 3; level += 3) {
        struct corpus c;
        corpus_make(&c, 10, 4000, 1, 5);
        set_single_field(&c.s[3], 4000, 'z'); /* record 3 has data, and compresses */
        size_t len;
        unsigned char *buf = write_mem(&c, level, &len);
        uint64_t bytes;
        uint64_t off = record_offset(buf, len, 3, &bytes);
        buf[off + bytes - 5] ^= 0x10;
        expect_error(buf, len, SF_ERR_CORRUPT, off, "record 3: checksum mismatch");
        struct parse_result r;
        parse(buf, len, &r);
        cr_expect_eq(r.samples, 3, "records before the bad one come out");
        bytes_free(&r.ser);

        struct sf__record_reader *rr;
        cr_assert_eq(sf__record_reader_new(NULL, "t.sfr", &rr), SF_OK);
        struct sf_sample s;
        cr_expect_eq(sf__record_reader_decode(rr, buf + off, bytes, off, 3, &s), SF_ERR_CORRUPT);
        char want[64];
        snprintf(want, sizeof want, "t.sfr: offset %llu: record 3", (unsigned long long)off);
        cr_expect(strstr(sf__record_reader_errmsg(rr), want) != NULL, "%s",
                  sf__record_reader_errmsg(rr));
        sf__record_reader_destroy(rr);

        /* skip_checksums: plain data passes; a compressed frame still must decode */
        struct sf_shard_reader_options o = sfr_options();
        o.skip_checksums = 1;
        parse_with(buf, len, &o, FEED_ALL, 0, &r);
        if (level == 0)
            cr_expect_eq(r.st, SF_OK, "%s", r.err);
        else
            cr_expect(r.st == SF_OK || r.st == SF_ERR_CORRUPT, "%s", r.err);
        bytes_free(&r.ser);
        free(buf);
        corpus_free(&c);
    }
}

Test(record, every_single_byte_flip_is_detected)
{
    struct corpus c;
    corpus_make(&c, 4, 200, 1, 6);
    for (int level = 0; level <= 3; level += 3) {
        size_t len;
        unsigned char *buf = write_mem(&c, level, &len);
        for (size_t i = 0; i < len; i++) {
            for (int bit = 0; bit < 8; bit += 3) {
                buf[i] ^= (unsigned char)(1u << bit);
                struct parse_result r;
                parse_as_record(buf, len, &r);
                cr_assert(r.st == SF_ERR_CORRUPT || r.st == SF_ERR_PARSE || r.st == SF_ERR_LIMIT,
                          "level %d: flip at %zu bit %d gave %d (%s)", level, i, bit, (int)r.st,
                          r.err);
                cr_assert(r.err_offset <= i, "flip at %zu reported at %llu", i, r.err_offset);
                bytes_free(&r.ser);
                buf[i] ^= (unsigned char)(1u << bit);
            }
        }
        free(buf);
    }
    corpus_free(&c);
}

Test(record, truncated_shard_is_an_error_at_every_length)
{
    struct corpus c;
    size_t len;
    unsigned char *buf = corpus_shard(&c, 5, 300, 0, 7, 0, &len);
    for (size_t k = 0; k < len; k++) {
        struct parse_result r;
        parse_as_record(buf, k, &r);
        cr_assert_eq(r.st, SF_ERR_CORRUPT, "k=%zu: %d (%s)", k, (int)r.st, r.err);
        cr_assert(r.err_offset <= k, "k=%zu: offset %llu", k, r.err_offset);
        cr_assert(strstr(r.err, "truncated") != NULL, "k=%zu: %s", k, r.err);
        bytes_free(&r.ser);
        struct sf__record_index *idx = NULL;
        cr_assert_neq(sf__record_index_from_tail(buf, k, k, "t", &idx, NULL, NULL, 0), SF_OK,
                      "k=%zu", k);
        cr_assert_null(idx);
    }
    /* a short file named .sfr is read as a record shard */
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.name = "x.sfr";
    struct parse_result r;
    parse_with(buf, 5, &o, FEED_ALL, 0, &r);
    cr_expect_eq(r.st, SF_ERR_CORRUPT);
    cr_expect_eq(r.format, SF_SHARD_FORMAT_RECORD);
    cr_expect(strstr(r.err, "16-byte record shard header") != NULL, "%s", r.err);
    bytes_free(&r.ser);
    free(buf);
    corpus_free(&c);
}

Test(record, bad_footer_and_index)
{
    struct corpus c;
    size_t len;
    unsigned char *buf = corpus_shard(&c, 6, 500, 0, 8, 0, &len);
    const size_t fat = len - 40;
    const uint64_t io = get64(buf + fat);

    /* footer magic */
    buf[len - 1] ^= 1;
    expect_bad_tail(buf, len, "footer magic", fat, "footer magic");
    buf[len - 1] ^= 1;

    /* footer checksum */
    buf[fat + 2] ^= 1;
    expect_bad_tail(buf, len, "footer checksum", fat, "footer checksum");
    buf[fat + 2] ^= 1;

    /* a footer with a valid checksum pointing elsewhere */
    put64(buf + fat, io - 16);
    put64(buf + fat + 24, XXH3_64bits(buf + fat, 24));
    expect_bad_tail(buf, len, "does not end at the footer", fat, "footer points");
    put64(buf + fat, io);
    put64(buf + fat + 24, XXH3_64bits(buf + fat, 24));

    /* index checksum */
    buf[io + 20] ^= 1;
    expect_bad_tail(buf, len, "index block checksum", io, "index block checksum");
    buf[io + 20] ^= 1;

    /* index entries swapped, checksum recomputed */
    unsigned char e[16];
    memcpy(e, buf + io + 16, 16);
    memcpy(buf + io + 16, buf + io + 32, 16);
    memcpy(buf + io + 32, e, 16);
    size_t ib = 24 + 16 * 6;
    put64(buf + io + ib - 8, XXH3_64bits(buf + io, ib - 8));
    expect_bad_tail(buf, len, "index entry 1", io + 16, "index entry 0");
    free(buf);

    /* data after the footer */
    buf = write_mem(&c, 0, &len);
    buf = realloc(buf, len + 3);
    memcpy(buf + len, "xyz", 3);
    expect_error(buf, len + 3, SF_ERR_CORRUPT, len, "after the record shard footer");
    struct parse_result r;
    parse_with(buf, len + 3, NULL, FEED_RANDOM_LATE, 3, &r);
    cr_expect_eq(r.st, SF_ERR_CORRUPT, "%s", r.err);
    cr_expect_eq(r.samples, 6);
    bytes_free(&r.ser);

    /* bad magic (format forced) and version */
    buf[1] = 'X';
    parse_as_record(buf, len, &r);
    cr_expect_eq(r.st, SF_ERR_PARSE);
    cr_expect_eq(r.err_offset, 0);
    bytes_free(&r.ser);
    buf[1] = 'S';
    buf[8] = 2;
    expect_error(buf, len, SF_ERR_PARSE, 8, "version 2");
    free(buf);
    corpus_free(&c);
}

/* ------------------------------------------------------------ limits */

Test(record, reader_limits)
{
    struct corpus c;
    corpus_make(&c, 3, 10, 0, 9);
    set_single_field(&c.s[1], 70000, 'a');
    size_t len;
    unsigned char *buf = write_mem(&c, 3, &len);
    uint64_t off = record_offset(buf, len, 1, NULL);

    struct sf_shard_reader_options o = sfr_options();
    o.max_record_bytes = 60000;
    expect_limit(buf, len, &o, off, "record 1");
    o = sfr_options();
    o.zstd_window_log_max = 10;
    expect_limit(buf, len, &o, off, "window");
    free(buf);

    /* too many fields */
    struct sf__record_field_in f[5] = {
        {"a", "1", 1}, {"b", "2", 1}, {"c", "3", 1}, {"d", "4", 1}, {"e", "5", 1}};
    struct sf__record_writer *w;
    cr_assert_eq(sf__record_writer_new(NULL, &w, NULL, 0), SF_OK);
    cr_assert_eq(sf__record_writer_add(w, "k", f, 5), SF_OK);
    cr_assert_eq(sf__record_writer_finish(w), SF_OK);
    buf = sf__record_writer_take(w, &len);
    sf__record_writer_destroy(w);
    o = sfr_options();
    o.max_fields = 4;
    expect_limit(buf, len, &o, 16, NULL);
    free(buf);
    corpus_free(&c);
}

Test(record, writer_rejects_bad_input)
{
    struct sf__record_writer *w;
    char err[256];
    struct sf__record_writer_options o;
    sf__record_writer_options_init_default(&o);
    o.zstd_level = 99;
    cr_expect_eq(sf__record_writer_new(&o, &w, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(w);

    struct sf__record_field_in ok[1] = {{"jpg", "x", 1}};
    struct sf__record_field_in dup[2] = {{"jpg", "x", 1}, {"jpg", "y", 1}};
    struct sf__record_field_in nodata[1] = {{"jpg", NULL, 5}};
    struct sf__record_field_in noname[1] = {{"", "x", 1}};
#define EXPECT_ADD_FAILS(key, fields, n, want, frag)                                               \
    do {                                                                                           \
        cr_assert_eq(sf__record_writer_new(NULL, &w, NULL, 0), SF_OK);                             \
        cr_expect_eq(sf__record_writer_add(w, key, fields, n), want);                              \
        cr_expect(strstr(sf__record_writer_errmsg(w), frag) != NULL, "%s",                         \
                  sf__record_writer_errmsg(w));                                                    \
        cr_expect_eq(sf__record_writer_finish(w), want, "errors are sticky");                      \
        sf__record_writer_destroy(w);                                                              \
    } while (0)
    EXPECT_ADD_FAILS("", ok, 1, SF_ERR_INVALID_ARGUMENT, "key");
    EXPECT_ADD_FAILS(NULL, ok, 1, SF_ERR_INVALID_ARGUMENT, "key");
    EXPECT_ADD_FAILS("k", dup, 2, SF_ERR_INVALID_ARGUMENT, "share a name");
    EXPECT_ADD_FAILS("k", nodata, 1, SF_ERR_INVALID_ARGUMENT, "no data");
    EXPECT_ADD_FAILS("k", noname, 1, SF_ERR_INVALID_ARGUMENT, "name");

    /* duplicate among many fields (the sorted check) */
    struct sf__record_field_in many[40];
    char names[40][8];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof names[i], "f%d", i == 39 ? 7 : i);
        many[i] = (struct sf__record_field_in){names[i], "x", 1};
    }
    EXPECT_ADD_FAILS("k", many, 40, SF_ERR_INVALID_ARGUMENT, "share a name");
    snprintf(names[39], sizeof names[39], "f39");
    cr_assert_eq(sf__record_writer_new(NULL, &w, NULL, 0), SF_OK);
    cr_expect_eq(sf__record_writer_add(w, "k", many, 40), SF_OK);
    /* take() before finish gives nothing */
    size_t n = 7;
    cr_expect_null(sf__record_writer_take(w, &n));
    cr_expect_eq(n, 0);
    cr_expect_eq(sf__record_writer_finish(w), SF_OK);
    cr_expect_eq(sf__record_writer_add(w, "k2", ok, 1), SF_ERR_INVALID_ARGUMENT);
    sf__record_writer_destroy(w);

    /* caps */
    sf__record_writer_options_init_default(&o);
    o.max_record_bytes = 100;
    unsigned char big[200] = {0};
    struct sf__record_field_in bf[1] = {{"bin", big, sizeof big}};
    cr_assert_eq(sf__record_writer_new(&o, &w, NULL, 0), SF_OK);
    cr_expect_eq(sf__record_writer_add(w, "k", bf, 1), SF_ERR_LIMIT);
    sf__record_writer_destroy(w);
    sf__record_writer_options_init_default(&o);
    o.max_memory_bytes = 150;
    cr_assert_eq(sf__record_writer_new(&o, &w, NULL, 0), SF_OK);
    cr_expect_eq(sf__record_writer_add(w, "k", bf, 1), SF_ERR_LIMIT);
    cr_expect(strstr(sf__record_writer_errmsg(w), "max_memory_bytes") != NULL);
    sf__record_writer_destroy(w);
    sf__record_writer_destroy(NULL);

    /* a write error */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    close(fds[0]);
    sf__record_writer_options_init_default(&o);
    o.fd = fds[1];
    signal(SIGPIPE, SIG_IGN);
    cr_expect_eq(sf__record_writer_new(&o, &w, err, sizeof err), SF_ERR_IO);
    cr_expect(strstr(err, "write") != NULL, "%s", err);
    close(fds[1]);
}
