/* The fetch suite's fixture, shared by tests/test_fetch*.c (one executable):
 * the mock (plain or TLS) with a fresh root, its faults and exact stats,
 * objects written into its bucket, clients of it and a synchronous fetch. */
#ifndef SF_TEST_FETCH_FIXTURE_H
#define SF_TEST_FETCH_FIXTURE_H

#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/suite_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stddef.h>
#include <string.h>

#define KiB 1024ull
#define MiB (1024ull * 1024)

extern struct mock_proc srv;
extern char *tmp;                          /* holds root/ and scratch files */
extern char root[600];                     /* the mock's root: bucket "bucket" in it */
extern char base[80];                      /* "http://127.0.0.1:PORT" or https:// */
extern char cert_file[700], key_file[700]; /* start_mock_tls's */

/* tmp with root/bucket/, no server. */
void make_root(void);
/* make_root and the mock with the extra arguments (may be NULL); base. */
void start_mock(const char *const *extra);
/* make_root and the mock over TLS with a fresh certificate; base. */
void start_mock_tls(void);
/* The suite's .fini. */
void fetch_teardown(void);

/* One unsigned request to the mock's admin endpoints; the body into *out. */
long admin(const char *method, const char *path_query, const char *body, char **out);
/* Queues fault F for the next count requests under bucket/key prefix. */
void queue_fault(const char *prefix, const char *fault, unsigned count);
/* Replaces the mock's fault rules. */
void set_rules(const char *text);
cJSON *mock_stats(void);
/* A number in the stats by path ("keys", "bucket/k", "status", "503"); 0 when absent. */
double jnum(const cJSON *j, const char *a, const char *b, const char *c, const char *d);

/* One number of a fresh mock_stats(), by path as jnum's. */
double mock_stat(const char *a, const char *b, const char *c, const char *d);

void sha256(const void *p, size_t n, unsigned char out[32]);
/* got and want, n bytes each, are the same (compared by digest: no dump). */
#define expect_same_bytes(got, want, n)                                                            \
    do {                                                                                           \
        unsigned char h1_[32], h2_[32];                                                            \
        sha256((got), (n), h1_);                                                                   \
        sha256((want), (n), h2_);                                                                  \
        cr_expect(memcmp(h1_, h2_, 32) == 0, "SHA-256 of %zu fetched bytes differs", (size_t)(n)); \
    } while (0)
/* Writes root/bucket/key with n pseudo-random bytes; returns them (malloc'd). */
unsigned char *put_object(const char *key, size_t n, unsigned seed);
/* tmp/name created empty (truncated if it exists), open for reading and
 * writing: a destination for fetches into an fd. Close it. */
int open_scratch(const char *name);

/* The suite's client options: base, the mock's keys, 4 connections, 1 MiB
 * chunks, fast retries, a 1 s stall timeout. */
void opts_init(struct sf_s3_options *o);
/* start_mock(NULL) and default_client(). */
void start_default(void);
/* start_default() with one object: put_object(key, n, seed), returned. */
unsigned char *start_with_object(const char *key, size_t n, unsigned seed);
/* A client of the given concurrency and chunk size. */
void sized_client(unsigned concurrency, size_t chunk_bytes);

/* n objects dir/obj-00.bin, dir/obj-01.bin... (dir without the bucket),
 * object i of first + i * step + i pseudo-random bytes of seed seed + i: its
 * size in size[i], its bytes in want[i] (malloc'd). Returns how many ranges
 * of range_bytes they take in all. */
size_t put_numbered_objects(const char *dir, size_t n, size_t first, size_t step, unsigned seed,
                            size_t range_bytes, unsigned char **want, size_t *size);
/* Starts a fetch of each of put_numbered_objects' n objects into f[i]. */
void start_numbered_fetches(const char *dir, size_t n, struct sf_fetch **f);
/* Starts and waits for the end of a fetch; the fetch is left in *f. */
sf_status fetch_sync(const char *url, const struct sf_fetch_options *o, struct sf_fetch **f,
                     struct sf_fetch_progress *p);
/* A fetch of url (options o, or NULL) that must fail with want, its message
 * naming frag. */
void expect_fetch_fails(const char *url, const struct sf_fetch_options *o, sf_status want,
                        const char *frag);
/* Fetches s3://bucket/key whole into engine memory and checks it against want. */
void expect_fetch_whole(const char *key, const unsigned char *want, size_t n,
                        struct sf_fetch_progress *p);
/* put_object(key, n, seed), then expect_fetch_whole of it. */
void expect_put_and_fetch(const char *key, size_t n, unsigned seed, struct sf_fetch_progress *p);
/* sf_s3_get_stats of s3. */
struct sf_s3_stats client_stats(void);

#endif
