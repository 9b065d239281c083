/* The mock S3 server, driven over HTTP: every test starts its own server on
 * a free port with a fresh root directory and stops it. */
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

static const struct s3_creds creds = {"test-ak", "test-secret", NULL, NULL};

static char *root; /* server root */
static char *tmp;  /* parent of root, holds a file outside it */
static struct mock_proc srv;

/* tmp/root with an empty bucket1, and tmp/secret.txt outside the root. */
static void make_root(void)
{
    tmp = test_tmpdir();
    cr_assert(tmp);
    char path[600];
    snprintf(path, sizeof(path), "%s/root", tmp);
    root = strdup(path);
    cr_assert(mkdir(root, 0755) == 0);
    snprintf(path, sizeof(path), "%s/root/bucket1", tmp);
    cr_assert(mkdir(path, 0755) == 0);
    cr_assert(test_write_file(tmp, "secret.txt", "top secret", 10) == 0);
}

static void start_with(const char *const *extra)
{
    make_root();
    const char *args[32] = {"--access-key", "test-ak", "--secret-key", "test-secret"};
    size_t n = 4;
    for (size_t i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cr_assert(mock_proc_start(&srv, root, args) == 0, "the mock server did not start");
}

static void setup(void)
{
    start_with(NULL);
}

static void teardown(void)
{
    if (srv.pid > 0)
        mock_proc_stop(&srv);
    test_rmtree(tmp);
    free(tmp);
    free(root);
    tmp = root = NULL;
}

static long call(const char *method, const char *target, const char *const *headers,
                 struct s3_resp *r)
{
    struct s3_call c = {.method = method, .target = target, .headers = headers, .creds = &creds};
    s3_call(srv.url, &c, r);
    return r->status;
}

static void put_object(const char *key_path, const void *data, size_t n)
{
    struct s3_call c = {
        .method = "PUT", .target = key_path, .body = data, .body_len = n, .creds = &creds};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    cr_assert_eq(r.status, 200, "PUT %s: %ld %s", key_path, r.status, sf__strbuf_str(&r.body));
    s3_resp_free(&r);
}

static void expect_error(struct s3_resp *r, long status, const char *code)
{
    char got[128] = "";
    s3_xml_value(r, "Code", got, sizeof(got));
    cr_expect_eq(r->status, status, "status %ld, want %ld (%s)", r->status, status,
                 sf__strbuf_str(&r->body));
    cr_expect_str_eq(got, code);
}

static cJSON *stats(void)
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

static double key_status(cJSON *st, const char *key, const char *status)
{
    cJSON *k = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(st, "keys"), key);
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(k, "status"), status);
    return v ? v->valuedouble : 0;
}

/* One signed request that must fail with this status and S3 error code. */
static void expect_call_error(const char *method, const char *target, const char *const *headers,
                              long status, const char *code)
{
    struct s3_resp r;
    call(method, target, headers, &r);
    expect_error(&r, status, code);
    s3_resp_free(&r);
}

/* POST to an admin endpoint of the mock; returns the HTTP status. */
static long admin_post(const char *target, const char *body)
{
    struct s3_call c = {
        .method = "POST", .target = target, .body = body, .body_len = body ? strlen(body) : 0};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    s3_resp_free(&r);
    return r.status;
}

/* The first entry of a listing page: a common prefix if any, else a key. */
static void first_listed(const struct s3_resp *r, char out[64])
{
    const char *b = sf__strbuf_str(&r->body);
    const char *cp = strstr(b, "<CommonPrefixes><Prefix>");
    const char *k = strstr(b, "<Key>");
    out[0] = '\0';
    if (cp)
        sscanf(cp + 24, "%63[^<]", out);
    else if (k)
        sscanf(k + 5, "%63[^<]", out);
}

TestSuite(mock_server, .init = setup, .fini = teardown, .timeout = 60);
/* Tests that start the server with their own flags. */
TestSuite(mock_server_cfg, .fini = teardown, .timeout = 60);

Test(mock_server, stops_cleanly_on_sigterm)
{
    cr_assert_gt(srv.port, 0);
    cr_assert_eq(mock_proc_stop(&srv), 0, "exit status after SIGTERM");
}

Test(mock_server, get_full_and_every_range_form)
{
    char data[1000];
    test_fill(data, sizeof(data), 7);
    cr_assert(test_write_file(root, "bucket1/obj.bin", data, sizeof(data)) == 0);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1/obj.bin", NULL, &r), 200);
    cr_assert_eq(r.body.len, 1000);
    cr_assert(memcmp(r.body.data, data, 1000) == 0);
    s3_resp_free(&r);

    struct {
        const char *range;
        size_t start, len;
        const char *cr;
    } cases[] = {
        {"Range: bytes=10-99", 10, 90, "bytes 10-99/1000"},
        {"Range: bytes=900-", 900, 100, "bytes 900-999/1000"},
        {"Range: bytes=-50", 950, 50, "bytes 950-999/1000"},
        {"Range: bytes=990-5000", 990, 10, "bytes 990-999/1000"},
        {"Range: bytes=-5000", 0, 1000, "bytes 0-999/1000"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *h[] = {cases[i].range, NULL};
        cr_assert_eq(call("GET", "/bucket1/obj.bin", h, &r), 206, "%s", cases[i].range);
        char cr[128] = "";
        s3_resp_header(&r, "Content-Range", cr, sizeof(cr));
        cr_expect_str_eq(cr, cases[i].cr);
        cr_assert_eq(r.body.len, cases[i].len, "%s", cases[i].range);
        cr_expect(memcmp(r.body.data, data + cases[i].start, cases[i].len) == 0);
        s3_resp_free(&r);
    }
}

Test(mock_server, unsatisfiable_range_is_416_and_malformed_range_is_ignored)
{
    cr_assert(test_write_file(root, "bucket1/small", "0123456789", 10) == 0);
    struct s3_resp r;
    const char *h1[] = {"Range: bytes=10-20", NULL};
    expect_call_error("GET", "/bucket1/small", h1, 416, "InvalidRange");
    const char *h2[] = {"Range: bytes=-0", NULL};
    expect_call_error("GET", "/bucket1/small", h2, 416, "InvalidRange");
    const char *h3[] = {"Range: bytes=5-2", NULL};
    cr_assert_eq(call("GET", "/bucket1/small", h3, &r), 200);
    cr_assert_eq(r.body.len, 10);
    s3_resp_free(&r);
    const char *h4[] = {"Range: bytes=0-1,4-5", NULL};
    cr_assert_eq(call("GET", "/bucket1/small", h4, &r), 200);
    s3_resp_free(&r);
}

Test(mock_server, etag_is_quoted_md5_and_conditionals_hold)
{
    const char *content = "the quick brown fox";
    cr_assert(test_write_file(root, "bucket1/fox", content, strlen(content)) == 0);
    unsigned char md[16];
    unsigned int mdl;
    EVP_Digest(content, strlen(content), md, &mdl, EVP_md5(), NULL);
    char want[40] = "\"";
    sf__hex_encode(md, 16, want + 1);
    strcat(want, "\"");

    struct s3_resp r;
    cr_assert_eq(call("HEAD", "/bucket1/fox", NULL, &r), 200);
    char etag[64] = "", len[32] = "";
    s3_resp_header(&r, "ETag", etag, sizeof(etag));
    s3_resp_header(&r, "Content-Length", len, sizeof(len));
    cr_assert_str_eq(etag, want);
    cr_assert_eq(atoi(len), (int)strlen(content));
    cr_assert_eq(r.body.len, 0);
    s3_resp_free(&r);

    char hdr[128];
    snprintf(hdr, sizeof(hdr), "If-Match: %s", want);
    const char *ok[] = {hdr, NULL};
    cr_assert_eq(call("GET", "/bucket1/fox", ok, &r), 200);
    s3_resp_free(&r);
    const char *bad[] = {"If-Match: \"0123456789abcdef0123456789abcdef\"", NULL};
    expect_call_error("GET", "/bucket1/fox", bad, 412, "PreconditionFailed");
    snprintf(hdr, sizeof(hdr), "If-None-Match: %s", want);
    const char *inm[] = {hdr, NULL};
    cr_assert_eq(call("GET", "/bucket1/fox", inm, &r), 304);
    cr_assert_eq(r.body.len, 0);
    s3_resp_free(&r);
}

Test(mock_server, put_get_delete_round_trip)
{
    size_t n = 300 * 1024;
    char *data = malloc(n);
    test_fill(data, n, 3);
    put_object("/bucket1/deep/dir/obj.bin", data, n);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1/deep/dir/obj.bin", NULL, &r), 200);
    cr_assert_eq(r.body.len, n);
    cr_assert(memcmp(r.body.data, data, n) == 0);
    s3_resp_free(&r);
    cr_assert_eq(call("DELETE", "/bucket1/deep/dir/obj.bin", NULL, &r), 204);
    s3_resp_free(&r);
    expect_call_error("GET", "/bucket1/deep/dir/obj.bin", NULL, 404, "NoSuchKey");
    char dir[700];
    snprintf(dir, sizeof(dir), "%s/bucket1/deep", root);
    cr_expect(access(dir, F_OK) != 0, "empty parent directories are removed");
    /* no temporary upload file is left behind */
    struct s3_resp l;
    cr_assert_eq(call("GET", "/bucket1?list-type=2", NULL, &l), 200);
    char kc[16];
    s3_xml_value(&l, "KeyCount", kc, sizeof(kc));
    cr_expect_str_eq(kc, "0");
    s3_resp_free(&l);
    free(data);
}

Test(mock_server, put_with_wrong_payload_hash_is_refused_and_not_stored)
{
    struct s3_call c = {.method = "PUT",
                        .target = "/bucket1/x",
                        .body = "abc",
                        .body_len = 3,
                        .creds = &creds,
                        .payload_hash = SF__EMPTY_SHA256};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 400, "XAmzContentSHA256Mismatch");
    s3_resp_free(&r);
    char path[700];
    snprintf(path, sizeof(path), "%s/bucket1/x", root);
    cr_expect(access(path, F_OK) != 0);
    /* UNSIGNED-PAYLOAD is accepted */
    struct s3_call u = {.method = "PUT",
                        .target = "/bucket1/x",
                        .body = "abc",
                        .body_len = 3,
                        .creds = &creds,
                        .unsigned_payload = 1};
    s3_call(srv.url, &u, &r);
    cr_expect_eq(r.status, 200);
    s3_resp_free(&r);
}

Test(mock_server, list_v2_pages_through_2500_keys)
{
    char key[64];
    for (int i = 0; i < 2500; i++) {
        snprintf(key, sizeof(key), "bucket1/k/%05d", i);
        cr_assert(test_write_file(root, key, "x", 1) == 0);
    }
    char token[4096] = "";
    int seen = 0, pages = 0;
    for (;;) {
        char target[4200];
        if (*token) {
            struct sf__strbuf enc;
            sf__strbuf_init(&enc, 0);
            /* tokens are opaque; encode as a client must */
            for (const char *p = token; *p; p++)
                sf__strbuf_printf(&enc,
                                  (*p >= '0' && *p <= '9') || (*p >= 'A' && *p <= 'Z') ||
                                          (*p >= 'a' && *p <= 'z')
                                      ? "%c"
                                      : "%%%02X",
                                  (unsigned char)*p);
            snprintf(target, sizeof(target), "/bucket1?list-type=2&continuation-token=%s",
                     sf__strbuf_str(&enc));
            sf__strbuf_free(&enc);
        } else {
            snprintf(target, sizeof(target), "/bucket1?list-type=2");
        }
        struct s3_resp r;
        cr_assert_eq(call("GET", target, NULL, &r), 200, "%s", sf__strbuf_str(&r.body));
        pages++;
        const char *p = sf__strbuf_str(&r.body);
        while ((p = strstr(p, "<Key>")) != NULL) {
            p += 5;
            char want[32];
            snprintf(want, sizeof(want), "k/%05d<", seen);
            cr_assert(strncmp(p, want, strlen(want)) == 0, "key %d out of order", seen);
            seen++;
        }
        char trunc[16] = "";
        s3_xml_value(&r, "IsTruncated", trunc, sizeof(trunc));
        token[0] = '\0';
        if (strcmp(trunc, "true") == 0)
            cr_assert(s3_xml_value(&r, "NextContinuationToken", token, sizeof(token)) == 0);
        s3_resp_free(&r);
        if (!*token)
            break;
        cr_assert_lt(pages, 10);
    }
    cr_expect_eq(seen, 2500);
    cr_expect_eq(pages, 3);
}

Test(mock_server, list_delimiter_rolls_up_common_prefixes_across_pages)
{
    const char *keys[] = {"a/1", "a/2", "b/1", "c", "d/x/1", "d/y"};
    for (size_t i = 0; i < 6; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "bucket1/%s", keys[i]);
        cr_assert(test_write_file(root, rel, "z", 1) == 0);
    }
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1?list-type=2&delimiter=%2F", NULL, &r), 200);
    const char *b = sf__strbuf_str(&r.body);
    cr_expect(strstr(b, "<CommonPrefixes><Prefix>a/</Prefix></CommonPrefixes>"));
    cr_expect(strstr(b, "<CommonPrefixes><Prefix>b/</Prefix></CommonPrefixes>"));
    cr_expect(strstr(b, "<CommonPrefixes><Prefix>d/</Prefix></CommonPrefixes>"));
    cr_expect(strstr(b, "<Key>c</Key>"));
    cr_expect(!strstr(b, "<Key>a/1</Key>"));
    char kc[16];
    s3_xml_value(&r, "KeyCount", kc, sizeof(kc));
    cr_expect_str_eq(kc, "4");
    s3_resp_free(&r);

    /* One entry per page: a/, b/, c, d/ then the end. */
    const char *want[] = {"a/", "b/", "c", "d/"};
    char token[512] = "";
    for (int i = 0; i < 4; i++) {
        char target[700];
        snprintf(target, sizeof(target), "/bucket1?list-type=2&delimiter=%%2F&max-keys=1%s%s",
                 *token ? "&continuation-token=" : "", token);
        cr_assert_eq(call("GET", target, NULL, &r), 200);
        char got[64];
        first_listed(&r, got);
        cr_expect_str_eq(got, want[i], "page %d", i);
        char trunc[16] = "";
        s3_xml_value(&r, "IsTruncated", trunc, sizeof(trunc));
        token[0] = '\0';
        s3_xml_value(&r, "NextContinuationToken", token, sizeof(token));
        cr_expect_str_eq(trunc, i < 3 ? "true" : "false", "page %d", i);
        s3_resp_free(&r);
    }

    cr_assert_eq(call("GET", "/bucket1?list-type=2&prefix=d%2F&delimiter=%2F", NULL, &r), 200);
    b = sf__strbuf_str(&r.body);
    cr_expect(strstr(b, "<Prefix>d/x/</Prefix>"));
    cr_expect(strstr(b, "<Key>d/y</Key>"));
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?list-type=2&start-after=c", NULL, &r), 200);
    b = sf__strbuf_str(&r.body);
    cr_expect(!strstr(b, "<Key>c</Key>") && strstr(b, "<Key>d/x/1</Key>"));
    s3_resp_free(&r);
}

Test(mock_server, special_keys_are_escaped_or_url_encoded)
{
    put_object("/bucket1/sp%20ace%2Bplus%26amp%25pct%C3%A9", "1", 1);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1/sp%20ace%2Bplus%26amp%25pct%C3%A9", NULL, &r), 200);
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?list-type=2", NULL, &r), 200);
    cr_expect(strstr(sf__strbuf_str(&r.body), "<Key>sp ace+plus&amp;amp%pct\xC3\xA9</Key>"), "%s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?list-type=2&encoding-type=url", NULL, &r), 200);
    cr_expect(strstr(sf__strbuf_str(&r.body), "<Key>sp%20ace%2Bplus%26amp%25pct%C3%A9</Key>"), "%s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);
}

Test(mock_server, buckets_are_created_listed_and_deleted)
{
    struct s3_resp r;
    cr_assert_eq(call("PUT", "/newbucket", NULL, &r), 200);
    s3_resp_free(&r);
    expect_call_error("PUT", "/newbucket", NULL, 409, "BucketAlreadyOwnedByYou");
    cr_assert_eq(call("GET", "/", NULL, &r), 200);
    const char *b = sf__strbuf_str(&r.body);
    const char *p1 = strstr(b, "<Name>bucket1</Name>"), *p2 = strstr(b, "<Name>newbucket</Name>");
    cr_expect(p1 && p2 && p1 < p2, "%s", b);
    s3_resp_free(&r);
    put_object("/newbucket/k", "v", 1);
    expect_call_error("DELETE", "/newbucket", NULL, 409, "BucketNotEmpty");
    cr_assert_eq(call("DELETE", "/newbucket/k", NULL, &r), 204);
    s3_resp_free(&r);
    cr_assert_eq(call("DELETE", "/newbucket", NULL, &r), 204);
    s3_resp_free(&r);
    expect_call_error("GET", "/newbucket?list-type=2", NULL, 404, "NoSuchBucket");
    expect_call_error("GET", "/nobucket/key", NULL, 404, "NoSuchBucket");
    expect_call_error("PUT", "/Bad_Bucket", NULL, 400, "InvalidBucketName");
}

Test(mock_server, authentication_failures_have_their_s3_codes)
{
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    struct s3_call c = {.method = "GET", .target = "/bucket1/k"};
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "AccessDenied");
    s3_resp_free(&r);

    struct s3_creds wrong_secret = {"test-ak", "not-the-secret", NULL, NULL};
    c.creds = &wrong_secret;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "SignatureDoesNotMatch");
    cr_expect(strstr(sf__strbuf_str(&r.body), "<CanonicalRequest>GET\n/bucket1/k\n"));
    cr_expect(!strstr(sf__strbuf_str(&r.body), "test-secret"), "the secret never leaks");
    s3_resp_free(&r);

    struct s3_creds wrong_key = {"other-ak", "test-secret", NULL, NULL};
    c.creds = &wrong_key;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "InvalidAccessKeyId");
    s3_resp_free(&r);

    struct s3_creds wrong_region = {"test-ak", "test-secret", NULL, "eu-west-1"};
    c.creds = &wrong_region;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 400, "AuthorizationHeaderMalformed");
    s3_resp_free(&r);

    c.creds = &creds;
    c.when = time(NULL) - 16 * 60;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "RequestTimeTooSkewed");
    s3_resp_free(&r);
    c.when = time(NULL) - 14 * 60;
    s3_call(srv.url, &c, &r);
    cr_expect_eq(r.status, 200, "14 minutes of skew is within the window");
    s3_resp_free(&r);

    /* extra x-amz-meta headers are signed and verified like the others */
    c.when = 0;
    const char *tampered[] = {"x-amz-meta-a: 1", NULL};
    c.headers = tampered;
    s3_call(srv.url, &c, &r);
    cr_expect_eq(r.status, 200, "signed extra header verifies");
    s3_resp_free(&r);
}

Test(mock_server, tampered_request_fails_signature)
{
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    cr_assert(test_write_file(root, "bucket1/j", "w", 1) == 0);
    /* Sign for /bucket1/k, then send it to /bucket1/j by hand. */
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, "test-ak", "test-secret", NULL, "us-east-1", "s3");
    struct sf__header h[] = {{"host", srv.host}};
    struct sf__sigv4_request req = {.method = "GET",
                                    .path = "/bucket1/k",
                                    .headers = h,
                                    .n_headers = 1,
                                    .payload_hash = SF__EMPTY_SHA256};
    char amz_date[SF__AMZ_DATE_LEN + 1];
    struct sf__header extra[3];
    size_t n_extra = 0;
    struct sf__sigv4_result res = {0};
    cr_assert(sf__sigv4_sign_request(&s, &req, time(NULL), amz_date, extra, &n_extra, &res) ==
              SF_OK);
    char l1[128], l2[128], l3[512];
    snprintf(l1, sizeof(l1), "x-amz-date: %s", amz_date);
    snprintf(l2, sizeof(l2), "x-amz-content-sha256: %s", SF__EMPTY_SHA256);
    snprintf(l3, sizeof(l3), "Authorization: %s", res.authorization);
    const char *hdrs[] = {l1, l2, l3, NULL};
    struct s3_call c = {.method = "GET", .target = "/bucket1/j", .headers = hdrs};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "SignatureDoesNotMatch");
    s3_resp_free(&r);
    c.target = "/bucket1/k";
    s3_call(srv.url, &c, &r);
    cr_expect_eq(r.status, 200, "the untampered request passes");
    s3_resp_free(&r);
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
}

Test(mock_server, keys_never_escape_the_root)
{
    const char *targets[] = {
        "/bucket1/../secret.txt", "/bucket1/..%2F..%2Fsecret.txt", "/bucket1/a/../../../secret.txt",
        "/bucket1//etc/passwd",   "/bucket1/%2Fetc%2Fpasswd",      "/bucket1/.sfmock-upload-x",
        "/bucket1/a%00b",
    };
    for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++) {
        struct s3_resp r;
        long st = call("GET", targets[i], NULL, &r);
        cr_expect(st == 400 || st == 404, "%s answered %ld", targets[i], st);
        cr_expect(!strstr(sf__strbuf_str(&r.body), "top secret"), "%s leaked", targets[i]);
        s3_resp_free(&r);
    }
    struct s3_resp r;
    call("PUT", "/bucket1/..%2F..%2Fescaped", NULL, &r);
    cr_expect_eq(r.status, 400);
    s3_resp_free(&r);
    char path[700];
    snprintf(path, sizeof(path), "%s/escaped", tmp);
    cr_expect(access(path, F_OK) != 0);
}

Test(mock_server, forced_faults_by_header)
{
    char data[4096];
    test_fill(data, sizeof(data), 9);
    cr_assert(test_write_file(root, "bucket1/f", data, sizeof(data)) == 0);
    struct s3_resp r;
    const char *h500[] = {"x-sfmock-fault: 500", NULL};
    expect_call_error("GET", "/bucket1/f", h500, 500, "InternalError");
    const char *h503[] = {"x-sfmock-fault: 503", NULL};
    expect_call_error("GET", "/bucket1/f", h503, 503, "SlowDown");

    const char *reset[] = {"x-sfmock-fault: reset=1000", NULL};
    call("GET", "/bucket1/f", reset, &r);
    cr_expect_eq(r.curl_code, CURLE_RECV_ERROR, "the client sees a reset, got curl code %d",
                 r.curl_code);
    cr_expect_eq(r.body.len, 1000, "the body stops after the forced byte count");
    cr_expect(memcmp(r.body.data, data, 1000) == 0);
    s3_resp_free(&r);

    /* Far into a large body, still exactly the forced count: nothing queued
     * in the kernel is lost to the reset. */
    size_t big_n = 3u << 20;
    char *big = malloc(big_n);
    test_fill(big, big_n, 10);
    cr_assert(test_write_file(root, "bucket1/big", big, big_n) == 0);
    const char *reset_big[] = {"x-sfmock-fault: reset=2500000", NULL};
    call("GET", "/bucket1/big", reset_big, &r);
    cr_expect_eq(r.curl_code, CURLE_RECV_ERROR, "curl code %d", r.curl_code);
    cr_expect_eq(r.body.len, 2500000);
    cr_expect(r.body.len <= big_n && memcmp(r.body.data, big, r.body.len) == 0);
    s3_resp_free(&r);
    free(big);

    const char *no206[] = {"x-sfmock-fault: no206", "Range: bytes=0-9", NULL};
    cr_expect_eq(call("GET", "/bucket1/f", no206, &r), 200);
    cr_expect_eq(r.body.len, sizeof(data));
    s3_resp_free(&r);

    const char *nocr[] = {"x-sfmock-fault: no_content_range", "Range: bytes=0-9", NULL};
    cr_expect_eq(call("GET", "/bucket1/f", nocr, &r), 206);
    char cr[64];
    cr_expect(s3_resp_header(&r, "Content-Range", cr, sizeof(cr)) != 0);
    s3_resp_free(&r);

    char e1[64] = "", e2[64] = "";
    cr_expect_eq(call("HEAD", "/bucket1/f", NULL, &r), 200);
    s3_resp_header(&r, "ETag", e1, sizeof(e1));
    s3_resp_free(&r);
    const char *chg[] = {"x-sfmock-fault: etag_changed", NULL};
    cr_expect_eq(call("HEAD", "/bucket1/f", chg, &r), 200);
    s3_resp_header(&r, "ETag", e2, sizeof(e2));
    s3_resp_free(&r);
    cr_expect_str_neq(e1, e2);
    cr_expect_eq(strlen(e2), 34);

    const char *bad[] = {"x-sfmock-fault: explode", NULL};
    cr_expect_eq(call("GET", "/bucket1/f", bad, &r), 400);
    s3_resp_free(&r);

    cJSON *st = stats();
    cJSON *faults = cJSON_GetObjectItem(st, "faults");
    cr_expect_eq(cJSON_GetObjectItem(faults, "500")->valuedouble, 1);
    cr_expect_eq(cJSON_GetObjectItem(faults, "503")->valuedouble, 1);
    cr_expect_eq(cJSON_GetObjectItem(faults, "reset")->valuedouble, 2);
    cJSON_Delete(st);
}

Test(mock_server, queued_faults_fail_exactly_the_next_n_requests)
{
    cr_assert(test_write_file(root, "bucket1/q/obj", "payload", 7) == 0);
    cr_assert(test_write_file(root, "bucket1/other", "x", 1) == 0);
    struct s3_resp r;
    cr_assert_eq(admin_post("/_mock/fault?prefix=bucket1/q/&fault=503&count=2", NULL), 200);
    cr_expect_eq(call("GET", "/bucket1/other", NULL, &r), 200, "other prefixes are unaffected");
    s3_resp_free(&r);
    long want[] = {503, 503, 200, 200};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(call("GET", "/bucket1/q/obj", NULL, &r), want[i], "attempt %d", i + 1);
        s3_resp_free(&r);
    }
    cJSON *st = stats();
    cr_expect_eq(key_status(st, "bucket1/q/obj", "503"), 2);
    cr_expect_eq(key_status(st, "bucket1/q/obj", "200"), 2);
    cJSON *ops = cJSON_GetObjectItem(st, "operations");
    cr_expect_eq(cJSON_GetObjectItem(ops, "GetObject")->valuedouble, 5);
    cJSON_Delete(st);

    cr_assert_eq(admin_post("/_mock/reset", NULL), 200);
    st = stats();
    cr_expect_eq(cJSON_GetObjectItem(st, "requests")->valuedouble, 0);
    cJSON_Delete(st);
}

Test(mock_server, fault_rules_are_scoped_and_replaceable)
{
    cr_assert(test_write_file(root, "bucket1/bad/x", "x", 1) == 0);
    cr_assert(test_write_file(root, "bucket1/good/x", "x", 1) == 0);
    cr_assert_eq(admin_post("/_mock/faults", "prefix=bucket1/bad/,p500=1\n"), 200);
    struct s3_resp r;
    expect_call_error("GET", "/bucket1/bad/x", NULL, 500, "InternalError");
    cr_expect_eq(call("GET", "/bucket1/good/x", NULL, &r), 200);
    s3_resp_free(&r);

    cr_expect_eq(admin_post("/_mock/faults", "prefix=x,p500=2\n"), 400,
                 "probabilities above 1 are refused");
    call("GET", "/bucket1/bad/x", NULL, &r);
    cr_expect_eq(r.status, 500, "a refused rule set leaves the old one in place");
    s3_resp_free(&r);

    cr_expect_eq(admin_post("/_mock/faults", ""), 200);
    cr_expect_eq(call("GET", "/bucket1/bad/x", NULL, &r), 200, "rules cleared");
    s3_resp_free(&r);
}

/* The statuses of 40 GETs against a fresh server with a random 500 rule. */
static void fault_sequence(const char *seed, long out[40])
{
    char rule[] = "prefix=bucket1/,p500=0.5";
    const char *args[] = {"--seed", seed, "--fault", rule, NULL};
    start_with(args);
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    for (int i = 0; i < 40; i++) {
        struct s3_resp r;
        out[i] = call("GET", "/bucket1/k", NULL, &r);
        s3_resp_free(&r);
    }
    teardown();
}

Test(mock_server_cfg, random_faults_repeat_with_the_seed)
{
    long a[40], b[40], c[40];
    fault_sequence("42", a);
    fault_sequence("42", b);
    fault_sequence("43", c);
    int fails = 0, differ = 0;
    for (int i = 0; i < 40; i++) {
        cr_expect_eq(a[i], b[i], "request %d", i);
        cr_expect(a[i] == 200 || a[i] == 500);
        fails += a[i] == 500;
        differ += a[i] != c[i];
    }
    /* p = 0.5 over 40 draws: both outcomes occur (P(all same) = 2^-39). */
    cr_expect(fails > 0 && fails < 40, "%d failures", fails);
    cr_expect(differ > 0, "another seed gives another sequence");
}

Test(mock_server_cfg, rate_limit_answers_slowdown_above_the_rate)
{
    const char *args[] = {"--fault", "prefix=bucket1/hot/,rate_limit=2", NULL};
    start_with(args);
    cr_assert(test_write_file(root, "bucket1/hot/k", "v", 1) == 0);
    cr_assert(test_write_file(root, "bucket1/cold", "v", 1) == 0);
    int ok = 0, slow = 0;
    for (int i = 0; i < 40; i++) {
        struct s3_resp r;
        long st = call("GET", "/bucket1/hot/k", NULL, &r);
        if (st == 200)
            ok++;
        else if (st == 503) {
            char code[32] = "";
            s3_xml_value(&r, "Code", code, sizeof(code));
            cr_expect_str_eq(code, "SlowDown");
            slow++;
        }
        s3_resp_free(&r);
    }
    /* 40 back-to-back requests against a burst of 2 at 2/s: unless they take
     * 19 s, some are refused; the first two never are. */
    cr_expect_geq(ok, 2);
    cr_expect_gt(slow, 0);
    cr_expect_eq(ok + slow, 40);
    struct s3_resp r;
    cr_expect_eq(call("GET", "/bucket1/cold", NULL, &r), 200, "other prefixes are not limited");
    s3_resp_free(&r);
    cJSON *st = stats();
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(st, "faults"), "rate_limit")->valuedouble,
                 slow);
    cJSON_Delete(st);
}

Test(mock_server_cfg, stall_stops_the_body_midway)
{
    const char *args[] = {"--fault", "prefix=bucket1/slow,stall=1,stall_ms=20000", NULL};
    start_with(args);
    char data[65536];
    test_fill(data, sizeof(data), 5);
    cr_assert(test_write_file(root, "bucket1/slow", data, sizeof(data)) == 0);
    struct s3_call c = {
        .method = "GET", .target = "/bucket1/slow", .creds = &creds, .low_speed_time_s = 2};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    cr_expect_eq(r.curl_code, CURLE_OPERATION_TIMEDOUT, "the client sees no progress");
    cr_expect_eq(r.body.len, sizeof(data) / 2, "the stall starts halfway");
    cr_expect(memcmp(r.body.data, data, r.body.len) == 0);
    s3_resp_free(&r);
    /* the server still stops promptly with a stalled transfer open */
    cr_expect_eq(mock_proc_stop(&srv), 0);
}

Test(mock_server_cfg, bandwidth_cap_and_latency_slow_but_keep_the_body)
{
    const char *args[] = {"--fault", "prefix=bucket1/capped,bandwidth=200K,latency_ms=300", NULL};
    start_with(args);
    size_t n = 100 * 1024;
    char *data = malloc(n);
    test_fill(data, n, 11);
    cr_assert(test_write_file(root, "bucket1/capped", data, n) == 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1/capped", NULL, &r), 200);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_expect_eq(r.body.len, n);
    cr_expect(memcmp(r.body.data, data, n) == 0);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    /* A lower bound only (sleeps never end early): 300 ms latency + 0.5 s of
     * pacing. This checks the fault happens, not how fast anything is. */
    cr_expect_geq(s, 0.75, "took %.3f s", s);
    s3_resp_free(&r);
    free(data);
}

Test(mock_server_cfg, etag_changes_after_n_requests)
{
    const char *args[] = {"--fault", "prefix=bucket1/e,etag_change_after=2", NULL};
    start_with(args);
    cr_assert(test_write_file(root, "bucket1/e", "content", 7) == 0);
    char tags[4][64];
    for (int i = 0; i < 4; i++) {
        struct s3_resp r;
        cr_assert_eq(call("HEAD", "/bucket1/e", NULL, &r), 200);
        s3_resp_header(&r, "ETag", tags[i], sizeof(tags[i]));
        s3_resp_free(&r);
    }
    cr_expect_str_eq(tags[0], tags[1]);
    cr_expect_str_neq(tags[1], tags[2]);
    cr_expect_str_eq(tags[2], tags[3]);
    /* If-Match with the first ETag now fails: the object "changed". */
    char hdr[100];
    snprintf(hdr, sizeof(hdr), "If-Match: %s", tags[0]);
    const char *h[] = {hdr, "Range: bytes=0-1", NULL};
    expect_call_error("GET", "/bucket1/e", h, 412, "PreconditionFailed");
}

Test(mock_server_cfg, session_token_is_required_when_configured)
{
    const char *args[] = {"--session-token", "tok123", NULL};
    start_with(args);
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    expect_call_error("GET", "/bucket1/k", NULL, 403, "InvalidToken");
    struct s3_creds with = {"test-ak", "test-secret", "tok123", NULL};
    struct s3_call c = {.method = "GET", .target = "/bucket1/k", .creds = &with};
    s3_call(srv.url, &c, &r);
    cr_expect_eq(r.status, 200);
    s3_resp_free(&r);
}

Test(mock_server_cfg, anonymous_mode_serves_unsigned_but_checks_signed)
{
    const char *args[] = {"--anonymous", NULL};
    start_with(args);
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    struct s3_call c = {.method = "GET", .target = "/bucket1/k"};
    s3_call(srv.url, &c, &r);
    cr_expect_eq(r.status, 200);
    s3_resp_free(&r);
    struct s3_creds bad = {"test-ak", "nope", NULL, NULL};
    c.creds = &bad;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "SignatureDoesNotMatch");
    s3_resp_free(&r);
}

Test(mock_server, unsupported_operations_answer_not_implemented)
{
    expect_call_error("GET", "/bucket1/k?partNumber=1", NULL, 501, "NotImplemented");
    expect_call_error("GET", "/bucket1?versioning", NULL, 501, "NotImplemented");
    const char *copy[] = {"x-amz-copy-source: /bucket1/a", NULL};
    expect_call_error("PUT", "/bucket1/b", copy, 501, "NotImplemented");
}

Test(mock_server_cli, bad_command_lines_exit_non_zero, .timeout = 60)
{
    const char *cases[][4] = {
        {"--port", "70000", NULL},
        {"--fault", "p500=7", NULL},
        {"--fault", "nonsense=1", NULL},
        {"--bogus", NULL},
    };
    char *dir = test_tmpdir();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mock_proc p;
        cr_expect(mock_proc_start(&p, dir, cases[i]) != 0, "case %zu started", i);
    }
    struct mock_proc p;
    cr_expect(mock_proc_start(&p, "/nonexistent/root", NULL) != 0);
    test_rmtree(dir);
    free(dir);
}

Test(mock_server, list_v1_markers_page_through_common_prefixes)
{
    const char *keys[] = {"a/1", "a/2", "b/1", "c"};
    for (size_t i = 0; i < 4; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "bucket1/%s", keys[i]);
        cr_assert(test_write_file(root, rel, "z", 1) == 0);
    }
    const char *want[] = {"a/", "b/", "c"};
    char marker[256] = "";
    for (int i = 0; i < 3; i++) {
        char target[512];
        snprintf(target, sizeof(target), "/bucket1?delimiter=%%2F&max-keys=1&marker=%s", marker);
        struct s3_resp r;
        cr_assert_eq(call("GET", target, NULL, &r), 200);
        char got[64];
        first_listed(&r, got);
        cr_expect_str_eq(got, want[i], "page %d", i);
        char trunc[16] = "";
        s3_xml_value(&r, "IsTruncated", trunc, sizeof(trunc));
        cr_expect_str_eq(trunc, i < 2 ? "true" : "false", "page %d", i);
        marker[0] = '\0';
        if (i < 2) {
            char next[64] = "";
            cr_assert(s3_xml_value(&r, "NextMarker", next, sizeof(next)) == 0);
            /* "a/" -> "a%2F" */
            snprintf(marker, sizeof(marker), "%.*s%%2F", (int)strlen(next) - 1, next);
        }
        s3_resp_free(&r);
    }
}

Test(mock_server, fault_rules_apply_to_object_requests_only)
{
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    cr_assert_eq(admin_post("/_mock/faults", "p503=1\n"), 200);
    struct s3_resp r;
    cr_expect_eq(call("GET", "/bucket1?list-type=2", NULL, &r), 200, "listing is not faulted");
    s3_resp_free(&r);
    expect_call_error("GET", "/bucket1/k", NULL, 503, "SlowDown");
    expect_call_error("PUT", "/bucket1/k2", NULL, 503, "SlowDown");
}

Test(mock_server, queued_body_faults_wait_for_a_get)
{
    char data[2048];
    test_fill(data, sizeof(data), 4);
    cr_assert(test_write_file(root, "bucket1/b", data, sizeof(data)) == 0);
    struct s3_resp r;
    cr_assert_eq(admin_post("/_mock/fault?prefix=bucket1/b&fault=reset%3D100&count=1", NULL), 200);
    cr_expect_eq(call("HEAD", "/bucket1/b", NULL, &r), 200);
    s3_resp_free(&r);
    call("GET", "/bucket1/b", NULL, &r);
    cr_expect_eq(r.body.len, 100, "the reset was kept for the GET");
    s3_resp_free(&r);
    cr_expect_eq(call("GET", "/bucket1/b", NULL, &r), 200);
    cr_expect_eq(r.body.len, sizeof(data));
    s3_resp_free(&r);
}

/* Sends raw bytes on a fresh connection and reads whatever comes back. */
static void raw_exchange(unsigned port, const char *data, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        (void)!write(fd, data, n);
        shutdown(fd, SHUT_WR);
        char buf[4096];
        while (read(fd, buf, sizeof(buf)) > 0)
            ;
    }
    close(fd);
}

Test(mock_server, malformed_requests_never_take_the_server_down)
{
    cr_assert(test_write_file(root, "bucket1/k", "0123456789", 10) == 0);
    const char *fixed[] = {
        "GET /bucket1/k HTTP/1.1\r\nHost: x\r\nAuthorization: AWS4-HMAC-SHA256 \r\n\r\n",
        "GET /bucket1/k HTTP/1.1\r\nHost: x\r\nAuthorization: AWS4-HMAC-SHA256 Credential=a/b/c/d/"
        "aws4_request, SignedHeaders=, Signature=zz\r\n\r\n",
        "GET /bucket1/k HTTP/1.1\r\nHost: x\r\nRange: bytes=99999999999999999999999-1\r\n\r\n",
        "GET /%ZZ%/..%2f HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /bucket1?list-type=2&max-keys=-1&continuation-token=K0g HTTP/1.1\r\nHost: x\r\n\r\n",
        "PUT /bucket1/k HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nshort",
        "POST /_mock/faults HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\nbandwidth=nan\n",
        "POST /_mock/fault?fault=reset%3D-5 HTTP/1.1\r\nHost: x\r\n\r\n",
        "PUT /latest/api/token HTTP/1.1\r\nHost: x\r\n"
        "X-aws-ec2-metadata-token-ttl-seconds: 99999999999999999999999\r\n\r\n",
        "GET /latest/meta-data/iam/security-credentials/%ZZ HTTP/1.1\r\nHost: x\r\n"
        "X-aws-ec2-metadata-token: \r\n\r\n",
        "GET /bucket1/k HTTP/1.1\r\nHost: x\r\nx-amz-security-token: \r\n\r\n",
        "GARBAGE\r\n\r\n",
        "\r\n\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        raw_exchange(srv.port, fixed[i], strlen(fixed[i]));
    /* Random request lines and headers built from S3-ish pieces. */
    const char *pieces[] = {"GET ",
                            "PUT ",
                            "HEAD ",
                            "DELETE ",
                            "/",
                            "bucket1",
                            "/k",
                            "?",
                            "list-type=2",
                            "&",
                            "%",
                            "%2F",
                            "..",
                            "\r\n",
                            ": ",
                            "Range",
                            "bytes=",
                            "-",
                            "1",
                            "Authorization",
                            "AWS4-HMAC-SHA256",
                            "Credential=",
                            ",",
                            "x-sfmock-fault",
                            "reset=",
                            "HTTP/1.1"};
    unsigned long long x = 12345;
    char req[2048];
    for (int i = 0; i < 200; i++) {
        size_t len = 0;
        int parts = 3 + (int)(x % 30);
        for (int p = 0; p < parts; p++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            const char *piece = pieces[x % (sizeof(pieces) / sizeof(pieces[0]))];
            size_t pl = strlen(piece);
            if (len + pl + 5 >= sizeof(req))
                break;
            memcpy(req + len, piece, pl);
            len += pl;
        }
        memcpy(req + len, "\r\n\r\n", 4);
        raw_exchange(srv.port, req, len + 4);
    }
    struct s3_resp r;
    cr_expect_eq(call("GET", "/bucket1/k", NULL, &r), 200, "the server still answers");
    cr_expect_eq(r.body.len, 10);
    s3_resp_free(&r);
    cr_expect_eq(mock_proc_stop(&srv), 0, "and still exits cleanly");
}

/* ------------------------------------------------------------ credentials */

#define ROLES_PATH "/latest/meta-data/iam/security-credentials/"
#define TTL_HEADER "X-aws-ec2-metadata-token-ttl-seconds"

/* An unsigned request to the server under test. */
static long plain(const char *method, const char *target, const char *const *headers,
                  struct s3_resp *r)
{
    struct s3_call c = {.method = method, .target = target, .headers = headers};
    s3_call(srv.url, &c, r);
    return r->status;
}

/* The body of a 200 application/json answer, parsed. */
static cJSON *get_json(const char *target, const char *const *headers)
{
    struct s3_resp r;
    cr_assert_eq(plain("GET", target, headers, &r), 200, "GET %s: %ld %s", target, r.status,
                 sf__strbuf_str(&r.body));
    char ct[64] = "";
    s3_resp_header(&r, "Content-Type", ct, sizeof(ct));
    cr_expect_str_eq(ct, "application/json");
    cJSON *j = cJSON_Parse(sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_assert(j, "the answer is not JSON");
    return j;
}

static const char *json_str(const cJSON *j, const char *name)
{
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, name));
    cr_assert(v, "no string field %s", name);
    return v;
}

/* "YYYY-MM-DDTHH:MM:SSZ" as a time_t; -1 when malformed. */
static time_t parse_aws_time(const char *s)
{
    struct tm tm = {0};
    char z = 0;
    if (strlen(s) != 20 ||
        sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &z) != 7 ||
        z != 'Z')
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return timegm(&tm);
}

/* PUT /latest/api/token with this TTL; the token into out. */
static void imds_token(const char *ttl, char *out, size_t out_len)
{
    char hdr[96];
    snprintf(hdr, sizeof(hdr), TTL_HEADER ": %s", ttl);
    const char *h[] = {hdr, NULL};
    struct s3_resp r;
    cr_assert_eq(plain("PUT", "/latest/api/token", h, &r), 200, "%s", sf__strbuf_str(&r.body));
    cr_assert(r.body.len > 16 && r.body.len < out_len, "token of %zu bytes", r.body.len);
    memcpy(out, r.body.data, r.body.len);
    out[r.body.len] = '\0';
    char echoed[32] = "";
    s3_resp_header(&r, TTL_HEADER, echoed, sizeof(echoed));
    cr_expect_str_eq(echoed, ttl);
    s3_resp_free(&r);
}

/* GET with X-aws-ec2-metadata-token (none when token is NULL). */
static long imds_get(const char *target, const char *token, struct s3_resp *r)
{
    char hdr[256];
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", token ? token : "");
    const char *h[] = {hdr, NULL};
    return plain("GET", target, token ? h : NULL, r);
}

/* The IMDS credential document of role, through a fresh token. */
static cJSON *imds_credentials(const char *role)
{
    char tok[128], hdr[256], target[256];
    imds_token("60", tok, sizeof(tok));
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", tok);
    snprintf(target, sizeof(target), ROLES_PATH "%s", role);
    const char *h[] = {hdr, NULL};
    return get_json(target, h);
}

/* A signed GET with the key pair and token of a credential document. */
static long get_with(const cJSON *doc, const char *target, struct s3_resp *r)
{
    struct s3_creds c = {json_str(doc, "AccessKeyId"), json_str(doc, "SecretAccessKey"),
                         json_str(doc, "Token"), NULL};
    struct s3_call sc = {.method = "GET", .target = target, .creds = &c};
    s3_call(srv.url, &sc, r);
    return r->status;
}

/* A signed GET with the test key pair and this session token. */
static long get_with_token(const char *token, const char *target, struct s3_resp *r)
{
    struct s3_creds c = {"test-ak", "test-secret", token, NULL};
    struct s3_call sc = {.method = "GET", .target = target, .creds = &c};
    s3_call(srv.url, &sc, r);
    return r->status;
}

static double cred_stat(cJSON *st, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(st, "credentials"), name);
    cr_assert(cJSON_IsNumber(v), "no credentials.%s in the stats", name);
    return v->valuedouble;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

Test(mock_server, imds_token_role_and_credentials_flow)
{
    char tok[128];
    imds_token("21600", tok, sizeof(tok));
    struct s3_resp r;
    cr_assert_eq(imds_get(ROLES_PATH, tok, &r), 200);
    cr_expect_str_eq(sf__strbuf_str(&r.body), "mock-role\n");
    char ct[64] = "";
    s3_resp_header(&r, "Content-Type", ct, sizeof(ct));
    cr_expect_str_eq(ct, "text/plain");
    s3_resp_free(&r);

    char hdr[256];
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", tok);
    const char *h[] = {hdr, NULL};
    time_t before = time(NULL);
    cJSON *doc = get_json(ROLES_PATH "mock-role", h);
    time_t after = time(NULL);
    cr_expect_str_eq(json_str(doc, "Code"), "Success");
    cr_expect_str_eq(json_str(doc, "Type"), "AWS-HMAC");
    cr_expect_str_eq(json_str(doc, "AccessKeyId"), "test-ak");
    cr_expect_str_eq(json_str(doc, "SecretAccessKey"), "test-secret");
    cr_expect(strncmp(json_str(doc, "Token"), "mock-issued-", 12) == 0, "%s",
              json_str(doc, "Token"));
    time_t exp = parse_aws_time(json_str(doc, "Expiration"));
    cr_expect(exp >= before + 3600 && exp <= after + 3600, "Expiration %s, now %lld",
              json_str(doc, "Expiration"), (long long)before);
    time_t updated = parse_aws_time(json_str(doc, "LastUpdated"));
    cr_expect(updated >= before && updated <= after, "LastUpdated %s",
              json_str(doc, "LastUpdated"));
    /* The same IMDS token serves again, and each document has a new token. */
    cJSON *again = get_json(ROLES_PATH "mock-role", h);
    cr_expect_str_neq(json_str(doc, "Token"), json_str(again, "Token"));
    cJSON_Delete(again);
    cJSON_Delete(doc);
}

Test(mock_server, imds_refuses_bad_requests)
{
    struct s3_resp r;
    const char *bad_ttls[] = {TTL_HEADER ": 0",
                              TTL_HEADER ": 21601",
                              TTL_HEADER ": 12abc",
                              TTL_HEADER ": -5",
                              TTL_HEADER ": 99999999999999999999",
                              NULL};
    cr_expect_eq(plain("PUT", "/latest/api/token", NULL, &r), 400, "no TTL header");
    s3_resp_free(&r);
    for (size_t i = 0; bad_ttls[i]; i++) {
        const char *h[] = {bad_ttls[i], NULL};
        cr_expect_eq(plain("PUT", "/latest/api/token", h, &r), 400, "%s", bad_ttls[i]);
        s3_resp_free(&r);
    }
    const char *proxied[] = {TTL_HEADER ": 60", "X-Forwarded-For: 10.0.0.1", NULL};
    cr_expect_eq(plain("PUT", "/latest/api/token", proxied, &r), 403);
    s3_resp_free(&r);
    cr_expect_eq(plain("GET", "/latest/api/token", NULL, &r), 405);
    s3_resp_free(&r);

    char tok[128];
    imds_token("60", tok, sizeof(tok));
    cr_expect_eq(imds_get(ROLES_PATH, NULL, &r), 401, "no token");
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH, "not-a-token", &r), 401, "unknown token");
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "mock-role", NULL, &r), 401);
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "other-role", tok, &r), 404);
    s3_resp_free(&r);
    cr_expect_eq(imds_get("/latest/meta-data/ami-id", tok, &r), 404);
    s3_resp_free(&r);

    /* Refused requests are not counted: only the one token was issued. */
    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "imds_token"), 1);
    cr_expect_eq(cred_stat(st, "imds_role_list"), 0);
    cr_expect_eq(cred_stat(st, "imds_credentials"), 0);
    cJSON_Delete(st);
}

Test(mock_server_cfg, imds_token_expires_and_role_is_configurable)
{
    const char *args[] = {"--imds-role", "trainer", NULL};
    start_with(args);
    char tok[128];
    imds_token("1", tok, sizeof(tok));
    struct s3_resp r;
    cr_assert_eq(imds_get(ROLES_PATH, tok, &r), 200);
    cr_expect_str_eq(sf__strbuf_str(&r.body), "trainer\n");
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "mock-role", tok, &r), 404);
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "trainer", tok, &r), 200);
    s3_resp_free(&r);
    sleep_ms(2100);
    cr_expect_eq(imds_get(ROLES_PATH, tok, &r), 401, "the token outlived its TTL");
    s3_resp_free(&r);
}

Test(mock_server_cfg, container_credentials_require_the_exact_authorization)
{
    const char *args[] = {"--container-auth-token",
                          "Bearer s3cr3t",
                          "--container-path",
                          "/v2/credentials/abc",
                          "--issue-ttl-s",
                          "120",
                          NULL};
    start_with(args);
    const char *paths[] = {"/_mock/container-credentials", "/v2/credentials/abc"};
    const char *wrong[] = {"Authorization: Bearer s3cr3t2", "Authorization: bearer s3cr3t",
                           "Authorization: s3cr3t"};
    struct s3_resp r;
    for (size_t i = 0; i < 2; i++) {
        cr_expect_eq(plain("GET", paths[i], NULL, &r), 401, "%s without Authorization", paths[i]);
        char ct[64] = "";
        s3_resp_header(&r, "Content-Type", ct, sizeof(ct));
        cr_expect_str_eq(ct, "text/plain");
        cJSON *not_json = cJSON_Parse(sf__strbuf_str(&r.body));
        cr_expect(!cJSON_IsObject(not_json), "a 401 carries no credentials");
        cJSON_Delete(not_json);
        s3_resp_free(&r);
        for (size_t j = 0; j < 3; j++) {
            const char *h[] = {wrong[j], NULL};
            cr_expect_eq(plain("GET", paths[i], h, &r), 401, "%s", wrong[j]);
            s3_resp_free(&r);
        }
        const char *right[] = {"Authorization: Bearer s3cr3t", NULL};
        time_t before = time(NULL);
        cJSON *doc = get_json(paths[i], right);
        cr_expect_str_eq(json_str(doc, "AccessKeyId"), "test-ak");
        cr_expect_str_eq(json_str(doc, "SecretAccessKey"), "test-secret");
        cr_expect(strncmp(json_str(doc, "Token"), "mock-issued-", 12) == 0);
        time_t exp = parse_aws_time(json_str(doc, "Expiration"));
        cr_expect(exp >= before + 120 && exp <= time(NULL) + 120, "Expiration %s",
                  json_str(doc, "Expiration"));
        cJSON_Delete(doc);
    }
    const char *right[] = {"Authorization: Bearer s3cr3t", NULL};
    cr_expect_eq(plain("POST", paths[0], right, &r), 405);
    s3_resp_free(&r);
    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "container"), 2);
    cJSON_Delete(st);
}

Test(mock_server, issued_tokens_authenticate_signed_requests)
{
    cr_assert(test_write_file(root, "bucket1/k", "value", 5) == 0);
    struct s3_resp r;
    /* No --container-auth-token: the endpoint needs no Authorization. */
    cJSON *ecs = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(ecs, "/bucket1/k", &r), 200, "%s", sf__strbuf_str(&r.body));
    cr_expect_eq(r.body.len, 5);
    s3_resp_free(&r);
    cJSON *ec2 = imds_credentials("mock-role");
    cr_expect_eq(get_with(ec2, "/bucket1/k", &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);

    get_with_token("mock-issued-999-00000000000000000000000000000000", "/bucket1/k", &r);
    expect_error(&r, 403, "InvalidToken");
    s3_resp_free(&r);
    /* An issued token does not replace the signature. */
    struct s3_creds bad = {"test-ak", "wrong-secret", json_str(ecs, "Token"), NULL};
    struct s3_call c = {.method = "GET", .target = "/bucket1/k", .creds = &bad};
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "SignatureDoesNotMatch");
    s3_resp_free(&r);
    cJSON_Delete(ecs);
    cJSON_Delete(ec2);
}

Test(mock_server_cfg, expired_issued_token_answers_expired_token)
{
    const char *args[] = {"--issue-ttl-s", "1", NULL};
    start_with(args);
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    cJSON *doc = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(doc, "/bucket1/k", &r), 200, "fresh: %s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    sleep_ms(2100);
    get_with(doc, "/bucket1/k", &r);
    expect_error(&r, 400, "ExpiredToken");
    char msg[128] = "";
    s3_xml_value(&r, "Message", msg, sizeof(msg));
    cr_expect_str_eq(msg, "The provided token has expired.");
    s3_resp_free(&r);
    cJSON_Delete(doc);
    /* A new issuance works again. */
    doc = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(doc, "/bucket1/k", &r), 200);
    s3_resp_free(&r);
    cJSON_Delete(doc);

    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "expired_token_rejections"), 1);
    cr_expect_eq(cred_stat(st, "container"), 2);
    cr_expect_eq(key_status(st, "bucket1/k", "400"), 1);
    cr_expect_eq(key_status(st, "bucket1/k", "200"), 2);
    cJSON_Delete(st);
}

Test(mock_server_cfg, configured_session_token_and_issued_tokens_both_pass)
{
    const char *args[] = {"--session-token", "tok123", NULL};
    start_with(args);
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    cr_expect_eq(get_with_token("tok123", "/bucket1/k", &r), 200);
    s3_resp_free(&r);
    cJSON *doc = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(doc, "/bucket1/k", &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cJSON_Delete(doc);
    expect_call_error("GET", "/bucket1/k", NULL, 403, "InvalidToken");
    get_with_token("tok1234", "/bucket1/k", &r);
    expect_error(&r, 403, "InvalidToken");
    s3_resp_free(&r);
}

Test(mock_server, credential_counters_are_exact_and_reset)
{
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    char t1[128], t2[128];
    imds_token("60", t1, sizeof(t1));
    imds_token("120", t2, sizeof(t2));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(imds_get(ROLES_PATH, i % 2 ? t1 : t2, &r), 200);
        s3_resp_free(&r);
    }
    cJSON *ec2 = imds_credentials("mock-role"); /* a third token */
    cJSON *ecs = get_json("/_mock/container-credentials", NULL);
    cJSON_Delete(get_json("/_mock/container-credentials", NULL));
    /* refused: none of these count */
    cr_assert_eq(imds_get(ROLES_PATH, "bogus", &r), 401);
    s3_resp_free(&r);
    cr_assert_eq(plain("PUT", "/latest/api/token", NULL, &r), 400);
    s3_resp_free(&r);
    cr_assert_eq(plain("DELETE", "/_mock/container-credentials", NULL, &r), 405);
    s3_resp_free(&r);
    /* one S3 request: the only one in the S3 counters */
    cr_assert_eq(get_with(ecs, "/bucket1/k", &r), 200);
    s3_resp_free(&r);

    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "imds_token"), 3);
    cr_expect_eq(cred_stat(st, "imds_role_list"), 3);
    cr_expect_eq(cred_stat(st, "imds_credentials"), 1);
    cr_expect_eq(cred_stat(st, "container"), 2);
    cr_expect_eq(cred_stat(st, "expired_token_rejections"), 0);
    cr_expect_eq(cJSON_GetObjectItem(st, "requests")->valuedouble, 1);
    cJSON *ops = cJSON_GetObjectItem(st, "operations");
    cr_expect_eq(cJSON_GetArraySize(ops), 1, "S3 operations other than GetObject counted");
    cJSON *get = cJSON_GetObjectItem(ops, "GetObject");
    cr_expect(get && get->valuedouble == 1, "one GetObject");
    cJSON_Delete(st);

    cr_assert_eq(admin_post("/_mock/reset", NULL), 200);
    st = stats();
    const char *names[] = {"imds_token", "imds_role_list", "imds_credentials", "container",
                           "expired_token_rejections"};
    for (size_t i = 0; i < 5; i++)
        cr_expect_eq(cred_stat(st, names[i]), 0, "%s after reset", names[i]);
    cJSON_Delete(st);
    /* Reset clears counters, not the issued tokens. */
    cr_expect_eq(get_with(ec2, "/bucket1/k", &r), 200);
    s3_resp_free(&r);
    cJSON_Delete(ec2);
    cJSON_Delete(ecs);
}

/* -------------------------------------------------------------------- TLS */

static char cert_file[700], key_file[700];
static char tls_url[64]; /* "https://127.0.0.1:PORT" */

/* Starts the server over TLS with a fresh certificate (in tmp, outside the root). */
static void start_tls(void)
{
    make_root();
    cr_assert(test_make_cert(tmp, cert_file, sizeof(cert_file), key_file, sizeof(key_file)) == 0);
    const char *extra[] = {"--access-key", "test-ak",   "--secret-key", "test-secret", "--tls-cert",
                           cert_file,      "--tls-key", key_file,       NULL};
    cr_assert(mock_proc_start(&srv, root, extra) == 0, "the TLS mock server did not start");
    snprintf(tls_url, sizeof(tls_url), "%s", srv.url);
}

TestSuite(mock_server_tls, .init = start_tls, .fini = teardown, .timeout = 60);

static void tls_get(const char *target, const char *const *headers, const char *ca,
                    struct s3_resp *r)
{
    struct s3_call c = {
        .method = "GET", .target = target, .headers = headers, .creds = &creds, .ca_file = ca};
    s3_call(tls_url, &c, r);
}

Test(mock_server_tls, https_get_with_the_test_ca_is_byte_identical)
{
    size_t n = 3u << 20;
    char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 11);
    cr_assert(test_write_file(root, "bucket1/big.bin", data, n) == 0);
    struct s3_resp r;
    tls_get("/bucket1/big.bin", NULL, cert_file, &r);
    cr_assert_eq(r.curl_code, CURLE_OK, "curl: %s", curl_easy_strerror(r.curl_code));
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body.len, n);
    cr_expect(memcmp(r.body.data, data, n) == 0, "the body differs");
    s3_resp_free(&r);

    const char *range[] = {"Range: bytes=1000000-1999999", NULL};
    tls_get("/bucket1/big.bin", range, cert_file, &r);
    cr_assert_eq(r.status, 206);
    cr_assert_eq(r.body.len, 1000000);
    cr_expect(memcmp(r.body.data, data + 1000000, 1000000) == 0);
    s3_resp_free(&r);

    /* An upload over TLS lands intact. */
    struct s3_call put = {.method = "PUT",
                          .target = "/bucket1/up.bin",
                          .body = data,
                          .body_len = 300 * 1024,
                          .creds = &creds,
                          .ca_file = cert_file};
    s3_call(tls_url, &put, &r);
    cr_expect_eq(r.status, 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    tls_get("/bucket1/up.bin", NULL, cert_file, &r);
    cr_assert_eq(r.body.len, 300 * 1024);
    cr_expect(memcmp(r.body.data, data, 300 * 1024) == 0);
    s3_resp_free(&r);
    free(data);
}

Test(mock_server_tls, https_without_the_test_ca_fails_verification)
{
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    tls_get("/bucket1/k", NULL, NULL, &r);
    cr_expect_eq(r.curl_code, CURLE_PEER_FAILED_VERIFICATION, "curl: %d %s", r.curl_code,
                 curl_easy_strerror(r.curl_code));
    cr_expect_eq(r.status, 0);
    s3_resp_free(&r);
    /* Plain HTTP on the TLS port gets no HTTP answer. */
    char http_url[64];
    snprintf(http_url, sizeof(http_url), "http://127.0.0.1:%u", srv.port);
    struct s3_call c = {.method = "GET", .target = "/bucket1/k", .creds = &creds};
    s3_call(http_url, &c, &r);
    cr_expect_eq(r.status, 0);
    s3_resp_free(&r);
    /* and the server still serves verified clients */
    tls_get("/bucket1/k", NULL, cert_file, &r);
    cr_expect_eq(r.status, 200);
    s3_resp_free(&r);
}

Test(mock_server_tls, reset_fault_cuts_a_tls_body)
{
    size_t n = 1u << 20;
    char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 5);
    cr_assert(test_write_file(root, "bucket1/r.bin", data, n) == 0);
    const char *h[] = {"x-sfmock-fault: reset=100000", NULL};
    struct s3_resp r;
    tls_get("/bucket1/r.bin", h, cert_file, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_neq(r.curl_code, CURLE_OK, "the transfer must fail");
    /* Exactly 100000 in practice; TLS framing makes only the bound certain
     * (docs/mock-server.md). */
    cr_expect(r.body.len > 0 && r.body.len <= 100000, "%zu bytes", r.body.len);
    cr_expect(memcmp(r.body.data, data, r.body.len) == 0);
    s3_resp_free(&r);
    free(data);
}

/* Runs the server binary with args (stdout discarded); returns its exit
 * status, or -1 when it did not exit within 10 s (killed). stderr into err. */
static int run_mock(const char *const *args, char *err, size_t err_len)
{
    const char *argv[24] = {SF_MOCK_S3_BIN};
    size_t n = 1;
    for (size_t i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int fds[2];
    cr_assert(pipe2(fds, O_CLOEXEC) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int null_fd = open("/dev/null", O_WRONLY);
        dup2(null_fd, STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    struct pollfd pfd = {fds[0], POLLIN, 0};
    ssize_t got = 1;
    while (got > 0 && poll(&pfd, 1, 10000) > 0) {
        char buf[512];
        got = read(fds[0], buf, sizeof(buf));
        for (ssize_t i = 0; i < got && len + 1 < err_len; i++)
            err[len++] = buf[i];
    }
    err[len] = '\0';
    close(fds[0]);
    if (got > 0) /* still running */
        kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    return got <= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(mock_server_cli, bad_credential_and_tls_flags_exit_with_a_reason, .timeout = 60)
{
    char *dir = test_tmpdir();
    cr_assert(dir);
    char cert[600], key[600];
    cr_assert(test_make_cert(dir, cert, sizeof(cert), key, sizeof(key)) == 0);
    struct stat sb;
    cr_assert(stat(key, &sb) == 0);
    cr_expect_eq(sb.st_mode & 0777, 0600, "the key file is private");
    struct {
        const char *args[8];
        int status;
        const char *says;
    } cases[] = {
        {{"--issue-ttl-s", "0"}, 2, "--issue-ttl-s"},
        {{"--issue-ttl-s", "1h"}, 2, "--issue-ttl-s"},
        {{"--imds-role", "a/b"}, 2, "--imds-role"},
        {{"--container-path", "relative"}, 2, "--container-path"},
        {{"--tls-cert", cert}, 2, "go together"},
        {{"--tls-cert", "/nonexistent/cert.pem", "--tls-key", key}, 1, "/nonexistent/cert.pem"},
        {{"--tls-cert", key, "--tls-key", key}, 1, "TLS"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *args[12] = {"--root", dir, "--port", "0", "--quiet"};
        size_t n = 5;
        for (size_t j = 0; cases[i].args[j]; j++)
            args[n++] = cases[i].args[j];
        args[n] = NULL;
        char err[2048];
        cr_expect_eq(run_mock(args, err, sizeof(err)), cases[i].status, "case %zu: %s", i, err);
        cr_expect(strstr(err, cases[i].says) != NULL, "case %zu says: %s", i, err);
    }
    test_rmtree(dir);
    free(dir);
}

/* ============================================================ multipart upload */

#define MiB (1024 * 1024)

static void md5_of(const void *data, size_t n, unsigned char out[16])
{
    unsigned int len = 0;
    EVP_Digest(data, n, out, &len, EVP_md5(), NULL);
}

/* S3's ETag of an object made of these parts: md5 of the binary md5s, "-N". */
static void multipart_etag(const unsigned char *data, const size_t *sizes, size_t n, char *out,
                           size_t out_len)
{
    unsigned char *cat = malloc(16 * n), md[16];
    cr_assert(cat);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        md5_of(data + off, sizes[i], cat + 16 * i);
        off += sizes[i];
    }
    md5_of(cat, 16 * n, md);
    free(cat);
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    snprintf(out, out_len, "\"%s-%zu\"", hex, n);
}

static void create_upload(const char *key_path, char *id, size_t id_len)
{
    char target[512];
    snprintf(target, sizeof(target), "%s?uploads", key_path);
    struct s3_resp r;
    cr_assert_eq(call("POST", target, NULL, &r), 200, "%s", sf__strbuf_str(&r.body));
    cr_assert_eq(s3_xml_value(&r, "UploadId", id, id_len), 0, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
}

/* UploadPart; returns the status and writes the ETag header. */
static long upload_part(const char *key_path, const char *id, unsigned n, const void *data,
                        size_t len, char *etag, size_t etag_len)
{
    char target[512];
    snprintf(target, sizeof(target), "%s?partNumber=%u&uploadId=%s", key_path, n, id);
    struct s3_call c = {
        .method = "PUT", .target = target, .body = data, .body_len = len, .creds = &creds};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    if (etag && s3_resp_header(&r, "ETag", etag, etag_len) != 0)
        etag[0] = '\0';
    long st = r.status;
    s3_resp_free(&r);
    return st;
}

static long complete_upload(const char *key_path, const char *id, const char *xml,
                            struct s3_resp *r)
{
    char target[512];
    snprintf(target, sizeof(target), "%s?uploadId=%s", key_path, id);
    struct s3_call c = {
        .method = "POST", .target = target, .body = xml, .body_len = strlen(xml), .creds = &creds};
    s3_call(srv.url, &c, r);
    return r->status;
}

/* Files under the bucket folder whose names start with prefix. */
static int files_named(const char *prefix)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/bucket1", root);
    DIR *d = opendir(path);
    cr_assert(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Staged parts or uploads: the mock's temporary files, not the hidden ETag
 * files of multipart objects. */
static int staged_files(void)
{
    return files_named(".sfmock-") - files_named(".sfmock-etag-");
}

static int count_tag(const struct s3_resp *r, const char *tag)
{
    int n = 0;
    for (const char *p = sf__strbuf_str(&r->body); (p = strstr(p, tag)); p += strlen(tag))
        n++;
    return n;
}

Test(mock_server, multipart_upload_round_trip_has_the_s3_etag)
{
    size_t sizes[3] = {5 * MiB, 5 * MiB + 3, 1000};
    size_t total = sizes[0] + sizes[1] + sizes[2];
    unsigned char *data = malloc(total);
    cr_assert(data);
    test_fill(data, total, 77);
    char id[128], etags[3][64];
    create_upload("/bucket1/dir/big.bin", id, sizeof(id));
    /* parts arrive in any order; part 2 is sent twice, the second one counts */
    cr_assert_eq(upload_part("/bucket1/dir/big.bin", id, 3, data + sizes[0] + sizes[1], sizes[2],
                             etags[2], sizeof(etags[2])),
                 200);
    cr_assert_eq(upload_part("/bucket1/dir/big.bin", id, 2, data, 100, NULL, 0), 200);
    cr_assert_eq(upload_part("/bucket1/dir/big.bin", id, 2, data + sizes[0], sizes[1], etags[1],
                             sizeof(etags[1])),
                 200);
    cr_assert_eq(
        upload_part("/bucket1/dir/big.bin", id, 1, data, sizes[0], etags[0], sizeof(etags[0])),
        200);
    unsigned char md[16];
    md5_of(data, sizes[0], md);
    char want[40];
    snprintf(want, sizeof(want), "\"");
    for (int i = 0; i < 16; i++)
        snprintf(want + 1 + 2 * i, 3, "%02x", md[i]);
    strcat(want, "\"");
    cr_expect_str_eq(etags[0], want, "a part's ETag is its quoted MD5");
    cr_expect_eq(staged_files(), 3, "three parts held as files");

    struct s3_resp r;
    char target[512];
    snprintf(target, sizeof(target), "/bucket1/dir/big.bin?uploadId=%s", id);
    cr_assert_eq(call("GET", target, NULL, &r), 200, "ListParts: %s", sf__strbuf_str(&r.body));
    cr_expect_eq(count_tag(&r, "<Part>"), 3);
    cr_expect(strstr(sf__strbuf_str(&r.body), "<Size>5242883</Size>"), "%s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    snprintf(target, sizeof(target), "/bucket1/dir/big.bin?uploadId=%s&max-parts=2", id);
    cr_assert_eq(call("GET", target, NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Part>"), 2);
    char v[64];
    cr_expect(s3_xml_value(&r, "IsTruncated", v, sizeof(v)) == 0 && !strcmp(v, "true"));
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 1, "%s", sf__strbuf_str(&r.body));
    cr_expect(s3_xml_value(&r, "Key", v, sizeof(v)) == 0 && !strcmp(v, "dir/big.bin"));
    s3_resp_free(&r);

    char xml[1024];
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part>"
             "<Part><PartNumber>2</PartNumber><ETag>%s</ETag></Part>"
             "<Part><ETag>%s</ETag><PartNumber>3</PartNumber></Part></CompleteMultipartUpload>",
             etags[0], etags[1], etags[2]);
    cr_assert_eq(complete_upload("/bucket1/dir/big.bin", id, xml, &r), 200, "%s",
                 sf__strbuf_str(&r.body));
    char etag[64] = "", want_etag[64];
    multipart_etag(data, sizes, 3, want_etag, sizeof(want_etag));
    s3_xml_value(&r, "ETag", etag, sizeof(etag));
    cr_expect(strstr(sf__strbuf_str(&r.body), "-3&quot;") || strstr(etag, "-3\""), "%s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);

    cr_assert_eq(call("GET", "/bucket1/dir/big.bin", NULL, &r), 200);
    cr_expect(r.body.len == total && memcmp(r.body.data, data, total) == 0, "object differs");
    cr_expect_eq(s3_resp_header(&r, "ETag", etag, sizeof(etag)), 0);
    cr_expect_str_eq(etag, want_etag);
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?list-type=2", NULL, &r), 200);
    cr_expect(strstr(sf__strbuf_str(&r.body), "-3&quot;</ETag>"), "listing: %s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 0, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "no part file left");
    expect_call_error("GET", target, NULL, 404, "NoSuchUpload");

    cJSON *j = stats();
    cJSON *ops = cJSON_GetObjectItem(j, "operations");
    cr_expect_eq(cJSON_GetObjectItem(ops, "UploadPart")->valuedouble, 4);
    cr_expect_eq(cJSON_GetObjectItem(ops, "CompleteMultipartUpload")->valuedouble, 1);
    cr_expect_eq(cJSON_GetObjectItem(ops, "CreateMultipartUpload")->valuedouble, 1);
    cJSON_Delete(j);
    free(data);
}

Test(mock_server, complete_multipart_refuses_bad_part_lists_as_s3_does)
{
    size_t n = 5 * MiB;
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 78);
    char id[128], e1[64], e2[64], e3[64], xml[1024];
    create_upload("/bucket1/k", id, sizeof(id));
    cr_assert_eq(upload_part("/bucket1/k", id, 1, data, n, e1, sizeof(e1)), 200);
    cr_assert_eq(upload_part("/bucket1/k", id, 2, data, 1000, e2, sizeof(e2)), 200);
    cr_assert_eq(upload_part("/bucket1/k", id, 3, data, 10, e3, sizeof(e3)), 200);
    struct s3_resp r;
#define PART(num, tag) "<Part><PartNumber>" #num "</PartNumber><ETag>" tag "</ETag></Part>"
    /* a wrong ETag */
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload>" PART(1, "%s") PART(2, "%s") "</CompleteMultipartUpload>",
             e1, "\"00000000000000000000000000000000\"");
    complete_upload("/bucket1/k", id, xml, &r);
    expect_error(&r, 400, "InvalidPart");
    s3_resp_free(&r);
    /* a part never uploaded */
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload>" PART(1, "%s") PART(4, "%s") "</CompleteMultipartUpload>",
             e1, e2);
    complete_upload("/bucket1/k", id, xml, &r);
    expect_error(&r, 400, "InvalidPart");
    s3_resp_free(&r);
    /* out of order, and a repeated number */
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload>" PART(2, "%s") PART(1, "%s") "</CompleteMultipartUpload>",
             e2, e1);
    complete_upload("/bucket1/k", id, xml, &r);
    expect_error(&r, 400, "InvalidPartOrder");
    s3_resp_free(&r);
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload>" PART(1, "%s") PART(1, "%s") "</CompleteMultipartUpload>",
             e1, e1);
    complete_upload("/bucket1/k", id, xml, &r);
    expect_error(&r, 400, "InvalidPartOrder");
    s3_resp_free(&r);
    /* a part under 5 MiB that is not the last */
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload>" PART(1, "%s") PART(2, "%s")
                 PART(3, "%s") "</CompleteMultipartUpload>",
             e1, e2, e3);
    complete_upload("/bucket1/k", id, xml, &r);
    expect_error(&r, 400, "EntityTooSmall");
    cr_expect(strstr(sf__strbuf_str(&r.body), "<ProposedSize>1000</ProposedSize>"), "%s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    /* no parts, or not XML */
    complete_upload("/bucket1/k", id, "<CompleteMultipartUpload></CompleteMultipartUpload>", &r);
    expect_error(&r, 400, "MalformedXML");
    s3_resp_free(&r);
    complete_upload("/bucket1/k", id, "<CompleteMultipartUpload><Part>", &r);
    expect_error(&r, 400, "MalformedXML");
    s3_resp_free(&r);
    /* an unknown upload id, on every operation; and another key's id */
    complete_upload("/bucket1/k", "nosuchupload", xml, &r);
    expect_error(&r, 404, "NoSuchUpload");
    s3_resp_free(&r);
    complete_upload("/bucket1/other", id, xml, &r);
    expect_error(&r, 404, "NoSuchUpload");
    s3_resp_free(&r);
    cr_expect_eq(upload_part("/bucket1/k", "nosuchupload", 1, data, 10, NULL, 0), 404);
    expect_call_error("GET", "/bucket1/k?uploadId=nosuchupload", NULL, 404, "NoSuchUpload");
    expect_call_error("DELETE", "/bucket1/k?uploadId=nosuchupload", NULL, 404, "NoSuchUpload");
    /* part numbers outside 1..10000 */
    cr_expect_eq(upload_part("/bucket1/k", id, 0, data, 10, NULL, 0), 400);
    cr_expect_eq(upload_part("/bucket1/k", id, 10001, data, 10, NULL, 0), 400);
    cr_expect_eq(call("HEAD", "/bucket1/k", NULL, &r), 404, "nothing was published");
    s3_resp_free(&r);

    /* the refused lists left the upload as it was: a good list completes it,
     * and part 3, not listed, is dropped */
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload>" PART(1, "%s") PART(2, "%s") "</CompleteMultipartUpload>",
             e1, e2);
#undef PART
    cr_expect_eq(complete_upload("/bucket1/k", id, xml, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1/k", NULL, &r), 200);
    cr_expect(r.body.len == n + 1000 && memcmp(r.body.data, data, n) == 0 &&
                  memcmp((char *)r.body.data + n, data, 1000) == 0,
              "object differs");
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "the dropped part's file is gone too");
    free(data);
}

Test(mock_server, abort_multipart_frees_its_parts)
{
    char id[128], id2[128];
    create_upload("/bucket1/a", id, sizeof(id));
    create_upload("/bucket1/a", id2, sizeof(id2));
    cr_expect_str_neq(id, id2);
    cr_assert_eq(upload_part("/bucket1/a", id, 1, "hello", 5, NULL, 0), 200);
    cr_assert_eq(upload_part("/bucket1/a", id, 2, "world", 5, NULL, 0), 200);
    cr_expect_eq(staged_files(), 2);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1?uploads&prefix=a", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 2, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    char target[512];
    snprintf(target, sizeof(target), "/bucket1/a?uploadId=%s", id);
    cr_expect_eq(call("DELETE", target, NULL, &r), 204);
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "an aborted upload's parts are deleted");
    expect_call_error("GET", target, NULL, 404, "NoSuchUpload");
    cr_expect_eq(upload_part("/bucket1/a", id, 3, "late", 4, NULL, 0), 404);
    cr_expect_eq(call("HEAD", "/bucket1/a", NULL, &r), 404);
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 1);
    s3_resp_free(&r);
    snprintf(target, sizeof(target), "/bucket1/a?uploadId=%s", id2);
    cr_expect_eq(call("DELETE", target, NULL, &r), 204);
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 0);
    s3_resp_free(&r);
    expect_call_error("POST", "/nosuchbucket/a?uploads", NULL, 404, "NoSuchBucket");
}

Test(mock_server, upload_part_is_authenticated_and_hash_checked)
{
    char id[128], target[512];
    create_upload("/bucket1/p", id, sizeof(id));
    snprintf(target, sizeof(target), "/bucket1/p?partNumber=1&uploadId=%s", id);
    struct s3_resp r;
    struct s3_call c = {.method = "PUT",
                        .target = target,
                        .body = "data",
                        .body_len = 4,
                        .creds = &creds,
                        .payload_hash =
                            "0000000000000000000000000000000000000000000000000000000000000000"};
    s3_call(srv.url, &c, &r);
    expect_error(&r, 400, "XAmzContentSHA256Mismatch");
    s3_resp_free(&r);
    const struct s3_creds bad = {"test-ak", "wrong-secret", NULL, NULL};
    c.payload_hash = NULL;
    c.creds = &bad;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "SignatureDoesNotMatch");
    s3_resp_free(&r);
    c.creds = NULL;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "AccessDenied");
    s3_resp_free(&r);
    c.creds = &creds;
    c.unsigned_payload = 1;
    cr_expect_eq(s3_call(srv.url, &c, &r), 0);
    cr_expect_eq(r.status, 200, "UNSIGNED-PAYLOAD: %s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 1, "only the accepted part is kept");
    /* the complete request's body is hash-checked too */
    snprintf(target, sizeof(target), "/bucket1/p?uploadId=%s", id);
    struct s3_call cc = {.method = "POST",
                         .target = target,
                         .body = "<CompleteMultipartUpload/>",
                         .body_len = 26,
                         .creds = &creds,
                         .payload_hash =
                             "0000000000000000000000000000000000000000000000000000000000000000"};
    s3_call(srv.url, &cc, &r);
    expect_error(&r, 400, "XAmzContentSHA256Mismatch");
    s3_resp_free(&r);
}

static size_t stop_after(char *ptr, size_t size, size_t nmemb, void *user)
{
    (void)ptr;
    size_t *got = user;
    *got += size * nmemb;
    return *got >= 4096 ? 0 : size * nmemb; /* 0 aborts the transfer */
}

static double bytes_sent(void)
{
    cJSON *j = stats();
    double v = cJSON_GetObjectItem(j, "bytes_sent")->valuedouble;
    cJSON_Delete(j);
    return v;
}

/* A client that reads a few KiB of a large object and hangs up: the
 * statistics count what went out, not the whole object. Once over plain
 * GET (sendfile), once with a body fault (the callback body). */
Test(mock_server_cfg, bytes_sent_counts_what_a_cut_transfer_sent)
{
    const char *args[] = {"--anonymous", NULL};
    start_with(args);
    size_t size = 64 * MiB;
    char path[700];
    snprintf(path, sizeof(path), "%s/bucket1/huge.bin", root);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    close(fd);
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(admin_post("/_mock/reset", NULL), 200);
        CURL *h = curl_easy_init();
        char url[256];
        snprintf(url, sizeof(url), "%s/bucket1/huge.bin", srv.url);
        struct curl_slist *hdr = round ? curl_slist_append(NULL, "x-sfmock-fault: stall=10") : NULL;
        size_t got = 0;
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stop_after);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &got);
        curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 4096L);
        CURLcode rc = curl_easy_perform(h);
        curl_easy_cleanup(h); /* closes the connection */
        curl_slist_free_all(hdr);
        cr_expect_eq(rc, CURLE_WRITE_ERROR);
        cr_expect_geq(got, 4096);
        /* the server learns of the hang-up when its next write fails */
        double sent = bytes_sent();
        for (int i = 0; i < 100 && sent >= (double)size; i++) {
            usleep(50000);
            sent = bytes_sent();
        }
        cr_expect_lt(sent, (double)size / 2, "round %d: %.0f of %zu bytes counted as sent", round,
                     sent, size);
        cr_expect_geq(sent, (double)got, "round %d: %.0f sent but the client read %zu", round, sent,
                      got);
    }
}

/* ------------------------------------------------------------ aws-chunked */

#define STREAMING_SIGNED         "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
#define STREAMING_SIGNED_TRAILER "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
#define STREAMING_UNSIGNED       "STREAMING-UNSIGNED-PAYLOAD-TRAILER"

/* Bitwise reflected CRCs, independent of the mock's zlib and table code. */
static uint32_t crc_bitwise(uint32_t poly, const void *data, size_t n)
{
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
    }
    return ~c;
}

static void crc_b64(uint32_t v, char out[16])
{
    unsigned char be[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 8), (unsigned char)v};
    EVP_EncodeBlock((unsigned char *)out, be, 4);
}

static void crc32_b64(const void *data, size_t n, char out[16])
{
    crc_b64(crc_bitwise(0xEDB88320u, data, n), out);
}

/* An aws-chunked PUT built by hand, as SDKs send it. */
struct chunked_put {
    const char *target;
    const void *data;
    size_t n;
    size_t chunk;          /* data bytes per chunk */
    const char *mode;      /* one of the STREAMING_* values */
    const char *trailer;   /* trailer header name ("x-amz-checksum-crc32"), or NULL */
    const char *trailer_value; /* NULL: the right CRC32 of data */
    int bad_chunk_sig;     /* corrupt the second chunk's signature */
    int bad_trailer_sig;   /* corrupt the trailer signature */
    long long decoded_len; /* x-amz-decoded-content-length; -1: n, -2: absent */
    size_t cut;            /* send only the first `cut` encoded bytes (0: all) */
    const char *garbage;   /* replaces the first chunk header line */
};

static void chunk_sign(struct sf__sigv4_signer *s, const char *amz_date, char prev[65],
                       int trailer, const void *data, size_t n)
{
    char hash[65], sig[65];
    sf__sha256_hex(data, n, hash);
    char day[9];
    memcpy(day, amz_date, 8);
    day[8] = '\0';
    cr_assert_eq(sf__sigv4_sign_chunk(s, amz_date, day, "us-east-1", "s3", prev, trailer, hash, sig),
                 SF_OK);
    memcpy(prev, sig, 65);
}

static long chunked_put(const struct chunked_put *p, struct s3_resp *r)
{
    int is_signed = strcmp(p->mode, STREAMING_UNSIGNED) != 0;
    int has_trailer = strcmp(p->mode, STREAMING_SIGNED) != 0;
    char crc[64];
    if (p->trailer_value)
        snprintf(crc, sizeof crc, "%s", p->trailer_value);
    else
        crc32_b64(p->data, p->n, crc);

    /* the request's own signature seeds the chain */
    char amz_date[SF__AMZ_DATE_LEN + 1], dlen[32], trailer_hdr[96];
    snprintf(dlen, sizeof dlen, "%lld", p->decoded_len == -1 ? (long long)p->n : p->decoded_len);
    snprintf(trailer_hdr, sizeof trailer_hdr, "%s",
             p->trailer ? p->trailer : "x-amz-checksum-crc32");
    struct sf__header hdrs[6];
    size_t nh = 0;
    hdrs[nh++] = (struct sf__header){"host", srv.host};
    hdrs[nh++] = (struct sf__header){"content-encoding", "aws-chunked"};
    if (p->decoded_len != -2)
        hdrs[nh++] = (struct sf__header){"x-amz-decoded-content-length", dlen};
    if (has_trailer)
        hdrs[nh++] = (struct sf__header){"x-amz-trailer", trailer_hdr};
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, creds.access_key, creds.secret_key, NULL, "us-east-1", "s3");
    const char *q = strchr(p->target, '?');
    char path[512];
    snprintf(path, sizeof path, "%.*s", (int)(q ? q - p->target : (long)strlen(p->target)),
             p->target);
    struct sf__sigv4_request req = {"PUT", path, q ? q + 1 : NULL, hdrs, nh, p->mode};
    struct sf__header extra[3];
    size_t n_extra = 0;
    struct sf__sigv4_result res = {0};
    cr_assert_eq(sf__sigv4_sign_request(&s, &req, time(NULL), amz_date, extra, &n_extra, &res),
                 SF_OK);
    char prev[65];
    memcpy(prev, res.signature, 65);

    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    const unsigned char *d = p->data;
    size_t off = 0;
    for (int i = 0;; i++) {
        size_t len = p->n - off < p->chunk ? p->n - off : p->chunk;
        if (i == 0 && p->garbage) {
            sf__strbuf_puts(&b, p->garbage);
        } else {
            sf__strbuf_printf(&b, "%zx", len);
            if (is_signed) {
                chunk_sign(&s, amz_date, prev, 0, d + off, len);
                char sig[65];
                memcpy(sig, prev, 65);
                if (i == 1 && p->bad_chunk_sig)
                    sig[0] = sig[0] == '0' ? '1' : '0';
                sf__strbuf_printf(&b, ";chunk-signature=%s", sig);
            }
        }
        sf__strbuf_puts(&b, "\r\n");
        sf__strbuf_append(&b, (const char *)d + off, len);
        if (len == 0)
            break;
        sf__strbuf_puts(&b, "\r\n");
        off += len;
    }
    if (has_trailer) {
        char line[256];
        snprintf(line, sizeof line, "%s:%s\n", trailer_hdr, crc);
        sf__strbuf_printf(&b, "%s:%s\r\n", trailer_hdr, crc);
        if (is_signed) {
            chunk_sign(&s, amz_date, prev, 1, line, strlen(line));
            if (p->bad_trailer_sig)
                prev[5] = prev[5] == 'a' ? 'b' : 'a';
            sf__strbuf_printf(&b, "x-amz-trailer-signature:%s\r\n", prev);
        }
    }
    sf__strbuf_puts(&b, "\r\n");
    cr_assert_eq(b.err, SF_OK);

    char lines[8][640];
    const char *hl[9];
    size_t nl = 0;
    for (size_t i = 1; i < nh; i++) /* host: curl sends it */
        snprintf(lines[nl++], sizeof lines[0], "%s: %s", hdrs[i].name, hdrs[i].value);
    for (size_t i = 0; i < n_extra; i++)
        snprintf(lines[nl++], sizeof lines[0], "%s: %s", extra[i].name, extra[i].value);
    snprintf(lines[nl++], sizeof lines[0], "Authorization: %s", res.authorization);
    for (size_t i = 0; i < nl; i++)
        hl[i] = lines[i];
    hl[nl] = NULL;
    struct s3_call c = {.method = "PUT",
                        .target = p->target,
                        .headers = hl,
                        .body = b.data,
                        .body_len = p->cut ? p->cut : b.len};
    s3_call(srv.url, &c, r);
    sf__strbuf_free(&b);
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
    return r->status;
}

/* The object's bytes over GET equal data. */
static void expect_object(const char *target, const void *data, size_t n)
{
    struct s3_resp r;
    cr_assert_eq(call("GET", target, NULL, &r), 200, "GET %s", target);
    cr_expect_eq(r.body.len, n, "%s: %zu bytes, want %zu", target, r.body.len, n);
    cr_expect(r.body.len == n && (n == 0 || memcmp(r.body.data, data, n) == 0), "%s differs",
              target);
    s3_resp_free(&r);
}

static void expect_absent(const char *target)
{
    struct s3_resp r;
    cr_expect_eq(call("HEAD", target, NULL, &r), 404, "%s was stored", target);
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "temporary files left behind");
}

/* The aws-chunked PUT p is refused with status and code, and nothing is stored. */
static void expect_chunked_refused(const struct chunked_put *p, long status, const char *code)
{
    struct s3_resp r;
    chunked_put(p, &r);
    expect_error(&r, status, code);
    s3_resp_free(&r);
    expect_absent(p->target);
}

static double group_count(cJSON *st, const char *group, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(st, group), name);
    return v ? v->valuedouble : 0;
}

Test(mock_server, aws_chunked_uploads_are_decoded_byte_exact)
{
    size_t n = 200 * 1024 + 17;
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 5);
    struct s3_resp r;
    struct chunked_put p = {.target = "/bucket1/signed.bin", .data = data, .n = n,
                            .chunk = 64 * 1024, .mode = STREAMING_SIGNED, .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    expect_object("/bucket1/signed.bin", data, n);

    /* botocore's form: unsigned chunks, a CRC32 trailer; echoed as S3 does */
    p = (struct chunked_put){.target = "/bucket1/unsigned.bin", .data = data, .n = n,
                             .chunk = 8192, .mode = STREAMING_UNSIGNED,
                             .trailer = "x-amz-checksum-crc32", .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    char echo[64] = "", want[16];
    crc32_b64(data, n, want);
    s3_resp_header(&r, "x-amz-checksum-crc32", echo, sizeof echo);
    cr_expect_str_eq(echo, want);
    s3_resp_free(&r);
    expect_object("/bucket1/unsigned.bin", data, n);

    /* AWS's trailer example: 66560 'a' have CRC32C sOO8/Q== */
    char *as = malloc(66560);
    cr_assert(as);
    memset(as, 'a', 66560);
    p = (struct chunked_put){.target = "/bucket1/trailer.bin", .data = as, .n = 66560,
                             .chunk = 65536, .mode = STREAMING_SIGNED_TRAILER,
                             .trailer = "x-amz-checksum-crc32c", .trailer_value = "sOO8/Q==",
                             .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_header(&r, "x-amz-checksum-crc32c", echo, sizeof echo);
    cr_expect_str_eq(echo, "sOO8/Q==");
    s3_resp_free(&r);
    expect_object("/bucket1/trailer.bin", as, 66560);

    /* an empty object is one final chunk */
    p = (struct chunked_put){.target = "/bucket1/empty", .data = "", .n = 0, .chunk = 1,
                             .mode = STREAMING_SIGNED, .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    expect_object("/bucket1/empty", "", 0);

    cJSON *st = stats();
    cr_expect_eq(group_count(st, "aws_chunked", STREAMING_SIGNED), 2);
    cr_expect_eq(group_count(st, "aws_chunked", STREAMING_UNSIGNED), 1);
    cr_expect_eq(group_count(st, "aws_chunked", STREAMING_SIGNED_TRAILER), 1);
    cr_expect_eq(group_count(st, "checksums", "CRC32"), 1);
    cr_expect_eq(group_count(st, "checksums", "CRC32C"), 1);
    cJSON_Delete(st);
    free(as);
    free(data);
}

Test(mock_server, aws_chunked_bad_signatures_are_refused_and_not_stored)
{
    size_t n = 100 * 1024;
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 6);
    struct chunked_put p = {.target = "/bucket1/k", .data = data, .n = n, .chunk = 32 * 1024,
                            .mode = STREAMING_SIGNED, .decoded_len = -1, .bad_chunk_sig = 1};
    expect_chunked_refused(&p, 403, "SignatureDoesNotMatch");

    p.mode = STREAMING_SIGNED_TRAILER;
    p.trailer = "x-amz-checksum-crc32";
    p.bad_chunk_sig = 0;
    p.bad_trailer_sig = 1;
    expect_chunked_refused(&p, 403, "SignatureDoesNotMatch");
    free(data);
}

Test(mock_server, aws_chunked_wrong_trailer_checksum_is_bad_digest)
{
    size_t n = 50 * 1024;
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 7);
    const char *modes[2] = {STREAMING_UNSIGNED, STREAMING_SIGNED_TRAILER};
    for (int i = 0; i < 2; i++) {
        struct chunked_put p = {.target = "/bucket1/k", .data = data, .n = n, .chunk = 16384,
                                .mode = modes[i], .trailer = "x-amz-checksum-crc32",
                                .trailer_value = "AAAAAA==", .decoded_len = -1};
        expect_chunked_refused(&p, 400, "BadDigest");
    }
    free(data);
}

Test(mock_server, aws_chunked_length_and_framing_errors_are_400)
{
    size_t n = 40 * 1024;
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 8);
    struct s3_resp r;
    struct chunked_put p = {.target = "/bucket1/k", .data = data, .n = n, .chunk = 16384,
                            .mode = STREAMING_SIGNED, .decoded_len = (long long)n + 1};
    expect_chunked_refused(&p, 400, "IncompleteBody");

    p.decoded_len = -2;
    chunked_put(&p, &r);
    expect_error(&r, 411, "MissingContentLength");
    s3_resp_free(&r);

    /* cut inside the second chunk's data: a complete HTTP body, a truncated encoding */
    p.decoded_len = -1;
    p.cut = 16384 + 20000;
    expect_chunked_refused(&p, 400, "IncompleteBody");

    p.cut = 0;
    p.mode = STREAMING_UNSIGNED;
    p.trailer = "x-amz-checksum-crc32";
    p.garbage = "zz";
    expect_chunked_refused(&p, 400, "InvalidRequest");
    free(data);
}

Test(mock_server, checksum_headers_of_plain_uploads_are_verified_and_echoed)
{
    size_t n = 3000;
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 9);
    char crc[16], crcc[16], sha[64], hdr[3][128];
    crc32_b64(data, n, crc);
    crc_b64(crc_bitwise(0x82F63B78u, data, n), crcc);
    unsigned char md[32];
    unsigned int ml = 0;
    EVP_Digest(data, n, md, &ml, EVP_sha256(), NULL);
    EVP_EncodeBlock((unsigned char *)sha, md, 32);
    snprintf(hdr[0], sizeof hdr[0], "x-amz-checksum-crc32: %s", crc);
    snprintf(hdr[1], sizeof hdr[1], "x-amz-checksum-crc32c: %s", crcc);
    snprintf(hdr[2], sizeof hdr[2], "x-amz-checksum-sha256: %s", sha);
    for (int i = 0; i < 3; i++) {
        const char *h[] = {hdr[i], NULL};
        struct s3_call c = {.method = "PUT", .target = "/bucket1/ok", .headers = h, .body = data,
                            .body_len = n, .creds = &creds};
        struct s3_resp r;
        s3_call(srv.url, &c, &r);
        cr_expect_eq(r.status, 200, "%s: %s", hdr[i], sf__strbuf_str(&r.body));
        char name[64], echo[64] = "";
        snprintf(name, sizeof name, "%.*s", (int)(strchr(hdr[i], ':') - hdr[i]), hdr[i]);
        s3_resp_header(&r, name, echo, sizeof echo);
        cr_expect_str_eq(echo, strchr(hdr[i], ' ') + 1);
        s3_resp_free(&r);
    }
    const char *bad[] = {"x-amz-checksum-sha1: 2jmj7l5rSw0yVb/vlWAYkK/YBwk=", NULL};
    struct s3_call c = {.method = "PUT", .target = "/bucket1/bad", .headers = bad, .body = data,
                        .body_len = n, .creds = &creds};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 400, "BadDigest");
    s3_resp_free(&r);
    expect_absent("/bucket1/bad");

    /* UploadPart checks them the same way */
    char id[128];
    create_upload("/bucket1/mp", id, sizeof id);
    char target[256];
    snprintf(target, sizeof target, "/bucket1/mp?partNumber=1&uploadId=%s", id);
    const char *wrong[] = {"x-amz-checksum-crc32: AAAAAA==", NULL};
    c = (struct s3_call){.method = "PUT", .target = target, .headers = wrong, .body = data,
                         .body_len = n, .creds = &creds};
    s3_call(srv.url, &c, &r);
    expect_error(&r, 400, "BadDigest");
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0);
    free(data);
}

/* Uploads data as a 2-part multipart object (5 MiB + the rest); its ETag. */
static void multipart_put(const char *key_path, const unsigned char *data, size_t n,
                          char *etag, size_t etag_len)
{
    size_t sizes[2] = {5 * MiB, n - 5 * MiB};
    char id[128], etags[2][64], xml[512];
    create_upload(key_path, id, sizeof id);
    cr_assert_eq(upload_part(key_path, id, 1, data, sizes[0], etags[0], sizeof etags[0]), 200);
    cr_assert_eq(upload_part(key_path, id, 2, data + sizes[0], sizes[1], etags[1], sizeof etags[1]),
                 200);
    snprintf(xml, sizeof xml,
             "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part>"
             "<Part><PartNumber>2</PartNumber><ETag>%s</ETag></Part></CompleteMultipartUpload>",
             etags[0], etags[1]);
    struct s3_resp r;
    cr_assert_eq(complete_upload(key_path, id, xml, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    multipart_etag(data, sizes, 2, etag, etag_len);
}

static void expect_etag(const char *target, const char *want)
{
    struct s3_resp r;
    char etag[64] = "";
    cr_assert_eq(call("HEAD", target, NULL, &r), 200, "HEAD %s", target);
    s3_resp_header(&r, "ETag", etag, sizeof etag);
    s3_resp_free(&r);
    cr_expect_str_eq(etag, want, "ETag of %s", target);
}

Test(mock_server, multipart_etag_survives_a_restart_and_goes_with_the_object)
{
    size_t n = 5 * MiB + 1000;
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 10);
    char want[64], want2[64];
    multipart_put("/bucket1/mp.bin", data, n, want, sizeof want);
    multipart_put("/bucket1/d/mp2.bin", data, n, want2, sizeof want2);
    expect_etag("/bucket1/mp.bin", want);
    cr_expect_eq(files_named(".sfmock-etag-mp.bin"), 1, "the hidden ETag file of mp.bin");
    cr_expect_eq(staged_files(), 0);

    /* a new server on the same root answers the multipart ETags */
    cr_assert_eq(mock_proc_stop(&srv), 0);
    const char *args[] = {"--access-key", "test-ak", "--secret-key", "test-secret", NULL};
    cr_assert_eq(mock_proc_start(&srv, root, args), 0);
    expect_etag("/bucket1/mp.bin", want);
    expect_etag("/bucket1/d/mp2.bin", want2);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1?list-type=2", NULL, &r), 200);
    cr_expect(strstr(sf__strbuf_str(&r.body), "-2&quot;</ETag>"), "listing: %s",
              sf__strbuf_str(&r.body));
    cr_expect(!strstr(sf__strbuf_str(&r.body), ".sfmock"), "the sidecar is listed: %s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);

    /* overwritten: the content's MD5 again, and the sidecar is gone */
    put_object("/bucket1/mp.bin", data, 100);
    unsigned char md[16];
    md5_of(data, 100, md);
    char md5_etag[40] = "\"";
    for (int i = 0; i < 16; i++)
        snprintf(md5_etag + 1 + 2 * i, 3, "%02x", md[i]);
    strcat(md5_etag, "\"");
    expect_etag("/bucket1/mp.bin", md5_etag);
    cr_expect_eq(files_named(".sfmock-"), 0, "a hidden file is left");

    /* deleted: the folder d/ holds nothing and is pruned */
    cr_assert_eq(call("DELETE", "/bucket1/d/mp2.bin", NULL, &r), 204);
    s3_resp_free(&r);
    char path[700];
    snprintf(path, sizeof path, "%s/bucket1/d", root);
    struct stat sb;
    cr_expect_neq(stat(path, &sb), 0, "bucket1/d still exists (a sidecar left in it?)");
    free(data);
}
