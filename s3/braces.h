/*
 * WebDataset-style brace expansion of shard patterns:
 *   "train-{000000..001023}.tar"  numeric range; when either bound other
 *                                 than "0" has a leading zero, every number
 *                                 is zero-padded to the longer bound's width
 *                                 (braceexpand's rule: "{1..010}" gives
 *                                 001..010; "{1..10}" is not padded);
 *   "{a,b,c}"                      a list (items may be empty: "x{,-v2}");
 *   several braces multiply, left-most varies slowest (WebDataset order).
 * Ranges may go down ("{10..1}"). A brace with neither ',' nor ".." ("{x}",
 * "{}") is kept literally, as bash and braceexpand do. Nested braces are not
 * supported (error).
 * Unbalanced braces, non-numeric range bounds, or more than max_results
 * results are errors with a message naming the column.
 */
#ifndef SF_S3_BRACES_H
#define SF_S3_BRACES_H

#include "shardfeed/common.h"
#include "common/strv.h" /* sf__strv_free, for the results */

#include <stddef.h>

/* 1 when s holds a brace expression (a list or a range) or a brace syntax
 * error, i.e. when sf__brace_expand would not yield s itself; 0 otherwise
 * (also for NULL). Never allocates. */
int sf__has_braces(const char *s);

/* Expands pattern into *out (a malloc'd array of *n malloc'd strings; free
 * with sf__strv_free). A pattern without braces yields itself. max_results 0
 * means 10 million. Errors: SF_ERR_INVALID_ARGUMENT (syntax), SF_ERR_LIMIT
 * (more than max_results results, or more than 1 GiB of result strings; both
 * checked before anything is allocated), SF_ERR_NO_MEMORY. On error *out is
 * NULL, *n is 0 and err (when err_len > 0) holds a message. */
sf_status sf__brace_expand(const char *pattern, size_t max_results, char ***out, size_t *n,
                           char *err, size_t err_len);

#endif
