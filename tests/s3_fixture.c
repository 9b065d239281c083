/* The s3 suite's fixture (s3_fixture.h). */
#include "s3_fixture.h"
#include "support/spawn.h"

#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct mock_proc srv;
char *tmp;
char root[600];

/* ------------------------------------------------------------ environment */

void make_root(void)
{
    tmp = mock_env_root(root, sizeof(root));
}

void start_mock(const char *const *extra)
{
    make_root();
    mock_env_start(&srv, root, extra);
}

void s3_teardown(void)
{
    mock_env_stop(&srv, &tmp, &s3);
}

/* ------------------------------------------------------------ mock admin */

cJSON *mock_stats(void)
{
    return mock_env_stats(&srv);
}

double jnum(const cJSON *j, const char *a, const char *b, const char *c)
{
    return mock_env_jnum(j, a, b, c, NULL);
}

double mock_requests(void)
{
    cJSON *j = mock_stats();
    double n = jnum(j, "requests", NULL, NULL);
    cJSON_Delete(j);
    return n;
}

/* ------------------------------------------------------------ data and client */

unsigned char *put_object(const char *key, size_t n, unsigned seed)
{
    return mock_env_put(root, key, n, seed);
}

void put_small(const char *key, size_t n)
{
    free(put_object(key, n, (unsigned)n));
}

void opts_init(struct sf_s3_options *o)
{
    mock_env_s3_fast(o, srv.url, 4, 256 * 1024);
    o->connect_timeout_ms = 5000;
}

void local_client(void)
{
    make_root();
    struct sf_s3_options o;
    opts_init(&o);
    o.endpoint_url = "http://127.0.0.1:1"; /* never contacted */
    client(&o);
}

const char *errmsg(void)
{
    static char buf[1024];
    return sf_s3_errmsg(s3, buf, sizeof(buf));
}

sf_status fetch_whole(const char *url, const void *want, size_t n)
{
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(s3, url, NULL, &f);
    if (st != SF_OK)
        return st;
    struct sf_fetch_progress p;
    st = sf_fetch_wait(f, ~0ull, -1, &p);
    if (st == SF_OK) {
        cr_expect_eq(p.total, n, "%s", url);
        cr_expect(sf_fetch_data(f) && memcmp(sf_fetch_data(f), want, n) == 0, "%s: bytes differ",
                  url);
    }
    sf_fetch_destroy(f);
    return st;
}

void expect_stat_fails(const char *url, sf_status want, const char *const *words)
{
    struct sf_object_info info;
    sf_status st = sf_s3_stat(s3, url, &info);
    cr_expect_eq(st, want, "%s: %s", sf_status_name(st), errmsg());
    for (; *words; words++)
        cr_expect(strstr(errmsg(), *words), "message: %s", errmsg());
    if (st == SF_OK)
        sf_object_info_clear(&info);
}

void expect_fetch_fails(const char *url, sf_status want, const char *const *words)
{
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(s3, url, NULL, &f);
    if (st == SF_OK)
        st = sf_fetch_wait(f, SF_SIZE_UNKNOWN, -1, NULL);
    cr_expect_eq(st, want, "%s", sf_status_name(st));
    const char *m = f ? sf_fetch_errmsg(f) : errmsg();
    for (; *words; words++)
        cr_expect(strstr(m, *words), "message: %s", m);
    sf_fetch_destroy(f);
}

void expect_no_request_refused(void)
{
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "status", "403", NULL), 0, "a signature did not match");
    cr_expect_eq(jnum(j, "status", "400", NULL), 0);
    cJSON_Delete(j);
}

void put_shards(const char *prefix, int count, const int *skip, char (*etags)[35])
{
    for (int i = 0; i < count; i++) {
        int skipped = 0;
        for (const int *s = skip; s && *s >= 0; s++)
            skipped |= *s == i;
        if (skipped)
            continue;
        char key[128];
        snprintf(key, sizeof(key), "%s%03d.tar", prefix, i);
        unsigned char *d = put_object(key, 100 + (size_t)i, (unsigned)i);
        if (etags)
            mock_env_etag(d, 100 + (size_t)i, etags[i]);
        free(d);
    }
}

int cli_run_argv(const char *tag, const char *const *argv)
{
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    char out[800], err[800];
    snprintf(out, sizeof(out), "%s/%s.out", tmp, tag);
    snprintf(err, sizeof(err), "%s/%s.err", tmp, tag);
    int rc = test_run(argv, out, err);
    cr_assert(rc >= 0, "%s did not run", argv[0]);
    return rc;
}

void cli_argv(const char *const *args, const char **argv, int cap)
{
    int n = 0;
    argv[n++] = SF_CLI_BIN;
    argv[n++] = args[0];
    argv[n++] = "--endpoint-url";
    argv[n++] = srv.url;
    for (int i = 1; args[i] && n < cap - 1; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
}

int cli_run(const char *tag, const char *const *args)
{
    const char *argv[32];
    cli_argv(args, argv, 32);
    return cli_run_argv(tag, argv);
}

const char *cli_output(const char *tag, const char *ext)
{
    static char buf[1 << 16];
    char path[800];
    snprintf(path, sizeof(path), "%s/%s.%s", tmp, tag, ext);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}
