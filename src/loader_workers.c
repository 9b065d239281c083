/*
 * Loader batch ring and the threads that fill and copy it: batch
 * alloc/free/finish, the decode workers (decode_threads of them) and the gpu
 * thread that copies finished batches to the device. batch_finish runs on
 * whichever thread drops a batch's last pending count (a worker or the
 * reader).
 */
#include "src/loader_internal.h"

#include "common/file.h"
#include "src/decode.h"
#include "src/gpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ batches */

void sf__loader_batch_free(struct sf_loader *l, struct batch *b)
{
    sf__host_free(b->images, b->pinned);
    free(b->labels);
    free(b->flags);
    free(b->shards);
    free(b->skipped);
    free(b->key_arena);
    free(b->key_off);
    free(b->keys);
    if (b->extra)
        for (size_t i = 0; i < (size_t)l->o.batch_size * l->n_extra; i++)
            free(b->extra[i].p);
    free(b->extra);
    free(b->field_data);
    free(b->field_offsets);
    free(b->fields);
}

sf_status sf__loader_batch_alloc(struct sf_loader *l, struct batch *b)
{
    size_t n = l->o.batch_size;
    b->images = sf__host_alloc(n * l->image_bytes, l->on_device, &b->pinned);
    b->labels = calloc(n, sizeof(*b->labels));
    b->flags = calloc(n, sizeof(*b->flags));
    b->shards = calloc(n, sizeof(*b->shards));
    b->skipped = calloc(n, 1);
    b->key_off = calloc(n, sizeof(*b->key_off));
    b->keys = calloc(n, sizeof(*b->keys));
    if (!b->images || !b->labels || !b->flags || !b->shards || !b->skipped || !b->key_off ||
        !b->keys)
        return SF_ERR_NO_MEMORY;
    if (l->n_extra) {
        b->extra = calloc(n * l->n_extra, sizeof(*b->extra));
        b->field_offsets = calloc(l->n_extra * (n + 1), sizeof(*b->field_offsets));
        b->fields = calloc(l->n_extra, sizeof(*b->fields));
        if (!b->extra || !b->field_offsets || !b->fields)
            return SF_ERR_NO_MEMORY;
    }
    return SF_OK;
}

/* All slots decoded: compact skips, lay out the extra fields, publish.
 * Called by whoever dropped pending to 0 (outside mu). */
static void batch_finish(struct sf_loader *l, struct batch *b)
{
    size_t n = b->assigned, out = 0;
    size_t ib = l->image_bytes;
    for (size_t i = 0; i < n; i++) {
        if (b->skipped[i])
            continue;
        if (out != i) {
            memmove(b->images + out * ib, b->images + i * ib, ib);
            b->labels[out] = b->labels[i];
            b->flags[out] = b->flags[i];
            b->shards[out] = b->shards[i];
            b->key_off[out] = b->key_off[i];
            for (size_t e = 0; e < l->n_extra; e++) {
                struct slot_extra t = b->extra[out * l->n_extra + e];
                b->extra[out * l->n_extra + e] = b->extra[i * l->n_extra + e];
                b->extra[i * l->n_extra + e] = t;
            }
        }
        out++;
    }
    b->size = out;
    for (size_t i = 0; i < out; i++)
        b->keys[i] = b->key_arena + b->key_off[i];
    int oom = 0;
    if (l->n_extra) {
        size_t total = 0;
        for (size_t i = 0; i < out * l->n_extra; i++)
            total += b->extra[i].len;
        if (total > b->field_cap) {
            unsigned char *d = realloc(b->field_data, total);
            if (d) {
                b->field_data = d;
                b->field_cap = total;
            } else {
                oom = 1;
            }
        }
        size_t at = 0;
        for (size_t e = 0; e < l->n_extra && !oom; e++) {
            uint64_t *off = b->field_offsets + e * ((size_t)l->o.batch_size + 1);
            b->fields[e].name = l->extra_names[e];
            b->fields[e].data = b->field_data + at;
            size_t start = at;
            for (size_t i = 0; i < out; i++) {
                off[i] = at - start;
                struct slot_extra *x = &b->extra[i * l->n_extra + e];
                if (x->len)
                    memcpy(b->field_data + at, x->p, x->len);
                at += x->len;
            }
            off[out] = at - start;
            b->fields[e].offsets = off;
        }
    }
    if (oom) {
        sf__loader_fail(l, SF_ERR_NO_MEMORY, "batch %llu: out of memory for extra fields",
                        (unsigned long long)b->index);
        return;
    }
    pthread_mutex_lock(&l->mu);
    /* gen above the loader's: the next epoch read ahead, ready for when
     * set_epoch adopts it. */
    if (b->state == B_FILLING && b->gen >= l->gen)
        b->state = B_READY;
    pthread_cond_broadcast(&l->cv_consumer);
    pthread_cond_broadcast(&l->cv_gpu);
    pthread_cond_broadcast(&l->cv_reader);
    pthread_mutex_unlock(&l->mu);
}

void sf__loader_batch_unpend(struct sf_loader *l, struct batch *b)
{
    if (atomic_fetch_sub(&b->pending, 1) == 1)
        batch_finish(l, b);
}

/* The ring slot holding batch `index` of the current generation, or NULL. */
struct batch *sf__loader_find_batch(struct sf_loader *l, uint64_t index)
{
    for (unsigned i = 0; i < l->ring; i++) {
        struct batch *b = &l->batches[i];
        if (b->index == index && b->gen == l->gen && b->state != B_FREE)
            return b;
    }
    return NULL;
}

/* ------------------------------------------------------------ decode workers */

static void shard_unref(struct sf_loader *l, struct shard_slot *sh)
{
    if (atomic_fetch_sub(&sh->refs, 1) == 1) {
        pthread_mutex_lock(&l->mu);
        pthread_cond_broadcast(&l->cv_reader);
        pthread_mutex_unlock(&l->mu);
    }
}

/*
 * A decoded sample's bytes are not read again from this mapping (a pad
 * re-reads them through the page cache), so the pages its decode mapped
 * leave this process: a mapped shard's resident size falls as its samples
 * are decoded instead of staying whole while the shuffle buffer still holds
 * one of them (docs/loader.md "Threads and memory"). The span and the
 * sweep (set by the reader, only for file mappings: a RAM-only download's
 * buffer is the only copy) may take a neighbour's pages too; reading them
 * faults them back unchanged.
 */
static void drop_pages(struct shard_slot *sh, const struct sample_loc *loc)
{
    if (loc->span)
        sf__drop_mapped(loc->span, loc->span_len);
    if (sh->sweep && (atomic_fetch_add(&sh->decodes, 1) + 1) % SF__DROP_SWEEP_EVERY == 0)
        sf__drop_mapped(sh->sweep, sh->sweep_len);
}

static sf_status decode_one(struct sf_loader *l, struct sf_decoder *d, const struct work *w,
                            char *err, size_t err_len)
{
    struct batch *b = w->b;
    const struct sample_loc *loc = w->loc;
    const char *url = l->objs[w->sh->shard]->url;
    const char *key = loc->key;
    unsigned char *dst = b->images + (size_t)w->slot * l->image_bytes;
    if (!loc->img) {
        snprintf(err, err_len, "%s: sample '%s' at offset %llu has no image field (%s)", url, key,
                 loc->offset, l->image_fields);
        return SF_ERR_NOT_FOUND;
    }
    char m[512];
    sf_status st =
        sf__decode_jpeg(d, &l->o.image, loc->img, loc->img_size, w->rng, dst, NULL, m, sizeof(m));
    if (st != SF_OK) {
        snprintf(err, err_len, "%s: sample '%s', image at offset %llu: %s", url, key, loc->img_off,
                 m);
        return st;
    }
    b->labels[w->slot] = -1;
    if (l->n_lbl && loc->lbl) {
        int64_t v;
        st = sf__parse_label(loc->lbl_name, loc->lbl, loc->lbl_size, &v, m, sizeof(m));
        if (st != SF_OK) {
            snprintf(err, err_len, "%s: sample '%s' at offset %llu: label: %s", url, key,
                     loc->offset, m);
            return st;
        }
        b->labels[w->slot] = v;
    }
    for (size_t e = 0; e < l->n_extra; e++) {
        struct slot_extra *x = &b->extra[(size_t)w->slot * l->n_extra + e];
        x->len = 0;
        if (!loc->extra[e].p) {
            snprintf(err, err_len, "%s: sample '%s' at offset %llu has no field '%s'", url, key,
                     loc->offset, l->extra_names[e]);
            return SF_ERR_NOT_FOUND;
        }
        if (l->extra_zst[e]) {
            size_t n = 0;
            st = sf__decode_zstd(d, loc->extra[e].p, loc->extra[e].n, l->o.max_extra_bytes, &x->p,
                                 &x->cap, &n, m, sizeof(m));
            if (st != SF_OK) {
                snprintf(err, err_len, "%s: sample '%s' at offset %llu: field '%s': %s", url, key,
                         loc->offset, l->extra_names[e], m);
                return st;
            }
            x->len = n;
            continue;
        }
        if (loc->extra[e].n > l->o.max_extra_bytes) {
            snprintf(err, err_len,
                     "%s: sample '%s' at offset %llu: field '%s' is %zu bytes, over "
                     "max_extra_bytes",
                     url, key, loc->offset, l->extra_names[e], loc->extra[e].n);
            return SF_ERR_LIMIT;
        }
        if (loc->extra[e].n > x->cap) {
            unsigned char *p = realloc(x->p, loc->extra[e].n);
            if (!p) {
                snprintf(err, err_len, "out of memory");
                return SF_ERR_NO_MEMORY;
            }
            x->p = p;
            x->cap = loc->extra[e].n;
        }
        memcpy(x->p, loc->extra[e].p, loc->extra[e].n);
        x->len = loc->extra[e].n;
    }
    drop_pages(w->sh, loc);
    return SF_OK;
}

void *sf__loader_worker_main(void *arg)
{
    struct sf_loader *l = arg;
    sf__nvtx_name_thread("sf decode");
    struct sf_decoder *d = NULL;
    if (sf__decoder_new(&d) != SF_OK) {
        sf__loader_fail(l, SF_ERR_NO_MEMORY, "decode worker: out of memory");
        return NULL;
    }
    char err[ERR_LEN];
    /* One lock round per sample: the end of one and the start of the next. */
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->q_len == 0)
            pthread_cond_wait(&l->cv_work, &l->mu);
        if (l->stop)
            break;
        struct work w = l->q[l->q_head];
        l->q_head = (l->q_head + 1) % l->q_cap;
        l->q_len--;
        l->active_decodes++;
        int failed = l->error != SF_OK;
        pthread_mutex_unlock(&l->mu);

        sf_status st = SF_OK;
        if (!failed) {
            const uint64_t t0 = sf__now_ns();
            sf__nvtx_push("decode");
            st = decode_one(l, d, &w, err, sizeof(err));
            sf__nvtx_pop();
            atomic_fetch_add(&l->decode_busy_ns, (unsigned long long)(sf__now_ns() - t0));
        }
        if (st == SF_OK && !failed) {
            atomic_fetch_add(&l->n_decoded, 1);
        } else if (st != SF_OK) {
            if (l->o.on_error == SF_ON_ERROR_SKIP && st != SF_ERR_NO_MEMORY) {
                w.b->skipped[w.slot] = 1;
                unsigned long long k = atomic_fetch_add(&l->n_skipped, 1);
                if (k < 10)
                    sf__loader_log(l, SF_LOG_WARN, "skipped: %s", err);
            } else {
                sf__loader_fail(l, st, "%s", err);
            }
        }
        shard_unref(l, w.sh);
        sf__loader_batch_unpend(l, w.b);
        pthread_mutex_lock(&l->mu);
        l->active_decodes--;
        if (l->active_decodes == 0 && l->q_len == 0)
            pthread_cond_broadcast(&l->cv_reader);
    }
    pthread_mutex_unlock(&l->mu);
    sf__decoder_destroy(d);
    return NULL;
}

/* ------------------------------------------------------------ gpu thread */

void *sf__loader_gpu_main(void *arg)
{
    struct sf_loader *l = arg;
    sf__nvtx_name_thread("sf gpu copy");
    pthread_mutex_lock(&l->mu);
    for (;;) {
        struct batch *b = NULL;
        while (!l->stop) {
            b = sf__loader_find_batch(l, l->next_gpu);
            if (b && b->state == B_READY)
                break;
            sf__loader_cond_wait_ms(&l->cv_gpu, &l->mu, 50);
        }
        if (l->stop)
            break;
        unsigned idx = (unsigned)(b - l->batches); /* device slot = host slot */
        b->gpu_busy = 1;
        pthread_mutex_unlock(&l->mu);

        struct sf__gpu_job job;
        memset(&job, 0, sizeof(job));
        job.host = b->images;
        job.bytes = b->size * l->image_bytes;
        job.normalize = l->o.normalize_on_device && l->o.image.dtype == SF_DTYPE_UINT8;
        job.n_images = b->size;
        job.width = l->o.image.width;
        job.height = l->o.image.height;
        job.layout = l->o.image.layout;
        memcpy(job.mean, l->o.image.mean, sizeof(job.mean));
        memcpy(job.std, l->o.image.std, sizeof(job.std));
        char err[ERR_LEN];
        sf__nvtx_push("h2d");
        sf_status st = job.bytes ? sf__gpu_submit(l->gpu, idx, &job, err, sizeof(err)) : SF_OK;
        pthread_mutex_lock(&l->mu);
        if (st == SF_OK && b->state == B_READY)
            b->state = B_ON_GPU;
        pthread_cond_broadcast(&l->cv_consumer);
        pthread_mutex_unlock(&l->mu);
        double s = 0;
        if (st == SF_OK && job.bytes)
            st = sf__gpu_wait(l->gpu, idx, &s, err, sizeof(err));
        sf__nvtx_pop();
        if (st != SF_OK)
            sf__loader_fail(l, st, "batch %llu: %s", (unsigned long long)b->index, err);
        pthread_mutex_lock(&l->mu);
        b->gpu_s = s;
        l->gpu_copy_s += s;
        b->gpu_busy = 0;
        if (b->state == B_ON_GPU)
            b->state = B_GPU_DONE;
        l->next_gpu++;
        pthread_cond_broadcast(&l->cv_consumer);
        pthread_cond_broadcast(&l->cv_reader);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}
