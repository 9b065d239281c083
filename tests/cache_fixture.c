/* The cache suite's fixture (cache_fixture.h). */
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

struct mock_proc srv;
char *tmp;
char root[600];
char cdir[600];
struct sf_s3 *s3;
struct sf_cache *cache;

void make_dirs(void)
{
    tmp = mock_env_root(root, sizeof(root));
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    snprintf(cdir, sizeof(cdir), "%s/cache", tmp);
}

void start_mock(const char *const *extra)
{
    make_dirs();
    mock_env_start(&srv, root, extra);
}

void start_mock_with_fault(const char *spec)
{
    const char *faults[] = {"--fault", spec, NULL};
    start_mock(faults);
}

unsigned char *mock_with_object(const char *fault, const char *key, size_t n, unsigned seed)
{
    if (fault)
        start_mock_with_fault(fault);
    else
        start_mock(NULL);
    return put_object(key, n, seed);
}

void cache_teardown(void)
{
    sf_cache_destroy(cache);
    cache = NULL;
    mock_env_stop(&srv, &tmp, &s3);
}

/* ------------------------------------------------------------ helpers */

long admin(const char *method, const char *path_query, char **out)
{
    return mock_env_admin(&srv, method, path_query, NULL, out);
}

double key_gets(const char *key)
{
    cJSON *j = mock_env_stats(&srv);
    char k[300];
    snprintf(k, sizeof(k), "bucket/%s", key);
    double n = mock_env_jnum(j, "keys", k, "operations", "GetObject");
    cJSON_Delete(j);
    return n;
}

unsigned char *put_object(const char *key, size_t n, unsigned seed)
{
    return mock_env_put(root, key, n, seed);
}

void put_numbered_objects(unsigned char **d, int count, const char *prefix, int digits, size_t n,
                          unsigned seed0)
{
    for (int i = 0; i < count; i++) {
        char k[64];
        snprintf(k, sizeof(k), "%s%0*d.tar", prefix, digits, i);
        d[i] = put_object(k, n, seed0 + (unsigned)i);
    }
}

void client_c(unsigned long long chunk, unsigned concurrency)
{
    struct sf_s3_options o;
    mock_env_s3_fast(&o, srv.url, concurrency, chunk);
    s3 = mock_env_s3_new(&o);
}

void client(unsigned long long chunk)
{
    client_c(chunk, 4);
}

void open_cache(unsigned long long limit, enum sf_cache_revalidate rv)
{
    struct sf_cache_options co;
    sf_cache_options_init_default(&co);
    co.dir = cdir;
    co.limit_bytes = limit;
    co.revalidate = rv;
    char err[512] = "";
    cr_assert(sf_cache_new(&co, &cache, err, sizeof(err)) == SF_OK, "%s", err);
}

unsigned char *mock_and_cache(const char *key, size_t n, unsigned seed, unsigned long long chunk,
                              unsigned concurrency)
{
    start_mock(NULL);
    unsigned char *data = put_object(key, n, seed);
    client_c(chunk, concurrency);
    open_cache(0, SF_REVALIDATE_TRUST);
    return data;
}

struct sf_object_info info_of(const char *key)
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

enum sf_cache_source read_through(const char *key, const unsigned char *want, size_t n)
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

void expect_fetched_then_on_disk(const char *key, const unsigned char *want, size_t n)
{
    cr_assert_eq(read_through(key, want, n), SF_CACHE_FROM_FETCH);
    cr_assert_eq(read_through(key, want, n), SF_CACHE_FROM_DISK);
}

struct sf_cache_object *open_through(const char *key)
{
    struct sf_object_info in = info_of(key);
    struct sf_cache_object *o = NULL;
    cr_assert_eq(sf_cache_open(cache, s3, &in, &o), SF_OK);
    return o;
}

void wait_whole(struct sf_cache_object *o, const unsigned char *want, size_t n,
                struct sf_cache_object_progress *p)
{
    sf_status st = sf_cache_object_wait(o, n, 30000, p);
    cr_assert_eq(st, SF_OK, "%s", sf_cache_object_errmsg(o));
    cr_assert(p->done);
    cr_assert(memcmp(sf_cache_object_data(o), want, n) == 0, "wrong bytes");
}

void walk_cache(void (*fn)(void *user, const char *name, const char *path, const struct stat *st),
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

int has_suffix(const char *name, const char *suffix)
{
    size_t l = strlen(name), k = strlen(suffix);
    return l > k && !strcmp(name + l - k, suffix);
}

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

struct tally tally_cache(void)
{
    struct tally t;
    memset(&t, 0, sizeof(t));
    walk_cache(tally_one, &t);
    return t;
}

unsigned long long cache_bytes(int *n_entries)
{
    struct tally t = tally_cache();
    if (n_entries)
        *n_entries = t.entries;
    return t.bytes;
}

void only_entry(char *out, size_t n)
{
    struct tally t = tally_cache();
    cr_assert_eq(t.entries, 1, "expected one entry, found %d", t.entries);
    cr_assert(snprintf(out, n, "%s", t.entry_path) < (int)n);
}

pid_t cli_spawn(const char *const *args, const char *tag)
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

int cli_wait(pid_t pid)
{
    int rc = test_wait(pid);
    cr_assert(rc >= 0);
    return rc;
}

int cli_run(const char *const *args, const char *tag)
{
    return cli_wait(cli_spawn(args, tag));
}

char *slurp_tag(const char *tag, const char *ext)
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

void set_rules_c(const char *text)
{
    struct s3_call c = {
        .method = "POST", .target = "/_mock/faults", .body = text, .body_len = strlen(text)};
    struct s3_resp r;
    cr_assert(s3_call(srv.url, &c, &r) == 0);
    cr_assert_eq(r.status, 200, "rules %s", text);
    s3_resp_free(&r);
}
