/* Loader internals shared with loader_config.c and the tests. */
#ifndef SF_SRC_LOADER_H
#define SF_SRC_LOADER_H

#include "shardfeed.h"
#include "shardfeed_loader.h"

#include <stddef.h>
#include <stdint.h>

/* Checks every option; SF_ERR_INVALID_ARGUMENT with a message naming it. */
sf_status sf__loader_options_check(const struct sf_loader_options *o, char *err, size_t err_len);

/* Sample counts from pack's index.json text (index_name, for messages; NULL
 * means "index.json"): *all = 1 when every object (matched by base name) is
 * listed with its count, else 0 (counts then partial; text that is not JSON
 * is such an index). SF_ERR_CORRUPT, with err naming index_name, the shard
 * and the field, when the entry of one of the objects has a "samples" that
 * is not a finite whole number from 0 to 2^64 - 1. */
sf_status sf__loader_counts_from_index_json(const char *text, const char *index_name,
                                            const struct sf_object_info *const *objs, size_t n,
                                            uint64_t *counts, int *all, char *err, size_t err_len);

/* Enum option by name ("crop": random_resized|center|none, "layout",
 * "dtype", "on_error", "device", "epoch_policy", "partition"): 0 and *out set,
 * or -1 for an unknown value. */
int sf__loader_parse_enum(const char *what, const char *s, int *out);

#endif
