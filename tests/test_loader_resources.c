/* What a loader holds over time: descriptors, threads and mappings counted
 * (from /proc/self) before and after cycles of open / epochs / close, over
 * local files and the mock with faults, after opens that fail at each step
 * and after an error mid-epoch; a low descriptor limit. Suite `loader`
 * (test_loader.c). */
#include "loader_fixture.h"
#include "support/mock_proc.h"
#include "support/spawn.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Entries of a /proc/self folder (the one this reads excluded). */
static unsigned count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static unsigned n_fds(void)
{
    return count_entries("/proc/self/fd") - 1; /* the DIR's own */
}

static unsigned n_threads(void)
{
    return count_entries("/proc/self/task");
}

static unsigned n_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert(f);
    unsigned n = 0;
    int c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

struct held {
    unsigned fds, threads, maps;
};

static struct held held_now(void)
{
    struct held h = {n_fds(), n_threads(), n_maps()};
    return h;
}

/* The same descriptors and threads as at `before`; mappings within slack
 * (malloc arenas of threads that ran come and go). */
static void expect_same(struct held before, unsigned maps_slack, const char *what)
{
    struct held now = held_now();
    cr_assert_eq(now.fds, before.fds, "%s: %u descriptors open, %u before", what, now.fds,
                 before.fds);
    cr_assert_eq(now.threads, before.threads, "%s: %u threads, %u before", what, now.threads,
                 before.threads);
    cr_assert_leq(now.maps, before.maps + maps_slack, "%s: %u mappings, %u before", what, now.maps,
                  before.maps);
}

/* Opens, reads up to max_batches of each epoch in epochs (set_epoch between
 * them), closes. */
static void cycle(const struct sf_loader_options *o, unsigned epochs, unsigned max_batches)
{
    struct sf_loader *l = open_loader(o);
    for (unsigned e = 0; e < epochs; e++) {
        if (e)
            cr_assert_eq(sf_loader_set_epoch(l, e), SF_OK, "%s", sf_loader_errmsg(l));
        struct epoch_log log;
        sf_status st = run_epoch(l, &log, max_batches);
        cr_assert(st == SF_OK || st == SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
        free(log.seen);
    }
    sf_loader_close(l);
}

Test(loader, local_cycles_give_back_descriptors_threads_and_mappings)
{
    struct sf_loader_options o;
    local_options(&o, 64, 8 << 10);
    o.prefetch_shards = 2;
    cycle(&o, 1, 0); /* first use: whatever libraries set up once */
    struct held before = held_now();
    for (int i = 0; i < 4; i++)
        cycle(&o, 2, i % 2 ? 1 : 0);
    expect_same(before, 8, "after 4 local open/epoch/close cycles");
}

/* bucket_options for n images in shards of 16 KiB, and into cache_dir (len
 * bytes) a disk cache folder under tmp, for the tests that turn one on. */
static void bucket_options_and_cache_dir(struct sf_loader_options *o, unsigned n, char *cache_dir,
                                         size_t len)
{
    bucket_options(o, n, 16 << 10, NULL, NULL);
    snprintf(cache_dir, len, "%s/cache", tmp);
}

Test(loader, mock_cycles_with_faults_give_back_descriptors_and_threads)
{
    char cache_dir[800];
    struct sf_loader_options o;
    bucket_options_and_cache_dir(&o, 48, cache_dir, sizeof(cache_dir));
    o.s3.io_threads = 2;
    cycle(&o, 1, 0);
    struct held before = held_now();
    cr_assert_eq(admin("POST", "/_mock/faults", "p503=0.2,reset=0.1\n"), 200);
    cycle(&o, 1, 0);
    cycle(&o, 1, 1); /* closed with fetches in flight */
    o.cache.dir = cache_dir;
    o.ram_only = 0;
    cycle(&o, 1, 1);
    expect_same(before, 8, "after cycles against the mock with faults");
}

static void expect_open_fails(const struct sf_loader_options *o, const char *what)
{
    struct sf_loader *l = NULL;
    char err[1024] = "";
    sf_status st = sf_loader_open(o, &l, err, sizeof(err));
    cr_assert_neq(st, SF_OK, "%s opened", what);
    cr_assert_null(l);
    cr_assert(err[0], "%s: no message", what);
}

Test(loader, failed_opens_leave_nothing_open)
{
    char cache_dir[800], missing_src[800];
    struct sf_loader_options o;
    bucket_options_and_cache_dir(&o, 40, cache_dir, sizeof(cache_dir));
    cycle(&o, 1, 1);
    snprintf(missing_src, sizeof(missing_src), "%s/nowhere/x.tar", tmp);
    const struct {
        const char *source, *what;
    } bad_sources[] = {
        {"s3://bucket/no-such/shard-000000.tar", "a missing key"},
        {"s3://no-such-bucket/data/", "a missing bucket"},
        {"s3://", "a bad URL"},
        {missing_src, "a missing local file"},
    };
    struct held before = held_now();
    for (int round = 0; round < 2; round++) {
        struct sf_loader_options b = o;
        b.batch_size = 0;
        expect_open_fails(&b, "a bad option");
        for (size_t i = 0; i < sizeof(bad_sources) / sizeof(bad_sources[0]); i++) {
            b = o;
            const char *source[] = {bad_sources[i].source};
            b.sources = source;
            expect_open_fails(&b, bad_sources[i].what);
        }
        b = o;
        b.s3.access_key_id = "wrong";
        b.s3.secret_access_key = "wrong-secret";
        expect_open_fails(&b, "wrong credentials");
        b = o;
        b.s3.endpoint_url = "http://127.0.0.1:1";
        b.s3.max_attempts = 2;
        expect_open_fails(&b, "an endpoint that refuses");
        b = o;
        b.s3.ca_bundle = "/nonexistent/ca.pem";
        expect_open_fails(&b, "a CA bundle that cannot be read");
        b = o;
        b.s3.profile = "no-such-profile";
        expect_open_fails(&b, "a missing profile");
        b = o;
        FILE *f = fopen(cache_dir, "w");
        cr_assert(f);
        fclose(f);
        b.cache.dir = cache_dir; /* a file, not a folder */
        b.ram_only = 0;
        expect_open_fails(&b, "a cache directory that is a file");
        unlink(cache_dir);
    }
    expect_same(before, 8, "after failed opens");
}

Test(loader, an_error_mid_epoch_then_close_leaves_nothing_open)
{
    struct sf_loader_options o;
    bucket_options(&o, 120, 16 << 10, NULL, NULL);
    remove_bucket_index();
    o.prefetch_shards = 1;
    cycle(&o, 1, 1);
    struct held before = held_now();
    struct sf_loader *l = open_loader(&o);
    struct sf_batch b;
    cr_assert_eq(sf_loader_next(l, &b), SF_OK, "%s", sf_loader_errmsg(l));
    sf_loader_release(l, &b);
    /* Every shard gone: whichever is opened next fails. */
    char p[1000];
    for (unsigned i = 0;; i++) {
        snprintf(p, sizeof(p), "%s/bucket/data/shard-%06u.tar", root, i);
        if (unlink(p) != 0)
            break;
    }
    sf_status st;
    while ((st = sf_loader_next(l, &b)) == SF_OK)
        sf_loader_release(l, &b);
    cr_assert_neq(st, SF_END_OF_EPOCH);
    sf_loader_close(l);
    expect_same(before, 8, "after an error mid-epoch");
}

/* A child with few descriptors opens a loader of concurrency 64: it fails
 * with a message, or reads; it neither crashes nor hangs (SIGALRM). */
static int low_nofile_child(const struct sf_loader_options *o, rlim_t extra, char *msg,
                            size_t msg_len)
{
    int fd;
    pid_t pid = test_fork_piped(&fd);
    cr_assert(pid >= 0);
    if (pid == 0) {
        alarm(30);
        struct rlimit rl = {n_fds() + extra, n_fds() + extra};
        rl.rlim_max = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_max : rl.rlim_cur;
        rl.rlim_cur = n_fds() + extra;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(90);
        struct sf_loader *l = NULL;
        char err[1024] = "";
        sf_status st = sf_loader_open(o, &l, err, sizeof(err));
        if (st == SF_OK) {
            struct sf_batch b;
            while ((st = sf_loader_next(l, &b)) == SF_OK)
                sf_loader_release(l, &b);
            snprintf(err, sizeof(err), "%s", sf_loader_errmsg(l));
            sf_loader_close(l);
        }
        dprintf(fd, "%s: %s", sf_status_name(st), err);
        _exit(st == SF_END_OF_EPOCH ? 0 : 1);
    }
    int ws = test_wait_piped(pid, fd, msg, msg_len);
    cr_assert_neq(ws, -1);
    cr_assert(WIFEXITED(ws), "the child died of signal %d: %s", WTERMSIG(ws), msg);
    return WEXITSTATUS(ws);
}

Test(loader, few_descriptors_fail_with_a_message_not_a_crash_or_hang)
{
    char cache_dir[800];
    struct sf_loader_options o;
    bucket_options_and_cache_dir(&o, 120, cache_dir, sizeof(cache_dir));
    o.s3.concurrency = 64;
    o.cache.dir = cache_dir;
    o.ram_only = 0;
    char msg[2048];
    for (rlim_t extra = 0; extra < 20; extra += 13) {
        int rc = low_nofile_child(&o, extra, msg, sizeof(msg));
        cr_assert(rc == 0 || rc == 1, "extra %u: exit %d: %s", (unsigned)extra, rc, msg);
        if (rc == 1)
            cr_assert(strstr(msg, "Too many open files"), "extra %u: %s", (unsigned)extra, msg);
    }
}

/* A job that moves its position often: set_epoch every 3 batches, state
 * restores, 20 epochs over more shards than prefetch_shards. While it runs,
 * the mappings stay under a bound set by the shards (a shard's mapping is
 * split where its pages were given back, and how many shards the shuffle
 * buffer keeps open depends on the position: no exact count); after close,
 * the descriptors, threads and mappings of before the open. */
Test(loader, set_epoch_storms_and_restores_hold_mappings_and_threads_flat)
{
    struct sf_loader_options o;
    local_options(&o, 96, 4 << 10);
    o.prefetch_shards = 2;
    o.batch_size = 4;
    cycle(&o, 1, 1);
    struct held before = held_now();
    struct sf_loader *l = open_loader(&o);
    size_t n_shards = sf_loader_shard_count(l);
    cr_assert_gt(n_shards, 8u);
    unsigned char state[SF_LOADER_STATE_BYTES];
    unsigned most = 0;
    struct sf_batch b;
    for (unsigned e = 0; e < 20; e++) {
        cr_assert_eq(sf_loader_set_epoch(l, e), SF_OK, "%s", sf_loader_errmsg(l));
        for (unsigned k = 0; k < 3; k++) {
            cr_assert_eq(sf_loader_next(l, &b), SF_OK, "%s", sf_loader_errmsg(l));
            sf_loader_release(l, &b);
        }
        if (e % 4 == 1) {
            cr_assert_eq(sf_loader_state_save(l, state, sizeof(state)), SF_OK);
            cr_assert_eq(sf_loader_next(l, &b), SF_OK, "%s", sf_loader_errmsg(l));
            sf_loader_release(l, &b);
            cr_assert_eq(sf_loader_state_restore(l, state, sizeof(state)), SF_OK, "%s",
                         sf_loader_errmsg(l));
        }
        if (e % 5 == 4) { /* an epoch read to its end */
            sf_status st;
            while ((st = sf_loader_next(l, &b)) == SF_OK)
                sf_loader_release(l, &b);
            cr_assert_eq(st, SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
        }
        unsigned m = n_maps();
        most = m > most ? m : most;
    }
    /* Threads' stacks and arenas, and each shard in a few pieces. */
    cr_assert_leq(most, before.maps + 64 + 4 * (unsigned)n_shards, "%u mappings, %u before open",
                  most, before.maps);
    sf_loader_close(l);
    expect_same(before, 4, "after 20 epochs of set_epoch every 3 batches and restores");
}
