/* How many CPUs this process may run on: the affinity mask when it can be
 * read (a container or taskset limits it), else the online CPUs, at least 1.
 * Sizes the default thread pools (decode workers, I/O threads) and the
 * doctor's and autotune's searches. Needs _GNU_SOURCE (the build sets it). */
#ifndef SF_COMMON_CPU_H
#define SF_COMMON_CPU_H

#include <sched.h>
#include <unistd.h>

static inline unsigned sf__cores_available(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return (unsigned)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

#endif
