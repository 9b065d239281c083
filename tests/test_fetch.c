/* The fetch engine (sf_fetch_*), driven against the mock S3 server: every
 * test starts its own server on a free port with a fresh root and stops it.
 * Faults are forced through the mock's admin endpoints and counted with its
 * exact statistics, so attempt counts are asserted exactly.
 *
 * One suite, `fetch`, in one executable: this file (destinations, progress,
 * cancel, TLS, unsigned and local URLs), test_fetch_faults.c (faults and
 * attempts) and test_fetch_ranges.c (first bytes first, priority, several
 * I/O threads), over fetch_fixture.c. */
#include "fetch_fixture.h"

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
#include <sys/stat.h>
#include <unistd.h>

TestSuite(fetch, .fini = fetch_teardown, .timeout = 60);

/* An engine with nothing to do sleeps: after a fetch (the slow start's rate
 * cap holds tokens then), half a second idle costs each I/O thread at most a
 * turn or two of its loop (its poll waits up to 1 s or a wake-up). Before,
 * a token in the bucket made the wait 0 and every I/O thread spun. */
Test(fetch, an_idle_engine_sleeps)
{
    start_mock(NULL);
    struct sf_s3_options o;
    opts_init(&o);
    o.io_threads = 2;
    client(&o);
    unsigned char *want = put_object("idle.bin", 64 * KiB, 91);
    struct sf_fetch_progress p;
    expect_fetch_whole("idle.bin", want, 64 * KiB, &p);
    free(want);
    unsigned long long before = sf__engine_io_loops(s3->engine);
    usleep(500 * 1000);
    unsigned long long turns = sf__engine_io_loops(s3->engine) - before;
    cr_expect_leq(turns, 8ull, "idle I/O threads turned %llu times in 0.5 s", turns);
}

/* ============================================================ destinations */

Test(fetch, whole_object_into_engine_memory_with_unknown_size)
{
    size_t n = 3 * MiB + 12345; /* not a multiple of the chunk */
    unsigned char *want = start_with_object("whole.bin", n, 1);
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    cr_assert_eq(fetch_sync("s3://bucket/whole.bin", NULL, &f, &p), SF_OK, "%s",
                 sf_fetch_errmsg(f));
    cr_expect_eq(p.total, n);
    cr_expect_eq(p.object_size, n);
    cr_expect_eq(p.contiguous, n);
    cr_expect_eq(p.received, n);
    cr_expect_eq(p.requests, 5,
                 "the 256 KiB probe (first range), the rest of the first MiB, three more ranges");
    cr_expect_eq(p.retries, 0);
    cr_expect_eq(p.status, SF_OK);
    expect_same_bytes(sf_fetch_data(f), want, n);
    char etag[35];
    mock_env_etag(want, n, etag);
    cr_expect_str_eq(sf_fetch_etag(f), etag);
    cr_expect_str_eq(sf_fetch_errmsg(f), "");
    sf_fetch_destroy(f);

    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "keys", "bucket/whole.bin", "operations", "GetObject"), 5);
    cr_expect_eq(jnum(j, "keys", "bucket/whole.bin", "status", "206"), 5);
    cr_expect_eq(jnum(j, "operations", "HeadObject", NULL, NULL), 0, "the probe is a GET");
    cr_expect_eq(jnum(j, "bytes_sent", NULL, NULL, NULL), n, "every byte sent once");
    cJSON_Delete(j);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.requests, 5);
    cr_expect_eq(s.bytes_received, n);
    cr_expect_eq(s.objects_done, 1);
    cr_expect_eq(s.objects_failed, 0);
    free(want);
}

Test(fetch, into_a_caller_buffer_and_a_too_small_one)
{
    size_t n = 2 * MiB + 7;
    unsigned char *want = start_with_object("buf.bin", n, 2);
    unsigned char *buf = malloc(n + 16);
    cr_assert(buf);
    memset(buf, 0xA5, n + 16);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.buffer = buf;
    o.buffer_bytes = n + 16;
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    cr_assert_eq(fetch_sync("s3://bucket/buf.bin", &o, &f, &p), SF_OK, "%s", sf_fetch_errmsg(f));
    cr_expect_null(sf_fetch_data(f), "a caller destination is not engine memory");
    cr_expect_eq(p.total, n);
    expect_same_bytes(buf, want, n);
    for (size_t i = n; i < n + 16; i++)
        cr_expect_eq(buf[i], 0xA5, "byte %zu past the object was written", i);
    sf_fetch_destroy(f);

    /* one byte short */
    o.buffer_bytes = n - 1;
    expect_fetch_fails("s3://bucket/buf.bin", &o, SF_ERR_LIMIT, "buffer");
    free(buf);
    free(want);
}

Test(fetch, into_an_fd_at_a_file_offset)
{
    size_t n = 2 * MiB + 333;
    unsigned char *want = start_with_object("fd.bin", n, 3);
    int fd = open_scratch("out.bin");
    unsigned char lead[100];
    memset(lead, 'L', sizeof(lead));
    cr_assert(pwrite(fd, lead, sizeof(lead), 0) == (ssize_t)sizeof(lead));
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.fd = fd;
    o.file_offset = 100;
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    cr_assert_eq(fetch_sync("s3://bucket/fd.bin", &o, &f, &p), SF_OK, "%s", sf_fetch_errmsg(f));
    cr_expect_null(sf_fetch_data(f));
    sf_fetch_destroy(f);
    struct stat sb;
    cr_assert(fstat(fd, &sb) == 0);
    cr_expect_eq((size_t)sb.st_size, 100 + n);
    unsigned char *got = malloc(n + 100);
    cr_assert(got);
    cr_assert(pread(fd, got, n + 100, 0) == (ssize_t)(n + 100));
    cr_expect(memcmp(got, lead, 100) == 0, "bytes before file_offset were overwritten");
    expect_same_bytes(got + 100, want, n);

    /* a sub-range into the same file, at another offset */
    o.offset = MiB - 10;
    o.length = MiB + 20;
    o.file_offset = 5;
    cr_assert_eq(fetch_sync("s3://bucket/fd.bin", &o, &f, &p), SF_OK, "%s", sf_fetch_errmsg(f));
    cr_expect_eq(p.total, MiB + 20);
    sf_fetch_destroy(f);
    cr_assert(pread(fd, got, MiB + 20, 5) == (ssize_t)(MiB + 20));
    expect_same_bytes(got, want + MiB - 10, MiB + 20);
    close(fd);
    free(got);
    free(want);
}

/* O_APPEND makes pwrite() ignore its offset: before the fix the ranges
 * were appended in the order they arrived, a scrambled file, SF_OK. */
Test(fetch, an_fd_open_for_appending_is_refused)
{
    unsigned char *want = start_with_object("app.bin", MiB, 4);
    int fd = open_scratch("app.bin");
    cr_assert(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_APPEND) == 0);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.fd = fd;
    struct sf_fetch *f = NULL;
    cr_expect_eq(sf_fetch_start(s3, "s3://bucket/app.bin", &o, &f), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(f);
    char msg[512];
    const char *m = sf_s3_errmsg(s3, msg, sizeof(msg));
    cr_expect(strstr(m, "O_APPEND") && strstr(m, "s3://bucket/app.bin"), "message: %s", m);
    struct stat sb;
    cr_assert(fstat(fd, &sb) == 0);
    cr_expect_eq(sb.st_size, 0, "%lld bytes written", (long long)sb.st_size);
    close(fd);
    free(want);
}

Test(fetch, offset_and_length_sub_ranges)
{
    size_t n = 3 * MiB + 5;
    unsigned char *want = start_with_object("sub.bin", n, 4);
    char etag[35];
    mock_env_etag(want, n, etag);
    struct {
        unsigned long long offset, length;
        int known_size;
    } cases[] = {
        {0, 1, 0},
        {1000, 1536 * KiB, 0},
        {MiB - 1, 2, 0},              /* across a chunk boundary */
        {MiB, MiB, 0},                /* exactly one aligned chunk */
        {n - 10, SF_SIZE_UNKNOWN, 0}, /* to the end */
        {n - 10, 1000, 0},            /* length past the end: clipped */
        {12345, 2 * MiB + 1, 1},
        {n - 1, SF_SIZE_UNKNOWN, 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sf_fetch_options o;
        sf_fetch_options_init_default(&o);
        o.offset = cases[i].offset;
        o.length = cases[i].length;
        if (cases[i].known_size) {
            o.size = n;
            o.etag = etag;
        }
        unsigned long long end =
            o.length == SF_SIZE_UNKNOWN || o.offset + o.length > n ? n : o.offset + o.length;
        size_t len = (size_t)(end - o.offset);
        struct sf_fetch *f = NULL;
        struct sf_fetch_progress p;
        sf_status st = fetch_sync("s3://bucket/sub.bin", &o, &f, &p);
        cr_assert_eq(st, SF_OK, "case %zu: %s: %s", i, sf_status_name(st), sf_fetch_errmsg(f));
        cr_expect_eq(p.total, len, "case %zu", i);
        cr_expect_eq(p.object_size, n, "case %zu", i);
        cr_expect_eq(p.contiguous, len, "case %zu", i);
        unsigned char *d = sf_fetch_data(f);
        cr_assert(d, "case %zu", i);
        cr_expect(memcmp(d, want + o.offset, len) == 0, "case %zu: bytes differ", i);
        sf_fetch_destroy(f);
    }

    /* offset past the end */
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.offset = n + 1;
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync("s3://bucket/sub.bin", &o, &f, &p);
    cr_expect_eq(st, SF_ERR_RANGE, "%s: %s", sf_status_name(st), f ? sf_fetch_errmsg(f) : "");
    sf_fetch_destroy(f);
    free(want);
}

Test(fetch, small_and_empty_objects)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.chunk_bytes = 256 * KiB;
    client(&so);
    size_t sizes[] = {0, 1, 1000, 256 * KiB - 1, 256 * KiB, 256 * KiB + 1, 3 * 256 * KiB + 17};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char key[64];
        snprintf(key, sizeof(key), "small-%zu.bin", sizes[i]);
        unsigned char *want = put_object(key, sizes[i], 10 + (unsigned)i);
        struct sf_fetch_progress p;
        expect_fetch_whole(key, want, sizes[i], &p);
        cr_expect_eq(p.object_size, sizes[i], "size %zu", sizes[i]);
        size_t chunks = sizes[i] == 0 ? 1 : (sizes[i] + 256 * KiB - 1) / (256 * KiB);
        cr_expect_eq(p.requests, chunks, "size %zu: %u requests, want %zu", sizes[i], p.requests,
                     chunks);
        free(want);
    }
}

Test(fetch, known_size_and_etag_from_a_listing)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.chunk_bytes = 256 * KiB;
    client(&so);
    size_t sizes[] = {0, 1, 300 * KiB, 1 * MiB + 3};
    unsigned char *want[4];
    for (size_t i = 0; i < 4; i++) {
        char key[64];
        snprintf(key, sizeof(key), "ds/part-%zu.bin", i);
        want[i] = put_object(key, sizes[i], 20 + (unsigned)i);
    }
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_expand(s3, "s3://bucket/ds/", 0, &l), SF_OK);
    cr_assert_eq(sf_object_list_count(l), 4);
    admin("POST", "/_mock/reset", NULL, NULL);
    unsigned expected_gets = 0;
    for (size_t i = 0; i < 4; i++) {
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_assert_eq(it->size, sizes[i], "%s", it->key);
        char etag[35];
        mock_env_etag(want[i], sizes[i], etag);
        cr_expect_str_eq(it->etag, etag);
        struct sf_fetch_options o;
        sf_fetch_options_init_default(&o);
        o.size = it->size;
        o.etag = it->etag;
        struct sf_fetch *f = NULL;
        struct sf_fetch_progress p;
        sf_status st = fetch_sync(it->url, &o, &f, &p);
        cr_assert_eq(st, SF_OK, "%s: %s", it->url, sf_fetch_errmsg(f));
        cr_expect_eq(p.total, sizes[i]);
        cr_expect_str_eq(sf_fetch_etag(f), etag);
        unsigned chunks = (unsigned)((sizes[i] + 256 * KiB - 1) / (256 * KiB));
        cr_expect_eq(p.requests, chunks, "%s: no probe when the size is known", it->url);
        expected_gets += chunks;
        cr_assert(sf_fetch_data(f));
        expect_same_bytes(sf_fetch_data(f), want[i], sizes[i]);
        sf_fetch_destroy(f);
        free(want[i]);
    }
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "GetObject", NULL, NULL), expected_gets,
                 "an empty object of known size needs no request");
    cr_expect_eq(jnum(j, "status", "412", NULL, NULL), 0, "If-Match with the listing's ETag holds");
    cJSON_Delete(j);
    sf_object_list_destroy(l);
}

/* An ETag from a store that lists it bare (Ceph RGW, NetApp ONTAP) or from a
 * proxy that weakened it is the object's ETag all the same: the fetch sends
 * it as If-Match and checks each range's quoted ETag against it. Compared
 * as given, every range read as a changed object (SF_ERR_CHANGED). */
Test(fetch, a_bare_or_weak_etag_from_a_listing_matches_the_quoted_header)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.chunk_bytes = 256 * KiB;
    client(&so);
    size_t n = 1 * MiB + 3;
    unsigned char *want = put_object("ds/bare.bin", n, 41);
    char quoted[35];
    mock_env_etag(want, n, quoted);
    char bare[35], weak[40];
    snprintf(bare, sizeof(bare), "%.32s", quoted + 1);
    snprintf(weak, sizeof(weak), "W/%s", quoted);
    const char *forms[] = {bare, weak};
    for (size_t i = 0; i < 2; i++) {
        struct sf_fetch_options o;
        sf_fetch_options_init_default(&o);
        o.size = n;
        o.etag = forms[i];
        struct sf_fetch *f = NULL;
        struct sf_fetch_progress p;
        sf_status st = fetch_sync("s3://bucket/ds/bare.bin", &o, &f, &p);
        cr_expect_eq(st, SF_OK, "ETag %s: %s: %s", forms[i], sf_status_name(st),
                     sf_fetch_errmsg(f));
        cr_expect_str_eq(sf_fetch_etag(f), quoted, "the ETag in its one form");
        if (st == SF_OK)
            expect_same_bytes(sf_fetch_data(f), want, n);
        sf_fetch_destroy(f);
    }
    cr_expect_eq(mock_stat("status", "412", NULL, NULL), 0, "If-Match held");
    free(want);
}

/* ============================================================ progress and cancel */

Test(fetch, wait_returns_on_a_contiguous_prefix_before_the_end)
{
    start_mock(NULL);
    sized_client(2, 256 * KiB);
    size_t n = 3 * MiB;
    unsigned char *want = put_object("slow.bin", n, 40);
    set_rules("prefix=bucket/slow.bin,bandwidth=1M"); /* per connection: >= 1.5 s in all */
    unsigned char *buf = calloc(1, n);
    cr_assert(buf);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.buffer = buf;
    o.buffer_bytes = n;
    struct sf_fetch *f = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/slow.bin", &o, &f), SF_OK);
    struct sf_fetch_progress p;
    sf_status st = sf_fetch_wait(f, 300 * KiB, -1, &p);
    cr_assert_eq(st, SF_OK, "%s", sf_status_name(st));
    cr_expect_geq(p.contiguous, 300 * KiB);
    cr_expect_eq(p.done, 0, "the whole object arrived already: the wait did not return early");
    cr_expect_lt(p.contiguous, n);
    cr_expect_eq(p.total, n);
    cr_expect_leq(p.contiguous, p.received);
    cr_expect(memcmp(buf, want, p.contiguous) == 0, "the contiguous prefix is not final");
    /* a wait that cannot be met in time */
    struct sf_fetch_progress q;
    cr_expect_eq(sf_fetch_wait(f, n, 0, &q), SF_ERR_TIMEOUT);
    unsigned long long last = p.contiguous;
    unsigned steps = 0;
    while (!p.done) {
        st = sf_fetch_wait(f, last + 1, 5000, &p);
        cr_assert(st == SF_OK || st == SF_ERR_TIMEOUT, "%s", sf_status_name(st));
        cr_assert_geq(p.contiguous, last, "contiguous went back from %llu to %llu", last,
                      p.contiguous);
        cr_assert_leq(p.contiguous, p.received);
        cr_assert(memcmp(buf, want, p.contiguous) == 0, "prefix of %llu bytes not final",
                  p.contiguous);
        last = p.contiguous;
        steps++;
    }
    cr_expect_eq(p.status, SF_OK);
    cr_expect_eq(p.contiguous, n);
    cr_expect_gt(steps, 1, "progress came in steps");
    expect_same_bytes(buf, want, n);
    sf_fetch_destroy(f);
    free(buf);
    free(want);
}

Test(fetch, destroy_cancels_a_slow_fetch_and_the_client_stays_usable)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.chunk_bytes = 512 * KiB;
    client(&so);
    size_t n = 4 * MiB;
    unsigned char *slow = put_object("cancel/slow.bin", n, 41);
    unsigned char *want = put_object("after.bin", MiB + 1, 42);
    set_rules("prefix=bucket/cancel/,bandwidth=256K"); /* 4 connections: >= 4 s in all */
    struct sf_fetch *f = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/cancel/slow.bin", NULL, &f), SF_OK);
    struct sf_fetch_progress p;
    cr_assert_eq(sf_fetch_wait(f, 1, -1, &p), SF_OK);
    cr_expect_eq(p.done, 0);
    sf_fetch_destroy(f);
    struct sf_s3_stats s = client_stats();
    cr_expect_lt(s.bytes_received, n, "destroy waited for the whole transfer");
    cr_expect_eq(s.objects_done, 0);
    cr_expect_eq(s.objects_failed, 0, "a cancel is not a failure");
    struct sf_s3_stats s2 = client_stats();
    cr_expect_eq(s2.bytes_received, s.bytes_received, "bytes arrived after the destroy");
    struct sf_fetch_progress q;
    expect_fetch_whole("after.bin", want, MiB + 1, &q);
    free(slow);
    free(want);
}

Test(fetch, twenty_concurrent_fetches_share_keep_alive_connections)
{
    start_mock(NULL);
    sized_client(8, 64 * KiB);
    enum { N = 20 };
    unsigned char *want[N];
    size_t size[N];
    struct sf_fetch *f[N];
    size_t total_chunks =
        put_numbered_objects("many", N, 10 * KiB, 37 * KiB, 50, 64 * KiB, want, size);
    start_numbered_fetches("many", N, f);
    for (size_t i = 0; i < N; i++) {
        struct sf_fetch_progress p;
        sf_status st = sf_fetch_wait(f[i], ~0ull, -1, &p);
        cr_expect_eq(st, SF_OK, "object %zu: %s", i, sf_fetch_errmsg(f[i]));
        cr_expect_eq(p.total, size[i]);
        if (st == SF_OK)
            expect_same_bytes(sf_fetch_data(f[i]), want[i], size[i]);
    }
    for (size_t i = 0; i < N; i++) {
        sf_fetch_destroy(f[i]);
        free(want[i]);
    }
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.objects_done, N);
    cr_expect_eq(s.requests, total_chunks);
    cr_expect_gt(s.requests, 8);
    cr_expect_leq(s.connections, 8, "%u connections for %llu requests: no keep-alive",
                  s.connections, s.requests);
    cr_expect_geq(s.connections, 1);
}

/* ============================================================ TLS, http, local */

static void tls_case(const char *ca, int insecure, sf_status want_st)
{
    start_mock_tls();
    struct sf_s3_options o;
    opts_init(&o);
    o.ca_bundle = ca ? cert_file : NULL;
    o.insecure = insecure;
    client(&o);
    size_t n = MiB + 4321;
    unsigned char *want = put_object("tls.bin", n, 60);
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync("s3://bucket/tls.bin", NULL, &f, &p);
    cr_expect_eq(st, want_st, "%s: %s", sf_status_name(st), sf_fetch_errmsg(f));
    if (want_st == SF_OK) {
        cr_assert(sf_fetch_data(f));
        expect_same_bytes(sf_fetch_data(f), want, n);
    } else {
        cr_expect(strstr(sf_fetch_errmsg(f), "certificate"), "message: %s", sf_fetch_errmsg(f));
        cr_expect_eq(p.requests, 1, "a certificate error is not retried");
    }
    sf_fetch_destroy(f);
    free(want);
}

Test(fetch, tls_with_the_test_ca_bundle)
{
    tls_case("cert", 0, SF_OK);
}

Test(fetch, tls_with_the_system_store_fails_verification)
{
    tls_case(NULL, 0, SF_ERR_NETWORK);
}

Test(fetch, tls_insecure_skips_verification)
{
    tls_case(NULL, 1, SF_OK);
}

/* Fetches bucket/key by its plain http:// URL on the mock (no s3://). */
static sf_status fetch_http(const char *key, struct sf_fetch **f, struct sf_fetch_progress *p)
{
    char url[256];
    snprintf(url, sizeof(url), "%s/bucket/%s", base, key);
    return fetch_sync(url, NULL, f, p);
}

Test(fetch, unsigned_http_url_from_an_anonymous_server)
{
    const char *args[] = {"--anonymous", NULL};
    start_mock(args);
    unsigned_client();
    size_t n = 2 * MiB + 1;
    unsigned char *want = put_object("pub/open.bin", n, 61);
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_http("pub/open.bin", &f, &p);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), sf_fetch_errmsg(f));
    cr_expect_eq(p.total, n);
    expect_same_bytes(sf_fetch_data(f), want, n);
    sf_fetch_destroy(f);
    cr_expect_eq(mock_stat("keys", "bucket/pub/open.bin", "status", "206"), 4);
    free(want);
}

Test(fetch, unsigned_http_url_without_anonymous_access_is_denied)
{
    start_mock(NULL);
    unsigned_client();
    free(put_object("closed.bin", 10, 62));
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_http("closed.bin", &f, &p);
    cr_expect_eq(st, SF_ERR_ACCESS_DENIED, "%s: %s", sf_status_name(st), sf_fetch_errmsg(f));
    cr_expect_eq(p.requests, 1);
    sf_fetch_destroy(f);
}

Test(fetch, local_files_into_memory_and_fd)
{
    make_root();
    snprintf(base, sizeof(base), "http://127.0.0.1:1"); /* never contacted */
    default_client();
    size_t n = 300 * KiB + 3;
    unsigned char *want = malloc(n);
    cr_assert(want);
    test_fill(want, n, 70);
    cr_assert(test_write_file(tmp, "local dir/data.bin", want, n) == 0);
    char path[800], url[820];
    snprintf(path, sizeof(path), "%s/local dir/data.bin", tmp);
    snprintf(url, sizeof(url), "file://%s/local%%20dir/data.bin", tmp);

    const char *srcs[] = {path, url};
    for (size_t i = 0; i < 2; i++) {
        struct sf_fetch *f = NULL;
        struct sf_fetch_progress p;
        sf_status st = fetch_sync(srcs[i], NULL, &f, &p);
        cr_assert_eq(st, SF_OK, "%s: %s", srcs[i], sf_fetch_errmsg(f));
        cr_expect(p.done);
        cr_expect_eq(p.total, n);
        cr_expect_eq(p.object_size, n);
        cr_expect_eq(p.contiguous, n);
        expect_same_bytes(sf_fetch_data(f), want, n);
        sf_fetch_destroy(f);

        /* a sub-range into an fd at a file offset */
        char out[32];
        snprintf(out, sizeof(out), "out-%zu.bin", i);
        int fd = open_scratch(out);
        struct sf_fetch_options o;
        sf_fetch_options_init_default(&o);
        o.fd = fd;
        o.file_offset = 10;
        o.offset = 1000;
        o.length = 200 * KiB;
        st = fetch_sync(srcs[i], &o, &f, &p);
        cr_assert_eq(st, SF_OK, "%s: %s", srcs[i], sf_fetch_errmsg(f));
        cr_expect_eq(p.total, 200 * KiB);
        sf_fetch_destroy(f);
        unsigned char *got = malloc(200 * KiB);
        cr_assert(got);
        cr_assert(pread(fd, got, 200 * KiB, 10) == (ssize_t)(200 * KiB));
        expect_same_bytes(got, want + 1000, 200 * KiB);
        struct stat sb;
        cr_assert(fstat(fd, &sb) == 0);
        cr_expect_eq((size_t)sb.st_size, 10 + 200 * KiB);
        free(got);
        close(fd);
    }

    char missing[800];
    snprintf(missing, sizeof(missing), "%s/nope.bin", tmp);
    expect_fetch_fails(missing, NULL, SF_ERR_NOT_FOUND, "nope.bin");
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.requests, 0, "local files need no request");
    free(want);
}

/* One destination only, for S3 and local sources alike (a local read once
 * filled the buffer past buffer_bytes when an fd was given too). */
Test(fetch, both_a_buffer_and_an_fd_are_refused)
{
    free(start_with_object("two.bin", 1000, 80));
    cr_assert(test_write_file(tmp, "local.bin", "0123456789abcdef", 16) == 0);
    char path[700];
    snprintf(path, sizeof(path), "%s/local.bin", tmp);
    int fd = open_scratch("out.bin");
    unsigned char *small = malloc(4);
    cr_assert(small);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.buffer = small;
    o.buffer_bytes = 4;
    o.fd = fd;
    const char *srcs[] = {"s3://bucket/two.bin", path};
    for (size_t i = 0; i < 2; i++) {
        struct sf_fetch *f = NULL;
        sf_status st = sf_fetch_start(s3, srcs[i], &o, &f);
        if (st == SF_OK) {
            struct sf_fetch_progress p;
            st = sf_fetch_wait(f, ~0ull, -1, &p);
            sf_fetch_destroy(f);
        }
        cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s: %s", srcs[i], sf_status_name(st));
        char buf[512];
        cr_expect(strstr(sf_s3_errmsg(s3, buf, sizeof(buf)), "one destination"), "%s: %s", srcs[i],
                  buf);
    }
    close(fd);
    free(small);
}
