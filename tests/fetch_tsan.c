/*
 * The fetch engine's I/O threads under ThreadSanitizer (Criterion does not
 * start under TSan, so this is a plain program; scripts/test.sh runs it).
 * One client with 4 I/O threads against the mock: many objects and two
 * large ones at once (engine memory, a file, an on_data observer), random
 * resets, a missing object, a cancel mid-transfer and a range failing for
 * good while the others run on other threads. Exits 1 on a wrong byte or
 * status; TSan's reports make the test fail on their own.
 */
#include "s3/fetch.h"
#include "shardfeed.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB 1024ull
#define MiB (1024ull * 1024)

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static char root[600];

static unsigned char *put(const char *key, size_t n, unsigned seed)
{
    unsigned char *d = malloc(n);
    if (!d)
        abort();
    test_fill(d, n, seed);
    char rel[700];
    snprintf(rel, sizeof(rel), "bucket/%s", key);
    if (test_write_file(root, rel, d, n) != 0)
        abort();
    return d;
}

static struct mock_proc srv;

static void set_rules(const char *text)
{
    struct s3_call c = {.method = "POST", .target = "/_mock/faults", .body = text,
                        .body_len = strlen(text)};
    struct s3_resp r;
    int rc = s3_call(srv.url, &c, &r);
    CHECK(rc == 0 && r.status == 200, "rules '%s': HTTP %ld", text, r.status);
    s3_resp_free(&r);
}

static void queue_fault(const char *prefix, const char *fault)
{
    char q[256];
    snprintf(q, sizeof(q), "/_mock/fault?prefix=%s&fault=%s&count=1", prefix, fault);
    struct s3_call c = {.method = "POST", .target = q};
    struct s3_resp r;
    int rc = s3_call(srv.url, &c, &r);
    CHECK(rc == 0 && r.status == 200, "%s: HTTP %ld", q, r.status);
    s3_resp_free(&r);
}

/* The observer counts bytes; the engine calls it one call at a time per fetch. */
struct seen {
    unsigned long long bytes;
};
static void on_data(void *user, unsigned long long offset, const void *data, size_t len)
{
    (void)offset;
    (void)data;
    ((struct seen *)user)->bytes += len;
}

int main(void)
{
    char *tmp = test_tmpdir();
    if (!tmp)
        return 2;
    test_isolate_aws_env(tmp);
    snprintf(root, sizeof(root), "%s/root", tmp);
    char path[700];
    snprintf(path, sizeof(path), "%s/bucket", root);
    if (mkdir(root, 0755) != 0 || mkdir(path, 0755) != 0)
        return 2;
    if (mock_proc_start(&srv, root, NULL) != 0)
        return 2;

    struct sf_s3_options so;
    sf_s3_options_init_default(&so);
    so.endpoint_url = srv.url;
    so.access_key_id = "mock-access-key";
    so.secret_access_key = "mock-secret-key";
    so.io_threads = 4;
    so.concurrency = 8;
    so.chunk_bytes = 256 * KiB;
    so.retry_base_ms = 5;
    so.throttle_base_ms = 5;
    so.retry_cap_ms = 100;
    struct sf_s3 *s3 = NULL;
    char err[512];
    if (sf_s3_new(&so, &s3, err, sizeof(err)) != SF_OK) {
        fprintf(stderr, "sf_s3_new: %s\n", err);
        return 2;
    }

    enum { N = 16 };
    unsigned char *want[N];
    size_t size[N];
    struct sf_fetch *f[N];
    for (int i = 0; i < N; i++) {
        char key[64];
        snprintf(key, sizeof(key), "o/obj-%02d.bin", i);
        size[i] = 1000 + (size_t)i * 97 * KiB;
        want[i] = put(key, size[i], 300 + (unsigned)i);
    }
    size_t big_n = 6 * MiB + 99;
    unsigned char *big = put("o/big.bin", big_n, 399);
    set_rules("prefix=bucket/o/,reset=0.05");

    snprintf(path, sizeof(path), "%s/big.out", tmp);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.fd = fd;
    struct seen seen = {0};
    fo.on_data = on_data;
    fo.on_data_user = &seen;
    struct sf_fetch *bm = NULL, *bf = NULL, *missing = NULL;
    CHECK(sf_fetch_start(s3, "s3://bucket/o/big.bin", NULL, &bm) == SF_OK, "start big");
    CHECK(sf_fetch_start(s3, "s3://bucket/o/big.bin", &fo, &bf) == SF_OK, "start big to fd");
    CHECK(sf_fetch_start(s3, "s3://bucket/o/nope.bin", NULL, &missing) == SF_OK, "start missing");
    for (int i = 0; i < N; i++) {
        char url[128];
        snprintf(url, sizeof(url), "s3://bucket/o/obj-%02d.bin", i);
        CHECK(sf_fetch_start(s3, url, NULL, &f[i]) == SF_OK, "start %d", i);
    }
    struct sf_fetch_progress p;
    /* a reader following the frontier while the ranges land on 4 threads */
    for (unsigned long long at = 0; at < big_n; at += 300 * KiB)
        if (sf_fetch_wait(bm, at, -1, &p) != SF_OK && p.done)
            break;
    CHECK(sf_fetch_wait(bm, ~0ull, -1, &p) == SF_OK, "big: %s", sf_fetch_errmsg(bm));
    CHECK(memcmp(sf_fetch_data(bm), big, big_n) == 0, "big: wrong bytes");
    CHECK(sf__fetch_io_threads_used(bm) >= 2, "big ran on %u threads",
          sf__fetch_io_threads_used(bm));
    CHECK(sf_fetch_wait(bf, ~0ull, -1, &p) == SF_OK, "big to fd: %s", sf_fetch_errmsg(bf));
    CHECK(seen.bytes == big_n, "on_data saw %llu bytes of %zu", seen.bytes, big_n);
    unsigned char *got = malloc(big_n);
    CHECK(got && pread(fd, got, big_n, 0) == (ssize_t)big_n && memcmp(got, big, big_n) == 0,
          "big to fd: wrong bytes");
    free(got);
    close(fd);
    CHECK(sf_fetch_wait(missing, ~0ull, -1, &p) == SF_ERR_NOT_FOUND, "missing: %s",
          sf_fetch_errmsg(missing));
    for (int i = 0; i < N; i++) {
        sf_status st = sf_fetch_wait(f[i], ~0ull, -1, &p);
        CHECK(st == SF_OK && memcmp(sf_fetch_data(f[i]), want[i], size[i]) == 0,
              "object %d: %s", i, sf_fetch_errmsg(f[i]));
        sf_fetch_destroy(f[i]);
        free(want[i]);
    }
    sf_fetch_destroy(bm);
    sf_fetch_destroy(bf);
    sf_fetch_destroy(missing);

    /* a cancel while ranges run on every thread */
    set_rules("prefix=bucket/o/,bandwidth=512K");
    struct sf_fetch_options ko;
    sf_fetch_options_init_default(&ko);
    ko.size = big_n;
    struct sf_fetch *k = NULL;
    CHECK(sf_fetch_start(s3, "s3://bucket/o/big.bin", &ko, &k) == SF_OK, "start cancel");
    CHECK(sf_fetch_wait(k, 1, -1, &p) == SF_OK, "cancel: first byte");
    sf_fetch_destroy(k);
    sf_s3_destroy(s3);

    /* a range failing for good while the others run on other threads */
    so.max_attempts = 1;
    if (sf_s3_new(&so, &s3, err, sizeof(err)) != SF_OK) {
        fprintf(stderr, "sf_s3_new: %s\n", err);
        return 2;
    }
    queue_fault("bucket/o/big.bin", "500");
    CHECK(sf_fetch_start(s3, "s3://bucket/o/big.bin", &ko, &k) == SF_OK, "start failing");
    CHECK(sf_fetch_wait(k, ~0ull, -1, &p) == SF_ERR_HTTP, "failing: %s", sf_fetch_errmsg(k));
    sf_fetch_destroy(k);
    sf_s3_destroy(s3);
    free(big);
    mock_proc_stop(&srv);
    test_rmtree(tmp);
    free(tmp);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
