/*
 * shardfeed — epoch order: which samples a rank (and a worker within it)
 * reads in an epoch, in which order, and how to resume mid-epoch.
 *
 * A sampler turns the list of shards (each with its number of samples), a
 * seed, an epoch, and the distributed position (rank of world_size, worker of
 * num_workers) into a deterministic stream of sample references. It reads no
 * data: the order depends only on those inputs, so it is the same in every
 * run whatever the thread timing, and every rank can compute it alone.
 *
 * The algorithm, its PRNG (defined bit for bit so other implementations can
 * reproduce it), the partition and equalisation policies and the state
 * format are in docs/sampling.md.
 *
 * Thread safety: a struct sf_sampler belongs to one thread at a time (no
 * internal locking); distinct samplers are independent. Functions that take
 * no sampler may be called from any thread, except sf_dist_from_env(), which
 * reads the environment (getenv) and must not race with setenv().
 */
#ifndef SHARDFEED_SAMPLING_H
#define SHARDFEED_SAMPLING_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ distributed position */

/*
 * Where this process sits in a distributed job. A field below 0 is unset.
 */
struct sf_dist {
    int rank;       /* global rank, 0 <= rank < world_size */
    int world_size; /* number of ranks, >= 1 */
    int local_rank; /* rank within the node (picks the GPU); not used for sampling */
};

/*
 * Fills the unset fields of d (those below 0) from the launcher's
 * environment: RANK, WORLD_SIZE and LOCAL_RANK (as set by torchrun and most
 * launchers). Fields already set are kept: options win over the environment.
 * A field that stays unset because its variable is absent gets its
 * single-process default: rank 0, world_size 1, local_rank 0.
 *
 * Parsing is strict: a value is one or more ASCII digits and nothing else
 * (no sign, no whitespace, no suffix) that fits in an int; WORLD_SIZE must be
 * at least 1. A bad value, or a rank that is not below the world size, gives
 * SF_ERR_INVALID_ARGUMENT and a message in err naming the variable (or
 * option) and its value; d is then left unchanged.
 *
 * d may not be NULL; err may be NULL (err_len is then ignored). Reads the
 * environment with getenv(): do not call it while another thread calls
 * setenv() or putenv().
 */
SF_API sf_status sf_dist_from_env(struct sf_dist *d, char *err, size_t err_len);

/* ------------------------------------------------------------------ sampler options */

/*
 * What to do when the streams (rank x worker) of an epoch would get
 * different numbers of samples. With DDP every rank must run the same
 * number of steps, or the ranks that finish first wait forever in the next
 * collective: PAD and DROP prevent that.
 */
enum sf_epoch_policy {
    /* Every stream delivers as many samples as the largest one: a shorter
     * stream repeats its own last-read samples (see docs/sampling.md), and
     * each repeated sample is flagged SF_SAMPLE_PAD. Every real sample of
     * the epoch is delivered exactly once across all streams. The default. */
    SF_EPOCH_PAD = 0,
    /* Every stream delivers as many samples as the smallest one: a longer
     * stream stops reading once it has read that many, so the tail of its
     * read order is skipped this epoch (a different tail every epoch). No
     * sample is delivered twice. */
    SF_EPOCH_DROP = 1,
    /* No equalisation: every stream delivers exactly the samples of its
     * share. Streams may differ in length: use it with world_size 1, or when
     * the training loop copes with uneven inputs itself (DDP Join). */
    SF_EPOCH_UNEVEN = 2,
};

/* How an epoch's samples are split between the streams. */
enum sf_partition {
    /* Whole shards: each shard is read by exactly one stream (one rank,
     * one worker). Shards are dealt in the epoch's shuffled order, each to
     * the stream with the fewest samples so far. Needs at least one
     * non-empty shard per stream, else sf_sampler_new() fails with
     * SF_ERR_INVALID_ARGUMENT. The default. */
    SF_PARTITION_SHARDS = 0,
    /* Sample ranges: the shuffled shards are laid end to end and cut into
     * world_size x num_workers contiguous ranges of equal length (+-1), so a
     * shard may be read in part by two streams (each reads a disjoint range
     * of its samples, never the same sample). For datasets with fewer
     * shards than streams. Needs at least one sample per stream. */
    SF_PARTITION_SAMPLES = 1,
};

/*
 * Options of a sampler. Initialise with sf_sampler_options_init_default(),
 * then set what differs.
 */
struct sf_sampler_options {
    uint64_t seed;        /* default 0 */
    uint64_t epoch;       /* the epoch the sampler starts in; default 0 */
    int rank;             /* -1 (default): from RANK, else 0; see sf_dist_from_env() */
    int world_size;       /* -1 (default): from WORLD_SIZE, else 1 */
    unsigned worker;      /* this loader's worker within the rank; default 0 */
    unsigned num_workers; /* loaders (workers) per rank, >= 1; default 1 */
    /* Shuffle buffer, in samples. 0 or 1: no sample shuffling (shards are
     * still shuffled). At most SF_SAMPLER_MAX_SHUFFLE_BUFFER. Default 1000. */
    uint64_t shuffle_buffer;
    /* Samples read before the first one is delivered. 0 (default) means
     * shuffle_buffer: the buffer is full before anything leaves it. A smaller
     * value starts sooner; the buffer then grows by one slot every two
     * samples read until it holds shuffle_buffer. Must not exceed
     * shuffle_buffer (when shuffle_buffer is 0, at most 1). */
    uint64_t initial_fill;
    enum sf_epoch_policy policy; /* default SF_EPOCH_PAD */
    enum sf_partition partition; /* default SF_PARTITION_SHARDS */
    /*
     * 0 (default): counts are exact. 1: counts are estimates (shards with no
     * index, docs/sampling.md "Without counts"). The shards are dealt on the
     * estimates as usual, so every stream computes the same deal alone, and:
     *  - with several streams and SF_EPOCH_PAD or SF_EPOCH_DROP, the epoch
     *    size is fixed from the estimates (the largest or smallest estimated
     *    share), the same on every stream; the reader makes its real samples
     *    fit it (pads or drops, counted by the reader);
     *  - with one stream, or SF_EPOCH_UNEVEN, the epoch is the stream's real
     *    length, which the reader tells with sf_sampler_feed() as it reads.
     * Items then carry only read indices (shard is SF_SAMPLE_UNRESOLVED): the
     * reader maps read index k to the k-th sample it reads. Needs
     * SF_PARTITION_SHARDS.
     */
    int estimated_counts;
};

/* The largest shuffle_buffer accepted (2^26 samples: 512 MiB of indices). */
#define SF_SAMPLER_MAX_SHUFFLE_BUFFER (1ULL << 26)
/* The largest number of shards accepted. */
#define SF_SAMPLER_MAX_SHARDS (1ULL << 28)

/* Fills o with the defaults above. o may not be NULL. */
SF_API void sf_sampler_options_init_default(struct sf_sampler_options *o);

/* ------------------------------------------------------------------ sampler */

/* One stream's epoch order. Opaque. */
struct sf_sampler;

/* Flags of a struct sf_sample_ref. */
#define SF_SAMPLE_PAD 1u /* a repeat added by SF_EPOCH_PAD; its data is a real sample's */
/* struct sf_sample_ref.shard of a sampler on estimated counts: the item is
 * named by its read_index only. */
#define SF_SAMPLE_UNRESOLVED UINT64_MAX
/* sf_sampler_next(): an open-ended stream needs to know whether its next read
 * index exists (sf_sampler_feed()). */
#define SF_SAMPLER_WAIT (-1)

/* One sample of the epoch order. */
struct sf_sample_ref {
    uint64_t shard;    /* index into the counts array given to sf_sampler_new() */
    uint64_t sample;   /* index of the sample within the shard, from 0, in file order */
    uint64_t position; /* 0-based place of this item in the stream's epoch order */
    /* 0-based place in the stream's read order: real samples are numbered
     * in sf_sampler_plan() order, pads after them. The item can only be
     * delivered once read_index samples before it have been read:
     * read_index <= position + shuffle_buffer - 1 (docs/sampling.md). */
    uint64_t read_index;
    unsigned flags; /* SF_SAMPLE_PAD or 0 */
};

/* A run of samples the stream reads: samples [begin, end) of shard. */
struct sf_shard_range {
    uint64_t shard;
    uint64_t begin;
    uint64_t end;
};

/*
 * Creates the sampler of one stream (one worker of one rank).
 *
 * counts[i] is the number of samples of shard i (from index.json or a
 * listing pass); the array is copied. A shard of 0 samples is allowed and
 * never read. o NULL means the defaults. Fields of o left at -1 (rank,
 * world_size) are resolved with sf_dist_from_env().
 *
 * Fails with SF_ERR_INVALID_ARGUMENT (bad option, n_shards 0, counts NULL,
 * too few shards or samples for world_size x num_workers streams, sample
 * total overflowing 64 bits), SF_ERR_LIMIT (more than SF_SAMPLER_MAX_SHARDS
 * shards) or SF_ERR_NO_MEMORY. On failure *out is NULL and, when err is not
 * NULL, it receives a message (truncated to err_len). out may not be NULL.
 *
 * Cost: O(n_shards log streams) per epoch to plan, O(shuffle_buffer) memory.
 */
SF_API sf_status sf_sampler_new(const struct sf_sampler_options *o, const uint64_t *counts,
                                size_t n_shards, struct sf_sampler **out, char *err,
                                size_t err_len);

/* Frees the sampler. NULL is a no-op. */
SF_API void sf_sampler_destroy(struct sf_sampler *s);

/*
 * Delivers the next sample of the epoch into *out and returns 1, or returns
 * 0 at the end of the epoch (then *out is untouched and later calls keep
 * returning 0 until sf_sampler_set_epoch() or a restore). Never fails and
 * never allocates; s and out may not be NULL (0 is returned if they are).
 * An open-ended sampler on estimated counts returns SF_SAMPLER_WAIT (-1)
 * when its next step needs to know whether read index k exists, k being the
 * number of reads it has taken so far: call sf_sampler_feed() and retry.
 * The order is the same whatever the timing of the feeds.
 */
SF_API int sf_sampler_next(struct sf_sampler *s, struct sf_sample_ref *out);

/*
 * Tells an open-ended sampler (estimated counts, one stream or
 * SF_EPOCH_UNEVEN) that its stream has at least `reads` samples in read
 * order, or, with final 1, exactly `reads` (the reader reached the end of
 * its plan). Then the epoch size is `reads`. A no-op for other samplers.
 * Fails with SF_ERR_INVALID_ARGUMENT when a final length contradicts what
 * the sampler was told or has already taken as read. s may not be NULL.
 */
SF_API sf_status sf_sampler_feed(struct sf_sampler *s, uint64_t reads, int final);

/*
 * Starts epoch `epoch` from its beginning (the configuration is kept). The
 * epoch number may go back or jump. Never fails: sf_sampler_new() allocated
 * everything an epoch needs. Costs one epoch plan, O(n_shards log streams).
 * NULL is a no-op.
 */
SF_API void sf_sampler_set_epoch(struct sf_sampler *s, uint64_t epoch);

/*
 * Number of samples this stream delivers in the current epoch, pads
 * included. With SF_EPOCH_PAD and SF_EPOCH_DROP it is the same on every
 * rank and worker of the job. For an open-ended sampler (estimated counts)
 * it is the estimate until sf_sampler_feed() gives the final length
 * (sf_sampler_info.size_known). s may not be NULL.
 */
SF_API uint64_t sf_sampler_epoch_size(const struct sf_sampler *s);

/* Facts about a sampler and its current epoch. */
struct sf_sampler_info {
    uint64_t epoch;
    uint64_t epoch_size; /* as sf_sampler_epoch_size() */
    int size_known;      /* 0: epoch_size is an estimate (open-ended, not fed yet) */
    int estimated;       /* estimated_counts */
    uint64_t position;   /* samples delivered so far this epoch */
    uint64_t pad_count;  /* how many of epoch_size are SF_SAMPLE_PAD repeats */
    /* Samples of this stream's share not delivered this epoch (SF_EPOCH_DROP). */
    uint64_t dropped_count;
    uint64_t total_samples; /* samples of all shards: the whole epoch, every stream */
    int rank;               /* resolved, options or environment */
    int world_size;
    unsigned worker;
    unsigned num_workers;
    uint64_t shuffle_buffer; /* effective: at least 1 */
    uint64_t initial_fill;   /* effective: 1..shuffle_buffer */
};

/* Fills *out. s and out may not be NULL. */
SF_API void sf_sampler_get_info(const struct sf_sampler *s, struct sf_sampler_info *out);

/*
 * The shard ranges this stream reads in the current epoch, in read order
 * (the order a loader should fetch them in). Sets *n to their number.
 * Returns an array owned by the sampler, valid until the next
 * sf_sampler_set_epoch(), successful sf_sampler_state_restore() or
 * sf_sampler_destroy(). Pads re-use samples of these ranges and are not
 * listed. s and n may not be NULL.
 */
SF_API const struct sf_shard_range *sf_sampler_plan(const struct sf_sampler *s, size_t *n);

/* ------------------------------------------------------------------ state */

/* Size of a saved state, in bytes. Fixed for state versions 1 (exact counts)
 * and 2 (estimated counts: also the flag and, once known, the open-ended
 * stream's length). */
#define SF_SAMPLER_STATE_BYTES 128

/*
 * Saves where the stream is: its configuration (seed, counts hash and shard
 * count, rank, world size, worker, workers, shuffle buffer, initial fill,
 * policy, partition), the epoch and the number of samples delivered, as
 * SF_SAMPLER_STATE_BYTES bytes of a versioned little-endian format with a
 * checksum (docs/sampling.md). Portable across machines and processes.
 * A sampler on estimated counts also saves its stream length when it was
 * fed a final one (version 2 of the format).
 *
 * Writes exactly SF_SAMPLER_STATE_BYTES bytes to buf. Fails with
 * SF_ERR_INVALID_ARGUMENT when buf_len is smaller. s and buf may not be NULL.
 */
SF_API sf_status sf_sampler_state_save(const struct sf_sampler *s, void *buf, size_t buf_len);

/*
 * As sf_sampler_state_save(), but records `position` samples delivered
 * instead of the sampler's own count: for a loader that runs ahead of what
 * its user has consumed and saves the user's position. position may not
 * exceed sf_sampler_epoch_size() (else SF_ERR_INVALID_ARGUMENT), unless the
 * sampler is open-ended and its length not known yet.
 */
SF_API sf_status sf_sampler_state_save_at(const struct sf_sampler *s, uint64_t position, void *buf,
                                          size_t buf_len);

/*
 * Moves s to a saved state: the saved epoch, with the saved number of
 * samples already delivered, so the next sf_sampler_next() returns exactly
 * the first sample not yet delivered and the rest of the epoch follows,
 * none twice. s may have been created with any epoch; everything else of its
 * configuration must match the saved one.
 *
 * Fails, leaving s unchanged, with SF_ERR_CORRUPT (not a sampler state,
 * bad checksum), SF_ERR_UNSUPPORTED (a state version this library does not
 * know) or SF_ERR_INVALID_ARGUMENT (state_len is not
 * SF_SAMPLER_STATE_BYTES, or the state belongs to a different
 * configuration: the message, see sf_sampler_errmsg(), names the first
 * field that differs and both values). s and state may not be NULL.
 *
 * Cost: plans the saved epoch and replays it up to the position without
 * producing output: O(n_shards log streams + position) steps of a few
 * nanoseconds each; no allocation.
 */
SF_API sf_status sf_sampler_state_restore(struct sf_sampler *s, const void *state,
                                          size_t state_len);

/*
 * The detail message of the last call on s that failed ("" when none did).
 * Owned by s, valid until the next call on s. s may not be NULL.
 */
SF_API const char *sf_sampler_errmsg(const struct sf_sampler *s);

#ifdef __cplusplus
}
#endif

/* Lets shardfeed.h include shardfeed_loader.h once these types are complete. */

#endif /* SHARDFEED_SAMPLING_H */
