/* Secrets (keys, tokens, the files and responses that hold them) are wiped
 * before their memory goes back to the allocator, so a later allocation or a
 * core dump does not show them. explicit_bzero is not optimised away. */
#ifndef SF_COMMON_SECRET_H
#define SF_COMMON_SECRET_H

#include <stdlib.h>
#include <string.h>

static inline void sf__wipe(void *p, size_t n)
{
    if (p && n)
        explicit_bzero(p, n);
}

/* Wipes and frees a NUL-terminated secret; NULL is fine. */
static inline void sf__free_secret(char *s)
{
    if (s) {
        sf__wipe(s, strlen(s));
        free(s);
    }
}

#endif
