/* Growing an array by doubling: the one step every list in the library
 * takes before it appends an item. */
#ifndef SF_COMMON_GROW_H
#define SF_COMMON_GROW_H

#include <stdint.h>
#include <stdlib.h>

/*
 * Room for one more item in items, an array of n items of item_bytes each
 * with room for *cap: items itself while n < *cap, else the array
 * reallocated to twice *cap (first_cap the first time) with *cap raised.
 * NULL when memory or size_t runs out; items and *cap are then unchanged
 * and still the caller's.
 */
static inline void *sf__grow(void *items, size_t n, size_t *cap, size_t item_bytes,
                             size_t first_cap)
{
    if (n < *cap)
        return items;
    size_t c = *cap ? *cap * 2 : first_cap;
    if (c <= *cap || c > SIZE_MAX / item_bytes)
        return NULL;
    void *p = realloc(items, c * item_bytes);
    if (p)
        *cap = c;
    return p;
}

#endif
