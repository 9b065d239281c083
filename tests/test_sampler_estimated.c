/* The sampler on estimated counts: open-ended streams fed as shards are
 * read, fixed sizes across streams, resume before and after the length is
 * known. Suite `sampler` (test_sampler.c). */
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

/* ------------------------------------------------------------------ estimated counts */

/* Drains an open-ended sampler whose stream really has `length` samples,
 * feeding it `chunk` reads at a time whenever it waits, from `fed` already
 * fed. Returns the read
 * indices in delivery order; *n receives their number. */
static uint64_t *drain_fed(struct sf_sampler *s, uint64_t length, uint64_t chunk, uint64_t fed,
                           size_t *n)
{
    uint64_t *out = calloc(length + 1, sizeof *out);
    cr_assert_not_null(out);
    *n = 0;
    for (;;) {
        struct sf_sample_ref it;
        int r = sf_sampler_next(s, &it);
        if (r == 0)
            break;
        if (r == SF_SAMPLER_WAIT) {
            cr_assert_lt(fed, length + 1, "waits after being told the final length");
            fed = fed + chunk < length ? fed + chunk : length;
            cr_assert_eq(sf_sampler_feed(s, fed, fed == length), SF_OK);
            continue;
        }
        cr_assert_eq(r, 1);
        cr_assert_eq(it.shard, SF_SAMPLE_UNRESOLVED);
        cr_assert_lt(it.read_index, fed, "read index %llu delivered before it was read",
                     (unsigned long long)it.read_index);
        cr_assert_lt(*n, length, "more items than the stream's length");
        out[(*n)++] = it.read_index;
    }
    return out;
}

/* The whole stream of a fresh sampler over est (2 shards) of length
 * samples, fed chunk by chunk (free it). */
static uint64_t *whole_stream(const struct sf_sampler_options *o, const uint64_t *est,
                              uint64_t length, uint64_t chunk)
{
    struct sf_sampler *a = make(o, est, 2);
    size_t n = 0;
    uint64_t *all = drain_fed(a, length, chunk, 0, &n);
    cr_assert_eq(n, length);
    sf_sampler_destroy(a);
    return all;
}

/* Takes cut items from s, feeding step more samples whenever it waits: up
 * to length, told final when reached (may_end), or never reaching it.
 * Returns the samples fed. */
static uint64_t take_fed(struct sf_sampler *s, uint64_t cut, uint64_t step, uint64_t length,
                         int may_end)
{
    uint64_t fed = 0;
    for (uint64_t got = 0; got < cut;) {
        struct sf_sample_ref it;
        int r = sf_sampler_next(s, &it);
        if (r == SF_SAMPLER_WAIT) {
            if (may_end) {
                fed = fed + step < length ? fed + step : length;
            } else {
                fed += step;
                cr_assert_lt(fed, length);
            }
            cr_assert_eq(sf_sampler_feed(s, fed, fed == length), SF_OK);
            continue;
        }
        cr_assert_eq(r, 1);
        got++;
    }
    return fed;
}

/* s's state, saved after cut items and fed samples fed (estimated
 * samplers write state version 2), restored in a fresh sampler, delivers
 * exactly all[cut..length); s is destroyed. */
static void expect_resumes(struct sf_sampler *s, const struct sf_sampler_options *o,
                           const uint64_t *est, uint64_t length, uint64_t fed,
                           const uint64_t *all, uint64_t cut)
{
    unsigned char st[SF_SAMPLER_STATE_BYTES];
    cr_assert_eq(sf_sampler_state_save(s, st, sizeof st), SF_OK);
    cr_assert_eq(st[8], 2, "estimated samplers write state version 2");
    sf_sampler_destroy(s);
    struct sf_sampler *b = make(o, est, 2);
    cr_assert_eq(sf_sampler_state_restore(b, st, sizeof st), SF_OK, "%s", sf_sampler_errmsg(b));
    size_t m = 0;
    uint64_t *rest = drain_fed(b, length, 3, fed, &m);
    cr_assert_eq(m, length - cut, "cut %llu", (unsigned long long)cut);
    for (size_t i = 0; i < m; i++)
        cr_assert_eq(rest[i], all[cut + i], "cut %llu item %zu", (unsigned long long)cut, i);
    free(rest);
    sf_sampler_destroy(b);
}

Test(sampler, estimated_one_stream_waits_for_reads_and_matches_exact_order)
{
    clear_dist_env();
    /* Estimates say 40 samples; the stream really has 53. With one stream the
     * epoch is the real length, and the order of read indices is the one an
     * exact sampler gives to a stream of 53 samples, whatever the feeding. */
    uint64_t est[] = {10, 10, 10, 10};
    uint64_t exact[] = {53};
    struct sf_sampler_options o =
        opts((struct cfg){.buffer = 16, .fill = 4, .seed = 5, .epoch = 2});
    struct sf_sampler_options oe = o;
    oe.estimated_counts = 1;
    struct run ref = run_of(&o, exact, 1);
    cr_assert_eq(ref.n, 53);
    uint64_t chunks[] = {1, 3, 7, 53};
    for (size_t c = 0; c < 4; c++) {
        struct sf_sampler *s = make(&oe, est, 4);
        struct sf_sampler_info info;
        sf_sampler_get_info(s, &info);
        cr_assert_eq(info.size_known, 0);
        cr_assert_eq(info.estimated, 1);
        cr_assert_eq(info.epoch_size, 40, "the estimate before any feed");
        size_t n = 0;
        uint64_t *got = drain_fed(s, 53, chunks[c], 0, &n);
        cr_assert_eq(n, 53);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(got[i], ref.items[i].read_index, "chunk %llu, item %zu",
                         (unsigned long long)chunks[c], i);
        sf_sampler_get_info(s, &info);
        cr_assert_eq(info.size_known, 1);
        cr_assert_eq(info.epoch_size, 53);
        free(got);
        sf_sampler_destroy(s);
    }
    free(ref.items);
}

Test(sampler, estimated_streams_get_the_same_fixed_size_and_never_wait)
{
    clear_dist_env();
    uint64_t est[] = {30, 10, 25, 25, 40, 5, 18};
    for (int policy = SF_EPOCH_PAD; policy <= SF_EPOCH_DROP; policy++) {
        uint64_t sizes[3];
        int dealt[7] = {0};
        for (int rank = 0; rank < 3; rank++) {
            struct sf_sampler_options o = opts((struct cfg){.rank = rank,
                                                            .world = 3,
                                                            .estimated = 1,
                                                            .policy = (enum sf_epoch_policy)policy,
                                                            .buffer = 8});
            struct sf_sampler *s = make(&o, est, 7);
            sizes[rank] = sf_sampler_epoch_size(s);
            size_t np = 0;
            const struct sf_shard_range *plan = sf_sampler_plan(s, &np);
            for (size_t i = 0; i < np; i++) {
                dealt[plan[i].shard]++;
                cr_assert_eq(plan[i].begin, 0);
                cr_assert_eq(plan[i].end, est[plan[i].shard], "whole shards are planned");
            }
            /* Read indices 0..size-1, each once, no waiting. */
            uint8_t *seen = calloc(sizes[rank], 1);
            struct sf_sample_ref it;
            uint64_t n = 0;
            int r;
            while ((r = sf_sampler_next(s, &it)) == 1) {
                cr_assert_lt(it.read_index, sizes[rank]);
                cr_assert_eq(seen[it.read_index], 0);
                seen[it.read_index] = 1;
                n++;
            }
            cr_assert_eq(r, 0, "a fixed-size stream never waits");
            cr_assert_eq(n, sizes[rank]);
            free(seen);
            sf_sampler_destroy(s);
        }
        cr_assert_eq(sizes[0], sizes[1]);
        cr_assert_eq(sizes[1], sizes[2]);
        for (int i = 0; i < 7; i++)
            cr_assert_eq(dealt[i], 1, "shard %d dealt to exactly one rank", i);
    }
}

Test(sampler, estimated_resume_before_and_after_the_length_is_known)
{
    clear_dist_env();
    uint64_t est[] = {20, 20};
    struct sf_sampler_options o = opts((struct cfg){.estimated = 1, .buffer = 10, .seed = 11});
    const uint64_t length = 37;
    uint64_t *all = whole_stream(&o, est, length, 5);
    /* Cut at every position; the length is told before the save only past
     * the point where the stream must have been read to its end. */
    for (uint64_t cut = 0; cut <= length; cut++) {
        struct sf_sampler *s = make(&o, est, 2);
        uint64_t fed = take_fed(s, cut, 5, length, 1);
        expect_resumes(s, &o, est, length, fed, all, cut);
    }
    free(all);
}

Test(sampler, estimated_counts_refuse_sample_partition_and_exact_states)
{
    clear_dist_env();
    uint64_t est[] = {20, 20};
    struct sf_sampler_options o =
        opts((struct cfg){.world = 2, .estimated = 1, .partition = SF_PARTITION_SAMPLES});
    struct sf_sampler *s = NULL;
    char err[256] = "";
    cr_assert_eq(sf_sampler_new(&o, est, 2, &s, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(err, "exact sample counts"), "%s", err);
    cr_assert_null(s);

    struct sf_sampler_options ex = opts((struct cfg){0});
    struct sf_sampler *exact = make(&ex, est, 2);
    struct sf_sampler_options es = ex;
    es.estimated_counts = 1;
    struct sf_sampler *estm = make(&es, est, 2);
    unsigned char st[SF_SAMPLER_STATE_BYTES];
    cr_assert_eq(sf_sampler_state_save(exact, st, sizeof st), SF_OK);
    cr_assert_eq(sf_sampler_state_restore(estm, st, sizeof st), SF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(sf_sampler_errmsg(estm), "estimated counts"), "%s", sf_sampler_errmsg(estm));
    cr_assert_eq(sf_sampler_feed(estm, 10, 1), SF_OK);
    cr_assert_eq(sf_sampler_feed(estm, 12, 1), SF_ERR_INVALID_ARGUMENT,
                 "a second, different final length is refused");
    sf_sampler_destroy(exact);
    sf_sampler_destroy(estm);
}

Test(sampler, estimated_resume_past_the_estimate_before_the_length_is_known)
{
    clear_dist_env();
    /* Estimates say 20 samples; the stream has 53. A save at position 30,
     * before the reader reached the end (no final length), restores: the
     * estimate is no bound on an open-ended stream's position. */
    uint64_t est[] = {10, 10};
    struct sf_sampler_options o = opts((struct cfg){.estimated = 1, .buffer = 10, .seed = 3});
    const uint64_t length = 53, cut = 30;
    uint64_t *all = whole_stream(&o, est, length, 4);

    struct sf_sampler *s = make(&o, est, 2);
    uint64_t fed = take_fed(s, cut, 4, length, 0);
    struct sf_sampler_info info;
    sf_sampler_get_info(s, &info);
    cr_assert_eq(info.size_known, 0);
    cr_assert_gt(cut, info.epoch_size, "the cut is past the estimate");
    expect_resumes(s, &o, est, length, fed, all, cut);
    free(all);
}

Test(sampler, estimated_feed_after_the_final_length_accepts_what_agrees_with_it)
{
    clear_dist_env();
    uint64_t est[] = {20, 20};
    struct sf_sampler_options o = opts((struct cfg){.estimated = 1});
    struct sf_sampler *s = make(&o, est, 2);
    cr_assert_eq(sf_sampler_feed(s, 25, 0), SF_OK);
    cr_assert_eq(sf_sampler_feed(s, 24, 1), SF_ERR_INVALID_ARGUMENT,
                 "a final length below what was told to exist is refused");
    cr_assert_eq(sf_sampler_feed(s, 30, 1), SF_OK);
    cr_assert_eq(sf_sampler_feed(s, 12, 0), SF_OK, "at least 12 of 30: no contradiction");
    cr_assert_eq(sf_sampler_feed(s, 30, 0), SF_OK);
    cr_assert_eq(sf_sampler_feed(s, 31, 0), SF_ERR_INVALID_ARGUMENT, "31 of a stream of 30");
    cr_assert_eq(sf_sampler_epoch_size(s), 30);
    sf_sampler_destroy(s);
}

Test(sampler, estimated_failed_restore_keeps_what_the_stream_was_fed)
{
    clear_dist_env();
    /* An open-ended stream told "at least 25 reads" takes 3 items (13
     * reads). A restore then fails its last check (a version 2 state whose
     * epoch size disagrees with its own final length, checksum valid): the
     * sampler must be as it was, still able to read up to 25 without
     * waiting for a feed the reader already gave. */
    uint64_t est[] = {20, 20};
    struct sf_sampler_options o = opts((struct cfg){.estimated = 1, .buffer = 10, .seed = 5});
    struct sf_sampler *ref = make(&o, est, 2);
    struct sf_sampler *s = make(&o, est, 2);
    cr_assert_eq(sf_sampler_feed(ref, 25, 0), SF_OK);
    cr_assert_eq(sf_sampler_feed(s, 25, 0), SF_OK);
    struct sf_sample_ref a, b;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(sf_sampler_next(ref, &a), 1);
        cr_assert_eq(sf_sampler_next(s, &b), 1);
    }
    unsigned char st[SF_SAMPLER_STATE_BYTES];
    cr_assert_eq(sf_sampler_state_save(s, st, sizeof st), SF_OK);
    /* Length 40 (stored + 1), epoch size 39; checksum recomputed as
     * docs/sampling.md defines it. */
    const uint64_t length1 = 41, size = 39;
    for (int i = 0; i < 8; i++) {
        st[112 + i] = (unsigned char)(length1 >> (8 * i));
        st[40 + i] = (unsigned char)(size >> (8 * i));
    }
    uint64_t h = SF__TAG_STATE;
    for (size_t off = 0; off < 120; off += 8) {
        uint64_t w = 0;
        for (int i = 7; i >= 0; i--)
            w = (w << 8) | st[off + (size_t)i];
        h = sf__absorb64(h, w);
    }
    for (int i = 0; i < 8; i++)
        st[120 + i] = (unsigned char)(h >> (8 * i));
    cr_assert_eq(sf_sampler_state_restore(s, st, sizeof st), SF_ERR_CORRUPT, "%s",
                 sf_sampler_errmsg(s));
    /* Both deliver the same items up to the same wait. */
    for (int i = 0;; i++) {
        int ra = sf_sampler_next(ref, &a), rb = sf_sampler_next(s, &b);
        cr_assert_eq(rb, ra, "item %d after the failed restore: %d, untouched sampler %d", i, rb,
                     ra);
        if (ra != 1)
            break;
        cr_assert(same_item(&a, &b), "item %d", i);
    }
    sf_sampler_destroy(ref);
    sf_sampler_destroy(s);
}
