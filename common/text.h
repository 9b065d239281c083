/* Small pieces of text parsing that protocol and file readers share. */
#ifndef SF_COMMON_TEXT_H
#define SF_COMMON_TEXT_H

#include <stddef.h>
#include <string.h>

/* Splits s[0..n) at the first sep: "name<sep>value", neither part trimmed.
 * 0 (and the outputs untouched) when s has no sep. */
static inline int sf__split_at(const char *s, size_t n, char sep, size_t *name_len,
                               const char **value, size_t *value_len)
{
    const char *at = memchr(s, sep, n);
    if (!at)
        return 0;
    *name_len = (size_t)(at - s);
    *value = at + 1;
    *value_len = n - *name_len - 1;
    return 1;
}

#endif
