/*
 * shardfeed — the loader: shards in a bucket to decoded batches on the GPU.
 *
 * A loader expands its sources, learns how many samples each shard holds,
 * and then runs the whole pipeline on its own threads:
 *
 *   sampler (epoch order) -> fetch/cache (parallel ranged GETs, prefetch_shards
 *   ahead) -> shard reader (parses as bytes arrive) -> decode workers
 *   (decode_threads, each with its own JPEG decompressor and zstd context,
 *   writing into their slot of a batch) -> ring of prefetch_batches host
 *   batches (pinned when CUDA and a GPU are present) -> GPU prefetcher (copy
 *   stream, events, device ring, uint8 -> float normalisation kernel) -> user.
 *
 * The consumer calls sf_loader_next() and sf_loader_release(). Batches come in
 * a fixed order: sample k of the stream's epoch order (see
 * shardfeed_sampling.h) goes to slot k % batch_size of batch k / batch_size,
 * whatever the thread timing. Memory is bounded by the options (shards in
 * flight, batch ring, shuffle buffer), never by the dataset size.
 *
 * Thread safety: a loader's functions are called from one consumer thread at
 * a time (no two calls on the same loader at once); the loader's own threads
 * never call back into user code except the log callback, which may be
 * called from any of them.
 *
 * Configuration by struct, JSON file (sf_loader_options_from_json) and CLI
 * flags use the same names: docs/loader.md.
 */
#ifndef SHARDFEED_LOADER_H
#define SHARDFEED_LOADER_H

#include "shardfeed/common.h"
#include "shardfeed_s3.h"
#include "shardfeed_cache.h"
#include "shardfeed_sampling.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ image transform */

/* How the output window is cut from each image. */
enum sf_crop {
    /* torchvision RandomResizedCrop: a random area fraction in [scale_min,
     * scale_max] and aspect ratio (log-uniform) in [ratio_min, ratio_max],
     * 10 tries then the centre crop fallback, resized to width x height. Only
     * the crop region is decoded, at the smallest DCT scale that still covers
     * the output. Training. The default. */
    SF_CROP_RANDOM_RESIZED = 0,
    /* Resize (shorter side to the output's / center_fraction) then the
     * centre width x height: torchvision Resize + CenterCrop. Evaluation. */
    SF_CROP_CENTER = 1,
    /* The whole image resized to width x height (aspect not kept); an image
     * of exactly that size is copied as decoded (libjpeg-turbo's pixels). */
    SF_CROP_NONE = 2,
};

/* Pixel layout of one image in a batch. */
enum sf_layout {
    SF_LAYOUT_CHW = 0, /* planar, channel-major (PyTorch). The default. */
    SF_LAYOUT_HWC = 1, /* interleaved RGB */
};

/* Element type of host batches. */
enum sf_dtype {
    /* 0..255 (the default): 4x fewer bytes over PCIe; normalise on the GPU. */
    SF_DTYPE_UINT8 = 0,
    /* (x / 255 - mean[c]) / std[c], computed on the CPU by the decode worker. */
    SF_DTYPE_FLOAT32 = 1,
};

/* What a sample that cannot be decoded (corrupt JPEG, bad label, image over
 * the limits) does to the loader. */
enum sf_on_error {
    /* The loader fails: sf_loader_next() returns the error, naming the shard,
     * the sample key and the byte offset. The default. */
    SF_ON_ERROR_FAIL = 0,
    /* The sample is left out of its batch (later samples of that batch move
     * up, so the batch is shorter) and counted in stats.samples_skipped; the
     * first few are logged at SF_LOG_WARN with shard, key and offset. */
    SF_ON_ERROR_SKIP = 1,
};

/* Where batches are delivered. */
enum sf_device_mode {
    SF_DEVICE_AUTO = 0, /* the GPU when built with CUDA and a device exists, else host */
    SF_DEVICE_HOST = 1, /* host batches only (no CUDA calls at all) */
    SF_DEVICE_CUDA = 2, /* the GPU or fail at open */
    /* The emulated device (docs/gpu.md): the whole GPU path (ring, copy
     * stream, events, normalise kernel) on CPU threads, in every build. Its
     * device memory is not readable by the host; for tests and benchmarks. */
    SF_DEVICE_EMULATED = 3,
};

struct sf_image_options {
    unsigned width, height;     /* output size; default 224 x 224 */
    enum sf_crop crop;          /* default SF_CROP_RANDOM_RESIZED */
    float scale_min, scale_max; /* RandomResizedCrop area fraction; default 0.08, 1 */
    float ratio_min, ratio_max; /* RandomResizedCrop aspect ratio; default 3/4, 4/3 */
    float center_fraction;      /* SF_CROP_CENTER: crop / resize; default 0.875 (224 of 256) */
    float hflip;                /* probability of a horizontal flip, 0..1; default 0.5
                                   (set 0 for evaluation) */
    enum sf_layout layout;      /* default SF_LAYOUT_CHW */
    enum sf_dtype dtype;        /* host batch type; default SF_DTYPE_UINT8 */
    float mean[3], std[3];      /* normalisation, on 0..1 values; default ImageNet's */
    /* Untrusted input limits: an image beyond them is an error (on_error). */
    unsigned max_side;   /* pixels per side; default 16384 */
    uint64_t max_pixels; /* width x height; default 64 Mi */
    unsigned max_scans;  /* progressive JPEG scans; default 64 */
};

/* ------------------------------------------------------------------ loader options */

struct sf_loader_options {
    /* Sources: s3:// URLs, brace patterns, prefixes ending in '/', local paths
     * (sf_s3_expand). Borrowed during sf_loader_open() only. */
    const char *const *sources;
    size_t source_count;

    struct sf_s3_options s3;       /* the loader's own client; strings borrowed during open */
    struct sf_cache_options cache; /* disk tier when cache.dir is set or ram_only is 0 */
    /* 1: no disk cache; shards are fetched into memory only (each shard's
     * buffer is freed once its samples are decoded). Default 0. */
    int ram_only;
    unsigned prefetch_shards; /* shards fetched ahead of the one being read; default 4 */
    /* Shards larger than this are refused (memory bound in ram_only mode);
     * default 4 GiB. */
    unsigned long long max_shard_bytes;
    /* Whether sample counts learned in earlier epochs or runs (kept in the
     * cache directory) may make an epoch exact when no index.json lists the
     * shards: -1 (default) auto: when every rank sees the same store (one
     * rank, or WORLD_SIZE == LOCAL_WORLD_SIZE); 0 never; 1 always (a cache
     * directory shared by every node). docs/sampling.md "Without counts". */
    int learned_counts;

    struct sf_sampler_options sampler; /* seed, epoch, rank, world size, shuffle buffer, policy */

    unsigned batch_size;       /* samples per batch; default 256 */
    int drop_last;             /* 1: the epoch's last short batch is not delivered; default 0 */
    unsigned prefetch_batches; /* host batch ring depth; default 4 (at least 2) */
    unsigned decode_threads;   /* 0 (default): the cores this process may run on */

    struct sf_image_options image;
    /* Field names, ';'-separated, first present wins. Defaults:
     * image "jpg;jpeg", label "cls;json;txt" (json: a number, or the
     * member "label" of an object). NULL keeps the default; "" for label
     * means no label (labels are then -1). */
    const char *image_fields;
    const char *label_fields;
    /* Extra fields passed through as bytes (e.g. "npy;txt"), ';'-separated;
     * a name ending in ".zst" is decompressed by the decode worker. NULL or ""
     * (default): none. A sample missing one is an error (on_error). */
    const char *extra_fields;
    unsigned long long max_extra_bytes; /* per field per sample; default 16 MiB */
    enum sf_on_error on_error;          /* default SF_ON_ERROR_FAIL */

    enum sf_device_mode device; /* default SF_DEVICE_AUTO */
    int cuda_device;            /* -1 (default): LOCAL_RANK, else 0 */
    /* 1 (default): with a GPU, uint8 batches are also converted on the device
     * to float32 (x / 255 - mean) / std in the same layout. */
    int normalize_on_device;
    /* 1: sf_loader_next() waits for the device copy on the host (event
     * synchronise). 0 (default): it returns as soon as the copy is queued and
     * the caller makes its stream wait on batch->cuda_event. */
    int sync_device;

    /* NULL: silent; called from any loader thread. Also the S3 client's and
     * the cache's sink (retries, throttling, evictions) unless s3.log or
     * cache.log is set. */
    sf_log_fn log;
    void *log_user;
    enum sf_log_level log_level; /* default SF_LOG_WARN */

    /* A tar shard that ends right after a member, without its two zero
     * end-of-archive blocks (or after one of them), cannot be told from one
     * cut short at that boundary. 0 (default): read as complete, counted in
     * stats.shards_without_end_marker and logged as a warning; 1: an error
     * (SF_ERR_CORRUPT naming the shard and the offset). docs/FORMAT.md. */
    int require_end_marker;
};

/* Fills o with the defaults above (s3, cache and sampler defaults included).
 * o may not be NULL. */
SF_API void sf_loader_options_init_default(struct sf_loader_options *o);

/*
 * Reads options from a JSON object (text, NUL-terminated), over what o
 * already holds. Keys are the option names of docs/loader.md (batch_size,
 * decode_threads, prefetch_batches, prefetch_shards, shuffle_buffer, seed,
 * cache_dir, cache_limit, concurrency, chunk_size, width, height, crop, ...);
 * sizes accept "8M" strings. An unknown key, a wrong type or a bad value fails
 * with SF_ERR_INVALID_ARGUMENT and a message naming the key. Strings (sources,
 * cache_dir, field lists, endpoint...) point into storage owned by *keep,
 * which the caller frees with sf_loader_options_free_json() after
 * sf_loader_open(). o, json and keep may not be NULL.
 */
SF_API sf_status sf_loader_options_from_json(struct sf_loader_options *o, const char *json,
                                             void **keep, char *err, size_t err_len);
SF_API void sf_loader_options_free_json(void *keep);

/*
 * Checks the options the way sf_loader_open() does first, without touching
 * the network, a file or a device: SF_OK, or SF_ERR_INVALID_ARGUMENT with a
 * message naming the option in err (may be NULL). A caller that must tell bad
 * usage from a failure (the CLI exits 2 for one, 1 for the other) calls it
 * before sf_loader_open(), whose SF_ERR_INVALID_ARGUMENT may then come from
 * a server (an HTTP 400) or a source that cannot be parsed. The sampling
 * options are checked too, rank and world_size resolved from the launcher's
 * environment when unset (sf_dist_from_env(): a rank not below the world
 * size is refused here, not at open). o may not be NULL. Any thread.
 */
SF_API sf_status sf_loader_options_check(const struct sf_loader_options *o, char *err,
                                         size_t err_len);

/* ------------------------------------------------------------------ batches */

/* One pass-through field of a batch: sample i's bytes are
 * data[offsets[i] .. offsets[i+1]). */
struct sf_batch_field {
    const char *name;
    const unsigned char *data;
    const uint64_t *offsets; /* size + 1 entries */
};

/*
 * A delivered batch. Everything it points to is owned by the loader and valid
 * until sf_loader_release() of this batch (host and device memory).
 */
struct sf_batch {
    uint64_t epoch;
    uint64_t index;    /* batch number within the epoch, from 0 */
    uint64_t position; /* epoch position of its first sample */
    size_t size;       /* samples in the batch (batch_size, or fewer: the last, skips) */
    unsigned width, height, channels; /* channels is 3 */
    enum sf_layout layout;
    enum sf_dtype dtype;
    size_t image_bytes; /* bytes of one image in images */
    /* size images back to back: host memory (pinned when CUDA is in use). */
    const void *images;
    const int64_t *labels;   /* size entries; -1 where a sample has no label */
    const uint32_t *flags;   /* size entries: SF_SAMPLE_PAD for padding repeats */
    const char *const *keys; /* size sample keys */
    const uint64_t *shards;  /* size shard indices (into sf_loader_shard_url) */
    size_t field_count;
    const struct sf_batch_field *fields; /* extra_fields, in option order */

    /* GPU (NULL on host delivery): images copied to the device, and float32
     * normalised ones (dtype uint8 with normalize_on_device). cuda_event is a
     * cudaEvent_t recorded on the loader's copy stream after both: make the
     * compute stream wait on it (cudaStreamWaitEvent) unless sync_device. */
    void *device_images;
    void *device_normalized;
    void *cuda_event;
    int cuda_device;
    /* Where device_images lives: SF_DEVICE_HOST (no device copy),
     * SF_DEVICE_CUDA, or SF_DEVICE_EMULATED (cuda_event is then an event
     * of the emulated device, not a cudaEvent_t). */
    enum sf_device_mode device;
    void *device_ring; /* opaque: the loader's device ring (sf_batch_wait_stream) */
};

/* ------------------------------------------------------------------ loader */

struct sf_loader;

/*
 * Opens a loader: expands the sources (checking every named object exists,
 * with its size and ETag: sf_s3_expand_stat()), takes the shards' sample
 * counts from index.json beside the shards, else from counts learned in
 * earlier runs (learned_counts), else estimates them from the sizes and the
 * head of the first shard (docs/sampling.md "Without counts": no shard is
 * read before the first batch), creates the client, cache, sampler, batch
 * ring, GPU ring and starts the threads. Returns at once after that; the
 * first batch follows the head shard's first bytes.
 *
 * Fails with SF_ERR_INVALID_ARGUMENT (a bad option, naming it), the status of
 * a source that cannot be listed or counted, SF_ERR_UNSUPPORTED
 * (SF_DEVICE_CUDA without CUDA or a device) or SF_ERR_NO_MEMORY; *out is then
 * NULL and err (may be NULL) gets the message.
 */
SF_API sf_status sf_loader_open(const struct sf_loader_options *o, struct sf_loader **out,
                                char *err, size_t err_len);

/*
 * Delivers the next batch of the epoch into *out (SF_OK); or returns
 * SF_END_OF_EPOCH: the epoch is over, every batch of it was delivered (call
 * sf_loader_set_epoch() for the next one); or an error of the pipeline (any
 * other status, never SF_END_OF_EPOCH: a missing, truncated, changed or
 * corrupt shard, a sample that cannot be decoded under on_error fail...;
 * sticky: later calls return it too; sf_loader_errmsg() names the shard,
 * key and offset). Blocks while the batch is not ready; the time spent
 * blocked is stats.consumer_wait_s.
 * At most prefetch_batches - 1 batches may be held (not released) at once;
 * asking for more is SF_ERR_LIMIT. l and out may not be NULL.
 */
SF_API sf_status sf_loader_next(struct sf_loader *l, struct sf_batch *out);

/*
 * sf_loader_next() that waits at most timeout_ms: SF_NOT_READY when no batch
 * (and no end of epoch, no error) came in that time; *out is then untouched
 * and the loader is as before: call again. For consumers that must stay
 * responsive while they wait (signals, cancellation: the Python binding
 * checks for Ctrl-C between waits).
 */
SF_API sf_status sf_loader_next_wait(struct sf_loader *l, struct sf_batch *out,
                                     unsigned timeout_ms);

/* Hands a batch back: its buffers (host and device) return to the ring and may
 * be overwritten from then on. Batches may be released in any order, and from
 * any thread (also while the consumer thread is in sf_loader_next()). A batch
 * not from this loader, released twice, or NULL (l or b) is ignored. */
SF_API void sf_loader_release(struct sf_loader *l, const struct sf_batch *b);

/*
 * GPU delivery, for consumers that pass batches between streams (DLPack's
 * __dlpack__(stream=s)): sf_batch_wait_stream() makes `stream` (a
 * cudaStream_t; (void *)1 the legacy default stream, (void *)2 the
 * per-thread one) wait for the batch's device copy, without blocking the
 * host. sf_loader_release_after() releases the batch like
 * sf_loader_release(), and the device slot is overwritten only after the
 * work queued on `stream` before this call has finished (the one-stream case
 * of sf_loader_release_after_streams() below, which says what (void *)2
 * becomes and which statuses come back). Host batches: the
 * first is SF_OK (nothing to wait for), the second a plain release. Without
 * CUDA, a device batch cannot exist.
 */
SF_API sf_status sf_batch_wait_stream(const struct sf_batch *b, void *stream);
SF_API sf_status sf_loader_release_after(struct sf_loader *l, const struct sf_batch *b,
                                         void *stream);

/* The most distinct streams one release can wait for (see below). */
#define SF_LOADER_RELEASE_STREAMS_MAX 4

/*
 * sf_loader_release_after() for a batch read on several streams: the device
 * slot is overwritten only after the work queued on EVERY one of `streams[0]`
 * .. `streams[n - 1]` before this call has finished (one event per distinct
 * stream; sf_loader_release_after(l, b, s) is the case n = 1). Duplicates
 * count once, and so do (void *)1 and (void *)2: a release after the
 * per-thread default stream is recorded on the legacy default stream, which
 * waits for every blocking stream, because the per-thread stream would be
 * that of the thread releasing (often not the one that read the batch).
 * n = 0 is sf_loader_release(). More than SF_LOADER_RELEASE_STREAMS_MAX
 * distinct streams (a device batch): SF_ERR_LIMIT and nothing is released (the caller still
 * holds the batch: make the extra streams wait on one of the others, then
 * release after that one). streams NULL with n > 0 or l / b NULL:
 * SF_ERR_INVALID_ARGUMENT, nothing released. A stream the device refuses
 * (destroyed, not of this device): the batch is released, ordered after the
 * other streams, and the first refusal's status is returned. Host batches: a
 * plain release (the streams are not looked at). A batch not from this
 * loader or released already: ignored, SF_OK. Any thread, as
 * sf_loader_release().
 */
SF_API sf_status sf_loader_release_after_streams(struct sf_loader *l, const struct sf_batch *b,
                                                 void *const *streams, size_t n);

/*
 * Starts epoch `epoch` from its beginning. The epoch the loader is at, before
 * any batch of it was delivered, is at its beginning already: that call
 * keeps what was read ahead. Likewise right after sf_loader_state_restore(),
 * set_epoch of the restored epoch keeps the restored position (so a loop
 * that calls set_epoch(e) before each epoch resumes where the state says). Batches of the old epoch still held
 * stay valid until released; those not yet delivered are dropped. Fails with
 * the sticky error if the loader has failed.
 */
SF_API sf_status sf_loader_set_epoch(struct sf_loader *l, uint64_t epoch);

/* Size of a saved loader state. */
#define SF_LOADER_STATE_BYTES 168

/*
 * Saves the consumer's position: the epoch and the samples of every batch
 * delivered by sf_loader_next() so far (not what the threads read ahead), as
 * SF_LOADER_STATE_BYTES bytes (a sampler state plus the batch size and a
 * checksum). Restore with sf_loader_state_restore() on a loader opened with
 * the same sources and options: the next batch is then the first one not
 * delivered before the save, with the same contents. Restore refuses a
 * state of another configuration (SF_ERR_INVALID_ARGUMENT, naming the
 * setting), of another version (SF_ERR_UNSUPPORTED, naming both) and a
 * damaged or cut one (SF_ERR_CORRUPT); the loader is then left as it was.
 */
SF_API sf_status sf_loader_state_save(struct sf_loader *l, void *buf, size_t len);
SF_API sf_status sf_loader_state_restore(struct sf_loader *l, const void *state, size_t len);

/* Counters since sf_loader_open(). Rates are per second of wall time since
 * open. sf_loader_get_stats() may be called from any thread, also while
 * another calls sf_loader_next(); l NULL fills zeros. out may not be NULL. */
struct sf_loader_stats {
    double elapsed_s;
    uint64_t batches_delivered, samples_delivered, samples_skipped, pad_samples;
    /* Real samples not delivered so that every rank delivers the same number
     * (SF_EPOCH_DROP, or estimated counts: docs/sampling.md). */
    uint64_t dropped_samples;
    uint64_t samples_read;    /* parsed out of shards */
    uint64_t samples_decoded; /* by the workers */
    uint64_t shards_opened;
    uint64_t bytes_fetched; /* from the network (cache misses) */
    uint64_t bytes_read;    /* shard bytes parsed (hits and misses) */
    uint64_t cache_hits, cache_misses;
    uint64_t requests, retries;
    double consumer_wait_s;                  /* total time sf_loader_next() blocked */
    double decode_busy_s;                    /* summed over decode threads */
    double read_busy_s;                      /* the reader thread, parsing and scheduling */
    double gpu_copy_s;                       /* copy + normalise, measured by events (0 on host) */
    double images_per_s;                     /* samples_delivered / elapsed_s */
    double decode_per_s;                     /* samples_decoded / elapsed_s */
    double read_per_s;                       /* samples_read / elapsed_s */
    double fetch_mib_per_s;                  /* bytes_fetched / elapsed_s */
    unsigned decode_queue, decode_queue_cap; /* samples waiting for a decode worker */
    unsigned ready_batches, batch_ring;      /* batches done and not delivered; ring size */
    unsigned shards_in_flight;               /* open (fetching or held) shards */
    unsigned decode_threads;
    int on_device; /* 1 when batches are delivered on the GPU */
    uint64_t epoch;
    /* Tar shards read to their end that had no end-of-archive blocks (or a
     * lone one), each time one was read (require_end_marker 0). */
    uint64_t shards_without_end_marker;
};
SF_API void sf_loader_get_stats(struct sf_loader *l, struct sf_loader_stats *out);

/* The stage that bounds the pipeline (sf_loader_report, shardfeed doctor). */
enum sf_stage {
    SF_STAGE_NONE = 0,    /* nothing in the loader: the consumer's step is slower */
    SF_STAGE_STARTUP = 1, /* most of the waiting was for the first batch */
    SF_STAGE_FETCH = 2,   /* bytes from the store */
    SF_STAGE_READ = 3,    /* shard read and parse (reader thread) */
    SF_STAGE_DECODE = 4,  /* decode and augment (decode threads) */
    SF_STAGE_ASSEMBLY = 5, /* batch assembly and hand-off (ring depth) */
    SF_STAGE_DEVICE = 6,  /* host-to-device copy and normalise */
};
/* "none", "startup", "fetch", "read", "decode", "assembly", "device";
 * "unknown" otherwise. Never NULL. */
SF_API const char *sf_stage_name(enum sf_stage s);

/*
 * The starvation report: how long the consumer waited for its batches, which
 * stage made it wait and the knob to turn, from counters the loader keeps
 * anyway (docs/loader.md "Starvation report"). Covers the window since
 * sf_loader_open() or the last sf_loader_report_reset(), from the window's
 * first sf_loader_next() call on.
 */
struct sf_loader_report {
    double span_s;          /* from the window's first sf_loader_next() call to now */
    uint64_t batches;       /* delivered in the window */
    uint64_t samples;       /* delivered in the window */
    double wait_s;          /* time the consumer was blocked in next() */
    double wait_share;      /* wait_s / span_s, 0..1 */
    double first_wait_s;    /* the window's first batch's wait */
    double wait_p50_ms, wait_p99_ms, wait_max_ms; /* per delivered batch; the
                                                     percentiles to within 19 % */
    double step_per_s;      /* samples/s the consumer takes when it does not wait:
                               samples / (span_s - wait_s) */
    double decode_per_thread_per_s; /* samples decoded per busy second of one thread */
    double decode_busy;     /* decode threads' busy share, 0..1 */
    double read_busy;       /* the reader thread's busy share, 0..1 */
    double device_busy;     /* the device copies' busy share, 0..1 (0 on host) */
    double fetch_mib_per_s; /* bytes fetched from the store / span_s */
    enum sf_stage bound;    /* SF_STAGE_NONE when wait_share <= 0.05 */
    int starving;           /* 1 when wait_share > 0.05 */
    char verdict[384];      /* one line: the bounding stage, the figures, the knob */
};
/* Fills out (zeros and verdict "" for l NULL). Any thread. */
SF_API void sf_loader_report(struct sf_loader *l, struct sf_loader_report *out);
/* Starts a new report window (e.g. at each epoch). Any thread; l NULL: no-op. */
SF_API void sf_loader_report_reset(struct sf_loader *l);

/*
 * shardfeed doctor (docs/doctor.md): each stage of the pipeline measured on
 * its own, on the user's data and options, a few seconds each, to find the
 * one that bounds it. sf_doctor_measure() measures what the library owns
 * (fetch, read, decode, assembly, device copy); the caller measures its
 * training step and the full pipeline with it (the CLI with --step-ms, Python
 * with the user's function) and sf_doctor_conclude() names the bound and the
 * knob. Rates are samples per second; 0 = not measured.
 */
#define SF_DOCTOR_MAX_SIDE 320 /* the --max-side doctor measures and suggests */

struct sf_doctor_result {
    double stage_per_s[7];       /* indexed by enum sf_stage: FETCH, READ, DECODE, ASSEMBLY,
                                    DEVICE (NONE and STARTUP unused) */
    char stage_note[7][160];     /* how each was measured, or why it was not */
    double decode_per_thread_per_s;
    unsigned decode_threads, cores;
    double fetch_mib_per_s;      /* at the loader's concurrency */
    double fetch_mib_per_s_more; /* at concurrency_more */
    unsigned concurrency, concurrency_more;
    double bytes_per_sample;     /* mean shard bytes per sample parsed */
    unsigned long long samples_measured; /* distinct raw samples decoded */
    /* pack --max-side SF_DOCTOR_MAX_SIDE, measured on up to 32 of the raw
     * samples re-encoded in memory: one-thread decode speed-up and the
     * bytes left (1: none was larger; 0: not measured). */
    double max_side_speedup, max_side_bytes;
    /* sf_doctor_conclude() fills these: */
    double step_per_s;     /* the caller's step alone; 0 = no step (infinitely fast) */
    double pipeline_per_s; /* the full pipeline with the step */
    double wait_share;     /* the step's share of time waiting for data, 0..1 */
    int fetch_counts;      /* 1 when the fetch stage bounds (data not in the cache) */
    enum sf_stage bound;   /* SF_STAGE_NONE: the step itself */
    char verdict[512];
};

/* Measures the stages for loader options o (sources, S3, image options,
 * decode_threads, batch_size, device), about stage_s seconds each (0: 2 s).
 * Reads at most 64 MiB of the first shards and keeps at most 512 raw samples;
 * fetches from the store without touching the cache. SF_OK, or the first
 * failure (err names the object). */
SF_API sf_status sf_doctor_measure(const struct sf_loader_options *o, double stage_s,
                                   struct sf_doctor_result *out, char *err, size_t err_len);
/* Names the bounding stage and the knob from the measured stages, the step's
 * own rate (0: none) and the full pipeline run's report (NULL: none). */
SF_API void sf_doctor_conclude(struct sf_doctor_result *r, double step_per_s,
                               double pipeline_per_s, const struct sf_loader_report *pipeline,
                               int data_in_cache);

/*
 * Autotune (docs/doctor.md "Autotune"): a small search of decode_threads,
 * concurrency, chunk size, prefetch_shards and prefetch_batches against the
 * user's store and data, within about budget_s seconds (0: 20 s), then a
 * check of the whole pipeline with the tuned options against the given ones
 * (the given ones are kept when the tuned ones are not faster). The result
 * holds the options as a JSON object that --config / config= / 
 * sf_loader_options_from_json() take.
 */
struct sf_tune_result {
    unsigned decode_threads, concurrency, prefetch_shards, prefetch_batches;
    unsigned long long chunk_bytes;
    double decode_per_s;    /* decode stage at decode_threads */
    double fetch_mib_per_s; /* fetch stage at concurrency and chunk_bytes (0: local) */
    double tuned_per_s;     /* the whole pipeline with the tuned options */
    double given_per_s;     /* the same with the options given */
    int kept_given;         /* 1: the tuned point was not faster, the given options stay */
    unsigned points;        /* stage measurements made */
    double seconds;         /* time the search took */
    char config_json[512];
    char trace[1024];       /* what was tried, one "name=value:rate" per point */
};
SF_API sf_status sf_tune(const struct sf_loader_options *o, double budget_s,
                         struct sf_tune_result *out, char *err, size_t err_len);

/* Shards of the loader (after expansion), by index: the URL is owned by the
 * loader, valid until sf_loader_close(); NULL when i is out of range or l is
 * NULL (count 0). */
SF_API size_t sf_loader_shard_count(const struct sf_loader *l);
SF_API const char *sf_loader_shard_url(const struct sf_loader *l, size_t i);
/* Samples and batches this rank delivers in the epoch the loader was opened
 * at or last set to (pads included, drop_last applied); 0 for NULL. With
 * estimated counts and one rank (docs/sampling.md "Without counts") these
 * are estimates until the reader reaches the end of the data:
 * sf_loader_epoch_size_known() says 1 once they are exact. */
SF_API uint64_t sf_loader_epoch_samples(const struct sf_loader *l);
SF_API uint64_t sf_loader_epoch_batches(const struct sf_loader *l);
SF_API int sf_loader_epoch_size_known(struct sf_loader *l);
/* Samples (pads included) of the current epoch this rank has delivered: the
 * position sf_loader_state_save() records, restored by
 * sf_loader_state_restore(), 0 after sf_loader_set_epoch(); 0 for NULL.
 * With sf_loader_epoch_samples() it tells that every batch of an epoch of
 * known size was taken although the end was not asked for yet. */
SF_API uint64_t sf_loader_epoch_delivered(struct sf_loader *l);

/* The detail of the loader's last error ("" when none): the shard, key and
 * offset for pipeline errors. Owned by the loader, valid until the next call
 * on it; "" for NULL. */
SF_API const char *sf_loader_errmsg(const struct sf_loader *l);

/* Stops the threads, frees everything (held batches included: their memory
 * is gone after this). A shard whose bytes have all arrived is published to
 * the cache first; an unfinished download is kept for a later resume. NULL is
 * a no-op. */
SF_API void sf_loader_close(struct sf_loader *l);

#ifdef __cplusplus
}
#endif

#endif /* SHARDFEED_LOADER_H */
