/*
 * RAM tier: a byte-bounded LRU of shard buffers, reference-counted.
 *
 * An entry is a buffer plus a release function; the cache owns it from
 * insertion on. Entries in use (references held) are never evicted: the
 * cache evicts the least recently released unused entries until the bytes
 * held fit the limit. When everything held is in use, an insertion that
 * does not fit fails with SF_ERR_LIMIT rather than exceeding the limit, so
 * the limit is a hard bound; callers apply backpressure (wait for releases).
 *
 * Thread-safe: every function may be called from any thread.
 */
#ifndef SF_CACHE_RAM_CACHE_H
#define SF_CACHE_RAM_CACHE_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>

struct sf__ram_cache;
struct sf__ram_entry;

struct sf__ram_stats {
    uint64_t limit_bytes;
    uint64_t bytes; /* held now, in use or not */
    uint64_t bytes_in_use;
    uint64_t entries;
    uint64_t hits;
    uint64_t misses;
    uint64_t insertions;
    uint64_t evictions;
    uint64_t evicted_bytes;
    uint64_t refused; /* insertions refused: no room even after evicting */
};

typedef void (*sf__ram_release_fn)(void *user, void *data, size_t size);

sf_status sf__ram_cache_new(uint64_t limit_bytes, struct sf__ram_cache **out);
/* Frees every entry. All references must have been released. NULL is fine. */
void sf__ram_cache_destroy(struct sf__ram_cache *c);

/* Takes a reference to the entry for key, or NULL (a miss, counted). */
struct sf__ram_entry *sf__ram_cache_get(struct sf__ram_cache *c, const char *key);

/*
 * Inserts data (size bytes, released by release(user, data, size) when the
 * entry is evicted or the cache destroyed) under key and returns a reference
 * to it in *out. If key is already present, the existing entry is returned
 * and the new buffer is released at once. SF_ERR_LIMIT: size does not fit
 * even after evicting every unused entry; the buffer is then NOT taken and
 * stays the caller's.
 */
sf_status sf__ram_cache_insert(struct sf__ram_cache *c, const char *key, void *data, size_t size,
                               sf__ram_release_fn release, void *user, struct sf__ram_entry **out);

/* Drops a reference taken by get or insert. NULL is fine. */
void sf__ram_cache_release(struct sf__ram_cache *c, struct sf__ram_entry *e);

/* Removes key if present and unused (1), or marks it to go on last release. */
int sf__ram_cache_remove(struct sf__ram_cache *c, const char *key);

const void *sf__ram_entry_data(const struct sf__ram_entry *e);
size_t sf__ram_entry_size(const struct sf__ram_entry *e);

void sf__ram_cache_stats(struct sf__ram_cache *c, struct sf__ram_stats *out);

#endif
