/* What the libFuzzer harnesses of tests/fuzz share (docs/testing.md).
 *
 * Every harness defines LLVMFuzzerTestOneInput(). The same file is built two
 * ways: with clang and -fsanitize=fuzzer (SF_FUZZ=ON, scripts/fuzz.sh), and
 * with the normal compiler beside replay.c, which feeds it the files of
 * tests/fuzz/regressions/<harness>/ and corpus/<harness>/ in ctest. A broken
 * invariant calls fz_fail(): abort(), which both builds report as a crash. */
#ifndef SF_TESTS_FUZZ_H
#define SF_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define fz_fail(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "fuzz invariant broken at %s:%d: ", __FILE__, __LINE__);                   \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        abort();                                                                                   \
    } while (0)

#define fz_check(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fz_fail(__VA_ARGS__);                                                                  \
    } while (0)

/* Input consumed from the front. */
struct fz {
    const uint8_t *p;
    size_t n;
};

static inline uint8_t fz_u8(struct fz *f)
{
    if (!f->n)
        return 0;
    f->n--;
    return *f->p++;
}

static inline uint64_t fz_u64(struct fz *f)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | fz_u8(f);
    return v;
}

/* The bytes up to the next NUL (or the end) as a malloc'd C string; the NUL
 * is consumed. Never NULL (aborts when out of memory). */
static inline char *fz_str(struct fz *f, size_t *len_out)
{
    const uint8_t *z = f->n ? memchr(f->p, 0, f->n) : NULL;
    size_t len = z ? (size_t)(z - f->p) : f->n;
    char *s = malloc(len + 1);
    fz_check(s != NULL, "out of memory");
    if (len)
        memcpy(s, f->p, len);
    s[len] = '\0';
    f->p += len;
    f->n -= len;
    if (z) {
        f->p++;
        f->n--;
    }
    if (len_out)
        *len_out = len;
    return s;
}

/* An exact-size heap copy (ASan sees a read one byte past it); NUL-terminated
 * one byte further when nul is 1. */
static inline unsigned char *fz_copy(const void *d, size_t n, int nul)
{
    size_t sz = n + (size_t)nul;
    unsigned char *c = malloc(sz ? sz : 1);
    fz_check(c != NULL, "out of memory");
    if (n)
        memcpy(c, d, n);
    if (nul)
        c[n] = 0;
    return c;
}

static inline uint64_t fz_rng(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

#endif
