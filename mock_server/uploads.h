/* Multipart uploads in progress on the mock server: which uploads exist and
 * which parts each has received. Part bodies are files (hidden
 * MOCK_TMP_PREFIX names in the bucket folder, like PutObject's temporary
 * files); this registry holds their paths and sizes, and unlinks them when an
 * upload is aborted, completed or the server stops. */
#ifndef SF_MOCK_UPLOADS_H
#define SF_MOCK_UPLOADS_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define MOCK_MAX_UPLOADS     1000         /* uploads in progress, whole server */
#define MOCK_MAX_PARTS_TOTAL 100000       /* parts held by all uploads in progress */
#define MOCK_MAX_PART_NUMBER 10000        /* S3: part numbers 1..10000 */
#define MOCK_MIN_PART_BYTES  (5ull << 20) /* S3: every part but the last */
#define MOCK_UPLOAD_ID_LEN   40

struct mock_part {
    unsigned number;
    uint64_t size;
    unsigned char md5[16];
    time_t mtime;
    char *path; /* the part's file */
};

/* An upload as listed by ListMultipartUploads. */
struct mock_upload_info {
    char *key;
    char id[MOCK_UPLOAD_ID_LEN + 1];
    time_t initiated;
};

struct mock_uploads;

sf_status mock_uploads_new(struct mock_uploads **out);
/* Unlinks the part files of every upload left and frees. NULL is a no-op. */
void mock_uploads_destroy(struct mock_uploads *u);

/* A new upload of bucket/key; writes its id. SF_ERR_LIMIT when
 * MOCK_MAX_UPLOADS are in progress. */
sf_status mock_uploads_create(struct mock_uploads *u, const char *bucket, const char *key,
                              char id[MOCK_UPLOAD_ID_LEN + 1]);

/* SF_OK when id is an upload of bucket/key that accepts parts; SF_ERR_NOT_FOUND
 * otherwise (unknown, aborted, completed, or being completed). */
sf_status mock_uploads_check(struct mock_uploads *u, const char *bucket, const char *key,
                             const char *id);

/* Records part p of upload id; on SF_OK the registry owns p->path (a part of
 * the same number is replaced and its file unlinked). SF_ERR_NOT_FOUND as
 * mock_uploads_check(), SF_ERR_LIMIT over MOCK_MAX_PARTS_TOTAL; on failure
 * the caller still owns the file. */
sf_status mock_uploads_add_part(struct mock_uploads *u, const char *bucket, const char *key,
                                const char *id, const struct mock_part *p);

/* Removes the upload and unlinks its parts. SF_ERR_NOT_FOUND as above. */
sf_status mock_uploads_abort(struct mock_uploads *u, const char *bucket, const char *key,
                             const char *id);

/* A copy of the upload's parts sorted by number (free with
 * mock_parts_free); with `completing` the upload is also marked as being
 * completed, so no part can be added or replaced and no other completion
 * start until mock_uploads_end_complete(). */
sf_status mock_uploads_parts(struct mock_uploads *u, const char *bucket, const char *key,
                             const char *id, int completing, struct mock_part **parts, size_t *n);
void mock_parts_free(struct mock_part *parts, size_t n);

/* Ends a completion started by mock_uploads_parts(completing = 1): done = 1
 * removes the upload and unlinks every part file, done = 0 lets it take
 * parts again. */
void mock_uploads_end_complete(struct mock_uploads *u, const char *id, int done);

/* The uploads of bucket whose key starts with prefix, sorted by key then
 * initiation, into a malloc'd array (free with mock_upload_infos_free). */
sf_status mock_uploads_list(struct mock_uploads *u, const char *bucket, const char *prefix,
                            struct mock_upload_info **out, size_t *n);
void mock_upload_infos_free(struct mock_upload_info *infos, size_t n);

#endif
