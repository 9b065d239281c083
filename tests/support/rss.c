#include "support/rss.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

long test_mapped_rss_kib(const void *start, const char *path_prefix)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert(f, "/proc/self/smaps");
    char line[1024];
    int in = 0;
    long sum = 0, kib;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        int path_at = 0;
        /* a mapping's first line: "lo-hi perms offset dev inode [path]" */
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &path_at) == 2 && path_at > 0)
            in = (start && lo == (unsigned long)(uintptr_t)start) ||
                 (path_prefix && strncmp(line + path_at, path_prefix, strlen(path_prefix)) == 0);
        else if (in && sscanf(line, "Rss: %ld kB", &kib) == 1)
            sum += kib;
    }
    fclose(f);
    return sum;
}
