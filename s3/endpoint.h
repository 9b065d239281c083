/*
 * Where requests go: source URLs (s3://, http(s)://, file://, paths) and the
 * S3 endpoint (AWS or a custom one such as MinIO), with path-style or
 * virtual-hosted addressing.
 */
#ifndef SF_S3_ENDPOINT_H
#define SF_S3_ENDPOINT_H

#include "shardfeed_s3.h"

#include <stddef.h>

enum sf__loc_kind { SF__LOC_S3 = 0, SF__LOC_HTTP = 1, SF__LOC_FILE = 2 };

/* A parsed source URL. Strings are malloc'd. */
struct sf__locator {
    enum sf__loc_kind kind;
    char *bucket;  /* S3: bucket name */
    char *key;     /* S3: key ("" for a bucket or "s3://"); FILE: the path; HTTP: the path */
    char *url;     /* HTTP: the URL as given */
    char *display; /* "s3://bucket/key", the URL, or the path: for messages */
    char *mem;     /* the strings above, in one allocation (NULL: borrowed strings) */
};

/* Parses url: "s3://bucket/key", "s3://bucket", "s3://", "http(s)://...",
 * "file:///path" (percent-decoded), anything else is a local path. Rejects
 * empty input, s3 bucket names that are not 1..255 chars of [A-Za-z0-9._-],
 * and keys over 1024 bytes. */
sf_status sf__locator_parse(const char *url, struct sf__locator *out, char *err, size_t err_len);
void sf__locator_free(struct sf__locator *l);
sf_status sf__locator_copy(const struct sf__locator *src, struct sf__locator *dst);

struct sf__endpoint {
    char *scheme;    /* "https" */
    char *authority; /* "s3.us-east-1.amazonaws.com" or "127.0.0.1:9000" */
    char *base_path; /* "" or "/minio" (no trailing slash) */
    char *region;
    char *mem; /* the four strings above, in one allocation */
    int is_aws;
    enum sf_addressing addressing; /* resolved: PATH or VIRTUAL (AUTO decided per bucket) */
};

/* endpoint_url NULL means AWS (https://s3.REGION.amazonaws.com). Custom
 * endpoints default to path-style; AWS to virtual-hosted (path-style for
 * bucket names that cannot be host names, e.g. with dots or upper case). */
sf_status sf__endpoint_init(struct sf__endpoint *e, const char *endpoint_url, const char *region,
                            enum sf_addressing addressing, char *err, size_t err_len);
void sf__endpoint_free(struct sf__endpoint *e);

/* One request target: the URL to give curl, the Host header value and the
 * wire path (percent-encoded) that SigV4 signs. Strings malloc'd. */
struct sf__target {
    char *url;
    char *host;
    char *path;
};

/* Target for bucket/key (key "" = bucket level; bucket NULL = service
 * level) with an optional wire query (already encoded, without '?'). */
sf_status sf__endpoint_target(const struct sf__endpoint *e, const char *bucket, const char *key,
                              const char *query, struct sf__target *out);
void sf__target_free(struct sf__target *t);

#endif
