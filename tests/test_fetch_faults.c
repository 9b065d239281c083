/* The fetch engine under the mock's faults: retries, attempts, resumes,
 * changed objects, throttling and quotas, counted exactly. Suite `fetch`
 * (test_fetch.c). */
#include "fetch_fixture.h"
#include "support/spawn.h"

#include "s3/fetch.h" /* sf__fetch_io_threads_used, sf__engine_io_loops */
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
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ============================================================ faults and attempts */

/* The mock answered key (bucket/k) `requests` times, `n_status` of them with
 * status; the client sent as many, all but the first as retries. */
static void expect_attempts(const char *key, unsigned requests, const char *status,
                            unsigned n_status)
{
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "keys", key, "requests", NULL), requests, "%s", key);
    cr_expect_eq(jnum(j, "keys", key, "status", status), n_status, "%s: %s", key, status);
    cJSON_Delete(j);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.requests, requests);
    cr_expect_eq(s.retries, requests - 1);
}

/* A single-chunk object: every request is one attempt of the same range. */
static void expect_two_forced_errors_then_success(const char *fault)
{
    size_t n = 100 * KiB;
    unsigned char *want = start_with_object("flaky.bin", n, 30);
    queue_fault("bucket/flaky.bin", fault, 2);
    struct sf_fetch_progress p;
    expect_fetch_whole("flaky.bin", want, n, &p);
    cr_expect_eq(p.requests, 3, "%s: %u requests", fault, p.requests);
    cr_expect_eq(p.retries, 2);
    expect_attempts("bucket/flaky.bin", 3, fault, 2);
    cr_expect_eq(mock_stat("keys", "bucket/flaky.bin", "status", "206"), 1);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.throttled, strcmp(fault, "503") == 0 ? 2 : 0, "%s", fault);
    free(want);
}

Test(fetch, two_forced_503_then_success_is_three_requests)
{
    expect_two_forced_errors_then_success("503");
}

Test(fetch, two_forced_500_then_success_is_three_requests)
{
    expect_two_forced_errors_then_success("500");
}

Test(fetch, missing_key_fails_at_once_with_not_found)
{
    start_default();
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync("s3://bucket/no/such-key.bin", NULL, &f, &p);
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    cr_expect_eq(p.status, SF_ERR_NOT_FOUND);
    cr_expect(p.done);
    cr_expect_eq(p.requests, 1);
    cr_expect_eq(p.retries, 0);
    cr_expect(strstr(sf_fetch_errmsg(f), "s3://bucket/no/such-key.bin"), "message: %s",
              sf_fetch_errmsg(f));
    cr_expect(strstr(sf_fetch_errmsg(f), "404"), "message: %s", sf_fetch_errmsg(f));
    cr_expect(strstr(sf_fetch_errmsg(f), "NoSuchKey"), "message: %s", sf_fetch_errmsg(f));
    sf_fetch_destroy(f);
    cr_expect_eq(mock_stat("requests", NULL, NULL, NULL), 1);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.objects_failed, 1);
}

Test(fetch, wrong_secret_fails_at_once_without_leaking_it)
{
    start_mock(NULL);
    free(put_object("k.bin", 1000, 31));
    struct sf_s3_options o;
    opts_init(&o);
    o.secret_access_key = "wrong-secret-Zq7";
    client(&o);
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync("s3://bucket/k.bin", NULL, &f, &p);
    cr_expect(st == SF_ERR_SIGNATURE || st == SF_ERR_ACCESS_DENIED, "%s", sf_status_name(st));
    cr_expect_eq(p.requests, 1);
    const char *msg = sf_fetch_errmsg(f);
    cr_expect(strstr(msg, "s3://bucket/k.bin") && strstr(msg, "403"), "message: %s", msg);
    cr_expect_null(strstr(msg, "wrong-secret-Zq7"), "the secret is in the message: %s", msg);
    cr_expect_null(strstr(msg, "mock-secret-key"), "message: %s", msg);
    char buf[1024];
    cr_expect_null(strstr(sf_s3_errmsg(s3, buf, sizeof(buf)), "wrong-secret-Zq7"));
    sf_fetch_destroy(f);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "requests", NULL, NULL, NULL), 1);
    cr_expect_eq(jnum(j, "status", "403", NULL, NULL), 1);
    cJSON_Delete(j);
}

/* The probe (first range, size unknown) is the first GET: it takes the queued fault. */
Test(fetch, reset_mid_body_resumes_with_the_remaining_bytes)
{
    start_default();
    size_t n = 2 * MiB + 512 * KiB;
    size_t cut = 100000; /* inside the first range (256 KiB) */
    unsigned char *want = put_object("reset.bin", n, 32);
    char fault[32];
    snprintf(fault, sizeof(fault), "reset=%zu", cut);
    queue_fault("bucket/reset.bin", fault, 1);
    struct sf_fetch_progress p;
    expect_fetch_whole("reset.bin", want, n, &p);
    cr_expect_eq(p.retries, 1);
    cr_expect_eq(p.requests, 5, "4 ranges (256 KiB, the rest of 1 MiB, 1 MiB, 512 KiB), one retry");
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "faults", "reset", NULL, NULL), 1);
    double sent = jnum(j, "bytes_sent", NULL, NULL, NULL);
    /* the cut attempt sent `cut` bytes; a retry of the whole range would make
     * the total n + cut, resuming makes it n + cut - (bytes received before the cut) */
    cr_expect(sent >= (double)n && sent < (double)(n + cut),
              "mock sent %.0f bytes for a %zu-byte object cut at %zu: the retry re-asked for "
              "bytes it had",
              sent, n, cut);
    cJSON_Delete(j);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.bytes_received, n, "every byte written exactly once");
    free(want);
}

Test(fetch, stall_mid_body_is_aborted_and_resumed)
{
    start_mock(NULL);
    struct sf_s3_options o;
    opts_init(&o);
    o.stall_timeout_ms = 500;
    client(&o);
    size_t n = 2 * MiB + 512 * KiB;
    unsigned char *want = put_object("stall.bin", n, 33);
    queue_fault("bucket/stall.bin", "stall=8000", 1); /* stalls after half of 256 KiB */
    struct sf_fetch_progress p;
    expect_fetch_whole("stall.bin", want, n, &p);
    cr_expect_eq(p.retries, 1);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "faults", "stall", NULL, NULL), 1);
    double sent = jnum(j, "bytes_sent", NULL, NULL, NULL);
    /* the stalled answer counts its whole 256 KiB; the retry asks for the rest of it */
    cr_expect(sent >= (double)n && sent < (double)(n + 256 * KiB),
              "mock sent %.0f bytes for a %zu-byte object: the retry re-asked for the whole "
              "range",
              sent, n);
    cJSON_Delete(j);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.bytes_received, n);
    free(want);
}

static void expect_bad_answer_retried(const char *fault)
{
    size_t n = 2 * MiB + 99;
    unsigned char *want = start_with_object("bad.bin", n, 34);
    queue_fault("bucket/bad.bin", fault, 1);
    struct sf_fetch_progress p;
    expect_fetch_whole("bad.bin", want, n, &p);
    cr_expect_eq(p.retries, 1, "%s", fault);
    cr_expect_eq(p.requests, 5, "%s: 4 ranges and one retry", fault);
    cr_expect_eq(mock_stat("faults", fault, NULL, NULL), 1, "%s", fault);
    free(want);
}

Test(fetch, a_200_instead_of_206_is_retried)
{
    expect_bad_answer_retried("no206");
}

Test(fetch, a_206_without_content_range_is_retried)
{
    expect_bad_answer_retried("no_content_range");
}

Test(fetch, etag_change_between_ranges_fails_with_changed)
{
    size_t n = 3 * MiB;
    unsigned char *want = start_with_object("chg.bin", n, 35);
    set_rules("prefix=bucket/chg.bin,etag_change_after=1");
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync("s3://bucket/chg.bin", NULL, &f, &p);
    cr_expect_eq(st, SF_ERR_CHANGED, "%s: %s", sf_status_name(st), sf_fetch_errmsg(f));
    cr_expect(strstr(sf_fetch_errmsg(f), "changed"), "message: %s", sf_fetch_errmsg(f));
    cr_expect(strstr(sf_fetch_errmsg(f), "s3://bucket/chg.bin"), "message: %s", sf_fetch_errmsg(f));
    sf_fetch_destroy(f);
    cJSON *j = mock_stats();
    cr_expect_geq(jnum(j, "status", "412", NULL, NULL), 1);
    cJSON_Delete(j);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.objects_failed, 1);
    cr_expect_eq(s.objects_done, 0);
    free(want);
}

Test(fetch, etag_changed_since_the_listing_fails_with_changed)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.concurrency = 1;
    client(&so);
    size_t n = 2 * MiB;
    unsigned char *want = put_object("lst.bin", n, 36);
    char etag[35];
    mock_env_etag(want, n, etag);
    queue_fault("bucket/lst.bin", "etag_changed", 1);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.size = n;
    o.etag = etag;
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync("s3://bucket/lst.bin", &o, &f, &p);
    cr_expect_eq(st, SF_ERR_CHANGED, "%s: %s", sf_status_name(st), sf_fetch_errmsg(f));
    cr_expect(strstr(sf_fetch_errmsg(f), "changed"), "message: %s", sf_fetch_errmsg(f));
    cr_expect_eq(p.requests, 1, "a changed object is not retried");
    sf_fetch_destroy(f);
    free(want);
}

/* A client of max_attempts (and retry_quota, 0: the default) fetches key,
 * an object of n bytes that always answers fault ("p503"); *f and *p as
 * fetch_sync leaves them. */
static sf_status fetch_under_fault(unsigned max_attempts, unsigned retry_quota, const char *key,
                                   size_t n, const char *fault, struct sf_fetch **f,
                                   struct sf_fetch_progress *p)
{
    start_mock(NULL);
    struct sf_s3_options o;
    opts_init(&o);
    o.max_attempts = max_attempts;
    if (retry_quota)
        o.retry_quota = retry_quota;
    client(&o);
    free(put_object(key, n, (unsigned)n));
    char rule[256], url[256];
    snprintf(rule, sizeof(rule), "prefix=bucket/%s,%s=1", key, fault);
    set_rules(rule);
    snprintf(url, sizeof(url), "s3://bucket/%s", key);
    return fetch_sync(url, NULL, f, p);
}

Test(fetch, max_attempts_reached_under_permanent_503)
{
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_under_fault(4, 0, "busy.bin", 100 * KiB, "p503", &f, &p);
    cr_expect_eq(st, SF_ERR_THROTTLED, "%s", sf_status_name(st));
    cr_expect_eq(p.requests, 4);
    cr_expect_eq(p.retries, 3);
    cr_expect(strstr(sf_fetch_errmsg(f), "4 attempts"), "message: %s", sf_fetch_errmsg(f));
    cr_expect(strstr(sf_fetch_errmsg(f), "SlowDown"), "message: %s", sf_fetch_errmsg(f));
    sf_fetch_destroy(f);
    expect_attempts("bucket/busy.bin", 4, "503", 4);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.objects_failed, 1);
}

/* A process out of descriptors cannot open a connection: the message says
 * so (socket: Too many open files), not "Couldn't connect to server", which
 * sends the user after the network. Run in a child whose every descriptor
 * is taken once its client is up. */
Test(fetch, no_descriptor_for_a_connection_is_named_in_the_message)
{
    start_mock(NULL);
    free(put_object("k.bin", 10 * KiB, 3));
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        alarm(20);
        struct sf_s3_options o;
        opts_init(&o);
        o.max_attempts = 2;
        client(&o);
        if (test_use_up_descriptors(256) != 0)
            _exit(3);
        struct sf_fetch *f = NULL;
        struct sf_fetch_progress p;
        sf_status st = sf_fetch_start(s3, "s3://bucket/k.bin", NULL, &f);
        if (st == SF_OK)
            st = sf_fetch_wait(f, SF_SIZE_UNKNOWN, -1, &p);
        if (st == SF_OK)
            st = p.status;
        const char *m = f ? sf_fetch_errmsg(f) : "";
        fprintf(stderr, "%s: %s\n", sf_status_name(st), m);
        _exit(st != SF_OK && strstr(m, "Too many open files") && strstr(m, "k.bin") ? 0 : 1);
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws), "signal %d", WTERMSIG(ws));
    cr_assert_eq(WEXITSTATUS(ws), 0, "the message (the child's stderr) does not say what ran out");
}

/* The 503 that ends a request (max_attempts reached) is counted too:
 * sf_s3_stats documents "503 SlowDown / 429 answers". */
Test(fetch, every_throttled_answer_is_counted)
{
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    cr_expect_eq(fetch_under_fault(3, 0, "busy.bin", 10 * KiB, "p503", &f, &p), SF_ERR_THROTTLED);
    sf_fetch_destroy(f);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(mock_stat("status", "503", NULL, NULL), 3);
    cr_expect_eq(s.throttled, 3, "%llu of 3 SlowDown answers counted", s.throttled);
}

Test(fetch, retry_quota_stops_retrying_a_failing_server)
{
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    /* a quota of 10: two retries of cost 5 */
    sf_status st = fetch_under_fault(50, 10, "down.bin", 100 * KiB, "p500", &f, &p);
    cr_expect_eq(st, SF_ERR_HTTP, "%s", sf_status_name(st));
    cr_expect(strstr(sf_fetch_errmsg(f), "quota"), "message: %s", sf_fetch_errmsg(f));
    cr_expect_eq(p.requests, 3, "first try and the two retries the quota pays for");
    sf_fetch_destroy(f);
    cr_expect_eq(mock_stat("keys", "bucket/down.bin", "requests", NULL), 3);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.retry_tokens, 0);
}

Test(fetch, rate_limited_prefix_backs_off_and_completes)
{
    start_mock(NULL);
    struct sf_s3_options o;
    opts_init(&o);
    o.concurrency = 16;
    o.chunk_bytes = 16 * KiB;
    o.throttle_base_ms = 100;
    client(&o);
    size_t n = 200 * 16 * KiB;
    unsigned char *want = put_object("thr/big.bin", n, 39);
    set_rules("prefix=bucket/thr/,rate_limit=50");
    struct sf_fetch *f = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/thr/big.bin", NULL, &f), SF_OK);
    /* the window regrows after the limit is met: watch its low point */
    unsigned low = 16;
    struct sf_fetch_progress p;
    sf_status st;
    while ((st = sf_fetch_wait(f, ~0ull, 20, &p)) == SF_ERR_TIMEOUT) {
        struct sf_s3_stats s = client_stats();
        if (s.concurrency_limit < low)
            low = s.concurrency_limit;
    }
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), sf_fetch_errmsg(f));
    expect_same_bytes(sf_fetch_data(f), want, n);
    sf_fetch_destroy(f);
    struct sf_s3_stats s = client_stats();
    cJSON *j = mock_stats();
    double ok = jnum(j, "status", "206", NULL, NULL);
    double limited = jnum(j, "faults", "rate_limit", NULL, NULL);
    cJSON_Delete(j);
    cr_expect_eq(ok, 200, "each range answered once");
    cr_expect_gt(s.throttled, 0, "the limit (50/s, burst 50) was hit");
    cr_expect_eq((double)s.throttled, limited, "every 503 SlowDown counted");
    cr_expect_lt(low, 16, "the window never shrank");
    /* 150 ranges past the burst, admitted at 50/s for 3 s. Retrying at once
     * would meet an empty bucket thousands of times; a halved window alone,
     * still sending every new range the moment one finishes, meets it once
     * per range that did not fit (over 100). Backing off and pacing to the
     * rate the server accepts keeps the 503s to a fraction: the cap recovers
     * by 10/s a second (docs/transport.md), so it probes past the limit
     * again every few seconds; 38-56 were seen over 12 runs with 1 and 2 I/O
     * threads on a loaded machine. */
    cr_expect_lt(s.throttled, 75, "%llu throttled answers for 200 ranges: a retry storm",
                 s.throttled);
    cr_expect_eq(s.requests, 200 + s.retries);
    free(want);
}
