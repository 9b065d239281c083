/*
 * What the files of the S3 client share (s3/s3_client.c: configuration,
 * signing, stat, fetch; s3/s3_list.c: listing and expansion;
 * s3/s3_upload.c: PUT and multipart upload). Private to them: the rest of
 * the library sees only shardfeed_s3.h and s3/s3_client.h.
 */
#ifndef SF_S3_S3_CLIENT_IMPL_H
#define SF_S3_S3_CLIENT_IMPL_H

#include "s3/credentials.h"
#include "s3/endpoint.h"
#include "s3/fetch.h"
#include "shardfeed_s3.h"

#include <pthread.h>

struct sf_s3 {
    struct sf_s3_options opt; /* its strings are the caller's: read only in sf_s3_new */
    char *ca_bundle;          /* resolved (option, AWS_CA_BUNDLE or profile); owned */
    struct sf__endpoint ep;
    struct sf__cred_chain *creds;
    struct sf__engine *engine;
    pthread_mutex_t lock; /* guards errmsg */
    char errmsg[1024];
};

/* Keeps the message (printf-style) as the client's detail; returns st. */
__attribute__((format(printf, 3, 4))) sf_status sf__s3_set_err(struct sf_s3 *s3, sf_status st,
                                                               const char *fmt, ...);

/* sf__locator_parse, with the client's detail set when url is refused. */
sf_status sf__s3_parse_url(struct sf_s3 *s3, const char *url, struct sf__locator *loc);

/* Resolves (or refreshes) the credentials on the caller's thread; on failure
 * the detail names display. */
sf_status sf__s3_ensure_creds(struct sf_s3 *s3, const char *display);

/* Stat of a local file: fills url (display), key (path), size and
 * last_modified of *out; on failure the detail names display. */
sf_status sf__s3_stat_local(struct sf_s3 *s3, const char *path, const char *display,
                            struct sf_object_info *out);

/* HEAD of an s3:// or http(s):// object: fills size, etag and
 * last_modified of *out (nothing else). Only s3:// requests need
 * credentials. */
sf_status sf__s3_head_object(struct sf_s3 *s3, const struct sf__locator *loc,
                             struct sf_object_info *out);

#endif
