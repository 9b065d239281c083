/* The cache suite's fixture, shared by tests/test_cache*.c (one
 * executable): the mock with a fresh root and a cache directory beside it,
 * a client and a cache, reads through the cache, a walk of its files, and
 * the CLI run against them. */
#ifndef SF_TEST_CACHE_FIXTURE_H
#define SF_TEST_CACHE_FIXTURE_H

#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#define MB (1024u * 1024)

extern struct mock_proc srv;
extern char *tmp;
extern char root[600]; /* the mock's root, bucket "bucket" in it */
extern char cdir[600]; /* the cache directory */
extern struct sf_s3 *s3;
extern struct sf_cache *cache;

/* tmp with root/bucket/ and the mock's keys in the environment; cdir. */
void make_dirs(void);
/* make_dirs and the mock with the extra arguments (may be NULL). */
void start_mock(const char *const *extra);
/* start_mock with one --fault spec (the mock's syntax). */
void start_mock_with_fault(const char *spec);
/* The mock (with the fault spec, when not NULL) holding key, n bytes of
 * seed (put_object): their bytes (malloc'd). */
unsigned char *mock_with_object(const char *fault, const char *key, size_t n, unsigned seed);
/* The suite's .fini. */
void cache_teardown(void);

long admin(const char *method, const char *path_query, char **out);
/* Replaces the mock's fault rules, which must be taken. */
void set_rules_c(const char *text);
/* GET requests the mock answered for bucket/key (every status). */
double key_gets(const char *key);
/* Writes root/bucket/key with n pseudo-random bytes; returns them (malloc'd). */
unsigned char *put_object(const char *key, size_t n, unsigned seed);
/* put_object of count objects of n bytes: object i keyed prefix, i in at
 * least digits decimal digits (zero-padded), ".tar", of seed seed0 + i;
 * their bytes into d[i]. */
void put_numbered_objects(unsigned char **d, int count, const char *prefix, int digits, size_t n,
                          unsigned seed0);

/* s3 = a client of chunk bytes and concurrency connections (client: 4). */
void client_c(unsigned long long chunk, unsigned concurrency);
void client(unsigned long long chunk);
/* cache = a cache in cdir of limit bytes (0: none) revalidating as rv. */
void open_cache(unsigned long long limit, enum sf_cache_revalidate rv);
/* The mock with key (n bytes of seed) in its bucket, a client of chunk
 * bytes and concurrency connections, and an unlimited cache that trusts
 * its entries; the object's bytes (malloc'd). */
unsigned char *mock_and_cache(const char *key, size_t n, unsigned seed, unsigned long long chunk,
                              unsigned concurrency);
/* sf_s3_stat of s3://bucket/key, which must succeed. */
struct sf_object_info info_of(const char *key);
/* Opens key through the cache, waits for all of it, compares with want;
 * where the bytes came from. */
enum sf_cache_source read_through(const char *key, const unsigned char *want, size_t n);
/* read_through of key twice: fetched the first time, from the disk (the
 * entry published) the second. */
void expect_fetched_then_on_disk(const char *key, const unsigned char *want, size_t n);
/* Opens key through the cache, which must succeed; the object. */
struct sf_cache_object *open_through(const char *key);
/* Waits for all n bytes of o, which must succeed, then asserts o done and
 * its bytes those of want; p as the wait left it. o stays open. */
void wait_whole(struct sf_cache_object *o, const unsigned char *want, size_t n,
                struct sf_cache_object_progress *p);

/* Calls fn(user, name, path, st) for every file in the cache's key
 * directories (v1/<2 hex>/...); nothing when the cache does not exist yet. */
void walk_cache(void (*fn)(void *user, const char *name, const char *path, const struct stat *st),
                void *user);
/* name ends with suffix (and is longer). */
int has_suffix(const char *name, const char *suffix);
/* The cache's entries (.sf) and downloads (.part). */
struct tally {
    unsigned long long bytes;
    int entries, parts;
    char entry_path[1400];
};
struct tally tally_cache(void);
/* Sum of the sizes of entries and downloads in the cache directory. */
unsigned long long cache_bytes(int *n_entries);
/* Path of the single entry file in the cache, into out. */
void only_entry(char *out, size_t n);

/* Starts the shardfeed CLI with args (NULL-terminated, without the
 * program); stdout and stderr into tmp/TAG.out and tmp/TAG.err. */
pid_t cli_spawn(const char *const *args, const char *tag);
/* Its exit status. */
int cli_wait(pid_t pid);
/* cli_spawn, then cli_wait. */
int cli_run(const char *const *args, const char *tag);
/* tmp/TAG.EXT (static buffer). */
char *slurp_tag(const char *tag, const char *ext);

#endif
