/* The mock S3 server's faults: by header, queued, rules, random with a seed,
 * rate limits, stalls, bandwidth, changing ETags. Suites `mock_server` and
 * `mock_server_cfg` (test_mock_server.c). */
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

Test(mock_server, forced_faults_by_header)
{
    char data[4096];
    test_fill(data, sizeof(data), 9);
    cr_assert(test_write_file(root, "bucket1/f", data, sizeof(data)) == 0);
    struct s3_resp r;
    expect_header_error("GET", "/bucket1/f", "x-sfmock-fault: 500", 500, "InternalError");
    expect_header_error("GET", "/bucket1/f", "x-sfmock-fault: 503", 503, "SlowDown");

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
    cr_expect_eq(group_count(st, "faults", "500"), 1);
    cr_expect_eq(group_count(st, "faults", "503"), 1);
    cr_expect_eq(group_count(st, "faults", "reset"), 2);
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
    start_with_k(args);
    for (int i = 0; i < 40; i++) {
        struct s3_resp r;
        out[i] = call("GET", "/bucket1/k", NULL, &r);
        s3_resp_free(&r);
    }
    mock_server_teardown();
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
    unsigned char *data = test_put_object(root, "bucket1", "capped", n, 11);
    cr_assert(data);
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
    start_with_k(args);
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
    start_with_k(args);
    struct s3_resp r;
    struct s3_call c = {.method = "GET", .target = "/bucket1/k"};
    s3_call(srv.url, &c, &r);
    cr_expect_eq(r.status, 200);
    s3_resp_free(&r);
    struct s3_creds bad = {"test-ak", "nope", NULL, NULL};
    c.creds = &bad;
    expect_sent_error(&c, 403, "SignatureDoesNotMatch");
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
