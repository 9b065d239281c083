/*
 * The loader's reader thread: plans the epoch with the sampler, opens shards
 * ahead in plan order, parses them and assigns each sample to its batch slot
 * on the decode queue; handles epoch resets and restores. Everything here
 * runs on the reader thread.
 */
#include "src/loader_internal.h"

#include "src/decode.h"
#include "src/sampler.h"
#include "src/gpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ reader thread */

struct reader {
    const struct sf_shard_range *plan;
    size_t n_plan;
    size_t next_open;  /* plan entries opened */
    size_t next_parse; /* plan entry being parsed */
    uint64_t samples_read;
    uint64_t position;       /* epoch positions assigned */
    uint64_t stop_at;        /* positions to assign (drop_last) */
    uint64_t window;         /* effective shuffle buffer */
    double blocked_s;        /* this round, waiting for a free batch slot (not busy) */
    struct shard_slot *open; /* list */
    struct sf_sample_ref pending;
    int have_pending, sampler_done;
    struct batch *cur;
    uint64_t gen;   /* of the batches it fills: l->gen, or l->gen + 1 reading ahead */
    uint64_t epoch; /* the epoch it reads */
    uint64_t size;  /* its sampler positions */
    int known;      /* size is exact */
    uint64_t dropped; /* SF_EPOCH_DROP's truncation, counted when the epoch starts */
    /* Estimated counts: the plan is read as passes over it (pass 0 real,
     * later passes pads), slots numbered by virtual index. */
    int est;
    int pass0_done;
    uint64_t target;    /* read indices delivered: T, or UINT64_MAX (open-ended) */
    uint64_t next_read; /* read indices parsed so far (in order) */
    uint64_t real;      /* R: the stream's real samples, once pass0_done */
    uint64_t *rs_buf;   /* restore: sorted copy of the sampler's buffer */
    unsigned long long decoded_base; /* l->n_decoded when this reading began */
};

/* Counts this epoch's deliveries per shard with the counter sampler,
 * positioned like the main one. */
static void count_deliveries(struct sf_loader *l, uint64_t stop_at)
{
    unsigned char st[SF_SAMPLER_STATE_BYTES];
    memset(l->deliveries, 0, l->n_shards * sizeof(*l->deliveries));
    if (sf_sampler_state_save(l->sampler, st, sizeof(st)) != SF_OK ||
        sf_sampler_state_restore(l->counter, st, sizeof(st)) != SF_OK)
        return;
    struct sf_sample_ref r;
    while (sf_sampler_next(l->counter, &r))
        if (r.position < stop_at) /* drop_last: the short tail is not delivered */
            l->deliveries[r.shard]++;
}

static void reader_close_all(struct sf_loader *l, struct reader *rd)
{
    while (rd->open) {
        struct shard_slot *n = rd->open->next;
        sf__loader_shard_close(l, rd->open);
        rd->open = n;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Plans the reader's epoch from the sampler's current position: the reader's
 * own state only (and the per-shard deliveries, read when a shard opens). */
static void reader_plan(struct sf_loader *l, struct reader *rd, uint64_t position)
{
    reader_close_all(l, rd);
    free(rd->rs_buf);
    memset(rd, 0, sizeof(*rd));
    l->rs_window = NULL;
    l->rs_n = l->rs_read = 0;
    rd->plan = sf_sampler_plan(l->sampler, &rd->n_plan);
    struct sf_sampler_info info;
    sf_sampler_get_info(l->sampler, &info);
    rd->position = position;
    rd->window = info.shuffle_buffer;
    rd->est = info.estimated;
    uint64_t size = info.epoch_size;
    uint64_t B = l->o.batch_size;
    int known = info.size_known;
    rd->epoch = info.epoch;
    rd->size = size;
    rd->known = !rd->est || known;
    if (rd->est) {
        rd->target = known ? size : UINT64_MAX;
        rd->stop_at = known ? (l->o.drop_last ? size / B * B : size) : UINT64_MAX;
        if (position) {
            /* Read indices that entered the buffer and left it before the
             * restore point are parsed but not delivered again. */
            const uint64_t *buf;
            uint64_t n, read;
            sf__sampler_window(l->sampler, &read, &buf, &n);
            rd->rs_buf = malloc((n ? n : 1) * sizeof(*rd->rs_buf));
            if (!rd->rs_buf) {
                sf__loader_fail(l, SF_ERR_NO_MEMORY, "loader: out of memory");
            } else {
                memcpy(rd->rs_buf, buf, n * sizeof(*buf));
                qsort(rd->rs_buf, n, sizeof(*rd->rs_buf), cmp_u64);
                l->rs_window = rd->rs_buf;
                l->rs_n = n;
                l->rs_read = read;
            }
        }
    } else {
        rd->stop_at = l->o.drop_last ? size / B * B : size;
        count_deliveries(l, rd->stop_at);
        /* SF_EPOCH_DROP's truncation, known from the start with exact counts
         * (on estimates est_pass0_done counts it). */
        rd->dropped = info.dropped_count;
    }
}

static uint64_t epoch_batches_of(const struct sf_loader *l, uint64_t size)
{
    uint64_t B = l->o.batch_size;
    return l->o.drop_last ? size / B : (size + B - 1) / B;
}

/* Starts the reader's epoch at the sampler's current position. */
static void reader_begin(struct sf_loader *l, struct reader *rd, uint64_t position)
{
    reader_plan(l, rd, position);
    rd->decoded_base = atomic_load(&l->n_decoded);
    atomic_fetch_add(&l->n_dropped, rd->dropped);
    uint64_t B = l->o.batch_size;
    /* Replayed positions were consumed already: the shards hold fewer
     * deliveries, and samples read before `position` are counted. */
    pthread_mutex_lock(&l->mu);
    l->epoch = rd->epoch;
    l->epoch_positions = rd->size;
    l->epoch_batches = epoch_batches_of(l, rd->size);
    l->size_known = rd->known;
    l->epoch_estimated = rd->est;
    l->plan_done = !rd->est;
    if (!rd->known)
        l->epoch_batches = UINT64_MAX; /* until the stream's end is read */
    l->next_deliver = (position + B - 1) / B; /* position / B, but a short epoch end */
    l->next_gpu = l->next_deliver;
    l->delivered_positions = position;
    rd->gen = l->gen;
    pthread_mutex_unlock(&l->mu);
}

/*
 * Reads the next epoch ahead while the consumer finishes this one, so the
 * ring holds its first batches when set_epoch(epoch + 1) comes: no stall at
 * the epoch boundary (docs/loader.md "Epoch boundaries"). Only when this
 * epoch is read to its end and every shard of it closed (the next epoch's
 * per-shard deliveries replace this one's), on exact counts (estimated
 * epochs end with a basis decision), not while a reset is asked, and only
 * once set_epoch moved the loader to another epoch: a run of one epoch
 * never fetches shards it will not read (with S3, requests and bytes that
 * cost money). The
 * batches carry gen + 1, which neither the consumer nor the device thread
 * take until set_epoch adopts them; any other set_epoch, a restore or close
 * throws them away. Returns 1 when it started.
 */
static int reader_read_ahead(struct sf_loader *l, struct reader *rd)
{
    pthread_mutex_lock(&l->mu);
    int go = !l->stop && l->error == SF_OK && !l->reset_req && !l->spec_active &&
             rd->gen == l->gen && !l->estimated && !l->epoch_estimated && !l->next_sampler &&
             l->epochs_moved > 0;
    uint64_t next = l->epoch + 1, gen = l->gen + 1;
    pthread_mutex_unlock(&l->mu);
    if (!go)
        return 0;
    sf_sampler_set_epoch(l->sampler, next);
    reader_plan(l, rd, 0);
    rd->gen = gen;
    pthread_mutex_lock(&l->mu);
    /* A reset asked meanwhile replans everything: not marked for adoption. */
    if (!l->reset_req) {
        l->spec_active = 1;
        l->spec_epoch = rd->epoch;
        l->spec_gen = gen;
        l->spec_positions = rd->size;
        l->spec_batches = epoch_batches_of(l, rd->size);
        l->spec_dropped = rd->dropped;
    }
    pthread_mutex_unlock(&l->mu);
    return 1;
}

/* Samples read before the restore point: a restored sampler needs them to be
 * counted as read. The plan is walked to the read index the sampler's
 * pending items need; shards wholly before it are skipped without reading.
 * Simple approach: nothing is skipped; reading starts at the plan's start,
 * and samples with no deliveries left are dropped as soon as parsed. */

/* A free ring slot (not held, not read by a device copy), or NULL. mu held. */
static struct batch *free_slot(struct sf_loader *l)
{
    for (unsigned i = 0; i < l->ring; i++)
        if (l->batches[i].state == B_FREE && !l->batches[i].gpu_busy)
            return &l->batches[i];
    return NULL;
}

/* Takes any free slot for batch `bindex`: batches are not tied to a slot, so
 * a batch the consumer keeps never blocks the ring while it holds at most
 * prefetch_batches - 1. */
static int reader_wait_slot(struct sf_loader *l, struct reader *rd, uint64_t bindex)
{
    struct batch *b = NULL;
    pthread_mutex_lock(&l->mu);
    double t_wait = sf__now_s();
    while (!l->stop && l->error == SF_OK && !l->reset_req && !(b = free_slot(l))) {
        /* Keep downloads moving while we wait for the consumer. */
        pthread_mutex_unlock(&l->mu);
        for (struct shard_slot *s = rd->open; s; s = s->next)
            if (sf__loader_shard_pump(l, s, 0, 0) != SF_OK)
                return -1;
        pthread_mutex_lock(&l->mu);
        if (!free_slot(l) && !l->stop && !l->reset_req)
            sf__loader_cond_wait_ms(&l->cv_reader, &l->mu, 20);
    }
    int ok = !l->stop && l->error == SF_OK && !l->reset_req && b;
    if (ok) {
        b->state = B_FILLING;
        b->gen = rd->gen;
        b->epoch = rd->epoch;
        b->index = bindex;
        b->position = bindex * l->o.batch_size;
        b->assigned = 0;
        b->size = 0;
        b->key_len = 0;
        b->gpu_s = 0;
        atomic_store(&b->pending, 1);
        memset(b->skipped, 0, l->o.batch_size);
        rd->cur = b;
    }
    rd->blocked_s += sf__now_s() - t_wait;
    pthread_mutex_unlock(&l->mu);
    return ok ? 0 : -1;
}

/* Closes the batch being filled: the reader's token goes. */
static void reader_close_batch(struct sf_loader *l, struct reader *rd)
{
    if (!rd->cur)
        return;
    struct batch *b = rd->cur;
    rd->cur = NULL;
    sf__loader_batch_unpend(l, b);
}

/* Estimated counts: the open slot that recorded read index k (slots hold
 * consecutive ranges), or NULL. */
static struct shard_slot *slot_of_read(const struct reader *rd, uint64_t k)
{
    for (struct shard_slot *s = rd->open; s; s = s->next)
        if (s->started && k >= s->first_read && k < s->first_read + s->recorded)
            return s;
    return NULL;
}

/* Puts one delivered ref into its slot. Returns 0, or -1 to stop. */
static int reader_assign(struct sf_loader *l, struct reader *rd, const struct sf_sample_ref *r)
{
    uint64_t B = l->o.batch_size;
    uint64_t bindex = rd->position / B;
    unsigned slot = (unsigned)(rd->position % B);
    if (!rd->cur) {
        if (reader_wait_slot(l, rd, bindex) != 0)
            return -1;
    }
    struct batch *b = rd->cur;
    struct shard_slot *sh = NULL;
    uint64_t sample = r->sample, shard = r->shard;
    unsigned flags = r->flags & SF_SAMPLE_PAD;
    if (rd->est) {
        sh = slot_of_read(rd, r->read_index);
        if (sh) {
            sample = r->read_index - sh->first_read;
            shard = sh->shard;
            flags = sh->pad ? SF_SAMPLE_PAD : 0;
        }
    } else {
        sh = l->slot_of[r->shard];
        if (sh && (r->sample < sh->begin || r->sample >= sh->end))
            sh = NULL;
    }
    const struct sample_loc *loc = sh ? sf__loader_loc(sh, sample - sh->begin) : NULL;
    if (!loc || !loc->present) {
        sf__loader_fail(l, SF_ERR_INTERNAL,
                        "loader: sample %llu of shard %llu (read index %llu) is not held",
                        (unsigned long long)sample, (unsigned long long)shard,
                        (unsigned long long)r->read_index);
        return -1;
    }
    const char *key = loc->key;
    size_t klen = strlen(key) + 1;
    if (b->key_len + klen > b->key_cap) {
        size_t cap = b->key_cap ? b->key_cap * 2 : 8192;
        while (cap < b->key_len + klen)
            cap *= 2;
        char *k = realloc(b->key_arena, cap);
        if (!k) {
            sf__loader_fail(l, SF_ERR_NO_MEMORY, "loader: out of memory");
            return -1;
        }
        b->key_arena = k;
        b->key_cap = cap;
    }
    memcpy(b->key_arena + b->key_len, key, klen);
    b->key_off[slot] = b->key_len;
    b->key_len += klen;
    b->flags[slot] = flags;
    b->shards[slot] = shard;
    b->labels[slot] = -1;
    b->assigned = slot + 1;
    if (flags)
        atomic_fetch_add(&l->n_pads, 1);
    atomic_fetch_add(&b->pending, 1);
    struct work w = {
        .b = b,
        .slot = slot,
        .sh = sh,
        .loc = loc,
        .rng = sf__sample_rng_seed(l->o.sampler.seed, rd->epoch, shard, sample),
    };
    pthread_mutex_lock(&l->mu);
    /* The queue holds at most every slot of the ring: never full. */
    l->q[(l->q_head + l->q_len) % l->q_cap] = w;
    l->q_len++;
    pthread_cond_signal(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    rd->position++;
    if (rd->position % B == 0)
        reader_close_batch(l, rd);
    return 0;
}

/* Closes shards nobody needs any more. */
static void reader_sweep(struct sf_loader *l, struct reader *rd, int failed)
{
    struct shard_slot **pp = &rd->open;
    while (*pp) {
        struct shard_slot *s = *pp;
        /* Not before it is parsed while the epoch is read: the read count
         * of the plan walks through it. A cache download is let finish, so
         * it is published (verified, renamed) and the next epoch hits. */
        if (atomic_load(&s->refs) == 0 && (s->parsed || s->begin == s->end || rd->sampler_done) &&
            (s->done_fetch || !s->co || failed)) {
            *pp = s->next;
            sf__loader_shard_close(l, s);
            continue;
        }
        pp = &s->next;
    }
}

/* Until the first batch is assigned and decoded, another shard is opened
 * only while the ones opened have less than this left to download: the
 * head shard gets the bandwidth its first batch needs, and the decoders the
 * cores, instead of sharing them with the prefetched shards' downloads;
 * tiny shards still open many at once. */
#define START_INFLIGHT_BYTES (8ull << 20)

static int may_open_more(struct sf_loader *l, const struct reader *rd)
{
    if (!rd->open)
        return 1;
    if (rd->position >= l->o.batch_size &&
        atomic_load(&l->n_decoded) - rd->decoded_base >= l->o.batch_size)
        return 1;
    unsigned long long left = 0;
    for (const struct shard_slot *s = rd->open; s; s = s->next) {
        if (s->done_fetch)
            continue;
        if (s->size == SF_SIZE_UNKNOWN)
            return 0;
        left += s->size > s->contiguous ? s->size - s->contiguous : 0;
    }
    return left < START_INFLIGHT_BYTES;
}

/* Appends a newly opened slot: downloads are driven (and so started) in read
 * order, so the shard read first gets its bytes first. */
static void reader_append(struct reader *rd, struct shard_slot *sh)
{
    struct shard_slot **tail = &rd->open;
    while (*tail)
        tail = &(*tail)->next;
    *tail = sh;
    rd->next_open++;
}

static unsigned count_unparsed(const struct reader *rd)
{
    unsigned n = 0;
    for (const struct shard_slot *s = rd->open; s; s = s->next)
        n += !s->parsed;
    return n;
}

/* Drains the pipeline for a reset: waits until no decode is queued or
 * running, then frees batches not held by the consumer. */
static void reader_drain(struct sf_loader *l, struct reader *rd)
{
    reader_close_batch(l, rd);
    pthread_mutex_lock(&l->mu);
    while (l->q_len || l->active_decodes)
        sf__loader_cond_wait_ms(&l->cv_reader, &l->mu, 20);
    /* The gpu thread may be copying one: wait for it to settle. */
    for (unsigned i = 0; i < l->ring; i++) {
        struct batch *b = &l->batches[i];
        while (b->gpu_busy)
            sf__loader_cond_wait_ms(&l->cv_reader, &l->mu, 5);
        if (b->state != B_HELD)
            b->state = B_FREE;
    }
    pthread_mutex_unlock(&l->mu);
    reader_close_all(l, rd);
}


/* The slot of virtual plan index v, or NULL. */
static struct shard_slot *slot_at(struct reader *rd, uint64_t v)
{
    for (struct shard_slot *s = rd->open; s; s = s->next)
        if (s->vindex == v)
            return s;
    return NULL;
}

/* The stream's plan is read to its end: R is known. */
static void est_pass0_done(struct sf_loader *l, struct reader *rd)
{
    rd->pass0_done = 1;
    rd->real = rd->next_read;
    uint64_t B = l->o.batch_size;
    if (rd->target == UINT64_MAX) {
        /* Open-ended: the epoch is exactly the real samples. */
        sf_status st = sf_sampler_feed(l->sampler, rd->real, 1);
        if (st != SF_OK) {
            sf__loader_fail(l, SF_ERR_INTERNAL, "loader: %s", sf_sampler_errmsg(l->sampler));
            return;
        }
        rd->target = rd->real;
        rd->stop_at = l->o.drop_last ? rd->real / B * B : rd->real;
    } else if (rd->real > rd->target) {
        atomic_fetch_add(&l->n_dropped, rd->real - rd->target);
        sf__loader_log(l, SF_LOG_INFO,
                       "epoch %llu: %llu of this rank's %llu samples dropped to deliver %llu "
                       "like every rank (estimated counts)",
                       (unsigned long long)l->epoch, (unsigned long long)(rd->real - rd->target),
                       (unsigned long long)rd->real, (unsigned long long)rd->target);
    } else if (rd->real < rd->target) {
        if (rd->real == 0) {
            sf__loader_fail(l, SF_ERR_CORRUPT,
                            "the %zu shards dealt to this rank hold no samples, so it cannot "
                            "deliver the %llu every rank delivers in epoch %llu (first: %s)",
                            rd->n_plan, (unsigned long long)rd->target,
                            (unsigned long long)l->epoch,
                            rd->n_plan ? l->objs[rd->plan[0].shard]->url : "-");
            return;
        }
        sf__loader_log(l, SF_LOG_INFO,
                       "epoch %llu: this rank's shards hold %llu samples; %llu pads make the "
                       "%llu every rank delivers (estimated counts)",
                       (unsigned long long)l->epoch, (unsigned long long)rd->real,
                       (unsigned long long)(rd->target - rd->real),
                       (unsigned long long)rd->target);
    }
    pthread_mutex_lock(&l->mu);
    l->plan_done = 1;
    if (!l->size_known) {
        l->size_known = 1;
        l->epoch_positions = rd->real;
        l->epoch_batches = l->o.drop_last ? rd->real / B : (rd->real + B - 1) / B;
    }
    pthread_cond_broadcast(&l->cv_consumer);
    pthread_mutex_unlock(&l->mu);
}

/* Estimated counts: opens and parses the plan as passes (pass 0 real, later
 * passes pads up to the target). Returns 1 when something progressed. */
static int est_read(struct sf_loader *l, struct reader *rd)
{
    int progressed = 0;
    uint64_t n = rd->n_plan;
    /* 1. Open ahead, in virtual order. Pass 0 always (to its end, so every
     * count is learned); pad passes once R < T is known, one slot at a time. */
    for (;;) {
        uint64_t v = rd->next_open;
        int in_window = rd->next_read <= rd->position + rd->window || rd->position >= rd->stop_at;
        if (count_unparsed(rd) >= l->o.prefetch_shards + 1 || !in_window ||
            !may_open_more(l, rd))
            break;
        if (v >= n) {
            if (!rd->pass0_done || rd->real >= rd->target || rd->next_parse < v ||
                rd->next_read >= rd->target)
                break;
        }
        struct shard_slot *sh;
        if (sf__loader_shard_open(l, rd->plan[v % n].shard, 0, UINT64_MAX, &sh) != SF_OK)
            break;
        sh->vindex = v;
        sh->pad = v >= n;
        reader_append(rd, sh);
    }
    /* 2. Keep the downloads moving; parse the head. */
    for (struct shard_slot *s = rd->open; s; s = s->next)
        if (sf__loader_shard_pump(l, s, 0, 0) != SF_OK)
            return progressed;
    while (rd->next_parse < rd->next_open) {
        struct shard_slot *sh = slot_at(rd, rd->next_parse);
        if (!sh)
            break;
        if (!sh->started) {
            sh->started = 1;
            sh->first_read = rd->next_read;
            sh->read_limit = rd->target;
        }
        sf__loader_shard_priority(sh, 1);
        long got = sf__loader_shard_parse(l, sh);
        if (got < 0)
            return progressed;
        atomic_fetch_add(&l->n_read, (unsigned long long)got);
        uint64_t read_now = sh->first_read + (sh->pad ? sh->recorded : sh->next_sample);
        if (read_now != rd->next_read || got)
            progressed = 1;
        rd->next_read = read_now;
        if (!sh->parsed)
            break;
        sf__loader_shard_priority(sh, 0);
        if (!sh->pad && !sh->learned) {
            sh->learned = 1;
            sf__loader_learn(l, sh->shard, sh->next_sample);
        }
        rd->next_parse++;
        progressed = 1;
        if (rd->next_parse == n)
            est_pass0_done(l, rd);
    }
    if (rd->target == UINT64_MAX && !rd->pass0_done)
        sf_sampler_feed(l->sampler, rd->next_read, 0);
    return progressed;
}

void *sf__loader_reader_main(void *arg)
{
    struct sf_loader *l = arg;
    sf__nvtx_name_thread("sf reader");
    struct reader rd;
    memset(&rd, 0, sizeof(rd));
    reader_begin(l, &rd, 0);
    double busy = 0;
    for (;;) {
        pthread_mutex_lock(&l->mu);
        int stop = l->stop;
        int reset = l->reset_req && !l->reset_done;
        pthread_mutex_unlock(&l->mu);
        if (stop)
            break;
        if (reset) {
            reader_drain(l, &rd);
            pthread_mutex_lock(&l->mu);
            l->spec_active = 0; /* a next epoch read ahead is thrown away */
            sf_status st = SF_OK;
            uint64_t position = 0;
            if (l->next_sampler) {
                /* A basis change (estimated <-> exact counts) from the consumer. */
                sf_sampler_destroy(l->sampler);
                sf_sampler_destroy(l->counter);
                l->sampler = l->next_sampler;
                l->counter = l->next_counter;
                l->estimated = l->next_estimated;
                l->next_sampler = l->next_counter = NULL;
            }
            if (l->have_restore) {
                st = sf_sampler_state_restore(l->sampler, l->restore_state,
                                              sizeof(l->restore_state));
                position = l->restore_position;
            } else {
                sf_sampler_set_epoch(l->sampler, l->reset_epoch);
            }
            l->gen = (rd.gen > l->gen ? rd.gen : l->gen) + 1;
            pthread_mutex_unlock(&l->mu);
            if (st != SF_OK)
                sf__loader_fail(l, st, "%s", sf_sampler_errmsg(l->sampler));
            reader_begin(l, &rd, position);
            pthread_mutex_lock(&l->mu);
            l->reset_done = 1;
            pthread_cond_broadcast(&l->cv_consumer);
            pthread_mutex_unlock(&l->mu);
            continue;
        }
        pthread_mutex_lock(&l->mu);
        int failed = l->error != SF_OK;
        pthread_mutex_unlock(&l->mu);
        if (failed || (rd.sampler_done && !rd.cur && (!rd.est || rd.pass0_done))) {
            /* Idle: the epoch is assigned (or failed); finish the downloads
             * still running and close what is done. */
            if (!failed)
                for (struct shard_slot *s = rd.open; s; s = s->next)
                    if (sf__loader_shard_pump(l, s, 0, 0) != SF_OK)
                        break;
            reader_sweep(l, &rd, failed);
            if (!failed && !rd.open && reader_read_ahead(l, &rd))
                continue;
            pthread_mutex_lock(&l->mu);
            if (!l->stop && !(l->reset_req && !l->reset_done))
                sf__loader_cond_wait_ms(&l->cv_reader, &l->mu, 50);
            pthread_mutex_unlock(&l->mu);
            continue;
        }
        double t0 = sf__now_s();
        sf__nvtx_push("read");
        int progressed = 0;
        if (rd.est) {
            progressed = est_read(l, &rd);
            goto deliver;
        }
        /* 1. Open shards ahead, in plan order, while the read position is
         * within the shuffle window of what has been assigned (so memory
         * stays bounded when the consumer is slower than the bucket). */
        while (rd.next_open < rd.n_plan && count_unparsed(&rd) < l->o.prefetch_shards + 1 &&
               may_open_more(l, &rd) &&
               rd.samples_read <= rd.position + rd.window) {
            const struct sf_shard_range *pr = &rd.plan[rd.next_open];
            if (l->deliveries[pr->shard] == 0) {
                rd.next_open++; /* nothing of it is delivered (resumed, drop_last) */
                continue;
            }
            struct shard_slot *sh;
            if (sf__loader_shard_open(l, pr->shard, pr->begin, pr->end, &sh) != SF_OK)
                break;
            reader_append(&rd, sh);
        }
        /* 2. Keep every download moving; parse the head of the read order. */
        for (struct shard_slot *s = rd.open; s; s = s->next)
            if (sf__loader_shard_pump(l, s, 0, 0) != SF_OK)
                break;
        while (rd.next_parse < rd.n_plan) {
            const struct sf_shard_range *pr = &rd.plan[rd.next_parse];
            struct shard_slot *sh = l->slot_of[pr->shard];
            if (!sh) {
                if (rd.next_parse < rd.next_open && l->deliveries[pr->shard] == 0) {
                    /* skipped unopened: its samples count as read */
                    rd.samples_read += pr->end - pr->begin;
                    rd.next_parse++;
                    progressed = 1;
                    continue;
                }
                break;
            }
            sf__loader_shard_priority(sh, 1);
            long got = sf__loader_shard_parse(l, sh);
            if (got < 0)
                break;
            rd.samples_read += (uint64_t)got;
            atomic_fetch_add(&l->n_read, (unsigned long long)got);
            if (got)
                progressed = 1;
            if (sh->parsed) {
                sf__loader_shard_priority(sh, 0);
                rd.next_parse++;
                progressed = 1;
                continue;
            }
            break;
        }
    deliver:
        /* 3. Deliver what the sampler can now place. */
        while (rd.position < rd.stop_at) {
            if (!rd.have_pending) {
                int r = sf_sampler_next(l->sampler, &rd.pending);
                if (r == SF_SAMPLER_WAIT)
                    break; /* open-ended: fed as the reader parses */
                if (r == 0) {
                    rd.sampler_done = 1;
                    break;
                }
                rd.have_pending = 1;
            }
            if (rd.est) {
                if (rd.pending.read_index >= rd.next_read)
                    break;
                if (reader_assign(l, &rd, &rd.pending) != 0)
                    break;
                rd.have_pending = 0;
                progressed = 1;
                continue;
            }
            if (rd.pending.read_index >= rd.samples_read && !(rd.pending.flags & SF_SAMPLE_PAD))
                break;
            if ((rd.pending.flags & SF_SAMPLE_PAD) && rd.next_parse < rd.n_plan)
                break; /* pads repeat samples of a fully read stream */
            if (reader_assign(l, &rd, &rd.pending) != 0)
                break;
            rd.have_pending = 0;
            progressed = 1;
        }
        if (rd.position >= rd.stop_at && !rd.sampler_done && rd.est) {
            /* drop_last on estimates: each sample of the short tail took a
             * ref on its slot when it was recorded; give it back once its
             * read index is parsed, so the slot can close. */
            while (!rd.sampler_done) {
                if (!rd.have_pending) {
                    int r = sf_sampler_next(l->sampler, &rd.pending);
                    if (r != 1) {
                        rd.sampler_done = r == 0;
                        break;
                    }
                    rd.have_pending = 1;
                }
                if (rd.pending.read_index >= rd.next_read)
                    break;
                struct shard_slot *sh = slot_of_read(&rd, rd.pending.read_index);
                if (sh)
                    atomic_fetch_sub(&sh->refs, 1);
                rd.have_pending = 0;
                progressed = 1;
            }
        } else if (rd.position >= rd.stop_at && !rd.sampler_done) {
            /* drop_last: the rest of the epoch is not delivered; its shards'
             * deliveries are released. */
            /* The tail was not counted in the deliveries (count_deliveries). */
            struct sf_sample_ref r;
            rd.have_pending = 0;
            while (sf_sampler_next(l->sampler, &r) == 1)
                ;
            rd.sampler_done = 1;
        }
        if (rd.sampler_done)
            reader_close_batch(l, &rd);
        reader_sweep(l, &rd, 0);
        sf__nvtx_pop();
        busy += sf__now_s() - t0 - rd.blocked_s;
        rd.blocked_s = 0;
        pthread_mutex_lock(&l->mu);
        l->read_busy_s = busy;
        pthread_mutex_unlock(&l->mu);
        if (!progressed) {
            /* Wait for bytes of the head shard (the engine works meanwhile). */
            struct shard_slot *head =
                rd.est ? slot_at(&rd, rd.next_parse)
                : rd.next_parse < rd.n_plan ? l->slot_of[rd.plan[rd.next_parse].shard]
                                            : NULL;
            if (head && !head->done_fetch) {
                unsigned long long want = sf_shard_reader_wanted(head->r);
                if (want <= head->contiguous)
                    want = head->contiguous + 1;
                sf__loader_shard_pump(l, head, want, 20);
            } else {
                pthread_mutex_lock(&l->mu);
                if (!l->stop && !l->reset_req)
                    sf__loader_cond_wait_ms(&l->cv_reader, &l->mu, 5);
                pthread_mutex_unlock(&l->mu);
            }
        }
    }
    reader_close_batch(l, &rd);
    /* Wait for the workers to finish with the shards before closing them. */
    pthread_mutex_lock(&l->mu);
    while (l->active_decodes)
        sf__loader_cond_wait_ms(&l->cv_reader, &l->mu, 5);
    pthread_mutex_unlock(&l->mu);
    /* A shard whose bytes have all arrived is published (hashed, renamed)
     * rather than left as a partial download: that is local work only. */
    for (struct shard_slot *s = rd.open; s; s = s->next)
        if (s->co && !s->done_fetch && s->size != SF_SIZE_UNKNOWN && s->contiguous >= s->size)
            sf__loader_shard_pump(l, s, s->size, 10000);
    reader_close_all(l, &rd);
    free(rd.rs_buf);
    return NULL;
}
