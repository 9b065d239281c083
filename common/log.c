#include "common/log.h"

#include <stdio.h>

void sf__vlog(sf_log_fn log, void *user, enum sf_log_level max_level, enum sf_log_level level,
              const char *fmt, va_list ap)
{
    if (!log || level > max_level)
        return;
    char line[SF__LOG_LINE_BYTES];
    vsnprintf(line, sizeof(line), fmt, ap);
    log(user, level, line);
}
