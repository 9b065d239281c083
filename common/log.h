/* Log lines for the caller's sink (include/shardfeed/common.h, sf_log_fn):
 * the one place a library message is formatted for a log. */
#ifndef SF_COMMON_LOG_H
#define SF_COMMON_LOG_H

#include "shardfeed/common.h"

#include <stdarg.h>

/* Longer lines are cut. */
#define SF__LOG_LINE_BYTES 4096

/* Formats one line and hands it to log, when log is set and level is at
 * most max_level (SF_LOG_DEBUG passes every line). */
void sf__vlog(sf_log_fn log, void *user, enum sf_log_level max_level, enum sf_log_level level,
              const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

#endif
