/* Seals a hand-made loader state (SF_LOADER_STATE_BYTES): recomputes the
 * sampler state's checksum (docs/sampling.md, "sf/state" over its first 15
 * words) and the loader's (src/loader_api.c), so a test or a fuzz harness
 * reaches the checks behind them. The checksums catch damage, not intent:
 * a hostile state is sealed like this. */
#ifndef SF_TESTS_SUPPORT_STATE_SEAL_H
#define SF_TESTS_SUPPORT_STATE_SEAL_H

#include "common/endian.h"
#include "shardfeed.h"
#include "src/crop.h"
#include "src/sampler.h"

#include <stddef.h>
#include <stdint.h>

/* Offsets in a loader state: its header, then the sampler state. */
#define SEAL_LOADER_POSITION  16
#define SEAL_LOADER_EPOCH     24
#define SEAL_SAMPLER          32
#define SEAL_SAMPLER_EPOCH    (SEAL_SAMPLER + 24)
#define SEAL_SAMPLER_POSITION (SEAL_SAMPLER + 32)
#define SEAL_SAMPLER_LENGTH   (SEAL_SAMPLER + 112)

static inline void seal_sampler_state(unsigned char *b)
{
    uint64_t h = SF__TAG_STATE;
    for (size_t off = 0; off < SF_SAMPLER_STATE_BYTES - 8; off += 8)
        h = sf__absorb64(h, sf__get_le64(b + off));
    sf__put_le64(b + SF_SAMPLER_STATE_BYTES - 8, h);
}

static inline void seal_loader_state(unsigned char *p)
{
    seal_sampler_state(p + SEAL_SAMPLER);
    uint64_t h = 0x6c6f616465727631ULL; /* "loaderv1" */
    for (size_t i = 0; i < SF_LOADER_STATE_BYTES - 8; i += 8)
        h = sf__sample_rng_seed(h, sf__get_le64(p + i), 0x5354415445ULL, i);
    sf__put_le64(p + SF_LOADER_STATE_BYTES - 8, h);
}

#endif
