/*
 * Disk tier: a directory of verified shard copies shared by many processes.
 *
 * Layout under <dir>/v1/ (see docs/cache.md):
 *   <kh[0:2]>/<kh>-<eh>.sf   published entry: the object's bytes, then a JSON
 *                            metadata block, then a 64-byte trailer (size,
 *                            XXH3-64 of the data, metadata checksum)
 *   <kh[0:2]>/<kh>.part      the download in progress for that key
 *   <kh[0:2]>/<kh>.lock      flock()ed by the downloader; holds a progress
 *                            record other processes read to follow it
 *   usage, evict.lock        the byte count of the tier, under evict.lock
 * kh = SHA-256(format version, endpoint, bucket, key), eh = SHA-256(ETag):
 * names never contain key text, so no key can point outside the directory.
 *
 * Locks are flock(2) locks: the kernel drops them when a process dies, so a
 * crash never leaves a key locked, and no shared memory outlives anyone.
 *
 * A struct sf__disk_cache is used by one thread at a time (the caller
 * serializes); many processes and many handles may share one directory.
 */
#ifndef SF_CACHE_DISK_CACHE_H
#define SF_CACHE_DISK_CACHE_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define SF__DC_FORMAT_VERSION 1
#define SF__DC_TRAILER_BYTES  64
#define SF__DC_ETAG_MAX       128
#define SF__DC_NAME_MAX       128
#define SF__DC_BLOCK_BYTES    (4u << 20)

struct sf__disk_cache;
struct sf__dc_writer;

struct sf__disk_cache_options {
    const char *dir;       /* created (0700) when missing */
    uint64_t limit_bytes;  /* 0 = unlimited */
    int fsync;             /* fsync the data and the directory at publish */
    unsigned stale_part_s; /* abandoned downloads older than this are swept */
};

/* What an object is, independent of its version. */
struct sf__cache_id {
    const char *endpoint; /* "http://127.0.0.1:9000", "https://s3.us-east-1.amazonaws.com" */
    const char *bucket;
    const char *key;
};

/* A published entry, as read back from its trailer and metadata. */
struct sf__dc_meta {
    uint64_t size;
    uint64_t checksum; /* XXH3-64 of the data */
    int64_t created;   /* unix seconds */
    int64_t last_used; /* mtime of the entry file, unix seconds */
    char etag[SF__DC_ETAG_MAX];
    char url[1024];
    char name[SF__DC_NAME_MAX]; /* entry file name relative to <dir>/v1 */
    uint64_t *blocks;           /* XXH3-64 of each SF__DC_BLOCK_BYTES block (malloc'd) */
    size_t n_blocks;
};
/* Frees meta->blocks. */
void sf__dc_meta_clear(struct sf__dc_meta *meta);

/* The progress record a downloader keeps in <kh>.lock. */
enum sf__dc_state { SF__DC_ST_IDLE = 0, SF__DC_ST_DOWNLOADING = 1, SF__DC_ST_PUBLISHED = 2 };
struct sf__dc_record {
    uint32_t state; /* enum sf__dc_state */
    uint64_t size;
    uint64_t contiguous; /* leading bytes of <kh>.part that are final */
    uint64_t pid;
    char etag[SF__DC_ETAG_MAX];
};

struct sf__dc_usage {
    uint64_t entries, entry_bytes;
    uint64_t parts, part_bytes; /* downloads in progress or abandoned */
    uint64_t abandoned_parts;
};

sf_status sf__disk_cache_open(const struct sf__disk_cache_options *o, struct sf__disk_cache **out,
                              char *err, size_t err_len);
void sf__disk_cache_close(struct sf__disk_cache *dc);             /* NULL is fine */
const char *sf__disk_cache_root(const struct sf__disk_cache *dc); /* <dir>/v1 */

/* Lookup flags. */
#define SF__DC_VERIFY_DATA 1u /* hash the data too, not only the trailer */
#define SF__DC_NO_TOUCH    2u /* do not mark the entry used (ls, verify) */

/*
 * Finds the published entry for id with that ETag (etag NULL or "": the
 * newest entry of any ETag: the "trust" revalidation policy). On a hit,
 * returns SF_OK with an O_RDONLY descriptor in *fd (the caller closes it) and
 * the entry's metadata, and marks the entry used (its mtime, the LRU clock).
 * SF_ERR_NOT_FOUND: no entry. SF_ERR_CORRUPT: an entry was there but failed
 * verification; it has been deleted (err says which check, at which offset)
 * and the caller should treat this as a miss.
 */
sf_status sf__dc_lookup(struct sf__disk_cache *dc, const struct sf__cache_id *id, const char *etag,
                        unsigned flags, int *fd, struct sf__dc_meta *meta, char *err,
                        size_t err_len);

/* Checks the data of an open entry against meta->checksum (XXH3-64). */
sf_status sf__dc_verify_fd(int fd, const struct sf__dc_meta *meta, char *err, size_t err_len);

enum sf__dc_begin_result {
    SF__DC_OWNER = 0,     /* this handle downloads: *w is set */
    SF__DC_BUSY = 1,      /* another process (or handle) is downloading it */
    SF__DC_PUBLISHED = 2, /* it was published meanwhile: look it up again */
};

/*
 * Tries to become the one downloader of (id, etag, size). Reserves size bytes
 * under the limit first, evicting least recently used entries; SF_ERR_LIMIT
 * when they cannot fit. The owner writes the bytes into sf__dc_writer_fd() at
 * their offsets; the first sf__dc_writer_resume() bytes are already there
 * from an interrupted download of the same ETag.
 */
sf_status sf__dc_begin(struct sf__disk_cache *dc, const struct sf__cache_id *id, const char *etag,
                       uint64_t size, enum sf__dc_begin_result *result, struct sf__dc_writer **w,
                       char *err, size_t err_len);
/* The bytes a download of size bytes reserves under the limit: the data and
 * room for its metadata and trailer (a published entry takes a little less). */
uint64_t sf__dc_entry_reserve(uint64_t size);
int sf__dc_writer_fd(const struct sf__dc_writer *w);
uint64_t sf__dc_writer_resume(const struct sf__dc_writer *w);
/*
 * In-stream checksums: the downloader calls this right after it wrote n bytes
 * at object offset `offset` of sf__dc_writer_fd(), with the bytes it wrote.
 * Each 4 MiB block is hashed as its bytes come in, from memory. Bytes that
 * arrive ahead of a gap in their block wait in the file and are hashed from
 * it (page cache) as soon as the gap is filled; bytes given twice, or more
 * gaps than it tracks, leave the block to be hashed from the file at publish
 * (counted). It may run on another thread than the writer's other calls,
 * but never at the same time as sf__dc_writer_publish/abort (the caller
 * stops the download first).
 */
void sf__dc_writer_feed(struct sf__dc_writer *w, uint64_t offset, const void *data, size_t n);
/* Publishes progress for processes following this download. */
void sf__dc_writer_progress(struct sf__dc_writer *w, uint64_t contiguous);
/*
 * All size bytes are written: takes the blocks' checksums from what
 * sf__dc_writer_feed() saw (hashing from the file only the blocks it could
 * not finish: a resumed prefix, bytes written twice), appends metadata and trailer,
 * renames the file into place (atomic publish), removes other ETags of the
 * key, unlocks and frees w. On failure w is aborted and freed too. *meta,
 * when not NULL, receives the published entry.
 */
sf_status sf__dc_writer_publish(struct sf__dc_writer *w, const char *url, struct sf__dc_meta *meta,
                                char *err, size_t err_len);
/* Gives up: keep_part keeps the bytes so a later begin resumes. Frees w. */
void sf__dc_writer_abort(struct sf__dc_writer *w, int keep_part);

/*
 * Reads another downloader's progress record for id. *owner_alive: 1 while a
 * process holds the key's lock. Returns SF_ERR_NOT_FOUND when there is none.
 */
sf_status sf__dc_peek(struct sf__disk_cache *dc, const struct sf__cache_id *id,
                      struct sf__dc_record *rec, int *owner_alive);
/* O_RDONLY descriptor of the key's download in progress, or -1. */
int sf__dc_open_part(struct sf__disk_cache *dc, const struct sf__cache_id *id);

/* Calls fn for every published entry (read from trailers, not verified). */
sf_status sf__dc_foreach(struct sf__disk_cache *dc,
                         int (*fn)(void *user, const char *path, const struct sf__dc_meta *m,
                                   sf_status st, const char *why),
                         void *user, char *err, size_t err_len);
/* Deletes one entry by name (from sf__dc_meta.name). `checked` (or NULL) is
 * the fstat of the file the caller found bad: when the name now holds
 * another file (republished by another process meanwhile), that one stays
 * and SF_ERR_NOT_FOUND is returned. */
sf_status sf__dc_remove(struct sf__disk_cache *dc, const char *name, const struct stat *checked);
/* Scans the directory: sizes, and sweeps abandoned downloads when sweep. */
sf_status sf__dc_usage(struct sf__disk_cache *dc, int sweep, struct sf__dc_usage *u, char *err,
                       size_t err_len);
/* Deletes every entry and every abandoned download. Downloads in progress
 * in other processes are left alone. *removed counts files deleted. */
sf_status sf__dc_clear(struct sf__disk_cache *dc, uint64_t *removed, char *err, size_t err_len);

/* Counters of this handle. */
struct sf__dc_counters {
    uint64_t hits, misses, corrupt, evictions, evicted_bytes, published, resumed, swept;
    /* published blocks hashed as their bytes arrived / read back from the
     * file at publish; bytes hashed from the file during a download because
     * they landed before the bytes in front of them */
    uint64_t stream_hashed_blocks, file_hashed_blocks, catch_up_bytes;
};
void sf__dc_counters(const struct sf__disk_cache *dc, struct sf__dc_counters *out);

/* Default directory: $XDG_CACHE_HOME/shardfeed, else $HOME/.cache/shardfeed. */
sf_status sf__dc_default_dir(char *out, size_t out_len);

#endif
