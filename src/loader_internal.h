/*
 * Loader internals shared by loader.c (open/close), loader_api.c (consumer
 * calls), loader_reader.c (reader thread), loader_workers.c (decode workers,
 * batch ring, gpu thread) and loader_shard.c (shard slots). Not installed.
 */
#ifndef SF_SRC_LOADER_INTERNAL_H
#define SF_SRC_LOADER_INTERNAL_H

#include "src/loader.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

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
    /* immutable after open */
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

    size_t image_bytes;
    unsigned ring;
    struct batch *batches; /* ring slots; their state fields under mu */
    struct sf_gpu *gpu;
    int on_device;

    pthread_mutex_t mu;
    pthread_cond_t cv_reader, cv_consumer, cv_work, cv_gpu;
    pthread_t reader_th, gpu_th;
    pthread_t *workers;
    unsigned n_workers;
    int reader_started, gpu_started;

    struct work *q; /* decode queue: a ring of q_cap entries, filled under mu */
    size_t q_cap;
    struct timespec t0;

    /* reader thread only */
    struct sf_sampler *sampler;
    struct sf_sampler *counter;  /* deliveries per shard at epoch start */
    uint64_t *deliveries;        /* per shard, this epoch */
    struct shard_slot **slot_of; /* per shard, open slot or NULL */

    /* consumer thread only */
    struct sf_sampler *state_smp; /* state save */

    /* under mu */
    size_t q_head, q_len;
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
    double consumer_wait_s, read_busy_s, gpu_copy_s;

    /* atomics (any thread): statistics */
    atomic_ullong n_delivered, n_batches, n_skipped, n_pads, n_read, n_decoded, n_shards_opened,
        bytes_read, cache_hits, cache_misses;
    atomic_ullong decode_busy_ns;
    atomic_uint shards_open;
};

/* ---- helpers (loader.c) */

double sf__loader_now_s(void);

/* Logs through the caller's callback when lv is within log_level. */
void sf__loader_log(struct sf_loader *l, enum sf_log_level lv, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first error (sticky) and wakes everyone. Takes mu. */
void sf__loader_fail(struct sf_loader *l, sf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Waits on cv for at most ms milliseconds. mu held. */
void sf__loader_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms);

/* 1 for a local path or file:// URL (not s3://, http:// or https://). */
int sf__loader_is_local(const char *url);

/* ---- shard slots (loader_shard.c); reader thread, or open before the threads */

void sf__loader_shard_close(struct sf_loader *l, struct shard_slot *sh);
sf_status sf__loader_shard_open(struct sf_loader *l, uint64_t shard, uint64_t begin, uint64_t end,
                                struct shard_slot **out);
sf_status sf__loader_shard_pump(struct sf_loader *l, struct shard_slot *sh, unsigned long long want,
                                int timeout_ms);
long sf__loader_shard_parse(struct sf_loader *l, struct shard_slot *sh);

/* ---- batch ring, decode workers, gpu thread (loader_workers.c) */

void sf__loader_batch_free(struct sf_loader *l, struct batch *b);
sf_status sf__loader_batch_alloc(struct sf_loader *l, struct batch *b);
/* Drops one pending count; the last one finishes the batch. Outside mu. */
void sf__loader_batch_unpend(struct sf_loader *l, struct batch *b);
/* The ring slot holding batch `index` of the current generation, or NULL. mu held. */
struct batch *sf__loader_find_batch(struct sf_loader *l, uint64_t index);
void *sf__loader_worker_main(void *arg);
void *sf__loader_gpu_main(void *arg);

/* ---- reader thread (loader_reader.c) */

void *sf__loader_reader_main(void *arg);

#endif
