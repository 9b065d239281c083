/* The disk cache's checksums computed as a download's bytes arrive, in any
 * order, and what they catch on disk. Suite `cache` (test_cache.c). */
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ------------------------------------------------------------ in-stream checksums */

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

/* A download of version "old" of key (3 MB + 11 bytes of seed), all written
 * and left unpublished, in a new cache. */
struct old_download {
    struct sf__disk_cache *dc;
    struct sf__cache_id id;
    unsigned char *bytes;
    size_t n;
    struct sf__dc_writer *w;
};

static void old_download(struct old_download *d, const char *key, unsigned seed)
{
    make_dirs();
    d->dc = dc_open();
    d->id = (struct sf__cache_id){.endpoint = "http://127.0.0.1:1", .bucket = "bucket", .key = key};
    d->n = 3 * MB + 11;
    d->bytes = malloc(d->n);
    cr_assert(d->bytes);
    test_fill(d->bytes, d->n, seed);
    enum sf__dc_begin_result r;
    char err[512] = "";
    d->w = NULL;
    cr_assert_eq(sf__dc_begin(d->dc, &d->id, "\"old\"", d->n, &r, &d->w, err, sizeof(err)), SF_OK,
                 "%s", err);
    cr_assert_eq(r, SF__DC_OWNER);
    cr_assert(pwrite(sf__dc_writer_fd(d->w), d->bytes, d->n, 0) == (ssize_t)d->n);
    sf__dc_writer_progress(d->w, d->n);
}

/* A leftover download of another version (its process gone) is not resumed:
 * its bytes are dropped before the new download starts (a new, empty file is
 * left as it is, see sf__dc_begin), and the entry holds the new bytes. */
Test(cache, leftover_download_of_another_version_is_dropped_not_resumed)
{
    struct old_download od;
    old_download(&od, "v.tar", 21);
    struct sf__disk_cache *dc = od.dc;
    sf__dc_writer_abort(od.w, 1); /* as a killed process leaves it */
    free(od.bytes);

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

/* A process that followed the old download has its bytes mapped (as
 * step_follow maps <kh>.part). The new download of another, smaller version
 * must not cut that file short under it: a read of the mapping past the new
 * end would be SIGBUS. The old bytes stay readable through the mapping. */
Test(cache, new_version_leaves_a_followers_mapping_of_the_old_download_intact)
{
    struct old_download od;
    old_download(&od, "m.tar", 23);
    struct sf__disk_cache *dc = od.dc;
    int pfd = sf__dc_open_part(dc, &od.id);
    cr_assert_geq(pfd, 0);
    const unsigned char *m = mmap(NULL, od.n, PROT_READ, MAP_SHARED, pfd, 0);
    cr_assert_neq(m, MAP_FAILED);
    close(pfd);
    sf__dc_writer_abort(od.w, 1); /* the downloader is killed */

    struct feed_case fc;
    feed_begin(&fc, dc, "m.tar", MB + 5, 24); /* ETag "e1", smaller */
    cr_assert_eq(sf__dc_writer_resume(fc.w), 0);
    cr_expect_eq(memcmp(m, od.bytes, od.n), 0, "the follower's mapping changed under it");
    munmap((void *)m, od.n);
    free(od.bytes);
    feed_put(&fc, 0, fc.n, 0);
    feed_publish_and_check(&fc);
    sf__disk_cache_close(dc);
}

/* docs/cache.md: leftover downloads whose lock is free "are the first to go
 * when space is needed", before any published entry, however recent. */
Test(cache, an_abandoned_download_goes_before_an_entry_when_room_is_needed)
{
    make_dirs();
    struct sf__disk_cache_options o = {.dir = cdir, .limit_bytes = 3 * MB};
    struct sf__disk_cache *dc = NULL;
    char err[512] = "";
    cr_assert_eq(sf__disk_cache_open(&o, &dc, err, sizeof(err)), SF_OK, "%s", err);
    struct feed_case fc;
    feed_begin(&fc, dc, "kept.tar", MB, 41);
    feed_put(&fc, 0, fc.n, 0);
    feed_publish_and_check(&fc); /* the oldest file of the tier */

    feed_begin(&fc, dc, "left.tar", MB, 42); /* its process dies halfway */
    feed_put(&fc, 0, fc.n / 2, 0);
    sf__dc_writer_progress(fc.w, fc.n / 2);
    sf__dc_writer_abort(fc.w, 1);
    free(fc.data);

    feed_begin(&fc, dc, "new.tar", MB, 43); /* needs room: one of the two goes */
    feed_put(&fc, 0, fc.n, 0);
    feed_publish_and_check(&fc);
    struct sf__cache_id kept = {
        .endpoint = "http://127.0.0.1:1", .bucket = "bucket", .key = "kept.tar"};
    struct sf__dc_meta m;
    int fd = -1;
    cr_expect_eq(sf__dc_lookup(dc, &kept, "\"e1\"", 0, &fd, &m, err, sizeof(err)), SF_OK,
                 "the entry was evicted, the abandoned download kept: %s", err);
    if (fd >= 0) {
        close(fd);
        sf__dc_meta_clear(&m);
    }
    struct sf__cache_id left = {
        .endpoint = "http://127.0.0.1:1", .bucket = "bucket", .key = "left.tar"};
    int pfd = sf__dc_open_part(dc, &left);
    cr_expect_lt(pfd, 0, "the abandoned download is still there");
    if (pfd >= 0)
        close(pfd);
    sf__disk_cache_close(dc);
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
    /* 3 blocks; ranges end on 4 MiB boundaries: every block in-stream */
    size_t n = 10 * MB + 5;
    unsigned char *data = mock_and_cache("stream.tar", n, 11, 4 * MB, 4);
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
