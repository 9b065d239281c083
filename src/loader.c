/*
 * The loader: sampler -> fetch/cache -> shard reader -> decode workers ->
 * batch ring -> GPU prefetcher -> consumer (include/shardfeed_loader.h,
 * docs/loader.md).
 *
 * Threads:
 *  - the reader thread owns the S3 client's fetches, the cache (single
 *    threaded by contract), the shard readers and the sampler. It opens
 *    shards prefetch_shards ahead in plan order, parses them as bytes arrive,
 *    takes the sampler's order and puts each sample in its batch slot on the
 *    decode queue;
 *  - decode_threads workers decode into the slot and finish a batch when its
 *    last slot is done;
 *  - with a GPU, the gpu thread copies finished batches, in order, to the
 *    device slot of the same ring index and waits for the copy's event;
 *  - the consumer calls next/release.
 *
 * One mutex (l->mu) guards the shared state; the decode itself, parsing and
 * fetch waits run outside it. Shards stay open while a sample of theirs is
 * still to be delivered (counted per epoch by a second sampler run through
 * the epoch) or being decoded, so sample pointers into them stay valid.
 */
#include "src/loader.h"

#include "src/decode.h"
#include "src/gpu.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ERR_LEN 1024

enum batch_state {
    B_FREE = 0, /* in the ring, unused */
    B_FILLING,  /* slots being assigned and decoded */
    B_READY,    /* every slot decoded (host complete) */
    B_ON_GPU,   /* device copy queued (event valid) */
    B_GPU_DONE, /* device copy complete */
    B_HELD,     /* delivered to the consumer */
};

struct slot_extra {
    unsigned char *p;
    size_t len, cap;
};

struct batch {
    enum batch_state state;
    int gpu_busy; /* a device copy reads images: not refilled until it is done */
    uint64_t gen; /* epoch generation it was filled in */
    uint64_t epoch, index, position;
    unsigned assigned;
    atomic_uint pending; /* slots not decoded yet + 1 while the reader may still assign */
    size_t size;         /* after compaction */
    unsigned char *images;
    int pinned;
    int64_t *labels;
    uint32_t *flags;
    uint64_t *shards;
    uint8_t *skipped;
    char *key_arena;
    size_t key_len, key_cap;
    size_t *key_off;
    const char **keys;
    struct slot_extra *extra;  /* batch_size x n_extra */
    unsigned char *field_data; /* built at finish */
    size_t field_cap;
    uint64_t *field_offsets; /* n_extra x (batch_size + 1) */
    struct sf_batch_field *fields;
    double gpu_s;
};

/* Where one sample's fields are in its shard (or in owned copies). */
struct sample_loc {
    const unsigned char *img;
    size_t img_size;
    unsigned long long img_off;
    const unsigned char *lbl;
    size_t lbl_size;
    char lbl_name[8];
    char *key; /* owned; never moves while the shard is open (workers read it) */
    unsigned long long offset;
    unsigned char *owned; /* fields copied out of a reader-owned (zstd) record */
    struct {
        const unsigned char *p;
        size_t n;
    } * extra;
    int present; /* parsed */
};

struct shard_slot {
    uint64_t shard;
    uint64_t begin, end; /* plan range */
    struct sf_cache_object *co;
    struct sf_fetch *f;
    void *map;
    size_t map_len;
    const unsigned char *base;
    unsigned long long size, contiguous;
    int done_fetch, parsed, hit_counted;
    struct sf_shard_reader *r;
    struct sample_loc *locs; /* end - begin */
    uint64_t next_sample;    /* samples parsed so far (index in shard) */
    atomic_ullong refs;      /* deliveries left + decodes in flight */
    unsigned long long bytes_counted;
    struct shard_slot *next; /* open list */
};

struct work {
    struct batch *b;
    unsigned slot;
    struct shard_slot *sh;
    const struct sample_loc *loc;
    uint64_t rng;
};

struct sf_loader {
    struct sf_loader_options o;
    char *image_fields, *label_fields, *extra_fields; /* owned copies */
    char **img_names, **lbl_names, **extra_names;
    size_t n_img, n_lbl, n_extra;
    char **extra_zst; /* names without .zst, or NULL */

    struct sf_s3 *s3;
    struct sf_cache *cache;
    struct sf_object_list **lists;
    size_t n_lists;
    const struct sf_object_info **objs;
    uint64_t *counts;
    size_t n_shards;

    struct sf_sampler *sampler;   /* reader thread */
    struct sf_sampler *counter;   /* deliveries per shard at epoch start */
    struct sf_sampler *state_smp; /* consumer thread: state save */
    uint64_t *deliveries;         /* per shard, this epoch */
    struct shard_slot **slot_of;  /* per shard, open slot or NULL */

    size_t image_bytes;
    unsigned ring;
    struct batch *batches;
    struct sf_gpu *gpu;
    int on_device;

    pthread_mutex_t mu;
    pthread_cond_t cv_reader, cv_consumer, cv_work, cv_gpu;
    pthread_t reader_th, gpu_th;
    pthread_t *workers;
    unsigned n_workers;
    int reader_started, gpu_started;

    /* decode queue (ring) */
    struct work *q;
    size_t q_cap, q_head, q_len;

    /* shared state under mu */
    int stop;
    sf_status error;
    char errmsg[ERR_LEN];
    uint64_t gen;  /* bumped by set_epoch / restore */
    int reset_req; /* consumer asks the reader to restart the epoch */
    uint64_t reset_epoch;
    int have_restore;
    unsigned char restore_state[SF_SAMPLER_STATE_BYTES];
    uint64_t restore_position;
    int reset_done;
    uint64_t epoch;
    uint64_t epoch_positions;     /* sampler epoch size */
    uint64_t epoch_batches;       /* batches this epoch */
    uint64_t next_deliver;        /* batch index the consumer gets next */
    uint64_t next_gpu;            /* batch index the gpu thread copies next */
    uint64_t delivered_positions; /* consumer position (state save) */
    unsigned held;
    unsigned active_decodes;

    /* statistics */
    struct timespec t0;
    atomic_ullong n_delivered, n_batches, n_skipped, n_pads, n_read, n_decoded, n_shards_opened,
        bytes_read, cache_hits, cache_misses;
    double consumer_wait_s, read_busy_s, gpu_copy_s;
    atomic_ullong decode_busy_ns;
    atomic_uint shards_open;
};

/* ------------------------------------------------------------ helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void logf_(struct sf_loader *l, enum sf_log_level lv, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(struct sf_loader *l, enum sf_log_level lv, const char *fmt, ...)
{
    if (!l->o.log || lv > l->o.log_level)
        return;
    char buf[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    l->o.log(l->o.log_user, lv, buf);
}

/* Records the first error (sticky) and wakes everyone. Takes mu. */
static void fail(struct sf_loader *l, sf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(struct sf_loader *l, sf_status st, const char *fmt, ...)
{
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&l->mu);
    int first = l->error == SF_OK;
    if (first) {
        l->error = st;
        snprintf(l->errmsg, sizeof(l->errmsg), "%s", msg);
    }
    pthread_cond_broadcast(&l->cv_consumer);
    pthread_cond_broadcast(&l->cv_reader);
    pthread_cond_broadcast(&l->cv_work);
    pthread_cond_broadcast(&l->cv_gpu);
    pthread_mutex_unlock(&l->mu);
    if (first)
        logf_(l, SF_LOG_ERROR, "%s", msg);
}

static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

static void free_names(char **v, size_t n);

/* Splits "a;b;c" into a NULL-terminated array of owned strings (NULL when
 * out of memory). */
static char **split_names(const char *s, size_t *n)
{
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ';';
    char **v = calloc(cap + 1, sizeof(*v));
    if (!v)
        return NULL;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ';');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len) {
            v[*n] = strndup(p, len);
            if (!v[*n]) {
                free_names(v, *n);
                *n = 0;
                return NULL;
            }
            (*n)++;
        }
        p += len + (e ? 1 : 0);
    }
    return v;
}

static void free_names(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

static const struct sf_sample_field *find_field(const struct sf_sample *s, const char *name)
{
    for (size_t i = 0; i < s->field_count; i++)
        if (!strcmp(s->fields[i].name, name))
            return &s->fields[i];
    return NULL;
}

static int is_local(const char *url)
{
    return strncmp(url, "s3://", 5) && strncmp(url, "http://", 7) && strncmp(url, "https://", 8);
}

static const char *local_path(const struct sf_object_info *obj)
{
    return !strncmp(obj->url, "file://", 7) ? obj->url + 7 : obj->url;
}

/* ------------------------------------------------------------ shards */

static void shard_close(struct sf_loader *l, struct shard_slot *sh)
{
    if (!sh)
        return;
    if (l->slot_of && l->slot_of[sh->shard] == sh) {
        l->slot_of[sh->shard] = NULL;
        atomic_fetch_sub(&l->shards_open, 1);
    }
    sf_shard_reader_destroy(sh->r);
    if (sh->co)
        sf_cache_object_close(sh->co);
    sf_fetch_destroy(sh->f); /* frees the engine-owned buffer; NULL is a no-op */
    if (sh->map && sh->map_len)
        munmap(sh->map, sh->map_len);
    if (sh->locs) {
        for (uint64_t i = 0; i < sh->end - sh->begin; i++) {
            free(sh->locs[i].owned);
            free(sh->locs[i].extra);
            free(sh->locs[i].key);
        }
        free(sh->locs);
    }
    free(sh);
}

/* Opens shard `shard` for its plan range. Reader thread. */
static sf_status shard_open(struct sf_loader *l, uint64_t shard, uint64_t begin, uint64_t end,
                            struct shard_slot **out)
{
    const struct sf_object_info *obj = l->objs[shard];
    struct shard_slot *sh = calloc(1, sizeof(*sh));
    if (!sh)
        return SF_ERR_NO_MEMORY;
    sh->shard = shard;
    sh->begin = begin;
    sh->end = end;
    sh->size = obj->size;
    sh->locs = calloc(end - begin ? end - begin : 1, sizeof(*sh->locs));
    if (!sh->locs) {
        free(sh);
        return SF_ERR_NO_MEMORY;
    }
    struct sf_shard_reader_options ro;
    sf_shard_reader_options_init_default(&ro);
    ro.name = obj->url;
    char err[ERR_LEN];
    sf_status st = sf_shard_reader_new(&ro, &sh->r, err, sizeof(err));
    if (st != SF_OK) {
        shard_close(l, sh);
        fail(l, st, "%s", err);
        return st;
    }
    if (is_local(obj->url)) {
        const char *path = local_path(obj);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            int e = errno;
            if (fd >= 0)
                close(fd);
            shard_close(l, sh);
            fail(l, e == ENOENT ? SF_ERR_NOT_FOUND : SF_ERR_IO, "%s: %s", path, strerror(e));
            return e == ENOENT ? SF_ERR_NOT_FOUND : SF_ERR_IO;
        }
        sh->size = (unsigned long long)sb.st_size;
        if (sh->size > l->o.max_shard_bytes) {
            close(fd);
            shard_close(l, sh);
            fail(l, SF_ERR_LIMIT, "%s: %llu bytes is over max_shard_bytes (%llu)", path, sh->size,
                 l->o.max_shard_bytes);
            return SF_ERR_LIMIT;
        }
        if (sh->size) {
            sh->map = mmap(NULL, (size_t)sh->size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (sh->map == MAP_FAILED) {
                int e = errno;
                sh->map = NULL;
                close(fd);
                shard_close(l, sh);
                fail(l, SF_ERR_IO, "%s: mmap: %s", path, strerror(e));
                return SF_ERR_IO;
            }
            sh->map_len = (size_t)sh->size;
            madvise(sh->map, sh->map_len, MADV_SEQUENTIAL | MADV_WILLNEED);
        }
        close(fd);
        sh->base = sh->map;
        sh->contiguous = sh->size;
        sh->done_fetch = 1;
        atomic_fetch_add(&l->cache_hits, 1);
        sh->hit_counted = 1;
    } else if (l->cache) {
        st = sf_cache_open(l->cache, l->s3, obj, &sh->co);
        if (st != SF_OK) {
            char m[ERR_LEN];
            sf_cache_errmsg(l->cache, m, sizeof(m));
            shard_close(l, sh);
            fail(l, st, "%s", m[0] ? m : sf_status_str(st));
            return st;
        }
    } else {
        struct sf_fetch_options fo;
        sf_fetch_options_init_default(&fo);
        fo.size = obj->size;
        if (obj->etag[0])
            fo.etag = obj->etag;
        st = sf_fetch_start(l->s3, obj->url, &fo, &sh->f);
        if (st != SF_OK) {
            char m[ERR_LEN];
            sf_s3_errmsg(l->s3, m, sizeof(m));
            shard_close(l, sh);
            fail(l, st, "%s", m[0] ? m : sf_status_str(st));
            return st;
        }
        atomic_fetch_add(&l->cache_misses, 1);
        sh->hit_counted = 1;
    }
    atomic_store(&sh->refs, l->deliveries[shard]);
    l->slot_of[shard] = sh;
    atomic_fetch_add(&l->shards_open, 1);
    atomic_fetch_add(&l->n_shards_opened, 1);
    *out = sh;
    return SF_OK;
}

/* Advances the shard's download without blocking longer than timeout_ms.
 * Returns SF_OK (maybe with new bytes) or an error (already recorded). */
static sf_status shard_pump(struct sf_loader *l, struct shard_slot *sh, unsigned long long want,
                            int timeout_ms)
{
    if (sh->done_fetch)
        return SF_OK;
    if (sh->co) {
        struct sf_cache_object_progress p;
        sf_status st = sf_cache_object_wait(sh->co, want, timeout_ms, &p);
        if (st != SF_OK && st != SF_ERR_TIMEOUT) {
            const char *m = sf_cache_object_errmsg(sh->co);
            fail(l, st, "%s", m && m[0] ? m : sf_status_str(st));
            return st;
        }
        if (!sh->hit_counted && p.size != SF_SIZE_UNKNOWN) {
            int hit = p.source == SF_CACHE_FROM_RAM || p.source == SF_CACHE_FROM_DISK;
            atomic_fetch_add(hit ? &l->cache_hits : &l->cache_misses, 1);
            sh->hit_counted = 1;
        }
        sh->size = p.size;
        /* A peer's download is read only once published: its mapping may be
         * replaced when it finishes, and decode workers hold pointers. */
        if (p.source == SF_CACHE_FROM_PEER && !p.done)
            return SF_OK;
        if (p.size != SF_SIZE_UNKNOWN && p.size > l->o.max_shard_bytes) {
            fail(l, SF_ERR_LIMIT, "%s: %llu bytes is over max_shard_bytes (%llu)",
                 l->objs[sh->shard]->url, p.size, l->o.max_shard_bytes);
            return SF_ERR_LIMIT;
        }
        sh->base = sf_cache_object_data(sh->co);
        sh->contiguous = p.contiguous;
        if (p.done)
            sh->done_fetch = 1;
        return SF_OK;
    }
    struct sf_fetch_progress p;
    sf_status st = sf_fetch_wait(sh->f, want, timeout_ms, &p);
    if (p.done && p.status != SF_OK) {
        const char *m = sf_fetch_errmsg(sh->f);
        fail(l, p.status, "%s", m && m[0] ? m : sf_status_str(p.status));
        return p.status;
    }
    (void)st;
    if (p.object_size != SF_SIZE_UNKNOWN && p.object_size > l->o.max_shard_bytes) {
        fail(l, SF_ERR_LIMIT, "%s: %llu bytes is over max_shard_bytes (%llu)",
             l->objs[sh->shard]->url, p.object_size, l->o.max_shard_bytes);
        return SF_ERR_LIMIT;
    }
    sh->size = p.total;
    sh->base = sf_fetch_data(sh->f);
    sh->contiguous = sh->base ? p.contiguous : 0;
    if (p.done)
        sh->done_fetch = 1;
    return SF_OK;
}

/* Copies what a sample needs into its loc. Reader thread. */
static sf_status record_sample(struct sf_loader *l, struct shard_slot *sh,
                               const struct sf_sample *s)
{
    struct sample_loc *loc = &sh->locs[s->index - sh->begin];
    const struct sf_sample_field *img = NULL, *lbl = NULL;
    for (size_t i = 0; i < l->n_img && !img; i++)
        img = find_field(s, l->img_names[i]);
    for (size_t i = 0; i < l->n_lbl && !lbl; i++)
        lbl = find_field(s, l->lbl_names[i]);
    loc->key = strndup(s->key, s->key_len);
    if (!loc->key)
        return SF_ERR_NO_MEMORY;
    loc->offset = s->offset;
    loc->present = 1; /* a missing image stays NULL: the worker reports it (on_error) */
    if (l->n_extra) {
        loc->extra = calloc(l->n_extra, sizeof(*loc->extra));
        if (!loc->extra)
            return SF_ERR_NO_MEMORY;
    }
    /* Reader-owned bytes (zstd records) are copied out. */
    size_t own = 0;
    if (s->reader_owned) {
        own += img ? img->size : 0;
        own += lbl ? lbl->size : 0;
        for (size_t e = 0; e < l->n_extra; e++) {
            const struct sf_sample_field *f = find_field(s, l->extra_names[e]);
            own += f ? f->size : 0;
        }
        loc->owned = malloc(own ? own : 1);
        if (!loc->owned)
            return SF_ERR_NO_MEMORY;
    }
    size_t at = 0;
#define TAKE(dst, f)                                                                               \
    do {                                                                                           \
        if (s->reader_owned) {                                                                     \
            memcpy(loc->owned + at, (f)->data, (f)->size);                                         \
            (dst) = loc->owned + at;                                                               \
            at += (f)->size;                                                                       \
        } else {                                                                                   \
            (dst) = (const unsigned char *)(f)->data;                                              \
        }                                                                                          \
    } while (0)
    if (img) {
        TAKE(loc->img, img);
        loc->img_size = img->size;
        loc->img_off = img->offset;
    }
    if (lbl) {
        TAKE(loc->lbl, lbl);
        loc->lbl_size = lbl->size;
        snprintf(loc->lbl_name, sizeof(loc->lbl_name), "%s", lbl->name);
    }
    for (size_t e = 0; e < l->n_extra; e++) {
        const struct sf_sample_field *f = find_field(s, l->extra_names[e]);
        if (f) {
            TAKE(loc->extra[e].p, f);
            loc->extra[e].n = f->size;
        }
    }
#undef TAKE
    return SF_OK;
}

/* Parses what arrived of the shard at the head of the read order. Returns
 * the number of samples newly read, or -1 on error. Reader thread. */
static long shard_parse(struct sf_loader *l, struct shard_slot *sh)
{
    if (sh->parsed)
        return 0;
    long got = 0;
    if (sh->contiguous == 0 && !sh->done_fetch)
        return 0;
    sf_status st = sf_shard_reader_feed(sh->r, sh->base, sh->contiguous,
                                        sh->done_fetch ? sh->size : SF_SIZE_UNKNOWN);
    if (st != SF_OK) {
        fail(l, st, "%s", sf_shard_reader_errmsg(sh->r));
        return -1;
    }
    if (sh->contiguous > sh->bytes_counted) {
        atomic_fetch_add(&l->bytes_read, sh->contiguous - sh->bytes_counted);
        sh->bytes_counted = sh->contiguous;
    }
    for (;;) {
        struct sf_sample s;
        enum sf_shard_event ev;
        st = sf_shard_reader_next(sh->r, &s, &ev);
        if (st != SF_OK) {
            fail(l, st, "%s", sf_shard_reader_errmsg(sh->r));
            return -1;
        }
        if (ev == SF_SHARD_NEED_MORE)
            break;
        if (ev == SF_SHARD_END) {
            if (sh->next_sample < sh->end) {
                fail(l, SF_ERR_CORRUPT,
                     "%s: %llu samples, but the index said at least %llu (offset %llu)",
                     l->objs[sh->shard]->url, (unsigned long long)sh->next_sample,
                     (unsigned long long)sh->end, sh->size);
                return -1;
            }
            sh->parsed = 1;
            break;
        }
        sh->next_sample = s.index + 1;
        if (s.index < sh->begin)
            continue; /* before this stream's part of a split shard */
        st = record_sample(l, sh, &s);
        if (st != SF_OK) {
            fail(l, st, "%s: out of memory", l->objs[sh->shard]->url);
            return -1;
        }
        got++;
        if (sh->next_sample >= sh->end) {
            sh->parsed = 1; /* the rest belongs to another stream, or nobody */
            break;
        }
    }
    return got;
}

/* ------------------------------------------------------------ batches */

static void batch_free(struct sf_loader *l, struct batch *b)
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

static sf_status batch_alloc(struct sf_loader *l, struct batch *b)
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
        fail(l, SF_ERR_NO_MEMORY, "batch %llu: out of memory for extra fields",
             (unsigned long long)b->index);
        return;
    }
    pthread_mutex_lock(&l->mu);
    if (b->state == B_FILLING && b->gen == l->gen)
        b->state = B_READY;
    pthread_cond_broadcast(&l->cv_consumer);
    pthread_cond_broadcast(&l->cv_gpu);
    pthread_cond_broadcast(&l->cv_reader);
    pthread_mutex_unlock(&l->mu);
}

static void batch_unpend(struct sf_loader *l, struct batch *b)
{
    if (atomic_fetch_sub(&b->pending, 1) == 1)
        batch_finish(l, b);
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
    return SF_OK;
}

static void *worker_main(void *arg)
{
    struct sf_loader *l = arg;
    sf__nvtx_name_thread("sf decode");
    struct sf_decoder *d = NULL;
    if (sf__decoder_new(&d) != SF_OK) {
        fail(l, SF_ERR_NO_MEMORY, "decode worker: out of memory");
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
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            sf__nvtx_push("decode");
            st = decode_one(l, d, &w, err, sizeof(err));
            sf__nvtx_pop();
            clock_gettime(CLOCK_MONOTONIC, &t1);
            atomic_fetch_add(&l->decode_busy_ns,
                             (unsigned long long)((t1.tv_sec - t0.tv_sec) * 1000000000LL +
                                                  (t1.tv_nsec - t0.tv_nsec)));
        }
        if (st == SF_OK && !failed) {
            atomic_fetch_add(&l->n_decoded, 1);
        } else if (st != SF_OK) {
            if (l->o.on_error == SF_ON_ERROR_SKIP && st != SF_ERR_NO_MEMORY) {
                w.b->skipped[w.slot] = 1;
                unsigned long long k = atomic_fetch_add(&l->n_skipped, 1);
                if (k < 10)
                    logf_(l, SF_LOG_WARN, "skipped: %s", err);
            } else {
                fail(l, st, "%s", err);
            }
        }
        shard_unref(l, w.sh);
        batch_unpend(l, w.b);
        pthread_mutex_lock(&l->mu);
        l->active_decodes--;
        if (l->active_decodes == 0 && l->q_len == 0)
            pthread_cond_broadcast(&l->cv_reader);
    }
    pthread_mutex_unlock(&l->mu);
    sf__decoder_destroy(d);
    return NULL;
}

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
    uint64_t gen;
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
        shard_close(l, rd->open);
        rd->open = n;
    }
}

/* Starts the reader's epoch at the sampler's current position. */
static void reader_begin(struct sf_loader *l, struct reader *rd, uint64_t position)
{
    reader_close_all(l, rd);
    memset(rd, 0, sizeof(*rd));
    rd->plan = sf_sampler_plan(l->sampler, &rd->n_plan);
    struct sf_sampler_info info;
    sf_sampler_get_info(l->sampler, &info);
    rd->position = position;
    rd->window = info.shuffle_buffer;
    uint64_t size = info.epoch_size;
    uint64_t B = l->o.batch_size;
    rd->stop_at = l->o.drop_last ? size / B * B : size;
    count_deliveries(l, rd->stop_at);
    /* Replayed positions were consumed already: the shards hold fewer
     * deliveries, and samples read before `position` are counted. */
    pthread_mutex_lock(&l->mu);
    l->epoch = info.epoch;
    l->epoch_positions = size;
    l->epoch_batches = l->o.drop_last ? size / B : (size + B - 1) / B;
    l->next_deliver = (position + B - 1) / B; /* position / B, but a short epoch end */
    l->next_gpu = l->next_deliver;
    l->delivered_positions = position;
    rd->gen = l->gen;
    pthread_mutex_unlock(&l->mu);
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

/* The ring slot holding batch `index` of the current generation, or NULL. */
static struct batch *find_batch(struct sf_loader *l, uint64_t index)
{
    for (unsigned i = 0; i < l->ring; i++) {
        struct batch *b = &l->batches[i];
        if (b->index == index && b->gen == l->gen && b->state != B_FREE)
            return b;
    }
    return NULL;
}

/* Takes any free slot for batch `bindex`: batches are not tied to a slot, so
 * a batch the consumer keeps never blocks the ring while it holds at most
 * prefetch_batches - 1. */
static int reader_wait_slot(struct sf_loader *l, struct reader *rd, uint64_t bindex)
{
    struct batch *b = NULL;
    pthread_mutex_lock(&l->mu);
    double t_wait = now_s();
    while (!l->stop && l->error == SF_OK && !l->reset_req && !(b = free_slot(l))) {
        /* Keep downloads moving while we wait for the consumer. */
        pthread_mutex_unlock(&l->mu);
        for (struct shard_slot *s = rd->open; s; s = s->next)
            if (shard_pump(l, s, 0, 0) != SF_OK)
                return -1;
        pthread_mutex_lock(&l->mu);
        if (!free_slot(l) && !l->stop && !l->reset_req)
            cond_wait_ms(&l->cv_reader, &l->mu, 20);
    }
    int ok = !l->stop && l->error == SF_OK && !l->reset_req && b;
    if (ok) {
        b->state = B_FILLING;
        b->gen = l->gen;
        b->epoch = l->epoch;
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
    rd->blocked_s += now_s() - t_wait;
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
    batch_unpend(l, b);
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
    struct shard_slot *sh = l->slot_of[r->shard];
    if (!sh || r->sample < sh->begin || r->sample >= sh->end ||
        !sh->locs[r->sample - sh->begin].present) {
        fail(l, SF_ERR_INTERNAL, "loader: sample %llu of shard %llu is not held",
             (unsigned long long)r->sample, (unsigned long long)r->shard);
        return -1;
    }
    const struct sample_loc *loc = &sh->locs[r->sample - sh->begin];
    const char *key = loc->key;
    size_t klen = strlen(key) + 1;
    if (b->key_len + klen > b->key_cap) {
        size_t cap = b->key_cap ? b->key_cap * 2 : 8192;
        while (cap < b->key_len + klen)
            cap *= 2;
        char *k = realloc(b->key_arena, cap);
        if (!k) {
            fail(l, SF_ERR_NO_MEMORY, "loader: out of memory");
            return -1;
        }
        b->key_arena = k;
        b->key_cap = cap;
    }
    memcpy(b->key_arena + b->key_len, key, klen);
    b->key_off[slot] = b->key_len;
    b->key_len += klen;
    b->flags[slot] = r->flags & SF_SAMPLE_PAD;
    b->shards[slot] = r->shard;
    b->labels[slot] = -1;
    b->assigned = slot + 1;
    if (r->flags & SF_SAMPLE_PAD)
        atomic_fetch_add(&l->n_pads, 1);
    atomic_fetch_add(&b->pending, 1);
    struct work w = {
        .b = b,
        .slot = slot,
        .sh = sh,
        .loc = loc,
        .rng = sf__sample_rng_seed(l->o.sampler.seed, l->epoch, r->shard, r->sample),
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
            shard_close(l, s);
            continue;
        }
        pp = &s->next;
    }
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
        cond_wait_ms(&l->cv_reader, &l->mu, 20);
    /* The gpu thread may be copying one: wait for it to settle. */
    for (unsigned i = 0; i < l->ring; i++) {
        struct batch *b = &l->batches[i];
        while (b->gpu_busy)
            cond_wait_ms(&l->cv_reader, &l->mu, 5);
        if (b->state != B_HELD)
            b->state = B_FREE;
    }
    pthread_mutex_unlock(&l->mu);
    reader_close_all(l, rd);
}

static void *reader_main(void *arg)
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
            sf_status st = SF_OK;
            uint64_t position = 0;
            if (l->have_restore) {
                st = sf_sampler_state_restore(l->sampler, l->restore_state,
                                              sizeof(l->restore_state));
                position = l->restore_position;
            } else {
                sf_sampler_set_epoch(l->sampler, l->reset_epoch);
            }
            l->gen++;
            pthread_mutex_unlock(&l->mu);
            if (st != SF_OK)
                fail(l, st, "%s", sf_sampler_errmsg(l->sampler));
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
        if (failed || (rd.sampler_done && !rd.cur)) {
            /* Idle: the epoch is assigned (or failed); finish the downloads
             * still running and close what is done. */
            if (!failed)
                for (struct shard_slot *s = rd.open; s; s = s->next)
                    if (shard_pump(l, s, 0, 0) != SF_OK)
                        break;
            reader_sweep(l, &rd, failed);
            pthread_mutex_lock(&l->mu);
            if (!l->stop && !(l->reset_req && !l->reset_done))
                cond_wait_ms(&l->cv_reader, &l->mu, 50);
            pthread_mutex_unlock(&l->mu);
            continue;
        }
        double t0 = now_s();
        sf__nvtx_push("read");
        /* 1. Open shards ahead, in plan order, while the read position is
         * within the shuffle window of what has been assigned (so memory
         * stays bounded when the consumer is slower than the bucket). */
        while (rd.next_open < rd.n_plan && count_unparsed(&rd) < l->o.prefetch_shards + 1 &&
               rd.samples_read <= rd.position + rd.window) {
            const struct sf_shard_range *pr = &rd.plan[rd.next_open];
            if (l->deliveries[pr->shard] == 0) {
                rd.next_open++; /* nothing of it is delivered (resumed, drop_last) */
                continue;
            }
            struct shard_slot *sh;
            if (shard_open(l, pr->shard, pr->begin, pr->end, &sh) != SF_OK)
                break;
            /* Appended: downloads are driven (and so started) in read order,
             * so the shard read first gets its bytes first. */
            struct shard_slot **tail = &rd.open;
            while (*tail)
                tail = &(*tail)->next;
            *tail = sh;
            rd.next_open++;
        }
        /* 2. Keep every download moving; parse the head of the read order. */
        int progressed = 0;
        for (struct shard_slot *s = rd.open; s; s = s->next)
            if (shard_pump(l, s, 0, 0) != SF_OK)
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
            long got = shard_parse(l, sh);
            if (got < 0)
                break;
            rd.samples_read += (uint64_t)got;
            atomic_fetch_add(&l->n_read, (unsigned long long)got);
            if (got)
                progressed = 1;
            if (sh->parsed) {
                rd.next_parse++;
                progressed = 1;
                continue;
            }
            break;
        }
        /* 3. Deliver what the sampler can now place. */
        while (rd.position < rd.stop_at) {
            if (!rd.have_pending) {
                if (!sf_sampler_next(l->sampler, &rd.pending)) {
                    rd.sampler_done = 1;
                    break;
                }
                rd.have_pending = 1;
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
        if (rd.position >= rd.stop_at && !rd.sampler_done) {
            /* drop_last: the rest of the epoch is not delivered; its shards'
             * deliveries are released. */
            /* The tail was not counted in the deliveries (count_deliveries). */
            struct sf_sample_ref r;
            rd.have_pending = 0;
            while (sf_sampler_next(l->sampler, &r))
                ;
            rd.sampler_done = 1;
        }
        if (rd.sampler_done)
            reader_close_batch(l, &rd);
        reader_sweep(l, &rd, 0);
        sf__nvtx_pop();
        busy += now_s() - t0 - rd.blocked_s;
        rd.blocked_s = 0;
        pthread_mutex_lock(&l->mu);
        l->read_busy_s = busy;
        pthread_mutex_unlock(&l->mu);
        if (!progressed) {
            /* Wait for bytes of the head shard (the engine works meanwhile). */
            struct shard_slot *head =
                rd.next_parse < rd.n_plan ? l->slot_of[rd.plan[rd.next_parse].shard] : NULL;
            if (head && !head->done_fetch) {
                unsigned long long want = sf_shard_reader_wanted(head->r);
                if (want <= head->contiguous)
                    want = head->contiguous + 1;
                shard_pump(l, head, want, 20);
            } else {
                pthread_mutex_lock(&l->mu);
                if (!l->stop && !l->reset_req)
                    cond_wait_ms(&l->cv_reader, &l->mu, 5);
                pthread_mutex_unlock(&l->mu);
            }
        }
    }
    reader_close_batch(l, &rd);
    /* Wait for the workers to finish with the shards before closing them. */
    pthread_mutex_lock(&l->mu);
    while (l->active_decodes)
        cond_wait_ms(&l->cv_reader, &l->mu, 5);
    pthread_mutex_unlock(&l->mu);
    /* A shard whose bytes have all arrived is published (hashed, renamed)
     * rather than left as a partial download: that is local work only. */
    for (struct shard_slot *s = rd.open; s; s = s->next)
        if (s->co && !s->done_fetch && s->size != SF_SIZE_UNKNOWN && s->contiguous >= s->size)
            shard_pump(l, s, s->size, 10000);
    reader_close_all(l, &rd);
    return NULL;
}

/* ------------------------------------------------------------ gpu thread */

static void *gpu_main(void *arg)
{
    struct sf_loader *l = arg;
    sf__nvtx_name_thread("sf gpu copy");
    pthread_mutex_lock(&l->mu);
    for (;;) {
        struct batch *b = NULL;
        while (!l->stop) {
            b = find_batch(l, l->next_gpu);
            if (b && b->state == B_READY)
                break;
            cond_wait_ms(&l->cv_gpu, &l->mu, 50);
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
            fail(l, st, "batch %llu: %s", (unsigned long long)b->index, err);
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

/* ------------------------------------------------------------ consumer API */

static int deliverable(const struct sf_loader *l, const struct batch *b)
{
    if (!l->on_device)
        return b->state == B_READY;
    if (b->state == B_GPU_DONE)
        return 1;
    return b->state == B_ON_GPU && !l->o.sync_device;
}

sf_status sf_loader_next(struct sf_loader *l, struct sf_batch *out)
{
    if (!l || !out)
        return SF_ERR_INVALID_ARGUMENT;
    double t0 = now_s();
    sf__nvtx_push("wait batch");
    pthread_mutex_lock(&l->mu);
    sf_status st = SF_OK;
    for (;;) {
        if (l->error != SF_OK) {
            st = l->error;
            break;
        }
        if (l->reset_req && !l->reset_done) {
            cond_wait_ms(&l->cv_consumer, &l->mu, 50);
            continue;
        }
        if (l->next_deliver >= l->epoch_batches) {
            st = SF_ERR_NOT_FOUND;
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
        struct batch *b = find_batch(l, l->next_deliver);
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
            if (l->on_device) {
                unsigned idx = (unsigned)(b - l->batches);
                out->device_images = sf__gpu_u8(l->gpu, idx);
                if (l->o.normalize_on_device && l->o.image.dtype == SF_DTYPE_UINT8)
                    out->device_normalized = sf__gpu_f32(l->gpu, idx);
                out->cuda_event = sf__gpu_event(l->gpu, idx);
                out->cuda_device = sf__gpu_device(l->gpu);
            }
            atomic_fetch_add(&l->n_delivered, b->size);
            atomic_fetch_add(&l->n_batches, 1);
            break;
        }
    wait:
        cond_wait_ms(&l->cv_consumer, &l->mu, 50);
    }
    l->consumer_wait_s += now_s() - t0;
    pthread_mutex_unlock(&l->mu);
    sf__nvtx_pop();
    return st;
}

void sf_loader_release(struct sf_loader *l, const struct sf_batch *b)
{
    if (!l || !b)
        return;
    pthread_mutex_lock(&l->mu);
    for (unsigned i = 0; i < l->ring; i++) {
        struct batch *x = &l->batches[i];
        if (x->state == B_HELD && x->images == b->images && x->index == b->index &&
            x->epoch == b->epoch) {
            x->state = B_FREE;
            l->held--;
            pthread_cond_broadcast(&l->cv_reader);
            break;
        }
    }
    pthread_mutex_unlock(&l->mu);
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
        cond_wait_ms(&l->cv_consumer, &l->mu, 50);
    l->reset_req = 0;
    sf_status st = l->error;
    pthread_mutex_unlock(&l->mu);
    return st;
}

sf_status sf_loader_set_epoch(struct sf_loader *l, uint64_t epoch)
{
    if (!l)
        return SF_ERR_INVALID_ARGUMENT;
    sf_sampler_set_epoch(l->state_smp, epoch);
    return request_reset(l, epoch, NULL, 0);
}

/* State: "SFLD" v1, batch size, position, epoch, sampler state, checksum. */
#define STATE_MAGIC 0x444c4653u
_Static_assert(SF_LOADER_STATE_BYTES == 32 + SF_SAMPLER_STATE_BYTES + 8, "loader state layout");

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

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
    pthread_mutex_unlock(&l->mu);
    put64(p, STATE_MAGIC | (1ULL << 32));
    put64(p + 8, l->o.batch_size);
    put64(p + 16, position);
    put64(p + 24, epoch);
    sf_sampler_set_epoch(l->state_smp, epoch);
    sf_status st = sf_sampler_state_save_at(l->state_smp, position, p + 32, SF_SAMPLER_STATE_BYTES);
    if (st != SF_OK)
        return st;
    put64(p + 32 + SF_SAMPLER_STATE_BYTES, state_sum(p, 32 + SF_SAMPLER_STATE_BYTES));
    return SF_OK;
}

sf_status sf_loader_state_restore(struct sf_loader *l, const void *state, size_t len)
{
    if (!l || !state)
        return SF_ERR_INVALID_ARGUMENT;
    const unsigned char *p = state;
    if (len != SF_LOADER_STATE_BYTES || get64(p) != (STATE_MAGIC | (1ULL << 32)) ||
        get64(p + 32 + SF_SAMPLER_STATE_BYTES) != state_sum(p, 32 + SF_SAMPLER_STATE_BYTES)) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg), "not a loader state (bad magic or checksum)");
        pthread_mutex_unlock(&l->mu);
        return SF_ERR_CORRUPT;
    }
    if (get64(p + 8) != l->o.batch_size) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg),
                 "the state was saved with batch_size %llu, this loader has %u",
                 (unsigned long long)get64(p + 8), l->o.batch_size);
        pthread_mutex_unlock(&l->mu);
        return SF_ERR_INVALID_ARGUMENT;
    }
    /* Check the sampler part on the consumer's own sampler first, so a
     * mismatch is reported without disturbing the pipeline. */
    sf_status st = sf_sampler_state_restore(l->state_smp, p + 32, SF_SAMPLER_STATE_BYTES);
    if (st != SF_OK) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->errmsg, sizeof(l->errmsg), "%s", sf_sampler_errmsg(l->state_smp));
        pthread_mutex_unlock(&l->mu);
        return st;
    }
    return request_reset(l, get64(p + 24), p + 32, get64(p + 16));
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

size_t sf_loader_shard_count(const struct sf_loader *l)
{
    return l ? l->n_shards : 0;
}

const char *sf_loader_shard_url(const struct sf_loader *l, size_t i)
{
    return l && i < l->n_shards ? l->objs[i]->url : NULL;
}

uint64_t sf_loader_epoch_samples(const struct sf_loader *l)
{
    return l ? sf_sampler_epoch_size(l->state_smp) : 0;
}

uint64_t sf_loader_epoch_batches(const struct sf_loader *l)
{
    if (!l)
        return 0;
    uint64_t n = sf_sampler_epoch_size(l->state_smp), B = l->o.batch_size;
    return l->o.drop_last ? n / B : (n + B - 1) / B;
}

const char *sf_loader_errmsg(const struct sf_loader *l)
{
    return l ? l->errmsg : "";
}

/* ------------------------------------------------------------ open / close */

void sf_loader_close(struct sf_loader *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv_reader);
    pthread_cond_broadcast(&l->cv_work);
    pthread_cond_broadcast(&l->cv_gpu);
    pthread_cond_broadcast(&l->cv_consumer);
    pthread_mutex_unlock(&l->mu);
    for (unsigned i = 0; i < l->n_workers; i++)
        pthread_join(l->workers[i], NULL);
    /* Workers are gone: nothing decodes, so the reader's final wait ends. */
    pthread_mutex_lock(&l->mu);
    l->active_decodes = 0;
    pthread_mutex_unlock(&l->mu);
    if (l->reader_started)
        pthread_join(l->reader_th, NULL);
    if (l->gpu_started)
        pthread_join(l->gpu_th, NULL);
    sf__gpu_close(l->gpu);
    if (l->batches)
        for (unsigned i = 0; i < l->ring; i++)
            batch_free(l, &l->batches[i]);
    free(l->batches);
    free(l->workers);
    free(l->q);
    sf_sampler_destroy(l->sampler);
    sf_sampler_destroy(l->counter);
    sf_sampler_destroy(l->state_smp);
    free(l->deliveries);
    free(l->slot_of);
    free(l->counts);
    free(l->objs);
    for (size_t i = 0; i < l->n_lists; i++)
        sf_object_list_destroy(l->lists[i]);
    free(l->lists);
    sf_cache_destroy(l->cache);
    sf_s3_destroy(l->s3);
    free_names(l->img_names, l->n_img);
    free_names(l->lbl_names, l->n_lbl);
    free_names(l->extra_names, l->n_extra);
    if (l->extra_zst)
        for (size_t i = 0; i < l->n_extra; i++)
            free(l->extra_zst[i]);
    free(l->extra_zst);
    free(l->image_fields);
    free(l->label_fields);
    free(l->extra_fields);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_reader);
    pthread_cond_destroy(&l->cv_consumer);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_gpu);
    free(l);
}

static unsigned cores_available(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return (unsigned)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* Keeps only shard-like objects of a listing: .tar, .tgz-less tar and .sfr. */
static int is_shard_name(const char *key)
{
    size_t n = strlen(key);
    return (n > 4 && !strcmp(key + n - 4, ".tar")) || (n > 4 && !strcmp(key + n - 4, ".sfr"));
}

static sf_status expand_sources(struct sf_loader *l, char *err, size_t err_len)
{
    const struct sf_loader_options *o = &l->o;
    l->lists = calloc(o->source_count, sizeof(*l->lists));
    if (!l->lists)
        return SF_ERR_NO_MEMORY;
    size_t total = 0;
    for (size_t i = 0; i < o->source_count; i++) {
        sf_status st = sf_s3_expand(l->s3, o->sources[i], 0, &l->lists[i]);
        if (st != SF_OK) {
            char m[ERR_LEN];
            sf_s3_errmsg(l->s3, m, sizeof(m));
            snprintf(err, err_len, "source '%s': %s", o->sources[i], m[0] ? m : sf_status_str(st));
            return st;
        }
        l->n_lists++;
        total += sf_object_list_count(l->lists[i]);
    }
    l->objs = calloc(total ? total : 1, sizeof(*l->objs));
    if (!l->objs)
        return SF_ERR_NO_MEMORY;
    for (size_t i = 0; i < l->n_lists; i++) {
        const char *src = o->sources[i];
        size_t sl = strlen(src);
        int listing = sl && src[sl - 1] == '/';
        size_t n = sf_object_list_count(l->lists[i]);
        for (size_t k = 0; k < n; k++) {
            const struct sf_object_info *obj = sf_object_list_get(l->lists[i], k);
            if (listing && !is_shard_name(obj->key))
                continue; /* index.json and other files beside the shards */
            l->objs[l->n_shards++] = obj;
        }
    }
    if (l->n_shards == 0) {
        snprintf(err, err_len, "no shards in the sources (a listing keeps *.tar and *.sfr)");
        return SF_ERR_NOT_FOUND;
    }
    return SF_OK;
}

/* Reads a whole small object (index.json) into memory. */
static sf_status read_small(struct sf_loader *l, const char *url, char **out, size_t *len)
{
    *out = NULL;
    if (is_local(url)) {
        const char *path = !strncmp(url, "file://", 7) ? url + 7 : url;
        FILE *f = fopen(path, "rb");
        if (!f)
            return errno == ENOENT ? SF_ERR_NOT_FOUND : SF_ERR_IO;
        char *buf = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
            if (n + 65536 > cap) {
                if (cap > (64u << 20)) {
                    free(buf);
                    fclose(f);
                    return SF_ERR_LIMIT;
                }
                cap = cap ? cap * 2 : 131072;
                char *nb = realloc(buf, cap + 1);
                if (!nb) {
                    free(buf);
                    fclose(f);
                    return SF_ERR_NO_MEMORY;
                }
                buf = nb;
            }
            size_t r = fread(buf + n, 1, cap - n, f);
            n += r;
            if (r == 0)
                break;
        }
        fclose(f);
        buf[n] = 0;
        *out = buf;
        *len = n;
        return SF_OK;
    }
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(l->s3, url, &fo, &f);
    if (st != SF_OK)
        return st;
    struct sf_fetch_progress p;
    st = sf_fetch_wait(f, SF_SIZE_UNKNOWN, -1, &p);
    if (st == SF_OK && p.done && p.status == SF_OK) {
        size_t n = p.total == SF_SIZE_UNKNOWN ? 0 : (size_t)p.total;
        char *buf = malloc(n + 1);
        if (!buf) {
            sf_fetch_destroy(f);
            return SF_ERR_NO_MEMORY;
        }
        if (n)
            memcpy(buf, sf_fetch_data(f), n);
        buf[n] = 0;
        *out = buf;
        *len = n;
    } else if (st == SF_OK) {
        st = p.status;
    }
    sf_fetch_destroy(f);
    return st;
}

static const char *base_name(const char *url)
{
    const char *s = strrchr(url, '/');
    return s ? s + 1 : url;
}

/* counts[] from index.json beside the shards (pack writes it), when it
 * lists every shard. Returns 1 when it did. */
static int counts_from_index(struct sf_loader *l)
{
    const char *first = l->objs[0]->url;
    const char *slash = strrchr(first, '/');
    char url[4096];
    if (slash)
        snprintf(url, sizeof(url), "%.*sindex.json", (int)(slash - first + 1), first);
    else
        snprintf(url, sizeof(url), "index.json");
    char *text = NULL;
    size_t len = 0;
    if (read_small(l, url, &text, &len) != SF_OK)
        return 0;
    int ok = sf__loader_counts_from_index_json(text, l->objs, l->n_shards, l->counts);
    free(text);
    if (ok)
        logf_(l, SF_LOG_INFO, "sample counts of %zu shards from %s", l->n_shards, url);
    return ok;
}

int sf__loader_counts_from_index_json(const char *text, const struct sf_object_info *const *objs,
                                      size_t n, uint64_t *counts)
{
    cJSON *j = cJSON_Parse(text);
    if (!j)
        return 0;
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "shards");
    int ok = cJSON_IsArray(arr);
    for (size_t i = 0; ok && i < n; i++) {
        const char *want = base_name(objs[i]->url);
        int found = 0;
        cJSON *s;
        cJSON_ArrayForEach(s, arr)
        {
            cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "name");
            cJSON *samples = cJSON_GetObjectItemCaseSensitive(s, "samples");
            if (cJSON_IsString(name) && !strcmp(base_name(name->valuestring), want) &&
                cJSON_IsNumber(samples) && samples->valuedouble >= 0) {
                counts[i] = (uint64_t)samples->valuedouble;
                found = 1;
                break;
            }
        }
        ok = found;
    }
    cJSON_Delete(j);
    return ok;
}

/* Counting pass: reads every shard once (through the cache when there is
 * one, so it also warms it). */
static sf_status counts_by_reading(struct sf_loader *l, char *err, size_t err_len)
{
    logf_(l, SF_LOG_WARN,
          "no index.json lists the %zu shards: counting their samples (reads every shard once; "
          "`shardfeed pack` writes index.json)",
          l->n_shards);
    for (size_t i = 0; i < l->n_shards; i++) {
        l->deliveries[i] = 0;
        struct shard_slot *sh = NULL;
        sf_status st = shard_open(l, i, 0, 0, &sh);
        if (st != SF_OK) {
            snprintf(err, err_len, "%s", l->errmsg);
            return st;
        }
        uint64_t n = 0;
        for (;;) {
            st = shard_pump(l, sh, sh->contiguous + 1, 100);
            if (st != SF_OK)
                break;
            st = sf_shard_reader_feed(sh->r, sh->base, sh->contiguous,
                                      sh->done_fetch ? sh->size : SF_SIZE_UNKNOWN);
            enum sf_shard_event ev = SF_SHARD_NEED_MORE;
            while (st == SF_OK) {
                struct sf_sample s;
                st = sf_shard_reader_next(sh->r, &s, &ev);
                if (st != SF_OK || ev != SF_SHARD_SAMPLE)
                    break;
                n++;
            }
            if (st != SF_OK) {
                fail(l, st, "%s", sf_shard_reader_errmsg(sh->r));
                break;
            }
            if (ev == SF_SHARD_END)
                break;
            if (sh->done_fetch && ev == SF_SHARD_NEED_MORE && sh->contiguous >= sh->size) {
                st = SF_ERR_INTERNAL;
                fail(l, st, "%s: reader wants bytes past the end", l->objs[i]->url);
                break;
            }
        }
        shard_close(l, sh);
        if (st != SF_OK) {
            snprintf(err, err_len, "%s", l->errmsg);
            return st;
        }
        l->counts[i] = n;
    }
    l->cache_hits = 0;
    l->cache_misses = 0;
    l->n_shards_opened = 0;
    l->bytes_read = 0;
    return SF_OK;
}

sf_status sf_loader_open(const struct sf_loader_options *opts, struct sf_loader **out, char *err,
                         size_t err_len)
{
    char dummy[8];
    if (!err) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    err[0] = 0;
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!opts) {
        snprintf(err, err_len, "loader options are NULL");
        return SF_ERR_INVALID_ARGUMENT;
    }
    sf_status st = sf__loader_options_check(opts, err, err_len);
    if (st != SF_OK)
        return st;
    struct sf_loader *l = calloc(1, sizeof(*l));
    if (!l)
        return SF_ERR_NO_MEMORY;
    clock_gettime(CLOCK_MONOTONIC, &l->t0);
    l->o = *opts;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_reader, NULL);
    pthread_cond_init(&l->cv_consumer, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_gpu, NULL);
    l->image_fields = strdup(opts->image_fields ? opts->image_fields : "jpg;jpeg");
    l->label_fields = strdup(opts->label_fields ? opts->label_fields : "cls;json;txt");
    l->extra_fields = strdup(opts->extra_fields ? opts->extra_fields : "");
    if (!l->image_fields || !l->label_fields || !l->extra_fields)
        goto oom;
    l->o.image_fields = l->image_fields;
    l->o.label_fields = l->label_fields;
    l->o.extra_fields = l->extra_fields;
    l->img_names = split_names(l->image_fields, &l->n_img);
    l->lbl_names = split_names(l->label_fields, &l->n_lbl);
    l->extra_names = split_names(l->extra_fields, &l->n_extra);
    if (!l->img_names || !l->lbl_names || !l->extra_names)
        goto oom;
    l->extra_zst = calloc(l->n_extra + 1, sizeof(*l->extra_zst));
    if (!l->extra_zst)
        goto oom;
    for (size_t i = 0; i < l->n_extra; i++) {
        size_t n = strlen(l->extra_names[i]);
        if (n > 4 && !strcmp(l->extra_names[i] + n - 4, ".zst") &&
            !(l->extra_zst[i] = strndup(l->extra_names[i], n - 4)))
            goto oom;
    }

    /* Where batches go. */
    int want_gpu = opts->device != SF_DEVICE_HOST;
    int dev = opts->cuda_device;
    if (dev < 0) {
        struct sf_dist d = {-1, -1, -1};
        dev = sf_dist_from_env(&d, NULL, 0) == SF_OK && d.local_rank >= 0 ? d.local_rank : 0;
    }
    if (want_gpu && !sf__gpu_usable(dev)) {
        if (opts->device == SF_DEVICE_CUDA) {
            snprintf(err, err_len, "device cuda: %s",
                     sf_cuda_compiled() ? "no CUDA device (or not the one asked for) is visible"
                                        : "this build has no CUDA");
            sf_loader_close(l);
            return SF_ERR_UNSUPPORTED;
        }
        want_gpu = 0;
    }
    l->on_device = want_gpu;

    st = sf_s3_new(&opts->s3, &l->s3, err, err_len);
    if (st != SF_OK)
        goto fail_out;
    l->o.s3.endpoint_url = l->o.s3.region = l->o.s3.profile = NULL;
    l->o.s3.access_key_id = l->o.s3.secret_access_key = l->o.s3.session_token = NULL;
    l->o.s3.ca_bundle = NULL;
    st = expand_sources(l, err, err_len);
    l->o.sources = NULL; /* borrowed during open only */
    if (st != SF_OK)
        goto fail_out;
    int all_local = 1;
    for (size_t i = 0; i < l->n_shards; i++)
        all_local &= is_local(l->objs[i]->url);
    if (!opts->ram_only && !all_local) {
        st = sf_cache_new(&opts->cache, &l->cache, err, err_len);
        if (st != SF_OK)
            goto fail_out;
    }
    l->o.cache.dir = NULL;
    l->counts = calloc(l->n_shards, sizeof(*l->counts));
    l->deliveries = calloc(l->n_shards, sizeof(*l->deliveries));
    l->slot_of = calloc(l->n_shards, sizeof(*l->slot_of));
    if (!l->counts || !l->deliveries || !l->slot_of)
        goto oom;
    if (!counts_from_index(l)) {
        st = counts_by_reading(l, err, err_len);
        if (st != SF_OK)
            goto fail_out;
    }
    /* initial_fill defaults to 100 (WebDataset's); a smaller shuffle buffer
     * caps it. */
    struct sf_sampler_options so = opts->sampler;
    uint64_t buf = so.shuffle_buffer ? so.shuffle_buffer : 1;
    if (so.initial_fill > buf)
        so.initial_fill = buf;
    st = sf_sampler_new(&so, l->counts, l->n_shards, &l->sampler, err, err_len);
    if (st == SF_OK)
        st = sf_sampler_new(&so, l->counts, l->n_shards, &l->counter, err, err_len);
    if (st == SF_OK)
        st = sf_sampler_new(&so, l->counts, l->n_shards, &l->state_smp, err, err_len);
    if (st != SF_OK)
        goto fail_out;

    l->ring = opts->prefetch_batches;
    if (l->on_device) {
        size_t u8 = (size_t)opts->batch_size * sf__image_bytes(&l->o.image);
        size_t f32 = opts->normalize_on_device && opts->image.dtype == SF_DTYPE_UINT8
                         ? (size_t)opts->batch_size * opts->image.width * opts->image.height * 3 *
                               sizeof(float)
                         : 0;
        /* First: it makes `dev` current, so the pinned batches below belong
         * to its context and no context is created on device 0. */
        st = sf__gpu_open(dev, l->ring, u8, f32, &l->gpu, err, err_len);
        if (st != SF_OK)
            goto fail_out;
    }
    l->image_bytes = sf__image_bytes(&l->o.image);
    l->batches = calloc(l->ring, sizeof(*l->batches));
    if (!l->batches)
        goto oom;
    for (unsigned i = 0; i < l->ring; i++) {
        l->batches[i].index = UINT64_MAX;
        if (batch_alloc(l, &l->batches[i]) != SF_OK)
            goto oom;
    }
    l->q_cap = (size_t)l->ring * opts->batch_size;
    l->q = calloc(l->q_cap, sizeof(*l->q));
    l->n_workers = opts->decode_threads ? opts->decode_threads : cores_available();
    l->workers = calloc(l->n_workers, sizeof(*l->workers));
    if (!l->q || !l->workers)
        goto oom;
    {
        unsigned started = 0;
        for (; started < l->n_workers; started++)
            if (pthread_create(&l->workers[started], NULL, worker_main, l) != 0)
                break;
        if (started < l->n_workers) {
            l->n_workers = started;
            snprintf(err, err_len, "cannot start decode threads");
            st = SF_ERR_NO_MEMORY;
            goto fail_out;
        }
    }
    if (pthread_create(&l->reader_th, NULL, reader_main, l) != 0) {
        snprintf(err, err_len, "cannot start the reader thread");
        st = SF_ERR_NO_MEMORY;
        goto fail_out;
    }
    l->reader_started = 1;
    if (l->on_device) {
        if (pthread_create(&l->gpu_th, NULL, gpu_main, l) != 0) {
            snprintf(err, err_len, "cannot start the gpu thread");
            st = SF_ERR_NO_MEMORY;
            goto fail_out;
        }
        l->gpu_started = 1;
    }
    /* Until the reader has planned, the consumer must not see epoch 0 as
     * empty: reader_begin sets epoch_batches under mu; set it here too. */
    pthread_mutex_lock(&l->mu);
    if (l->epoch_batches == 0) {
        l->epoch = opts->sampler.epoch;
        uint64_t n = sf_sampler_epoch_size(l->state_smp), B = opts->batch_size;
        l->epoch_batches = opts->drop_last ? n / B : (n + B - 1) / B;
        l->epoch_positions = n;
    }
    pthread_mutex_unlock(&l->mu);
    *out = l;
    return SF_OK;
oom:
    st = SF_ERR_NO_MEMORY;
    snprintf(err, err_len, "out of memory");
fail_out:
    if (!err[0] && l->errmsg[0])
        snprintf(err, err_len, "%s", l->errmsg);
    sf_loader_close(l);
    return st;
}
