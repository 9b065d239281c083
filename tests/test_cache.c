/* The RAM and disk tiers, sf_cache_open/warm, and the warm-cache and cache
 * commands, against the mock S3 server (each test starts its own). */
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

static struct mock_proc srv;
static char *tmp;
static char root[600]; /* the mock's root, bucket "bucket" in it */
static char cdir[600]; /* the cache directory */
static struct sf_s3 *s3;
static struct sf_cache *cache;

static void make_dirs(void)
{
    tmp = mock_env_root(root, sizeof(root));
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    snprintf(cdir, sizeof(cdir), "%s/cache", tmp);
}

static void start_mock(const char *const *extra)
{
    make_dirs();
    mock_env_start(&srv, root, extra);
}

static void teardown(void)
{
    sf_cache_destroy(cache);
    cache = NULL;
    mock_env_stop(&srv, &tmp, &s3);
}

TestSuite(cache, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------ helpers */

static long admin(const char *method, const char *path_query, char **out)
{
    return mock_env_admin(&srv, method, path_query, NULL, out);
}

/* GET requests the mock answered for bucket/key (every status). */
static double key_gets(const char *key)
{
    cJSON *j = mock_env_stats(&srv);
    char k[300];
    snprintf(k, sizeof(k), "bucket/%s", key);
    double n = mock_env_jnum(j, "keys", k, "operations", "GetObject");
    cJSON_Delete(j);
    return n;
}

static unsigned char *put_object(const char *key, size_t n, unsigned seed)
{
    unsigned char *data = test_put_object(root, "bucket", key, n, seed);
    cr_assert(data, "bucket/%s", key);
    return data;
}

static void client_c(unsigned long long chunk, unsigned concurrency)
{
    struct sf_s3_options o;
    sf_s3_options_init_default(&o);
    o.endpoint_url = srv.url;
    o.concurrency = concurrency;
    o.chunk_bytes = chunk;
    o.retry_base_ms = 5;
    o.throttle_base_ms = 5;
    o.retry_cap_ms = 200;
    char err[512] = "";
    cr_assert(sf_s3_new(&o, &s3, err, sizeof(err)) == SF_OK, "%s", err);
}

static void client(unsigned long long chunk)
{
    client_c(chunk, 4);
}

static void open_cache(unsigned long long limit, enum sf_cache_revalidate rv)
{
    struct sf_cache_options co;
    sf_cache_options_init_default(&co);
    co.dir = cdir;
    co.limit_bytes = limit;
    co.revalidate = rv;
    char err[512] = "";
    cr_assert(sf_cache_new(&co, &cache, err, sizeof(err)) == SF_OK, "%s", err);
}

static struct sf_object_info info_of(const char *key)
{
    struct sf_object_info in;
    memset(&in, 0, sizeof(in));
    static char url[8][600];
    static int slot;
    char *u = url[slot++ % 8];
    snprintf(u, 600, "s3://bucket/%s", key);
    in.url = u;
    in.key = (char *)key;
    in.size = SF_SIZE_UNKNOWN;
    return in;
}

/* Opens key through the cache, waits for all of it, compares with want. */
static enum sf_cache_source read_through(const char *key, const unsigned char *want, size_t n)
{
    struct sf_object_info in = info_of(key);
    struct sf_cache_object *o = NULL;
    sf_status st = sf_cache_open(cache, s3, &in, &o);
    char msg[1024];
    sf_cache_errmsg(cache, msg, sizeof(msg));
    cr_assert_eq(st, SF_OK, "open %s: %s", key, msg);
    struct sf_cache_object_progress p;
    st = sf_cache_object_wait(o, n, 30000, &p);
    cr_assert_eq(st, SF_OK, "wait %s: %s", key, sf_cache_object_errmsg(o));
    cr_assert_eq(p.contiguous, n);
    cr_assert_eq(sf_cache_object_size(o), n);
    cr_assert(n == 0 || memcmp(sf_cache_object_data(o), want, n) == 0, "%s: bytes differ", key);
    /* Complete: the object ends up published, whatever the source. */
    st = sf_cache_object_wait(o, n, 30000, &p);
    cr_assert_eq(st, SF_OK);
    cr_assert(p.done);
    enum sf_cache_source src = p.source;
    sf_cache_object_close(o);
    return src;
}

/* Calls fn(dir, name, path, st) for every file in the cache's key directories
 * (v1/<2 hex>/...); nothing when the cache does not exist yet. */
static void walk_cache(void (*fn)(void *user, const char *name, const char *path,
                                  const struct stat *st),
                       void *user)
{
    char v1[700];
    snprintf(v1, sizeof(v1), "%s/v1", cdir);
    DIR *d = opendir(v1);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strlen(de->d_name) != 2)
            continue;
        char sub[1024];
        snprintf(sub, sizeof(sub), "%s/%.2s", v1, de->d_name);
        DIR *s = opendir(sub);
        struct dirent *e;
        while (s && (e = readdir(s))) {
            char path[1400];
            struct stat st;
            snprintf(path, sizeof(path), "%s/%s", sub, e->d_name);
            if (e->d_name[0] != '.' && stat(path, &st) == 0)
                fn(user, e->d_name, path, &st);
        }
        if (s)
            closedir(s);
    }
    closedir(d);
}

static int has_suffix(const char *name, const char *suffix)
{
    size_t l = strlen(name), k = strlen(suffix);
    return l > k && !strcmp(name + l - k, suffix);
}

struct tally {
    unsigned long long bytes;
    int entries, parts;
    char entry_path[1400];
};

static void tally_one(void *user, const char *name, const char *path, const struct stat *st)
{
    struct tally *t = user;
    int entry = has_suffix(name, ".sf"), part = has_suffix(name, ".part");
    if (!entry && !part)
        return;
    t->bytes += (unsigned long long)st->st_size;
    t->entries += entry;
    t->parts += part;
    if (entry)
        snprintf(t->entry_path, sizeof(t->entry_path), "%s", path);
}

static struct tally tally_cache(void)
{
    struct tally t;
    memset(&t, 0, sizeof(t));
    walk_cache(tally_one, &t);
    return t;
}

/* Sum of the sizes of entries and downloads in the cache directory. */
static unsigned long long cache_bytes(int *n_entries)
{
    struct tally t = tally_cache();
    if (n_entries)
        *n_entries = t.entries;
    return t.bytes;
}

/* Path of the single entry file in the cache, into out. */
static void only_entry(char *out, size_t n)
{
    struct tally t = tally_cache();
    cr_assert_eq(t.entries, 1, "expected one entry, found %d", t.entries);
    cr_assert(snprintf(out, n, "%s", t.entry_path) < (int)n);
}

/* Runs the shardfeed CLI with argv (NULL-terminated, without the program);
 * stdout and stderr into files under tmp; returns the exit status. */
static pid_t cli_spawn(const char *const *args, const char *tag)
{
    char out[800], err[800];
    snprintf(out, sizeof(out), "%s/%s.out", tmp, tag);
    snprintf(err, sizeof(err), "%s/%s.err", tmp, tag);
    const char *argv[32];
    int n = 0;
    argv[n++] = SF_CLI_BIN;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = test_spawn(argv, out, err);
    cr_assert(pid >= 0);
    return pid;
}

static int cli_wait(pid_t pid)
{
    int rc = test_wait(pid);
    cr_assert(rc >= 0);
    return rc;
}

static int cli_run(const char *const *args, const char *tag)
{
    return cli_wait(cli_spawn(args, tag));
}

static char *slurp_tag(const char *tag, const char *ext)
{
    char path[800];
    snprintf(path, sizeof(path), "%s/%s.%s", tmp, tag, ext);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* ------------------------------------------------------------ RAM tier */

static void count_release(void *user, void *data, size_t size)
{
    (void)size;
    (*(int *)user)++;
    free(data);
}

Test(cache, ram_limit_holds_and_counts)
{
    struct sf__ram_cache *rc;
    cr_assert_eq(sf__ram_cache_new(1000, &rc), SF_OK);
    int freed = 0;
    for (int i = 0; i < 10; i++) {
        char k[16];
        snprintf(k, sizeof(k), "k%d", i);
        struct sf__ram_entry *e;
        cr_assert_eq(sf__ram_cache_insert(rc, k, malloc(300), 300, count_release, &freed, &e),
                     SF_OK);
        struct sf__ram_stats s;
        sf__ram_cache_stats(rc, &s);
        cr_assert_leq(s.bytes, 1000, "bytes %llu over the limit", (unsigned long long)s.bytes);
        sf__ram_cache_release(rc, e);
    }
    struct sf__ram_stats s;
    sf__ram_cache_stats(rc, &s);
    cr_assert_eq(s.entries, 3);
    cr_assert_eq(s.evictions, 7);
    cr_assert_eq(freed, 7);
    cr_assert_null(sf__ram_cache_get(rc, "k0"));
    struct sf__ram_entry *e = sf__ram_cache_get(rc, "k9");
    cr_assert_not_null(e);
    cr_assert_eq(sf__ram_entry_size(e), 300);
    sf__ram_cache_release(rc, e);
    sf__ram_cache_stats(rc, &s);
    cr_assert_eq(s.hits, 1);
    cr_assert_eq(s.misses, 1);
    sf__ram_cache_destroy(rc);
    cr_assert_eq(freed, 10);
}

Test(cache, ram_entries_in_use_are_never_evicted)
{
    struct sf__ram_cache *rc;
    cr_assert_eq(sf__ram_cache_new(1000, &rc), SF_OK);
    int freed = 0;
    struct sf__ram_entry *a, *b;
    char *pa = malloc(600);
    memset(pa, 'A', 600);
    cr_assert_eq(sf__ram_cache_insert(rc, "a", pa, 600, count_release, &freed, &a), SF_OK);
    char *pb = malloc(600);
    /* a is in use: b cannot fit, the insertion is refused and b stays ours. */
    cr_assert_eq(sf__ram_cache_insert(rc, "b", pb, 600, count_release, &freed, &b), SF_ERR_LIMIT);
    cr_assert_eq(freed, 0);
    cr_assert_eq(((const char *)sf__ram_entry_data(a))[599], 'A');
    sf__ram_cache_release(rc, a);
    cr_assert_eq(sf__ram_cache_insert(rc, "b", pb, 600, count_release, &freed, &b), SF_OK);
    cr_assert_eq(freed, 1, "a was not evicted once unused");
    struct sf__ram_stats s;
    sf__ram_cache_stats(rc, &s);
    cr_assert_eq(s.refused, 1);
    cr_assert_eq(s.bytes_in_use, 600);
    sf__ram_cache_release(rc, b);
    sf__ram_cache_destroy(rc);
}

Test(cache, ram_evicts_least_recently_used)
{
    struct sf__ram_cache *rc;
    cr_assert_eq(sf__ram_cache_new(1000, &rc), SF_OK);
    int freed = 0;
    const char *keys[] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        struct sf__ram_entry *e;
        cr_assert_eq(sf__ram_cache_insert(rc, keys[i], malloc(300), 300, count_release, &freed, &e),
                     SF_OK);
        sf__ram_cache_release(rc, e);
    }
    sf__ram_cache_release(rc, sf__ram_cache_get(rc, "a")); /* a is now the most recent */
    struct sf__ram_entry *d;
    cr_assert_eq(sf__ram_cache_insert(rc, "d", malloc(300), 300, count_release, &freed, &d), SF_OK);
    sf__ram_cache_release(rc, d);
    struct sf__ram_entry *x = sf__ram_cache_get(rc, "b");
    cr_assert_null(x, "b, the least recently used, should have been evicted");
    x = sf__ram_cache_get(rc, "a");
    cr_assert_not_null(x);
    sf__ram_cache_release(rc, x);
    sf__ram_cache_destroy(rc);
}

/* ------------------------------------------------------------ disk tier */

Test(cache, hit_after_fetch_no_network_and_private_modes)
{
    start_mock(NULL);
    size_t n = 3 * 1024 * 1024 + 17;
    unsigned char *data = put_object("shard-a.tar", n, 1);
    client(512 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    cr_assert_eq(read_through("shard-a.tar", data, n), SF_CACHE_FROM_FETCH);
    double gets = key_gets("shard-a.tar");
    cr_assert_eq(gets, 8, "expected 8 ranged GETs (256 KiB first, then to each 512 KiB), got %.0f",
                 gets);
    cr_assert_eq(read_through("shard-a.tar", data, n), SF_CACHE_FROM_DISK);
    cr_assert_eq(key_gets("shard-a.tar"), gets, "a hit touched the network");

    char path[900];
    only_entry(path, sizeof(path));
    cr_assert_null(strstr(path, "shard-a"), "entry names must not contain key text: %s", path);
    struct stat st;
    cr_assert(stat(path, &st) == 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    cr_assert(stat(cdir, &st) == 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    char v1[700];
    snprintf(v1, sizeof(v1), "%s/v1", cdir);
    cr_assert(stat(v1, &st) == 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.entries, 1);
    cr_assert_eq(cs.disk_hits, 1);
    cr_assert_eq(cs.fetched_objects, 1);
    free(data);
}

Test(cache, flipped_byte_is_detected_deleted_and_fetched_again)
{
    start_mock(NULL);
    size_t n = 9 * 1024 * 1024;
    unsigned char *data = put_object("flip.tar", n, 2);
    client(1024 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    cr_assert_eq(read_through("flip.tar", data, n), SF_CACHE_FROM_FETCH);
    double gets = key_gets("flip.tar");
    char path[900];
    only_entry(path, sizeof(path));
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0);
    unsigned char b;
    cr_assert(pread(fd, &b, 1, 5 * 1024 * 1024 + 3) == 1);
    b ^= 0x40;
    cr_assert(pwrite(fd, &b, 1, 5 * 1024 * 1024 + 3) == 1);
    close(fd);
    /* Never served: verified on open, deleted, downloaded again. */
    cr_assert_eq(read_through("flip.tar", data, n), SF_CACHE_FROM_FETCH);
    cr_assert_eq(key_gets("flip.tar"), gets + 10, "256 KiB, the rest of 1 MiB, 8 x 1 MiB");
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.corrupt, 1);
    cr_assert_eq(cs.entries, 1);
    cr_assert_eq(read_through("flip.tar", data, n), SF_CACHE_FROM_DISK);
    free(data);
}

Test(cache, corrupt_data_found_by_verify_command)
{
    start_mock(NULL);
    size_t n = 1024 * 1024;
    unsigned char *data = put_object("t.tar", n, 3);
    client(256 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    read_through("t.tar", data, n);
    char path[900];
    only_entry(path, sizeof(path));
    int fd = open(path, O_RDWR);
    unsigned char b = 0xff;
    cr_assert(pwrite(fd, &b, 1, 1000) == 1); /* in the data */
    close(fd);
    const char *args[] = {"cache", "verify", "--cache-dir", cdir, NULL};
    cr_assert_eq(cli_run(args, "verify"), 1);
    char *err = slurp_tag("verify", "err");
    cr_assert(strstr(err, "1 bad entry"), "stderr: %s", err);
    char *out = slurp_tag("verify", "out");
    cr_assert(strstr(out, "s3://bucket/t.tar") && strstr(out, "bytes 0..4194303") == NULL &&
                  strstr(out, "bytes 0..1048575"),
              "the report must name the object and the bad range: %s", out);
    cr_assert_eq(access(path, F_OK), -1, "the bad entry must be deleted");
    cr_assert_eq(cli_run(args, "verify2"), 0);
    free(data);
}

Test(cache, keys_with_dot_dot_stay_inside_the_cache)
{
    make_dirs();
    struct sf__disk_cache_options o = {.dir = cdir};
    struct sf__disk_cache *dc;
    char err[512];
    cr_assert_eq(sf__disk_cache_open(&o, &dc, err, sizeof(err)), SF_OK, "%s", err);
    struct sf__cache_id id = {"http://h", "bucket", "../../../../../../tmp/escape/../x"};
    enum sf__dc_begin_result r;
    struct sf__dc_writer *w;
    cr_assert_eq(sf__dc_begin(dc, &id, "\"e1\"", 10, &r, &w, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_eq(r, SF__DC_OWNER);
    cr_assert(pwrite(sf__dc_writer_fd(w), "0123456789", 10, 0) == 10);
    struct sf__dc_meta m;
    cr_assert_eq(sf__dc_writer_publish(w, "s3://bucket/../../x", &m, err, sizeof(err)), SF_OK);
    cr_assert_null(strstr(m.name, ".."));
    sf__dc_meta_clear(&m);
    int fd;
    cr_assert_eq(sf__dc_lookup(dc, &id, "\"e1\"", SF__DC_VERIFY_DATA, &fd, &m, err, sizeof(err)),
                 SF_OK, "%s", err);
    close(fd);
    /* The entry lies inside the cache directory. */
    char path[1024], real[4096], realc[4096];
    snprintf(path, sizeof(path), "%s/v1/%s", cdir, m.name);
    cr_assert(realpath(path, real) && realpath(cdir, realc));
    cr_assert(strncmp(real, realc, strlen(realc)) == 0, "%s is outside %s", real, realc);
    sf__dc_meta_clear(&m);
    cr_assert_eq(access("/tmp/escape", F_OK), -1);
    sf__disk_cache_close(dc);
}

Test(cache, limit_holds_under_eviction)
{
    start_mock(NULL);
    size_t n = 1024 * 1024;
    unsigned char *d[6];
    for (int i = 0; i < 6; i++) {
        char k[32];
        snprintf(k, sizeof(k), "e%d.tar", i);
        d[i] = put_object(k, n, 10 + (unsigned)i);
    }
    client(256 * 1024);
    unsigned long long limit = 3 * n + n / 2;
    open_cache(limit, SF_REVALIDATE_TRUST);
    for (int i = 0; i < 6; i++) {
        char k[32];
        snprintf(k, sizeof(k), "e%d.tar", i);
        cr_assert_eq(read_through(k, d[i], n), SF_CACHE_FROM_FETCH);
        int entries;
        unsigned long long b = cache_bytes(&entries);
        cr_assert_leq(b, limit, "cache holds %llu bytes over the %llu limit", b, limit);
    }
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.evictions, 3);
    cr_assert_eq(cs.entries, 3);
    /* The three most recent stay; the oldest went. */
    cr_assert_eq(read_through("e5.tar", d[5], n), SF_CACHE_FROM_DISK);
    cr_assert_eq(read_through("e3.tar", d[3], n), SF_CACHE_FROM_DISK);
    cr_assert_eq(read_through("e0.tar", d[0], n), SF_CACHE_FROM_FETCH);
    for (int i = 0; i < 6; i++)
        free(d[i]);
}

Test(cache, revalidation_trust_versus_head)
{
    start_mock(NULL);
    size_t n = 300 * 1024;
    unsigned char *v1 = put_object("r.tar", n, 20);
    client(128 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    read_through("r.tar", v1, n);
    unsigned char *v2 = put_object("r.tar", n, 21); /* overwritten: new ETag */
    /* trust: the cached copy is used, no request at all. */
    double gets = key_gets("r.tar");
    cr_assert_eq(read_through("r.tar", v1, n), SF_CACHE_FROM_DISK);
    cr_assert_eq(key_gets("r.tar"), gets);
    sf_cache_destroy(cache);
    cache = NULL;
    /* head: the ETag changed, so the new version is fetched. */
    open_cache(0, SF_REVALIDATE_HEAD);
    cr_assert_eq(read_through("r.tar", v2, n), SF_CACHE_FROM_FETCH);
    cr_assert_eq(read_through("r.tar", v2, n), SF_CACHE_FROM_DISK);
    int entries;
    cache_bytes(&entries);
    cr_assert_eq(entries, 1, "the old version must be removed when the new one is published");
    free(v1);
    free(v2);
}

/* A second process downloads (slowly); this one follows and reads the bytes
 * as they land. */
Test(cache, stream_an_entry_while_another_process_downloads_it)
{
    const char *faults[] = {"--fault", "prefix=bucket/slow,bandwidth=1M", NULL};
    start_mock(faults);
    size_t n = 2 * 1024 * 1024;
    unsigned char *data = put_object("slow.tar", n, 30);
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) {
        client_c(256 * 1024, 1); /* one range at a time: the prefix grows steadily */
        open_cache(0, SF_REVALIDATE_TRUST);
        struct sf_object_info in = info_of("slow.tar");
        struct sf_cache_object *o;
        if (sf_cache_open(cache, s3, &in, &o) != SF_OK)
            _exit(2);
        struct sf_cache_object_progress p;
        sf_status st = sf_cache_object_wait(o, n, 60000, &p);
        while (st == SF_OK && !p.done)
            st = sf_cache_object_wait(o, n, 60000, &p);
        int bad = st != SF_OK || p.source != SF_CACHE_FROM_FETCH ||
                  memcmp(sf_cache_object_data(o), data, n) != 0;
        sf_cache_object_close(o);
        sf_cache_destroy(cache);
        sf_s3_destroy(s3);
        _exit(bad ? 1 : 0);
    }
    client(512 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    /* Wait for the child's download to be under way. */
    int part_seen = 0;
    for (int i = 0; i < 500 && !part_seen; i++) {
        part_seen = tally_cache().parts > 0;
        usleep(10000);
    }
    cr_assert(part_seen, "the child never started downloading");
    struct sf_object_info in = info_of("slow.tar");
    struct sf_cache_object *o;
    cr_assert_eq(sf_cache_open(cache, s3, &in, &o), SF_OK);
    struct sf_cache_object_progress p;
    int partial_reads = 0;
    unsigned long long have = 0;
    for (;;) {
        sf_status st = sf_cache_object_wait(o, have + 1, 60000, &p);
        cr_assert_eq(st, SF_OK, "%s", sf_cache_object_errmsg(o));
        if (p.contiguous > have && p.contiguous < n) {
            partial_reads++;
            cr_assert_eq(p.source, SF_CACHE_FROM_PEER);
            /* Every byte offered so far is already right. */
            cr_assert(memcmp(sf_cache_object_data(o), data, (size_t)p.contiguous) == 0);
        }
        have = p.contiguous;
        if (p.done && have == n)
            break;
    }
    cr_assert_gt(partial_reads, 0, "never read a prefix while it downloaded");
    cr_assert(memcmp(sf_cache_object_data(o), data, n) == 0);
    sf_cache_object_close(o);
    int status;
    cr_assert(waitpid(child, &status, 0) == child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the downloading child failed");
    cr_assert_eq(key_gets("slow.tar"), 8, "downloaded more than once");
    free(data);
}

/* ------------------------------------------------------------ warm-cache */

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
    for (int i = 0; i < 6; i++) {
        char k[32];
        snprintf(k, sizeof(k), "k-%d.tar", i);
        free(put_object(k, n, 60 + (unsigned)i));
    }
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

Test(cache, warm_refuses_data_over_the_limit_before_fetching)
{
    start_mock(NULL);
    for (int i = 0; i < 4; i++) {
        char k[32];
        snprintf(k, sizeof(k), "big-%d.tar", i);
        free(put_object(k, 512 * 1024, 70 + (unsigned)i));
    }
    const char *args[] = {"warm-cache", "--endpoint-url", srv.url, "--cache-dir",
                          cdir,         "--cache-limit",  "1M",    "s3://bucket/big-{0..3}.tar",
                          NULL};
    cr_assert_eq(cli_run(args, "limit"), 1);
    char *err = slurp_tag("limit", "err");
    cr_assert(strstr(err, "cache_limit"), "stderr: %s", err);
    for (int i = 0; i < 4; i++) {
        char k[32];
        snprintf(k, sizeof(k), "big-%d.tar", i);
        cr_assert_eq(key_gets(k), 0, "%s was fetched", k);
    }
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
    free(put_object("d-0.tar", 200000, 90));
    free(put_object("d-1.tar", 200000, 91));
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

/* ------------------------------------------------------------ in-stream checksums */

#define MB (1024u * 1024)

/* A download written and fed piece by piece, as the fetch engine does. */
struct feed_case {
    struct sf__disk_cache *dc;
    struct sf__dc_writer *w;
    unsigned char *data;
    size_t n;
    struct sf__cache_id id;
};

static struct sf__disk_cache *dc_open(void)
{
    struct sf__disk_cache_options o = {.dir = cdir};
    struct sf__disk_cache *dc = NULL;
    char err[512] = "";
    cr_assert_eq(sf__disk_cache_open(&o, &dc, err, sizeof(err)), SF_OK, "%s", err);
    return dc;
}

static void feed_begin(struct feed_case *fc, struct sf__disk_cache *dc, const char *key, size_t n,
                       unsigned seed)
{
    memset(fc, 0, sizeof(*fc));
    fc->dc = dc;
    fc->n = n;
    fc->data = malloc(n);
    cr_assert(fc->data);
    test_fill(fc->data, n, seed);
    fc->id.endpoint = "http://127.0.0.1:1";
    fc->id.bucket = "bucket";
    fc->id.key = key;
    enum sf__dc_begin_result r;
    char err[512] = "";
    cr_assert_eq(sf__dc_begin(dc, &fc->id, "\"e1\"", n, &r, &fc->w, err, sizeof(err)), SF_OK, "%s",
                 err);
    cr_assert_eq(r, SF__DC_OWNER);
}

/* Writes [off, off + len) to the download; feeds it too unless quiet. */
static void feed_put(struct feed_case *fc, size_t off, size_t len, int quiet)
{
    int fd = sf__dc_writer_fd(fc->w);
    cr_assert(pwrite(fd, fc->data + off, len, (off_t)off) == (ssize_t)len);
    if (!quiet)
        sf__dc_writer_feed(fc->w, off, fc->data + off, len);
}

/* Publishes; the entry's block list must be the XXH3 of the object's bytes
 * and the entry must pass the open-time verification. */
static void feed_publish_and_check(struct feed_case *fc)
{
    struct sf__dc_meta m;
    char err[512] = "";
    cr_assert_eq(sf__dc_writer_publish(fc->w, "s3://bucket/k", &m, err, sizeof(err)), SF_OK, "%s",
                 err);
    cr_assert_eq(m.n_blocks, (fc->n + SF__DC_BLOCK_BYTES - 1) / SF__DC_BLOCK_BYTES);
    for (size_t i = 0; i < m.n_blocks; i++) {
        size_t off = i * SF__DC_BLOCK_BYTES;
        size_t len = fc->n - off < SF__DC_BLOCK_BYTES ? fc->n - off : SF__DC_BLOCK_BYTES;
        cr_expect_eq(m.blocks[i], XXH3_64bits(fc->data + off, len), "block %zu", i);
    }
    sf__dc_meta_clear(&m);
    int fd = -1;
    cr_assert_eq(
        sf__dc_lookup(fc->dc, &fc->id, "\"e1\"", SF__DC_VERIFY_DATA, &fd, &m, err, sizeof(err)),
        SF_OK, "%s", err);
    close(fd);
    sf__dc_meta_clear(&m);
    free(fc->data);
}

Test(cache, writer_hashes_blocks_as_bytes_arrive_in_any_order)
{
    make_dirs();
    struct sf__disk_cache *dc = dc_open();
    struct feed_case fc;
    feed_begin(&fc, dc, "order.tar", 4 * SF__DC_BLOCK_BYTES + 1000, 7);
    /* block 0: a range ahead of a gap waits in the file, caught up once the
     * gap fills; then in order again */
    feed_put(&fc, 1 * MB, 512 * 1024, 0);
    feed_put(&fc, 1 * MB + 512 * 1024, 512 * 1024, 0);
    feed_put(&fc, 0, 1 * MB, 0);
    feed_put(&fc, 2 * MB, 2 * MB, 0);
    /* block 1: all at once */
    feed_put(&fc, 4 * MB, 4 * MB, 0);
    /* block 2: a piece given twice: hashed from the file at publish */
    feed_put(&fc, 8 * MB, 1 * MB, 0);
    feed_put(&fc, 8 * MB, 1 * MB, 0);
    feed_put(&fc, 9 * MB, 3 * MB, 0);
    /* block 3: more separate runs ahead of a gap than are tracked */
    for (int i = 8; i >= 0; i--) {
        size_t at = 12 * MB + (size_t)i * 256 * 1024 + 1;
        feed_put(&fc, at, i == 8 ? 16 * MB - at : 256 * 1024 - 1, 0);
    }
    feed_put(&fc, 12 * MB, 1, 0);
    for (int i = 1; i <= 8; i++)
        feed_put(&fc, 12 * MB + (size_t)i * 256 * 1024, 1, 0);
    /* block 4 (1000 bytes): written, never fed (a resumed prefix) */
    feed_put(&fc, 16 * MB, 1000, 1);
    feed_publish_and_check(&fc);
    struct sf__dc_counters n;
    sf__dc_counters(dc, &n);
    cr_expect_eq(n.stream_hashed_blocks, 2, "blocks 0 and 1");
    cr_expect_eq(n.file_hashed_blocks, 3, "blocks 2, 3 and 4");
    cr_expect_eq(n.catch_up_bytes, 1 * MB, "block 0's early MiB, read back once");
    sf__disk_cache_close(dc);
}

/* The checksums are those of the bytes that arrived: a byte that changes on
 * disk after it was written is caught when the entry is opened. */
Test(cache, byte_changed_on_disk_after_it_arrived_fails_verification)
{
    make_dirs();
    struct sf__disk_cache *dc = dc_open();
    struct feed_case fc;
    feed_begin(&fc, dc, "rot.tar", 2 * SF__DC_BLOCK_BYTES + 5, 8);
    feed_put(&fc, 0, fc.n, 0);
    unsigned char b = fc.data[5 * MB + 3] ^ 0x10;
    cr_assert(pwrite(sf__dc_writer_fd(fc.w), &b, 1, 5 * MB + 3) == 1);
    struct sf__dc_meta m;
    char err[512] = "";
    cr_assert_eq(sf__dc_writer_publish(fc.w, "s3://bucket/rot.tar", &m, err, sizeof(err)), SF_OK,
                 "%s", err);
    sf__dc_meta_clear(&m);
    int fd = -1;
    sf_status st =
        sf__dc_lookup(dc, &fc.id, "\"e1\"", SF__DC_VERIFY_DATA, &fd, &m, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CORRUPT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "bytes 4194304..8388607"), "%s", err);
    struct sf__dc_counters n;
    sf__dc_counters(dc, &n);
    cr_expect_eq(n.file_hashed_blocks, 0);
    free(fc.data);
    sf__disk_cache_close(dc);
}

/* A leftover download of another version (its process gone) is not resumed:
 * its bytes are dropped before the new download starts (a new, empty file is
 * left as it is, see sf__dc_begin), and the entry holds the new bytes. */
Test(cache, leftover_download_of_another_version_is_dropped_not_resumed)
{
    make_dirs();
    struct sf__disk_cache *dc = dc_open();
    struct sf__cache_id id = {.endpoint = "http://127.0.0.1:1", .bucket = "bucket", .key = "v.tar"};
    size_t old_n = 3 * MB + 11;
    unsigned char *old = malloc(old_n);
    cr_assert(old);
    test_fill(old, old_n, 21);
    enum sf__dc_begin_result r;
    struct sf__dc_writer *w = NULL;
    char err[512] = "";
    cr_assert_eq(sf__dc_begin(dc, &id, "\"old\"", old_n, &r, &w, err, sizeof(err)), SF_OK, "%s",
                 err);
    cr_assert_eq(r, SF__DC_OWNER);
    cr_assert(pwrite(sf__dc_writer_fd(w), old, old_n, 0) == (ssize_t)old_n);
    sf__dc_writer_progress(w, old_n);
    sf__dc_writer_abort(w, 1); /* as a killed process leaves it */
    free(old);

    struct feed_case fc;
    feed_begin(&fc, dc, "v.tar", 2 * MB + 5, 22); /* ETag "e1", another size */
    cr_assert_eq(sf__dc_writer_resume(fc.w), 0);
    int fd = sf__dc_writer_fd(fc.w);
    struct stat st;
    cr_assert(fstat(fd, &st) == 0);
    cr_assert_eq((size_t)st.st_size, fc.n);
    unsigned char *now = malloc(fc.n);
    cr_assert(now && pread(fd, now, fc.n, 0) == (ssize_t)fc.n);
    size_t stale = 0;
    for (size_t i = 0; i < fc.n; i++)
        stale += now[i] != 0;
    free(now);
    cr_expect_eq(stale, 0, "bytes of the old version are still in the download file");
    feed_put(&fc, 0, fc.n, 0);
    feed_publish_and_check(&fc);
    sf__disk_cache_close(dc);
}

static void set_rules_c(const char *text)
{
    struct s3_call c = {
        .method = "POST", .target = "/_mock/faults", .body = text, .body_len = strlen(text)};
    struct s3_resp r;
    cr_assert(s3_call(srv.url, &c, &r) == 0);
    cr_assert_eq(r.status, 200, "rules %s", text);
    s3_resp_free(&r);
}

static void queue_fault_c(const char *prefix, const char *fault, unsigned count)
{
    char q[512];
    snprintf(q, sizeof(q), "/_mock/fault?prefix=%s&fault=%s&count=%u", prefix, fault, count);
    cr_assert_eq(admin("POST", q, NULL), 200, "%s", q);
}

static struct sf_cache_stats stats_now(void)
{
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    return cs;
}

Test(cache, entries_hashed_in_stream_verify_on_open)
{
    start_mock(NULL);
    size_t n = 10 * MB + 5; /* 3 blocks */
    unsigned char *data = put_object("stream.tar", n, 11);
    client_c(4 * MB, 4); /* ranges end on 4 MiB boundaries: every block in-stream */
    open_cache(0, SF_REVALIDATE_TRUST);
    cr_assert_eq(read_through("stream.tar", data, n), SF_CACHE_FROM_FETCH);
    struct sf_cache_stats cs = stats_now();
    cr_expect_eq(cs.stream_hashed_blocks, 3);
    cr_expect_eq(cs.file_hashed_blocks, 0, "nothing read back at publish");
    cr_expect_leq(cs.catch_up_bytes, 4 * MB - SF_FETCH_FIRST_RANGE_DEFAULT,
                  "only block 0 (first range + the rest of the chunk) may catch up");
    cr_assert_eq(read_through("stream.tar", data, n), SF_CACHE_FROM_DISK, "verified on open");
    unsigned long long bad = 1;
    cr_assert_eq(sf_cache_list(cache, 1, NULL, NULL, &bad), SF_OK);
    cr_expect_eq(bad, 0);
    /* Chunks smaller than a block: several ranges race inside each block. */
    sf_s3_destroy(s3);
    s3 = NULL;
    client_c(512 * 1024, 8);
    unsigned char *data2 = put_object("small-chunks.tar", n, 12);
    cr_assert_eq(read_through("small-chunks.tar", data2, n), SF_CACHE_FROM_FETCH);
    struct sf_cache_stats cs2 = stats_now();
    cr_expect_eq(cs2.stream_hashed_blocks + cs2.file_hashed_blocks, 6);
    cr_assert_eq(read_through("small-chunks.tar", data2, n), SF_CACHE_FROM_DISK);
    free(data);
    free(data2);
}

Test(cache, faulted_download_publishes_a_correct_entry_and_corruption_is_still_caught)
{
    start_mock(NULL);
    size_t n = 16 * MB + 77; /* 5 blocks */
    unsigned char *data = put_object("faulty.tar", n, 13);
    set_rules_c("prefix=bucket/faulty,p500=0.15,reset=0.3");
    queue_fault_c("bucket/faulty.tar", "reset=100000", 2);
    client_c(4 * MB, 4);
    open_cache(0, SF_REVALIDATE_TRUST);
    cr_assert_eq(read_through("faulty.tar", data, n), SF_CACHE_FROM_FETCH);
    struct sf_s3_stats ss;
    sf_s3_get_stats(s3, &ss);
    cr_expect_geq(ss.retries, 2, "the queued resets were retried");
    struct sf_cache_stats cs = stats_now();
    cr_expect_eq(cs.stream_hashed_blocks, 5, "resumed ranges continue their blocks' checksums");
    cr_expect_eq(cs.file_hashed_blocks, 0);
    set_rules_c("");
    cr_assert_eq(read_through("faulty.tar", data, n), SF_CACHE_FROM_DISK, "verified on open");
    /* A flipped byte is still caught, the entry deleted and fetched again. */
    char path[900];
    only_entry(path, sizeof(path));
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0);
    unsigned char b;
    cr_assert(pread(fd, &b, 1, 9 * MB + 1) == 1);
    b ^= 0x01;
    cr_assert(pwrite(fd, &b, 1, 9 * MB + 1) == 1);
    close(fd);
    cr_assert_eq(read_through("faulty.tar", data, n), SF_CACHE_FROM_FETCH);
    cs = stats_now();
    cr_expect_eq(cs.corrupt, 1);
    cr_assert_eq(read_through("faulty.tar", data, n), SF_CACHE_FROM_DISK);
    free(data);
}

static void find_part(void *user, const char *name, const char *path, const struct stat *st)
{
    (void)st;
    if (has_suffix(name, ".part"))
        snprintf(user, 1400, "%s", path);
}

/* What the entry certifies is what came over the network: a byte that
 * changes in the download file after it arrived (a bad disk, another
 * writer) makes the published entry fail its first open, never served. */
Test(cache, byte_changed_in_the_download_file_is_never_served)
{
    start_mock(NULL);
    size_t n = 6 * MB;
    unsigned char *data = put_object("rot.tar", n, 14);
    set_rules_c("prefix=bucket/rot.tar,bandwidth=1M"); /* per connection: >= 3 s in all */
    client_c(1 * MB, 2);
    open_cache(0, SF_REVALIDATE_TRUST);
    struct sf_object_info in = info_of("rot.tar");
    struct sf_cache_object *o = NULL;
    cr_assert_eq(sf_cache_open(cache, s3, &in, &o), SF_OK);
    struct sf_cache_object_progress p;
    cr_assert_eq(sf_cache_object_wait(o, 512 * 1024, 30000, &p), SF_OK, "%s",
                 sf_cache_object_errmsg(o));
    if (p.done) {
        sf_cache_object_close(o);
        free(data);
        cr_skip_test("the download finished before the test could change a byte");
    }
    cr_assert_eq(p.source, SF_CACHE_FROM_FETCH);
    struct tally t = tally_cache();
    cr_assert_eq(t.parts, 1);
    char part[1400] = "";
    walk_cache(find_part, part);
    int fd = open(part, O_RDWR);
    cr_assert(fd >= 0, "%s", part);
    unsigned char b = data[100] ^ 0x80;
    cr_assert(pwrite(fd, &b, 1, 100) == 1);
    close(fd);
    set_rules_c("");
    cr_assert_eq(sf_cache_object_wait(o, n, 30000, &p), SF_OK, "%s", sf_cache_object_errmsg(o));
    cr_assert(p.done);
    sf_cache_object_close(o);
    cr_expect_eq(stats_now().file_hashed_blocks, 0);
    /* The next open finds the entry bad, deletes it and downloads it again. */
    cr_assert_eq(read_through("rot.tar", data, n), SF_CACHE_FROM_FETCH);
    cr_expect_eq(stats_now().corrupt, 1);
    cr_assert_eq(read_through("rot.tar", data, n), SF_CACHE_FROM_DISK);
    free(data);
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
    struct sf_cache_object *o = NULL;
    sf_status st = sf_cache_open(cache, s3, &in, &o);
    char msg[1024] = "";
    if (st == SF_OK) {
        struct sf_cache_object_progress p;
        st = sf_cache_object_wait(o, 4096, 30000, &p);
        snprintf(msg, sizeof(msg), "%s", sf_cache_object_errmsg(o));
        sf_cache_object_close(o);
    } else {
        sf_cache_errmsg(cache, msg, sizeof(msg));
    }
    cr_expect_neq(st, SF_OK);
    cr_expect(strstr(msg, "odd/../x.tar") && strstr(msg, "HTTP 400") &&
                  strstr(msg, "InvalidArgument"),
              "%s: %s", sf_status_name(st), msg);
}
