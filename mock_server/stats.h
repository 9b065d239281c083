/* Request counters of the mock server, served as JSON at /_mock/stats. */
#ifndef SF_MOCK_STATS_H
#define SF_MOCK_STATS_H

#include "shardfeed/common.h"

#include <stdint.h>

struct mock_stats;

sf_status mock_stats_new(struct mock_stats **out);
void mock_stats_destroy(struct mock_stats *s);

/* Counts one answered request. key is "bucket/key", "bucket/" or NULL;
 * fault names the injected fault ("503", "reset", ...) or NULL. */
void mock_stats_record(struct mock_stats *s, const char *op, int status, const char *key,
                       uint64_t bytes_sent, uint64_t bytes_received, const char *fault);
/* Takes back bytes counted as sent by mock_stats_record() that did not go
 * out (a transfer that ended early). */
void mock_stats_unsent(struct mock_stats *s, uint64_t bytes);
/* Counts a fault that happens after the answer started (reset, stall). */
void mock_stats_fault(struct mock_stats *s, const char *fault);
/* Counts one credential event under "credentials": name is one of
 * "imds_token", "imds_role_list", "imds_credentials", "container",
 * "expired_token_rejections". */
void mock_stats_credential(struct mock_stats *s, const char *name);
/* Counts one event under root[group][name] ("aws_chunked", "checksums"),
 * the group appearing with its first event. */
void mock_stats_count(struct mock_stats *s, const char *group, const char *name);
/* The counters as a malloc'd JSON string. */
char *mock_stats_json(struct mock_stats *s);
void mock_stats_reset(struct mock_stats *s);

#endif
