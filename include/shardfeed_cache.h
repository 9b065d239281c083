/*
 * shardfeed cache: a RAM tier and a disk tier between the object store and
 * the shard readers, and the warm-cache operation.
 *
 * The disk tier is a directory many processes share (the ranks of a node,
 * several jobs): each object is downloaded once, by whichever process asks
 * first; the others follow its progress and read the bytes as they land.
 * Every entry carries its size, ETag, source URL and XXH3-64 checksums of
 * its data, checked when it is opened; an entry that fails is deleted and
 * fetched again, never served. docs/cache.md describes the layout, the
 * locking and the policies.
 *
 * Threads: a struct sf_cache and the objects opened from it are used by one
 * thread at a time (the caller serializes). Several handles, in one process
 * or many, may share a directory.
 */
#ifndef SHARDFEED_CACHE_H
#define SHARDFEED_CACHE_H

#include "shardfeed/common.h"
#include "shardfeed_s3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* When the cached copy of a key is trusted without asking the store. */
enum sf_cache_revalidate {
    /* A cached entry of the key is used as is; the store is not asked. Right
     * for training data, whose shards are written once. The default. */
    SF_REVALIDATE_TRUST = 0,
    /* Each open sends a HEAD (sf_s3_stat) and uses the entry only when its
     * ETag is the object's current one. Objects from a listing already carry
     * their ETag and need no HEAD. */
    SF_REVALIDATE_HEAD = 1,
};

struct sf_cache_options {
    /* Disk tier directory; NULL: $XDG_CACHE_HOME/shardfeed, else
     * ~/.cache/shardfeed. Created with mode 0700 when missing. */
    const char *dir;
    /* Disk tier limit in bytes (entries and downloads in progress); 0 means
     * no limit. Least recently used entries are evicted to stay under it. */
    unsigned long long limit_bytes;
    /* RAM tier: bytes of verified entries kept mapped between opens so a
     * re-open costs no I/O and no checksum; 0 (default) disables it. */
    unsigned long long ram_limit_bytes;
    /* fsync entries and their directory when publishing (default 0: a crash
     * may lose a recent entry, never corrupt one: it fails verification). */
    int fsync;
    enum sf_cache_revalidate revalidate;
    /* Hash the data of every entry opened from disk (default 1). With 0,
     * only the trailer and metadata are checked. */
    int verify_on_open;
    sf_log_fn log; /* NULL: silent */
    void *log_user;
    enum sf_log_level log_level; /* default SF_LOG_WARN */
};

/* Fills o with the defaults above. */
SF_API void sf_cache_options_init_default(struct sf_cache_options *o);

struct sf_cache;

/*
 * Opens (creating when needed) the cache described by o. On failure *out is
 * NULL and err (when not NULL) says why.
 */
SF_API sf_status sf_cache_new(const struct sf_cache_options *o, struct sf_cache **out, char *err,
                              size_t err_len);
/* Closes the cache. Every object opened from it must be closed. NULL is fine. */
SF_API void sf_cache_destroy(struct sf_cache *c);
/* The directory in use (the resolved default when o->dir was NULL). */
SF_API const char *sf_cache_dir(const struct sf_cache *c);
/* Copies the detail of the last failure of a call on c ("" when none) into
 * buf and returns buf, as sf_s3_errmsg() does. */
SF_API const char *sf_cache_errmsg(const struct sf_cache *c, char *buf, size_t len);

/* ------------------------------------------------------------ objects */

/* Where an opened object's bytes come from. */
enum sf_cache_source {
    SF_CACHE_FROM_RAM = 0,   /* the RAM tier */
    SF_CACHE_FROM_DISK = 1,  /* a verified disk entry */
    SF_CACHE_FROM_FETCH = 2, /* this handle downloads it now */
    SF_CACHE_FROM_PEER = 3,  /* another process downloads it; we follow */
};

struct sf_cache_object;

struct sf_cache_object_progress {
    unsigned long long size;       /* object size */
    unsigned long long contiguous; /* bytes [0, contiguous) of the data are final */
    int done;                      /* 1 when complete (and verified) or failed */
    enum sf_cache_source source;
    sf_status status;
};

/*
 * Opens obj (from sf_s3_expand/sf_s3_list/sf_s3_stat; size and ETag may be
 * unknown, then a HEAD finds them on a miss) through the cache: a hit is
 * verified and ready at once; on a miss this handle starts downloading it
 * into the disk tier, or follows the process that already is.
 * sf_cache_object_wait() drives the download and reports progress.
 */
SF_API sf_status sf_cache_open(struct sf_cache *c, struct sf_s3 *s3,
                               const struct sf_object_info *obj, struct sf_cache_object **out);

/*
 * Waits until at least min_contiguous bytes are available, the object is
 * complete (published and verified) or failed, or timeout_ms passes (then
 * SF_ERR_TIMEOUT; -1 waits forever). The download advances only inside this
 * call. Returns the object's status otherwise; p (may be NULL) gets the state.
 */
SF_API sf_status sf_cache_object_wait(struct sf_cache_object *o, unsigned long long min_contiguous,
                                      int timeout_ms, struct sf_cache_object_progress *p);

/* The object's bytes, read-only, valid for the contiguous prefix reported by
 * the last wait, until sf_cache_object_close(). NULL for an empty object.
 * While another process downloads the object (progress source
 * SF_CACHE_FROM_PEER, not done), a wait may replace the mapping when that
 * download ends or its process dies: take the pointer again after each wait
 * until the object is done, and keep no pointer from before across one. */
SF_API const void *sf_cache_object_data(const struct sf_cache_object *o);
SF_API unsigned long long sf_cache_object_size(const struct sf_cache_object *o);
/* Why the object failed (names the object and the offset); "" otherwise. */
SF_API const char *sf_cache_object_errmsg(const struct sf_cache_object *o);
/* Closes the object. A download not finished stops; its bytes are kept and
 * a later open resumes it. NULL is fine. */
SF_API void sf_cache_object_close(struct sf_cache_object *o);

/*
 * Marks o as the object being read now (priority 1) or a prefetch (0).
 * While this handle downloads it, its ranges are started before those of the
 * S3 client's other fetches (sf_fetch_set_priority()); a download that starts
 * later (after the lookup, or when a peer that was downloading it died)
 * starts with it. No effect on hits or on downloads followed in another
 * process. A loader sets it on the shard it is parsing and clears it when it
 * moves on. Same thread rules as sf_cache_object_wait(); o may not be NULL.
 */
SF_API void sf_cache_object_set_priority(struct sf_cache_object *o, int priority);

/* ------------------------------------------------------------ warm-cache */

/* What happened to one object during sf_cache_warm(). */
enum sf_warm_outcome {
    SF_WARM_FETCHED = 0, /* downloaded by this call */
    SF_WARM_CACHED = 1,  /* already cached and valid: skipped */
    SF_WARM_PEER = 2,    /* another process downloaded it meanwhile */
    SF_WARM_FAILED = 3,
    SF_WARM_WOULD_FETCH = 4, /* dry run: would be downloaded */
};

struct sf_warm_stats {
    unsigned long long objects_total, objects_done;
    unsigned long long fetched, cached, peer, failed;
    unsigned long long bytes_total;    /* all objects */
    unsigned long long bytes_to_fetch; /* objects not cached when the call began */
    unsigned long long bytes_fetched;  /* downloaded so far by this call */
    double elapsed_s;
};

/* The most objects sf_cache_warm() downloads at once (max_objects). */
#define SF_WARM_MAX_OBJECTS_MAX 256u

struct sf_warm_options {
    unsigned max_objects; /* objects downloading at once; 0 = 8; at most
                             SF_WARM_MAX_OBJECTS_MAX (SF_ERR_INVALID_ARGUMENT above) */
    int verify;           /* hash cached entries before skipping them (default 0:
                             trailer and metadata checks only) */
    int dry_run;          /* report, download nothing */
    /* Called about every progress_interval_ms (default 200) and at the end. */
    void (*progress)(void *user, const struct sf_warm_stats *s);
    unsigned progress_interval_ms;
    /* Called once per object when its outcome is known; msg names the object
     * and the offset for failures, "" otherwise. */
    void (*on_object)(void *user, const struct sf_object_info *obj, enum sf_warm_outcome outcome,
                      sf_status status, const char *msg);
    void *user;
    /* Optional (NULL: never cancelled): asked on the calling thread before
     * each object is looked up and about every 20 ms while downloading.
     * Nonzero stops the call: downloads in progress stop (their bytes are
     * kept and a later call resumes them), objects not reached yet are left
     * alone, progress is called once more with the totals so far, and the
     * call returns SF_ERR_CANCELLED. */
    int (*cancel)(void *user);
};
SF_API void sf_warm_options_init_default(struct sf_warm_options *o);

/*
 * Whether a training run reads obj, one of the objects sf_s3_expand(s3,
 * source) gave, as a shard: what warm-cache should cache. A listing (a
 * source ending in '/', or a local folder) gives its shards, *.tar and
 * *.sfr, and not the index.json beside them (the loader reads that with one
 * GET, never through the cache) nor any other file; an object named by its
 * key or a brace pattern is read whatever its name; a prefix never.
 * source and obj are not kept. 1 or 0. Any thread.
 */
SF_API int sf_warm_wants(const char *source, const struct sf_object_info *obj);

/*
 * Makes every one of the n_objects objects (from sf_s3_expand(), sf_s3_list()
 * or sf_s3_stat(); prefixes are ignored) present and valid in c's disk tier. Objects
 * already cached are skipped; the rest download in parallel (s3's
 * concurrency and chunk size); an interrupted run resumes where it stopped.
 * Before downloading anything it checks that the objects fit in the cache
 * limit (SF_ERR_LIMIT otherwise). Returns SF_OK when every object is
 * cached, else the status of the first failure (each one went to on_object).
 * *stats (may be NULL) gets the totals.
 */
SF_API sf_status sf_cache_warm(struct sf_cache *c, struct sf_s3 *s3,
                               const struct sf_object_info *objects, size_t n_objects,
                               const struct sf_warm_options *o, struct sf_warm_stats *stats);

/* ------------------------------------------------------------ inspection */

struct sf_cache_stats {
    /* This handle, since sf_cache_new(). */
    unsigned long long ram_hits, disk_hits, misses, corrupt, evictions, evicted_bytes;
    unsigned long long fetched_objects, fetched_bytes, resumed, peer_waits;
    unsigned long long ram_bytes, ram_limit_bytes;
    /* The directory, scanned now. */
    unsigned long long entries, entry_bytes, downloads, download_bytes, abandoned_downloads;
    unsigned long long limit_bytes;
    /* This handle: checksum blocks of the entries it published, hashed as
     * their bytes arrived or read back from the file at publish (resumed
     * downloads, bytes written twice); bytes hashed from the file during a
     * download because they landed ahead of a gap in their 4 MiB block. */
    unsigned long long stream_hashed_blocks, file_hashed_blocks, catch_up_bytes;
};
/* Fills *out; scans the directory. */
SF_API sf_status sf_cache_stats(struct sf_cache *c, struct sf_cache_stats *out);

/* One entry, as listed. */
struct sf_cache_entry_info {
    const char *name; /* file name below the cache directory */
    const char *url;  /* source ("" when the metadata is unreadable) */
    const char *etag;
    unsigned long long size;
    long long created, last_used; /* unix seconds */
    sf_status status;             /* SF_OK, or why the entry is invalid */
    const char *problem;          /* "" or what failed, with the offset */
};

/*
 * Calls fn for every entry, least recently used first; fn returns nonzero to
 * stop. With verify, each entry's data is hashed and a bad entry is deleted
 * (reported with its status and problem). *bad (may be NULL) counts them.
 */
SF_API sf_status sf_cache_list(struct sf_cache *c, int verify,
                               int (*fn)(void *user, const struct sf_cache_entry_info *e),
                               void *user, unsigned long long *bad);

/* Deletes every entry and abandoned download; downloads running in other
 * processes are left alone. *removed (may be NULL) counts files deleted. */
SF_API sf_status sf_cache_clear(struct sf_cache *c, unsigned long long *removed);

#ifdef __cplusplus
}
#endif

/* Lets shardfeed.h include shardfeed_loader.h once these types are complete. */

#endif
