/* Several strings in one allocation, for a struct whose strings are cut
 * from its input together and freed together (a locator, an endpoint): one
 * malloc, one free, no partial state. Strings already built in their own
 * buffers (a request target, a signature's texts) keep those buffers: a
 * copy into one block would add work to every request. */
#ifndef SF_COMMON_STRPACK_H
#define SF_COMMON_STRPACK_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One string to pack: n bytes of s (s NULL: *to becomes NULL), copied and
 * NUL-terminated at *to. */
struct sf__strpack_item {
    const char *s;
    size_t n;
    char **to;
};

/* strlen that takes NULL (an absent field). */
static inline size_t sf__strpack_len(const char *s)
{
    return s ? strlen(s) : 0;
}

/* Copies the n items into one malloc'd block, *mem (free it alone), and
 * points each item's *to at its copy. Returns -1 when out of memory or when
 * the lengths add up past SIZE_MAX: then *mem and every *to are NULL. */
static inline int sf__strpack(char **mem, const struct sf__strpack_item *it, size_t n)
{
    size_t total = 1;
    int over = 0;
    for (size_t i = 0; i < n; i++) {
        if (!it[i].s)
            continue;
        if (it[i].n >= SIZE_MAX - total)
            over = 1;
        else
            total += it[i].n + 1;
    }
    char *p = *mem = over ? NULL : malloc(total);
    for (size_t i = 0; i < n; i++) {
        *it[i].to = NULL;
        if (!p || !it[i].s)
            continue;
        memcpy(p, it[i].s, it[i].n);
        p[it[i].n] = '\0';
        *it[i].to = p;
        p += it[i].n + 1;
    }
    return *mem ? 0 : -1;
}

#endif
