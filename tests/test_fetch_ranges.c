/* The fetch engine's ranges: the first bytes first, on_data, priority over
 * prefetches, and several I/O threads sharing one object. Suite `fetch`
 * (test_fetch.c). */
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

/* ============================================================ first bytes first, priority */

/* Fetches key (size and ETag known, one request at a time) while the mock
 * changes the object after its first GET: the fetch delivers exactly its
 * first range, and the second range's failure names that range's bytes. */
static void expect_first_range(const char *key, unsigned long long first_range_bytes,
                               unsigned long long want_first, const char *want_second)
{
    size_t n = 3 * MiB;
    unsigned char *want = put_object(key, n, 90);
    char etag[35];
    mock_env_etag(want, n, etag);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.size = n;
    o.etag = etag;
    o.first_range_bytes = first_range_bytes;
    char url[300];
    snprintf(url, sizeof(url), "s3://bucket/%s", key);
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    sf_status st = fetch_sync(url, &o, &f, &p);
    cr_expect_eq(st, SF_ERR_CHANGED, "%s: %s: %s", key, sf_status_name(st), sf_fetch_errmsg(f));
    cr_expect_eq(p.requests, 2, "%s: the first range, then the second one (412)", key);
    cr_expect_eq(p.contiguous, want_first, "%s: the first range is %llu bytes", key, p.contiguous);
    cr_expect(strstr(sf_fetch_errmsg(f), want_second), "%s: expected '%s' in: %s", key, want_second,
              sf_fetch_errmsg(f));
    unsigned char *d = sf_fetch_data(f);
    cr_assert(d);
    cr_expect(memcmp(d, want, want_first) == 0, "%s: the first range's bytes differ", key);
    sf_fetch_destroy(f);
    free(want);
}

Test(fetch, first_range_is_small_and_the_next_ends_on_a_chunk_boundary)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.concurrency = 1; /* the second range starts after the first one is done */
    client(&so);        /* chunk 1 MiB */
    set_rules("prefix=bucket/first-,etag_change_after=1");
    expect_first_range("first-a.bin", 64 * KiB, 64 * KiB, "bytes 65536-1048575:");
    expect_first_range("first-b.bin", 0, SF_FETCH_FIRST_RANGE_DEFAULT, "bytes 262144-1048575:");
    /* never more than a chunk */
    expect_first_range("first-c.bin", 4 * MiB, MiB, "bytes 1048576-2097151:");
}

struct pieces {
    size_t n;
    unsigned char *count; /* how many times each byte was reported */
    const unsigned char *want;
    unsigned long long wrong; /* bytes reported with other content than the object's */
    unsigned long long calls;
};

static void on_piece(void *user, unsigned long long offset, const void *data, size_t len)
{
    struct pieces *pc = user;
    pc->calls++;
    for (size_t i = 0; i < len && offset + i < pc->n; i++) {
        pc->count[offset + i]++;
        if (((const unsigned char *)data)[i] != pc->want[offset + i])
            pc->wrong++;
    }
}

/* The observer sees every written byte once, with its content, even when
 * ranges are cut and resumed; the file destination gets the same bytes. */
Test(fetch, on_data_reports_each_byte_once_across_resets_and_retries)
{
    start_mock(NULL);
    default_client(); /* 4 in flight, chunk 1 MiB */
    size_t n = 5 * MiB + 4321;
    unsigned char *want = put_object("obs.bin", n, 91);
    queue_fault("bucket/obs.bin", "reset=70000", 2);
    queue_fault("bucket/obs.bin", "500", 1);
    int fd = open_scratch("obs.out");
    struct pieces pc = {.n = n, .count = calloc(1, n), .want = want};
    cr_assert(pc.count);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.fd = fd;
    o.on_data = on_piece;
    o.on_data_user = &pc;
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    cr_assert_eq(fetch_sync("s3://bucket/obs.bin", &o, &f, &p), SF_OK, "%s", sf_fetch_errmsg(f));
    cr_expect_geq(p.retries, 3);
    sf_fetch_destroy(f);
    size_t missing = 0, twice = 0;
    for (size_t i = 0; i < n; i++) {
        missing += pc.count[i] == 0;
        twice += pc.count[i] > 1;
    }
    cr_expect_eq(missing, 0, "%zu bytes never reported", missing);
    cr_expect_eq(twice, 0, "%zu bytes reported more than once", twice);
    cr_expect_eq(pc.wrong, 0, "%llu bytes reported with the wrong content", pc.wrong);
    /* gathered before writing: far fewer writes than 16 KiB callbacks */
    cr_expect_lt(pc.calls, n / (64 * KiB), "%llu writes for %zu bytes", pc.calls, n);
    unsigned char *got = malloc(n);
    cr_assert(got);
    cr_assert(pread(fd, got, n, 0) == (ssize_t)n);
    expect_same_bytes(got, want, n);
    close(fd);
    free(got);
    free(pc.count);
    free(want);
}

/* Starts a (size known) and b, both over a slow prefix with one request in
 * flight; b with priority from the start (mode 1), set after the start
 * (mode 2) or never (mode 0). Returns a's request count when b is done and
 * a's count right after b got its priority in *before. */
static unsigned race_a_and_b(int mode, unsigned *before, unsigned *a_ranges)
{
    size_t na = 2 * MiB, nb = 256 * KiB;
    unsigned char *wa = put_object("prio/a.bin", na, 92);
    unsigned char *wb = put_object("prio/b.bin", nb, 93);
    struct sf_fetch_options oa, ob;
    sf_fetch_options_init_default(&oa);
    oa.size = na;
    sf_fetch_options_init_default(&ob);
    ob.size = nb;
    ob.priority = mode == 1;
    struct sf_fetch *a = NULL, *b = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/prio/a.bin", &oa, &a), SF_OK);
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/prio/b.bin", &ob, &b), SF_OK);
    if (mode == 2)
        sf_fetch_set_priority(b, 1);
    struct sf_fetch_progress pa, pb;
    sf_fetch_progress(a, &pa);
    *before = pa.requests;
    cr_assert_eq(sf_fetch_wait(b, ~0ull, -1, &pb), SF_OK, "%s", sf_fetch_errmsg(b));
    sf_fetch_progress(a, &pa);
    unsigned during = pa.requests;
    cr_assert_eq(sf_fetch_wait(a, ~0ull, -1, &pa), SF_OK, "%s", sf_fetch_errmsg(a));
    *a_ranges = pa.requests;
    cr_expect_eq(memcmp(sf_fetch_data(a), wa, na), 0);
    cr_expect_eq(memcmp(sf_fetch_data(b), wb, nb), 0);
    sf_fetch_set_priority(b, 0); /* a finished fetch: no effect */
    sf_fetch_destroy(a);
    sf_fetch_destroy(b);
    free(wa);
    free(wb);
    return during;
}

Test(fetch, ranges_of_the_priority_fetch_start_before_a_prefetch)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.concurrency = 1;
    so.chunk_bytes = 64 * KiB; /* a: 32 ranges, b: 4 */
    client(&so);
    set_rules("prefix=bucket/prio/,latency_ms=10");
    unsigned before, a_ranges;
    /* Oldest first: every range of a is started before b's first. */
    unsigned during = race_a_and_b(0, &before, &a_ranges);
    cr_expect_eq(a_ranges, 32);
    cr_expect_eq(during, a_ranges, "without priority b waited for all of a's ranges");
    /* With priority, b's ranges go first: a starts at most the range it was
     * running, one more before the engine saw b, and one after b ended. */
    for (int mode = 1; mode <= 2; mode++) {
        during = race_a_and_b(mode, &before, &a_ranges);
        cr_expect_eq(a_ranges, 32);
        cr_expect_leq(during, before + 3, "mode %d: a started %u ranges while b ran (%u before)",
                      mode, during - before, before);
        cr_expect_lt(during, a_ranges, "mode %d: b waited for a", mode);
    }
}

/* ============================================================ several I/O threads */

static void threads_client(unsigned io_threads, unsigned concurrency, size_t chunk)
{
    struct sf_s3_options so;
    opts_init(&so);
    so.io_threads = io_threads;
    so.concurrency = concurrency;
    so.chunk_bytes = chunk;
    client(&so);
}

/*
 * Many objects and one large object of many ranges at once, into engine
 * memory and into a file: every byte right, each range asked once, and the
 * large object's ranges ran on more than one thread (on exactly one with
 * io_threads 1, so the hook tells the cases apart). The mock answers after
 * 20 ms, so every thread has work in flight before the first range is done.
 */
static void many_and_large(unsigned io_threads)
{
    start_mock(NULL);
    threads_client(io_threads, 8, 256 * KiB);
    set_rules("prefix=bucket/t/,latency_ms=20");
    enum { N = 24 };
    unsigned char *want[N];
    size_t size[N];
    struct sf_fetch *f[N];
    size_t ranges = put_numbered_objects("t", N, 1000, 61 * KiB, 200, 256 * KiB, want, size);
    size_t big_n = 8 * MiB + 12345; /* 33 ranges */
    unsigned char *big = put_object("t/big.bin", big_n, 250);
    ranges += 2 * ((big_n + 256 * KiB - 1) / (256 * KiB));
    int fd = open_scratch("big.out");
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.fd = fd;
    struct sf_fetch *bm = NULL, *bf = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/t/big.bin", NULL, &bm), SF_OK);
    start_numbered_fetches("t", N, f);
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/t/big.bin", &fo, &bf), SF_OK);
    struct sf_fetch_progress p;
    sf_status st = sf_fetch_wait(bm, ~0ull, -1, &p);
    cr_assert_eq(st, SF_OK, "%s", sf_fetch_errmsg(bm));
    cr_expect_eq(p.contiguous, big_n);
    expect_same_bytes(sf_fetch_data(bm), big, big_n);
    unsigned used = sf__fetch_io_threads_used(bm);
    if (io_threads == 1)
        cr_expect_eq(used, 1);
    else
        cr_expect_geq(used, 2, "the 33 ranges of one object ran on %u of %u threads", used,
                      io_threads);
    for (size_t i = 0; i < N; i++) {
        st = sf_fetch_wait(f[i], ~0ull, -1, &p);
        cr_expect_eq(st, SF_OK, "object %zu: %s", i, sf_fetch_errmsg(f[i]));
        cr_expect_eq(p.contiguous, size[i]);
        if (st == SF_OK)
            expect_same_bytes(sf_fetch_data(f[i]), want[i], size[i]);
    }
    st = sf_fetch_wait(bf, ~0ull, -1, &p);
    cr_assert_eq(st, SF_OK, "%s", sf_fetch_errmsg(bf));
    unsigned char *got = malloc(big_n);
    cr_assert(got);
    cr_assert(pread(fd, got, big_n, 0) == (ssize_t)big_n);
    expect_same_bytes(got, big, big_n);
    if (io_threads > 1)
        cr_expect_geq(sf__fetch_io_threads_used(bf), 2);
    free(got);
    close(fd);
    sf_fetch_destroy(bm);
    sf_fetch_destroy(bf);
    for (size_t i = 0; i < N; i++) {
        sf_fetch_destroy(f[i]);
        free(want[i]);
    }
    free(big);
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.objects_done, N + 2);
    cr_expect_eq(s.requests, ranges, "each range asked once");
    cr_expect_leq(s.connections, 8, "concurrency is the total over the threads");
    cr_expect_leq(s.concurrency_limit, 8);
}

Test(fetch, one_io_thread_runs_every_range)
{
    many_and_large(1);
}

Test(fetch, two_io_threads_share_the_ranges_of_one_object)
{
    many_and_large(2);
}

Test(fetch, four_io_threads_share_the_ranges_of_one_object)
{
    many_and_large(4);
}

/*
 * One object of unknown size alone: the probe runs on one thread, and the
 * ranges its answer lays out go to the others too, at once (not after their
 * poll timeout): 33 ranges of 20 ms on 4 threads, in well under a second.
 */
Test(fetch, the_ranges_after_a_probe_reach_every_thread)
{
    start_mock(NULL);
    threads_client(4, 8, 256 * KiB);
    set_rules("prefix=bucket/t/,latency_ms=20");
    size_t n = 8 * MiB + 1;
    unsigned char *want = put_object("t/alone.bin", n, 266);
    struct sf_fetch *f = NULL;
    struct sf_fetch_progress p;
    cr_assert_eq(fetch_sync("s3://bucket/t/alone.bin", NULL, &f, &p), SF_OK, "%s",
                 sf_fetch_errmsg(f));
    expect_same_bytes(sf_fetch_data(f), want, n);
    cr_expect_geq(sf__fetch_io_threads_used(f), 3, "ran on %u of 4 threads",
                  sf__fetch_io_threads_used(f));
    sf_fetch_destroy(f);
    free(want);
}

/* Random resets on 4 threads: every range resumes where its bytes stop. */
Test(fetch, four_io_threads_resume_reset_ranges_exactly_once)
{
    start_mock(NULL);
    threads_client(4, 8, 256 * KiB);
    size_t n = 6 * MiB + 777;
    unsigned char *want = put_object("r/reset.bin", n, 260);
    set_rules("prefix=bucket/r/,reset=0.3");
    struct sf_fetch_progress p;
    expect_fetch_whole("r/reset.bin", want, n, &p);
    cr_expect_gt(p.retries, 0, "no reset happened");
    struct sf_s3_stats s = client_stats();
    cr_expect_eq(s.bytes_received, n, "every byte written exactly once");
    free(want);
}

Test(fetch, four_io_threads_missing_object_fails_naming_it)
{
    start_mock(NULL);
    threads_client(4, 8, 256 * KiB);
    unsigned char *want = put_object("there.bin", MiB + 3, 261);
    expect_fetch_fails("s3://bucket/not-there.bin", NULL, SF_ERR_NOT_FOUND,
                       "s3://bucket/not-there.bin");
    struct sf_fetch_progress p;
    expect_fetch_whole("there.bin", want, MiB + 3, &p);
    free(want);
}

/*
 * A range fails for good while the other ranges of its object run on other
 * threads: the fetch fails naming the object and the range, its other
 * transfers are taken out where they run, nothing lands after the failure is
 * reported, and the client goes on.
 */
Test(fetch, a_range_failing_on_one_thread_stops_the_others)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.io_threads = 4;
    so.concurrency = 8;
    so.chunk_bytes = 512 * KiB;
    so.max_attempts = 1;
    client(&so);
    size_t n = 8 * MiB;
    unsigned char *want = put_object("fail/big.bin", n, 262);
    /* The answers come 100 ms late, the 500 too: by then the ranges of the
     * first burst are out on every thread (slow start sends half the window
     * at once), so the failure has others to stop whatever the load. */
    set_rules("prefix=bucket/fail/,bandwidth=256K,latency_ms=100");
    queue_fault("bucket/fail/big.bin", "500", 1);
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.size = n; /* every range starts at once */
    struct sf_fetch *f = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/fail/big.bin", &fo, &f), SF_OK);
    struct sf_fetch_progress p;
    sf_status st = sf_fetch_wait(f, ~0ull, -1, &p);
    cr_expect_eq(st, SF_ERR_HTTP, "%s: %s", sf_status_name(st), sf_fetch_errmsg(f));
    cr_expect(p.done);
    const char *msg = sf_fetch_errmsg(f);
    cr_expect(strstr(msg, "s3://bucket/fail/big.bin bytes ") && strstr(msg, "500"), "%s", msg);
    cr_expect_geq(sf__fetch_io_threads_used(f), 2);
    unsigned long long received = p.received;
    sf_fetch_destroy(f);
    cr_expect_lt(received, n, "the failure waited for the other ranges");
    struct sf_s3_stats s1, s2;
    sf_s3_get_stats(s3, &s1);
    cr_expect_eq(s1.objects_failed, 1);
    usleep(300 * 1000);
    sf_s3_get_stats(s3, &s2);
    cr_expect_eq(s2.bytes_received, s1.bytes_received, "bytes arrived after the failure");
    set_rules("");
    expect_put_and_fetch("after2.bin", 3 * MiB + 1, 263, &p);
    free(want);
}

Test(fetch, four_io_threads_destroy_cancels_ranges_on_every_thread)
{
    start_mock(NULL);
    threads_client(4, 8, 512 * KiB);
    size_t n = 8 * MiB;
    unsigned char *slow = put_object("cancel/slow4.bin", n, 264);
    set_rules("prefix=bucket/cancel/,bandwidth=256K");
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.size = n;
    struct sf_fetch *f = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/cancel/slow4.bin", &fo, &f), SF_OK);
    struct sf_fetch_progress p;
    for (int i = 0; i < 200 && sf__fetch_io_threads_used(f) < 2; i++)
        usleep(10 * 1000);
    cr_expect_geq(sf__fetch_io_threads_used(f), 2);
    cr_assert_eq(sf_fetch_wait(f, 1, -1, &p), SF_OK);
    cr_expect_eq(p.done, 0);
    sf_fetch_destroy(f);
    struct sf_s3_stats s, s2;
    sf_s3_get_stats(s3, &s);
    cr_expect_lt(s.bytes_received, n);
    cr_expect_eq(s.objects_failed, 0, "a cancel is not a failure");
    usleep(300 * 1000);
    sf_s3_get_stats(s3, &s2);
    cr_expect_eq(s2.bytes_received, s.bytes_received, "bytes arrived after the destroy");
    expect_put_and_fetch("after4.bin", 2 * MiB + 5, 265, &p);
    free(slow);
}

Test(fetch, io_threads_over_the_limit_is_refused)
{
    start_mock(NULL);
    struct sf_s3_options so;
    opts_init(&so);
    so.io_threads = 65;
    char err[256] = "";
    cr_expect_eq(sf_s3_new(&so, &s3, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "io_threads"), "%s", err);
    cr_expect_null(s3);
}
