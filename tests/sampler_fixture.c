/* The sampler suite's fixture (sampler_fixture.h). */
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

/* ------------------------------------------------------------------ helpers */

void clear_dist_env(void)
{
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
}

struct sf_sampler_options opts(struct cfg c)
{
    struct sf_sampler_options o;
    sf_sampler_options_init_default(&o);
    o.rank = c.rank;
    o.world_size = c.world ? c.world : 1;
    o.worker = c.worker;
    o.num_workers = c.workers ? c.workers : 1;
    o.seed = c.seed; /* the defaults of these are 0 */
    o.epoch = c.epoch;
    o.initial_fill = c.fill;
    o.estimated_counts = c.estimated;
    o.policy = c.policy;
    o.partition = c.partition;
    if (c.buffer)
        o.shuffle_buffer = c.buffer;
    return o;
}

struct sf_sampler *make(const struct sf_sampler_options *o, const uint64_t *counts, size_t n)
{
    struct sf_sampler *s = NULL;
    char err[256] = "";
    sf_status st = sf_sampler_new(o, counts, n, &s, err, sizeof err);
    cr_assert_eq(st, SF_OK, "sf_sampler_new: %s (%s)", sf_status_name(st), err);
    cr_assert_not_null(s);
    return s;
}

struct run drain(struct sf_sampler *s)
{
    struct run r = {NULL, 0};
    uint64_t left = sf_sampler_epoch_size(s);
    r.items = calloc(left ? left : 1, sizeof *r.items);
    cr_assert_not_null(r.items);
    struct sf_sample_ref it;
    while (sf_sampler_next(s, &it)) {
        cr_assert_lt(r.n, left, "more items than the epoch size %llu", (unsigned long long)left);
        r.items[r.n++] = it;
    }
    return r;
}

struct run run_of(const struct sf_sampler_options *o, const uint64_t *counts, size_t n)
{
    struct sf_sampler *s = make(o, counts, n);
    struct run r = drain(s);
    cr_assert_eq(r.n, sf_sampler_epoch_size(s));
    sf_sampler_destroy(s);
    return r;
}

int same_item(const struct sf_sample_ref *a, const struct sf_sample_ref *b)
{
    return a->shard == b->shard && a->sample == b->sample && a->position == b->position &&
           a->read_index == b->read_index && a->flags == b->flags;
}

uint64_t hash_run(const struct run *r)
{
    uint64_t h = 0x1234;
    for (size_t i = 0; i < r->n; i++) {
        h = sf__absorb64(h, r->items[i].shard);
        h = sf__absorb64(h, r->items[i].sample);
        h = sf__absorb64(h, r->items[i].flags);
    }
    return h;
}

void uneven_counts(uint64_t *c)
{
    for (size_t i = 0; i < N_UNEVEN; i++)
        c[i] = 1 + (i * 7919) % 13;
    c[17] = 0;
}

void same_counts(uint64_t *c, size_t n, uint64_t v)
{
    for (size_t i = 0; i < n; i++)
        c[i] = v;
}
