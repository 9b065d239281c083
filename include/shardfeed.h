/*
 * shardfeed — stream training data from S3-compatible object stores to the GPU.
 *
 * Public C API. Every declaration here is part of the stable surface: status
 * codes are append-only and never renumbered.
 *
 * Thread safety: functions in this header that take no handle are safe to call
 * from any thread at any time.
 */
#ifndef SHARDFEED_H
#define SHARDFEED_H

#include "shardfeed/export.h"

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

#ifdef __cplusplus
}
#endif

#endif /* SHARDFEED_H */
