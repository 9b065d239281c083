/* Arrays of owned strings: the one way every folder frees them. */
#ifndef SF_COMMON_STRV_H
#define SF_COMMON_STRV_H

#include <stddef.h>
#include <stdlib.h>

/* Frees the n strings of v, then v itself. v may be NULL (then n is not
 * read); entries may be NULL. */
static inline void sf__strv_free(char **v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

#endif
