/* The RAM and disk tiers, sf_cache_open/warm, and the warm-cache and cache
 * commands, against the mock S3 server (each test starts its own).
 *
 * Suite `cache`, one executable: this file (RAM and disk tiers),
 * test_cache_warm.c (warm-cache and the cache commands) and
 * test_cache_stream.c (checksums computed as bytes arrive), over
 * cache_fixture.c. */
#include "cache_fixture.h"

#include "cache/disk_cache.h"
#include "cache/disk_cache_internal.h"
#include "cache/ram_cache.h"
#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/rss.h"
#include "support/s3_client.h"
#include "support/spawn.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

TestSuite(cache, .fini = cache_teardown, .timeout = 120);

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
    size_t n = 3 * 1024 * 1024 + 17;
    unsigned char *data = mock_and_cache("shard-a.tar", n, 1, 512 * 1024, 4);
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

/* A disk hit is mapped without MAP_POPULATE and its verification gives each
 * block back once hashed: opening a large entry does not make it resident
 * in any mapping of the entry file (it did: populated, then hashed in
 * place). */
Test(cache, a_verified_hit_is_not_left_resident)
{
    size_t n = 9 * 1024 * 1024;
    unsigned char *data = mock_and_cache("big.tar", n, 3, 1024 * 1024, 4);
    cr_assert_eq(read_through("big.tar", data, n), SF_CACHE_FROM_FETCH);
    struct sf_object_info in = info_of("big.tar");
    struct sf_cache_object *o = NULL;
    cr_assert_eq(sf_cache_open(cache, s3, &in, &o), SF_OK);
    struct sf_cache_object_progress p;
    cr_assert_eq(sf_cache_object_wait(o, n, 30000, &p), SF_OK);
    cr_assert_eq(p.source, SF_CACHE_FROM_DISK);
    char path[900];
    only_entry(path, sizeof(path));
    long kib = test_mapped_rss_kib(NULL, path);
    cr_expect_leq(kib, 8, "%ld KiB of the 9 MiB entry resident after its verified open", kib);
    cr_expect(memcmp(sf_cache_object_data(o), data, n) == 0, "the bytes read back");
    sf_cache_object_close(o);
    free(data);
}

Test(cache, flipped_byte_is_detected_deleted_and_fetched_again)
{
    size_t n = 9 * 1024 * 1024;
    unsigned char *data = mock_and_cache("flip.tar", n, 2, 1024 * 1024, 4);
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

/* The RAM tier keeps a verified entry mapped between opens. When its file
 * is cut short by another program, the next open finds the entry bad and
 * fetches it again; the open after that must use the new file, never the
 * old mapping (reading it past the cut faults with SIGBUS). */
Test(cache, a_ram_entry_of_a_replaced_file_is_never_served)
{
    size_t n = 3 * MB + 5;
    start_mock(NULL);
    unsigned char *data = put_object("ram.tar", n, 4);
    client_c(1 * MB, 4);
    struct sf_cache_options co;
    sf_cache_options_init_default(&co);
    co.dir = cdir;
    co.ram_limit_bytes = 64 * MB;
    char err[512] = "";
    cr_assert(sf_cache_new(&co, &cache, err, sizeof(err)) == SF_OK, "%s", err);
    expect_fetched_then_on_disk("ram.tar", data, n);
    cr_assert_eq(read_through("ram.tar", data, n), SF_CACHE_FROM_RAM);
    char path[900];
    only_entry(path, sizeof(path));
    cr_assert(truncate(path, 64 * 1024) == 0);
    cr_assert_eq(read_through("ram.tar", data, n), SF_CACHE_FROM_FETCH);
    cr_assert_eq(read_through("ram.tar", data, n), SF_CACHE_FROM_DISK, "the old mapping was used");
    cr_assert_eq(read_through("ram.tar", data, n), SF_CACHE_FROM_RAM);
    free(data);
}

Test(cache, corrupt_data_found_by_verify_command)
{
    size_t n = 1024 * 1024;
    unsigned char *data = mock_and_cache("t.tar", n, 3, 256 * 1024, 4);
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

/* A disk cache made in cdir with id's 10-byte entry ("0123456789", ETag
 * "e1") published under url by this process, which must have been its
 * owner; m the entry's metadata. */
static struct sf__disk_cache *cache_with_entry(const struct sf__cache_id *id, const char *url,
                                               struct sf__dc_meta *m)
{
    make_dirs();
    struct sf__disk_cache_options o = {.dir = cdir};
    struct sf__disk_cache *dc;
    char err[512];
    cr_assert_eq(sf__disk_cache_open(&o, &dc, err, sizeof(err)), SF_OK, "%s", err);
    enum sf__dc_begin_result r;
    struct sf__dc_writer *w;
    cr_assert_eq(sf__dc_begin(dc, id, "\"e1\"", 10, &r, &w, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_eq(r, SF__DC_OWNER);
    cr_assert(pwrite(sf__dc_writer_fd(w), "0123456789", 10, 0) == 10);
    cr_assert_eq(sf__dc_writer_publish(w, url, m, err, sizeof(err)), SF_OK);
    return dc;
}

/* An entry found bad is deleted by name. When another process republished
 * the name in between (a good entry, another file), the good one must stay:
 * the deletion checks it is still the file that was found bad. */
Test(cache, removing_a_bad_entry_keeps_the_one_republished_meanwhile)
{
    struct sf__cache_id id = {"http://h", "bucket", "re.tar"};
    struct sf__dc_meta m;
    struct sf__disk_cache *dc = cache_with_entry(&id, "s3://bucket/re.tar", &m);
    char path[1024], other[1100];
    snprintf(path, sizeof(path), "%s/v1/%s", cdir, m.name);
    struct stat bad;
    cr_assert_eq(stat(path, &bad), 0);
    /* Another process publishes the same name again: a new file. */
    snprintf(other, sizeof(other), "%s.other", path);
    FILE *f = fopen(other, "wb");
    cr_assert_not_null(f);
    fputs("republished", f);
    fclose(f);
    cr_assert_eq(rename(other, path), 0);
    cr_assert_eq(sf__dc_remove(dc, m.name, &bad), SF_ERR_NOT_FOUND);
    cr_assert_eq(access(path, F_OK), 0, "the republished entry was deleted");
    struct stat now;
    cr_assert_eq(stat(path, &now), 0);
    cr_assert_eq(sf__dc_remove(dc, m.name, &now), SF_OK, "the file found bad itself goes");
    cr_assert_eq(access(path, F_OK), -1);
    sf__dc_meta_clear(&m);
    sf__disk_cache_close(dc);
}

Test(cache, keys_with_dot_dot_stay_inside_the_cache)
{
    struct sf__cache_id id = {"http://h", "bucket", "../../../../../../tmp/escape/../x"};
    struct sf__dc_meta m;
    struct sf__disk_cache *dc = cache_with_entry(&id, "s3://bucket/../../x", &m);
    char err[512];
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

/* ------------------------------------------------------------ truncated entries */

/* A fresh cache holding one entry of n bytes (seed) for id; its path into
 * path. */
static struct sf__disk_cache *open_with_entry(const struct sf__cache_id *id, size_t n,
                                              unsigned seed, char *path, size_t path_len)
{
    make_dirs();
    struct sf__disk_cache_options o = {.dir = cdir};
    struct sf__disk_cache *dc;
    char err[512] = "";
    cr_assert_eq(sf__disk_cache_open(&o, &dc, err, sizeof(err)), SF_OK, "%s", err);
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, seed);
    enum sf__dc_begin_result r;
    struct sf__dc_writer *w;
    cr_assert_eq(sf__dc_begin(dc, id, "\"e1\"", n, &r, &w, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_eq(r, SF__DC_OWNER);
    cr_assert(pwrite(sf__dc_writer_fd(w), data, n, 0) == (ssize_t)n);
    struct sf__dc_meta m;
    cr_assert_eq(sf__dc_writer_publish(w, "s3://bucket/t", &m, err, sizeof(err)), SF_OK, "%s", err);
    snprintf(path, path_len, "%s/v1/%s", cdir, m.name);
    sf__dc_meta_clear(&m);
    free(data);
    return dc;
}

/* An entry cut short by another program (truncate -s, a full disk) before
 * it is opened is refused, deleted, and the message names the entry and
 * the file's size. */
Test(cache, an_entry_truncated_before_its_open_is_refused_with_its_size)
{
    char err[1024] = "", path[1024];
    struct sf__cache_id id = {"http://h", "bucket", "t"};
    struct sf__disk_cache *dc = open_with_entry(&id, 5 * MB, 7, path, sizeof(path));
    cr_assert(truncate(path, 3 * MB) == 0);
    int fd = -1;
    struct sf__dc_meta m;
    cr_assert_eq(sf__dc_lookup(dc, &id, "\"e1\"", SF__DC_VERIFY_DATA, &fd, &m, err, sizeof(err)),
                 SF_ERR_CORRUPT);
    cr_assert_eq(fd, -1);
    cr_assert(strstr(err, "bucket/t") && strstr(err, "3145728 bytes"),
              "the message must name the entry and its size: %s", err);
    cr_assert_eq(access(path, F_OK), -1, "a truncated entry must be deleted");
    sf__disk_cache_close(dc);
}

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* The metadata names the object as C strings: an escaped NUL in one would
 * cut it when read ("t\u0000x" compared as "t"), so an entry whose
 * metadata holds one (checksums made to agree) is refused, not served for
 * another object. */
Test(cache, an_entry_whose_metadata_holds_a_nul_is_refused)
{
    char err[1024] = "", path[1024];
    struct sf__cache_id id = {"http://h", "bucket", "t"};
    size_t n = 1000;
    struct sf__disk_cache *dc = open_with_entry(&id, n, 5, path, sizeof(path));
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    static unsigned char file[1 << 16];
    size_t len = fread(file, 1, sizeof(file), f);
    fclose(f);
    cr_assert(len > n + 64 && len < sizeof(file) - 64);
    /* The metadata with "key":"t" made "key":"t\u0000x", then its length
     * and checksum and the trailer's own checksum written again. */
    char meta[4096];
    size_t ml = len - n - 64;
    cr_assert(ml < sizeof(meta) - 16);
    memcpy(meta, file + n, ml);
    meta[ml] = 0;
    char *k = strstr(meta, "\"key\":\"t\"");
    cr_assert(k, "%s", meta);
    memmove(k + 9 + 7, k + 9, strlen(k + 9) + 1);
    memcpy(k + 8, "\\u0000x", 7);
    ml += 7;
    unsigned char t[64];
    memcpy(t, file + len - 64, 64);
    memcpy(file + n, meta, ml);
    put_le(t + 12, ml, 4);
    put_le(t + 32, XXH3_64bits(meta, ml), 8);
    put_le(t + 48, XXH3_64bits(t, 48), 8);
    memcpy(file + n + ml, t, 64);
    f = fopen(path, "wb");
    cr_assert(f && fwrite(file, 1, n + ml + 64, f) == n + ml + 64);
    fclose(f);
    int fd = -1;
    struct sf__dc_meta m;
    cr_assert_eq(sf__dc_lookup(dc, &id, "\"e1\"", 0, &fd, &m, err, sizeof(err)), SF_ERR_CORRUPT,
                 "an entry of another key was served");
    cr_assert(strstr(err, "NUL"), "%s", err);
    sf__disk_cache_close(dc);
}

struct cutter {
    const char *path;
    unsigned char *bytes; /* the whole entry file */
    size_t n;
    off_t cut_to;          /* 0: 1 MiB */
    atomic_int stop, done; /* done: the cutter stopped (asked, or failed) */
    atomic_int rounds;
    pthread_t thread;
};

/* Cuts the entry file to cut_to (1 MiB) and writes back what was cut, again
 * and again. */
static void *cut_and_restore(void *arg)
{
    struct cutter *c = arg;
    int fd = open(c->path, O_WRONLY);
    while (fd >= 0 && !atomic_load(&c->stop)) {
        off_t to = c->cut_to ? c->cut_to : (off_t)MB;
        if (ftruncate(fd, to) != 0 ||
            pwrite(fd, c->bytes + to, c->n - (size_t)to, to) != (ssize_t)(c->n - (size_t)to))
            break;
        atomic_fetch_add(&c->rounds, 1);
    }
    if (fd >= 0)
        close(fd);
    atomic_store(&c->done, 1);
    return NULL;
}

/* Keeps a copy of the entry file fd (at path) and starts cutting it. */
static void cutter_start(struct cutter *c, const char *path, int fd, off_t cut_to)
{
    struct stat sb;
    cr_assert(fstat(fd, &sb) == 0);
    c->path = path;
    c->n = (size_t)sb.st_size;
    c->cut_to = cut_to;
    c->bytes = malloc(c->n);
    cr_assert(c->bytes && pread(fd, c->bytes, c->n, 0) == (ssize_t)c->n);
    cr_assert_eq(pthread_create(&c->thread, NULL, cut_and_restore, c), 0);
}

/* Stops the cutter; the file is whole again once it returns. */
static void cutter_stop(struct cutter *c)
{
    atomic_store(&c->stop, 1);
    pthread_join(c->thread, NULL);
    free(c->bytes);
}

/* The entry file shrinks while an open verifies it: the verification fails
 * (the entry is then deleted and fetched again), it never faults (SIGBUS
 * on a mapping past the new end of the file). */
Test(cache, an_entry_truncated_during_its_verification_never_faults)
{
    char err[1024] = "", path[1024];
    struct sf__cache_id id = {"http://h", "bucket", "t"};
    struct sf__disk_cache *dc = open_with_entry(&id, 16 * MB, 9, path, sizeof(path));
    int fd = -1;
    struct sf__dc_meta m;
    cr_assert_eq(sf__dc_lookup(dc, &id, "\"e1\"", 0, &fd, &m, err, sizeof(err)), SF_OK, "%s", err);
    struct cutter c = {0};
    cutter_start(&c, path, fd, 0);
    /* Until the file was cut 20 times (the cutter is slower than a check
     * that fails early), and 60 checks at least. */
    int failed = 0, i = 0;
    for (; i < 60 || (atomic_load(&c.rounds) < 20 && !atomic_load(&c.done)); i++) {
        sf_status st = sf__dc_verify_fd(fd, &m, err, sizeof(err));
        cr_assert(st == SF_OK || st == SF_ERR_CORRUPT, "verify: %s", sf_status_name(st));
        failed += st != SF_OK;
    }
    cutter_stop(&c);
    cr_log_info("%d of %d verifications failed, %d cuts", failed, i, atomic_load(&c.rounds));
    cr_assert_geq(atomic_load(&c.rounds), 20, "the cutter stopped early");
    cr_assert_eq(sf__dc_verify_fd(fd, &m, err, sizeof(err)), SF_OK, "restored: %s", err);
    sf__dc_meta_clear(&m);
    close(fd);
    sf__disk_cache_close(dc);
}

/* A small entry cut and written back again and again while its trailer and
 * metadata are read: a file that ends before the size fstat gave a moment
 * earlier is a corrupt entry (deleted, fetched again), never an I/O error,
 * which fails the open. */
Test(cache, an_entry_cut_while_its_trailer_is_read_is_corrupt_not_an_io_error)
{
    char err[1024] = "", path[1024];
    struct sf__cache_id id = {"http://h", "bucket", "t"};
    struct sf__disk_cache *dc = open_with_entry(&id, 8192, 9, path, sizeof(path));
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    struct cutter c = {0};
    cutter_start(&c, path, fd, 4096);
    int counts[3] = {0, 0, 0};
    for (int i = 0; i < 20000 || (atomic_load(&c.rounds) < 2000 && !atomic_load(&c.done)); i++) {
        struct sf__dc_meta m;
        sf_status st = sf__dc_read_entry(fd, &id, "\"e1\"", &m, err, sizeof(err));
        cr_assert(st == SF_OK || st == SF_ERR_CORRUPT, "%s: %s", sf_status_name(st), err);
        counts[st == SF_OK ? 0 : 1]++;
        sf__dc_meta_clear(&m);
    }
    cutter_stop(&c);
    cr_log_info("%d read, %d corrupt, %d cuts", counts[0], counts[1], atomic_load(&c.rounds));
    close(fd);
    sf__disk_cache_close(dc);
}

Test(cache, limit_holds_under_eviction)
{
    start_mock(NULL);
    size_t n = 1024 * 1024;
    unsigned char *d[6];
    put_numbered_objects(d, 6, "e", 1, n, 10);
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

/* An object bigger than cache_limit can never fit: the open fails without
 * evicting what is cached (nothing could make room for it). */
Test(cache, an_object_over_the_limit_evicts_nothing)
{
    start_mock(NULL);
    unsigned char *small = put_object("fits.tar", 100 * 1024, 31);
    free(put_object("huge.tar", 2 * MB, 32));
    client(256 * 1024);
    open_cache(MB, SF_REVALIDATE_TRUST);
    cr_assert_eq(read_through("fits.tar", small, 100 * 1024), SF_CACHE_FROM_FETCH);
    struct sf_object_info in = info_of("huge.tar");
    struct sf_cache_object *o = NULL;
    cr_assert_eq(sf_cache_open(cache, s3, &in, &o), SF_OK);
    struct sf_cache_object_progress p;
    sf_status st = sf_cache_object_wait(o, 2 * MB, 30000, &p);
    const char *msg = sf_cache_object_errmsg(o);
    cr_assert_eq(st, SF_ERR_LIMIT, "wait: %s (%s)", sf_status_name(st), msg);
    cr_assert(strstr(msg, "huge.tar") && strstr(msg, "cache_limit"), "%s", msg);
    sf_cache_object_close(o);
    cr_assert_eq(key_gets("huge.tar"), 0);
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.evictions, 0);
    cr_assert_eq(cs.entries, 1);
    cr_assert_eq(read_through("fits.tar", small, 100 * 1024), SF_CACHE_FROM_DISK);
    free(small);
}

/* Fake entries in four key folders of the cache (names only: a scan reads
 * no content), 1000 bytes each. */
static void fake_entries(void)
{
    const char *dirs[] = {"0a", "1b", "2c", "3d"};
    for (int i = 0; i < 4; i++) {
        char p[900];
        snprintf(p, sizeof(p), "%s/v1/%s", cdir, dirs[i]);
        cr_assert(mkdir(p, 0700) == 0 || errno == EEXIST, "%s", p);
        snprintf(p, sizeof(p), "%s/v1/%s/%s%062d-%032d.sf", cdir, dirs[i], dirs[i], i, i);
        FILE *f = fopen(p, "w");
        cr_assert(f, "%s", p);
        for (int k = 0; k < 1000; k++)
            fputc('x', f);
        fclose(f);
    }
}

/* Leaves exactly `spare` descriptors free in this process. */
static void leave_free_fds(int spare)
{
    struct rlimit rl;
    cr_assert(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rl.rlim_cur = 64;
    cr_assert(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    int last[8], n = 0, fd;
    while ((fd = dup(0)) >= 0) {
        for (int i = 7; i > 0; i--)
            last[i] = last[i - 1];
        last[0] = fd;
        n++;
    }
    cr_assert(n >= spare);
    for (int i = 0; i < spare; i++)
        close(last[i]);
}

/* A folder of the cache that cannot be opened (no descriptor left) fails
 * the scan: clearing, counting and eviction never act on a part of the
 * cache as if it were all of it (a clear that said it was done, a usage
 * count below what the disk holds, then more than cache_limit). */
Test(cache, a_folder_the_scan_cannot_open_fails_it_naming_why)
{
    make_dirs();
    open_cache(0, SF_REVALIDATE_TRUST);
    fake_entries();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* evict.lock and the top folder open; the first key folder cannot. */
        leave_free_fds(2);
        unsigned long long removed = 99;
        sf_status st = sf_cache_clear(cache, &removed);
        char m[512];
        sf_cache_errmsg(cache, m, sizeof(m));
        int ok = st == SF_ERR_IO && strstr(m, "cannot scan") && strstr(m, "Too many open files");
        _exit(ok ? 0 : st == SF_OK ? 10 + (int)removed : 2);
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws), "signal %d", WTERMSIG(ws));
    cr_assert_eq(WEXITSTATUS(ws), 0,
                 "exit %d (10 + n: the clear said it removed n of 4 entries and succeeded)",
                 WEXITSTATUS(ws));
    /* Nothing was removed; with descriptors, the same clear takes all four. */
    unsigned long long removed = 0;
    cr_assert_eq(sf_cache_clear(cache, &removed), SF_OK);
    cr_assert_eq(removed, 4);
}

Test(cache, revalidation_trust_versus_head)
{
    size_t n = 300 * 1024;
    unsigned char *v1 = mock_and_cache("r.tar", n, 20, 128 * 1024, 4);
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
    expect_fetched_then_on_disk("r.tar", v2, n);
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
    start_mock_with_fault("prefix=bucket/slow,bandwidth=1M");
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
