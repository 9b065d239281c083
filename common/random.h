/*
 * splitmix64 (Vigna): a tiny seeded generator for what must be repeatable
 * but not secret (fault draws in the mock server, synthetic test images).
 * The loader's own order uses src/sampler.h, whose arithmetic
 * docs/sampling.md pins bit for bit.
 */
#ifndef SF_COMMON_RANDOM_H
#define SF_COMMON_RANDOM_H

#include <stdint.h>

/* Advances *state and returns the next 64 random bits. */
static inline uint64_t sf__splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1): the top 53 bits of the next draw. */
static inline double sf__uniform01(uint64_t *state)
{
    return (double)(sf__splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
