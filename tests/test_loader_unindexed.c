/* The loader without index.json: counts estimated from the first shard,
 * learned and stored, pads and drops that keep ranks equal, resume mid-epoch.
 * Suite `loader` (test_loader.c). */
#include "loader_fixture.h"
#include "src/loader.h"
#include "src/loader_internal.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/state_seal.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Waits (bounded by the suite's timeout, not a threshold) until the reader
 * has closed every shard. */
static unsigned shards_open_after_settling(struct sf_loader *l)
{
    struct sf_loader_stats s;
    for (int i = 0; i < 400; i++) {
        sf_loader_get_stats(l, &s);
        if (s.shards_in_flight == 0)
            return 0;
        usleep(5000);
    }
    return s.shards_in_flight;
}

/* local_options without the shards' index.json. */
static void unindexed_local_options(struct sf_loader_options *o, unsigned n,
                                    unsigned long long shard_bytes)
{
    local_options(o, n, shard_bytes);
    remove_index(shards);
}

/* rank_options under policy, without learned counts (so an unindexed
 * epoch's size is estimated); shuffle, when not 0, is the shuffle buffer. */
static void estimated_options(struct sf_loader_options *o, const char *const *sources, size_t n,
                              int rank, unsigned world, int policy, unsigned shuffle)
{
    rank_options(o, sources, n, rank, (int)world);
    o->sampler.policy = (enum sf_epoch_policy)policy;
    if (shuffle)
        o->sampler.shuffle_buffer = shuffle;
    o->learned_counts = 0;
}

/* Sets l to epoch, which must be exact from its start (every shard's count
 * learned: its size known and, when logged is not NULL, logged holds in the
 * kept log), then runs it to its end into e. */
static void run_exact_epoch(struct sf_loader *l, uint64_t epoch, const char *logged,
                            struct epoch_log *e)
{
    cr_assert_eq(sf_loader_set_epoch(l, epoch), SF_OK, "%s", sf_loader_errmsg(l));
    if (logged)
        cr_assert(log_has(logged), "epoch %llu should be exact: %s", (unsigned long long)epoch,
                  log_text);
    cr_assert_eq(sf_loader_epoch_size_known(l), 1, "epoch %llu is estimated",
                 (unsigned long long)epoch);
    cr_assert_eq(run_epoch(l, e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
}

Test(loader, unindexed_one_rank_streams_every_sample_once_and_learns_counts)
{
    struct sf_loader_options o;
    unindexed_local_options(&o, 130, 32 << 10);
    struct sf_loader *l = open_loader(&o);
    cr_assert_eq(sf_loader_epoch_size_known(l), 0, "no counts: the size is an estimate");
    struct epoch_log e;
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(e.images, 130u);
    cr_assert_eq(e.pads, 0u);
    for (unsigned i = 0; i < 130; i++)
        cr_assert_eq(e.seen[i], 1, "sample %u seen %u times", i, e.seen[i]);
    cr_assert(e.labels_ok);
    cr_assert_eq(sf_loader_epoch_size_known(l), 1);
    cr_assert_eq(sf_loader_epoch_samples(l), 130u);
    cr_assert_eq(sf_loader_epoch_batches(l), 9u);
    /* The counts were learned: the next epoch is exact from its start. */
    cr_assert_eq(sf_loader_set_epoch(l, 1), SF_OK, "%s", sf_loader_errmsg(l));
    cr_assert_eq(sf_loader_epoch_size_known(l), 1);
    cr_assert_eq(sf_loader_epoch_samples(l), 130u);
    struct epoch_log e1;
    cr_assert_eq(run_epoch(l, &e1, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    for (unsigned i = 0; i < 130; i++)
        cr_assert_eq(e1.seen[i], 1, "epoch 1: sample %u seen %u times", i, e1.seen[i]);
    cr_assert_neq(e1.digest, e.digest, "another epoch, another order");
    struct sf_loader_stats s;
    sf_loader_get_stats(l, &s);
    cr_assert_eq(s.pad_samples, 0u);
    cr_assert_eq(s.dropped_samples, 0u);
    free(e.seen);
    free(e1.seen);
    sf_loader_close(l);
}

Test(loader, unindexed_ranks_deliver_the_same_number_of_batches)
{
    local_dataset(230, 12 << 10, -1);
    remove_index(shards);
    for (int policy = SF_EPOCH_PAD; policy <= SF_EPOCH_DROP; policy++) {
        unsigned batches[3], real_total = 0, dropped_total = 0;
        unsigned char *seen = calloc(230, 1);
        for (int rank = 0; rank < 3; rank++) {
            struct sf_loader_options o;
            estimated_options(&o, shards_src, 1, rank, 3, policy, 0);
            struct sf_loader *l = open_loader(&o);
            cr_assert_eq(sf_loader_epoch_size_known(l), 1, "equalised ranks know their size");
            uint64_t want = sf_loader_epoch_batches(l);
            struct epoch_log e;
            cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
            batches[rank] = e.batches;
            cr_assert_eq(e.batches, want);
            struct sf_loader_stats s;
            sf_loader_get_stats(l, &s);
            cr_assert_eq(s.pad_samples, e.pads);
            for (unsigned i = 0; i < 230; i++) {
                cr_assert(seen[i] + e.seen[i] <= 1, "sample %u delivered twice (policy %d)", i,
                          policy);
                seen[i] += e.seen[i];
                real_total += e.seen[i];
            }
            dropped_total += (unsigned)s.dropped_samples;
            free(e.seen);
            sf_loader_close(l);
        }
        cr_assert_eq(batches[0], batches[1]);
        cr_assert_eq(batches[1], batches[2]);
        cr_assert_eq(real_total + dropped_total, 230u,
                     "every sample is delivered or counted as dropped (policy %d)", policy);
        free(seen);
    }
}

Test(loader, unindexed_state_restore_gives_the_same_remaining_batches)
{
    struct sf_loader_options o;
    unindexed_local_options(&o, 130, 32 << 10);
    unsigned char state[SF_LOADER_STATE_BYTES];
    struct epoch_log head, tail;
    struct sf_loader *l = open_and_save_mid_epoch(&o, 3, state, &head, &tail);
    cr_assert_eq(head.images + tail.images, 130u);
    l = reopen_from_state(l, &o, state);
    struct epoch_log again;
    cr_assert_eq(run_epoch(l, &again, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(again.images, tail.images);
    cr_assert_eq(again.digest, tail.digest, "resumed batches differ");
    for (unsigned i = 0; i < 130; i++)
        cr_assert_eq(head.seen[i] + again.seen[i], 1, "sample %u", i);
    free(head.seen);
    free(tail.seen);
    free(again.seen);
    sf_loader_close(l);
}

/* Sets the position of a loader state (the loader's and its sampler's),
 * its stream length (+ 1, 0: unknown) and seals it again. */
static void craft_position(unsigned char *state, uint64_t position, uint64_t length1)
{
    sf__put_le64(state + SEAL_LOADER_POSITION, position);
    sf__put_le64(state + SEAL_SAMPLER_POSITION, position);
    sf__put_le64(state + SEAL_SAMPLER_LENGTH, length1);
    seal_loader_state(state);
}

/* Without counts one stream is open-ended: its length is what the reader
 * finds, so only the shards' bytes bound a saved position. A crafted state
 * (position 2^40) was accepted and replayed step by step for hours; one
 * past what the shards can hold is refused, naming the position (or the
 * stream length) and the bound, and the loader still resumes from a
 * genuine state. */
Test(loader, unindexed_state_beyond_what_the_shards_hold_is_refused)
{
    struct sf_loader_options o;
    unindexed_local_options(&o, 130, 32 << 10);
    unsigned char state[SF_LOADER_STATE_BYTES], bad[SF_LOADER_STATE_BYTES];
    struct epoch_log head, tail;
    struct sf_loader *l = open_and_save_mid_epoch(&o, 3, state, &head, &tail);
    uint64_t saved = sf__get_le64(state + SEAL_LOADER_POSITION);
    cr_assert_gt(saved, 0);

    /* The genuine state with its length forgotten (as if saved before the
     * end was read) still resumes: the bound is not in the way. */
    memcpy(bad, state, sizeof(bad));
    craft_position(bad, saved, 0);
    cr_assert_eq(sf_loader_state_restore(l, bad, sizeof(bad)), SF_OK, "%s", sf_loader_errmsg(l));

    const struct {
        uint64_t position, length1;
        const char *named;
    } cases[] = {
        {10000000, 0, "position 10000000 is beyond the "},
        {1ULL << 40, 0, "position 1099511627776 is beyond the "},
        {saved, (1ULL << 40) + 1, "stream length 1099511627776 is beyond the "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, state, sizeof(bad));
        craft_position(bad, cases[i].position, cases[i].length1);
        cr_assert_eq(sf_loader_state_restore(l, bad, sizeof(bad)), SF_ERR_INVALID_ARGUMENT,
                     "case %zu accepted", i);
        cr_assert(strstr(sf_loader_errmsg(l), cases[i].named), "case %zu: %s", i,
                  sf_loader_errmsg(l));
        cr_assert(strstr(sf_loader_errmsg(l), "shard(s) can hold"), "%s", sf_loader_errmsg(l));
    }
    expect_resumes_to_tail(l, state, &head, &tail);
}

/* One log sink (issue 18): the loader's log alone also carries its S3
 * client's retry messages; before, they went to s3.log and were lost. */
Test(loader, the_loader_log_carries_the_clients_retries)
{
    const char *seed[] = {"--seed", "5", NULL};
    mock_dataset_with(40, 16 << 10, seed);
    cr_assert_eq(admin("POST", "/_mock/faults", "p503=0.3\n"), 200);
    struct sf_loader_options o;
    s3_options(&o, bucket_src, NULL);
    o.s3.max_attempts = 30;
    cr_assert_null(o.s3.log);
    log_clear();
    keep_log_in(&o);
    struct epoch_log e;
    struct sf_loader *l = open_and_run_epoch(&o, &e);
    cr_expect_eq(e.images, 40u);
    struct sf_loader_stats st;
    sf_loader_get_stats(l, &st);
    cr_assert_gt(st.retries, 0u, "30%% 503s should have caused retries");
    cr_expect(log_has("; retry "), "no retry message in the loader's log:\n%s", log_text);
    free(e.seen);
    sf_loader_close(l);
}

Test(loader, unindexed_drop_last_one_rank_delivers_only_full_batches)
{
    local_dataset(130, 32 << 10, -1); /* 130 = 8 x 16 + 2 */
    remove_index(shards);
    uint64_t digest[2] = {0, 0};
    for (unsigned threads = 1; threads <= 4; threads += 3) {
        struct sf_loader_options o;
        base_options(&o, shards_src, 1);
        o.drop_last = 1;
        o.decode_threads = threads;
        struct sf_loader *l = open_loader(&o);
        cr_assert_eq(sf_loader_epoch_size_known(l), 0);
        struct epoch_log e;
        cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
        cr_assert_eq(e.batches, 8u);
        cr_assert_eq(e.images, 128u, "only full batches");
        cr_assert_eq(e.pads, 0u);
        digest[threads > 1] = e.digest;
        unsigned distinct = 0;
        for (unsigned i = 0; i < 130; i++) {
            cr_assert_leq(e.seen[i], 1, "sample %u seen %u times", i, e.seen[i]);
            distinct += e.seen[i];
        }
        cr_assert_eq(distinct, 128u);
        cr_assert_eq(sf_loader_epoch_size_known(l), 1);
        cr_assert_eq(sf_loader_epoch_batches(l), 8u);
        cr_assert_eq(sf_loader_epoch_samples(l), 128u, "the samples delivered, drop_last applied");
        cr_assert_eq(sf_loader_epoch_delivered(l), 128u, "every batch taken");
        struct sf_batch b;
        cr_assert_eq(sf_loader_next(l, &b), SF_END_OF_EPOCH, "the end stays the end");
        /* The two samples of the short tail hold no shard open. */
        cr_assert_eq(shards_open_after_settling(l), 0u, "shards still open after the epoch");
        /* The next epoch is exact (the counts were learned) and drops the same tail. */
        struct epoch_log e1;
        run_exact_epoch(l, 1, NULL, &e1);
        cr_assert_eq(e1.batches, 8u);
        cr_assert_eq(sf_loader_set_epoch(l, 2), SF_OK, "%s", sf_loader_errmsg(l));
        cr_assert_eq(sf_loader_epoch_delivered(l), 0u, "a new epoch starts at 0");
        free(e.seen);
        free(e1.seen);
        sf_loader_close(l);
    }
    cr_assert_eq(digest[0], digest[1], "1 and 4 decode threads gave other batches");
}

Test(loader, unindexed_empty_object_does_not_keep_the_next_epoch_estimated)
{
    /* A 0-byte object holds no sample: it is never read (nothing of it is
     * dealt), so its count is never learned; it is known from its size. */
    local_dataset(60, 32 << 10, -1);
    remove_index(shards);
    cr_assert(test_write_file(shards, "zz-empty.tar", "", 0) == 0);
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    keep_log_in(&o);
    struct sf_loader *l = open_loader(&o);
    /* (The reader may read all 60 samples before the next line: whether the
     * size is known yet depends on timing, so it is not asserted here.) */
    cr_assert(log_has("estimating from sizes"), "epoch 0 runs on estimates: %s", log_text);
    struct epoch_log e;
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(e.images, 60u);
    struct epoch_log e1;
    run_exact_epoch(l, 1, "every shard's sample count is known: exact", &e1);
    cr_assert_eq(e1.images, 60u);
    free(e.seen);
    free(e1.seen);
    sf_loader_close(l);
}

/* 90 samples (returned) whose first shard (the probe) holds small ones and
 * later shards big ones, so their estimates are many times their real
 * counts, and ranks' real shares differ from their estimated ones. */
static unsigned misestimated_dataset(void)
{
    sized_dataset(90, 15, 25, 48 << 10);
    return 90;
}

Test(loader, unindexed_ranks_with_wrong_estimates_pad_and_drop_to_equal_batches)
{
    const unsigned n = misestimated_dataset();
    unsigned pads_seen = 0, drops_seen = 0;
    for (unsigned run = 0; run < 6; run++) {
        int policy = run % 2 ? SF_EPOCH_DROP : SF_EPOCH_PAD;
        uint64_t seed = 7 + run / 2; /* another deal of the shards */
        unsigned batches[2], real_total = 0, dropped_total = 0;
        unsigned char *seen = calloc(n, 1);
        for (int rank = 0; rank < 2; rank++) {
            uint64_t digest[2];
            for (unsigned t = 0; t < 2; t++) {
                struct sf_loader_options o;
                estimated_options(&o, shards_src, 1, rank, 2, policy, 20);
                o.sampler.seed = seed;
                o.decode_threads = t ? 4 : 1;
                struct sf_loader *l = open_loader(&o);
                cr_assert_eq(sf_loader_epoch_size_known(l), 1);
                uint64_t want = sf_loader_epoch_batches(l);
                struct epoch_log e;
                cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
                cr_assert_eq(e.batches, want, "rank %d policy %d", rank, policy);
                cr_assert(e.labels_ok);
                digest[t] = e.digest;
                struct sf_loader_stats s;
                sf_loader_get_stats(l, &s);
                cr_assert_eq(s.pad_samples, e.pads, "pads flagged = pads counted");
                cr_assert_eq(s.samples_delivered, e.images);
                cr_assert_eq(e.images, sf_loader_epoch_samples(l), "every rank delivers T");
                if (t == 0) {
                    batches[rank] = e.batches;
                    pads_seen += e.pads;
                    drops_seen += (unsigned)s.dropped_samples;
                    dropped_total += (unsigned)s.dropped_samples;
                    for (unsigned i = 0; i < n; i++) {
                        cr_assert(seen[i] + e.seen[i] <= 1, "sample %u twice (policy %d)", i,
                                  policy);
                        seen[i] += e.seen[i];
                        real_total += e.seen[i];
                    }
                }
                free(e.seen);
                sf_loader_close(l);
            }
            cr_assert_eq(digest[0], digest[1],
                         "rank %d policy %d: 1 and 4 decode threads gave other batches", rank,
                         policy);
        }
        cr_assert_eq(batches[0], batches[1], "policy %d", policy);
        cr_assert_eq(real_total + dropped_total, n,
                     "delivered + dropped = every sample (policy %d)", policy);
        free(seen);
    }
    cr_assert_gt(pads_seen, 0u, "the data should make some rank pad");
    cr_assert_gt(drops_seen, 0u, "the data should make some rank drop");
}

/* 120 samples on the mock without index.json; cache_dir (800 bytes) and the
 * learned-counts store in it (900 bytes). */
static void mock_dataset_counted_in(char *cache_dir, char *store)
{
    mock_dataset(120, 24 << 10);
    remove_bucket_index();
    snprintf(cache_dir, 800, "%s/cache", tmp);
    snprintf(store, 900, "%s/v1/counts.log", cache_dir);
}

Test(loader, learned_counts_in_the_cache_dir_make_a_later_run_exact_at_open)
{
    char cache_dir[800], store[900];
    mock_dataset_counted_in(cache_dir, store);
    struct sf_loader_options o;
    s3_options(&o, bucket_src, cache_dir);
    keep_log_in(&o);
    log_clear();
    struct sf_loader *l = open_loader(&o);
    cr_assert(log_has("estimating from sizes"), "%s", log_text);
    struct epoch_log head, tail;
    cr_assert_eq(run_epoch(l, &head, 2), SF_OK, "%s", sf_loader_errmsg(l));
    unsigned char state[SF_LOADER_STATE_BYTES];
    cr_assert_eq(sf_loader_state_save(l, state, sizeof(state)), SF_OK, "%s", sf_loader_errmsg(l));
    cr_assert_eq(run_epoch(l, &tail, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(head.images + tail.images, 120u);
    sf_loader_close(l);
    struct stat sb;
    cr_assert(stat(store, &sb) == 0 && sb.st_size > 0, "no learned counts in %s", store);

    /* A later run: exact at open, from the store alone (no probe of a head,
     * nothing read before the first batch). */
    log_clear();
    l = open_loader(&o);
    cr_assert_eq(sf_loader_epoch_size_known(l), 1, "exact before any batch");
    cr_assert_eq(sf_loader_epoch_samples(l), 120u);
    cr_assert(log_has("learned in earlier runs"), "%s", log_text);
    cr_assert(!log_has("estimating from sizes"), "probed although every count is known: %s",
              log_text);
    struct epoch_log all;
    cr_assert_eq(run_epoch(l, &all, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(all.images, 120u);
    for (unsigned i = 0; i < 120; i++)
        cr_assert_eq(all.seen[i], 1, "sample %u", i);

    /* The state saved on estimates resumes on estimates in this exact loader,
     * and the next epoch is exact again. */
    cr_assert_eq(sf_loader_state_restore(l, state, sizeof(state)), SF_OK, "%s",
                 sf_loader_errmsg(l));
    struct epoch_log again;
    cr_assert_eq(run_epoch(l, &again, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(again.digest, tail.digest, "resumed batches differ");
    for (unsigned i = 0; i < 120; i++)
        cr_assert_eq(head.seen[i] + again.seen[i], 1, "sample %u", i);
    log_clear();
    struct epoch_log e1;
    run_exact_epoch(l, 1, "is known: exact", &e1);
    for (unsigned i = 0; i < 120; i++)
        cr_assert_eq(e1.seen[i], 1, "epoch 1: sample %u", i);
    free(head.seen);
    free(tail.seen);
    free(all.seen);
    free(again.seen);
    free(e1.seen);
    sf_loader_close(l);
}

Test(loader, ranks_agree_on_the_basis_when_one_could_not_save_its_counts)
{
    /* Two ranks share a store. Rank 0's saved counts are lost (as on a full
     * disk); it still knows them in memory. Were they used, rank 0 alone
     * would run epoch 1 exact and rank 1 on estimates: other batch counts,
     * a DDP hang. Several ranks decide on the shared store only. */
    char cache_dir[800], store[900];
    mock_dataset_counted_in(cache_dir, store);
    struct sf_loader *ls[2];
    for (int rank = 0; rank < 2; rank++) {
        struct sf_loader_options o;
        s3_options(&o, bucket_src, cache_dir);
        o.sampler.rank = rank;
        o.sampler.world_size = 2;
        o.learned_counts = 1; /* always: the store is shared */
        keep_log_in(&o);
        ls[rank] = open_loader(&o);
        struct epoch_log e;
        cr_assert_eq(run_epoch(ls[rank], &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(ls[rank]));
        free(e.seen);
        if (rank == 0)
            cr_assert(unlink(store) == 0, "rank 0 saved no counts in %s", store);
    }
    int exact[2];
    for (int rank = 0; rank < 2; rank++) {
        log_clear();
        cr_assert_eq(sf_loader_set_epoch(ls[rank], 1), SF_OK, "%s", sf_loader_errmsg(ls[rank]));
        exact[rank] = log_has("is known: exact");
    }
    cr_assert_eq(exact[0], exact[1], "rank 0 %s, rank 1 %s", exact[0] ? "exact" : "estimated",
                 exact[1] ? "exact" : "estimated");
    cr_assert_eq(sf_loader_epoch_batches(ls[0]), sf_loader_epoch_batches(ls[1]));
    for (int rank = 0; rank < 2; rank++)
        sf_loader_close(ls[rank]);
}

Test(loader, indexed_drop_policy_counts_the_samples_it_drops)
{
    /* dropped_samples counts SF_EPOCH_DROP's truncation with exact counts
     * too, not only with estimates. */
    local_dataset(230, 12 << 10, -1);
    unsigned real_total = 0, dropped_total = 0, batches[3];
    for (int rank = 0; rank < 3; rank++) {
        struct sf_loader_options o;
        rank_options(&o, shards_src, 1, rank, 3);
        o.sampler.policy = SF_EPOCH_DROP;
        struct epoch_log e;
        struct sf_loader *l = open_and_run_epoch(&o, &e);
        batches[rank] = e.batches;
        cr_assert_eq(e.pads, 0u);
        real_total += e.images;
        struct sf_loader_stats s;
        sf_loader_get_stats(l, &s);
        dropped_total += (unsigned)s.dropped_samples;
        free(e.seen);
        sf_loader_close(l);
    }
    cr_assert_eq(batches[0], batches[1]);
    cr_assert_eq(batches[1], batches[2]);
    cr_assert_lt(real_total, 230u, "the shards' deal should be uneven here");
    cr_assert_eq(real_total + dropped_total, 230u, "delivered + dropped = every sample");
}

Test(loader, unindexed_shards_without_samples_end_the_epoch_at_once)
{
    /* One rank, shards that hold no sample (a tar of only its end blocks):
     * the epoch is empty, known once they are read; no wait, no error.
     * (With the counts then known, the next epoch is refused as an exact
     * one would be: the shards hold no sample.) */
    loader_tmpdir();
    static unsigned char zeros[10240];
    cr_assert(test_write_file(tmp, "a.tar", zeros, sizeof(zeros)) == 0);
    cr_assert(test_write_file(tmp, "b.tar", zeros, sizeof(zeros)) == 0);
    snprintf(shards, sizeof(shards), "%s/", tmp);
    n_samples = 1;
    for (int drop_last = 0; drop_last <= 1; drop_last++) {
        struct sf_loader_options o;
        base_options(&o, shards_src, 1);
        o.drop_last = drop_last;
        struct epoch_log e;
        struct sf_loader *l = open_and_run_epoch(&o, &e);
        cr_assert_eq(e.batches, 0u);
        cr_assert_eq(sf_loader_epoch_size_known(l), 1);
        cr_assert_eq(sf_loader_epoch_samples(l), 0u);
        free(e.seen);
        sf_loader_close(l);
    }
}

Test(loader, unindexed_set_epoch_mid_epoch_starts_the_next_one_cleanly)
{
    local_dataset(130, 32 << 10, -1);
    remove_index(shards);
    /* One rank (open-ended stream) and two (fixed size, pads or drops). */
    for (int world = 1; world <= 2; world++) {
        unsigned char *seen = calloc(130, 1);
        unsigned batches[2] = {0, 0};
        for (int rank = 0; rank < world; rank++) {
            struct sf_loader_options o;
            rank_options(&o, shards_src, 1, rank, world);
            o.learned_counts = 0; /* epoch 1 on estimates too */
            struct sf_loader *l = open_loader(&o);
            struct epoch_log part;
            cr_assert_eq(run_epoch(l, &part, 1), SF_OK, "%s", sf_loader_errmsg(l));
            free(part.seen);
            cr_assert_eq(sf_loader_set_epoch(l, 1), SF_OK, "%s", sf_loader_errmsg(l));
            struct epoch_log e;
            cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
            cr_assert_eq(e.batches, sf_loader_epoch_batches(l));
            batches[rank] = e.batches;
            for (unsigned i = 0; i < 130; i++) {
                cr_assert(seen[i] + e.seen[i] <= 1, "sample %u twice (world %d)", i, world);
                seen[i] += e.seen[i];
            }
            free(e.seen);
            sf_loader_close(l);
        }
        if (world == 1)
            for (unsigned i = 0; i < 130; i++)
                cr_assert_eq(seen[i], 1, "sample %u (one rank)", i);
        else
            cr_assert_eq(batches[0], batches[1]);
        free(seen);
    }
}

Test(loader, unindexed_ranks_resume_mid_epoch_with_pads_and_drops)
{
    const unsigned n = misestimated_dataset();
    unsigned pads = 0, drops = 0;
    for (int rank = 0; rank < 2; rank++) {
        struct sf_loader_options o;
        estimated_options(&o, shards_src, 1, rank, 2, SF_EPOCH_PAD, 20);
        o.batch_size = 8;
        struct sf_loader *l = open_loader(&o);
        uint64_t total = sf_loader_epoch_batches(l);
        cr_assert_geq(total, 3u);
        struct epoch_log head, tail;
        cr_assert_eq(run_epoch(l, &head, (unsigned)total - 2), SF_OK, "%s", sf_loader_errmsg(l));
        unsigned char state[SF_LOADER_STATE_BYTES];
        cr_assert_eq(sf_loader_state_save(l, state, sizeof(state)), SF_OK);
        cr_assert_eq(run_epoch(l, &tail, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
        struct sf_loader_stats s;
        sf_loader_get_stats(l, &s);
        pads += head.pads + tail.pads;
        drops += (unsigned)s.dropped_samples;
        l = reopen_from_state(l, &o, state);
        struct epoch_log again;
        cr_assert_eq(run_epoch(l, &again, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
        cr_assert_eq(again.batches, 2u);
        cr_assert_eq(again.pads, tail.pads, "rank %d", rank);
        cr_assert_eq(again.digest, tail.digest, "rank %d: resumed batches differ", rank);
        for (unsigned i = 0; i < n; i++)
            cr_assert_leq(head.seen[i] + again.seen[i], 1, "rank %d sample %u", rank, i);
        free(head.seen);
        free(tail.seen);
        free(again.seen);
        sf_loader_close(l);
    }
    cr_assert_gt(pads, 0u);
    cr_assert_gt(drops, 0u);
}

/* Folders <tmp>/a/ (samples 0..19, small) and <tmp>/b/ (20..29, big up to
 * b_big_to) packed as one shard each, with their index.json; a_dst/b_dst get
 * the folders (800 bytes), a/b the shard paths (900 bytes). */
static void two_folders(unsigned b_big_to, char *a_dst, char *b_dst, char *a, char *b)
{
    loader_tmpdir();
    char a_src[700], b_src[700];
    snprintf(a_src, sizeof(a_src), "%s/asrc", tmp);
    snprintf(b_src, sizeof(b_src), "%s/bsrc", tmp);
    make_sized(a_src, 0, 20, 0, 0);
    make_sized(b_src, 20, 30, 0, b_big_to);
    snprintf(a_dst, 800, "%s/a/", tmp);
    snprintf(b_dst, 800, "%s/b/", tmp);
    pack(a_src, a_dst, 64 << 20, NULL);
    pack(b_src, b_dst, 64 << 20, NULL);
    n_samples = 30;
    snprintf(a, 900, "%sshard-000000.tar", a_dst);
    snprintf(b, 900, "%sshard-000000.tar", b_dst);
}

Test(loader, unindexed_one_shard_per_rank_pads_by_reading_it_again)
{
    /* Two shards, one per rank. The first (the probe) holds 20 small
     * samples; the second 10 big ones, estimated at many times that. With
     * PAD every rank delivers the big shard's estimate: both read their only
     * shard several times over. With DROP the big shard's rank pads to 20. */
    char small_dst[800], big_dst[800], a[900], b[900];
    two_folders(30, small_dst, big_dst, a, b);
    remove_index(small_dst);
    remove_index(big_dst);
    const char *src[] = {a, b};
    for (int policy = SF_EPOCH_PAD; policy <= SF_EPOCH_DROP; policy++) {
        unsigned batches[2], images[2];
        unsigned char *seen = calloc(30, 1);
        for (int rank = 0; rank < 2; rank++) {
            struct sf_loader_options o;
            estimated_options(&o, src, 2, rank, 2, policy, 8);
            struct epoch_log e;
            struct sf_loader *l = open_and_run_epoch(&o, &e);
            batches[rank] = e.batches;
            images[rank] = e.images;
            cr_assert_eq(e.batches, sf_loader_epoch_batches(l));
            struct sf_loader_stats s;
            sf_loader_get_stats(l, &s);
            cr_assert_eq(s.pad_samples, e.pads);
            cr_assert_eq(s.dropped_samples, 0u);
            unsigned real = e.images - e.pads;
            cr_assert(real == 20 || real == 10, "rank %d read %u real samples", rank, real);
            for (unsigned i = 0; i < 30; i++) {
                cr_assert(seen[i] + e.seen[i] <= 1, "sample %u twice", i);
                seen[i] += e.seen[i];
            }
            if (policy == SF_EPOCH_PAD)
                cr_assert_gt(e.pads, real, "the only shard is read again more than once");
            free(e.seen);
            sf_loader_close(l);
        }
        for (unsigned i = 0; i < 30; i++)
            cr_assert_eq(seen[i], 1, "sample %u (policy %d)", i, policy);
        cr_assert_eq(batches[0], batches[1]);
        cr_assert_eq(images[0], images[1]);
        free(seen);
    }
}

/* One epoch of l to its end, each of the n samples exactly once; closes l. */
static void epoch_once_each_then_close(struct sf_loader *l, unsigned n)
{
    struct epoch_log e;
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(e.seen[i], 1, "sample %u", i);
    free(e.seen);
    sf_loader_close(l);
}

Test(loader, an_index_json_counts_only_the_shards_beside_it)
{
    /* Two folders, each with its index.json, whose shards have the same
     * name. The first folder's index does not describe the second's shard:
     * taking its count (20 for a shard of 10) would fail mid-epoch, or with
     * a larger real count silently cut the shard. */
    char a_dst[800], b_dst[800], a[900], b[900];
    two_folders(0, a_dst, b_dst, a, b);
    const char *src[] = {a, b};
    struct sf_loader_options o;
    base_options(&o, src, 2);
    struct sf_loader *l = open_loader(&o);
    epoch_once_each_then_close(l, 30);
}

Test(loader, unindexed_ranks_with_drop_last_deliver_full_batches_and_close_every_shard)
{
    local_dataset(230, 12 << 10, -1);
    remove_index(shards);
    unsigned batches[2];
    for (int rank = 0; rank < 2; rank++) {
        struct sf_loader_options o;
        estimated_options(&o, shards_src, 1, rank, 2, SF_EPOCH_PAD, 0);
        o.drop_last = 1;
        struct epoch_log e;
        struct sf_loader *l = open_and_run_epoch(&o, &e);
        batches[rank] = e.batches;
        cr_assert_eq(e.batches, sf_loader_epoch_batches(l));
        cr_assert_eq(e.images, e.batches * 16u, "only full batches");
        cr_assert_eq(shards_open_after_settling(l), 0u, "rank %d: shards still open", rank);
        free(e.seen);
        sf_loader_close(l);
    }
    cr_assert_eq(batches[0], batches[1]);
}

/* Opens loaders over shards without samples, one after another, and asks
 * each for a batch: the end of the (empty) epoch must come. */
static void *open_empty_epochs(void *arg)
{
    const char *const *src = arg;
    for (int i = 0; i < 150; i++) {
        struct sf_loader_options o;
        base_options(&o, src, 1);
        o.decode_threads = 1;
        struct sf_loader *l = NULL;
        if (sf_loader_open(&o, &l, NULL, 0) != SF_OK)
            return (void *)1;
        struct sf_batch b;
        sf_status st = sf_loader_next(l, &b);
        sf_loader_close(l);
        if (st != SF_END_OF_EPOCH)
            return (void *)2;
    }
    return NULL;
}

Test(loader, an_epoch_the_reader_ends_during_open_stays_ended)
{
    /* The reader may read a small unindexed stream to its end before
     * sf_loader_open returns; open must not then reset the epoch's size to
     * "unknown" (the consumer would wait forever). Loaders opened from
     * several threads at once make that order likely. */
    loader_tmpdir();
    static unsigned char zeros[10240];
    cr_assert(test_write_file(tmp, "a.tar", zeros, sizeof(zeros)) == 0);
    snprintf(shards, sizeof(shards), "%s/", tmp);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        cr_assert(pthread_create(&th[i], NULL, open_empty_epochs, (void *)shards_src) == 0);
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        cr_assert_null(r, "thread %d: %s", i, r == (void *)1 ? "open failed" : "no end of epoch");
    }
}

Test(loader, an_index_json_does_not_count_the_shards_of_a_subfolder)
{
    /* A listed folder holds shards and their index.json, and a subfolder
     * more shards of the same names (packed on their own: a validation
     * split, an older copy). Entries are matched by file name: taking the
     * folder's entry for the subfolder's shard of the same name refused the
     * open (its size differs: "the index is stale"), or with the same size
     * gave it another shard's count. Such shards run on estimates; an index
     * `shardfeed index` wrote over the subfolder too (other names) counts. */
    loader_tmpdir();
    char a_src[700], b_src[700], a_dst[800], b_dst[800];
    snprintf(a_src, sizeof(a_src), "%s/asrc", tmp);
    snprintf(b_src, sizeof(b_src), "%s/bsrc", tmp);
    make_sized(a_src, 0, 20, 0, 0);
    make_sized(b_src, 20, 30, 0, 0);
    snprintf(a_dst, sizeof(a_dst), "%s/a/", tmp);
    snprintf(b_dst, sizeof(b_dst), "%s/a/sub/", tmp);
    pack(a_src, a_dst, 64 << 20, NULL);
    pack(b_src, b_dst, 64 << 20, NULL);
    n_samples = 30;
    const char *src[] = {a_dst};
    struct sf_loader_options o;
    base_options(&o, src, 1);
    struct sf_loader *l = NULL;
    char err[1024] = "";
    cr_assert_eq(sf_loader_open(&o, &l, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_eq(sf_loader_shard_count(l), 2u);
    epoch_once_each_then_close(l, 30);

    char from[900], to[900];
    snprintf(from, sizeof(from), "%sshard-000000.tar", b_dst);
    snprintf(to, sizeof(to), "%sother.tar", b_dst);
    cr_assert(rename(from, to) == 0);
    char out[4096];
    const char *index[] = {SF_CLI_BIN, "index", a_dst, NULL};
    cr_assert_eq(run_cli(index, out, sizeof(out)), 0, "%s", out);
    l = open_loader(&o);
    cr_expect_eq(sf_loader_epoch_size_known(l), 1, "the nested index.json gives exact counts");
    epoch_once_each_then_close(l, 30);
}
