/* warm-cache and the cache commands, run as the built program against the
 * mock: several processes at once, kills and cancels, limits, failures.
 * Suite `cache` (test_cache.c). */
#include "cache_fixture.h"

#include "cache/disk_cache.h"
#include "cache/ram_cache.h"
#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/spawn.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ------------------------------------------------------------ warm-cache */

/* Objects PREFIX-0.tar .. PREFIX-(n-1).tar of size bytes, seeds seed, seed + 1... */
static void put_numbered(const char *prefix, int n, size_t size, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        char k[32];
        snprintf(k, sizeof(k), "%s-%d.tar", prefix, i);
        free(put_object(k, size, seed + (unsigned)i));
    }
}

/* None of put_numbered's objects was asked for. */
static void expect_none_fetched(const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char k[32];
        snprintf(k, sizeof(k), "%s-%d.tar", prefix, i);
        cr_assert_eq(key_gets(k), 0, "%s was fetched", k);
    }
}

Test(cache, four_processes_warm_the_same_shards_each_fetched_once)
{
    const char *faults[] = {"--fault", "prefix=bucket/w,latency_ms=20", NULL};
    start_mock(faults);
    size_t n = 1024 * 1024;
    for (int i = 0; i < 12; i++) {
        char k[32];
        snprintf(k, sizeof(k), "w-%03d.tar", i);
        free(put_object(k, n, 40 + (unsigned)i));
    }
    char pattern[700];
    snprintf(pattern, sizeof(pattern), "s3://bucket/w-{000..011}.tar");
    const char *args[] = {"warm-cache", "--endpoint-url", srv.url, "--cache-dir",
                          cdir,         "--chunk-size",   "256K",  "--concurrency",
                          "4",          "--json",         pattern, NULL};
    pid_t pids[4];
    char tags[4][8];
    for (int i = 0; i < 4; i++) {
        snprintf(tags[i], sizeof(tags[i]), "w%d", i);
        pids[i] = cli_spawn(args, tags[i]);
    }
    unsigned long long fetched = 0, peer = 0, cached = 0;
    for (int i = 0; i < 4; i++) {
        int rc = cli_wait(pids[i]);
        cr_assert_eq(rc, 0, "warm-cache %d exited %d: %s", i, rc, slurp_tag(tags[i], "err"));
        cJSON *j = cJSON_Parse(slurp_tag(tags[i], "out"));
        cr_assert(j, "not JSON: %s", slurp_tag(tags[i], "out"));
        fetched += (unsigned long long)cJSON_GetObjectItem(j, "fetched")->valuedouble;
        peer += (unsigned long long)cJSON_GetObjectItem(j, "by_other_process")->valuedouble;
        cached += (unsigned long long)cJSON_GetObjectItem(j, "cached")->valuedouble;
        cr_assert_eq(cJSON_GetObjectItem(j, "failed")->valuedouble, 0);
        cJSON_Delete(j);
    }
    cr_assert_eq(fetched, 12, "each shard is fetched by exactly one process");
    cr_assert_eq(fetched + peer + cached, 48);
    for (int i = 0; i < 12; i++) {
        char k[32];
        snprintf(k, sizeof(k), "w-%03d.tar", i);
        cr_assert_eq(key_gets(k), 4, "%s: GETs %.0f, expected 4 ranges once", k, key_gets(k));
    }
    client(256 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    unsigned long long bad = 99;
    cr_assert_eq(sf_cache_list(cache, 1, NULL, NULL, &bad), SF_OK);
    cr_assert_eq(bad, 0);
    int entries;
    cache_bytes(&entries);
    cr_assert_eq(entries, 12);
}

Test(cache, kill_during_warm_then_rerun_resumes_and_verifies)
{
    const char *faults[] = {"--fault", "prefix=bucket/k,bandwidth=1M", NULL};
    start_mock(faults);
    size_t n = 2 * 1024 * 1024;
    put_numbered("k", 6, n, 60);
    const char *args[] = {"warm-cache",
                          "--endpoint-url",
                          srv.url,
                          "--cache-dir",
                          cdir,
                          "--chunk-size",
                          "512K",
                          "--concurrency",
                          "4",
                          "--max-objects",
                          "2",
                          "--json",
                          "s3://bucket/k-{0..5}.tar",
                          NULL};
    pid_t pid = cli_spawn(args, "first");
    /* Let it publish at least one shard and be in the middle of others. */
    int entries = 0;
    for (int i = 0; i < 3000 && entries < 1; i++) {
        usleep(10000);
        cache_bytes(&entries);
    }
    cr_assert_geq(entries, 1, "nothing was published before the kill");
    usleep(300000);
    kill(pid, SIGKILL);
    cr_assert_eq(cli_wait(pid), 128 + SIGKILL);
    cache_bytes(&entries);
    cr_assert_lt(entries, 6, "the kill came too late to test anything");

    cr_assert_eq(cli_run(args, "second"), 0, "%s", slurp_tag("second", "err"));
    cJSON *j = cJSON_Parse(slurp_tag("second", "out"));
    cr_assert(j);
    double fetched_bytes = cJSON_GetObjectItem(j, "bytes_fetched")->valuedouble;
    double cached = cJSON_GetObjectItem(j, "cached")->valuedouble;
    cJSON_Delete(j);
    cr_assert_geq(cached, 1);
    cr_assert_lt(fetched_bytes, 6.0 * n - cached * n + 1, "the re-run fetched more than needed");
    client(512 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    unsigned long long bad = 99;
    cr_assert_eq(sf_cache_list(cache, 1, NULL, NULL, &bad), SF_OK);
    cr_assert_eq(bad, 0);
    cache_bytes(&entries);
    cr_assert_eq(entries, 6);
    /* A third run has nothing left to do. */
    cr_assert_eq(cli_run(args, "third"), 0);
    j = cJSON_Parse(slurp_tag("third", "out"));
    cr_assert_eq(cJSON_GetObjectItem(j, "cached")->valuedouble, 6);
    cr_assert_eq(cJSON_GetObjectItem(j, "bytes_fetched")->valuedouble, 0);
    cJSON_Delete(j);
}

/* Four shards of size bytes each warmed under a 1M cache_limit: refused
 * before anything is fetched, the limit named, nothing in the cache. */
static void expect_refused_before_fetching(const char *prefix, size_t size, unsigned seed)
{
    start_mock(NULL);
    put_numbered(prefix, 4, size, seed);
    char pattern[64];
    snprintf(pattern, sizeof(pattern), "s3://bucket/%s-{0..3}.tar", prefix);
    const char *args[] = {"warm-cache", "--endpoint-url", srv.url, "--cache-dir",
                          cdir,         "--cache-limit",  "1M",    pattern,
                          NULL};
    int rc = cli_run(args, prefix);
    int entries;
    cache_bytes(&entries);
    cr_assert_eq(rc, 1, "warm-cache said all 4 shards are cached; %d are: %s", entries,
                 slurp_tag(prefix, "out"));
    cr_assert(strstr(slurp_tag(prefix, "err"), "cache_limit"), "%s", slurp_tag(prefix, "err"));
    cr_assert_eq(entries, 0);
    expect_none_fetched(prefix, 4);
}

Test(cache, warm_refuses_data_over_the_limit_before_fetching)
{
    expect_refused_before_fetching("big", 512 * 1024, 70);
}

/* Shards whose bytes add up to exactly the limit do not fit with their
 * checksums: warming them would evict the first to make room for the last
 * and still report every shard fetched. Refused before fetching instead. */
Test(cache, warm_counts_each_entrys_checksums_against_the_limit)
{
    expect_refused_before_fetching("edge", 256 * 1024, 75);
}

/* A shard that cannot be found and one over the limit: both are named, the
 * limit too, although the failure already counts as a shard done. */
Test(cache, warm_over_the_limit_says_so_beside_a_missing_shard)
{
    start_mock(NULL);
    free(put_object("lim-0.tar", 512 * 1024, 77));
    const char *args[] = {"warm-cache", "--endpoint-url", srv.url, "--cache-dir",
                          cdir,         "--cache-limit",  "256K",  "s3://bucket/lim-{0..1}.tar",
                          NULL};
    cr_assert_eq(cli_run(args, "lim"), 1);
    char *err = slurp_tag("lim", "err");
    cr_assert(strstr(err, "cache_limit"), "the limit is not named: %s", err);
    cr_assert(strstr(err, "s3://bucket/lim-1.tar"), "the missing shard is not named: %s", err);
    cr_assert_eq(key_gets("lim-0.tar"), 0);
}

/* A shard named twice (a prefix and one of its keys) is one shard: counted
 * once against the limit, fetched once, not "fetched by another process". */
Test(cache, warm_counts_a_shard_named_twice_once)
{
    start_mock(NULL);
    free(put_object("twice/t-0.tar", 600 * 1024, 78));
    const char *args[] = {"warm-cache",
                          "--endpoint-url",
                          srv.url,
                          "--cache-dir",
                          cdir,
                          "--cache-limit",
                          "1M",
                          "--json",
                          "s3://bucket/twice/",
                          "s3://bucket/twice/t-0.tar",
                          NULL};
    cr_assert_eq(cli_run(args, "twice"), 0, "%s", slurp_tag("twice", "err"));
    cJSON *j = cJSON_Parse(slurp_tag("twice", "out"));
    cr_assert(j, "not JSON: %s", slurp_tag("twice", "out"));
    cr_expect_eq(cJSON_GetObjectItem(j, "objects")->valuedouble, 1);
    cr_expect_eq(cJSON_GetObjectItem(j, "fetched")->valuedouble, 1);
    cr_expect_eq(cJSON_GetObjectItem(j, "by_other_process")->valuedouble, 0);
    cJSON_Delete(j);
}

/* A listing warms what the loader reads from it: its shards, not the
 * index.json beside them (the loader reads that with a plain GET, never
 * through the cache) nor any other file. A key named on its own is warmed
 * whatever its name, as the loader reads it as a shard. */
Test(cache, warm_of_a_listing_caches_only_its_shards)
{
    start_mock(NULL);
    free(put_object("ls/a-0.tar", 100000, 70));
    free(put_object("ls/a-1.sfr", 100000, 71));
    free(put_object("ls/index.json", 3000, 72));
    free(put_object("ls/README.txt", 2000, 73));
    free(put_object("named.bin", 1000, 74));
    const char *args[] = {
        "warm-cache",      "--endpoint-url",        srv.url, "--cache-dir", cdir, "--json",
        "s3://bucket/ls/", "s3://bucket/named.bin", NULL};
    cr_assert_eq(cli_run(args, "listing"), 0, "%s", slurp_tag("listing", "err"));
    cJSON *j = cJSON_Parse(slurp_tag("listing", "out"));
    cr_assert(j, "not JSON: %s", slurp_tag("listing", "out"));
    cr_expect_eq(cJSON_GetObjectItem(j, "objects")->valuedouble, 3);
    cr_expect_eq(cJSON_GetObjectItem(j, "fetched")->valuedouble, 3);
    cJSON_Delete(j);
    cr_expect_eq(key_gets("ls/index.json"), 0, "index.json was cached as a shard");
    cr_expect_eq(key_gets("ls/README.txt"), 0, "a file that is no shard was cached");
    int entries;
    cache_bytes(&entries);
    cr_assert_eq(entries, 3);
}

Test(cache, warm_names_every_failed_shard_and_keeps_the_rest)
{
    start_mock(NULL);
    free(put_object("m-0.tar", 100000, 80));
    free(put_object("m-2.tar", 100000, 82));
    const char *args[] = {"warm-cache", "--endpoint-url",           srv.url, "--cache-dir",
                          cdir,         "s3://bucket/m-{0..3}.tar", NULL};
    cr_assert_eq(cli_run(args, "missing"), 1);
    char *err = slurp_tag("missing", "err");
    cr_assert(strstr(err, "s3://bucket/m-1.tar") && strstr(err, "s3://bucket/m-3.tar"),
              "every missing shard must be named: %s", err);
    char *out = slurp_tag("missing", "out");
    cr_assert(strstr(out, "2 fetched") && strstr(out, "2 failed"), "summary: %s", out);
    int entries;
    cache_bytes(&entries);
    cr_assert_eq(entries, 2);
}

Test(cache, dry_run_fetches_nothing_and_clear_empties)
{
    start_mock(NULL);
    put_numbered("d", 2, 200000, 90);
    const char *dry[] = {"warm-cache", "--endpoint-url",           srv.url, "--cache-dir", cdir,
                         "--dry-run",  "s3://bucket/d-{0..1}.tar", NULL};
    cr_assert_eq(cli_run(dry, "dry"), 0);
    cr_assert(strstr(slurp_tag("dry", "out"), "2 of 2 shards would be fetched"), "%s",
              slurp_tag("dry", "out"));
    cr_assert_eq(key_gets("d-0.tar") + key_gets("d-1.tar"), 0);
    const char *warm[] = {"warm-cache", "--endpoint-url",           srv.url, "--cache-dir",
                          cdir,         "s3://bucket/d-{0..1}.tar", NULL};
    cr_assert_eq(cli_run(warm, "warm"), 0);
    const char *ls[] = {"cache", "ls", "--cache-dir", cdir, NULL};
    cr_assert_eq(cli_run(ls, "ls"), 0);
    char *out = slurp_tag("ls", "out");
    cr_assert(strstr(out, "s3://bucket/d-0.tar") && strstr(out, "s3://bucket/d-1.tar"), "%s", out);
    const char *clear[] = {"cache", "clear", "--cache-dir", cdir, NULL};
    cr_assert_eq(cli_run(clear, "clear"), 0);
    int entries;
    cache_bytes(&entries);
    cr_assert_eq(entries, 0);
    const char *bad[] = {"warm-cache", "--cache-limit", "lots", "s3://bucket/x", NULL};
    cr_assert_eq(cli_run(bad, "bad"), 2);
    cr_assert(strstr(slurp_tag("bad", "err"), "--cache-limit"));
}

/* `get -o` onto a FIFO (or /dev/null) writes into it; it must never be
 * replaced by a renamed regular file. */
Test(cache, get_into_a_fifo_writes_through_it)
{
    start_mock(NULL);
    unsigned char *want = put_object("fifo-src.bin", 700000, 91);
    char fifo[800], copy[800];
    snprintf(fifo, sizeof(fifo), "%s/pipe", tmp);
    snprintf(copy, sizeof(copy), "%s/copy.bin", tmp);
    cr_assert(mkfifo(fifo, 0600) == 0);
    pid_t reader = fork();
    cr_assert(reader >= 0);
    if (reader == 0) {
        int in = open(fifo, O_RDONLY), out = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        char buf[65536];
        ssize_t n;
        while ((n = read(in, buf, sizeof(buf))) > 0)
            if (write(out, buf, (size_t)n) != n)
                _exit(1);
        _exit(n == 0 ? 0 : 1);
    }
    const char *args[] = {"get", "--endpoint-url", srv.url, "s3://bucket/fifo-src.bin", "-o", fifo,
                          NULL};
    cr_assert_eq(cli_run(args, "fifo"), 0, "%s", slurp_tag("fifo", "err"));
    cr_assert_eq(cli_wait(reader), 0);
    struct stat sb;
    cr_assert(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    FILE *f = fopen(copy, "rb");
    cr_assert(f);
    unsigned char *got = malloc(700001);
    size_t n = fread(got, 1, 700001, f);
    fclose(f);
    cr_assert_eq(n, 700000u);
    cr_assert(!memcmp(got, want, n));
    free(got);
    free(want);
}

struct warm_cancel {
    int after_bytes; /* cancel once progress reported fetched bytes */
    int asked, cancelled;
    unsigned long long seen_fetched;
};

static void warm_cancel_progress(void *user, const struct sf_warm_stats *s)
{
    struct warm_cancel *w = user;
    w->seen_fetched = s->bytes_fetched;
}

static int warm_cancel_ask(void *user)
{
    struct warm_cancel *w = user;
    w->asked++;
    if (w->after_bytes && w->seen_fetched > 0)
        w->cancelled = 1;
    return w->cancelled;
}

Test(cache, warm_cancel_stops_downloads_and_a_rerun_completes)
{
    start_mock(NULL);
    unsigned char *data[3];
    for (int i = 0; i < 3; i++) {
        char k[32];
        snprintf(k, sizeof(k), "w-%d.tar", i);
        data[i] = put_object(k, 1 << 20, 120 + (unsigned)i);
    }
    set_rules_c("prefix=bucket/w-,bandwidth=256K"); /* 1 MiB takes >= 4 s on one connection */
    client(1 << 20);
    open_cache(0, SF_REVALIDATE_TRUST);
    struct sf_object_info objs[3] = {info_of("w-0.tar"), info_of("w-1.tar"), info_of("w-2.tar")};
    struct warm_cancel w = {.after_bytes = 1};
    struct sf_warm_options wo;
    sf_warm_options_init_default(&wo);
    wo.max_objects = 1;
    wo.progress_interval_ms = 10;
    wo.progress = warm_cancel_progress;
    wo.cancel = warm_cancel_ask;
    wo.user = &w;
    struct sf_warm_stats s;
    sf_status st = sf_cache_warm(cache, s3, objs, 3, &wo, &s);
    cr_assert_eq(st, SF_ERR_CANCELLED, "%s", sf_status_name(st));
    cr_assert(w.cancelled);
    cr_assert_eq(s.fetched, 0);
    cr_assert_lt(s.objects_done, 3);
    cr_assert_gt(s.bytes_fetched, 0);
    char msg[512];
    sf_cache_errmsg(cache, msg, sizeof(msg));
    cr_assert(strstr(msg, "cancelled"), "%s", msg);
    /* one at a time: the objects after the first were never requested */
    cr_assert_eq(key_gets("w-1.tar") + key_gets("w-2.tar"), 0);
    int entries;
    cache_bytes(&entries);
    cr_assert_eq(entries, 0);

    /* A cancel before anything was looked up touches nothing. */
    struct warm_cancel now = {.cancelled = 1};
    wo.user = &now;
    st = sf_cache_warm(cache, s3, objs, 3, &wo, &s);
    cr_assert_eq(st, SF_ERR_CANCELLED);
    cr_assert_eq(s.objects_done, 0);

    set_rules_c("");
    struct warm_cancel never = {0};
    wo.user = &never;
    wo.max_objects = 3;
    st = sf_cache_warm(cache, s3, objs, 3, &wo, &s);
    sf_cache_errmsg(cache, msg, sizeof(msg));
    cr_assert_eq(st, SF_OK, "%s", msg);
    cr_assert_eq(s.fetched, 3);
    cr_assert_gt(never.asked, 0);
    for (int i = 0; i < 3; i++) {
        char k[32];
        snprintf(k, sizeof(k), "w-%d.tar", i);
        cr_assert_eq(read_through(k, data[i], 1 << 20), SF_CACHE_FROM_DISK);
        free(data[i]);
    }
}

/* Opens in through the test's cache and waits (30 s at most) for its first
 * want bytes; the status, and the message of a failure in msg. */
static sf_status open_and_wait(const struct sf_object_info *in, unsigned long long want, char *msg,
                               size_t len)
{
    struct sf_cache_object *o = NULL;
    sf_status st = sf_cache_open(cache, s3, in, &o);
    if (st != SF_OK) {
        sf_cache_errmsg(cache, msg, len);
        return st;
    }
    struct sf_cache_object_progress p;
    st = sf_cache_object_wait(o, want, 30000, &p);
    snprintf(msg, len, "%s", sf_cache_object_errmsg(o));
    sf_cache_object_close(o);
    return st;
}

/* An HTTP 400 on the download (the mock refuses a key with a '..' segment
 * with 400 InvalidArgument) fails the object with a message that keeps the
 * S3 error code, as the RAM path's does. */
Test(cache, a_refused_download_keeps_the_s3_error_code)
{
    start_mock(NULL);
    free(put_object("x.tar", 4096, 1));
    client(64 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    struct sf_object_info in = info_of("odd/../x.tar");
    in.size = 4096;
    char etag[] = "\"0123456789abcdef0123456789abcdef\"";
    snprintf(in.etag, sizeof(in.etag), "%s", etag);
    char msg[1024] = "";
    sf_status st = open_and_wait(&in, 4096, msg, sizeof(msg));
    cr_expect_neq(st, SF_OK);
    cr_expect(strstr(msg, "odd/../x.tar") && strstr(msg, "HTTP 400") &&
                  strstr(msg, "InvalidArgument"),
              "%s: %s", sf_status_name(st), msg);
}

/* warm-cache of a local file said "the server sent no ETag": there is no
 * server, and local files are never cached. Now it says so. */
Test(cache, a_local_file_is_refused_as_never_cached)
{
    make_dirs();
    client(64 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    cr_assert_eq(test_write_file(root, "local.tar", "not a cacheable object", 22), 0);
    char path[700];
    snprintf(path, sizeof(path), "%s/local.tar", root);
    struct sf_object_info in;
    memset(&in, 0, sizeof(in));
    in.url = path;
    in.size = SF_SIZE_UNKNOWN;
    char msg[1024] = "";
    sf_status st = open_and_wait(&in, 1, msg, sizeof(msg));
    cr_expect_eq(st, SF_ERR_UNSUPPORTED, "%s: %s", sf_status_name(st), msg);
    cr_expect(strstr(msg, "local.tar") && strstr(msg, "local file") && !strstr(msg, "server"),
              "%s", msg);
}
