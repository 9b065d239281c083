/*
 * shardfeed — stream training data from S3-compatible object stores to the GPU.
 *
 * Public C API: this header includes every part of it. Each part can also be
 * included alone (each includes shardfeed/common.h and the parts it builds
 * on), as a tree:
 *
 *   shardfeed/common.h      version, status codes, sizes, the log sink
 *   shardfeed_s3.h          S3 client, listings, PUT, the fetch engine
 *   shardfeed_shard.h       streaming shard readers (tar, record)
 *   shardfeed_sampling.h    the sampler: shuffles, ranks, epochs, resume
 *   shardfeed_cache.h       RAM and disk cache tiers, warm-cache
 *   shardfeed_pack.h        writing shards and index.json
 *   shardfeed_loader.h      the loader: batches on the host or the GPU
 *
 * Status codes are append-only and never renumbered; docs/DECISIONS.md
 * ("ABI") says what may change how.
 */
#ifndef SHARDFEED_H
#define SHARDFEED_H

#include "shardfeed/common.h"
#include "shardfeed_s3.h"
#include "shardfeed_shard.h"
#include "shardfeed_sampling.h"
#include "shardfeed_cache.h"
#include "shardfeed_pack.h"
#include "shardfeed_loader.h"

#endif /* SHARDFEED_H */
