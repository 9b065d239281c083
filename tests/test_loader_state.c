/* The loader's saved position: a state saved mid-epoch restores to the same
 * remaining batches; a damaged, crafted, foreign or cut state is refused
 * naming what is wrong, and the loader then resumes as if nothing happened.
 * Suite `loader` (test_loader.c, which also holds a state saved at an
 * epoch's end, beside the read-ahead). */
#include "loader_fixture.h"
#include "support/state_seal.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What the state tests save 3 batches into: 130 local samples in shards of
 * 32 KiB, read at epoch 3. */
static void epoch_3_options(struct sf_loader_options *o)
{
    local_options(o, 130, 32 << 10);
    o->sampler.epoch = 3;
}

Test(loader, state_restore_gives_the_same_remaining_batches)
{
    struct sf_loader_options o;
    epoch_3_options(&o);
    unsigned char state[SF_LOADER_STATE_BYTES];
    struct epoch_log head, tail;
    struct sf_loader *l = open_and_save_mid_epoch(&o, 3, state, &head, &tail);
    cr_assert_eq(head.images + tail.images, 130u);
    sf_loader_close(l);

    /* A new loader, opened at epoch 0, resumes at the saved point. */
    o.sampler.epoch = 0;
    l = open_loader(&o);
    cr_assert_eq(sf_loader_state_restore(l, state, sizeof(state)), SF_OK);
    /* A training loop's set_epoch of the restored epoch keeps the position. */
    cr_assert_eq(sf_loader_set_epoch(l, 3), SF_OK);
    struct epoch_log again;
    cr_assert_eq(run_epoch(l, &again, 0), SF_END_OF_EPOCH);
    cr_assert_eq(again.images, tail.images);
    cr_assert_eq(again.digest, tail.digest, "resumed batches differ");
    /* Once a batch is delivered, set_epoch restarts the epoch as usual. */
    free(again.seen);
    cr_assert_eq(sf_loader_set_epoch(l, 3), SF_OK);
    cr_assert_eq(run_epoch(l, &again, 0), SF_END_OF_EPOCH);
    cr_assert_eq(again.images, 130u);
    /* A corrupted state is refused. */
    state[40] ^= 1;
    cr_assert_eq(sf_loader_state_restore(l, state, sizeof(state)), SF_ERR_CORRUPT);
    free(head.seen);
    free(tail.seen);
    free(again.seen);
    sf_loader_close(l);

    /* A different batch size is refused, naming it. */
    state[40] ^= 1;
    o.batch_size = 8;
    l = open_loader(&o);
    cr_assert_eq(sf_loader_state_restore(l, state, sizeof(state)), SF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(sf_loader_errmsg(l), "batch_size"), "%s", sf_loader_errmsg(l));
    sf_loader_close(l);
}

/* The loader's position and epoch are saved twice, in its header and in its
 * sampler state, and a saved position is where a batch starts (or the
 * epoch's end). A state made otherwise (sealed again: the checksums catch
 * damage, not intent) was accepted: the reader started at one place, the
 * batches at another, and the samples of a batch cut in the middle were
 * never delivered. Each is refused naming both values, and the loader then
 * resumes from the genuine state as if nothing happened. */
Test(loader, a_state_made_inconsistent_or_cutting_a_batch_is_refused)
{
    struct sf_loader_options o;
    epoch_3_options(&o);
    unsigned char state[SF_LOADER_STATE_BYTES], bad[SF_LOADER_STATE_BYTES];
    struct epoch_log head, tail;
    struct sf_loader *l = open_and_save_mid_epoch(&o, 3, state, &head, &tail);
    uint64_t at = sf__get_le64(state + SEAL_LOADER_POSITION), B = o.batch_size;
    cr_assert_eq(at, 3 * B);

    const struct {
        int field;
        uint64_t value;
        sf_status want;
        const char *named;
    } cases[] = {
        {SEAL_LOADER_POSITION, 4 * B, SF_ERR_CORRUPT, "inconsistent"},
        {SEAL_SAMPLER_POSITION, 2 * B, SF_ERR_CORRUPT, "inconsistent"},
        {SEAL_LOADER_EPOCH, 4, SF_ERR_CORRUPT,
         "position 48 of epoch 4, its sampler state says position 48 of epoch 3"},
        {-1, 3 * B + 1, SF_ERR_INVALID_ARGUMENT, "position 49 is neither where a batch starts"},
    };
    cr_assert_eq(B, 16u, "the messages above assume batches of 16");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, state, sizeof(bad));
        if (cases[i].field < 0) {
            sf__put_le64(bad + SEAL_LOADER_POSITION, cases[i].value);
            sf__put_le64(bad + SEAL_SAMPLER_POSITION, cases[i].value);
        } else {
            sf__put_le64(bad + cases[i].field, cases[i].value);
        }
        seal_loader_state(bad);
        cr_assert_eq(sf_loader_state_restore(l, bad, sizeof(bad)), cases[i].want, "case %zu: %s", i,
                     sf_loader_errmsg(l));
        cr_assert(strstr(sf_loader_errmsg(l), cases[i].named), "case %zu: %s", i,
                  sf_loader_errmsg(l));
    }
    /* Sealed as it was, the state is the genuine one. */
    memcpy(bad, state, sizeof(bad));
    seal_loader_state(bad);
    cr_assert_eq(memcmp(bad, state, sizeof(bad)), 0, "the test's seal is not the loader's");
    expect_resumes_to_tail(l, state, &head, &tail);
}

/* A state of another version (a newer library's) is refused as such,
 * naming both versions, and a cut one naming its length: both were "not a
 * loader state (bad magic or checksum)", SF_ERR_CORRUPT, like a damaged one.
 * Either leaves the loader where it was. */
Test(loader, a_state_of_another_version_or_length_is_refused_naming_it)
{
    struct sf_loader_options o;
    local_options(&o, 40, 32 << 10);
    struct sf_loader *l = open_loader(&o);
    struct epoch_log head;
    cr_assert_eq(run_epoch(l, &head, 1), SF_OK);
    unsigned char state[SF_LOADER_STATE_BYTES];
    cr_assert_eq(sf_loader_state_save(l, state, sizeof(state)), SF_OK);
    state[4] = 2; /* version 2; "SFLD" kept */
    cr_expect_eq(sf_loader_state_restore(l, state, sizeof(state)), SF_ERR_UNSUPPORTED);
    cr_expect(strstr(sf_loader_errmsg(l), "version 2") && strstr(sf_loader_errmsg(l), "1"), "%s",
              sf_loader_errmsg(l));
    state[4] = 1;
    cr_expect_eq(sf_loader_state_restore(l, state, sizeof(state) - 8), SF_ERR_CORRUPT);
    cr_expect(strstr(sf_loader_errmsg(l), "160 bytes") && strstr(sf_loader_errmsg(l), "168"), "%s",
              sf_loader_errmsg(l));
    struct epoch_log tail;
    cr_assert_eq(run_epoch(l, &tail, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_expect_eq(head.images + tail.images, 40u);
    free(head.seen);
    free(tail.seen);
    sf_loader_close(l);
}
