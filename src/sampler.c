/*
 * Epoch order (docs/sampling.md): a seeded shard permutation per epoch, a
 * partition of the shards (or of sample ranges) between rank x worker
 * streams, equalisation of the streams' lengths, and a WebDataset-style
 * shuffle buffer emulated on read indices. Nothing depends on data or on
 * thread timing, so the order is computed here, ahead of any I/O, and a
 * saved position is restored by replaying the buffer.
 *
 * Every allocation happens in sf_sampler_new(): planning an epoch, stepping
 * and restoring never fail for want of memory.
 */
#include "src/sampler.h"

#include "common/strbuf.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ PRNG */

uint64_t sf__fmix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t sf__absorb64(uint64_t h, uint64_t w)
{
    return sf__fmix64((h + SF__GAMMA) ^ w);
}

uint64_t sf__rng_next(struct sf__rng *r)
{
    r->state += SF__GAMMA;
    return sf__fmix64(r->state);
}

uint64_t sf__rng_below(struct sf__rng *r, uint64_t n)
{
    if (n == 0)
        return 0;
    /* 2^64 mod n, computed in 64 bits: (2^64 - n) mod n. Values below it
     * would make the low residues one draw more likely. */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = sf__rng_next(r);
        if (x >= threshold)
            return x % n;
    }
}

void sf__shard_order(uint64_t seed, uint64_t epoch, size_t *perm, size_t n)
{
    struct sf__rng rng = {sf__absorb64(sf__absorb64(SF__TAG_SHARDS, seed), epoch)};
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    for (size_t i = n; i-- > 1;) {
        size_t j = (size_t)sf__rng_below(&rng, (uint64_t)i + 1);
        size_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

uint64_t sf__counts_hash(const uint64_t *counts, size_t n)
{
    uint64_t h = sf__absorb64(SF__TAG_COUNTS, (uint64_t)n);
    for (size_t i = 0; i < n; i++)
        h = sf__absorb64(h, counts[i]);
    return h;
}

/* ------------------------------------------------------------------ environment */

/* When *out is negative (not set in the options): reads variable name as a
 * strict non-negative int into *out, or when it is absent, unset_value; *src
 * then says which (the name, or unset_src). */
static sf_status env_int(const char *name, int unset_value, const char *unset_src, int *out,
                         const char **src, char *err, size_t err_len)
{
    if (*out >= 0)
        return SF_OK;
    const char *v = getenv(name);
    if (!v) {
        *out = unset_value;
        *src = unset_src;
        return SF_OK;
    }
    long long value = 0;
    const char *p = v;
    /* ASCII digits only: isdigit() depends on the locale, strtol() takes
     * signs and leading blanks. */
    while (*p >= '0' && *p <= '9') {
        value = value * 10 + (*p - '0');
        if (value > INT_MAX)
            break;
        p++;
    }
    if (p == v || *p != '\0')
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "%s=\"%.40s\" is not a non-negative integer that fits in an int", name, v);
    *out = (int)value;
    *src = name;
    return SF_OK;
}

sf_status sf_dist_from_env(struct sf_dist *d, char *err, size_t err_len)
{
    if (!d)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "sf_dist_from_env: d is NULL");
    struct sf_dist r = *d;
    const char *rank_src = "option rank";
    const char *world_src = "option world_size";
    const char *local_src = "option local_rank";
    sf_status st;
    if ((st = env_int("RANK", 0, "default rank (RANK unset)", &r.rank, &rank_src, err,
                      err_len)) != SF_OK ||
        (st = env_int("WORLD_SIZE", 1, "default world_size (WORLD_SIZE unset)", &r.world_size,
                      &world_src, err, err_len)) != SF_OK ||
        (st = env_int("LOCAL_RANK", 0, "default local_rank (LOCAL_RANK unset)", &r.local_rank,
                      &local_src, err, err_len)) != SF_OK)
        return st;
    if (r.world_size < 1)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "world size %d (from %s) must be at least 1", r.world_size, world_src);
    if (r.rank >= r.world_size)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "rank %d (from %s) is not below world size %d (from %s)", r.rank, rank_src,
                        r.world_size, world_src);
    *d = r;
    return SF_OK;
}

/* ------------------------------------------------------------------ sampler */

/* A stream's load while shards are dealt; ordered by (load, stream). */
struct deal_slot {
    uint64_t load;
    uint64_t stream;
};

struct sf_sampler {
    /* Configuration, fixed by sf_sampler_new(). */
    uint64_t seed;
    int rank;
    int world_size;
    unsigned worker;
    unsigned num_workers;
    uint64_t streams;      /* world_size * num_workers */
    uint64_t stream;       /* rank * num_workers + worker */
    uint64_t buffer_slots; /* effective shuffle buffer, >= 1 */
    uint64_t initial_fill; /* effective, 1..buffer_slots */
    enum sf_epoch_policy policy;
    enum sf_partition partition;
    uint64_t *counts;
    size_t n_shards;
    uint64_t total; /* sum of counts */
    uint64_t counts_hash;
    /* Counts are estimates (docs/sampling.md, "Without counts"): items carry
     * read indices only. open_ended: the epoch is the stream's real length,
     * learned through sf_sampler_feed(); else the size is fixed from the
     * estimates (equalised streams). */
    int estimated;
    int open_ended;

    /* Scratch and plan, sized once. */
    size_t *perm;            /* n_shards */
    struct deal_slot *slots; /* streams entries, SF_PARTITION_SHARDS only */
    struct sf_shard_range *plan;
    size_t plan_len;      /* <= n_shards */
    uint64_t *plan_first; /* read index of plan[i]'s first sample; plan_len + 1 entries */

    /* The current epoch. */
    uint64_t epoch;
    uint64_t share;   /* samples of this stream's share before equalisation */
    uint64_t real;    /* real samples read: min(share, size) */
    uint64_t pads;    /* size - real */
    uint64_t size;    /* samples delivered this epoch */
    uint64_t dropped; /* share - real */
    uint64_t known;   /* open_ended: read indices known to exist */
    int final;        /* open_ended: the stream's length is known (size) */

    /* Shuffle buffer over read indices. */
    uint64_t *buf; /* buffer_slots entries */
    uint64_t buf_len;
    struct sf__rng rng;
    uint64_t read;      /* read indices pushed so far */
    uint64_t delivered; /* items returned so far */
    int started;        /* initial fill reached */
    int grow;           /* while growing: the next push only grows the buffer */

    char errmsg[256];
};

void sf_sampler_options_init_default(struct sf_sampler_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->seed = 0;
    o->epoch = 0;
    o->rank = -1;
    o->world_size = -1;
    o->worker = 0;
    o->num_workers = 1;
    o->shuffle_buffer = 1000;
    o->initial_fill = 0;
    o->policy = SF_EPOCH_PAD;
    o->partition = SF_PARTITION_SHARDS;
}

/* Whether slot a comes before slot b in the min-heap. */
static int slot_less(const struct deal_slot *a, const struct deal_slot *b)
{
    return a->load < b->load || (a->load == b->load && a->stream < b->stream);
}

static void slots_sift_down(struct deal_slot *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && slot_less(&h[l], &h[m]))
            m = l;
        if (r < n && slot_less(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        struct deal_slot t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Deals the epoch's shards: each non-empty shard, in permuted order, to the
 * stream with the fewest samples so far (lowest stream index on ties).
 * Appends this stream's shards to the plan; sets the loads' min and max. */
static void plan_shards(struct sf_sampler *s, uint64_t *min_load, uint64_t *max_load)
{
    size_t n = (size_t)s->streams;
    /* Equal loads ordered by stream: already a valid heap. */
    for (size_t u = 0; u < n; u++) {
        s->slots[u].load = 0;
        s->slots[u].stream = u;
    }
    for (size_t i = 0; i < s->n_shards; i++) {
        size_t shard = s->perm[i];
        uint64_t c = s->counts[shard];
        if (c == 0)
            continue;
        if (s->slots[0].stream == s->stream) {
            struct sf_shard_range r = {shard, 0, c};
            s->plan[s->plan_len++] = r;
        }
        s->slots[0].load += c;
        slots_sift_down(s->slots, n, 0);
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t u = 0; u < n; u++) {
        if (s->slots[u].load < lo)
            lo = s->slots[u].load;
        if (s->slots[u].load > hi)
            hi = s->slots[u].load;
        if (s->slots[u].stream == s->stream)
            s->share = s->slots[u].load;
    }
    *min_load = lo;
    *max_load = hi;
}

/* Stream u's share of the permuted samples laid end to end starts here. */
static uint64_t range_start(uint64_t u, uint64_t q, uint64_t r)
{
    return u * q + (u < r ? u : r);
}

/* Cuts the permuted samples into streams ranges of q or q + 1 samples (the
 * first total % streams get q + 1) and plans this stream's range. */
static void plan_samples(struct sf_sampler *s, uint64_t *min_load, uint64_t *max_load)
{
    uint64_t q = s->total / s->streams, r = s->total % s->streams;
    uint64_t a = range_start(s->stream, q, r), b = range_start(s->stream + 1, q, r);
    uint64_t off = 0;
    for (size_t i = 0; i < s->n_shards && off < b; i++) {
        size_t shard = s->perm[i];
        uint64_t c = s->counts[shard];
        uint64_t lo = off > a ? off : a;
        uint64_t hi = off + c < b ? off + c : b;
        if (lo < hi) {
            struct sf_shard_range pr = {shard, lo - off, hi - off};
            s->plan[s->plan_len++] = pr;
        }
        off += c;
    }
    s->share = b - a;
    *min_load = q;
    *max_load = q + (r > 0);
}

/* Plans epoch `epoch` and rewinds the stream to its start. */
static void start_epoch(struct sf_sampler *s, uint64_t epoch)
{
    uint64_t min_load = 0, max_load = 0;
    s->epoch = epoch;
    s->plan_len = 0;
    sf__shard_order(s->seed, epoch, s->perm, s->n_shards);
    if (s->partition == SF_PARTITION_SHARDS)
        plan_shards(s, &min_load, &max_load);
    else
        plan_samples(s, &min_load, &max_load);

    switch (s->policy) {
    case SF_EPOCH_PAD: s->size = max_load; break;
    case SF_EPOCH_DROP: s->size = min_load; break;
    case SF_EPOCH_UNEVEN: s->size = s->share; break;
    }
    s->known = 0;
    s->final = 0;
    if (s->estimated) {
        /* The plan keeps whole shards (the reader reads each to its real end);
         * what is real, padded or dropped is the reader's to count. An
         * open-ended stream's size is the estimate until fed. */
        for (size_t i = 0; i < s->plan_len; i++)
            s->plan_first[i] = i;
        s->plan_first[s->plan_len] = s->plan_len;
        s->real = s->pads = s->dropped = 0;
        goto rng;
    }
    s->real = s->share < s->size ? s->share : s->size;
    s->pads = s->size - s->real;
    s->dropped = s->share - s->real;

    /* Keep only the first `real` samples of the read order (DROP). */
    uint64_t first = 0;
    size_t kept = 0;
    while (kept < s->plan_len && first < s->real) {
        struct sf_shard_range *pr = &s->plan[kept];
        uint64_t len = pr->end - pr->begin;
        if (len > s->real - first) {
            len = s->real - first;
            pr->end = pr->begin + len;
        }
        s->plan_first[kept++] = first;
        first += len;
    }
    s->plan_len = kept;
    s->plan_first[kept] = first;

rng:
    s->rng.state = sf__absorb64(SF__TAG_BUFFER, s->seed);
    s->rng.state = sf__absorb64(s->rng.state, epoch);
    s->rng.state = sf__absorb64(s->rng.state, (uint64_t)s->world_size);
    s->rng.state = sf__absorb64(s->rng.state, (uint64_t)s->rank);
    s->rng.state = sf__absorb64(s->rng.state, s->num_workers);
    s->rng.state = sf__absorb64(s->rng.state, s->worker);
    s->buf_len = 0;
    s->read = 0;
    s->delivered = 0;
    s->started = 0;
    s->grow = 0;
}

/* Advances the shuffle buffer to its next output, a read index; 0 at the
 * end of the epoch. The rules are those of docs/sampling.md, step for step. */
static int step(struct sf_sampler *s, uint64_t *read_index)
{
    for (;;) {
        /* An open-ended stream's size is unknown until fed: unbounded. */
        int unknown = s->open_ended && !s->final;
        uint64_t size = unknown ? UINT64_MAX : s->size;
        if (s->delivered >= size)
            return 0;
        if (s->read < size) {
            /* Re-entering here after a wait is the same as going on: the
             * state between pushes is complete. */
            if (unknown && s->read >= s->known)
                return SF_SAMPLER_WAIT; /* does read index `read` exist? */
            s->buf[s->buf_len++] = s->read++;
            if (!s->started) {
                if (s->buf_len < s->initial_fill)
                    continue;
                s->started = 1;
                s->grow = 1;
            } else if (s->buf_len < s->buffer_slots && s->grow) {
                s->grow = 0;
                continue;
            } else {
                s->grow = 1;
            }
        }
        uint64_t k = sf__rng_below(&s->rng, s->buf_len);
        *read_index = s->buf[k];
        s->buf[k] = s->buf[--s->buf_len];
        s->delivered++;
        return 1;
    }
}

/* Which sample a read index stands for. */
static void resolve(const struct sf_sampler *s, uint64_t read_index, struct sf_sample_ref *out)
{
    uint64_t k = read_index;
    out->flags = 0;
    if (s->estimated) {
        out->shard = SF_SAMPLE_UNRESOLVED;
        out->sample = read_index;
        out->read_index = read_index;
        return;
    }
    if (k >= s->real) {
        /* Pad j repeats read index ((real - pads % real) + j) % real: the last
         * `pads` real samples read, in order, cycling when pads > real. */
        uint64_t j = k - s->real;
        k = ((s->real - s->pads % s->real) + j) % s->real;
        out->flags = SF_SAMPLE_PAD;
    }
    /* Last plan range whose first read index is <= k. */
    size_t lo = 0, hi = s->plan_len;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->plan_first[mid] <= k)
            lo = mid;
        else
            hi = mid;
    }
    out->shard = s->plan[lo].shard;
    out->sample = s->plan[lo].begin + (k - s->plan_first[lo]);
    out->read_index = read_index;
}

static sf_status check_options(const struct sf_sampler_options *o, char *err, size_t err_len)
{
    if (o->num_workers < 1)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "num_workers must be at least 1");
    if (o->worker >= o->num_workers)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "worker %u is not below num_workers %u", o->worker, o->num_workers);
    if (o->shuffle_buffer > SF_SAMPLER_MAX_SHUFFLE_BUFFER)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "shuffle_buffer %llu is above the limit of %llu samples",
                        (unsigned long long)o->shuffle_buffer, SF_SAMPLER_MAX_SHUFFLE_BUFFER);
    uint64_t slots = o->shuffle_buffer ? o->shuffle_buffer : 1;
    if (o->initial_fill > slots)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "initial_fill %llu is above shuffle_buffer %llu",
                        (unsigned long long)o->initial_fill, (unsigned long long)o->shuffle_buffer);
    if (o->policy != SF_EPOCH_PAD && o->policy != SF_EPOCH_DROP && o->policy != SF_EPOCH_UNEVEN)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "unknown epoch policy %d",
                        (int)o->policy);
    if (o->partition != SF_PARTITION_SHARDS && o->partition != SF_PARTITION_SAMPLES)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "unknown partition %d",
                        (int)o->partition);
    if (o->estimated_counts && o->partition == SF_PARTITION_SAMPLES)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "partition by samples needs exact sample counts (an index.json beside "
                        "the shards: `shardfeed index`), not estimates");
    return SF_OK;
}

sf_status sf__sampler_options_check(const struct sf_sampler_options *o, char *err, size_t err_len)
{
    return check_options(o, err, err_len);
}

sf_status sf_sampler_new(const struct sf_sampler_options *opts, const uint64_t *counts,
                         size_t n_shards, struct sf_sampler **out, char *err, size_t err_len)
{
    if (!out)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "sf_sampler_new: out is NULL");
    *out = NULL;
    struct sf_sampler_options defaults;
    sf_sampler_options_init_default(&defaults);
    const struct sf_sampler_options *o = opts ? opts : &defaults;

    sf_status st = check_options(o, err, err_len);
    if (st != SF_OK)
        return st;
    if (n_shards == 0)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "no shards to sample from");
    if (!counts)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "counts is NULL");
    if (n_shards > SF_SAMPLER_MAX_SHARDS)
        return sf__fail(err, err_len, SF_ERR_LIMIT, "%zu shards is above the limit of %llu",
                        n_shards, SF_SAMPLER_MAX_SHARDS);

    /* rank and world_size: options, else the launcher's environment. The
     * sampler has no use for LOCAL_RANK, so it is not read (nor checked). */
    struct sf_dist dist = {o->rank, o->world_size, 0};
    if ((st = sf_dist_from_env(&dist, err, err_len)) != SF_OK)
        return st;

    uint64_t total = 0, nonempty = 0;
    for (size_t i = 0; i < n_shards; i++) {
        if (counts[i] > UINT64_MAX - total)
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                            "the sample counts add up to more than 2^64 (at shard %zu)", i);
        total += counts[i];
        nonempty += counts[i] > 0;
    }
    uint64_t streams = (uint64_t)dist.world_size * o->num_workers;
    if (total == 0)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "the %zu shard%s hold%s no sample: nothing to load", n_shards,
                        n_shards == 1 ? "" : "s", n_shards == 1 ? "s" : "");
    if (o->partition == SF_PARTITION_SHARDS && nonempty < streams)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "%llu non-empty shards cannot give one to each of %llu streams "
                        "(world_size %d x num_workers %u): use more shards, fewer workers, "
                        "or partition by samples (SF_PARTITION_SAMPLES)",
                        (unsigned long long)nonempty, (unsigned long long)streams, dist.world_size,
                        o->num_workers);
    if (total < streams)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "%llu samples cannot give one to each of %llu streams "
                        "(world_size %d x num_workers %u)",
                        (unsigned long long)total, (unsigned long long)streams, dist.world_size,
                        o->num_workers);

    struct sf_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory for the sampler");
    s->seed = o->seed;
    s->rank = dist.rank;
    s->world_size = dist.world_size;
    s->worker = o->worker;
    s->num_workers = o->num_workers;
    s->streams = streams;
    s->stream = (uint64_t)dist.rank * o->num_workers + o->worker;
    s->buffer_slots = o->shuffle_buffer ? o->shuffle_buffer : 1;
    s->initial_fill = o->initial_fill ? o->initial_fill : s->buffer_slots;
    s->policy = o->policy;
    s->partition = o->partition;
    s->n_shards = n_shards;
    s->total = total;
    s->counts_hash = sf__counts_hash(counts, n_shards);
    s->estimated = o->estimated_counts != 0;
    s->open_ended = s->estimated && (streams == 1 || o->policy == SF_EPOCH_UNEVEN);

    /* n_shards <= 2^28 and streams <= nonempty <= n_shards when dealing
     * shards, so none of these sizes overflows. */
    s->counts = malloc(n_shards * sizeof *s->counts);
    s->perm = malloc(n_shards * sizeof *s->perm);
    s->plan = malloc(n_shards * sizeof *s->plan);
    s->plan_first = malloc((n_shards + 1) * sizeof *s->plan_first);
    s->buf = malloc((size_t)s->buffer_slots * sizeof *s->buf);
    if (o->partition == SF_PARTITION_SHARDS)
        s->slots = malloc((size_t)streams * sizeof *s->slots);
    if (!s->counts || !s->perm || !s->plan || !s->plan_first || !s->buf ||
        (o->partition == SF_PARTITION_SHARDS && !s->slots)) {
        sf_sampler_destroy(s);
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY,
                        "out of memory for a sampler of %zu shards and %llu buffer slots", n_shards,
                        (unsigned long long)o->shuffle_buffer);
    }
    memcpy(s->counts, counts, n_shards * sizeof *counts);
    start_epoch(s, o->epoch);
    *out = s;
    return SF_OK;
}

void sf_sampler_destroy(struct sf_sampler *s)
{
    if (!s)
        return;
    free(s->counts);
    free(s->perm);
    free(s->slots);
    free(s->plan);
    free(s->plan_first);
    free(s->buf);
    free(s);
}

int sf_sampler_next(struct sf_sampler *s, struct sf_sample_ref *out)
{
    if (!s || !out)
        return 0;
    uint64_t read_index;
    int r = step(s, &read_index);
    if (r != 1)
        return r;
    resolve(s, read_index, out);
    out->position = s->delivered - 1;
    return 1;
}

void sf__sampler_window(const struct sf_sampler *s, uint64_t *read, const uint64_t **buf,
                        uint64_t *buf_len)
{
    *read = s->read;
    *buf = s->buf;
    *buf_len = s->buf_len;
}

uint64_t sf__sampler_shard_count(const struct sf_sampler *s, size_t shard)
{
    return s && shard < s->n_shards ? s->counts[shard] : 0;
}

sf_status sf_sampler_feed(struct sf_sampler *s, uint64_t reads, int final)
{
    if (!s)
        return SF_ERR_INVALID_ARGUMENT;
    if (!s->open_ended)
        return SF_OK; /* the size is fixed: nothing to learn */
    if (s->final) {
        /* "At least reads" agrees with the length; another length does not. */
        if (final ? reads != s->size : reads > s->size)
            return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_INVALID_ARGUMENT,
                            "the stream's length was given as %llu, now %llu",
                            (unsigned long long)s->size, (unsigned long long)reads);
        return SF_OK;
    }
    if (final && (reads < s->read || reads < s->known))
        return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_INVALID_ARGUMENT,
                        "a stream of %llu samples, but %llu were already told to exist",
                        (unsigned long long)reads,
                        (unsigned long long)(s->read > s->known ? s->read : s->known));
    if (reads > s->known)
        s->known = reads;
    if (final) {
        s->final = 1;
        s->size = reads;
        s->known = reads;
    }
    return SF_OK;
}

void sf_sampler_set_epoch(struct sf_sampler *s, uint64_t epoch)
{
    if (s)
        start_epoch(s, epoch);
}

uint64_t sf_sampler_epoch_size(const struct sf_sampler *s)
{
    return s ? s->size : 0;
}

void sf_sampler_get_info(const struct sf_sampler *s, struct sf_sampler_info *out)
{
    if (!s || !out)
        return;
    memset(out, 0, sizeof *out);
    out->epoch = s->epoch;
    out->epoch_size = s->size;
    out->size_known = !s->open_ended || s->final;
    out->estimated = s->estimated;
    out->position = s->delivered;
    out->pad_count = s->pads;
    out->dropped_count = s->dropped;
    out->total_samples = s->total;
    out->rank = s->rank;
    out->world_size = s->world_size;
    out->worker = s->worker;
    out->num_workers = s->num_workers;
    out->shuffle_buffer = s->buffer_slots;
    out->initial_fill = s->initial_fill;
}

const struct sf_shard_range *sf_sampler_plan(const struct sf_sampler *s, size_t *n)
{
    if (n)
        *n = s ? s->plan_len : 0;
    return s ? s->plan : NULL;
}

const char *sf_sampler_errmsg(const struct sf_sampler *s)
{
    return s ? s->errmsg : "";
}

/* ------------------------------------------------------------------ state */

/* Byte offsets of the version 1 state (docs/sampling.md). */
enum {
    ST_MAGIC = 0,
    ST_VERSION = 8,
    ST_SIZE = 12,
    ST_SEED = 16,
    ST_EPOCH = 24,
    ST_POSITION = 32,
    ST_EPOCH_SIZE = 40,
    ST_COUNTS_HASH = 48,
    ST_N_SHARDS = 56,
    ST_RANK = 64,
    ST_WORLD_SIZE = 68,
    ST_WORKER = 72,
    ST_NUM_WORKERS = 76,
    ST_SHUFFLE_BUFFER = 80,
    ST_INITIAL_FILL = 88,
    ST_POLICY = 96,
    ST_PARTITION = 100,
    ST_FLAGS = 104,  /* version 2: bit 0 estimated counts */
    ST_LENGTH = 112, /* version 2: open-ended stream length + 1, 0 when unknown */
    ST_CHECKSUM = 120,
};
#define STATE_MAGIC   0x524c504d41534653ULL /* "SFSAMPLR" */
#define STATE_VERSION 1u
/* Version 2: a sampler on estimated counts (the layout of version 1 plus
 * ST_FLAGS and ST_LENGTH). Exact samplers keep writing version 1. */
#define STATE_VERSION_EST 2u

_Static_assert(ST_CHECKSUM + 8 == SF_SAMPLER_STATE_BYTES, "state layout");

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t state_checksum(const unsigned char *b)
{
    uint64_t h = SF__TAG_STATE;
    for (size_t off = 0; off < ST_CHECKSUM; off += 8)
        h = sf__absorb64(h, get_u64(b + off));
    return h;
}

sf_status sf_sampler_state_save_at(const struct sf_sampler *s, uint64_t position, void *buf,
                                   size_t buf_len)
{
    if (!s || !buf || buf_len < SF_SAMPLER_STATE_BYTES ||
        (position > s->size && !(s->open_ended && !s->final)))
        return SF_ERR_INVALID_ARGUMENT;
    unsigned char *b = buf;
    memset(b, 0, SF_SAMPLER_STATE_BYTES);
    put_u64(b + ST_MAGIC, STATE_MAGIC);
    put_u32(b + ST_VERSION, s->estimated ? STATE_VERSION_EST : STATE_VERSION);
    put_u32(b + ST_SIZE, SF_SAMPLER_STATE_BYTES);
    put_u64(b + ST_SEED, s->seed);
    put_u64(b + ST_EPOCH, s->epoch);
    put_u64(b + ST_POSITION, position);
    put_u64(b + ST_EPOCH_SIZE, s->size);
    put_u64(b + ST_COUNTS_HASH, s->counts_hash);
    put_u64(b + ST_N_SHARDS, s->n_shards);
    put_u32(b + ST_RANK, (uint32_t)s->rank);
    put_u32(b + ST_WORLD_SIZE, (uint32_t)s->world_size);
    put_u32(b + ST_WORKER, s->worker);
    put_u32(b + ST_NUM_WORKERS, s->num_workers);
    put_u64(b + ST_SHUFFLE_BUFFER, s->buffer_slots);
    put_u64(b + ST_INITIAL_FILL, s->initial_fill);
    put_u32(b + ST_POLICY, (uint32_t)s->policy);
    put_u32(b + ST_PARTITION, (uint32_t)s->partition);
    if (s->estimated) {
        put_u32(b + ST_FLAGS, 1);
        put_u64(b + ST_LENGTH, s->open_ended && s->final ? s->size + 1 : 0);
    }
    put_u64(b + ST_CHECKSUM, state_checksum(b));
    return SF_OK;
}

sf_status sf_sampler_state_save(const struct sf_sampler *s, void *buf, size_t buf_len)
{
    if (!s)
        return SF_ERR_INVALID_ARGUMENT;
    return sf_sampler_state_save_at(s, s->delivered, buf, buf_len);
}

/* Moves s to `position` of `epoch` by replaying the buffer. length1: an
 * open-ended stream's length + 1, 0 when unknown. */
static void seek(struct sf_sampler *s, uint64_t epoch, uint64_t position, uint64_t length1)
{
    uint64_t ignored;
    start_epoch(s, epoch);
    if (s->open_ended && length1) {
        s->final = 1;
        s->size = length1 - 1;
        s->known = s->size;
    } else if (s->open_ended) {
        /* Saved before the length was known: every read it pushed existed. */
        s->known = UINT64_MAX;
    }
    while (s->delivered < position && step(s, &ignored) == 1) {
    }
    if (s->open_ended && !s->final)
        s->known = s->read;
}

#define CHECK_FIELD(name, saved, mine)                                                             \
    do {                                                                                           \
        unsigned long long saved_ = (saved), mine_ = (mine);                                       \
        if (saved_ != mine_)                                                                       \
            return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_INVALID_ARGUMENT,                  \
                            "sampler state is from a different configuration: " name               \
                            " is %llu in the state, %llu in this sampler",                         \
                            saved_, mine_);                                                        \
    } while (0)

sf_status sf_sampler_state_restore(struct sf_sampler *s, const void *state, size_t state_len)
{
    return sf__sampler_state_restore_within(s, state, state_len, UINT64_MAX, NULL);
}

sf_status sf__sampler_state_restore_within(struct sf_sampler *s, const void *state,
                                           size_t state_len, uint64_t max_samples,
                                           const char *bound_why)
{
    if (!s)
        return SF_ERR_INVALID_ARGUMENT;
    if (!state || state_len != SF_SAMPLER_STATE_BYTES)
        return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_INVALID_ARGUMENT,
                        "a sampler state is %d bytes, got %zu%s", SF_SAMPLER_STATE_BYTES,
                        state ? state_len : 0, state ? "" : " (NULL)");
    const unsigned char *b = state;
    if (get_u64(b + ST_MAGIC) != STATE_MAGIC)
        return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_CORRUPT,
                        "not a sampler state (bad magic)");
    uint32_t version = get_u32(b + ST_VERSION);
    if (version != STATE_VERSION && version != STATE_VERSION_EST)
        return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_UNSUPPORTED,
                        "sampler state version %u is not supported (this library reads %u)",
                        version, STATE_VERSION);
    if (get_u32(b + ST_SIZE) != SF_SAMPLER_STATE_BYTES ||
        get_u64(b + ST_CHECKSUM) != state_checksum(b))
        return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_CORRUPT,
                        "sampler state is damaged (checksum mismatch)");

    CHECK_FIELD("seed", get_u64(b + ST_SEED), s->seed);
    CHECK_FIELD("shard count", get_u64(b + ST_N_SHARDS), s->n_shards);
    CHECK_FIELD("counts hash", get_u64(b + ST_COUNTS_HASH), s->counts_hash);
    CHECK_FIELD("world_size", get_u32(b + ST_WORLD_SIZE), (uint32_t)s->world_size);
    CHECK_FIELD("rank", get_u32(b + ST_RANK), (uint32_t)s->rank);
    CHECK_FIELD("num_workers", get_u32(b + ST_NUM_WORKERS), s->num_workers);
    CHECK_FIELD("worker", get_u32(b + ST_WORKER), s->worker);
    CHECK_FIELD("shuffle_buffer", get_u64(b + ST_SHUFFLE_BUFFER), s->buffer_slots);
    CHECK_FIELD("initial_fill", get_u64(b + ST_INITIAL_FILL), s->initial_fill);
    CHECK_FIELD("policy", get_u32(b + ST_POLICY), (uint32_t)s->policy);
    CHECK_FIELD("partition", get_u32(b + ST_PARTITION), (uint32_t)s->partition);
    CHECK_FIELD("estimated counts", version == STATE_VERSION_EST && (get_u32(b + ST_FLAGS) & 1),
                s->estimated);

    uint64_t epoch = get_u64(b + ST_EPOCH);
    uint64_t position = get_u64(b + ST_POSITION);
    uint64_t size = get_u64(b + ST_EPOCH_SIZE);
    uint64_t length = version == STATE_VERSION_EST ? get_u64(b + ST_LENGTH) : 0;
    /* An open-ended stream's length is whatever its reader found, so only
     * what its shards can hold bounds the saved position (or length): past
     * it, the replay would run for as many steps as the state says. */
    if (s->open_ended) {
        uint64_t reach = length > position ? length - 1 : position;
        if (reach > max_samples)
            return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_INVALID_ARGUMENT,
                            "sampler state %s %llu is beyond the %llu samples %s",
                            reach == position ? "position" : "stream length",
                            (unsigned long long)reach, (unsigned long long)max_samples,
                            bound_why ? bound_why : "this stream can hold");
    }
    uint64_t old_epoch = s->epoch, old_position = s->delivered;
    int old_final = s->final;
    uint64_t old_size = s->size, old_known = s->known;
    start_epoch(s, epoch);
    if (s->open_ended && length) {
        s->final = 1;
        s->size = length - 1;
    }
    /* Saved before the real length was known: the estimate is no bound on
     * the position (the stream may be longer). */
    int unbounded = s->open_ended && !length;
    if (unbounded)
        size = s->size;
    if (size != s->size || (position > size && !unbounded)) {
        /* Same configuration yet another epoch length: a state written by
         * a library with a different algorithm under the same version. */
        uint64_t mine = s->size;
        seek(s, old_epoch, old_position, old_final ? old_size + 1 : 0);
        /* The replay only knows the reads it pushed; the reader may have
         * told of more, and will not tell again. */
        s->known = old_known;
        return sf__fail(s->errmsg, sizeof s->errmsg, SF_ERR_CORRUPT,
                        "sampler state says epoch %llu has %llu samples (position %llu); "
                        "this sampler computes %llu",
                        (unsigned long long)epoch, (unsigned long long)size,
                        (unsigned long long)position, (unsigned long long)mine);
    }
    seek(s, epoch, position, s->open_ended ? length : 0);
    return SF_OK;
}
