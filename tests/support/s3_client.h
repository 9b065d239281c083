/* Test support: one signed (or unsigned) S3 request with libcurl. */
#ifndef SF_TEST_S3_CLIENT_H
#define SF_TEST_S3_CLIENT_H

#include "common/strbuf.h"

#include <stddef.h>
#include <time.h>

struct s3_creds {
    const char *access_key;
    const char *secret_key;
    const char *session_token; /* NULL = none */
    const char *region;        /* NULL = us-east-1 */
};

struct s3_call {
    const char *method;         /* "GET" */
    const char *target;         /* wire path and query: "/b/my%20key?x=1" */
    const char *const *headers; /* "Name: value" lines, NULL-terminated, may be NULL */
    const void *body;
    size_t body_len;
    const struct s3_creds *creds; /* NULL = unsigned */
    time_t when;                  /* signing time; 0 = now */
    int unsigned_payload;         /* send UNSIGNED-PAYLOAD instead of the body hash */
    const char *payload_hash;     /* override x-amz-content-sha256 (tests of bad hashes) */
    long low_speed_time_s;        /* abort when under 1 byte/s for this long; 0 = never */
    const char *ca_file;          /* CA bundle for https; NULL = curl's default store */
};

struct s3_resp {
    long status;   /* 0 when no HTTP answer arrived */
    int curl_code; /* CURLcode of the transfer */
    struct sf__strbuf body;
    struct sf__strbuf headers; /* raw header block(s) */
};

/* Performs the call against base ("http://127.0.0.1:PORT", or https:// with
 * ca_file). Returns 0 when an HTTP status was received (whatever it is), -1
 * otherwise. Free resp. */
int s3_call(const char *base, const struct s3_call *c, struct s3_resp *resp);
void s3_resp_free(struct s3_resp *r);
/* Value of a response header (case-insensitive) into out; 0 if found. */
int s3_resp_header(const struct s3_resp *r, const char *name, char *out, size_t out_len);
/* Text of the first <tag>...</tag> of the body into out; 0 if found. */
int s3_xml_value(const struct s3_resp *r, const char *tag, char *out, size_t out_len);

/* One unsigned request to the mock's admin endpoints ("/_mock/stats",
 * "/_mock/faults") with body (may be NULL). Returns the HTTP status, or -1
 * when no answer came; the response body into *out (malloc'd) when out is
 * not NULL and an answer came. */
long mock_admin(const char *base, const char *method, const char *path_query, const char *body,
                char **out);

#endif
