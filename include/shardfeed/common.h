/*
 * shardfeed: what every public header shares: the version, status codes,
 * byte sizes and the log sink. Every sub-header includes it; shardfeed.h
 * includes them all.
 *
 * Thread safety: the functions here take no handle and are safe to call
 * from any thread at any time.
 */
#ifndef SHARDFEED_COMMON_H
#define SHARDFEED_COMMON_H

#include "shardfeed/export.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Library version, also available at run time through sf_version(). */
#define SF_VERSION_MAJOR  0
#define SF_VERSION_MINOR  1
#define SF_VERSION_PATCH  0
#define SF_VERSION_STRING "0.1.0"

/*
 * Result of every call that can fail. 0 means success. Codes are pinned
 * forever: new ones are only ever appended before SF_STATUS_COUNT_.
 */
typedef enum sf_status {
    SF_OK = 0,
    SF_ERR_INVALID_ARGUMENT = 1, /* bad option, flag, URL or parameter */
    SF_ERR_NO_MEMORY = 2,        /* an allocation failed */
    SF_ERR_IO = 3,               /* local file or socket I/O failed */
    SF_ERR_PARSE = 4,            /* malformed input (request, XML, header) */
    SF_ERR_NOT_FOUND = 5,        /* bucket, key or file does not exist */
    SF_ERR_ACCESS_DENIED = 6,    /* credentials missing or refused */
    SF_ERR_SIGNATURE = 7,        /* a SigV4 signature did not match */
    SF_ERR_NETWORK = 8,          /* connection refused, reset, DNS failure */
    SF_ERR_TIMEOUT = 9,          /* a transfer stalled or a deadline passed */
    SF_ERR_HTTP = 10,            /* an unexpected HTTP status */
    SF_ERR_CHANGED = 11,         /* the object changed (ETag, precondition) */
    SF_ERR_RANGE = 12,           /* a byte range could not be satisfied */
    SF_ERR_UNSUPPORTED = 13,     /* a feature this build or server lacks */
    SF_ERR_LIMIT = 14,           /* a configured size or count limit was hit */
    SF_ERR_CORRUPT = 15,         /* data failed a checksum or format check */
    SF_ERR_THROTTLED = 16,       /* the server asked us to slow down */
    SF_ERR_CANCELLED = 17,       /* the operation was cancelled */
    SF_ERR_INTERNAL = 18,        /* a bug: an invariant did not hold */
    /* Not an error: sf_loader_next() has no more batches in this epoch. No
     * other call returns it, and no failure is ever reported with it. */
    SF_END_OF_EPOCH = 19,
    /* Not an error: sf_loader_next_wait() found no batch ready within its
     * timeout. No other call returns it. */
    SF_NOT_READY = 20,
    SF_STATUS_COUNT_             /* not a status; keep last */
} sf_status;

/*
 * Returns a short, static, English description of a status code.
 * Never allocates, never returns NULL; unknown codes give "unknown status".
 */
SF_API const char *sf_status_str(sf_status status);

/*
 * Returns the stable identifier of a status code ("SF_ERR_NOT_FOUND"), for
 * logs and JSON output. Never allocates, never returns NULL.
 */
SF_API const char *sf_status_name(sf_status status);

/* Returns the library version string, e.g. "0.1.0". Static storage. */
SF_API const char *sf_version(void);

/*
 * Returns 1 when this build of the library was compiled with CUDA support,
 * 0 otherwise. It says nothing about whether a GPU is present.
 */
SF_API int sf_cuda_compiled(void);

/*
 * Number of CUDA devices visible to this process: 0 when the library was
 * built without CUDA, when no driver is loaded, or when no GPU is present.
 * Never fails. May initialise the CUDA runtime on first call.
 */
SF_API int sf_cuda_device_count(void);

/* ------------------------------------------------------------------ sizes */

/*
 * Parses a byte size: a decimal integer with an optional unit. "8M", "8MB"
 * and "8MiB" all mean 8 * 2^20 (storage sizes in this field are binary; the
 * decision is in docs/configuration.md); units are B, K, M, G, T with an
 * optional "i" and/or "B", case-insensitive. Whitespace, signs, fractions and
 * overflow are rejected with SF_ERR_INVALID_ARGUMENT. out may not be NULL.
 */
SF_API sf_status sf_parse_bytes(const char *text, unsigned long long *out);

/* ------------------------------------------------------------------ logging */

enum sf_log_level { SF_LOG_ERROR = 0, SF_LOG_WARN = 1, SF_LOG_INFO = 2, SF_LOG_DEBUG = 3 };

/*
 * Log sink. The library never prints; it calls this (from any of its
 * threads, possibly concurrently) with a NUL-terminated line without a
 * trailing newline. Secrets never appear in messages.
 */
typedef void (*sf_log_fn)(void *user, enum sf_log_level level, const char *message);

/* A size or offset that is not known (yet). */
#define SF_SIZE_UNKNOWN (~0ULL)

#ifdef __cplusplus
}
#endif

#endif /* SHARDFEED_COMMON_H */
