/*
 * WebDataset-style brace expansion of shard patterns:
 *   "train-{000000..001023}.tar"  numeric range, zero-padded to the width of
 *                                 the first bound when it has a leading zero
 *                                 (or when both bounds have the same width);
 *   "{a,b,c}"                      a list (items may be empty: "x{,-v2}");
 *   several braces multiply, left-most varies slowest (WebDataset order).
 * Ranges may go down ("{10..1}"). Nested braces are not supported (error).
 * Unbalanced braces, non-numeric range bounds, or more than max_results
 * results are errors with a message naming the column.
 */
#ifndef SF_S3_BRACES_H
#define SF_S3_BRACES_H

#include "shardfeed.h"

#include <stddef.h>

/* 1 when s holds a '{' that starts a brace expression. */
int sf__has_braces(const char *s);

/* Expands pattern into *out (a malloc'd array of *n malloc'd strings; free
 * with sf__strv_free). A pattern without braces yields itself. max_results 0
 * means 10 million. Errors: SF_ERR_INVALID_ARGUMENT (syntax), SF_ERR_LIMIT. */
sf_status sf__brace_expand(const char *pattern, size_t max_results, char ***out, size_t *n,
                           char *err, size_t err_len);

void sf__strv_free(char **v, size_t n);

#endif
