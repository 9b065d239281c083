/*
 * Learned sample counts (docs/sampling.md, "Without counts"): the number of
 * samples a shard was found to hold, kept in the cache directory, keyed by
 * the object's URL, ETag and size, so that a later epoch or run knows it
 * without reading the shard or an index.json.
 *
 * The store is one append-only file, <cache_dir>/v1/counts.log, of lines
 *   <32 hex: XXH3-128 of url \0 etag \0 size> <count> <8 hex: check>\n
 * appended with one O_APPEND write each (atomic on local file systems), so
 * the ranks of a node may add to it at once. A line whose check fails (torn
 * or damaged) is ignored. Records are read from the end of each line: an
 * append that follows a torn one (a crash mid-write leaves no newline) lands
 * on the same line, and is still found. Counts of the same key never differ unless the
 * data does, and then the ETag differs too.
 *
 * Thread safety: none inside; the loader calls it from one thread at a time.
 */
#ifndef SF_SRC_COUNTS_H
#define SF_SRC_COUNTS_H

#include "shardfeed.h"

#include <stddef.h>
#include <stdint.h>

/* The key of one object: XXH3-128 of url, etag and size (decimal). */
struct sf__count_key {
    uint64_t hi, lo;
};
struct sf__count_key sf__count_key_of(const char *url, const char *etag, unsigned long long size);

/*
 * Looks up the keys[0..n) in <dir>/v1/counts.log: found[i] = 1 and counts[i]
 * set for each key present (others untouched). A missing file finds nothing
 * (SF_OK). Cost: one pass over the file plus O(n log n).
 */
sf_status sf__counts_lookup(const char *dir, const struct sf__count_key *keys, size_t n,
                            uint64_t *counts, unsigned char *found);

/* Appends one learned count. Creates <dir>/v1 when needed. */
sf_status sf__counts_append(const char *dir, struct sf__count_key key, uint64_t count);

#endif

struct sf_s3;
struct sf_object_info;

/*
 * Estimates the bytes one sample takes in the shard obj from its head: reads
 * the first 1 MiB (up to 16 MiB while fewer than 8 samples are complete in
 * it), parses it and returns end of the last complete sample / samples.
 * The whole shard when smaller. obj->size must be known. A shard whose head
 * holds no complete sample even at 16 MiB gives its whole size (one sample).
 * Fails on a fetch error or a corrupt head, with a message naming the shard
 * and offset.
 */
sf_status sf__probe_bytes_per_sample(struct sf_s3 *s3, const struct sf_object_info *obj,
                                     double *bytes_per_sample, char *err, size_t err_len);
