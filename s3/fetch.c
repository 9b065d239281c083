/*
 * The fetch object: its layout once the size is known, its progress
 * and frontier, and the public sf_fetch_* API. The locks are described
 * in s3/fetch_internal.h.
 */
#include "s3/fetch_internal.h"
#include "s3/etag.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ fetch state */

uint64_t sf__xfer_len(const struct xfer *x)
{
    return x->last - x->first + 1;
}

struct xfer *sf__range_at(struct sf_fetch *f, size_t i)
{
    return i == 0 ? &f->head : &f->rest[i - 1];
}

/* Moves the frontier over the completed ranges; f->lock held. */
void sf__publish_locked(struct sf_fetch *f)
{
    while (f->contig_idx < f->n_ranges) {
        struct xfer *x = sf__range_at(f, f->contig_idx);
        if (x->got < sf__xfer_len(x))
            break;
        f->contig_idx++;
    }
    uint64_t contiguous = f->total;
    if (f->contig_idx < f->n_ranges) {
        struct xfer *x = sf__range_at(f, f->contig_idx);
        contiguous = x->first - f->offset + x->got;
    } else if (f->n_ranges == 0) {
        contiguous = f->head.got;
    }
    int changed = contiguous != f->s_contiguous;
    f->s_contiguous = contiguous;
    /* A reader waiting for the next sample is woken once, not for every
     * 16 KiB callback of curl. */
    if (changed && f->s_waiters && contiguous >= f->s_wait_min)
        pthread_cond_broadcast(&f->cond);
}

void sf__publish_progress(struct sf_fetch *f)
{
    pthread_mutex_lock(&f->lock);
    sf__publish_locked(f);
    pthread_mutex_unlock(&f->lock);
}

/* The total is known: size the destination and lay out the ranges. */
sf_status sf__fetch_layout(struct sf__engine *e, struct sf_fetch *f, uint64_t size, char *msg,
                           size_t msg_len)
{
    f->size = size;
    if (f->offset > size || (f->offset == size && size > 0 && f->length != 0)) {
        snprintf(msg, msg_len, "%s: offset %" PRIu64 " is past the end (%" PRIu64 " bytes)",
                 f->loc.display, f->offset, size);
        return SF_ERR_RANGE;
    }
    uint64_t total = size - f->offset;
    if (f->length != SF_SIZE_UNKNOWN && f->length < total)
        total = f->length;
    f->total = total;
    if (f->fd < 0) {
        if (f->buf && total > f->buf_bytes) {
            snprintf(msg, msg_len,
                     "%s: %" PRIu64 " bytes do not fit the %" PRIu64 "-byte destination buffer",
                     f->loc.display, total, f->buf_bytes);
            return SF_ERR_LIMIT;
        }
        if (!f->buf) {
            if (total > e->cfg.opt.max_object_bytes) {
                snprintf(msg, msg_len, "%s: %" PRIu64 " bytes exceed max_object_bytes (%llu)",
                         f->loc.display, total, e->cfg.opt.max_object_bytes);
                return SF_ERR_LIMIT;
            }
            f->buf = malloc(total ? total : 1);
            if (!f->buf) {
                snprintf(msg, msg_len, "%s: cannot allocate %" PRIu64 " bytes", f->loc.display,
                         total);
                return SF_ERR_NO_MEMORY;
            }
            f->owns_buf = 1;
            f->buf_bytes = total;
        }
    }
    /*
     * The head is small (first bytes first); the next range ends at the first
     * multiple of chunk_bytes in object offsets and the others follow on
     * those multiples, so a cache's 4 MiB checksum blocks each fall in one
     * range when chunk_bytes is a multiple of 4 MiB (hashed as they arrive).
     */
    uint64_t chunk = e->cfg.opt.chunk_bytes;
    uint64_t end = f->offset + total;
    uint64_t head_end = f->offset + (total < f->first_bytes ? total : f->first_bytes);
    size_t n = 0;
    if (total > 0) {
        n = 1;
        if (head_end < end) {
            uint64_t next = (head_end / chunk + 1) * chunk; /* first boundary after head_end */
            n += 1;
            if (next < end)
                n += (size_t)((end - next + chunk - 1) / chunk);
        }
    }
    if (n > 1) {
        f->rest = calloc(n - 1, sizeof(*f->rest));
        if (!f->rest) {
            snprintf(msg, msg_len, "%s: cannot allocate %zu ranges", f->loc.display, n);
            return SF_ERR_NO_MEMORY;
        }
        f->n_rest = n - 1;
    }
    /* the head keeps whatever bytes it already has */
    if (total > 0) {
        f->head.first = f->offset;
        f->head.last = head_end - 1;
    }
    uint64_t at = head_end;
    for (size_t i = 1; i < n; i++) {
        struct xfer *x = &f->rest[i - 1];
        uint64_t stop = (at / chunk + 1) * chunk;
        x->f = f;
        x->first = at;
        x->last = (stop < end ? stop : end) - 1;
        at = x->last + 1;
    }
    f->n_ranges = n;
    pthread_mutex_lock(&f->lock);
    f->s_total = total;
    f->s_size = size;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    return SF_OK;
}

static struct sf_fetch *fetch_alloc(const struct sf_fetch_options *o)
{
    struct sf_fetch *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->data_lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    f->fd = o->fd;
    f->file_offset = o->file_offset;
    f->buf = o->buffer;
    f->buf_bytes = o->buffer ? o->buffer_bytes : 0;
    f->offset = o->offset;
    f->length = o->length;
    f->size = o->size;
    f->s_total = SF_SIZE_UNKNOWN;
    f->s_size = o->size;
    f->total = SF_SIZE_UNKNOWN;
    f->head.f = f;
    f->first_bytes = o->first_range_bytes ? o->first_range_bytes : SF_FETCH_FIRST_RANGE_DEFAULT;
    f->on_data = o->on_data;
    f->on_data_user = o->on_data_user;
    f->prio = f->prio_req = o->priority != 0;
    if (o->etag) /* a listing's ETag, in the form the headers are read in */
        sf__etag_canon(f->etag_expected, sizeof(f->etag_expected), o->etag, strlen(o->etag));
    snprintf(f->s_etag, sizeof(f->s_etag), "%s", f->etag_expected);
    return f;
}

sf_status sf__engine_fetch(struct sf__engine *e, const struct sf__locator *loc,
                           const struct sf_fetch_options *o, struct sf_fetch **out, char *err,
                           size_t err_len)
{
    *out = NULL;
    if (o->buffer && o->fd >= 0) {
        snprintf(err, err_len, "a fetch has one destination: buffer or fd, not both");
        return SF_ERR_INVALID_ARGUMENT;
    }
    struct sf_fetch *f = fetch_alloc(o);
    if (!f)
        return SF_ERR_NO_MEMORY;
    f->e = e;
    if (f->first_bytes > e->cfg.opt.chunk_bytes)
        f->first_bytes = e->cfg.opt.chunk_bytes;
    if (sf__locator_copy(loc, &f->loc) != SF_OK) {
        sf_fetch_destroy(f);
        return SF_ERR_NO_MEMORY;
    }
    if (o->length == 0 || o->size != SF_SIZE_UNKNOWN) {
        /* no probe needed: lay the ranges out now (the engine is not running
         * this fetch yet, so this thread may touch its I/O-thread fields) */
        char msg[512];
        sf_status st = SF_OK;
        if (o->size != SF_SIZE_UNKNOWN)
            st = sf__fetch_layout(e, f, o->size, msg, sizeof(msg));
        else {
            f->size = SF_SIZE_UNKNOWN;
            f->total = 0;
            f->n_ranges = 0;
        }
        if (st != SF_OK) {
            snprintf(err, err_len, "%s", msg);
            sf_fetch_destroy(f);
            return st;
        }
        if (f->total == 0) {
            f->s_total = 0;
            f->s_done = 1;
            f->released = 1;
            f->e = NULL;
            *out = f;
            return SF_OK;
        }
    } else {
        /* the probe is the head range of the layout to come */
        uint64_t first = f->first_bytes;
        uint64_t len = o->length != SF_SIZE_UNKNOWN && o->length < first ? o->length : first;
        f->head.first = o->offset;
        f->head.last = o->offset + len - 1;
    }
    pthread_mutex_lock(&e->lock);
    int down = e->shutdown;
    if (!down) {
        f->next_incoming = e->incoming_fetches;
        e->incoming_fetches = f;
    }
    pthread_mutex_unlock(&e->lock);
    if (down) {
        f->released = 1;
        f->e = NULL;
        sf_fetch_destroy(f);
        snprintf(err, err_len, "client is shutting down");
        return SF_ERR_CANCELLED;
    }
    sf__wake_all(e);
    *out = f;
    return SF_OK;
}

sf_status sf__fetch_new_done(const struct sf_fetch_options *o, uint64_t object_size, uint64_t total,
                             sf_status st, const char *msg, void *owned_buffer,
                             struct sf_fetch **out)
{
    struct sf_fetch *f = fetch_alloc(o);
    if (!f) {
        free(owned_buffer);
        return SF_ERR_NO_MEMORY;
    }
    if (owned_buffer) {
        f->buf = owned_buffer;
        f->owns_buf = 1;
        f->buf_bytes = total;
    }
    f->total = total;
    f->s_total = total;
    f->s_size = object_size;
    f->s_contiguous = st == SF_OK ? total : 0;
    f->s_received = f->s_contiguous;
    f->s_done = 1;
    f->s_status = st;
    f->released = 1;
    if (msg)
        snprintf(f->errmsg, sizeof(f->errmsg), "%s", msg);
    *out = f;
    return SF_OK;
}

/* ------------------------------------------------------------ sf_fetch */

SF_API void sf_fetch_options_init_default(struct sf_fetch_options *o)
{
    memset(o, 0, sizeof(*o));
    o->fd = -1;
    o->length = SF_SIZE_UNKNOWN;
    o->size = SF_SIZE_UNKNOWN;
}

static void fill_progress(struct sf_fetch *f, struct sf_fetch_progress *p)
{
    p->total = f->s_total;
    p->object_size = f->s_size;
    p->contiguous = f->s_contiguous;
    p->received = f->s_received;
    p->requests = f->s_requests;
    p->retries = f->s_retries;
    p->done = f->s_done;
    p->status = f->s_status;
}

SF_API void sf_fetch_progress(struct sf_fetch *f, struct sf_fetch_progress *p)
{
    pthread_mutex_lock(&f->lock);
    fill_progress(f, p);
    pthread_mutex_unlock(&f->lock);
}

SF_API sf_status sf_fetch_wait(struct sf_fetch *f, unsigned long long min_contiguous,
                               int timeout_ms, struct sf_fetch_progress *p)
{
    struct timespec deadline;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    sf_status st = SF_OK;
    pthread_mutex_lock(&f->lock);
    if (!f->s_done && f->s_contiguous < min_contiguous) {
        f->s_waiters++;
        if (f->s_waiters == 1 || min_contiguous < f->s_wait_min)
            f->s_wait_min = min_contiguous;
        while (!f->s_done && f->s_contiguous < min_contiguous) {
            if (timeout_ms < 0) {
                pthread_cond_wait(&f->cond, &f->lock);
            } else if (pthread_cond_timedwait(&f->cond, &f->lock, &deadline) == ETIMEDOUT) {
                break;
            }
        }
        f->s_waiters--;
        /* The others' thresholds are not known: wake them on any progress. */
        f->s_wait_min = 0;
    }
    if (f->s_done)
        st = f->s_status;
    else if (f->s_contiguous < min_contiguous)
        st = SF_ERR_TIMEOUT;
    if (p)
        fill_progress(f, p);
    pthread_mutex_unlock(&f->lock);
    return st;
}

SF_API void sf_fetch_set_priority(struct sf_fetch *f, int priority)
{
    struct sf__engine *e = f->e;
    if (!e)
        return; /* finished when it was created (local file, empty range) */
    pthread_mutex_lock(&e->lock);
    f->prio_req = priority != 0;
    e->prio_pending = 1;
    pthread_mutex_unlock(&e->lock);
    sf__wake_all(e);
}

SF_API void *sf_fetch_data(struct sf_fetch *f)
{
    pthread_mutex_lock(&f->lock);
    void *d = f->owns_buf && f->s_total != SF_SIZE_UNKNOWN ? f->buf : NULL;
    pthread_mutex_unlock(&f->lock);
    return d;
}

SF_API const char *sf_fetch_etag(struct sf_fetch *f)
{
    return f->s_etag;
}

SF_API const char *sf_fetch_errmsg(struct sf_fetch *f)
{
    return f->errmsg;
}

SF_API void sf_fetch_destroy(struct sf_fetch *f)
{
    if (!f)
        return;
    struct sf__engine *e = f->e;
    if (e) {
        pthread_mutex_lock(&f->lock);
        int released = f->released;
        pthread_mutex_unlock(&f->lock);
        if (!released) {
            pthread_mutex_lock(&e->lock);
            f->cancel = 1;
            e->cancel_pending = 1;
            pthread_mutex_unlock(&e->lock);
            sf__wake_all(e);
            pthread_mutex_lock(&f->lock);
            while (!f->released)
                pthread_cond_wait(&f->cond, &f->lock);
            pthread_mutex_unlock(&f->lock);
        }
    }
    if (f->owns_buf)
        free(f->buf);
    free(f->rest);
    sf__locator_free(&f->loc);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->data_lock);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

unsigned sf__fetch_io_threads_used(struct sf_fetch *f)
{
    pthread_mutex_lock(&f->lock);
    uint64_t m = f->workers_used;
    pthread_mutex_unlock(&f->lock);
    unsigned n = 0;
    for (; m; m &= m - 1)
        n++;
    return n;
}
