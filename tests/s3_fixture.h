/* The s3 suite's fixture, shared by tests/test_s3*.c (one executable): the
 * mock with a fresh root, objects in its bucket, its stats, clients of it,
 * and the CLI run against it. */
#ifndef SF_TEST_S3_FIXTURE_H
#define SF_TEST_S3_FIXTURE_H

#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/suite_client.h"

#include <cjson/cJSON.h>
#include <stddef.h>

extern struct mock_proc srv;
extern char *tmp;      /* holds root/ and scratch files */
extern char root[600]; /* the mock's root: bucket "bucket" in it */

/* tmp with root/bucket/, no server. */
void make_root(void);
/* make_root and the mock with the extra arguments (may be NULL). */
void start_mock(const char *const *extra);
/* The suite's .fini. */
void s3_teardown(void);

cJSON *mock_stats(void);
/* j[a][b][c] (stopping at a NULL name), 0 when absent. */
double jnum(const cJSON *j, const char *a, const char *b, const char *c);
/* Requests the mock answered. */
double mock_requests(void);

/* Writes root/bucket/key with n pseudo-random bytes; returns them (malloc'd). */
unsigned char *put_object(const char *key, size_t n, unsigned seed);
void put_small(const char *key, size_t n);
/* Puts prefix-NNN.tar for n in [0, count) except those in skip (-1 ends it),
 * with size 100 + n; their ETags into etags[n] when etags is not NULL. */
void put_shards(const char *prefix, int count, const int *skip, char (*etags)[35]);

/* The suite's client options: the mock, 4 connections, 256 KiB chunks, fast
 * retries. */
void opts_init(struct sf_s3_options *o);
/* make_root and a client whose endpoint is never contacted, for local paths. */
void local_client(void);
/* s3's detail message. */
const char *errmsg(void);
/* Fetches url whole into memory, checking it against want (n bytes). */
sf_status fetch_whole(const char *url, const void *want, size_t n);
/* Stats url, which must fail with want, errmsg() holding each of words
 * (NULL-terminated). */
void expect_stat_fails(const char *url, sf_status want, const char *const *words);
/* Fetches url whole, which must fail with want, the fetch's message (s3's
 * when none started) holding each of words (NULL-terminated). */
void expect_fetch_fails(const char *url, sf_status want, const char *const *words);
/* No request the mock answered was refused: no 403 (a signature that did
 * not match), no 400. */
void expect_no_request_refused(void);

/* Runs the shardfeed CLI with argv as given (argv[0] is SF_CLI_BIN), stdout
 * and stderr into tmp/TAG.out and tmp/TAG.err; the exit status. */
int cli_run_argv(const char *tag, const char *const *argv);
/* argv (cap entries) for the shardfeed CLI: SF_CLI_BIN, args[0] (the
 * command), --endpoint-url srv.url, then the rest of args (NULL-terminated). */
void cli_argv(const char *const *args, const char **argv, int cap);
/* Runs the shardfeed CLI with --endpoint-url and args (NULL-terminated). */
int cli_run(const char *tag, const char *const *args);
/* Contents of tmp/TAG.EXT (static buffer). */
const char *cli_output(const char *tag, const char *ext);

#endif
