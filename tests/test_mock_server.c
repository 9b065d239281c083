/* The mock S3 server, driven over HTTP: every test starts its own server on
 * a free port with a fresh root directory and stops it. This file: objects,
 * ranges, listings, buckets, authentication, the command line, malformed
 * requests. Suites `mock_server` (a server per test) and `mock_server_cfg`
 * (one started with the test's own flags) are declared here and go on in
 * test_mock_server_faults.c, _creds.c, _tls.c and _uploads.c, over
 * mock_server_fixture.c. */
#include "mock_server_fixture.h"
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

/* GETs a listing page (into *r, to free) whose first entry is want and that
 * says it is truncated or not. */
static void expect_page(const char *target, const char *want, int truncated, struct s3_resp *r)
{
    cr_assert_eq(call("GET", target, NULL, r), 200);
    char got[64];
    first_listed(r, got);
    cr_expect_str_eq(got, want, "%s", target);
    char trunc[16] = "";
    s3_xml_value(r, "IsTruncated", trunc, sizeof(trunc));
    cr_expect_str_eq(trunc, truncated ? "true" : "false", "%s", target);
}

TestSuite(mock_server, .init = mock_server_setup, .fini = mock_server_teardown, .timeout = 60);
/* Tests that start the server with their own flags. */
TestSuite(mock_server_cfg, .fini = mock_server_teardown, .timeout = 60);

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
    expect_header_error("GET", "/bucket1/small", "Range: bytes=10-20", 416, "InvalidRange");
    expect_header_error("GET", "/bucket1/small", "Range: bytes=-0", 416, "InvalidRange");
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

    /* The forms a tag may take in a condition (RFC 9110: a list, weak tags,
     * "*"; S3 also takes a bare tag): the mock reads them on its own, as
     * the oracle of the client's conditional requests. */
    char bare[40];
    snprintf(bare, sizeof(bare), "%.32s", want + 1);
    const char *other = "\"0123456789abcdef0123456789abcdef\"";
    struct {
        const char *name, *before, *after; /* the value: before + tag + after */
        int status;
    } conds[] = {
        {"If-Match", "", "", 200},
        {"If-Match", "W/\"", "\"", 200},
        {"If-Match", "", ", \"x\"", 200},
        {"If-Match", "\"x\" ,  \"", "\" ", 200},
        {"If-Match", "\"x\", \"y", "\"", 412},
        {"If-None-Match", "\"x\", W/\"", "\"", 304},
        {"If-None-Match", "\"", "x\"", 200},
    };
    for (size_t i = 0; i < sizeof(conds) / sizeof(conds[0]); i++) {
        snprintf(hdr, sizeof(hdr), "%s: %s%s%s", conds[i].name, conds[i].before, bare,
                 conds[i].after);
        const char *h[] = {hdr, NULL};
        cr_expect_eq(call("GET", "/bucket1/fox", h, &r), conds[i].status, "%s", hdr);
        s3_resp_free(&r);
    }
    const char *any[] = {"If-Match: *", NULL}, *none[] = {"If-None-Match: *", NULL};
    cr_expect_eq(call("GET", "/bucket1/fox", any, &r), 200);
    s3_resp_free(&r);
    cr_expect_eq(call("GET", "/bucket1/fox", none, &r), 304);
    s3_resp_free(&r);
    snprintf(hdr, sizeof(hdr), "If-Match: %s, %s", other, other);
    const char *neither[] = {hdr, NULL};
    expect_call_error("GET", "/bucket1/fox", neither, 412, "PreconditionFailed");
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
    expect_sent_error(&c, 400, "XAmzContentSHA256Mismatch");
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
        expect_page(target, want[i], i < 3, &r);
        token[0] = '\0';
        s3_xml_value(&r, "NextContinuationToken", token, sizeof(token));
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
    expect_get_has("/bucket1?list-type=2", "<Key>sp ace+plus&amp;amp%pct\xC3\xA9</Key>");
    expect_get_has("/bucket1?list-type=2&encoding-type=url",
                   "<Key>sp%20ace%2Bplus%26amp%25pct%C3%A9</Key>");
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
    expect_sent_error(&c, 403, "AccessDenied");

    struct s3_creds wrong_secret = {"test-ak", "not-the-secret", NULL, NULL};
    c.creds = &wrong_secret;
    s3_call(srv.url, &c, &r);
    expect_error(&r, 403, "SignatureDoesNotMatch");
    cr_expect(strstr(sf__strbuf_str(&r.body), "<CanonicalRequest>GET\n/bucket1/k\n"));
    cr_expect(!strstr(sf__strbuf_str(&r.body), "test-secret"), "the secret never leaks");
    s3_resp_free(&r);

    struct s3_creds wrong_key = {"other-ak", "test-secret", NULL, NULL};
    c.creds = &wrong_key;
    expect_sent_error(&c, 403, "InvalidAccessKeyId");

    struct s3_creds wrong_region = {"test-ak", "test-secret", NULL, "eu-west-1"};
    c.creds = &wrong_region;
    expect_sent_error(&c, 400, "AuthorizationHeaderMalformed");

    c.creds = &creds;
    c.when = time(NULL) - 16 * 60;
    expect_sent_error(&c, 403, "RequestTimeTooSkewed");
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
    expect_sent_error(&c, 403, "SignatureDoesNotMatch");
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

Test(mock_server, unsupported_operations_answer_not_implemented)
{
    expect_call_error("GET", "/bucket1/k?partNumber=1", NULL, 501, "NotImplemented");
    expect_call_error("GET", "/bucket1?versioning", NULL, 501, "NotImplemented");
    expect_header_error("PUT", "/bucket1/b", "x-amz-copy-source: /bucket1/a", 501,
                        "NotImplemented");
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
        expect_page(target, want[i], i < 2, &r);
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
