#include "common/strbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRBUF_DEFAULT_MAX_BYTES ((size_t)64 * 1024 * 1024)
#define STRBUF_MIN_CAP           ((size_t)64)

/* A zero-initialised struct (never passed through init) still gets the
 * documented default, so the cap can never be "unlimited" by accident. */
static size_t strbuf_limit(const struct sf__strbuf *b)
{
    return b->max_bytes ? b->max_bytes : STRBUF_DEFAULT_MAX_BYTES;
}

static sf_status strbuf_fail(struct sf__strbuf *b, sf_status st)
{
    if (b->err == SF_OK)
        b->err = st;
    return b->err;
}

/* Makes room for `extra` more bytes plus the NUL. Contents are unchanged on
 * failure. */
static sf_status strbuf_reserve(struct sf__strbuf *b, size_t extra)
{
    size_t limit = strbuf_limit(b);

    /* The last test keeps room for the NUL even when max_bytes is SIZE_MAX. */
    if (extra > limit || b->len > limit - extra || b->len + extra == SIZE_MAX)
        return strbuf_fail(b, SF_ERR_LIMIT);
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return SF_OK;

    size_t new_cap = b->cap ? b->cap : STRBUF_MIN_CAP;
    while (new_cap < need) {
        if (new_cap > SIZE_MAX / 2) {
            new_cap = need;
            break;
        }
        new_cap *= 2;
    }
    /* Never allocate past what the cap can ever use. */
    if (limit < SIZE_MAX && new_cap > limit + 1)
        new_cap = limit + 1;
    if (new_cap < need)
        new_cap = need;

    char *p = realloc(b->data, new_cap);
    if (!p)
        return strbuf_fail(b, SF_ERR_NO_MEMORY);
    b->data = p;
    b->cap = new_cap;
    return SF_OK;
}

void sf__strbuf_init(struct sf__strbuf *b, size_t max_bytes)
{
    if (!b)
        return;
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max_bytes = max_bytes ? max_bytes : STRBUF_DEFAULT_MAX_BYTES;
    b->err = SF_OK;
}

void sf__strbuf_free(struct sf__strbuf *b)
{
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->err = SF_OK;
}

/* Empties the buffer and clears the sticky error, keeping the allocation for
 * reuse. */
void sf__strbuf_reset(struct sf__strbuf *b)
{
    if (!b)
        return;
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
    b->err = SF_OK;
}

sf_status sf__strbuf_append(struct sf__strbuf *b, const void *data, size_t n)
{
    if (!b)
        return SF_ERR_INVALID_ARGUMENT;
    if (b->err != SF_OK)
        return b->err;
    if (n == 0)
        return SF_OK;
    if (!data)
        return strbuf_fail(b, SF_ERR_INVALID_ARGUMENT);
    sf_status st = strbuf_reserve(b, n);
    if (st != SF_OK)
        return st;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return SF_OK;
}

sf_status sf__strbuf_puts(struct sf__strbuf *b, const char *s)
{
    if (!b)
        return SF_ERR_INVALID_ARGUMENT;
    if (!s)
        return b->err != SF_OK ? b->err : strbuf_fail(b, SF_ERR_INVALID_ARGUMENT);
    return sf__strbuf_append(b, s, strlen(s));
}

sf_status sf__strbuf_putc(struct sf__strbuf *b, char c)
{
    return sf__strbuf_append(b, &c, 1);
}

sf_status sf__strbuf_vprintf(struct sf__strbuf *b, const char *fmt, va_list ap)
{
    if (!b)
        return SF_ERR_INVALID_ARGUMENT;
    if (b->err != SF_OK)
        return b->err;
    if (!fmt)
        return strbuf_fail(b, SF_ERR_INVALID_ARGUMENT);

    /* First try into the space already there, then grow to the exact size. */
    size_t avail = b->cap > b->len ? b->cap - b->len : 0;
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(avail ? b->data + b->len : NULL, avail, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        if (b->data)
            b->data[b->len] = '\0';
        return strbuf_fail(b, SF_ERR_INVALID_ARGUMENT);
    }
    if ((size_t)n < avail) {
        size_t limit = strbuf_limit(b);
        if ((size_t)n > limit || b->len > limit - (size_t)n) {
            b->data[b->len] = '\0';
            return strbuf_fail(b, SF_ERR_LIMIT);
        }
        b->len += (size_t)n;
        return SF_OK;
    }
    if (b->data)
        b->data[b->len] = '\0'; /* undo the truncated attempt */

    sf_status st = strbuf_reserve(b, (size_t)n);
    if (st != SF_OK)
        return st;
    va_copy(ap2, ap);
    int n2 = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap2);
    va_end(ap2);
    if (n2 != n) {
        b->data[b->len] = '\0';
        return strbuf_fail(b, SF_ERR_INTERNAL);
    }
    b->len += (size_t)n;
    return SF_OK;
}

sf_status sf__strbuf_printf(struct sf__strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sf_status st = sf__strbuf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
}

char *sf__strbuf_take(struct sf__strbuf *b)
{
    if (!b || b->err != SF_OK)
        return NULL;
    char *s = b->data;
    if (!s) {
        s = malloc(1);
        if (!s) {
            strbuf_fail(b, SF_ERR_NO_MEMORY);
            return NULL;
        }
        s[0] = '\0';
    }
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    return s;
}

const char *sf__strbuf_str(const struct sf__strbuf *b)
{
    if (!b || !b->data)
        return "";
    return b->data;
}

sf_status sf__fail(char *err, size_t err_len, sf_status st, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}
