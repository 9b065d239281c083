/*
 * The fetch engine: io_threads I/O threads, each with its own libcurl multi
 * handle (keep-alive connection pool), run every HTTP request of a client,
 * each object as ranges (a small first one, then chunk_bytes on chunk
 * multiples; the ranges of one object spread over the threads) with at most
 * `concurrency` requests in flight in total, priority fetches first. Bytes go
 * to their offset in the destination (files: gathered per range, written in
 * 256 KiB pieces). Stall and silent-server timeouts and If-Match
 * consistency live here; when to retry, the back-off, the retry quota and the
 * throttling window and rate are s3/fetch_policy.c's; docs/transport.md
 * explains both.
 *
 * Threads: sf__engine_* functions may be called from any thread except the
 * prepare and invalidate callbacks, which run on an I/O thread (one at a
 * time: under the engine's scheduler lock).
 */
#ifndef SF_S3_FETCH_H
#define SF_S3_FETCH_H

#include "s3/endpoint.h"
#include "common/strbuf.h"
#include "s3/xml.h"
#include "shardfeed_s3.h"

#include <curl/curl.h>
#include <stdint.h>
#include <time.h>

#define SF__NO_RANGE UINT64_MAX

/* io_threads: at most this many; the default is the CPUs this process may
 * run on (sched_getaffinity), at most SF__IO_THREADS_DEFAULT_MAX. */
#define SF__IO_THREADS_MAX         SF_S3_IO_THREADS_MAX
#define SF__IO_THREADS_DEFAULT_MAX 4
/* The request rate a new engine starts at (slow start, s3/fetch_policy.h). */
#define SF__START_RPS 100.0
unsigned sf__io_threads_default(void);

/* What the I/O thread asks the client to turn into a request. */
struct sf__req_spec {
    const char *method; /* "GET", "HEAD" */
    const struct sf__locator *loc;
    const char *query;    /* wire query, NULL = none */
    uint64_t range_first; /* SF__NO_RANGE = no Range header */
    uint64_t range_last;  /* inclusive */
    const char *if_match; /* NULL = none */
    time_t sign_time;     /* now, corrected by the clock skew the server reported */
    /* hex SHA-256 of the request body, signed as x-amz-content-sha256; NULL = empty body */
    const char *payload_hash;
};

/* Builds the URL and the (signed) header list of one attempt; called on the
 * I/O thread right before each attempt, so retries are signed afresh. */
typedef sf_status (*sf__prepare_fn)(void *user, const struct sf__req_spec *spec, char **url,
                                    struct curl_slist **headers, char *err, size_t err_len);
/* Called on the I/O thread when the server says the session token expired. */
typedef void (*sf__invalidate_fn)(void *user);

struct sf__engine_config {
    /* The client's options, resolved: io_threads 1.. (capped at concurrency,
     * which counts requests in flight over all I/O threads), ca_bundle the
     * file in use or NULL (copied), max_object_bytes not 0. The engine reads
     * no other string of them (endpoint, region and credentials are
     * prepare's). */
    struct sf_s3_options opt;
    sf__prepare_fn prepare;
    sf__invalidate_fn invalidate;
    void *user;
    /* The region s3:// requests are signed for, for messages: an answer
     * naming another one as the bucket's says what to change. */
    char region[64];
};

struct sf__engine;

sf_status sf__engine_new(const struct sf__engine_config *c, struct sf__engine **out, char *err,
                         size_t err_len);
/* Cancels everything, joins the I/O thread, frees. NULL is a no-op. */
void sf__engine_destroy(struct sf__engine *e);

/* The answer to a non-object request (HEAD, listing). */
struct sf__response {
    long status;
    struct sf__strbuf body; /* capped at max_body */
    char etag[128];
    uint64_t content_length; /* SF_SIZE_UNKNOWN when absent */
    int64_t last_modified;   /* seconds, 0 when absent */
    char request_id[128];
    struct sf__s3_error s3err; /* parsed error body, code "" when none */
    char errmsg[768];          /* set when the call fails */
};
void sf__response_free(struct sf__response *r);

/* Runs one request to completion with the retry policy, blocking the
 * caller. Returns SF_OK on 2xx, else the mapped status with resp->errmsg. */
sf_status sf__engine_call(struct sf__engine *e, const char *method, const struct sf__locator *loc,
                          const char *query, size_t max_body, struct sf__response *resp);

/* A request body (PUT): `len` bytes from memory, or from fd at `offset` when
 * data is NULL. It is read with pread() and rewound for every attempt, so a
 * retried request resends it whole; it must not change until the call
 * returns. sha256_hex is its hex SHA-256, signed as x-amz-content-sha256. */
struct sf__body {
    const void *data;
    int fd;
    uint64_t offset;
    uint64_t len;
    const char *sha256_hex;
};

/* sf__engine_call() with a request body (NULL = none, as sf__engine_call). */
sf_status sf__engine_call_body(struct sf__engine *e, const char *method,
                               const struct sf__locator *loc, const char *query,
                               const struct sf__body *body, size_t max_body,
                               struct sf__response *resp);

/* Starts an object fetch (loc is copied). See sf_fetch_start(). */
sf_status sf__engine_fetch(struct sf__engine *e, const struct sf__locator *loc,
                           const struct sf_fetch_options *o, struct sf_fetch **out, char *err,
                           size_t err_len);

/* A fetch that is already finished (local files): status and message given. */
sf_status sf__fetch_new_done(const struct sf_fetch_options *o, uint64_t object_size, uint64_t total,
                             sf_status st, const char *msg, void *owned_buffer,
                             struct sf_fetch **out);

void sf__engine_stats(struct sf__engine *e, struct sf_s3_stats *out);

/* Test hook: how many I/O threads ran ranges of f. */
unsigned sf__fetch_io_threads_used(struct sf_fetch *f);
/* Test hook: turns of every I/O thread's loop so far (an idle engine sleeps
 * between events; it does not spin). */
unsigned long long sf__engine_io_loops(struct sf__engine *e);

/* Maps an HTTP status and S3 error code to an sf_status; sets *retry to 0
 * (fatal), 1 (transient) or 2 (throttled). Exposed for tests. */
sf_status sf__classify_http(long status, const char *s3_code, int *retry);

#endif
