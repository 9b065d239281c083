/* The mock server's object store: a directory whose top-level folders are
 * buckets and whose files are objects. */
#ifndef SF_MOCK_OBJECTS_H
#define SF_MOCK_OBJECTS_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#define MOCK_TMP_PREFIX ".sfmock-"
/* Longest ETag: quotes + 32 hex, and "-N" (N <= 10000) for multipart objects. */
#define MOCK_ETAG_LEN 40

struct mock_store;

struct mock_entry {
    char *key;
    uint64_t size;
    time_t mtime;
    dev_t dev;
    ino_t ino;
    int64_t mtime_ns;
};

struct mock_listing {
    struct mock_entry *entries; /* sorted by key, byte order */
    size_t n;
};

sf_status mock_store_new(const char *root, struct mock_store **out);
void mock_store_destroy(struct mock_store *st);
const char *mock_store_root(const struct mock_store *st);

/* 1 when name follows the S3 bucket naming rules (3-63 chars, a-z 0-9 . -). */
int mock_bucket_name_valid(const char *name);
/* 1 when key (len bytes, may hold NUL) can be stored as a file under a
 * bucket: no empty, "." or ".." segment, no leading '/', no NUL, no segment
 * starting with MOCK_TMP_PREFIX, at most 1024 bytes. */
int mock_key_valid(const char *key, size_t len);

/* root/bucket[/key] into a malloc'd string; the inputs must be valid. */
char *mock_store_path(const struct mock_store *st, const char *bucket, const char *key);

/* 1 if the bucket directory exists. */
int mock_bucket_exists(const struct mock_store *st, const char *bucket);

/*
 * The ETag of the object file at path (open as fd, described by sb): the one
 * pinned by mock_store_set_etag() or persisted by mock_store_persist_etag()
 * while the file keeps its inode, size and mtime, else the quoted hex MD5 of
 * its content. Cached by (dev, inode, size, mtime), so repeated GETs of a
 * large object cost one hash. fd is read with pread; path may be NULL (then
 * no persisted ETag is looked for).
 */
sf_status mock_store_etag(struct mock_store *st, const char *path, int fd, const struct stat *sb,
                          char out[MOCK_ETAG_LEN + 1]);

/*
 * Pins the ETag of the file sb describes (a completed multipart upload's
 * "hex-N"), so mock_store_etag() answers it instead of the content's MD5
 * while the file keeps its inode, size and mtime. Held in memory only.
 */
void mock_store_set_etag(struct mock_store *st, const struct stat *sb, const char *etag);

/*
 * Persists etag for the object file that will be at path and is described by
 * sb (a temporary file renamed there next: rename keeps inode, size and
 * mtime), in a hidden sidecar file next to it (MOCK_TMP_PREFIX "etag-" and
 * the file's name), so the ETag survives a restart of the server. The
 * sidecar is written atomically and ignored once the file's inode, size or
 * mtime differ. SF_ERR_IO when it cannot be written.
 */
sf_status mock_store_persist_etag(const char *path, const struct stat *sb, const char *etag);

/* Removes the sidecar of the object file at path, if any (the object was
 * overwritten or deleted). */
void mock_store_forget_etag(const char *path);

/* All objects of bucket whose key starts with prefix, sorted. */
sf_status mock_store_list(const struct mock_store *st, const char *bucket, const char *prefix,
                          struct mock_listing *out);
void mock_listing_free(struct mock_listing *l);

/* Writes "YYYY-MM-DDTHH:MM:SS.000Z" and the RFC 7231 date. */
void mock_format_iso8601(time_t t, char out[32]);
void mock_format_http_date(time_t t, char out[40]);

#endif
