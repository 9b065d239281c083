/* Internal entry points of the S3 client for the rest of the library. */
#ifndef SF_S3_S3_CLIENT_H
#define SF_S3_S3_CLIENT_H

#include "shardfeed_s3.h"

#include <stddef.h>

/*
 * Where url's object lives, independent of its version, for naming cache
 * entries: s3:// URLs give the resolved endpoint ("http://127.0.0.1:9000",
 * "https://s3.us-east-1.amazonaws.com"), the bucket and the key; http(s)://
 * URLs give endpoint "url", no bucket and the URL as key; local paths give
 * endpoint "file" and the path. SF_ERR_LIMIT when a buffer is too small.
 */
sf_status sf__s3_identity(struct sf_s3 *s3, const char *url, char *endpoint, size_t endpoint_len,
                          char *bucket, size_t bucket_len, char *key, size_t key_len);

#endif
