/* The monotonic clock: every timing, rate and deadline in the library reads
 * it (never the wall clock, which can step). */
#ifndef SF_COMMON_CLOCK_H
#define SF_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Seconds since an arbitrary fixed point. */
static inline double sf__now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Nanoseconds since the same point. */
static inline uint64_t sf__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
