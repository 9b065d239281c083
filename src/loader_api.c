/*
 * The loader's consumer API: next/release, set_epoch, state save/restore,
 * stats and the epoch size accessors. Run by the consumer thread (the one
 * that calls next); get_stats and errmsg may be called from any thread.
 */
#include "src/loader_internal.h"

#include "src/decode.h"
#include "src/gpu.h"
#include "src/record.h"
#include "src/sampler.h"
#include "common/endian.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ consumer API */

static int deliverable(const struct sf_loader *l, const struct batch *b)
{
    if (!l->on_device)
        return b->state == B_READY;
    if (b->state == B_GPU_DONE)
        return 1;
    return b->state == B_ON_GPU && !l->o.sync_device;
}

/* deadline_s < 0: wait as long as it takes. */
static sf_status next_batch(struct sf_loader *l, struct sf_batch *out, double timeout_s)
{
    if (!l || !out)
        return SF_ERR_INVALID_ARGUMENT;
    double t0 = sf__now_s();
    sf__nvtx_push("wait batch");
    pthread_mutex_lock(&l->mu);
    if (l->waits.t_first == 0)
        l->waits.t_first = t0;
    sf_status st = SF_OK;
    for (;;) {
        if (l->error != SF_OK) {
            st = l->error;
            break;
        }
        if (l->reset_req && !l->reset_done)
            goto wait;
        if (l->next_deliver >= l->epoch_batches) {
            st = SF_END_OF_EPOCH;
            break;
        }
        if (l->held + 1 >= l->ring) {
            st = SF_ERR_LIMIT;
            snprintf(l->errmsg, sizeof(l->errmsg),
                     "%u batches held: release one before asking for the next (prefetch_batches "
                     "%u)",
                     l->held, l->ring);
            break;
        }
        /* Estimated counts: the last batch waits until the plan is read to
         * its end, so every count of the epoch is saved before any rank can
         * start the next one (docs/sampling.md). */
        int last_waits = l->epoch_estimated && !l->plan_done &&
                         l->next_deliver + 1 >= l->epoch_batches;
        struct batch *b = last_waits ? NULL : sf__loader_find_batch(l, l->next_deliver);
        if (b && deliverable(l, b)) {
            if (b->size == 0 && (!l->on_device || !b->gpu_busy)) {
                /* every sample of it was skipped */
                b->state = B_FREE;
                l->next_deliver++;
                uint64_t end = b->position + l->o.batch_size;
                l->delivered_positions = end < l->epoch_positions ? end : l->epoch_positions;
                pthread_cond_broadcast(&l->cv_reader);
                continue;
            }
            if (b->size == 0)
                goto wait;
            b->state = B_HELD;
            l->held++;
            l->restored_fresh = 0;
            l->next_deliver++;
            uint64_t end = b->position + l->o.batch_size;
            l->delivered_positions = end < l->epoch_positions ? end : l->epoch_positions;
            memset(out, 0, sizeof(*out));
            out->epoch = b->epoch;
            out->index = b->index;
            out->position = b->position;
            out->size = b->size;
            out->width = l->o.image.width;
            out->height = l->o.image.height;
            out->channels = 3;
            out->layout = l->o.image.layout;
            out->dtype = l->o.image.dtype;
            out->image_bytes = l->image_bytes;
            out->images = b->images;
            out->labels = b->labels;
            out->flags = b->flags;
            out->keys = b->keys;
            out->shards = b->shards;
            out->field_count = l->n_extra;
            out->fields = l->n_extra ? b->fields : NULL;
            out->cuda_device = -1;
            out->device = SF_DEVICE_HOST;
            if (l->on_device) {
                unsigned idx = (unsigned)(b - l->batches);
                out->device_images = sf__gpu_u8(l->gpu, idx);
                if (l->o.normalize_on_device && l->o.image.dtype == SF_DTYPE_UINT8)
                    out->device_normalized = sf__gpu_f32(l->gpu, idx);
                out->cuda_event = sf__gpu_event(l->gpu, idx);
                out->cuda_device = sf__gpu_device(l->gpu);
                out->device = sf__gpu_backend_of(l->gpu) == SF__GPU_EMULATED ? SF_DEVICE_EMULATED
                                                                              : SF_DEVICE_CUDA;
                out->device_ring = l->gpu;
            }
            atomic_fetch_add(&l->n_delivered, b->size);
            atomic_fetch_add(&l->n_batches, 1);
            break;
        }
    wait:
        if (timeout_s >= 0) {
            double left = t0 + timeout_s - sf__now_s();
            if (left <= 0) {
                st = SF_NOT_READY;
                break;
            }
            sf__loader_cond_wait_ms(&l->cv_consumer, &l->mu,
                                    left < 0.05 ? (unsigned)(left * 1000) + 1 : 50);
            continue;
        }
        sf__loader_cond_wait_ms(&l->cv_consumer, &l->mu, 50);
    }
    const double waited = sf__now_s() - t0;
    l->consumer_wait_s += waited;
    if (st == SF_OK) {
        sf__wait_log_add(&l->waits, l->waits.pending_s + waited);
        l->waits.pending_s = 0;
    } else if (st == SF_NOT_READY) {
        l->waits.pending_s += waited;
    }
    pthread_mutex_unlock(&l->mu);
    sf__nvtx_pop();
    return st;
}

/* Releases b after the n streams (n = 0: at once). */
static sf_status release(struct sf_loader *l, const struct sf_batch *b, void *const *streams,
                         size_t n)
{
    if (!l || !b || (!streams && n > 0))
        return SF_ERR_INVALID_ARGUMENT;
    sf_status st = SF_OK;
    pthread_mutex_lock(&l->mu);
    for (unsigned i = 0; i < l->ring; i++) {
        struct batch *x = &l->batches[i];
        if (x->state == B_HELD && x->images == b->images && x->index == b->index &&
            x->epoch == b->epoch) {
            if (n > 0 && l->on_device)
                st = sf__gpu_release_after_streams(l->gpu, i, streams, n);
            if (st == SF_ERR_LIMIT)
                break; /* refused whole: the caller still holds the batch */
            x->state = B_FREE;
            l->held--;
            pthread_cond_broadcast(&l->cv_reader);
            break;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

void sf_loader_release(struct sf_loader *l, const struct sf_batch *b)
{
    (void)release(l, b, NULL, 0);
}

sf_status sf_loader_release_after(struct sf_loader *l, const struct sf_batch *b, void *stream)
{
    return release(l, b, &stream, 1);
}

sf_status sf_loader_release_after_streams(struct sf_loader *l, const struct sf_batch *b,
                                          void *const *streams, size_t n)
{
    return release(l, b, streams, n);
}

sf_status sf_batch_wait_stream(const struct sf_batch *b, void *stream)
{
    if (!b)
        return SF_ERR_INVALID_ARGUMENT;
    if (!b->cuda_event)
        return SF_OK;
    return sf__gpu_stream_wait(b->device_ring, b->cuda_event, stream);
}

sf_status sf_loader_next(struct sf_loader *l, struct sf_batch *out)
{
    return next_batch(l, out, -1);
}

sf_status sf_loader_next_wait(struct sf_loader *l, struct sf_batch *out, unsigned timeout_ms)
{
    return next_batch(l, out, timeout_ms / 1000.0);
}

static sf_status request_reset(struct sf_loader *l, uint64_t epoch, const void *state,
                               uint64_t position)
{
    pthread_mutex_lock(&l->mu);
    if (l->error != SF_OK) {
        sf_status st = l->error;
        pthread_mutex_unlock(&l->mu);
        return st;
    }
    l->reset_req = 1;
    l->reset_done = 0;
    l->reset_epoch = epoch;
    l->have_restore = state != NULL;
    if (state)
        memcpy(l->restore_state, state, SF_SAMPLER_STATE_BYTES);
    l->restore_position = position;
    pthread_cond_broadcast(&l->cv_reader);
    pthread_cond_broadcast(&l->cv_work);
    while (!l->reset_done && !l->stop)
        sf__loader_cond_wait_ms(&l->cv_consumer, &l->mu, 50);
    l->reset_req = 0;
    sf_status st = l->error;
    pthread_mutex_unlock(&l->mu);
    return st;
}

/* The fewest bytes a sample takes in a shard: a record's 40-byte header
 * (docs/FORMAT.md; its index entry is not counted: a shard cut before its
 * index still delivers its records), a tar member's 512-byte header. */
#define MIN_SAMPLE_BYTES SF__RECORD_REC_HEADER_BYTES

/* The most samples the shards can hold, from their sizes (one of unknown
 * size: max_shard_bytes, the most the loader reads of it), for a restore on
 * a stream whose length is not known: its only bound. why tells it. */
static uint64_t samples_bound(const struct sf_loader *l, char *why, size_t why_len)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < l->n_shards; i++) {
        uint64_t b = l->objs[i]->size == SF_SIZE_UNKNOWN ? l->o.max_shard_bytes : l->objs[i]->size;
        bytes = b > UINT64_MAX - bytes ? UINT64_MAX : bytes + b;
    }
    snprintf(why, why_len, "the %zu shard(s) can hold (%llu bytes, a sample taking at least %u)",
             l->n_shards, (unsigned long long)bytes, MIN_SAMPLE_BYTES);
    return bytes / MIN_SAMPLE_BYTES;
}

/* The position of a sampler state (docs/sampling.md: offset 32). */
static uint64_t sampler_state_position(const unsigned char *smp_state)
{
    return sf__get_le64(smp_state + 32);
}

/* A saved position is where a batch starts (the loader delivers whole
 * batches) or the end of its epoch (the last batch may be short): smp, just
 * restored, tells the end. Else the reader would fill the batch the
 * position cuts from its middle and the consumer, waiting for the next one,
 * never deliver it: those samples would be lost without a word. */
static sf_status check_batch_start(struct sf_loader *l, const struct sf_sampler *smp,
                                   uint64_t position)
{
    struct sf_sampler_info info;
    sf_sampler_get_info(smp, &info);
    if (position % l->o.batch_size == 0 || (info.size_known && position == info.epoch_size))
        return SF_OK;
    pthread_mutex_lock(&l->mu);
    snprintf(l->errmsg, sizeof(l->errmsg),
             "loader state position %llu is neither where a batch starts (batch_size %u) nor "
             "the end of epoch %llu",
             (unsigned long long)position, l->o.batch_size, (unsigned long long)info.epoch);
    pthread_mutex_unlock(&l->mu);
    return SF_ERR_INVALID_ARGUMENT;
}

/* Moves the loader to exact (estimated 0) or estimated counts: the
 * consumer's state sampler now, the reader's samplers at the next reset. */
static sf_status switch_basis(struct sf_loader *l, int estimated, uint64_t epoch,
                              const void *state)
{
    struct sf_sampler *a, *b, *c;
    char err[ERR_LEN] = "";
    sf_status st = sf__loader_make_samplers(l, estimated, epoch, &a, &b, &c, err, sizeof(err));
    if (st != SF_OK) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg), "%s", err);
        pthread_mutex_unlock(&l->mu);
        return st;
    }
    if (state) {
        char why[160];
        uint64_t bound = samples_bound(l, why, sizeof(why));
        st = sf__sampler_state_restore_within(c, state, SF_SAMPLER_STATE_BYTES, bound, why);
        if (st != SF_OK) {
            pthread_mutex_lock(&l->mu);
            snprintf(l->errmsg, sizeof(l->errmsg), "%s", sf_sampler_errmsg(c));
            pthread_mutex_unlock(&l->mu);
        } else {
            st = check_batch_start(l, c, sampler_state_position(state));
        }
        if (st != SF_OK) {
            sf_sampler_destroy(a);
            sf_sampler_destroy(b);
            sf_sampler_destroy(c);
            return st;
        }
    }
    sf_sampler_destroy(l->state_smp);
    l->state_smp = c;
    l->estimated_c = estimated;
    pthread_mutex_lock(&l->mu);
    sf_sampler_destroy(l->next_sampler);
    sf_sampler_destroy(l->next_counter);
    l->next_sampler = a;
    l->next_counter = b;
    l->next_estimated = estimated;
    pthread_mutex_unlock(&l->mu);
    return SF_OK;
}

/* The reader read `epoch` ahead and this one is delivered to its end: the
 * batches read ahead become the current epoch's, without a restart. */
static int adopt_read_ahead(struct sf_loader *l, uint64_t epoch)
{
    pthread_mutex_lock(&l->mu);
    int ok = l->spec_active && l->spec_epoch == epoch && l->error == SF_OK &&
             !(l->reset_req && !l->reset_done) && l->next_deliver >= l->epoch_batches &&
             !l->epoch_estimated;
    if (ok) {
        /* Nothing of the epoch that ended is left but batches the consumer
         * holds (delivered to its end); a leftover would block its slot. */
        for (unsigned i = 0; i < l->ring; i++) {
            struct batch *b = &l->batches[i];
            if (b->gen < l->spec_gen && b->state != B_HELD && b->state != B_FREE &&
                !b->gpu_busy)
                b->state = B_FREE;
        }
        l->gen = l->spec_gen;
        l->epoch = epoch;
        l->epoch_positions = l->spec_positions;
        l->epoch_batches = l->spec_batches;
        l->size_known = 1;
        l->plan_done = 1;
        l->next_deliver = 0;
        l->next_gpu = 0;
        l->delivered_positions = 0;
        l->spec_active = 0;
        atomic_fetch_add(&l->n_dropped, l->spec_dropped);
        pthread_cond_broadcast(&l->cv_consumer);
        pthread_cond_broadcast(&l->cv_gpu);
        pthread_cond_broadcast(&l->cv_reader);
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}

sf_status sf_loader_set_epoch(struct sf_loader *l, uint64_t epoch)
{
    if (!l)
        return SF_ERR_INVALID_ARGUMENT;
    int switch_basis_now = l->estimated_c && sf__loader_counts_complete(l);
    /* The epoch the loader is at, before anything of it was delivered (the
     * usual `for e in ...: set_epoch(e)` right after open): it is at its
     * beginning already; restarting would throw the read-ahead away. Right
     * after a state restore, that epoch stays at the restored position (the
     * same loop, resumed from a checkpoint). */
    pthread_mutex_lock(&l->mu);
    int fresh = !switch_basis_now && l->error == SF_OK && !(l->reset_req && !l->reset_done) &&
                l->epoch == epoch &&
                ((l->next_deliver == 0 && l->delivered_positions == 0) || l->restored_fresh);
    pthread_mutex_unlock(&l->mu);
    if (fresh)
        return SF_OK;
    l->restored_fresh = 0;
    pthread_mutex_lock(&l->mu);
    if (epoch != l->epoch)
        l->epochs_moved++;
    pthread_mutex_unlock(&l->mu);
    if (!switch_basis_now && adopt_read_ahead(l, epoch)) {
        sf_sampler_set_epoch(l->state_smp, epoch);
        return SF_OK;
    }
    /* Counts learned since (this run or another rank of the node): the new
     * epoch is exact when every one is known. */
    if (switch_basis_now) {
        sf_status st = switch_basis(l, 0, epoch, NULL);
        if (st != SF_OK)
            return st;
        sf__loader_log(l, SF_LOG_INFO, "epoch %llu: every shard's sample count is known: exact",
                       (unsigned long long)epoch);
    }
    sf_sampler_set_epoch(l->state_smp, epoch);
    return request_reset(l, epoch, NULL, 0);
}

/* State: "SFLD" v1, batch size, position, epoch, sampler state, checksum. */
#define STATE_MAGIC 0x444c4653u
_Static_assert(SF_LOADER_STATE_BYTES == 32 + SF_SAMPLER_STATE_BYTES + 8, "loader state layout");

static uint64_t state_sum(const unsigned char *p, size_t n)
{
    uint64_t h = 0x6c6f616465727631ULL; /* "loaderv1" */
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        for (size_t k = 0; k < 8 && i + k < n; k++)
            w |= (uint64_t)p[i + k] << (8 * k);
        h = sf__sample_rng_seed(h, w, 0x5354415445ULL, i);
    }
    return h;
}

sf_status sf_loader_state_save(struct sf_loader *l, void *buf, size_t len)
{
    if (!l || !buf || len < SF_LOADER_STATE_BYTES)
        return SF_ERR_INVALID_ARGUMENT;
    unsigned char *p = buf;
    memset(p, 0, SF_LOADER_STATE_BYTES);
    pthread_mutex_lock(&l->mu);
    uint64_t position = l->delivered_positions;
    uint64_t epoch = l->epoch;
    int length_known = l->epoch_estimated && l->size_known;
    uint64_t length = l->epoch_positions;
    pthread_mutex_unlock(&l->mu);
    sf__put_le64(p, STATE_MAGIC | (1ULL << 32));
    sf__put_le64(p + 8, l->o.batch_size);
    sf__put_le64(p + 16, position);
    sf__put_le64(p + 24, epoch);
    sf_sampler_set_epoch(l->state_smp, epoch);
    if (length_known)
        sf_sampler_feed(l->state_smp, length, 1); /* open-ended: its real length */
    sf_status st = sf_sampler_state_save_at(l->state_smp, position, p + 32, SF_SAMPLER_STATE_BYTES);
    if (st != SF_OK)
        return st;
    sf__put_le64(p + 32 + SF_SAMPLER_STATE_BYTES, state_sum(p, 32 + SF_SAMPLER_STATE_BYTES));
    return SF_OK;
}

sf_status sf_loader_state_restore(struct sf_loader *l, const void *state, size_t len)
{
    if (!l || !state)
        return SF_ERR_INVALID_ARGUMENT;
    const unsigned char *p = state;
    /* The magic first: a newer library's state (another version, maybe
     * another length and checksum) is named as such, not as damaged. */
    int ours = len >= 8 && (sf__get_le64(p) & 0xffffffffu) == STATE_MAGIC;
    uint32_t version = ours ? (uint32_t)(sf__get_le64(p) >> 32) : 0;
    if (ours && version != 1) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg),
                 "loader state version %u is not supported (this library reads version 1)",
                 version);
        pthread_mutex_unlock(&l->mu);
        return SF_ERR_UNSUPPORTED;
    }
    if (len != SF_LOADER_STATE_BYTES || !ours ||
        sf__get_le64(p + 32 + SF_SAMPLER_STATE_BYTES) != state_sum(p, 32 + SF_SAMPLER_STATE_BYTES)) {
        pthread_mutex_lock(&l->mu);
        if (len != SF_LOADER_STATE_BYTES)
            snprintf(l->errmsg, sizeof(l->errmsg),
                     "not a loader state: %zu bytes, a loader state is %d (cut short or padded?)",
                     len, SF_LOADER_STATE_BYTES);
        else
            snprintf(l->errmsg, sizeof(l->errmsg), "not a loader state (bad magic or checksum)");
        pthread_mutex_unlock(&l->mu);
        return SF_ERR_CORRUPT;
    }
    if (sf__get_le64(p + 8) != l->o.batch_size) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg),
                 "the state was saved with batch_size %llu, this loader has %u",
                 (unsigned long long)sf__get_le64(p + 8), l->o.batch_size);
        pthread_mutex_unlock(&l->mu);
        return SF_ERR_INVALID_ARGUMENT;
    }
    /* The loader's position and epoch are its sampler state's, saved
     * together: a state where they differ was made, not saved, and would
     * start the reader and the batches at different places. */
    uint64_t position = sf__get_le64(p + 16), epoch = sf__get_le64(p + 24);
    uint64_t smp_position = sampler_state_position(p + 32), smp_epoch = sf__get_le64(p + 32 + 24);
    if (position != smp_position || epoch != smp_epoch) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg),
                 "loader state is inconsistent: position %llu of epoch %llu, its sampler "
                 "state says position %llu of epoch %llu",
                 (unsigned long long)position, (unsigned long long)epoch,
                 (unsigned long long)smp_position, (unsigned long long)smp_epoch);
        pthread_mutex_unlock(&l->mu);
        return SF_ERR_CORRUPT;
    }
    /* A state saved on estimated counts (sampler state version 2) is
     * restored on estimates, even if every count is known by now; an exact
     * one needs every count. */
    int want_est = p[32 + 8] == 2;
    if (want_est != l->estimated_c) {
        if (!want_est && !sf__loader_counts_complete(l)) {
            pthread_mutex_lock(&l->mu);
            snprintf(l->errmsg, sizeof(l->errmsg),
                     "the state was saved with every shard's sample count known; this loader "
                     "does not know them all (write index.json with `shardfeed index`)");
            pthread_mutex_unlock(&l->mu);
            return SF_ERR_INVALID_ARGUMENT;
        }
        sf_status st = switch_basis(l, want_est, epoch, p + 32);
        if (st == SF_OK)
            st = request_reset(l, epoch, p + 32, position);
        l->restored_fresh = st == SF_OK;
        return st;
    }
    /* Check the sampler part on the consumer's own sampler first, so a
     * mismatch is reported without disturbing the pipeline. */
    char why[160];
    uint64_t bound = samples_bound(l, why, sizeof(why));
    unsigned char before[SF_SAMPLER_STATE_BYTES];
    int have_before = sf_sampler_state_save(l->state_smp, before, sizeof(before)) == SF_OK;
    sf_status st =
        sf__sampler_state_restore_within(l->state_smp, p + 32, SF_SAMPLER_STATE_BYTES, bound, why);
    if (st != SF_OK) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg), "%s", sf_sampler_errmsg(l->state_smp));
        pthread_mutex_unlock(&l->mu);
        return st;
    }
    st = check_batch_start(l, l->state_smp, position);
    if (st != SF_OK) {
        if (have_before) /* where it was: a refused state changes nothing */
            sf_sampler_state_restore(l->state_smp, before, sizeof(before));
        return st;
    }
    st = request_reset(l, epoch, p + 32, position);
    l->restored_fresh = st == SF_OK;
    return st;
}

void sf_loader_get_stats(struct sf_loader *l, struct sf_loader_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!l)
        return;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    out->elapsed_s = (double)(t.tv_sec - l->t0.tv_sec) + (double)(t.tv_nsec - l->t0.tv_nsec) * 1e-9;
    out->samples_delivered = atomic_load(&l->n_delivered);
    out->batches_delivered = atomic_load(&l->n_batches);
    out->samples_skipped = atomic_load(&l->n_skipped);
    out->pad_samples = atomic_load(&l->n_pads);
    out->dropped_samples = atomic_load(&l->n_dropped);
    out->shards_without_end_marker = atomic_load(&l->n_no_end_marker);
    out->samples_read = atomic_load(&l->n_read);
    out->samples_decoded = atomic_load(&l->n_decoded);
    out->shards_opened = atomic_load(&l->n_shards_opened);
    out->bytes_read = atomic_load(&l->bytes_read);
    out->cache_hits = atomic_load(&l->cache_hits);
    out->cache_misses = atomic_load(&l->cache_misses);
    out->decode_busy_s = (double)atomic_load(&l->decode_busy_ns) * 1e-9;
    if (l->s3) {
        struct sf_s3_stats ss;
        sf_s3_get_stats(l->s3, &ss);
        out->bytes_fetched = ss.bytes_received;
        out->requests = ss.requests;
        out->retries = ss.retries;
    }
    pthread_mutex_lock(&l->mu);
    out->consumer_wait_s = l->consumer_wait_s;
    out->read_busy_s = l->read_busy_s;
    out->gpu_copy_s = l->gpu_copy_s;
    out->decode_queue = (unsigned)l->q_len;
    out->decode_queue_cap = (unsigned)l->q_cap;
    unsigned ready = 0;
    for (unsigned i = 0; i < l->ring; i++)
        ready += l->batches[i].state == B_READY || l->batches[i].state == B_ON_GPU ||
                 l->batches[i].state == B_GPU_DONE;
    out->ready_batches = ready;
    out->batch_ring = l->ring;
    out->epoch = l->epoch;
    pthread_mutex_unlock(&l->mu);
    out->decode_threads = l->n_workers;
    out->shards_in_flight = atomic_load(&l->shards_open);
    out->on_device = l->on_device;
    double e = out->elapsed_s > 0 ? out->elapsed_s : 1e-9;
    out->images_per_s = (double)out->samples_delivered / e;
    out->decode_per_s = (double)out->samples_decoded / e;
    out->read_per_s = (double)out->samples_read / e;
    out->fetch_mib_per_s = (double)out->bytes_fetched / e / 1048576.0;
}

/* The epoch's numbers that the reader and the consumer move under l->mu,
 * read at one moment; all 0 for NULL. Only the mutex changes, so a const
 * loader may be read. */
struct epoch_now {
    int size_known; /* positions is exact, not an estimate */
    int estimated;  /* this epoch runs on estimated counts */
    uint64_t positions, delivered;
};

static struct epoch_now epoch_now(const struct sf_loader *l)
{
    struct epoch_now e = {0, 0, 0, 0};
    if (!l)
        return e;
    struct sf_loader *m = (struct sf_loader *)l; /* the mutex only */
    pthread_mutex_lock(&m->mu);
    e.size_known = m->size_known;
    e.estimated = m->epoch_estimated;
    e.positions = m->epoch_positions;
    e.delivered = m->delivered_positions;
    pthread_mutex_unlock(&m->mu);
    return e;
}

int sf_loader_epoch_size_known(struct sf_loader *l)
{
    return epoch_now(l).size_known;
}

uint64_t sf_loader_epoch_samples(const struct sf_loader *l)
{
    if (!l)
        return 0;
    uint64_t n = sf_sampler_epoch_size(l->state_smp);
    if (l->estimated_c) {
        /* The reader learns an open-ended stream's real length. */
        const struct epoch_now e = epoch_now(l);
        if (e.size_known && e.estimated)
            n = e.positions;
    }
    /* drop_last: the short last batch is never delivered */
    return l->o.drop_last ? n / l->o.batch_size * l->o.batch_size : n;
}

uint64_t sf_loader_epoch_delivered(struct sf_loader *l)
{
    return epoch_now(l).delivered;
}

uint64_t sf_loader_epoch_batches(const struct sf_loader *l)
{
    if (!l)
        return 0;
    uint64_t n = sf_loader_epoch_samples(l), B = l->o.batch_size;
    return (n + B - 1) / B;
}

const char *sf_loader_errmsg(const struct sf_loader *l)
{
    return l ? l->errmsg : "";
}
