#include "shardfeed/common.h"

#include <stddef.h>

struct status_text {
    const char *name;
    const char *text;
};

/* Indexed by sf_status; the static assert below keeps it complete. */
static const struct status_text status_texts[] = {
    [SF_OK] = {"SF_OK", "success"},
    [SF_ERR_INVALID_ARGUMENT] = {"SF_ERR_INVALID_ARGUMENT", "invalid argument"},
    [SF_ERR_NO_MEMORY] = {"SF_ERR_NO_MEMORY", "out of memory"},
    [SF_ERR_IO] = {"SF_ERR_IO", "I/O error"},
    [SF_ERR_PARSE] = {"SF_ERR_PARSE", "malformed input"},
    [SF_ERR_NOT_FOUND] = {"SF_ERR_NOT_FOUND", "not found"},
    [SF_ERR_ACCESS_DENIED] = {"SF_ERR_ACCESS_DENIED", "access denied"},
    [SF_ERR_SIGNATURE] = {"SF_ERR_SIGNATURE", "signature does not match"},
    [SF_ERR_NETWORK] = {"SF_ERR_NETWORK", "network error"},
    [SF_ERR_TIMEOUT] = {"SF_ERR_TIMEOUT", "timed out"},
    [SF_ERR_HTTP] = {"SF_ERR_HTTP", "unexpected HTTP status"},
    [SF_ERR_CHANGED] = {"SF_ERR_CHANGED", "object changed"},
    [SF_ERR_RANGE] = {"SF_ERR_RANGE", "range not satisfiable"},
    [SF_ERR_UNSUPPORTED] = {"SF_ERR_UNSUPPORTED", "not supported"},
    [SF_ERR_LIMIT] = {"SF_ERR_LIMIT", "limit exceeded"},
    [SF_ERR_CORRUPT] = {"SF_ERR_CORRUPT", "corrupt data"},
    [SF_ERR_THROTTLED] = {"SF_ERR_THROTTLED", "throttled by server"},
    [SF_ERR_CANCELLED] = {"SF_ERR_CANCELLED", "cancelled"},
    [SF_ERR_INTERNAL] = {"SF_ERR_INTERNAL", "internal error"},
    [SF_END_OF_EPOCH] = {"SF_END_OF_EPOCH", "end of epoch"},
    [SF_NOT_READY] = {"SF_NOT_READY", "no batch ready yet"},
};

_Static_assert(sizeof(status_texts) / sizeof(status_texts[0]) == SF_STATUS_COUNT_,
               "every sf_status needs a text");

const char *sf_status_str(sf_status status)
{
    if ((unsigned)status >= SF_STATUS_COUNT_)
        return "unknown status";
    return status_texts[status].text;
}

const char *sf_status_name(sf_status status)
{
    if ((unsigned)status >= SF_STATUS_COUNT_)
        return "SF_ERR_UNKNOWN";
    return status_texts[status].name;
}

const char *sf_version(void)
{
    return SF_VERSION_STRING;
}
