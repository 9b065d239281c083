/*
 * Loader internals shared by loader.c (open/close), loader_api.c (consumer
 * calls), loader_reader.c (reader thread), loader_workers.c (decode workers,
 * batch ring, gpu thread) and loader_shard.c (shard slots). Not installed.
 */
#ifndef SF_SRC_LOADER_INTERNAL_H
#define SF_SRC_LOADER_INTERNAL_H

#include "common/clock.h"
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
    /* The label field's name: one of the loader's lbl_names, whole (its last
     * dot-separated part picks the syntax). */
    const char *lbl_name;
    char *key; /* owned; never moves while the shard is open (workers read it) */
    unsigned long long offset;
    /* The mapped pages to give back once decoded (drop_pages): what the
     * decode's faults may have mapped; NULL for a small image
     * (SF__DROP_MIN_BYTES) or a shard that is not a file mapping. */
    const void *span;
    size_t span_len;
    unsigned char *owned; /* fields copied out of a reader-owned (zstd) record */
    struct {
        const unsigned char *p;
        size_t n;
    } * extra;
    int present; /* parsed */
    int done;    /* delivered before a restore point: not delivered again */
};

/* Locs live in chunks that never move (decode workers hold pointers). */
#define SF__LOC_CHUNK 1024

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
    struct sample_loc **chunks; /* locs by (sample - begin), SF__LOC_CHUNK each */
    size_t n_chunks;
    uint64_t next_sample;    /* samples parsed so far (index in shard) */
    /* The plan range ends at the shard's last sample by its count (exact
     * counts): the shard is parsed to its end, so a sample after that count
     * is an error rather than silently never delivered. */
    int to_end;
    /* Estimated counts (docs/sampling.md "Without counts"): the shard is
     * read to its real end and its samples numbered in read order. */
    int opened;          /* counted in shards_open */
    int priority;        /* its download was marked as the one being read */
    int stream;          /* 1: read to the real end; refs hold a token until parsed */
    int pad;             /* a re-read after the stream's end: samples are pads */
    int started;         /* first_read is set (the slot reached the head) */
    int learned;         /* its count was recorded */
    uint64_t vindex;     /* place in the reader's virtual plan (passes x plan) */
    uint64_t first_read; /* read index of sample 0 */
    uint64_t read_limit; /* samples with read index >= this are not recorded */
    uint64_t recorded;   /* samples recorded: read indices first_read .. + recorded */
    uint64_t beyond;     /* samples parsed at or past read_limit (dropped) */
    atomic_ullong refs;      /* deliveries left + decodes in flight */
    unsigned long long bytes_counted;
    unsigned long long parse_dropped; /* bytes whose mapped pages the parse gave back */
    /* The file mapping that drop_pages sweeps every SF__DROP_SWEEP_EVERY
     * decodes; set by the reader before the shard's first sample is queued,
     * NULL when the shard is not a file mapping. */
    const void *sweep;
    size_t sweep_len;
    atomic_uint decodes; /* samples decoded (drop_pages) */
    struct shard_slot *next;          /* open list */
};

/* Samples of file-mapped shards (local files, cache entries) whose image has
 * at least this many bytes give back what their decode mapped (up to the
 * page tables it touched, common/file.h) once decoded (loader_workers.c
 * drop_pages); for smaller ones the syscall, the TLB flush and the
 * neighbours' refaults would cost more than the memory one holds: every
 * SF__DROP_SWEEP_EVERY samples decoded from a shard give back all its pages.
 * The parse gives back what reading the headers mapped
 * (sf__loader_shard_parse), whatever the sizes. */
#define SF__DROP_MIN_BYTES (32u << 10)
#define SF__DROP_SWEEP_EVERY 32u

struct work {
    struct batch *b;
    unsigned slot;
    struct shard_slot *sh;
    const struct sample_loc *loc;
    uint64_t rng;
};

/* The consumer's waits of one report window (loader_report.c), under mu:
 * each delivered batch's wait on a log scale, 4 buckets per octave from
 * 1 us (bucket 0: under 1 us; the last: above 2^31 us), and the counters at
 * the window's start. */
#define SF__WAIT_BUCKETS 128
struct sf__wait_log {
    uint64_t hist[SF__WAIT_BUCKETS];
    uint64_t count;
    double total_s, max_s, first_s;
    double pending_s; /* waited in next_wait() calls that timed out, for the coming batch */
    double t_first;   /* the window's first next() call (sf__now_s), 0: none yet */
    struct sf_loader_stats base;
};

/* Adds one delivered batch's wait. mu held. */
void sf__wait_log_add(struct sf__wait_log *w, double wait_s);
/* The wait below which a share q (0..1) of the batches stayed: the top of
 * its bucket (at most 19 % above), never above the largest wait. */
double sf__wait_log_percentile_s(const struct sf__wait_log *w, double q);

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
    uint64_t *counts; /* exact counts, where known[i] */
    size_t n_shards;
    uint64_t *est_counts;       /* estimates from sizes (estimated basis) */
    unsigned char *known;       /* counts[i] known; consumer thread (or open) */
    unsigned char *stored;      /* known at open (index or store): not saved again */
    int from_index;             /* every count came from index.json */
    int sources_listed;         /* every source is a listed folder (open only) */
    int learned_allowed;        /* learned counts may be the basis: 0 no, 1 own + store, 2 store */
    double bytes_per_sample;    /* the probe's estimate; 0 before it ran */
    char *counts_dir;           /* cache directory of the learned store, or NULL */
    struct sf_sampler_options so; /* the sampler options in use (estimated_counts aside) */

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
    int estimated; /* the current epoch runs on estimated counts */
    const uint64_t *rs_window; /* restore: read indices still in the buffer, sorted */
    uint64_t rs_n, rs_read;    /* their number; read indices that entered the buffer */
    struct sf_sampler *sampler;
    struct sf_sampler *counter;  /* deliveries per shard at epoch start */
    uint64_t *deliveries;        /* per shard, this epoch */
    struct shard_slot **slot_of; /* per shard, open slot or NULL */

    /* consumer thread only */
    struct sf_sampler *state_smp; /* state save */
    int estimated_c;              /* state_smp runs on estimated counts */
    /* A state was restored and no batch delivered since: set_epoch of that
     * epoch keeps the restored position. */
    int restored_fresh;

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
    int size_known;               /* epoch_positions is exact (not an estimate) */
    int plan_done;                /* the reader has read its whole plan (estimated) */
    int epoch_estimated;          /* this epoch runs on estimated counts */
    /* The next epoch, read ahead by the reader (batches of gen spec_gen)
     * while the consumer finishes this one; set_epoch(spec_epoch) adopts it
     * instead of restarting (loader_reader.c, loader_api.c). */
    int spec_active;
    unsigned epochs_moved; /* set_epoch went to another epoch: a multi-epoch loop */
    uint64_t spec_epoch, spec_gen, spec_positions, spec_batches, spec_dropped;
    /* Samplers for the reader to take at the next reset (basis change). */
    struct sf_sampler *next_sampler, *next_counter;
    int next_estimated;
    uint64_t *learned;            /* counts learned this run, per shard */
    unsigned char *learned_known;
    unsigned held;
    unsigned active_decodes;
    double consumer_wait_s, read_busy_s, gpu_copy_s;
    struct sf__wait_log waits; /* the starvation report's window (loader_report.c) */

    /* atomics (any thread): statistics */
    atomic_ullong n_dropped;
    atomic_ullong n_no_end_marker; /* tar shards read to an end without its zero blocks */
    atomic_ullong n_delivered, n_batches, n_skipped, n_pads, n_read, n_decoded, n_shards_opened,
        bytes_read, cache_hits, cache_misses;
    atomic_ullong decode_busy_ns;
    atomic_uint shards_open;
};

/* ---- helpers (loader.c) */

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
/* Marks the slot's download as the one being read (1: its ranges go before
 * the prefetched shards') or not (0). */
void sf__loader_shard_priority(struct shard_slot *sh, int priority);
/* Loc of sample index i - sh->begin (NULL when not allocated). */
static inline struct sample_loc *sf__loader_loc(const struct shard_slot *sh, uint64_t i)
{
    size_t c = (size_t)(i / SF__LOC_CHUNK);
    return c < sh->n_chunks && sh->chunks[c] ? &sh->chunks[c][i % SF__LOC_CHUNK] : NULL;
}

/* ---- sample counts (loader.c) */

/* Builds samplers (reader, counter, state) on the exact counts (estimated 0)
 * or on the estimates (1; probes first when needed). */
sf_status sf__loader_make_samplers(struct sf_loader *l, int estimated, uint64_t epoch,
                                   struct sf_sampler **sampler, struct sf_sampler **counter,
                                   struct sf_sampler **state, char *err, size_t err_len);
/* Whether every count is known (index, store, or learned this run); fills
 * l->counts. Consumer thread (or open). */
int sf__loader_counts_complete(struct sf_loader *l);
/* Records a count learned by reading a whole shard. Reader thread. */
void sf__loader_learn(struct sf_loader *l, uint64_t shard, uint64_t count);

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
