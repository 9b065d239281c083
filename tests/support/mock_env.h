/* Test support for Criterion suites that run the mock S3 server: the
 * temporary root, the start, the admin calls and the client, each failing
 * the test (cr_assert) when it cannot do its part. */
#ifndef SF_TEST_MOCK_ENV_H
#define SF_TEST_MOCK_ENV_H

#include "shardfeed_s3.h"
#include "support/mock_proc.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* A fresh temporary directory, the AWS environment isolated in it (see
 * test_isolate_aws_env), holding root/bucket/: the directory is returned
 * (malloc'd), root's path written to root. */
char *mock_env_root(char *root, size_t root_len);
/* Starts the mock on root with the extra arguments (NULL-terminated, may be
 * NULL). */
void mock_env_start(struct mock_proc *srv, const char *root, const char *const *extra);
/* Destroys *s3 (s3 may be NULL), stops *srv when it runs and removes *tmp;
 * each may be unset. */
void mock_env_stop(struct mock_proc *srv, char **tmp, struct sf_s3 **s3);
/* test_put_object of root/bucket/key, n bytes of seed: the bytes (malloc'd). */
unsigned char *mock_env_put(const char *root, const char *key, size_t n, unsigned seed);
/* mock_admin against srv; the HTTP status. */
long mock_env_admin(const struct mock_proc *srv, const char *method, const char *path_query,
                    const char *body, char **out);
/* /_mock/stats parsed (cJSON_Delete it). */
cJSON *mock_env_stats(const struct mock_proc *srv);
/* j[a][b][c][d] (stopping at the first NULL name) as a number; 0 when absent. */
double mock_env_jnum(const cJSON *j, const char *a, const char *b, const char *c, const char *d);
/* Defaults, with the mock's endpoint and key pair. */
void mock_env_s3_options(struct sf_s3_options *o, const char *endpoint_url);
/* The mock's ETag of data: the quoted hex MD5 (35 bytes with the NUL). */
void mock_env_etag(const void *data, size_t n, char out[35]);
/* mock_env_s3_options with concurrency connections, chunk-byte ranges and
 * fast retries (5 ms bases, a 200 ms cap). */
void mock_env_s3_fast(struct sf_s3_options *o, const char *endpoint_url, unsigned concurrency,
                      unsigned long long chunk_bytes);
/* Takes the keys out of o: requests go unsigned. */
void mock_env_s3_unsigned(struct sf_s3_options *o);
/* sf_s3_new. */
struct sf_s3 *mock_env_s3_new(const struct sf_s3_options *o);
/* mock_env_s3_new of the options init fills (a suite's defaults), made
 * unsigned (mock_env_s3_unsigned) when unsigned_requests. */
struct sf_s3 *mock_env_s3_from(void (*init)(struct sf_s3_options *), int unsigned_requests);

#endif
