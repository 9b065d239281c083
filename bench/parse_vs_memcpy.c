/*
 * bench_parse: shard parse throughput against memcpy of the same bytes.
 *
 * Builds, in memory, a tar shard and a record shard of the same samples
 * (about --mib MiB each, samples of a ~--member-kib KiB "jpg" and a small
 * "cls", as an ImageNet-like WebDataset shard), then times in the same run:
 *   - memcpy of the shard into another buffer (the cost of one copy),
 *   - iterating every sample with sf_shard_reader and touching each field's
 *     pointer and length (first and last byte, size), as the loader does:
 *     tar (headers only), record (XXH3 checksum of every record verified),
 *     and both again fed in 8 MiB steps as the fetch engine reports them.
 * Each figure is the best of --rounds rounds. Prints the ratios
 * parse / memcpy (throughput; target >= 0.8).
 *
 * Usage: bench_parse [--mib N] [--rounds R] [--member-kib K]
 */
#include "shardfeed.h"
#include "shardfeed_shard.h"
#include "src/record.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_parse: %s\n", what);
    exit(1);
}

/* ------------------------------------------------------------ shards */

struct sample {
    size_t jpg_off, jpg_len; /* into the payload pool */
    char cls[4];
};

static void tar_header(unsigned char *h, const char *name, size_t size)
{
    memset(h, 0, 512);
    snprintf((char *)h, 100, "%s", name);
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    memcpy(h + 136, "00000000000", 12);
    h[156] = '0';
    memcpy(h + 257,
           "ustar\0"
           "00",
           8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
}

static size_t pad512(size_t n)
{
    return (n + 511) & ~(size_t)511;
}

static unsigned char *build_tar(const struct sample *s, size_t n, const unsigned char *pool,
                                size_t *len)
{
    size_t total = 1024;
    for (size_t i = 0; i < n; i++)
        total += 512 + pad512(s[i].jpg_len) + 512 + 512;
    unsigned char *t = calloc(1, total);
    if (!t)
        die("out of memory");
    size_t at = 0;
    char name[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "train/%08zu.jpg", i);
        tar_header(t + at, name, s[i].jpg_len);
        memcpy(t + at + 512, pool + s[i].jpg_off, s[i].jpg_len);
        at += 512 + pad512(s[i].jpg_len);
        snprintf(name, sizeof name, "train/%08zu.cls", i);
        size_t cl = strlen(s[i].cls);
        tar_header(t + at, name, cl);
        memcpy(t + at + 512, s[i].cls, cl);
        at += 1024;
    }
    *len = total; /* the two zero blocks are already there (calloc) */
    return t;
}

static unsigned char *build_record(const struct sample *s, size_t n, const unsigned char *pool,
                                   size_t *len)
{
    struct sf__record_writer_options o;
    sf__record_writer_options_init_default(&o);
    o.max_memory_bytes = (size_t)16 << 30;
    struct sf__record_writer *w;
    char err[256];
    if (sf__record_writer_new(&o, &w, err, sizeof err) != SF_OK)
        die(err);
    char key[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "train/%08zu", i);
        struct sf__record_field_in f[2] = {{"jpg", pool + s[i].jpg_off, s[i].jpg_len},
                                           {"cls", s[i].cls, strlen(s[i].cls)}};
        if (sf__record_writer_add(w, key, f, 2) != SF_OK)
            die(sf__record_writer_errmsg(w));
    }
    if (sf__record_writer_finish(w) != SF_OK)
        die(sf__record_writer_errmsg(w));
    unsigned char *p = sf__record_writer_take(w, len);
    sf__record_writer_destroy(w);
    if (!p)
        die("record writer gave nothing");
    return p;
}

/* ------------------------------------------------------------ timing */

static volatile uint64_t g_sink;

/* Parses the whole shard, fed at once (step 0) or step bytes at a time;
 * returns seconds, and the sample count in *samples. */
static double parse_once(const unsigned char *buf, size_t len, size_t step, size_t *samples)
{
    double t0 = now_s();
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.name = "bench";
    struct sf_shard_reader *r;
    if (sf_shard_reader_new(&o, &r, NULL, 0) != SF_OK)
        die("reader");
    size_t fed = step ? 0 : len;
    if (!step && sf_shard_reader_feed(r, buf, len, len) != SF_OK)
        die("feed");
    uint64_t sink = 0;
    size_t n = 0;
    for (;;) {
        struct sf_sample s;
        enum sf_shard_event ev;
        if (sf_shard_reader_next(r, &s, &ev) != SF_OK)
            die(sf_shard_reader_errmsg(r));
        if (ev == SF_SHARD_END)
            break;
        if (ev == SF_SHARD_NEED_MORE) {
            if (fed == len)
                die("reader wants more than the shard");
            fed = fed + step > len ? len : fed + step;
            if (sf_shard_reader_feed(r, buf, fed, len) != SF_OK)
                die("feed");
            continue;
        }
        n++;
        sink += s.key_len;
        for (size_t i = 0; i < s.field_count; i++) {
            const unsigned char *d = s.fields[i].data;
            size_t sz = s.fields[i].size;
            sink += sz + (sz ? (uint64_t)d[0] + d[sz - 1] : 0);
        }
    }
    sf_shard_reader_destroy(r);
    double t = now_s() - t0;
    g_sink += sink;
    *samples = n;
    return t;
}

static double best_parse(const unsigned char *buf, size_t len, size_t step, int rounds,
                         size_t *samples)
{
    double best = 1e30;
    for (int i = 0; i < rounds; i++) {
        double t = parse_once(buf, len, step, samples);
        if (t < best)
            best = t;
    }
    return best;
}

static double best_memcpy(unsigned char *dst, const unsigned char *src, size_t len, int rounds)
{
    double best = 1e30;
    for (int i = 0; i < rounds; i++) {
        double t0 = now_s();
        memcpy(dst, src, len);
        double t = now_s() - t0;
        g_sink += dst[len / 2] + dst[len - 1];
        if (t < best)
            best = t;
    }
    return best;
}

static void report(const char *what, size_t len, size_t samples, double t, double t_memcpy)
{
    printf("%-34s %8.2f GB/s  %8zu samples  ratio vs memcpy %6.2fx\n", what, (double)len / t / 1e9,
           samples, t_memcpy / t);
}

int main(int argc, char **argv)
{
    size_t mib = 256, member_kib = 110;
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            mib = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--member-kib") == 0 && i + 1 < argc)
            member_kib = strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_parse [--mib N] [--rounds R] [--member-kib K]\n");
            return 2;
        }
    }
    if (mib == 0 || member_kib == 0 || rounds < 1)
        die("sizes and rounds must be positive");

    /* Payloads: one pool of random bytes (JPEG-like, incompressible); each
     * sample takes a slice of 90%..110% of member_kib. */
    size_t target = mib << 20, mean = member_kib << 10;
    size_t n = target / (mean + 1024);
    size_t pool_len = mean * 2;
    unsigned char *pool = malloc(pool_len);
    struct sample *s = calloc(n ? n : 1, sizeof *s);
    if (!pool || !s)
        die("out of memory");
    uint64_t seed = 0x5eed;
    for (size_t i = 0; i < pool_len; i++)
        pool[i] = (unsigned char)(rng(&seed) >> 56);
    for (size_t i = 0; i < n; i++) {
        s[i].jpg_len = mean - mean / 10 + (size_t)(rng(&seed) % (mean / 5 + 1));
        s[i].jpg_off = (size_t)(rng(&seed) % (pool_len - s[i].jpg_len));
        snprintf(s[i].cls, sizeof s[i].cls, "%u", (unsigned)(rng(&seed) % 1000));
    }
    size_t tar_len, rec_len;
    unsigned char *tar = build_tar(s, n, pool, &tar_len);
    unsigned char *rec = build_record(s, n, pool, &rec_len);
    size_t max_len = tar_len > rec_len ? tar_len : rec_len;
    unsigned char *dst = malloc(max_len);
    if (!dst)
        die("out of memory");
    memset(dst, 1, max_len); /* fault the pages in before timing */

    printf("shardfeed bench_parse: %zu samples of ~%zu KiB, tar %.1f MiB, record %.1f MiB, "
           "best of %d rounds\n",
           n, member_kib, (double)tar_len / (1 << 20), (double)rec_len / (1 << 20), rounds);

    size_t got;
    const size_t step = (size_t)8 << 20;
    double m_tar = best_memcpy(dst, tar, tar_len, rounds);
    double p_tar = best_parse(tar, tar_len, 0, rounds, &got);
    if (got != n)
        die("tar: wrong sample count");
    double p_tar_s = best_parse(tar, tar_len, step, rounds, &got);
    double m_rec = best_memcpy(dst, rec, rec_len, rounds);
    double p_rec = best_parse(rec, rec_len, 0, rounds, &got);
    if (got != n)
        die("record: wrong sample count");
    double p_rec_s = best_parse(rec, rec_len, step, rounds, &got);

    printf("%-34s %8.2f GB/s\n", "memcpy (tar bytes)", (double)tar_len / m_tar / 1e9);
    report("tar parse, fed at once", tar_len, n, p_tar, m_tar);
    report("tar parse, fed in 8 MiB steps", tar_len, n, p_tar_s, m_tar);
    printf("%-34s %8.2f GB/s\n", "memcpy (record bytes)", (double)rec_len / m_rec / 1e9);
    report("record parse (checksums), at once", rec_len, n, p_rec, m_rec);
    report("record parse, 8 MiB steps", rec_len, n, p_rec_s, m_rec);
    double worst = m_tar / p_tar;
    double r2 = m_rec / p_rec;
    if (r2 < worst)
        worst = r2;
    printf("minimum ratio %.2fx (target >= 0.80x): %s\n", worst, worst >= 0.8 ? "met" : "NOT met");
    free(dst);
    free(tar);
    free(rec);
    free(pool);
    free(s);
    return g_sink == 42 ? 3 : 0; /* keeps the sink alive */
}
