/* A directory's entry names, filtered and sorted: what the mock server's
 * bucket list and the tools that walk a folder of cases share. */
#ifndef SF_COMMON_DIRNAMES_H
#define SF_COMMON_DIRNAMES_H

#include "common/grow.h"
#include "common/strv.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static inline int sf__dirnames_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * The names in dir (never "." or "..") for which keep(dir, name, user)
 * returns non-zero (every name when keep is NULL), in strcmp order, into
 * *names (free with sf__strv_free(*names, *n)). Returns 0, or -1 with errno
 * set (the directory cannot be read: *names NULL; out of memory: ENOMEM).
 */
static inline int sf__dirnames(const char *dir, int (*keep)(const char *, const char *, void *),
                               void *user, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    char **v = NULL;
    size_t k = 0, cap = 0;
    int failed = 0;
    struct dirent *de;
    while (!failed && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            (keep && !keep(dir, de->d_name, user)))
            continue;
        char **nv = sf__grow(v, k, &cap, sizeof(*v), 16);
        failed = !nv || !(nv[k] = strdup(de->d_name));
        if (nv)
            v = nv;
        if (!failed)
            k++;
    }
    closedir(d);
    if (failed) {
        sf__strv_free(v, k);
        errno = ENOMEM;
        return -1;
    }
    if (k)
        qsort(v, k, sizeof(*v), sf__dirnames_cmp);
    *names = v;
    *n = k;
    return 0;
}

#endif
