/*
 * Internals of the epoch sampler (src/sampler.c) shared with the loader and
 * the tests: the PRNG and hashing primitives, defined bit for bit in
 * docs/sampling.md so other implementations reproduce the same order.
 */
#ifndef SF_SRC_SAMPLER_H
#define SF_SRC_SAMPLER_H

#include "shardfeed_sampling.h"

#include <stddef.h>
#include <stdint.h>

/* splitmix64's increment (2^64 / golden ratio, odd). */
#define SF__GAMMA 0x9E3779B97F4A7C15ULL

/* Domain tags: 8 ASCII bytes read as a little-endian uint64. */
#define SF__TAG_SHARDS 0x64726168732f6673ULL /* "sf/shard": shard permutation */
#define SF__TAG_BUFFER 0x72666675622f6673ULL /* "sf/buffr": shuffle buffer picks */
#define SF__TAG_COUNTS 0x746e756f632f6673ULL /* "sf/count": counts fingerprint */
#define SF__TAG_STATE  0x65746174732f6673ULL /* "sf/state": state checksum */

/* splitmix64's output function (a bijection of uint64). */
uint64_t sf__fmix64(uint64_t z);

/* Mixes one word into a running hash: fmix64((h + GAMMA) ^ w). */
uint64_t sf__absorb64(uint64_t h, uint64_t w);

/* A splitmix64 generator. Plain value; copy it to fork a stream. */
struct sf__rng {
    uint64_t state;
};

/* state += GAMMA; returns fmix64(state). */
uint64_t sf__rng_next(struct sf__rng *r);

/* Uniform in [0, n), n >= 1, by rejection: draws until a value r with
 * r >= 2^64 mod n, returns r mod n. n == 0 returns 0 without drawing. */
uint64_t sf__rng_below(struct sf__rng *r, uint64_t n);

/* Fills perm[0..n) with the epoch's shard order: the identity shuffled by
 * Fisher-Yates (i from n-1 down to 1, swap i with below(i + 1)) with a
 * generator seeded absorb(absorb(TAG_SHARDS, seed), epoch). */
void sf__shard_order(uint64_t seed, uint64_t epoch, size_t *perm, size_t n);

/* The configuration fingerprint of a counts array:
 * h = absorb(TAG_COUNTS, n), then h = absorb(h, counts[i]) for each i. */
uint64_t sf__counts_hash(const uint64_t *counts, size_t n);

/* The shuffle buffer of s: read indices [0, *read) have entered it, and
 * buf[0..*buf_len) of them are still in it (not delivered). For a loader
 * resuming an epoch on estimated counts: read index k < *read was delivered
 * before the restore point unless it is in buf. */
void sf__sampler_window(const struct sf_sampler *s, uint64_t *read, const uint64_t **buf,
                        uint64_t *buf_len);

/* The checks sf_sampler_new() makes of o alone (worker, buffer limit,
 * initial fill, policy, partition), without the counts or the environment. */
sf_status sf__sampler_options_check(const struct sf_sampler_options *o, char *err, size_t err_len);

/* The sample count s was created with for shard `shard` (< its shard
 * count): the loader tells a plan range that ends at its shard's end. */
uint64_t sf__sampler_shard_count(const struct sf_sampler *s, size_t shard);

/* As sf_sampler_state_restore(), but an open-ended stream (its length
 * learned by reading) refuses, SF_ERR_INVALID_ARGUMENT, a saved position
 * or stream length above max_samples: the most samples its shards can
 * hold, the only bound on such a stream; bound_why (NULL: none) ends the
 * message, after "the N samples ". Else the same checks and effect. */
sf_status sf__sampler_state_restore_within(struct sf_sampler *s, const void *state,
                                           size_t state_len, uint64_t max_samples,
                                           const char *bound_why);

#endif
