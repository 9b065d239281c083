/* The sampler suite's fixture, shared by tests/test_sampler*.c (one
 * executable): options from the fields a test sets, a sampler made or
 * failing the test, its epoch drained, and the shard counts tests use. */
#ifndef SF_TEST_SAMPLER_FIXTURE_H
#define SF_TEST_SAMPLER_FIXTURE_H

#include "shardfeed_sampling.h"

#include <stddef.h>
#include <stdint.h>

struct run {
    struct sf_sample_ref *items;
    size_t n;
};

/* The options that differ from the defaults (0: the default; world and
 * workers 0 mean 1). */
struct cfg {
    int rank, world;
    unsigned worker, workers;
    uint64_t seed, epoch, buffer, fill;
    int estimated;
    enum sf_epoch_policy policy;
    enum sf_partition partition;
};

struct sf_sampler_options opts(struct cfg c);

/* Unsets RANK, WORLD_SIZE and LOCAL_RANK. */
void clear_dist_env(void);
/* sf_sampler_new, which must succeed. */
struct sf_sampler *make(const struct sf_sampler_options *o, const uint64_t *counts, size_t n);
/* Delivers the rest of the epoch of s (free items). */
struct run drain(struct sf_sampler *s);
/* A whole epoch of a fresh sampler. */
struct run run_of(const struct sf_sampler_options *o, const uint64_t *counts, size_t n);
int same_item(const struct sf_sample_ref *a, const struct sf_sample_ref *b);
/* A digest of the run's shards, samples and flags. */
uint64_t hash_run(const struct run *r);

/* Uneven shards: 1..13 samples, one empty shard. */
#define N_UNEVEN 41
void uneven_counts(uint64_t *c);
/* n shards of v samples each. */
void same_counts(uint64_t *c, size_t n, uint64_t v);

#endif
