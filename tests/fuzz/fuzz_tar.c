/* Tar shards (src/tar_reader.c through the public reader), fed in random
 * increments. Input: a flags byte (shard_feed.h), an 8-byte seed for the
 * increments, then the archive. */
#include "shard_feed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    unsigned flags = fz_u8(&f);
    uint64_t seed = fz_u64(&f);
    fz_feed_shard(f.p, f.n, (flags & 16) ? SF_SHARD_FORMAT_AUTO : SF_SHARD_FORMAT_TAR, flags, seed);
    return 0;
}
