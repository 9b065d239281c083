/* Test support: run shardfeed-mock-s3 as a child process on a free port. */
#ifndef SF_TEST_MOCK_PROC_H
#define SF_TEST_MOCK_PROC_H

#include <stddef.h>
#include <sys/types.h>

struct mock_proc {
    pid_t pid;
    unsigned port;
    char url[64];  /* "http://127.0.0.1:PORT" (https with --tls-cert) */
    char host[32]; /* "127.0.0.1:PORT", the Host header */
};

/* Starts the server with --root root --port 0 --quiet and the extra
 * arguments (NULL-terminated, may be NULL); waits for its "listening on"
 * line. Returns 0 or -1. */
int mock_proc_start(struct mock_proc *p, const char *root, const char *const *extra_args);
/* SIGTERM, then waits up to 10 s. Returns the exit status, or -1 if it had to
 * be killed or died from a signal. */
int mock_proc_stop(struct mock_proc *p);

/* A fresh temporary directory (malloc'd path). */
char *test_tmpdir(void);
/* test_tmpdir with an empty folder root in it, whose path goes to *root
 * (malloc'd); NULL (and *root NULL) on failure. */
char *test_tmpdir_with_root(char **root);
/* rm -rf */
void test_rmtree(const char *path);
/* Makes the folder dir/rel (its parent must exist); its path goes to path
 * unless NULL. Returns 0 or -1. */
int test_make_dir(const char *dir, const char *rel, char *path, size_t path_len);
/* Writes data to root/rel, creating parent directories. */
int test_write_file(const char *root, const char *rel, const void *data, size_t n);
/* Fills buf with deterministic pseudo-random bytes. */
void test_fill(void *buf, size_t n, unsigned seed);
/* Writes n bytes of test_fill(seed) to root/bucket/key (an object of the
 * mock whose root is root); returns them (malloc'd), NULL on failure. */
unsigned char *test_put_object(const char *root, const char *bucket, const char *key, size_t n,
                               unsigned seed);

/* Unsets the AWS_* variables a developer's shell may carry, disables IMDS and
 * points the AWS config and credentials files at absent files in dir, so no
 * ambient configuration leaks into a test. */
void test_isolate_aws_env(const char *dir);

#endif
