/* The mock_server suites' fixture, shared by tests/test_mock_server*.c (one
 * executable): the server under test with a fresh root, and signed and
 * unsigned requests to it. */
#ifndef SF_TEST_MOCK_SERVER_FIXTURE_H
#define SF_TEST_MOCK_SERVER_FIXTURE_H

#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>

/* The server's key pair: test-ak / test-secret. */
extern const struct s3_creds creds;
extern char *root; /* server root */
extern char *tmp;  /* parent of root, holds a file outside it */
extern struct mock_proc srv;

/* tmp/root with an empty bucket1, and tmp/secret.txt outside the root. */
void make_root(void);
/* make_root, then the server with the key pair and the extra arguments. */
void start_with(const char *const *extra);
/* start_with, and an object bucket1/k of one byte "v". */
void start_with_k(const char *const *extra);
/* start_with(NULL): the `mock_server` suite's .init. */
void mock_server_setup(void);
/* Stops the server, removes tmp: the suites' .fini. */
void mock_server_teardown(void);

/* A request signed with creds; the HTTP status (0 when none came). */
long call(const char *method, const char *target, const char *const *headers, struct s3_resp *r);
/* An unsigned request. */
long plain(const char *method, const char *target, const char *const *headers, struct s3_resp *r);
/* A signed PUT that must answer 200. */
void put_object(const char *key_path, const void *data, size_t n);
/* The answer has this status and S3 error code. */
void expect_error(struct s3_resp *r, long status, const char *code);
/* c sent to the server must fail with this status and S3 error code. */
void expect_sent_error(const struct s3_call *c, long status, const char *code);
/* One signed request that must fail with this status and S3 error code. */
void expect_call_error(const char *method, const char *target, const char *const *headers,
                       long status, const char *code);
/* /_mock/stats, parsed (cJSON_Delete it). */
cJSON *stats(void);
/* stats["keys"][key]["status"][status], 0 when absent. */
double key_status(cJSON *st, const char *key, const char *status);
/* expect_call_error with one header line ("Name: value"). */
void expect_header_error(const char *method, const char *target, const char *header, long status,
                         const char *code);
/* A signed GET that answers 200 with needle in the body. */
void expect_get_has(const char *target, const char *needle);
/* n bytes of test_fill(seed), malloc'd. */
unsigned char *filled(size_t n, unsigned seed);
/* st[group][name], 0 when absent. */
double group_count(cJSON *st, const char *group, const char *name);
/* POST to an admin endpoint of the mock; returns the HTTP status. */
long admin_post(const char *target, const char *body);

#endif
