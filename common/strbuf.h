/* Growable, NUL-terminated byte buffer with a hard size cap. */
#ifndef SF_COMMON_STRBUF_H
#define SF_COMMON_STRBUF_H

#include "shardfeed/common.h"

#include <stdarg.h>
#include <stddef.h>

struct sf__strbuf {
    char *data;       /* NUL-terminated; NULL until the first append */
    size_t len;       /* bytes used, excluding the NUL */
    size_t cap;       /* bytes allocated */
    size_t max_bytes; /* appends that would exceed this fail with SF_ERR_LIMIT; 0 = 64 MiB */
    sf_status err;    /* first failure, sticky: later appends are no-ops */
};

void sf__strbuf_init(struct sf__strbuf *b, size_t max_bytes);
void sf__strbuf_free(struct sf__strbuf *b);
void sf__strbuf_reset(struct sf__strbuf *b);
sf_status sf__strbuf_append(struct sf__strbuf *b, const void *data, size_t n);
sf_status sf__strbuf_puts(struct sf__strbuf *b, const char *s);
sf_status sf__strbuf_putc(struct sf__strbuf *b, char c);
sf_status sf__strbuf_printf(struct sf__strbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
sf_status sf__strbuf_vprintf(struct sf__strbuf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* Returns the buffer's string ("" when empty) and leaves b empty; the caller
 * frees it. NULL on a sticky error or allocation failure. */
char *sf__strbuf_take(struct sf__strbuf *b);
/* The current contents, never NULL ("" when empty). Valid until the next append. */
const char *sf__strbuf_str(const struct sf__strbuf *b);

/* Formats a message into the fixed buffer err (when err and err_len are set)
 * and returns st, so error paths read `return sf__fail(err, n, SF_ERR_X, ...)`. */
sf_status sf__fail(char *err, size_t err_len, sf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Empties the caller's message buffer (when there is one), so it reads ""
 * after a call that succeeds. */
static inline void sf__clear_err(char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
}

#endif
