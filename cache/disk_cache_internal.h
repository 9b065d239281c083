/*
 * What the files of the disk tier share; internal to cache/ (the API the
 * rest of the library uses is cache/disk_cache.h).
 *
 *   disk_cache.c   open/close, names (key and ETag hashes, paths), lookup
 *   disk_entry.c   the entry format: trailer + JSON metadata, block digests,
 *                  reading and verifying an entry
 *   disk_write.c   downloads: sf__dc_begin, in-stream block checksums,
 *                  publish, and the progress records followers read
 *   disk_evict.c   the byte count under evict.lock, directory scans,
 *                  eviction, listing, removal and clearing
 */
#ifndef SF_CACHE_DISK_CACHE_INTERNAL_H
#define SF_CACHE_DISK_CACHE_INTERNAL_H

#include "cache/disk_cache.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#define SF__DC_ENTRY_SUFFIX ".sf"

struct sf__disk_cache {
    struct sf__disk_cache_options o;
    char root[PATH_MAX - 128]; /* <dir>/v1 */
    struct sf__dc_counters n;
};

/* Blocks of SF__DC_BLOCK_BYTES in an object of size bytes. */
static inline size_t sf__dc_n_blocks(uint64_t size)
{
    return (size_t)((size + SF__DC_BLOCK_BYTES - 1) / SF__DC_BLOCK_BYTES);
}

/* A lower-case hex digit's value, else -1 (names and metadata are lower case). */
static inline int sf__dc_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static inline int64_t sf__dc_now_unix(void)
{
    return (int64_t)time(NULL);
}

/* ---- disk_cache.c: names and lookup */

/* kh: SHA-256 over the version and the three identity strings, NUL-separated. */
void sf__dc_key_hash(const struct sf__cache_id *id, char kh[65]);
/* "<kh[0:2]>/<kh>-<eh>.sf" of the key's entry with that ETag. */
void sf__dc_entry_name(const char *kh, const char *etag, char *out, size_t n);
/* mkdir 0700; an existing directory is fine. 0 or -1 (errno). */
int sf__dc_mkdir(const char *path);
/* sf__dc_mkdir of a key directory <root>/<kh[0:2]>, making <root> and its
 * parents again when they were removed. 0 or -1 (errno). */
int sf__dc_mkdir_sub(const char *path);
/* <root>/<kh[0:2]>, and <root>/<kh[0:2]>/<kh><suffix>; -1 when too long. */
int sf__dc_sub_path(const struct sf__disk_cache *dc, const char *kh, char *out, size_t n);
int sf__dc_file_path(const struct sf__disk_cache *dc, const char *kh, const char *suffix, char *out,
                     size_t n);
/* sf__dc_lookup for a key hash already computed. */
sf_status sf__dc_lookup_kh(struct sf__disk_cache *dc, const struct sf__cache_id *id, const char *kh,
                           const char *etag, unsigned flags, int *fd_out, struct sf__dc_meta *meta,
                           char *err, size_t err_len);

/* ---- disk_entry.c: the entry format */

/*
 * Reads and checks the trailer and metadata of an open entry (identity
 * checked when id is set, the ETag when want_etag is not empty). why says
 * what failed, at which offset. Fills meta (blocks allocated).
 */
sf_status sf__dc_read_entry(int fd, const struct sf__cache_id *id, const char *want_etag,
                            struct sf__dc_meta *meta, char *why, size_t why_len);
/* Reads n bytes of fd at off into buf, retrying short reads; a file that ends
 * first is SF_ERR_CORRUPT, a read error SF_ERR_IO (err names the offset). */
sf_status sf__dc_pread_full(int fd, unsigned char *buf, size_t n, uint64_t off, char *err,
                            size_t err_len);
/*
 * The metadata (JSON text, malloc'd into *meta_json, the caller frees it)
 * and trailer of an entry of size bytes with these block checksums, to be
 * written after the data. SF_ERR_NO_MEMORY, else SF_OK.
 */
sf_status sf__dc_entry_encode(const struct sf__cache_id *id, const char *etag, const char *url,
                              uint64_t size, int64_t created, const uint64_t *blocks, size_t nb,
                              char **meta_json, unsigned char trailer[SF__DC_TRAILER_BYTES]);

/* ---- disk_evict.c: the byte count, eviction */

/* Takes <root>/evict.lock (blocking); the descriptor, or -1. */
int sf__dc_evict_lock(struct sf__disk_cache *dc);
void sf__dc_evict_unlock(int fd);
/* Adds delta (may be negative) to the stored count; unknown stays unknown. */
void sf__dc_usage_add(struct sf__disk_cache *dc, int64_t delta);
/* Deletes path when it is still the file we looked at; returns its size. */
int64_t sf__dc_unlink_same(const char *path, const struct stat *seen);
/*
 * Under evict.lock: makes room for `need` bytes (own_kh's part excluded from
 * the count: it is being replaced). Returns SF_OK with the new usage written.
 */
sf_status sf__dc_make_room(struct sf__disk_cache *dc, uint64_t need, const char *own_kh, char *err,
                           size_t err_len);
/* Under evict.lock: gives back `need` bytes that sf__dc_make_room reserved. */
void sf__dc_unreserve_locked(struct sf__disk_cache *dc, uint64_t need);

#endif
