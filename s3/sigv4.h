/*
 * AWS Signature Version 4 for S3: signing (client) and verification (mock
 * server), header form ("Authorization"), with S3 rules: the path is never
 * normalized and is encoded once.
 *
 * Inputs are the request as it travels on the wire: the path and query
 * string exactly as sent (percent-encoded or not); the signer canonicalizes
 * them by decoding and re-encoding with sf__uri_encode(), so equivalent
 * encodings sign alike.
 */
#ifndef SF_S3_SIGV4_H
#define SF_S3_SIGV4_H

#include "shardfeed/common.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define SF__SHA256_HEX_LEN   64
#define SF__EMPTY_SHA256     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define SF__UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"
#define SF__AMZ_DATE_LEN     16 /* "20150830T123600Z" */

struct sf__header {
    const char *name;
    const char *value;
};

struct sf__sigv4_request {
    const char *method;               /* "GET" */
    const char *path;                 /* wire path without the query, e.g. "/bucket/my%20key" */
    const char *query;                /* wire query without '?', or NULL */
    const struct sf__header *headers; /* headers to sign; must hold host and x-amz-date */
    size_t n_headers;
    const char *payload_hash; /* lower-case hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" */
};

/* Credentials and scope. Strings are borrowed for the signer's lifetime. */
struct sf__sigv4_signer {
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token; /* NULL when none */
    const char *region;        /* "us-east-1" */
    const char *service;       /* "s3" */
    /* Derived key for one day, reused for every request of that day. */
    pthread_mutex_t lock;
    char key_date[9]; /* "YYYYMMDD" the cached key is for, "" if none */
    unsigned char key[32];
};

/* Everything a signature is made of, kept for tests and for error bodies. */
struct sf__sigv4_result {
    char *canonical_request; /* malloc'd */
    char *string_to_sign;    /* malloc'd */
    char *authorization;     /* malloc'd, the whole Authorization header value */
    char *signed_headers;    /* malloc'd, "host;x-amz-date" */
    char signature[SF__SHA256_HEX_LEN + 1];
};

void sf__sigv4_signer_init(struct sf__sigv4_signer *s, const char *access_key_id,
                           const char *secret_access_key, const char *session_token,
                           const char *region, const char *service);
void sf__sigv4_signer_destroy(struct sf__sigv4_signer *s);
void sf__sigv4_result_free(struct sf__sigv4_result *r);

/* Formats t as "YYYYMMDDTHHMMSSZ" (UTC, gmtime_r). */
void sf__sigv4_format_date(time_t t, char out[SF__AMZ_DATE_LEN + 1]);
/* Parses "YYYYMMDDTHHMMSSZ"; SF_ERR_PARSE when malformed. */
sf_status sf__sigv4_parse_date(const char *s, time_t *out);

/* Lower-case hex SHA-256 of data. */
void sf__sha256_hex(const void *data, size_t n, char out[SF__SHA256_HEX_LEN + 1]);
void sf__hex_encode(const unsigned char *in, size_t n, char *out /* 2n+1 */);

/*
 * Signs req at amz_date (which must equal the request's x-amz-date header).
 * The caller has already put host, x-amz-date, x-amz-content-sha256 and, with
 * temporary credentials, x-amz-security-token among req->headers: every
 * header in req->headers is signed. Fills *out (free with
 * sf__sigv4_result_free). Thread-safe for one signer.
 */
sf_status sf__sigv4_sign(struct sf__sigv4_signer *s, const struct sf__sigv4_request *req,
                         const char *amz_date, struct sf__sigv4_result *out);

/*
 * Builds the headers a client sends for req at time now: fills x-amz-date
 * (amz_date_out), x-amz-content-sha256 (req->payload_hash) and, with a session
 * token, x-amz-security-token into extra[0..*n_extra), signs req->headers plus
 * those, and stores the Authorization value in out. extra must have room for 3.
 * The strings in extra point into amz_date_out, req and s.
 */
sf_status sf__sigv4_sign_request(struct sf__sigv4_signer *s, const struct sf__sigv4_request *req,
                                 time_t now, char amz_date_out[SF__AMZ_DATE_LEN + 1],
                                 struct sf__header extra[3], size_t *n_extra,
                                 struct sf__sigv4_result *out);

/* A parsed Authorization header. */
struct sf__sigv4_auth {
    char access_key_id[128];
    char date[9];
    char region[64];
    char service[32];
    char signed_headers[1024]; /* "host;range;x-amz-date" */
    char signature[SF__SHA256_HEX_LEN + 1];
};

/* Parses "AWS4-HMAC-SHA256 Credential=AK/DATE/REGION/SERVICE/aws4_request,
 * SignedHeaders=a;b, Signature=hex". SF_ERR_PARSE when malformed. */
sf_status sf__sigv4_parse_authorization(const char *value, struct sf__sigv4_auth *out);

/*
 * Verifies a request against a parsed Authorization header with the
 * signer's secret. req->headers holds all request headers; only those named
 * in auth->signed_headers are used (all values of a repeated header, in
 * order). Returns SF_OK when the signature matches, SF_ERR_SIGNATURE when it
 * does not (out is filled either way, for the error body), SF_ERR_PARSE when
 * a signed header is absent or "host" is not signed.
 */
sf_status sf__sigv4_verify(struct sf__sigv4_signer *s, const struct sf__sigv4_auth *auth,
                           const struct sf__sigv4_request *req, const char *amz_date,
                           struct sf__sigv4_result *out);

/*
 * The signature of one piece of an aws-chunked body signed in streaming mode
 * (x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]). Each
 * chunk's signature chains on the previous one, the first on the request's
 * own (seed) signature:
 *   chunk:   "AWS4-HMAC-SHA256-PAYLOAD\n" amz_date "\n" scope "\n" prev "\n"
 *            hex(sha256("")) "\n" sha256_hex
 *   trailer: "AWS4-HMAC-SHA256-TRAILER\n" amz_date "\n" scope "\n" prev "\n"
 *            sha256_hex
 * where scope is "scope_date/region/service/aws4_request", sha256_hex the
 * lower-case hex SHA-256 of the chunk's data, or of the trailer headers as
 * "name:value\n" lines. Writes the lower-case hex signature to out.
 * SF_ERR_INVALID_ARGUMENT when an argument is NULL or prev/sha256_hex are not
 * 64 characters. Thread-safe for one signer.
 */
sf_status sf__sigv4_sign_chunk(struct sf__sigv4_signer *s, const char *amz_date,
                               const char *scope_date, const char *region, const char *service,
                               const char *prev_signature, int trailer, const char *sha256_hex,
                               char out[SF__SHA256_HEX_LEN + 1]);

#endif
