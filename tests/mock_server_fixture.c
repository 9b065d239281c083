/* The mock_server suites' fixture (mock_server_fixture.h). */
#include "mock_server_fixture.h"
#include "support/mock_env.h"
#include "s3/sigv4.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/test_cert.h"

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const struct s3_creds creds = {"test-ak", "test-secret", NULL, NULL};

char *root;
char *tmp;
struct mock_proc srv;

void make_root(void)
{
    tmp = test_tmpdir_with_root(&root);
    cr_assert(tmp);
    cr_assert(test_make_dir(root, "bucket1", NULL, 0) == 0);
    cr_assert(test_write_file(tmp, "secret.txt", "top secret", 10) == 0);
}

void start_with(const char *const *extra)
{
    make_root();
    const char *args[32] = {"--access-key", "test-ak", "--secret-key", "test-secret"};
    size_t n = 4;
    for (size_t i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cr_assert(mock_proc_start(&srv, root, args) == 0, "the mock server did not start");
}

void start_with_k(const char *const *extra)
{
    start_with(extra);
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
}

void mock_server_setup(void)
{
    start_with(NULL);
}

void mock_server_teardown(void)
{
    mock_env_stop(&srv, &tmp, NULL);
    free(root);
    root = NULL;
}

long call(const char *method, const char *target, const char *const *headers, struct s3_resp *r)
{
    struct s3_call c = {.method = method, .target = target, .headers = headers, .creds = &creds};
    s3_call(srv.url, &c, r);
    return r->status;
}

void put_object(const char *key_path, const void *data, size_t n)
{
    struct s3_call c = {
        .method = "PUT", .target = key_path, .body = data, .body_len = n, .creds = &creds};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    cr_assert_eq(r.status, 200, "PUT %s: %ld %s", key_path, r.status, sf__strbuf_str(&r.body));
    s3_resp_free(&r);
}

void expect_error(struct s3_resp *r, long status, const char *code)
{
    char got[128] = "";
    s3_xml_value(r, "Code", got, sizeof(got));
    cr_expect_eq(r->status, status, "status %ld, want %ld (%s)", r->status, status,
                 sf__strbuf_str(&r->body));
    cr_expect_str_eq(got, code);
}

cJSON *stats(void)
{
    struct s3_resp r;
    struct s3_call c = {.method = "GET", .target = "/_mock/stats"};
    s3_call(srv.url, &c, &r);
    cr_assert_eq(r.status, 200);
    cJSON *j = cJSON_Parse(sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_assert(j);
    return j;
}

double key_status(cJSON *st, const char *key, const char *status)
{
    cJSON *k = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(st, "keys"), key);
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(k, "status"), status);
    return v ? v->valuedouble : 0;
}

void expect_call_error(const char *method, const char *target, const char *const *headers,
                       long status, const char *code)
{
    struct s3_resp r;
    call(method, target, headers, &r);
    expect_error(&r, status, code);
    s3_resp_free(&r);
}

void expect_sent_error(const struct s3_call *c, long status, const char *code)
{
    struct s3_resp r;
    s3_call(srv.url, c, &r);
    expect_error(&r, status, code);
    s3_resp_free(&r);
}

void expect_header_error(const char *method, const char *target, const char *header, long status,
                         const char *code)
{
    const char *h[] = {header, NULL};
    expect_call_error(method, target, h, status, code);
}

void expect_get_has(const char *target, const char *needle)
{
    struct s3_resp r;
    cr_assert_eq(call("GET", target, NULL, &r), 200, "GET %s", target);
    cr_expect(strstr(sf__strbuf_str(&r.body), needle), "GET %s: %s", target,
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);
}

unsigned char *filled(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n);
    cr_assert(p);
    test_fill(p, n, seed);
    return p;
}

double group_count(cJSON *st, const char *group, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(st, group), name);
    return v ? v->valuedouble : 0;
}

long admin_post(const char *target, const char *body)
{
    struct s3_call c = {
        .method = "POST", .target = target, .body = body, .body_len = body ? strlen(body) : 0};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    s3_resp_free(&r);
    return r.status;
}

long plain(const char *method, const char *target, const char *const *headers, struct s3_resp *r)
{
    struct s3_call c = {.method = method, .target = target, .headers = headers};
    s3_call(srv.url, &c, r);
    return r->status;
}
