/*
 * The sampler's promises (docs/sampling.md) checked on thousands of random
 * configurations, seeded so every run checks the same ones: every stream of
 * a job gets the same epoch size (so the same batch count for any batch
 * size and drop_last) under PAD and DROP; with exact counts every real
 * sample is delivered exactly once (at most once under DROP), pads are
 * flagged, come after the real reads and stay within the documented bound;
 * the plan lists exactly the real reads; the buffer bound holds; and a
 * state saved at any position (0, inside, the last batch, the end) restores
 * into a fresh sampler that continues exactly like the uninterrupted one.
 * On estimated counts: fixed sizes equal across streams, open-ended streams
 * deliver each fed read index once and resume anywhere. Suite `sampler`.
 */
#include "sampler_fixture.h"

#include <criterion/criterion.h>

#include "shardfeed_sampling.h"
#include "src/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cr_assert_fail() on failure only: Criterion reports every assertion it
 * evaluates to its runner, too slow for millions of checks. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            cr_assert_fail("check failed: " #cond ": " __VA_ARGS__);                               \
    } while (0)

/* The case generator: its own splitmix64, independent of the sampler's. */
static uint64_t gen_state;

static uint64_t gen(uint64_t n)
{
    struct sf__rng r = {gen_state};
    uint64_t v = sf__rng_below(&r, n);
    gen_state = r.state;
    return v;
}

/* A random configuration; *desc receives it in words for failure messages. */
struct pcase {
    uint64_t counts[50];
    size_t n;
    struct cfg c; /* rank and worker are set per stream */
    uint64_t batch;
    int drop_last;
    char desc[512];
};

static void random_case(struct pcase *p)
{
    memset(p, 0, sizeof *p);
    p->n = 1 + (size_t)gen(50);
    /* Shards of 0, 1, a few or many samples, all in one case. */
    for (size_t i = 0; i < p->n; i++) {
        switch (gen(6)) {
        case 0: p->counts[i] = 0; break;
        case 1: p->counts[i] = 1; break;
        case 2: p->counts[i] = 2 + gen(5); break;
        case 3: p->counts[i] = 1 + gen(40); break;
        default: p->counts[i] = gen(20); break;
        }
    }
    p->c.world = 1 + (int)gen(16);
    p->c.workers = gen(3) ? 1 : 1 + (unsigned)gen(3);
    p->c.seed = gen(4) ? gen(1000) : UINT64_MAX - gen(3);
    p->c.epoch = gen(4);
    switch (gen(4)) {
    case 0: p->c.buffer = 0; break;
    case 1: p->c.buffer = 1; break;
    default: p->c.buffer = 1 + gen(300); break;
    }
    uint64_t slots = p->c.buffer ? p->c.buffer : 1;
    p->c.fill = gen(2) ? 0 : gen(slots + 1);
    p->c.policy = (enum sf_epoch_policy)gen(3);
    p->c.partition = gen(4) ? SF_PARTITION_SHARDS : SF_PARTITION_SAMPLES;
    p->c.estimated = p->c.partition == SF_PARTITION_SHARDS && gen(4) == 0;
    p->batch = 1 + gen(300);
    p->drop_last = (int)gen(2);
    int len = snprintf(p->desc, sizeof p->desc,
                       "world %d workers %u seed %llu epoch %llu buffer %llu fill %llu policy %d "
                       "partition %d estimated %d batch %llu drop_last %d counts[%zu] =",
                       p->c.world, p->c.workers, (unsigned long long)p->c.seed,
                       (unsigned long long)p->c.epoch, (unsigned long long)p->c.buffer,
                       (unsigned long long)p->c.fill, (int)p->c.policy, (int)p->c.partition,
                       p->c.estimated, (unsigned long long)p->batch, p->drop_last, p->n);
    for (size_t i = 0; i < p->n && len > 0 && (size_t)len < sizeof p->desc; i++)
        len += snprintf(p->desc + len, sizeof p->desc - (size_t)len, " %llu",
                        (unsigned long long)p->counts[i]);
}

static uint64_t batches_of(uint64_t size, uint64_t batch, int drop_last)
{
    return drop_last ? size / batch : (size + batch - 1) / batch;
}

/* Positions a resume is tried at: 0, the start of the last batch, its
 * last item, the end of the epoch and one random place. */
static size_t resume_points(uint64_t size, uint64_t batch, uint64_t *pts)
{
    size_t n = 0;
    pts[n++] = 0;
    pts[n++] = size;
    if (size > 0) {
        pts[n++] = (size - 1) / batch * batch;
        pts[n++] = size - 1;
        pts[n++] = gen(size + 1);
    }
    return n;
}

/* What a loader resuming on estimated counts reads from a restored sampler
 * (sf__sampler_window): read index k below `read` was delivered before the
 * restore point exactly when it is not in the buffer. `delivered` holds
 * the read indices of positions 0..pos-1. */
static void check_window(const struct pcase *p, const struct sf_sampler *s,
                         uint64_t (*delivered)(const void *, uint64_t), const void *arg,
                         uint64_t pos)
{
    uint64_t read = 0, len = 0;
    const uint64_t *buf = NULL;
    sf__sampler_window(s, &read, &buf, &len);
    CHECK(len <= read && read - len == pos, "%s: pos %llu: read %llu, buffer %llu", p->desc,
          (unsigned long long)pos, (unsigned long long)read, (unsigned long long)len);
    unsigned char *in = calloc(read + 1, 1);
    CHECK(in != NULL, "");
    for (uint64_t i = 0; i < len; i++) {
        CHECK(buf[i] < read && !in[buf[i]], "%s: pos %llu: buffer entry %llu", p->desc,
              (unsigned long long)pos, (unsigned long long)buf[i]);
        in[buf[i]] = 1;
    }
    for (uint64_t i = 0; i < pos; i++) {
        uint64_t k = delivered(arg, i);
        CHECK(k < read && !in[k], "%s: pos %llu: delivered read index %llu still in the window",
              p->desc, (unsigned long long)pos, (unsigned long long)k);
        in[k] = 2;
    }
    free(in);
}

static uint64_t item_read_index(const void *arg, uint64_t i)
{
    return ((const struct run *)arg)->items[i].read_index;
}

static uint64_t plain_read_index(const void *arg, uint64_t i)
{
    return ((const uint64_t *)arg)[i];
}

/* A sampler created in another epoch, restored from the state of `from`
 * saved at `pos` (both ways: stepping there, and save_at), continues with
 * exactly items[pos..size). */
static void check_resume(const struct pcase *p, const struct sf_sampler_options *o,
                         const struct run *all, uint64_t pos)
{
    unsigned char st[SF_SAMPLER_STATE_BYTES], st_at[SF_SAMPLER_STATE_BYTES];
    struct sf_sampler *a = make(o, p->counts, p->n);
    struct sf_sample_ref it;
    for (uint64_t i = 0; i < pos; i++)
        CHECK((sf_sampler_next(a, &it)) == (1), "%s: pos %llu", p->desc, (unsigned long long)pos);
    CHECK((sf_sampler_state_save(a, st, sizeof st)) == (SF_OK), "");
    /* A loader running ahead saves its user's position. */
    while (sf_sampler_next(a, &it) == 1) {
    }
    CHECK((sf_sampler_state_save_at(a, pos, st_at, sizeof st_at)) == (SF_OK), "");
    CHECK((memcmp(st, st_at, sizeof st)) == (0), "%s: save_at(%llu) differs from save", p->desc,
          (unsigned long long)pos);
    sf_sampler_destroy(a);

    struct sf_sampler_options o2 = *o;
    o2.epoch = o->epoch + 1 + gen(3);
    struct sf_sampler *b = make(&o2, p->counts, p->n);
    CHECK((sf_sampler_state_restore(b, st, sizeof st)) == (SF_OK), "%s: pos %llu: %s", p->desc,
          (unsigned long long)pos, sf_sampler_errmsg(b));
    struct sf_sampler_info info;
    sf_sampler_get_info(b, &info);
    CHECK((info.position) == (pos), "");
    CHECK((info.epoch) == (o->epoch), "");
    check_window(p, b, item_read_index, all, pos);
    uint64_t i = pos;
    while (sf_sampler_next(b, &it) == 1) {
        CHECK((i) < (all->n), "%s: resumed at %llu, too many items", p->desc,
              (unsigned long long)pos);
        CHECK(same_item(&it, &all->items[i]), "%s: resumed at %llu, item %llu differs", p->desc,
              (unsigned long long)pos, (unsigned long long)i);
        i++;
    }
    CHECK((i) == (all->n), "%s: resumed at %llu ended at %llu of %zu", p->desc,
          (unsigned long long)pos, (unsigned long long)i, all->n);
    sf_sampler_destroy(b);
}

/* Whether sf_sampler_new must refuse the case, as documented. */
static int must_refuse(const struct pcase *p)
{
    uint64_t total = 0, nonempty = 0;
    for (size_t i = 0; i < p->n; i++) {
        total += p->counts[i];
        nonempty += p->counts[i] > 0;
    }
    uint64_t streams = (uint64_t)p->c.world * p->c.workers;
    return total == 0 || total < streams ||
           (p->c.partition == SF_PARTITION_SHARDS && nonempty < streams);
}

/* The sampler of stream u of case p (rank u / workers, worker u % workers):
 * its options into o (a resume makes more with them), its info into info. */
static struct sf_sampler *open_stream(const struct pcase *p, unsigned u,
                                      struct sf_sampler_options *o, struct sf_sampler_info *info)
{
    struct cfg c = p->c;
    c.rank = (int)(u / p->c.workers);
    c.worker = u % p->c.workers;
    *o = opts(c);
    struct sf_sampler *s = make(o, p->counts, p->n);
    sf_sampler_get_info(s, info);
    return s;
}

/* One exact-count case: every stream of the job, drained and checked. */
static void check_exact(const struct pcase *p)
{
    uint64_t prefix[51] = {0}, max_count = 0;
    for (size_t i = 0; i < p->n; i++) {
        prefix[i + 1] = prefix[i] + p->counts[i];
        if (p->counts[i] > max_count)
            max_count = p->counts[i];
    }
    uint64_t total = prefix[p->n];
    unsigned char *seen = calloc(total, 1);
    CHECK((seen) != NULL, "");
    unsigned streams = (unsigned)p->c.world * p->c.workers;
    uint64_t size0 = 0, real_sum = 0, size_sum = 0, min_share = UINT64_MAX, max_share = 0;
    uint64_t dropped_sum = 0;
    unsigned resumed = (unsigned)gen(streams);
    for (unsigned u = 0; u < streams; u++) {
        struct sf_sampler_options o;
        struct sf_sampler_info info;
        struct sf_sampler *s = open_stream(p, u, &o, &info);
        size_t plan_n = 0;
        const struct sf_shard_range *plan = sf_sampler_plan(s, &plan_n);
        uint64_t planned = 0;
        for (size_t i = 0; i < plan_n; i++)
            planned += plan[i].end - plan[i].begin;
        struct run r = drain(s);
        uint64_t size = info.epoch_size, real = size - info.pad_count;
        CHECK((r.n) == (size), "%s: stream %u delivered %zu of %llu", p->desc, u, r.n,
              (unsigned long long)size);
        CHECK((planned) == (real), "%s: stream %u plans %llu samples, reads %llu", p->desc, u,
              (unsigned long long)planned, (unsigned long long)real);
        uint64_t share = real + info.dropped_count;
        min_share = share < min_share ? share : min_share;
        max_share = share > max_share ? share : max_share;
        if (u == 0)
            size0 = size;
        if (p->c.policy != SF_EPOCH_UNEVEN)
            CHECK((batches_of(size, p->batch, p->drop_last)) ==
                      (batches_of(size0, p->batch, p->drop_last)),
                  "%s: stream %u has %llu samples, stream 0 %llu", p->desc, u,
                  (unsigned long long)size, (unsigned long long)size0);
        size_sum += size;
        real_sum += real;
        dropped_sum += info.dropped_count;

        /* read indices: a permutation of 0..size-1; pads exactly those >= real. */
        unsigned char *ri = calloc(size ? size : 1, 1);
        CHECK((ri) != NULL, "");
        uint64_t slots = info.shuffle_buffer;
        for (size_t i = 0; i < r.n; i++) {
            const struct sf_sample_ref *it = &r.items[i];
            CHECK((it->position) == (i), "");
            CHECK((it->read_index) < (size), "");
            CHECK((ri[it->read_index]) == (0), "%s: read index twice", p->desc);
            ri[it->read_index] = 1;
            CHECK((it->read_index) <= (i + slots - 1), "%s: buffer bound", p->desc);
            CHECK((it->flags == SF_SAMPLE_PAD) == (it->read_index >= real),
                  "%s: stream %u item %zu read %llu flags %u real %llu", p->desc, u, i,
                  (unsigned long long)it->read_index, it->flags, (unsigned long long)real);
            CHECK((it->shard) < (p->n), "");
            CHECK((it->sample) < (p->counts[it->shard]), "%s: sample out of its shard", p->desc);
            /* The item is the plan's read_index-th sample (a pad, some real one). */
            uint64_t k = it->read_index, off = 0;
            if (k < real) {
                size_t j = 0;
                while (j < plan_n && off + (plan[j].end - plan[j].begin) <= k) {
                    off += plan[j].end - plan[j].begin;
                    j++;
                }
                CHECK((j) < (plan_n), "");
                CHECK((it->shard) == (plan[j].shard), "%s: read order is not the plan", p->desc);
                CHECK((it->sample) == (plan[j].begin + (k - off)), "");
                seen[prefix[it->shard] + it->sample]++;
            } else {
                int own = 0;
                for (size_t j = 0; j < plan_n && !own; j++)
                    own = plan[j].shard == it->shard && it->sample >= plan[j].begin &&
                          it->sample < plan[j].end;
                CHECK(own, "%s: stream %u pads with a sample it does not read", p->desc, u);
            }
        }
        free(ri);

        /* Resume in two streams of the job (the first and a random one):
         * each costs a replay, and every stream runs the same code. */
        if (u == 0 || u == resumed) {
            uint64_t pts[5];
            size_t np = resume_points(size, p->batch, pts);
            for (size_t i = 0; i < np; i++)
                check_resume(p, &o, &r, pts[i]);
        }
        free(r.items);
        sf_sampler_destroy(s);
    }

    for (uint64_t i = 0; i < total; i++)
        CHECK((seen[i]) <= (1), "%s: a sample delivered %u times", p->desc, seen[i]);
    CHECK((real_sum + dropped_sum) == (total), "%s", p->desc);
    if (p->c.policy != SF_EPOCH_DROP)
        CHECK((real_sum) == (total), "%s: samples missing", p->desc);
    /* Pads (or drops) per stream: the deal's imbalance, documented as at
     * most one shard's count (whole shards) or one sample (ranges). */
    uint64_t bound = p->c.partition == SF_PARTITION_SHARDS ? max_count : 1;
    CHECK((max_share - min_share) <= (bound), "%s: shares %llu..%llu", p->desc,
          (unsigned long long)min_share, (unsigned long long)max_share);
    if (p->c.policy == SF_EPOCH_PAD)
        CHECK((size_sum) == ((uint64_t)streams * max_share), "");
    if (p->c.policy == SF_EPOCH_DROP)
        CHECK((size_sum) == ((uint64_t)streams * min_share), "");
    free(seen);
}

/* Drains an open-ended sampler whose stream really holds `length` reads,
 * feeding random amounts from `fed`; checks each read index comes once and
 * was fed. Returns the read indices (free them); *n their number. */
static uint64_t *drain_open(const struct pcase *p, struct sf_sampler *s, uint64_t length,
                            uint64_t fed, uint64_t stop_after, size_t *n, uint64_t *fed_out)
{
    uint64_t *out = calloc(length + 1, sizeof *out);
    CHECK((out) != NULL, "");
    *n = 0;
    while (*n < stop_after) {
        struct sf_sample_ref it;
        int r = sf_sampler_next(s, &it);
        if (r == 0)
            break;
        if (r == SF_SAMPLER_WAIT) {
            CHECK((fed) < (length + 1), "%s: waits after the final length", p->desc);
            uint64_t more = 1 + gen(40);
            fed = length - fed < more ? length : fed + more;
            CHECK((sf_sampler_feed(s, fed, fed == length)) == (SF_OK), "%s", p->desc);
            continue;
        }
        CHECK((r) == (1), "");
        CHECK((it.read_index) < (fed), "%s: read index not fed yet", p->desc);
        CHECK((*n) < (length), "%s: more items than reads", p->desc);
        out[(*n)++] = it.read_index;
    }
    if (fed_out)
        *fed_out = fed;
    return out;
}

/* One estimated-count case: counts are estimates, the reader's real lengths
 * are random. */
static void check_estimated(const struct pcase *p)
{
    unsigned streams = (unsigned)p->c.world * p->c.workers;
    uint64_t size0 = 0;
    for (unsigned u = 0; u < streams; u++) {
        struct sf_sampler_options o;
        struct sf_sampler_info info;
        struct sf_sampler *s = open_stream(p, u, &o, &info);
        int open = streams == 1 || p->c.policy == SF_EPOCH_UNEVEN;
        CHECK((info.size_known) == (!open), "%s", p->desc);
        if (!open) {
            /* Fixed from the estimates, the same everywhere, never waits. */
            struct run r = drain(s);
            if (u == 0)
                size0 = info.epoch_size;
            CHECK((info.epoch_size) == (size0), "%s: stream %u", p->desc, u);
            CHECK((r.n) == (info.epoch_size), "");
            unsigned char *ri = calloc(r.n + 1, 1);
            CHECK((ri) != NULL, "");
            for (size_t i = 0; i < r.n; i++) {
                CHECK((r.items[i].shard) == (SF_SAMPLE_UNRESOLVED), "");
                CHECK((r.items[i].read_index) < (r.n), "");
                CHECK((ri[r.items[i].read_index]++) == (0), "%s", p->desc);
            }
            free(ri);
            uint64_t pts[5];
            size_t np = resume_points(r.n, p->batch, pts);
            for (size_t i = 0; i < np; i++)
                check_resume(p, &o, &r, pts[i]);
            free(r.items);
            sf_sampler_destroy(s);
            continue;
        }
        /* Open-ended: the real length, 0 to twice the estimate. */
        uint64_t length = gen(2 * info.epoch_size + 2);
        size_t n = 0;
        uint64_t *all = drain_open(p, s, length, 0, UINT64_MAX, &n, NULL);
        CHECK((n) == (length), "%s: delivered %zu of %llu", p->desc, n, (unsigned long long)length);
        unsigned char *ri = calloc(length + 1, 1);
        CHECK((ri) != NULL, "");
        for (size_t i = 0; i < n; i++)
            CHECK((ri[all[i]]++) == (0), "%s: read index twice", p->desc);
        free(ri);
        sf_sampler_destroy(s);

        /* Resume at random cut points, fed by other amounts. */
        uint64_t cuts[3] = {0, length, gen(length + 1)};
        for (size_t ci = 0; ci < 3; ci++) {
            uint64_t cut = cuts[ci], fed = 0;
            struct sf_sampler *a = make(&o, p->counts, p->n);
            size_t got = 0;
            free(drain_open(p, a, length, 0, cut, &got, &fed));
            CHECK((got) == (cut), "");
            unsigned char st[SF_SAMPLER_STATE_BYTES];
            CHECK((sf_sampler_state_save(a, st, sizeof st)) == (SF_OK), "");
            sf_sampler_destroy(a);
            struct sf_sampler *b = make(&o, p->counts, p->n);
            CHECK((sf_sampler_state_restore(b, st, sizeof st)) == (SF_OK), "%s: cut %llu: %s",
                  p->desc, (unsigned long long)cut, sf_sampler_errmsg(b));
            check_window(p, b, plain_read_index, all, cut);
            size_t m = 0;
            uint64_t *rest = drain_open(p, b, length, fed, UINT64_MAX, &m, NULL);
            CHECK((m) == (length - cut), "%s: cut %llu gave %zu", p->desc, (unsigned long long)cut,
                  m);
            for (size_t i = 0; i < m; i++)
                CHECK((rest[i]) == (all[cut + i]), "%s: cut %llu item %zu", p->desc,
                      (unsigned long long)cut, i);
            free(rest);
            sf_sampler_destroy(b);
        }
        free(all);
    }
}

Test(sampler, property_random_configurations_keep_every_promise)
{
    clear_dist_env();
    gen_state = 20261127;
    unsigned ran = 0, refused = 0;
    for (unsigned i = 0; i < 1200; i++) {
        struct pcase p;
        random_case(&p);
        struct sf_sampler_options o = opts(p.c);
        struct sf_sampler *s = NULL;
        char err[256] = "";
        sf_status st = sf_sampler_new(&o, p.counts, p.n, &s, err, sizeof err);
        if (must_refuse(&p)) {
            CHECK((st) == (SF_ERR_INVALID_ARGUMENT), "case %u: %s: accepted", i, p.desc);
            refused++;
            continue;
        }
        CHECK((st) == (SF_OK), "case %u: %s: %s", i, p.desc, err);
        sf_sampler_destroy(s);
        if (p.c.estimated)
            check_estimated(&p);
        else
            check_exact(&p);
        ran++;
    }
    /* The generator must exercise both sides. */
    CHECK((ran) > (400), "ran %u", ran);
    CHECK((refused) > (40), "refused %u", refused);
}

/*
 * The documented worst case on estimated counts (docs/sampling.md, "How much
 * is padded or dropped"): shard i really holds n_i samples in size_i bytes,
 * within a factor (1 + e) either way of the probe's b bytes per sample, and
 * is estimated at max(1, round(size_i / b)) (the loader's rule). With the
 * real deal of the sampler (whole shards, dealt on the estimates), each
 * stream's real length R and the fixed epoch size T must satisfy
 * |R - T| <= e*R + k/2 + (max_share - min_share) (k: the stream's shards,
 * one counting 1 instead of 1/2 when under half a probe sample).
 */
Test(sampler, property_estimated_pads_and_drops_stay_within_the_documented_bound)
{
    clear_dist_env();
    gen_state = 7;
    static const double es[] = {0, 0.05, 0.5, 1, 3};
    const double b = 1000;
    unsigned tight = 0;
    for (unsigned cs = 0; cs < 1500; cs++) {
        uint64_t n_true[50], est[50];
        double x[50];
        size_t n = 2 + (size_t)gen(49);
        int world = 2 + (int)gen(n - 1 < 15 ? n - 1 : 15);
        double e = es[gen(5)];
        for (size_t i = 0; i < n; i++) {
            n_true[i] = 1 + gen(gen(2) ? 3 : 50);
            double lo = ceil((double)n_true[i] * b / (1 + e));
            double hi = floor((double)n_true[i] * b * (1 + e));
            double size = lo + (double)gen((uint64_t)(hi - lo) + 1);
            x[i] = size / b;
            double r = floor(x[i] + 0.5);
            est[i] = r < 1 ? 1 : (uint64_t)r;
        }
        struct cfg c = {.world = world,
                        .estimated = 1,
                        .seed = gen(100),
                        .epoch = gen(4),
                        .policy = gen(2) ? SF_EPOCH_PAD : SF_EPOCH_DROP};
        uint64_t min_share = UINT64_MAX, max_share = 0, T = 0;
        for (int u = 0; u < world; u++) {
            c.rank = u;
            struct sf_sampler_options o = opts(c);
            struct sf_sampler *s = make(&o, est, n);
            size_t pn = 0;
            const struct sf_shard_range *plan = sf_sampler_plan(s, &pn);
            uint64_t share = 0;
            for (size_t i = 0; i < pn; i++)
                share += est[plan[i].shard];
            min_share = share < min_share ? share : min_share;
            max_share = share > max_share ? share : max_share;
            T = sf_sampler_epoch_size(s);
            sf_sampler_destroy(s);
        }
        for (int u = 0; u < world; u++) {
            c.rank = u;
            struct sf_sampler_options o = opts(c);
            struct sf_sampler *s = make(&o, est, n);
            CHECK((sf_sampler_epoch_size(s)) == (T), "every stream has the same size");
            size_t pn = 0;
            const struct sf_shard_range *plan = sf_sampler_plan(s, &pn);
            uint64_t R = 0;
            double rounding = 0;
            for (size_t i = 0; i < pn; i++) {
                size_t sh = plan[i].shard;
                CHECK((plan[i].begin) == (0), "");
                CHECK((plan[i].end) == (est[sh]), "whole shards on estimates");
                R += n_true[sh];
                rounding += x[sh] < 0.5 ? 1 : 0.5;
            }
            double off = R > T ? (double)(R - T) : (double)(T - R);
            double bound = e * (double)R + rounding + (double)(max_share - min_share);
            CHECK((off) <= (bound + 1e-9),
                  "case %u, e %g, world %d, stream %d: R %llu, T %llu, |R-T| %g > %g", cs, e, world,
                  u, (unsigned long long)R, (unsigned long long)T, off, bound);
            tight += off > 0.9 * bound && off > 0;
            sf_sampler_destroy(s);
        }
    }
    CHECK((tight) > (0), "some case comes near the bound");
}
