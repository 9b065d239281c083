/* Test support for the shard suites (tar, record): a deterministic
 * generator, a growable byte string, and samples serialized into one so
 * that comparing strings compares keys, field names, order and bytes. */
#ifndef SF_TEST_BYTES_H
#define SF_TEST_BYTES_H

#include "shardfeed_shard.h"

#include <stddef.h>
#include <stdint.h>

/* xorshift64*: deterministic test data and chunk sizes (*s 0 is seeded). */
uint64_t rng_next(uint64_t *s);

struct bytes {
    unsigned char *p;
    size_t len, cap;
};

/* Appends (failing the test when out of memory). */
void bytes_put(struct bytes *b, const void *d, size_t n);
void bytes_put_u64(struct bytes *b, uint64_t v);
void bytes_free(struct bytes *b);
int bytes_eq(const struct bytes *a, const struct bytes *b);
/* The sample: key, then per field its name and bytes, each after its
 * length. */
void serialize_sample(struct bytes *out, const struct sf_sample *s);

#endif
