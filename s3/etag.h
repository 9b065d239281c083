/* ETags in one form, wherever they come from. */
#ifndef SF_S3_ETAG_H
#define SF_S3_ETAG_H

#include <stddef.h>
#include <string.h>

/*
 * Writes the ETag src[0..n) to dst (cap bytes, cap >= 3) in the one form
 * shardfeed compares, stores and sends as If-Match: the strong, quoted tag,
 * `"abc"`. S3 and MinIO quote ETags in headers and listings alike, but
 * S3-compatible stores differ (Ceph RGW and NetApp ONTAP list them bare,
 * some servers answer bare headers, a proxy may weaken one to `W/"abc"`):
 * compared as sent, the listing's ETag never equalled the GET's and every
 * object read as changed. Surrounding blanks, one `W/` and one pair of
 * quotes are taken off, then the quotes put back. Nothing left (an empty
 * or blank tag) gives "", no ETag. A tag too long for dst is cut, its
 * closing quote kept.
 */
static inline void sf__etag_canon(char *dst, size_t cap, const char *src, size_t n)
{
    while (n > 0 && (*src == ' ' || *src == '\t')) {
        src++;
        n--;
    }
    while (n > 0 &&
           (src[n - 1] == ' ' || src[n - 1] == '\t' || src[n - 1] == '\r' || src[n - 1] == '\n'))
        n--;
    if (n >= 2 && src[0] == 'W' && src[1] == '/') {
        src += 2;
        n -= 2;
    }
    if (n >= 2 && src[0] == '"' && src[n - 1] == '"') {
        src++;
        n -= 2;
    }
    if (n == 0 || cap < 3) {
        if (cap)
            dst[0] = '\0';
        return;
    }
    if (n > cap - 3)
        n = cap - 3;
    memmove(dst + 1, src, n); /* src may lie inside dst */
    dst[0] = '"';
    dst[n + 1] = '"';
    dst[n + 2] = '\0';
}

#endif
