#include "s3/uri.h"

static const char uri_hex_upper[] = "0123456789ABCDEF";

static int uri_is_unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

int sf__hex_digit_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Output goes through a small stack chunk so long inputs cost one append per
 * chunk rather than one per byte. */
#define URI_CHUNK 256

sf_status sf__uri_encode(struct sf__strbuf *out, const char *src, size_t n, int keep_slash)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    if (n && !src)
        return SF_ERR_INVALID_ARGUMENT;

    char chunk[URI_CHUNK];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        if (used > sizeof chunk - 3) {
            sf_status st = sf__strbuf_append(out, chunk, used);
            if (st != SF_OK)
                return st;
            used = 0;
        }
        if (uri_is_unreserved(c) || (c == '/' && keep_slash)) {
            chunk[used++] = (char)c;
        } else {
            chunk[used++] = '%';
            chunk[used++] = uri_hex_upper[c >> 4];
            chunk[used++] = uri_hex_upper[c & 0x0f];
        }
    }
    if (used)
        return sf__strbuf_append(out, chunk, used);
    return out->err;
}

sf_status sf__uri_decode(struct sf__strbuf *out, const char *src, size_t n, int plus_is_space)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    if (n && !src)
        return SF_ERR_INVALID_ARGUMENT;

    char chunk[URI_CHUNK];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        if (used == sizeof chunk) {
            sf_status st = sf__strbuf_append(out, chunk, used);
            if (st != SF_OK)
                return st;
            used = 0;
        }
        if (c == '%' && n - i >= 3) {
            int hi = sf__hex_digit_value((unsigned char)src[i + 1]);
            int lo = sf__hex_digit_value((unsigned char)src[i + 2]);
            if (hi >= 0 && lo >= 0) {
                chunk[used++] = (char)((hi << 4) | lo);
                i += 2;
                continue;
            }
        }
        if (c == '+' && plus_is_space)
            c = ' ';
        chunk[used++] = (char)c;
    }
    if (used)
        return sf__strbuf_append(out, chunk, used);
    return out->err;
}
