/* Percent-encoding with the S3 / SigV4 rules. */
#ifndef SF_S3_URI_H
#define SF_S3_URI_H

#include "common/strbuf.h"

#include <stddef.h>

/* Appends src[0..n) percent-encoded: A-Z a-z 0-9 - . _ ~ pass through, '/'
 * passes through when keep_slash, every other byte becomes %XX (upper-case
 * hex), so a space is %20 and '+' is %2B. */
sf_status sf__uri_encode(struct sf__strbuf *out, const char *src, size_t n, int keep_slash);

/* Appends src[0..n) with %XX sequences decoded. When plus_is_space, '+'
 * becomes ' ' (form encoding). A '%' not followed by two hex digits is kept
 * literally. The result may contain NUL bytes: use out->len. */
sf_status sf__uri_decode(struct sf__strbuf *out, const char *src, size_t n, int plus_is_space);

/* 0-15 for a hex digit (either case), -1 otherwise. */
int sf__hex_digit_value(unsigned char c);

#endif
