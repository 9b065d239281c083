/* Loader internals shared with loader_config.c and the tests. */
#ifndef SF_SRC_LOADER_H
#define SF_SRC_LOADER_H

#include "shardfeed.h"
#include "shardfeed_loader.h"

#include <stddef.h>
#include <stdint.h>

/* Checks every option; SF_ERR_INVALID_ARGUMENT with a message naming it. */
sf_status sf__loader_options_check(const struct sf_loader_options *o, char *err, size_t err_len);

/* Enum option by name ("crop": random_resized|center|none, "layout",
 * "dtype", "on_error", "device", "epoch_policy", "partition"): 0 and *out set,
 * or -1 for an unknown value. */
int sf__loader_parse_enum(const char *what, const char *s, int *out);

/* Expands each of o's sources into (*lists)[i] (sf_s3_expand; with stat,
 * sf_s3_expand_stat: every object checked to exist). *n_lists counts the
 * lists made, *total their objects; the caller frees them with
 * sf__loader_lists_free whatever the result. */
sf_status sf__loader_expand_each(struct sf_s3 *s3, const struct sf_loader_options *o, int stat,
                                 struct sf_object_list ***lists, size_t *n_lists, size_t *total,
                                 char *err, size_t err_len);
void sf__loader_lists_free(struct sf_object_list **lists, size_t n_lists);

#endif
