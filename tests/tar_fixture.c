/* The tar suite's fixture (tar_fixture.h). */
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

/* ------------------------------------------------------------ helpers */

void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rng_next(&seed) >> 56);
}

char *long_name(size_t len, char fill, const char *suffix)
{
    size_t n = strlen(suffix);
    cr_assert(n <= len);
    char *s = malloc(len + 1);
    cr_assert_not_null(s);
    memset(s, fill, len - n);
    memcpy(s + len - n, suffix, n + 1);
    return s;
}

const struct feed_style tar_style = {"test.tar", 1500, 4};

void parse_with(const unsigned char *buf, size_t len, const struct sf_shard_reader_options *o,
                enum feed_mode mode, uint64_t seed, size_t max_step, struct parse_result *res)
{
    parse_shard(&tar_style, buf, len, o, mode, seed, max_step, res);
}

void parse(const unsigned char *buf, size_t len, struct parse_result *res)
{
    parse_with(buf, len, NULL, FEED_ALL, 0, 0, res);
}

/* ------------------------------------------------------------ tar builder */

void tb_checksum(unsigned char *h)
{
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < BLK; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
}

size_t tb_header(struct bytes *b, const char *name, char type, uint64_t size, enum tb_magic m)
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

void tb_data(struct bytes *b, const void *d, size_t n)
{
    bytes_put(b, d, n);
    static const unsigned char zero[BLK];
    if (n % BLK)
        bytes_put(b, zero, BLK - n % BLK);
}

size_t tb_file(struct bytes *b, const char *name, const void *d, size_t n)
{
    size_t at = tb_header(b, name, '0', n, TB_POSIX);
    tb_data(b, d, n);
    return at;
}

size_t tb_meta(struct bytes *b, char type, const void *d, size_t n)
{
    size_t at = tb_header(b, type == 'L' || type == 'K' ? "././@LongLink" : "PaxHeader", type, n,
                          type == 'L' || type == 'K' ? TB_GNU : TB_POSIX);
    tb_data(b, d, n);
    return at;
}

void tb_end(struct bytes *b)
{
    static const unsigned char zero[2 * BLK];
    bytes_put(b, zero, sizeof zero);
}

void tb_end_and_parse(struct bytes *b, struct parse_result *res)
{
    tb_end(b);
    parse(b->p, b->len, res);
}

void pax_rec(struct bytes *b, const char *kw, const char *val, size_t val_len)
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

size_t tb_pax(struct bytes *b, const char *kw, const char *val, size_t val_len)
{
    struct bytes x = {0};
    pax_rec(&x, kw, val, val_len);
    size_t at = tb_meta(b, 'x', x.p, x.len);
    bytes_free(&x);
    return at;
}

/* ------------------------------------------------------------ expected samples */

void serialize_want(struct bytes *out, const struct want_sample *w, size_t n)
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

void expect_samples(const struct parse_result *r, const struct want_sample *w, size_t n)
{
    struct bytes want = {0};
    serialize_want(&want, w, n);
    cr_expect_eq(r->st, SF_OK, "parse failed: %s", r->err);
    cr_expect_eq(r->samples, n, "%zu samples, want %zu", r->samples, n);
    cr_expect(bytes_eq(&r->ser, &want), "samples differ from what was written");
    bytes_free(&want);
}

/* ------------------------------------------------------------ random increments */

void expect_same_in_all_feed_modes(const unsigned char *buf, size_t len)
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
