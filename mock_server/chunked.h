/* A streaming decoder of aws-chunked request bodies (Content-Encoding:
 * aws-chunked), the three forms S3 takes:
 *   STREAMING-UNSIGNED-PAYLOAD-TRAILER          "size\r\n data \r\n" ... "0\r\n" trailers "\r\n"
 *   STREAMING-AWS4-HMAC-SHA256-PAYLOAD          "size;chunk-signature=S\r\n data \r\n" ... "0;chunk-signature=S\r\n\r\n"
 *   STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER  the signed chunks, then trailers and
 *                                               "x-amz-trailer-signature:S\r\n\r\n"
 * Bytes go in as they arrive, in pieces of any size; decoded data goes out
 * through a callback, so memory is bounded (one framing line, the trailers)
 * whatever the body's size. Chunk and trailer signatures are checked as they
 * complete, chained from the request's seed signature (sf__sigv4_sign_chunk). */
#ifndef SF_MOCK_CHUNKED_H
#define SF_MOCK_CHUNKED_H

#include "s3/sigv4.h"

#include <stddef.h>
#include <stdint.h>

#define MOCK_CHUNKED_MAX_TRAILERS 8

enum mock_chunked_mode {
    MOCK_CHUNKED_UNSIGNED_TRAILER,
    MOCK_CHUNKED_SIGNED,
    MOCK_CHUNKED_SIGNED_TRAILER,
};

/* Receives decoded bytes; returns 0, or -1 to stop (the decoder then fails
 * with status 500, code InternalError, unless the sink set its own). */
typedef int (*mock_chunked_sink)(void *cls, const char *data, size_t n);

struct mock_chunked_config {
    enum mock_chunked_mode mode;
    mock_chunked_sink sink;
    void *sink_cls;
    /* signed modes only: the verifier, the request's x-amz-date, its
     * credential scope and its (seed) signature; borrowed */
    struct sf__sigv4_signer *signer;
    const char *amz_date;
    const char *scope_date;
    const char *region;
    const char *service;
    const char *seed_signature;
};

struct mock_trailer {
    char *name; /* lower case */
    char *value;
};

struct mock_chunked;

/* Parses an x-amz-content-sha256 value: 0 and *mode for the three streaming
 * forms above, -1 for anything else. */
int mock_chunked_mode_of(const char *payload_hash, enum mock_chunked_mode *mode);

struct mock_chunked *mock_chunked_new(const struct mock_chunked_config *cfg);
void mock_chunked_destroy(struct mock_chunked *c); /* NULL is a no-op */

/* Feeds body bytes. 0 on success; -1 once the body is refused (later calls
 * return -1 and do nothing; mock_chunked_error says why). */
int mock_chunked_feed(struct mock_chunked *c, const char *data, size_t n);
/* The body ended: 0 if it was complete (final chunk, trailers and their
 * signature), -1 otherwise. */
int mock_chunked_finish(struct mock_chunked *c);

/* After a failure: the HTTP status, S3 error code and message. */
void mock_chunked_error(const struct mock_chunked *c, int *status, const char **code,
                        const char **message);
/* Lets a sink name its own failure (status, code, message) before it returns -1. */
void mock_chunked_fail(struct mock_chunked *c, int status, const char *code, const char *message);

uint64_t mock_chunked_decoded_bytes(const struct mock_chunked *c);
/* The trailers received (the trailer signature excluded), valid until destroy. */
const struct mock_trailer *mock_chunked_trailers(const struct mock_chunked *c, size_t *n);

#endif
