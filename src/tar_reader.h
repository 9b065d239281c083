/*
 * Streaming tar reader with WebDataset grouping (docs/FORMAT.md, "Tar shards").
 *
 * Parses ustar, GNU (long names 'L'/'K') and pax ('x', 'g') headers from a
 * contiguous prefix of a shard that grows between calls, without copying
 * member data: returned fields point into the shard buffer. The input is
 * untrusted: checksums, magic, numeric fields, caps and bounds are checked,
 * and every failure names the shard and the byte offset.
 *
 * Threads: a reader belongs to one thread at a time.
 */
#ifndef SF_SRC_TAR_READER_H
#define SF_SRC_TAR_READER_H

#include "shardfeed.h"
#include "shardfeed_shard.h"
#include "src/shard_reader.h"

#include <stddef.h>
#include <stdint.h>

#define SF__TAR_BLOCK 512u

/* 0 in any field means its default. */
struct sf__tar_options {
    size_t max_name_bytes;  /* member path, key; default 4096 */
    size_t max_pax_bytes;   /* data of one pax header; default 1 MiB */
    size_t max_fields;      /* fields per sample; default 1024 */
    int require_end_marker; /* 1: no two zero blocks at the end is SF_ERR_CORRUPT */
};

struct sf__tar_reader;

/* name (for messages) is copied; NULL means "shard". o may be NULL. */
sf_status sf__tar_reader_new(const struct sf__tar_options *o, const char *name,
                             struct sf__tar_reader **out);
void sf__tar_reader_destroy(struct sf__tar_reader *t);

/*
 * The next sample from in (the same shard, in growing over calls), or
 * SF_SHARD_NEED_MORE (common->wanted says up to where), or SF_SHARD_END.
 * Field data points into in->base; key and names are the reader's until the
 * next call. Failures are sticky (see sf__tar_reader_common()).
 */
sf_status sf__tar_reader_next(struct sf__tar_reader *t, const struct sf__shard_input *in,
                              struct sf_sample *out, enum sf_shard_event *event);

/* Error, counters and wanted bytes. */
const struct sf__shard_common *sf__tar_reader_common(const struct sf__tar_reader *t);

/* The lowest shard offset a later call may read: the next header, or the
 * data of a GNU long name or pax path still waiting for its member. Member
 * data is never read (fields only point at it). */
uint64_t sf__tar_reader_keep_from(const struct sf__tar_reader *t);

/* Parses a tar numeric field (octal, or base-256 when the first byte has its
 * high bit set) of len bytes. SF_ERR_PARSE for bad digits, negative values
 * and values over 2^63-1. Exposed for tests. */
sf_status sf__tar_parse_number(const unsigned char *field, size_t len, uint64_t *out);

#endif
