/* Internal to SigV4 (s3/sigv4.c signs, s3/sigv4_verify.c parses and checks):
 * what both sides share. */
#ifndef SF_S3_SIGV4_INTERNAL_H
#define SF_S3_SIGV4_INTERNAL_H

#include "s3/sigv4.h"

#include "common/calendar.h"

#include <stddef.h>

#define SIGV4_ALGORITHM  "AWS4-HMAC-SHA256"
#define SIGV4_TERMINATOR "aws4_request"

struct sf__sigv4_scope {
    const char *date; /* "YYYYMMDD" */
    const char *region;
    const char *service;
};

/* Signs req with exactly the headers hdrs[0..n) under scope, filling out.
 * out is left zeroed on failure. */
sf_status sf__sigv4_compute(struct sf__sigv4_signer *s, const struct sf__sigv4_scope *scope,
                            const struct sf__sigv4_request *req, const struct sf__header *hdrs,
                            size_t n, const char *amz_date, struct sf__sigv4_result *out);
/* Whether NUL-terminated name equals name2[0..n2) ignoring ASCII case. */
int sf__sigv4_name_eq(const char *name, const char *name2, size_t n2);
/* Whether the signer and the request carry every field signing needs. */
int sf__sigv4_signer_ok(const struct sf__sigv4_signer *s);
int sf__sigv4_request_ok(const struct sf__sigv4_request *req);

#endif
