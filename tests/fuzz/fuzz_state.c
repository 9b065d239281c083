/* A saved sampler state as sf_loader_state_restore() hands it to the
 * sampler (src/sampler.c, sf__sampler_state_restore_within with the bound
 * the loader passes: what the shards can hold). Random bytes would all fail
 * the checksum, so the input changes a genuine state instead:
 *
 *   byte 0   configuration (low 2 bits): exact PAD on 2 ranks, exact UNEVEN
 *            by samples, estimated on one stream (open-ended), estimated
 *            PAD on 2 ranks; bit 6: the state's length is the mask's
 *            (truncated or oversized); bit 7: keep the checksum as it is
 *   byte 1   the epoch of the genuine state
 *   byte 2   its position (modulo the epoch size + 1)
 *   byte 3   open-ended only: samples read before the save (its length,
 *            final when odd)
 *   rest     XORed into the state, from its first byte
 *
 * then sealed again (bit 7 clear). Invariant: a refusal has a message and
 * leaves the sampler where it was (it delivers what an untouched twin
 * delivers); a restore delivers the rest of the epoch from the saved
 * position, each item a sample of the counts, the same as a second sampler
 * restored from the same state. */
#include "fuzz.h"
#include "shardfeed.h"
#include "src/sampler.h"
#include "tests/support/state_seal.h"

#define N_SHARDS    4
#define MAX_SAMPLES 4096 /* the bound an open-ended restore is given */
#define MAX_STEPS   (4 * MAX_SAMPLES)

static const uint64_t exact_counts[N_SHARDS] = {5, 0, 7, 3};
static const uint64_t est_counts[N_SHARDS] = {5, 1, 7, 3};

static struct sf_sampler *make(unsigned cfg)
{
    struct sf_sampler_options o;
    sf_sampler_options_init_default(&o);
    o.seed = 0x5eed;
    o.rank = 0;
    o.world_size = 1;
    o.shuffle_buffer = 3;
    switch (cfg) {
    case 0:
        o.rank = 1;
        o.world_size = 2;
        o.shuffle_buffer = 4;
        o.initial_fill = 2;
        break;
    case 1:
        o.policy = SF_EPOCH_UNEVEN;
        o.partition = SF_PARTITION_SAMPLES;
        o.shuffle_buffer = 1;
        break;
    case 2: o.estimated_counts = 1; break;
    default:
        o.estimated_counts = 1;
        o.world_size = 2;
        o.shuffle_buffer = 2;
        break;
    }
    struct sf_sampler *s = NULL;
    char err[256];
    sf_status st =
        sf_sampler_new(&o, cfg >= 2 ? est_counts : exact_counts, N_SHARDS, &s, err, sizeof err);
    fz_check(st == SF_OK, "sampler %u: %s", cfg, err);
    return s;
}

/* Runs s to the end of its epoch (at most MAX_STEPS items), an open-ended
 * stream told `length` reads (final). Returns a digest of what came out;
 * *n: how many items. */
static uint64_t drain(struct sf_sampler *s, unsigned cfg, uint64_t length, uint64_t *n)
{
    struct sf_sampler_info info;
    sf_sampler_get_info(s, &info);
    uint64_t h = 0, first = info.position;
    struct sf_sample_ref r;
    *n = 0;
    for (int steps = 0; steps < MAX_STEPS; steps++) {
        int got = sf_sampler_next(s, &r);
        if (got == SF_SAMPLER_WAIT) {
            uint64_t read, buf_len;
            const uint64_t *buf;
            sf__sampler_window(s, &read, &buf, &buf_len);
            /* More than the stream's length was taken as read (a state saved
             * further): it is final there. */
            fz_check(sf_sampler_feed(s, read < length ? length : read, 1) == SF_OK, "feed %llu",
                     (unsigned long long)length);
            continue;
        }
        if (got == 0)
            break;
        fz_check(got == 1, "next returned %d", got);
        fz_check(r.position == first + *n, "position %llu after %llu from %llu",
                 (unsigned long long)r.position, (unsigned long long)*n, (unsigned long long)first);
        if (cfg < 2)
            fz_check(r.shard < N_SHARDS && r.sample < exact_counts[r.shard],
                     "sample %llu of shard %llu", (unsigned long long)r.sample,
                     (unsigned long long)r.shard);
        else
            fz_check(r.shard == SF_SAMPLE_UNRESOLVED, "estimated item resolved");
        h = sf__absorb64(h, r.shard ^ (r.sample << 20) ^ (r.read_index << 40) ^ r.flags);
        (*n)++;
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    unsigned flags = fz_u8(&f), cfg = flags & 3;
    uint64_t epoch = fz_u8(&f), at = fz_u8(&f), reads = fz_u8(&f);
    struct sf_sampler *s = make(cfg), *twin = make(cfg), *again = make(cfg);

    /* The genuine state. */
    sf_sampler_set_epoch(s, epoch);
    uint64_t length = reads / 2 + 1; /* open-ended: its real length */
    if (cfg == 2 && (reads & 1))
        fz_check(sf_sampler_feed(s, length, 1) == SF_OK, "feed");
    uint64_t size_now = sf_sampler_epoch_size(s);
    uint64_t position = at % (size_now + 1);
    size_t state_len = SF_SAMPLER_STATE_BYTES;
    if ((flags & 0x40) && f.n != SF_SAMPLER_STATE_BYTES)
        state_len = f.n;
    size_t room = state_len > SF_SAMPLER_STATE_BYTES ? state_len : SF_SAMPLER_STATE_BYTES;
    unsigned char *state = calloc(1, room);
    fz_check(state != NULL, "out of memory");
    fz_check(sf_sampler_state_save_at(s, position, state, SF_SAMPLER_STATE_BYTES) == SF_OK,
             "save at %llu of %llu", (unsigned long long)position, (unsigned long long)size_now);
    for (size_t i = 0; i < f.n && i < state_len; i++)
        state[i] ^= f.p[i];
    if (!(flags & 0x80) && state_len == SF_SAMPLER_STATE_BYTES)
        seal_sampler_state(state);
    uint64_t saved_position = sf__get_le64(state + 32);
    uint64_t saved_epoch = sf__get_le64(state + 24);

    /* Where the sampler stands before: a few items into epoch 7. */
    sf_sampler_set_epoch(s, 7);
    sf_sampler_set_epoch(twin, 7);
    struct sf_sample_ref r;
    for (int i = 0; i < 2; i++) {
        if (sf_sampler_next(s, &r) == SF_SAMPLER_WAIT)
            sf_sampler_feed(s, 64, 0);
        if (sf_sampler_next(twin, &r) == SF_SAMPLER_WAIT)
            sf_sampler_feed(twin, 64, 0);
    }
    struct sf_sampler_info before, after;
    sf_sampler_get_info(s, &before);

    sf_status st = sf__sampler_state_restore_within(s, state, state_len, MAX_SAMPLES,
                                                    "the fuzz shards can hold");
    uint64_t n1, n2;
    if (st != SF_OK) {
        fz_check(sf_sampler_errmsg(s)[0] != '\0', "refusal %d without a message", (int)st);
        sf_sampler_get_info(s, &after);
        fz_check(after.epoch == before.epoch && after.position == before.position,
                 "a refused restore moved the sampler: epoch %llu position %llu",
                 (unsigned long long)after.epoch, (unsigned long long)after.position);
        uint64_t h1 = drain(s, cfg, 64, &n1), h2 = drain(twin, cfg, 64, &n2);
        fz_check(h1 == h2 && n1 == n2, "a refused restore changed what follows");
    } else {
        sf_sampler_get_info(s, &after);
        fz_check(after.epoch == saved_epoch && after.position == saved_position,
                 "restored to epoch %llu position %llu, the state says %llu, %llu",
                 (unsigned long long)after.epoch, (unsigned long long)after.position,
                 (unsigned long long)saved_epoch, (unsigned long long)saved_position);
        fz_check(cfg != 2 || saved_position <= MAX_SAMPLES, "past the bound: %llu",
                 (unsigned long long)saved_position);
        fz_check(sf__sampler_state_restore_within(again, state, state_len, MAX_SAMPLES, NULL) ==
                     SF_OK,
                 "a second sampler refuses what the first took: %s", sf_sampler_errmsg(again));
        uint64_t feed = saved_position > length ? saved_position : length;
        uint64_t h1 = drain(s, cfg, feed, &n1), h2 = drain(again, cfg, feed, &n2);
        fz_check(h1 == h2 && n1 == n2, "two restores of one state deliver differently");
        if (after.size_known)
            fz_check(saved_position + n1 == after.epoch_size,
                     "from %llu, %llu items of an epoch of %llu",
                     (unsigned long long)saved_position, (unsigned long long)n1,
                     (unsigned long long)after.epoch_size);
    }
    free(state);
    sf_sampler_destroy(s);
    sf_sampler_destroy(twin);
    sf_sampler_destroy(again);
    return 0;
}
