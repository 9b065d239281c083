/*
 * shardfeed S3 client: options and credentials, HEAD / LIST / PUT, source
 * expansion (prefixes, brace patterns), and the ranged-GET fetch engine with
 * its statistics. docs/configuration.md and docs/transport.md describe them.
 */
#ifndef SHARDFEED_S3_H
#define SHARDFEED_S3_H

#include "shardfeed/common.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ S3 client */

/* How bucket names are put in request URLs. */
enum sf_addressing {
    SF_ADDRESSING_AUTO = 0,    /* virtual-hosted for AWS, path-style for custom endpoints */
    SF_ADDRESSING_PATH = 1,    /* https://endpoint/bucket/key */
    SF_ADDRESSING_VIRTUAL = 2, /* https://bucket.endpoint/key */
};

/* The ranges of sf_s3_options that sf_s3_new() accepts; the CLI flags and
 * the loader's JSON options take the same ones (written only here). */
#define SF_S3_CONCURRENCY_MAX  1024u
#define SF_S3_IO_THREADS_MAX   64u
#define SF_S3_CHUNK_BYTES_MIN  1024ull
#define SF_S3_CHUNK_BYTES_MAX  (5ull << 30)
#define SF_S3_MAX_ATTEMPTS_MAX 100u
#define SF_S3_TIMEOUT_MS_MAX   3600000u /* every *_timeout_ms: at most an hour */

/*
 * Options of an S3 client. Strings are copied by sf_s3_new(); NULL / 0 mean
 * "the default", which for endpoint, region, profile and credentials follows
 * the AWS conventions (environment, ~/.aws/config, ~/.aws/credentials): see
 * docs/configuration.md.
 */
struct sf_s3_options {
    const char *endpoint_url;      /* "http://127.0.0.1:9000"; NULL: AWS_ENDPOINT_URL_S3,
                                      AWS_ENDPOINT_URL, profile endpoint_url, else AWS */
    const char *region;            /* NULL: AWS_REGION, AWS_DEFAULT_REGION, profile, us-east-1 */
    const char *profile;           /* NULL: AWS_PROFILE, else "default" */
    const char *access_key_id;     /* explicit credentials; both or neither */
    const char *secret_access_key; /* never logged */
    const char *session_token;     /* optional, with explicit credentials */
    int no_sign_request;           /* 1: anonymous, no credential lookup at all */
    enum sf_addressing addressing;
    const char *ca_bundle; /* PEM file; NULL: AWS_CA_BUNDLE, profile ca_bundle, system store */
    int insecure;          /* 1: do not verify TLS certificates (never the default) */
    int http2;             /* 1: offer HTTP/2 over TLS; default 0 (HTTP/1.1) */

    unsigned concurrency;                /* requests in flight in total; default 32 */
    unsigned io_threads;                 /* I/O threads sharing concurrency, each with its
                                            own connection pool; 0 (default): the CPUs this
                                            process may use, at most 4; 1: one thread */
    unsigned long long chunk_bytes;      /* range size; default 8 MiB */
    unsigned max_attempts;               /* per request, first try included; default 10 */
    unsigned retry_base_ms;              /* transient errors backoff base; default 50 */
    unsigned throttle_base_ms;           /* SlowDown/429 backoff base; default 500 */
    unsigned retry_cap_ms;               /* backoff cap; default 20000 */
    unsigned retry_quota;                /* retry tokens (docs/transport.md); default 500 */
    unsigned stall_timeout_ms;           /* abort a transfer without progress; default 30000 */
    unsigned connect_timeout_ms;         /* TCP + TLS connect; default 10000 */
    /* An attempt with no response byte this long after it started (connect
     * included) is aborted and retried; 0 = off; default 15000. */
    unsigned first_byte_timeout_ms;
    /* A request (all its attempts and back-offs) that has received no byte
     * from the server for this long fails with SF_ERR_TIMEOUT naming the
     * endpoint; bytes arriving restart it, so a long healthy transfer is never
     * cut; 0 = off; default 45000 (docs/transport.md). */
    unsigned request_timeout_ms;
    unsigned long long max_object_bytes; /* cap on engine-allocated buffers; default 64 GiB */

    sf_log_fn log; /* NULL: silent */
    void *log_user;
    enum sf_log_level log_level; /* default SF_LOG_WARN */
};

/* Fills o with the defaults. o may not be NULL. */
SF_API void sf_s3_options_init_default(struct sf_s3_options *o);

/* An S3 client: configuration, credentials, and the fetch engine's I/O threads. */
struct sf_s3;

/*
 * Creates a client and starts its I/O threads. Resolves endpoint, region and
 * the credential chain (the chain's network providers are queried lazily, on
 * the first signed request). On failure *out is NULL; when err is not NULL it
 * receives a message (truncated to err_len).
 */
SF_API sf_status sf_s3_new(const struct sf_s3_options *o, struct sf_s3 **out, char *err,
                           size_t err_len);

/* Cancels every fetch still running, joins the I/O threads, frees. NULL is a no-op.
 * Every sf_fetch of this client must be destroyed first. */
SF_API void sf_s3_destroy(struct sf_s3 *s3);

/*
 * Copies the detail message of the last call on s3 that failed (from any
 * thread) into buf and returns buf: object, HTTP status, S3 error code and
 * request id when there are some. "" when nothing failed yet.
 */
SF_API const char *sf_s3_errmsg(struct sf_s3 *s3, char *buf, size_t buf_len);

/* Metadata of one object (or, from listings, one common prefix). */
struct sf_object_info {
    char *url;               /* "s3://bucket/key", "https://...", "/path"; owned */
    char *key;               /* key within the bucket (or path); owned */
    unsigned long long size; /* bytes; SF_SIZE_UNKNOWN when not known */
    char etag[128];          /* strong, quoted: "abc" (any form sent), "" if none */
    long long last_modified; /* seconds since the epoch, 0 when unknown */
    int is_prefix;           /* 1 for a common prefix ("directory") in ls output */
};

/* HEAD an object (or stat a local file). Fills *out; free with sf_object_info_clear(). */
SF_API sf_status sf_s3_stat(struct sf_s3 *s3, const char *url, struct sf_object_info *out);
SF_API void sf_object_info_clear(struct sf_object_info *info);

/* A list of objects (result of sf_s3_expand / sf_s3_list). */
struct sf_object_list;
SF_API size_t sf_object_list_count(const struct sf_object_list *l);
/* The i-th entry, NULL when i is out of range. Valid until the list is destroyed. */
SF_API const struct sf_object_info *sf_object_list_get(const struct sf_object_list *l, size_t i);
SF_API void sf_object_list_destroy(struct sf_object_list *l);

/*
 * 1 when url holds a brace pattern (a list "{a,b}" or a range "{0..9}") or a
 * brace syntax error that sf_s3_expand() would name, i.e. when the source
 * names objects by pattern rather than itself; 0 otherwise, also for NULL.
 * "{x}" and "{}" are literal. Never allocates, never fails; any thread.
 */
SF_API int sf_s3_is_pattern(const char *url);

/*
 * Turns a source into the objects it names, in order:
 *  - brace patterns "s3://b/train-{000000..001023}.tar", "{a,b}", several braces
 *    (expanded without network access; sizes unknown, existence not checked:
 *    sf_s3_expand_stat() checks both),
 *  - "s3://b/prefix/" (trailing slash: every object under it, all pages),
 *  - "s3://b/key", "https://host/path" (one object, not checked),
 *  - "file:///dir/x.tar", "dir/x.tar", "dir/" (local files; "dir/" lists the
 *    directory's regular files, recursively, sorted).
 * At most max_objects (0 = 10 million) results, else SF_ERR_LIMIT.
 */
SF_API sf_status sf_s3_expand(struct sf_s3 *s3, const char *source, size_t max_objects,
                              struct sf_object_list **out);

/* Named s3:// keys of one bucket up to this many are checked with one HEAD
 * each by sf_s3_expand_stat(); more are checked by listing. */
#define SF_EXPAND_HEAD_MAX 4

/*
 * sf_s3_expand() that checks what it names: the same sources give the same
 * objects in the same order, and every object is known to exist and has its
 * size, ETag (not for local files) and last_modified filled in.
 *  - s3:// keys named by a brace pattern, per bucket: up to SF_EXPAND_HEAD_MAX
 *    keys get one HEAD each; more are found by ListObjectsV2 under
 *    the longest common prefix of the keys, starting just before the
 *    smallest key and, after each page, resuming just before the next key
 *    not yet seen (or after the page's last key, whichever is later), until
 *    the largest key is passed or the listing ends. The cost is the pages of
 *    the listed range (1000 keys a page: a contiguous pattern of N shards
 *    takes about N/1000 requests, keys far apart about one request each);
 *    it needs s3:ListBucket permission.
 *  - one s3:// or http(s):// key, and http(s):// URLs of a pattern: one HEAD
 *    each, one after the other.
 *  - "s3://b/prefix/" (also as an item of a pattern): the listing, as
 *    sf_s3_expand().
 *  - local paths and file:// (also in patterns): stat(); a directory given
 *    alone is listed as sf_s3_expand() does, a directory in a pattern is an
 *    error (SF_ERR_INVALID_ARGUMENT).
 * An object that does not exist fails the call with SF_ERR_NOT_FOUND, and
 * sf_s3_errmsg() names the first missing URL in pattern order and how many
 * of the pattern's objects are missing (all are checked first). A prefix
 * with nothing under it is SF_ERR_NOT_FOUND too: never an empty success.
 * At most max_objects (0 = 10 million) results, else SF_ERR_LIMIT.
 * s3, source and out may not be NULL (SF_ERR_INVALID_ARGUMENT). On failure
 * *out is NULL and the detail is in sf_s3_errmsg(). Blocks the caller; any
 * thread, several at once on one client. Free the list with
 * sf_object_list_destroy().
 */
SF_API sf_status sf_s3_expand_stat(struct sf_s3 *s3, const char *source, size_t max_objects,
                                   struct sf_object_list **out);

#define SF_LIST_RECURSIVE 1
/*
 * Lists "s3://bucket/prefix" (ListObjectsV2, every page). Without
 * SF_LIST_RECURSIVE, keys are grouped at the next '/' into common prefixes
 * (is_prefix = 1), as `aws s3 ls` does. "s3://" alone lists the buckets.
 */
SF_API sf_status sf_s3_list(struct sf_s3 *s3, const char *url, int flags, size_t max_objects,
                            struct sf_object_list **out);

/* ------------------------------------------------------------------ upload */

/* Largest body sf_s3_put() sends: S3's single-PUT limit, 5 GiB. */
#define SF_PUT_MAX_BYTES (5ull << 30)

/*
 * Uploads one object to url ("s3://bucket/key") with a single PUT (S3
 * PutObject), signed with the body's real SHA-256. The body is either the
 * whole regular file at path (data must be NULL; it is read twice, to hash
 * it and while sending, and memory use does not grow with its size) or len
 * bytes at data (path must be NULL; data may be NULL when len is 0). The
 * file or buffer must not change until the call returns. Transient failures
 * (5xx, throttling, resets, stalls) are retried with the client's policy,
 * each attempt resending the whole body. Bodies over SF_PUT_MAX_BYTES fail
 * with SF_ERR_LIMIT (sf_s3_upload_file() sends larger files in parts). When
 * etag_out is not NULL it receives the ETag the server returned (quoted, ""
 * when none), truncated to etag_len. Blocks the caller; any thread. On
 * failure the detail is in sf_s3_errmsg().
 */
SF_API sf_status sf_s3_put(struct sf_s3 *s3, const char *url, const char *path, const void *data,
                           size_t len, char *etag_out, size_t etag_len);

/* Multipart upload (sf_s3_upload_file()): S3's limits. */
#define SF_UPLOAD_PART_BYTES_DEFAULT (64ull << 20) /* part size unless told */
#define SF_UPLOAD_PART_BYTES_MIN     (5ull << 20)  /* S3: every part but the last */
#define SF_UPLOAD_PART_BYTES_MAX     (5ull << 30)  /* S3: one part */
#define SF_UPLOAD_MAX_PARTS          10000u        /* S3: parts of one object */
#define SF_UPLOAD_MAX_BYTES          (5ull << 40)  /* S3: one object, 5 TiB */

struct sf_s3_upload_options {
    /* A file larger than this goes up in parts of this size (the last one
     * smaller); a smaller file in one PUT. 0 = SF_UPLOAD_PART_BYTES_DEFAULT;
     * else SF_UPLOAD_PART_BYTES_MIN..SF_UPLOAD_PART_BYTES_MAX. When the file
     * would need more than SF_UPLOAD_MAX_PARTS parts, the part size grows
     * (to a multiple of 1 MiB) so it fits. */
    unsigned long long part_bytes;
    /* Parts in flight at once (each read from the file as it is sent; the
     * client's `concurrency` also bounds requests); 0 = 4; at most 64. */
    unsigned parallel_parts;
};

/* Fills o with the defaults. */
SF_API void sf_s3_upload_options_init_default(struct sf_s3_upload_options *o);

/*
 * Uploads the regular file at path to url ("s3://bucket/key"): with one PUT
 * (as sf_s3_put()) when it is at most o->part_bytes, else as an S3
 * multipart upload (CreateMultipartUpload, o->parallel_parts UploadPart
 * requests at a time, CompleteMultipartUpload). Every part is signed with
 * its own SHA-256 and read from the file at its offset for each attempt, so
 * memory does not grow with the file or the part size (a 1 MiB hashing
 * buffer per part in flight). A part that fails transiently is retried with
 * the client's policy; when a part fails for good, or completing fails, the
 * upload is aborted (AbortMultipartUpload) so no parts are left stored, and
 * the message names the object, the part number and its offset. Files over
 * SF_UPLOAD_MAX_BYTES fail with SF_ERR_LIMIT. etag_out (may be NULL)
 * receives the object's ETag as the server returned it ("\"hex-N\"" for a
 * multipart upload on S3). o may be NULL (defaults). The file must not
 * change until the call returns. Blocks the caller; any thread. On failure
 * the detail is in sf_s3_errmsg().
 */
SF_API sf_status sf_s3_upload_file(struct sf_s3 *s3, const char *url, const char *path,
                                   const struct sf_s3_upload_options *o, char *etag_out,
                                   size_t etag_len);

/* ------------------------------------------------------------------ fetch */

/*
 * Where a fetch puts the bytes. Exactly one destination:
 *  - buffer != NULL: caller-owned memory of buffer_bytes; an object (range)
 *    larger than that fails with SF_ERR_LIMIT;
 *  - fd >= 0: written with pwrite() at file_offset + (object offset - offset);
 *    an fd open with O_APPEND is refused (SF_ERR_INVALID_ARGUMENT): it would
 *    put every range at the end, in arrival order;
 *  - neither: the engine allocates one buffer of the object's size (capped by
 *    max_object_bytes) when the size is known; see sf_fetch_data().
 */
struct sf_fetch_options {
    void *buffer;
    unsigned long long buffer_bytes;
    int fd; /* -1 = none */
    unsigned long long file_offset;
    unsigned long long offset; /* first byte of the object to fetch; default 0 */
    unsigned long long length; /* bytes from offset; SF_SIZE_UNKNOWN = to the end */
    unsigned long long size;   /* object size when known (listing), else SF_SIZE_UNKNOWN */
    const char *etag;          /* expected ETag (listing), sent as If-Match; NULL = learn it */
    /* Bytes of the first range, kept small so a reader parses the start of the
     * object at once; 0 = SF_FETCH_FIRST_RANGE_DEFAULT; never more than the
     * client's chunk_bytes. The next range ends at the first multiple of
     * chunk_bytes (object offsets), the others are chunk_bytes long. */
    unsigned long long first_range_bytes;
    /* 1: this fetch is the one being read now: its ranges are started before
     * those of fetches without priority (see sf_fetch_set_priority()). */
    int priority;
    /*
     * Optional observer, called on an I/O thread (one call at a time per fetch,
     * from whichever thread received the bytes) each time bytes have been
     * written to the destination: offset is the object offset of data[0].
     * The bytes of one range come in order and no byte comes twice (a retried
     * range goes on where its written bytes stop); ranges interleave. It must
     * be quick, must not block and must not call sf_fetch_* on this fetch.
     * It is never called after sf_fetch_wait() reported done, nor once
     * sf_fetch_destroy() has returned. Local files are read without it.
     */
    void (*on_data)(void *user, unsigned long long offset, const void *data, size_t len);
    void *on_data_user;
};
/* Default first range: 256 KiB (about two ImageNet-sized samples of a tar shard). */
#define SF_FETCH_FIRST_RANGE_DEFAULT (256ull * 1024)
SF_API void sf_fetch_options_init_default(struct sf_fetch_options *o);

/* One object being fetched as parallel ranged GETs. */
struct sf_fetch;

/* Progress snapshot. */
struct sf_fetch_progress {
    unsigned long long total;       /* bytes this fetch will deliver; SF_SIZE_UNKNOWN until known */
    unsigned long long object_size; /* size of the whole object; SF_SIZE_UNKNOWN until known */
    unsigned long long contiguous;  /* bytes [0, contiguous) of the destination are final */
    unsigned long long received;    /* bytes written so far, in any order */
    unsigned requests;              /* HTTP requests sent, retries included */
    unsigned retries;
    int done;         /* 1 when finished, successfully or not */
    sf_status status; /* SF_OK while running or when done without error */
};

/*
 * Starts fetching url (s3://, http(s)://; local paths are read synchronously
 * into the destination). Returns at once; the I/O threads do the work. The
 * destination must stay valid until sf_fetch_destroy().
 */
SF_API sf_status sf_fetch_start(struct sf_s3 *s3, const char *url, const struct sf_fetch_options *o,
                                struct sf_fetch **out);

/*
 * Blocks until at least min_contiguous bytes are final, or the fetch is done
 * (then it returns its status), or timeout_ms passes (SF_ERR_TIMEOUT; -1 =
 * wait forever). Fills *p when not NULL. Any thread.
 */
SF_API sf_status sf_fetch_wait(struct sf_fetch *f, unsigned long long min_contiguous,
                               int timeout_ms, struct sf_fetch_progress *p);
SF_API void sf_fetch_progress(struct sf_fetch *f, struct sf_fetch_progress *p);

/*
 * Says whether f is the fetch being read now (priority 1) or a prefetch (0).
 * The engine starts the ranges (and retries) of fetches with priority before
 * those of the others, oldest fetch first within each group; requests
 * already running are not interrupted. A loader sets it on the shard it
 * parses and clears it when it moves on. Any thread; no effect on a finished
 * fetch. f may not be NULL.
 */
SF_API void sf_fetch_set_priority(struct sf_fetch *f, int priority);

/* The engine-allocated buffer (NULL with a caller destination or before the
 * size is known) and the ETag the object was read at ("" until known; read it
 * once sf_fetch_wait() has reported a known total, it is set before that). */
SF_API void *sf_fetch_data(struct sf_fetch *f);
SF_API const char *sf_fetch_etag(struct sf_fetch *f);

/* Detail of a failed fetch (object, offset, HTTP status, S3 code, request id);
 * "" otherwise. Valid until sf_fetch_destroy(). */
SF_API const char *sf_fetch_errmsg(struct sf_fetch *f);

/* Cancels the fetch if it is still running, waits until the I/O threads no
 * longer touch the destination, frees it. NULL is a no-op. */
SF_API void sf_fetch_destroy(struct sf_fetch *f);

/* Counters of a client since sf_s3_new(). */
struct sf_s3_stats {
    unsigned long long requests;       /* HTTP requests sent */
    unsigned long long retries;        /* requests that were retries */
    unsigned long long throttled;      /* 503 SlowDown / 429 answers */
    unsigned long long bytes_received; /* body bytes written to destinations */
    unsigned long long objects_done;
    unsigned long long objects_failed;
    unsigned concurrency_limit; /* the current in-flight cap (lowered on throttling) */
    unsigned retry_tokens;      /* what is left of the retry quota */
    unsigned connections;       /* connections opened (keep-alive reuse shows here) */
    /* times throttling was judged a rate limit and the request rate cut; a
     * steady few percent of SlowDown that does not fall with the rate is
     * only retried (docs/transport.md) */
    unsigned long long rate_cuts;
};
SF_API void sf_s3_get_stats(struct sf_s3 *s3, struct sf_s3_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* SHARDFEED_S3_H */
