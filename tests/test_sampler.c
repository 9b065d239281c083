/*
 * Epoch order (src/sampler.c, docs/sampling.md): partition, equalisation,
 * determinism, shuffle buffer bounds, resume exactness, environment.
 * Criterion runs every test in its own process, so setenv here is local.
 *
 * Suite `sampler`, one executable: this file (PRNG and the reference,
 * partition, determinism, shuffle buffer), test_sampler_state.c (state,
 * environment) and test_sampler_estimated.c (estimated counts), over
 * sampler_fixture.c.
 */
#include "sampler_fixture.h"

#include <criterion/criterion.h>

#include "shardfeed_sampling.h"
#include "src/sampler.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Flat index of (shard, sample) given the counts' prefix sums. */
static uint64_t *prefix_of(const uint64_t *counts, size_t n)
{
    uint64_t *p = calloc(n + 1, sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++)
        p[i + 1] = p[i] + counts[i];
    return p;
}

/* ------------------------------------------------------------------ PRNG and spec */

Test(sampler, prng_is_splitmix64_with_published_outputs)
{
    /* The reference splitmix64 (Vigna) seeded with 0. */
    struct sf__rng r = {0};
    cr_expect_eq(sf__rng_next(&r), 0xe220a8397b1dcdafULL);
    cr_expect_eq(sf__rng_next(&r), 0x6e789e6aa1b965f4ULL);
    cr_expect_eq(sf__rng_next(&r), 0x06c45d188009454fULL);
}

Test(sampler, below_stays_in_range_and_reaches_every_value)
{
    struct sf__rng r = {99};
    int seen[7] = {0};
    for (int i = 0; i < 700; i++) {
        uint64_t v = sf__rng_below(&r, 7);
        cr_assert_lt(v, 7);
        seen[v]++;
    }
    for (int v = 0; v < 7; v++)
        cr_expect_gt(seen[v], 50, "value %d drawn %d times of 700", v, seen[v]);
    for (int i = 0; i < 100; i++)
        cr_expect_eq(sf__rng_below(&r, 1), 0);
    /* For n = 2^63 + 1 draws below 2^64 mod n = 2^63 - 1 are rejected: from
     * state 99 the first two draws (0x42f3..., 0x081a...) are, the third
     * gives 0xd5b2d034f041d2fb - n. Values from the Python reference. */
    static const uint64_t want[] = {0x55b2d034f041d2faULL, 0x2bbfa9247d3df542ULL,
                                    0x3a3cecbc70ee19c2ULL, 0x05c95dc6d74de83dULL,
                                    0x0d5bf86280de1313ULL, 0x092ea4feaa603f52ULL};
    struct sf__rng big = {99};
    for (int i = 0; i < 6; i++)
        cr_expect_eq(sf__rng_below(&big, (1ULL << 63) + 1), want[i], "draw %d", i);
    static const uint64_t want7[] = {2, 3, 0, 5, 3, 1, 5, 6, 4, 6};
    struct sf__rng small = {99};
    for (int i = 0; i < 10; i++)
        cr_expect_eq(sf__rng_below(&small, 7), want7[i], "draw %d", i);
}

Test(sampler, shard_order_matches_reference_and_changes_per_epoch)
{
    /* From the Python reference in docs/sampling.md. */
    static const size_t want0[10] = {4, 3, 5, 1, 2, 0, 8, 9, 7, 6};
    static const size_t want1[10] = {8, 6, 5, 2, 7, 9, 4, 3, 1, 0};
    size_t perm[10];
    sf__shard_order(42, 0, perm, 10);
    for (int i = 0; i < 10; i++)
        cr_expect_eq(perm[i], want0[i], "epoch 0 [%d]", i);
    sf__shard_order(42, 1, perm, 10);
    for (int i = 0; i < 10; i++)
        cr_expect_eq(perm[i], want1[i], "epoch 1 [%d]", i);
}

struct golden_item {
    uint64_t shard, sample, read_index;
    unsigned pad;
};

static void expect_golden(const struct sf_sampler_options *o, const uint64_t *counts, size_t n,
                          const struct golden_item *want, size_t want_n)
{
    struct run r = run_of(o, counts, n);
    cr_assert_eq(r.n, want_n, "%zu items, the reference has %zu", r.n, want_n);
    for (size_t i = 0; i < r.n; i++) {
        cr_expect(r.items[i].shard == want[i].shard && r.items[i].sample == want[i].sample &&
                      r.items[i].read_index == want[i].read_index &&
                      (r.items[i].flags == SF_SAMPLE_PAD) == (want[i].pad == 1) &&
                      r.items[i].position == i,
                  "item %zu: (%llu, %llu, read %llu, flags %u), reference (%llu, %llu, read %llu, "
                  "pad %u)",
                  i, (unsigned long long)r.items[i].shard, (unsigned long long)r.items[i].sample,
                  (unsigned long long)r.items[i].read_index, r.items[i].flags,
                  (unsigned long long)want[i].shard, (unsigned long long)want[i].sample,
                  (unsigned long long)want[i].read_index, want[i].pad);
    }
    free(r.items);
}

Test(sampler, orders_match_the_documented_reference_implementation)
{
    /* Each expected list was produced by the Python code in docs/sampling.md. */
    static const uint64_t c1[] = {3, 1, 4, 1, 5, 9, 2, 6};
    struct sf_sampler_options o =
        opts((struct cfg){.rank = 1, .world = 3, .seed = 7, .epoch = 1, .buffer = 4});
    static const struct golden_item g1[] = {{2, 2, 2, 0}, {2, 1, 1, 0},  {1, 0, 4, 0}, {2, 0, 0, 0},
                                            {7, 1, 6, 0}, {7, 3, 8, 0},  {7, 0, 5, 0}, {2, 3, 3, 0},
                                            {7, 4, 9, 0}, {7, 5, 10, 0}, {7, 2, 7, 0}};
    expect_golden(&o, c1, 8, g1, sizeof g1 / sizeof g1[0]);

    o.rank = 2;
    o.policy = SF_EPOCH_DROP;
    static const struct golden_item g2[] = {{0, 0, 0, 0}, {0, 1, 1, 0}, {6, 0, 3, 0}, {6, 1, 4, 0},
                                            {0, 2, 2, 0}, {4, 2, 7, 0}, {4, 0, 5, 0}, {4, 4, 9, 0},
                                            {4, 1, 6, 0}, {4, 3, 8, 0}};
    expect_golden(&o, c1, 8, g2, sizeof g2 / sizeof g2[0]);

    static const uint64_t c3[] = {5, 0, 4};
    o = opts((struct cfg){.rank = 3,
                          .world = 4,
                          .worker = 1,
                          .workers = 2,
                          .seed = 123456789012345ULL,
                          .epoch = 3,
                          .buffer = 3,
                          .fill = 1,
                          .partition = SF_PARTITION_SAMPLES});
    static const struct golden_item g3[] = {{0, 4, 0, 0}, {0, 4, 1, 1}};
    expect_golden(&o, c3, 3, g3, 2);

    /* A stream with 2 real samples padded to 11: pads cycle over its reads. */
    static const uint64_t c4[] = {10, 1, 1, 1};
    o = opts((struct cfg){.rank = 1, .world = 2, .seed = 1, .buffer = 5, .fill = 2});
    static const struct golden_item g4[] = {{3, 0, 1, 0}, {3, 0, 2, 1},  {1, 0, 3, 1}, {3, 0, 6, 1},
                                            {1, 0, 7, 1}, {1, 0, 0, 0},  {1, 0, 5, 1}, {3, 0, 4, 1},
                                            {1, 0, 9, 1}, {3, 0, 10, 1}, {3, 0, 8, 1}};
    expect_golden(&o, c4, 4, g4, sizeof g4 / sizeof g4[0]);
}

Test(sampler, long_streams_hash_to_the_reference_values)
{
    uint64_t counts[50];
    for (size_t i = 0; i < 50; i++)
        counts[i] = (1 + (i * 7919) % 13) * 10;
    struct sf_sampler_options o =
        opts((struct cfg){.rank = 2, .world = 4, .seed = 2024, .epoch = 5, .buffer = 100});
    struct run r = run_of(&o, counts, 50);
    cr_expect_eq(r.n, 920);
    cr_expect_eq(hash_run(&r), 0x89381210d8d22e7ULL, "hash %#llx",
                 (unsigned long long)hash_run(&r));
    free(r.items);

    o.rank = 1;
    o.worker = 1;
    o.num_workers = 3;
    o.policy = SF_EPOCH_DROP;
    o.initial_fill = 10;
    r = run_of(&o, counts, 50);
    cr_expect_eq(r.n, 240);
    cr_expect_eq(hash_run(&r), 0x7f06f4c5ddd03d22ULL, "hash %#llx",
                 (unsigned long long)hash_run(&r));
    free(r.items);
}

/* ------------------------------------------------------------------ partition */

/* Runs every stream of a world and checks the policy's promises. */
static void check_world(int world, unsigned workers, enum sf_epoch_policy policy,
                        enum sf_partition partition, const uint64_t *counts, size_t n)
{
    uint64_t *prefix = prefix_of(counts, n);
    uint64_t total = prefix[n];
    unsigned *seen = calloc(total, sizeof *seen);
    cr_assert_not_null(seen);
    uint64_t first_size = 0, real_sum = 0, pad_sum = 0, size_sum = 0;
    uint64_t min_size = UINT64_MAX, max_size = 0;

    for (int rank = 0; rank < world; rank++) {
        for (unsigned w = 0; w < workers; w++) {
            struct sf_sampler_options o = opts((struct cfg){.rank = rank,
                                                            .world = world,
                                                            .worker = w,
                                                            .workers = workers,
                                                            .seed = 77,
                                                            .epoch = 2,
                                                            .buffer = 16,
                                                            .policy = policy,
                                                            .partition = partition});
            struct sf_sampler *s = make(&o, counts, n);
            struct sf_sampler_info info;
            sf_sampler_get_info(s, &info);
            struct run r = drain(s);
            cr_assert_eq(r.n, info.epoch_size);
            if (rank == 0 && w == 0)
                first_size = r.n;
            if (policy != SF_EPOCH_UNEVEN)
                cr_expect_eq(r.n, first_size,
                             "world %d x %u: stream (%d, %u) has %zu samples, stream 0 has %llu",
                             world, workers, rank, w, r.n, (unsigned long long)first_size);
            min_size = r.n < min_size ? r.n : min_size;
            max_size = r.n > max_size ? r.n : max_size;
            size_sum += r.n;

            /* Samples the stream really read, to check pads against. */
            unsigned char *mine = calloc(total, 1);
            cr_assert_not_null(mine);
            uint64_t pads = 0;
            for (size_t i = 0; i < r.n; i++) {
                const struct sf_sample_ref *it = &r.items[i];
                cr_assert_lt(it->shard, n);
                cr_assert_lt(it->sample, counts[it->shard]);
                uint64_t flat = prefix[it->shard] + it->sample;
                if (it->flags & SF_SAMPLE_PAD) {
                    pads++;
                } else {
                    seen[flat]++;
                    mine[flat] = 1;
                }
            }
            for (size_t i = 0; i < r.n; i++)
                if (r.items[i].flags & SF_SAMPLE_PAD)
                    cr_expect(mine[prefix[r.items[i].shard] + r.items[i].sample],
                              "a pad of stream (%d, %u) repeats a sample it did not read", rank, w);
            cr_expect_eq(pads, info.pad_count);
            if (policy != SF_EPOCH_PAD)
                cr_expect_eq(pads, 0, "pads under a policy that does not pad");
            pad_sum += pads;
            real_sum += r.n - pads;
            free(mine);
            free(r.items);
            sf_sampler_destroy(s);
        }
    }

    uint64_t dup = 0, missing = 0;
    for (uint64_t i = 0; i < total; i++) {
        dup += seen[i] > 1;
        missing += seen[i] == 0;
    }
    cr_expect_eq(dup, 0, "world %d x %u policy %d partition %d: %llu samples delivered twice",
                 world, workers, (int)policy, (int)partition, (unsigned long long)dup);
    if (policy == SF_EPOCH_DROP) {
        cr_expect_eq(real_sum, size_sum);
        cr_expect_eq(real_sum + missing, total);
    } else {
        cr_expect_eq(missing, 0,
                     "world %d x %u policy %d partition %d: %llu samples never "
                     "delivered",
                     world, workers, (int)policy, (int)partition, (unsigned long long)missing);
        cr_expect_eq(real_sum, total);
    }
    if (policy == SF_EPOCH_PAD)
        cr_expect_eq(pad_sum, size_sum - total);
    if (partition == SF_PARTITION_SAMPLES)
        cr_expect_leq(max_size - min_size, policy == SF_EPOCH_UNEVEN ? 1 : 0);
    free(seen);
    free(prefix);
}

/* check_world of whole shards for 1..8 ranks of 1..workers workers. */
static void check_worlds(enum sf_epoch_policy policy, unsigned workers)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    for (int world = 1; world <= 8; world++)
        for (unsigned w = 1; w <= workers; w++)
            check_world(world, w, policy, SF_PARTITION_SHARDS, counts, N_UNEVEN);
}

Test(sampler, pad_ranks_same_size_every_sample_exactly_once_pads_marked)
{
    check_worlds(SF_EPOCH_PAD, 2);
}

Test(sampler, drop_ranks_same_size_no_duplicates)
{
    check_worlds(SF_EPOCH_DROP, 2);
}

Test(sampler, uneven_policy_covers_epoch_exactly)
{
    check_worlds(SF_EPOCH_UNEVEN, 1);
}

Test(sampler, sample_partition_serves_more_streams_than_shards)
{
    static const uint64_t counts[] = {7, 0, 12, 3};
    for (int world = 1; world <= 8; world++) {
        check_world(world, 1, SF_EPOCH_PAD, SF_PARTITION_SAMPLES, counts, 4);
        check_world(world, 2, SF_EPOCH_PAD, SF_PARTITION_SAMPLES, counts, 4);
        check_world(world, 1, SF_EPOCH_DROP, SF_PARTITION_SAMPLES, counts, 4);
        check_world(world, 2, SF_EPOCH_DROP, SF_PARTITION_SAMPLES, counts, 4);
        check_world(world, 1, SF_EPOCH_UNEVEN, SF_PARTITION_SAMPLES, counts, 4);
    }
}

Test(sampler, shards_are_never_split_between_streams)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    int owner[N_UNEVEN];
    for (size_t i = 0; i < N_UNEVEN; i++)
        owner[i] = -1;
    for (int rank = 0; rank < 5; rank++) {
        struct sf_sampler_options o =
            opts((struct cfg){.rank = rank, .world = 5, .policy = SF_EPOCH_UNEVEN});
        struct run r = run_of(&o, counts, N_UNEVEN);
        for (size_t i = 0; i < r.n; i++) {
            int *w = &owner[r.items[i].shard];
            cr_expect(*w == -1 || *w == rank, "shard %llu read by ranks %d and %d",
                      (unsigned long long)r.items[i].shard, *w, rank);
            *w = rank;
        }
        free(r.items);
    }
}

Test(sampler, pads_repeat_the_last_samples_read_in_read_order)
{
    /* Rank 1 gets shard(s) summing to less than rank 0; its pads must be its
     * last `pads` reads, in read order. */
    static const uint64_t counts[] = {9, 3, 2};
    for (int rank = 0; rank < 2; rank++) {
        struct sf_sampler_options o = opts((struct cfg){.rank = rank, .world = 2, .buffer = 1});
        struct sf_sampler *s = make(&o, counts, 3);
        struct sf_sampler_info info;
        sf_sampler_get_info(s, &info);
        struct run r = drain(s);
        /* No shuffling: the stream is the read order, pads last. */
        uint64_t real = r.n - info.pad_count;
        for (size_t i = 0; i < r.n; i++)
            cr_assert_eq(r.items[i].read_index, i);
        for (uint64_t j = 0; j < info.pad_count; j++) {
            const struct sf_sample_ref *pad = &r.items[real + j];
            uint64_t src = ((real - info.pad_count % real) + j) % real;
            cr_expect_eq(pad->flags, SF_SAMPLE_PAD);
            cr_expect(pad->shard == r.items[src].shard && pad->sample == r.items[src].sample,
                      "pad %llu repeats (%llu, %llu), want read %llu", (unsigned long long)j,
                      (unsigned long long)pad->shard, (unsigned long long)pad->sample,
                      (unsigned long long)src);
        }
        if (rank == 1)
            cr_expect_gt(info.pad_count, 0, "the smaller rank got no pads");
        free(r.items);
        sf_sampler_destroy(s);
    }
}

Test(sampler, drop_reads_only_a_prefix_of_the_plan)
{
    static const uint64_t counts[] = {9, 3, 2, 4, 1};
    struct sf_sampler_options o =
        opts((struct cfg){.world = 2, .policy = SF_EPOCH_DROP, .buffer = 1});
    uint64_t dropped_any = 0;
    for (uint64_t epoch = 0; epoch < 8; epoch++) {
        o.epoch = epoch;
        uint64_t shares = 0, size = 0;
        for (int rank = 0; rank < 2; rank++) {
            o.rank = rank;
            struct sf_sampler *s = make(&o, counts, 5);
            struct sf_sampler_info info;
            sf_sampler_get_info(s, &info);
            if (rank == 0)
                size = info.epoch_size;
            cr_expect_eq(info.epoch_size, size, "epoch %llu: ranks differ",
                         (unsigned long long)epoch);
            shares += info.epoch_size + info.dropped_count;
            dropped_any += info.dropped_count;
            size_t np = 0;
            const struct sf_shard_range *plan = sf_sampler_plan(s, &np);
            uint64_t planned = 0;
            for (size_t i = 0; i < np; i++)
                planned += plan[i].end - plan[i].begin;
            /* The plan lists exactly what is read: the dropped tail is not fetched. */
            cr_expect_eq(planned, info.epoch_size);
            /* Without a buffer the stream is the plan, in order: a prefix of the share. */
            struct run r = drain(s);
            size_t k = 0;
            for (size_t i = 0; i < np; i++)
                for (uint64_t j = plan[i].begin; j < plan[i].end; j++, k++)
                    cr_assert(r.items[k].shard == plan[i].shard && r.items[k].sample == j);
            cr_expect_eq(k, r.n);
            free(r.items);
            sf_sampler_destroy(s);
        }
        cr_expect_eq(shares, 19, "the two shares make the whole epoch");
    }
    /* 19 samples cannot split evenly: something is dropped every epoch. */
    cr_expect_geq(dropped_any, 8);
}

Test(sampler, too_few_shards_or_samples_is_a_clear_error)
{
    static const uint64_t counts[] = {5, 0, 5};
    struct sf_sampler_options o = opts((struct cfg){.world = 2, .workers = 2});
    struct sf_sampler *s = (struct sf_sampler *)&o; /* must be reset to NULL */
    char err[256] = "";
    cr_expect_eq(sf_sampler_new(&o, counts, 3, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(s);
    cr_expect(strstr(err, "2 non-empty shards") && strstr(err, "4 streams") &&
                  strstr(err, "SF_PARTITION_SAMPLES"),
              "message: %s", err);

    o.partition = SF_PARTITION_SAMPLES;
    cr_expect_eq(sf_sampler_new(&o, counts, 3, &s, err, sizeof err), SF_OK, "%s", err);
    sf_sampler_destroy(s);

    /* No sample at all: said as such, not as too few shards. */
    static const uint64_t none[] = {0, 0};
    o = opts((struct cfg){.world = 1});
    cr_expect_eq(sf_sampler_new(&o, none, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "the 2 shards hold no sample"), "message: %s", err);
    cr_expect_null(s);

    static const uint64_t tiny[] = {1, 2};
    o = opts((struct cfg){.world = 4, .partition = SF_PARTITION_SAMPLES});
    cr_expect_eq(sf_sampler_new(&o, tiny, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "3 samples") && strstr(err, "4 streams"), "message: %s", err);
    cr_expect_null(s);
}

Test(sampler, bad_options_are_refused)
{
    static const uint64_t counts[] = {5, 5};
    struct sf_sampler *s = NULL;
    char err[256];
    struct sf_sampler_options o = opts((struct cfg){0});

    o.num_workers = 0;
    cr_expect_eq(sf_sampler_new(&o, counts, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    o = opts((struct cfg){.worker = 2, .workers = 2});
    cr_expect_eq(sf_sampler_new(&o, counts, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "worker 2"), "%s", err);
    o = opts((struct cfg){.buffer = 10, .fill = 11});
    cr_expect_eq(sf_sampler_new(&o, counts, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "initial_fill"), "%s", err);
    o.initial_fill = 0;
    o.shuffle_buffer = SF_SAMPLER_MAX_SHUFFLE_BUFFER + 1;
    cr_expect_eq(sf_sampler_new(&o, counts, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    o.shuffle_buffer = 10;
    o.policy = (enum sf_epoch_policy)7;
    cr_expect_eq(sf_sampler_new(&o, counts, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    o.policy = SF_EPOCH_PAD;
    o.partition = (enum sf_partition)9;
    cr_expect_eq(sf_sampler_new(&o, counts, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    o.partition = SF_PARTITION_SHARDS;
    o.rank = 1; /* world 1 */
    cr_expect_eq(sf_sampler_new(&o, counts, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "rank 1") && strstr(err, "world size 1"), "%s", err);
    o.rank = 0;
    cr_expect_eq(sf_sampler_new(&o, counts, 0, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_sampler_new(&o, NULL, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    static const uint64_t huge[] = {UINT64_MAX, 1};
    cr_expect_eq(sf_sampler_new(&o, huge, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "2^64"), "%s", err);
    cr_expect_null(s);
    cr_expect_eq(sf_sampler_new(&o, counts, 2, NULL, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------ determinism */

Test(sampler, same_configuration_same_order_in_two_instances)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    struct sf_sampler_options o = opts((struct cfg){
        .rank = 1, .world = 3, .worker = 1, .workers = 2, .seed = 5, .epoch = 9, .buffer = 20});
    struct sf_sampler *a = make(&o, counts, N_UNEVEN);
    struct sf_sampler *b = make(&o, counts, N_UNEVEN);
    struct sf_sample_ref x, y;
    size_t n = 0;
    /* Interleaved: two samplers do not share anything. */
    for (;;) {
        int ha = sf_sampler_next(a, &x), hb = sf_sampler_next(b, &y);
        cr_assert_eq(ha, hb);
        if (!ha)
            break;
        cr_assert(same_item(&x, &y), "instances differ at item %zu", n);
        n++;
    }
    cr_expect_gt(n, 0);
    sf_sampler_destroy(a);
    sf_sampler_destroy(b);
}

Test(sampler, same_order_in_another_process)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    struct sf_sampler_options o =
        opts((struct cfg){.rank = 2, .world = 4, .seed = 31337, .buffer = 50});
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fds[0]);
        struct sf_sampler *s = NULL;
        uint64_t h = 0;
        if (sf_sampler_new(&o, counts, N_UNEVEN, &s, NULL, 0) == SF_OK) {
            struct run r = drain(s);
            h = hash_run(&r);
            free(r.items);
            sf_sampler_destroy(s);
        }
        _exit(write(fds[1], &h, sizeof h) == (ssize_t)sizeof h ? 0 : 1);
    }
    close(fds[1]);
    uint64_t child = 0;
    cr_assert_eq(read(fds[0], &child, sizeof child), (ssize_t)sizeof child);
    close(fds[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    struct run r = run_of(&o, counts, N_UNEVEN);
    cr_expect_eq(hash_run(&r), child);
    cr_expect_neq(child, 0);
    free(r.items);
}

Test(sampler, another_seed_or_epoch_gives_another_order)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    struct sf_sampler_options o = opts((struct cfg){.world = 2, .seed = 1, .buffer = 30});
    struct run base = run_of(&o, counts, N_UNEVEN);
    o.seed = 2;
    struct run seed2 = run_of(&o, counts, N_UNEVEN);
    o.seed = 1;
    o.epoch = 1;
    struct run epoch1 = run_of(&o, counts, N_UNEVEN);
    cr_expect_neq(hash_run(&base), hash_run(&seed2));
    cr_expect_neq(hash_run(&base), hash_run(&epoch1));
    cr_expect_neq(hash_run(&seed2), hash_run(&epoch1));
    free(base.items);
    free(seed2.items);
    free(epoch1.items);
}

Test(sampler, set_epoch_equals_a_fresh_sampler)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    struct sf_sampler_options o = opts((struct cfg){.rank = 1, .world = 2, .buffer = 8});
    struct sf_sampler *s = make(&o, counts, N_UNEVEN);
    free(drain(s).items);
    struct sf_sample_ref it;
    cr_expect_eq(sf_sampler_next(s, &it), 0, "past the end of the epoch");
    for (uint64_t e = 3; e > 0; e--) {
        sf_sampler_set_epoch(s, e);
        struct run got = drain(s);
        o.epoch = e;
        struct run want = run_of(&o, counts, N_UNEVEN);
        cr_assert_eq(got.n, want.n);
        for (size_t i = 0; i < got.n; i++)
            cr_assert(same_item(&got.items[i], &want.items[i]), "epoch %llu item %zu",
                      (unsigned long long)e, i);
        free(got.items);
        free(want.items);
    }
    sf_sampler_destroy(s);
}

/* ------------------------------------------------------------------ shuffle buffer */

Test(sampler, buffer_moves_samples_far_from_read_order)
{
    uint64_t counts[20];
    same_counts(counts, 20, 100);
    struct sf_sampler_options o = opts((struct cfg){.seed = 11, .buffer = 64});
    struct run r = run_of(&o, counts, 20);
    cr_assert_eq(r.n, 2000);
    uint64_t in_place = 0, displacement = 0, adjacent_in_order = 0;
    for (size_t i = 0; i < r.n; i++) {
        uint64_t ri = r.items[i].read_index;
        in_place += ri == i;
        displacement += ri > i ? ri - i : i - ri;
        if (i > 0 && r.items[i].shard == r.items[i - 1].shard &&
            r.items[i].sample == r.items[i - 1].sample + 1)
            adjacent_in_order++;
    }
    /* A buffer of 64 moves a sample ~64 places on average; read order
     * would give 0, 2000 and 1980. */
    cr_expect_gt(displacement / r.n, 16, "mean displacement %llu",
                 (unsigned long long)(displacement / r.n));
    cr_expect_lt(in_place, 100, "%llu samples in their read place", (unsigned long long)in_place);
    cr_expect_lt(adjacent_in_order, 100, "%llu consecutive pairs",
                 (unsigned long long)adjacent_in_order);
    free(r.items);
}

/* With a full initial fill, item e leaves after read e + B - 1 (or at the
 * drain): read_index <= min(e + B - 1, size - 1), and the bound is reached. */
Test(sampler, buffer_bound_is_exact_with_full_initial_fill)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    static const uint64_t buffers[] = {2, 3, 10, 37, 500};
    for (size_t b = 0; b < sizeof buffers / sizeof buffers[0]; b++) {
        struct sf_sampler_options o = opts((struct cfg){.seed = 3 + b, .buffer = buffers[b]});
        struct sf_sampler *s = make(&o, counts, N_UNEVEN);
        size_t np = 0;
        const struct sf_shard_range *plan = sf_sampler_plan(s, &np);
        /* read index of each plan range's first sample */
        uint64_t *first = calloc(np, sizeof *first);
        cr_assert_not_null(first);
        for (size_t i = 1; i < np; i++)
            first[i] = first[i - 1] + plan[i - 1].end - plan[i - 1].begin;
        struct run r = drain(s);
        uint64_t B = buffers[b], reached = 0;
        for (size_t e = 0; e < r.n; e++) {
            uint64_t bound = e + B - 1 < r.n - 1 ? e + B - 1 : r.n - 1;
            cr_assert_leq(r.items[e].read_index, bound, "B %llu item %zu read %llu",
                          (unsigned long long)B, e, (unsigned long long)r.items[e].read_index);
            reached += r.items[e].read_index == bound;
            /* Its shard began streaming no later than the bound. */
            size_t k = 0;
            while (k < np &&
                   !(plan[k].shard == r.items[e].shard && r.items[e].sample >= plan[k].begin &&
                     r.items[e].sample < plan[k].end))
                k++;
            cr_assert_lt(k, np, "item %zu is not in the plan", e);
            cr_assert_leq(first[k], bound);
            cr_assert_eq(first[k] + (r.items[e].sample - plan[k].begin), r.items[e].read_index);
        }
        cr_expect_gt(reached, 0, "B %llu: the bound is never reached", (unsigned long long)B);
        free(first);
        free(r.items);
        sf_sampler_destroy(s);
    }
}

/* With initial_fill F < B, the first item leaves after F reads, then the
 * buffer grows one slot every two reads until it holds B. */
Test(sampler, partial_initial_fill_starts_sooner_and_grows_to_the_buffer)
{
    uint64_t counts[10];
    same_counts(counts, 10, 50);
    struct sf_sampler_options o = opts((struct cfg){.seed = 8, .buffer = 40, .fill = 5});
    struct run r = run_of(&o, counts, 10);
    cr_assert_eq(r.n, 500);
    /* Reads done when item e leaves, from the documented rule. */
    uint64_t reads = 0, len = 0, e = 0, reached = 0;
    int started = 0, grow = 0;
    while (e < r.n) {
        int emit = 1;
        if (reads < r.n) {
            reads++;
            len++;
            if (!started) {
                if (len < 5)
                    emit = 0;
                else
                    started = grow = 1;
            } else if (len < 40 && grow) {
                grow = 0;
                emit = 0;
            } else {
                grow = 1;
            }
        }
        if (!emit)
            continue;
        cr_assert_lt(r.items[e].read_index, reads, "item %llu leaves before its read",
                     (unsigned long long)e);
        reached += r.items[e].read_index == reads - 1;
        len--;
        e++;
    }
    cr_expect_lt(r.items[0].read_index, 5);
    cr_expect_gt(reached, 0);
    cr_expect_leq(len, 40);
    free(r.items);
}

Test(sampler, no_buffer_means_read_order)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    for (uint64_t b = 0; b <= 1; b++) {
        struct sf_sampler_options o = opts((struct cfg){0});
        o.shuffle_buffer = b;
        struct sf_sampler *s = make(&o, counts, N_UNEVEN);
        struct sf_sampler_info info;
        sf_sampler_get_info(s, &info);
        cr_expect_eq(info.shuffle_buffer, 1);
        cr_expect_eq(info.initial_fill, 1);
        struct run r = drain(s);
        for (size_t i = 0; i < r.n; i++)
            cr_assert_eq(r.items[i].read_index, i);
        free(r.items);
        sf_sampler_destroy(s);
    }
}

Test(sampler, plan_is_read_in_order_within_shards)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    struct sf_sampler_options o = opts((struct cfg){.rank = 1, .world = 3, .buffer = 1});
    struct sf_sampler *s = make(&o, counts, N_UNEVEN);
    size_t np = 0;
    const struct sf_shard_range *plan = sf_sampler_plan(s, &np);
    struct run r = drain(s);
    size_t k = 0;
    for (size_t i = 0; i < np; i++) {
        cr_expect_eq(plan[i].begin, 0);
        cr_expect_eq(plan[i].end, counts[plan[i].shard]);
        for (uint64_t j = plan[i].begin; j < plan[i].end && k < r.n; j++, k++) {
            cr_assert_eq(r.items[k].shard, plan[i].shard);
            cr_assert_eq(r.items[k].sample, j);
        }
    }
    while (k < r.n)
        cr_assert_eq(r.items[k++].flags, SF_SAMPLE_PAD, "non-pad item beyond the plan");
    free(r.items);
    sf_sampler_destroy(s);
}
