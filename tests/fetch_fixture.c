/* The fetch suite's fixture (fetch_fixture.h). */
#include "fetch_fixture.h"

#include "s3/fetch.h"          /* sf__fetch_io_threads_used, sf__engine_io_loops */
#include "s3/s3_client_impl.h" /* the engine of a client */
#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/test_cert.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct mock_proc srv;
char *tmp;
char root[600];
char base[80];
char cert_file[700], key_file[700];

/* ------------------------------------------------------------ environment */

void make_root(void)
{
    tmp = mock_env_root(root, sizeof(root));
}

void start_mock(const char *const *extra)
{
    make_root();
    mock_env_start(&srv, root, extra);
    snprintf(base, sizeof(base), "%s", srv.url);
}

void start_mock_tls(void)
{
    make_root();
    cr_assert(test_make_cert(tmp, cert_file, sizeof(cert_file), key_file, sizeof(key_file)) == 0);
    const char *extra[] = {"--tls-cert", cert_file, "--tls-key", key_file, NULL};
    mock_env_start(&srv, root, extra);
    snprintf(base, sizeof(base), "%s", srv.url);
}

void fetch_teardown(void)
{
    mock_env_stop(&srv, &tmp, &s3);
}

/* ------------------------------------------------------------ admin requests */

long admin(const char *method, const char *path_query, const char *body, char **out)
{
    return mock_env_admin(&srv, method, path_query, body, out);
}

void queue_fault(const char *prefix, const char *fault, unsigned count)
{
    char q[512];
    snprintf(q, sizeof(q), "/_mock/fault?prefix=%s&fault=%s&count=%u", prefix, fault, count);
    char *body = NULL;
    long st = admin("POST", q, NULL, &body);
    cr_assert_eq(st, 200, "%s: %s", q, body ? body : "");
    free(body);
}

void set_rules(const char *text)
{
    char *body = NULL;
    long st = admin("POST", "/_mock/faults", text, &body);
    cr_assert_eq(st, 200, "rules '%s': %s", text, body ? body : "");
    free(body);
}

cJSON *mock_stats(void)
{
    return mock_env_stats(&srv);
}

double jnum(const cJSON *j, const char *a, const char *b, const char *c, const char *d)
{
    return mock_env_jnum(j, a, b, c, d);
}

/* ------------------------------------------------------------ data */

double mock_stat(const char *a, const char *b, const char *c, const char *d)
{
    cJSON *j = mock_stats();
    double n = jnum(j, a, b, c, d);
    cJSON_Delete(j);
    return n;
}

void sha256(const void *p, size_t n, unsigned char out[32])
{
    unsigned int len = 32;
    cr_assert(EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) == 1);
}

unsigned char *put_object(const char *key, size_t n, unsigned seed)
{
    return mock_env_put(root, key, n, seed);
}

int open_scratch(const char *name)
{
    char path[900];
    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(fd >= 0, "%s", path);
    return fd;
}

size_t put_numbered_objects(const char *dir, size_t n, size_t first, size_t step, unsigned seed,
                            size_t range_bytes, unsigned char **want, size_t *size)
{
    size_t ranges = 0;
    for (size_t i = 0; i < n; i++) {
        char key[128];
        snprintf(key, sizeof(key), "%s/obj-%02zu.bin", dir, i);
        size[i] = first + i * step + i;
        want[i] = put_object(key, size[i], seed + (unsigned)i);
        ranges += (size[i] + range_bytes - 1) / range_bytes;
    }
    return ranges;
}

void start_numbered_fetches(const char *dir, size_t n, struct sf_fetch **f)
{
    for (size_t i = 0; i < n; i++) {
        char url[160];
        snprintf(url, sizeof(url), "s3://bucket/%s/obj-%02zu.bin", dir, i);
        cr_assert_eq(sf_fetch_start(s3, url, NULL, &f[i]), SF_OK, "%s", url);
    }
}

/* ------------------------------------------------------------ client */

void opts_init(struct sf_s3_options *o)
{
    mock_env_s3_fast(o, base, 4, 1 * MiB);
    o->stall_timeout_ms = 1000;
    o->connect_timeout_ms = 5000;
}

void start_default(void)
{
    start_mock(NULL);
    default_client();
}

unsigned char *start_with_object(const char *key, size_t n, unsigned seed)
{
    start_default();
    return put_object(key, n, seed);
}

void sized_client(unsigned concurrency, size_t chunk_bytes)
{
    struct sf_s3_options o;
    opts_init(&o);
    o.concurrency = concurrency;
    o.chunk_bytes = chunk_bytes;
    client(&o);
}

sf_status fetch_sync(const char *url, const struct sf_fetch_options *o, struct sf_fetch **f,
                     struct sf_fetch_progress *p)
{
    sf_status st = sf_fetch_start(s3, url, o, f);
    if (st != SF_OK)
        return st;
    cr_assert(*f);
    return sf_fetch_wait(*f, ~0ull, -1, p);
}

void expect_fetch_fails(const char *url, const struct sf_fetch_options *o, sf_status want,
                        const char *frag)
{
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync(url, o, &f, &p);
    cr_expect_eq(st, want, "%s: %s, want %s", url, sf_status_name(st), sf_status_name(want));
    cr_expect(strstr(sf_fetch_errmsg(f), frag), "%s: message: %s", url, sf_fetch_errmsg(f));
    sf_fetch_destroy(f);
}

void expect_fetch_whole(const char *key, const unsigned char *want, size_t n,
                        struct sf_fetch_progress *p)
{
    char url[700];
    snprintf(url, sizeof(url), "s3://bucket/%s", key);
    struct sf_fetch *f = NULL;
    sf_status st = fetch_sync(url, NULL, &f, p);
    cr_assert_eq(st, SF_OK, "%s: %s: %s", url, sf_status_name(st), f ? sf_fetch_errmsg(f) : "");
    cr_assert(p->done);
    cr_expect_eq(p->total, n);
    cr_expect_eq(p->contiguous, n);
    cr_expect_eq(p->received, n);
    unsigned char *d = sf_fetch_data(f);
    cr_assert(d, "no engine buffer");
    expect_same_bytes(d, want, n);
    sf_fetch_destroy(f);
}

void expect_put_and_fetch(const char *key, size_t n, unsigned seed, struct sf_fetch_progress *p)
{
    unsigned char *want = put_object(key, n, seed);
    expect_fetch_whole(key, want, n, p);
    free(want);
}

struct sf_s3_stats client_stats(void)
{
    struct sf_s3_stats s;
    sf_s3_get_stats(s3, &s);
    return s;
}
