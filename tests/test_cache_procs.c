/* The disk cache as the processes of a node share it (docs/cache.md,
 * "Publishing and sharing between processes", "Eviction and the limit"):
 * crashes in the middle of a download or a publish, a cache directory that
 * disappears, writes that fail for want of room, entries evicted while
 * another process reads them. Part of the `cache` suite (test_cache.c). */
#include "cache_fixture.h"

#include "cache/disk_cache.h"
#include "cache/disk_cache_internal.h"
#include "shardfeed.h"
#include "support/spawn.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* rm -rf path (test support: the tree is ours). */
static void remove_tree(const char *path)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execlp("rm", "rm", "-rf", path, (char *)NULL);
        _exit(127);
    }
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* `rm -rf` of the whole cache directory while a process has it open (a
 * user freeing the disk, a cleaner of $XDG_CACHE_HOME): the next miss makes
 * the directory again and fetches, rather than failing every later shard. */
Test(cache, a_cache_dir_removed_while_open_is_made_again)
{
    size_t n = 300 * 1024;
    unsigned char *a = mock_and_cache("gone-a.tar", n, 71, 256 * 1024, 4);
    unsigned char *b = put_object("gone-b.tar", n, 72);
    cr_assert_eq(read_through("gone-a.tar", a, n), SF_CACHE_FROM_FETCH);
    remove_tree(cdir);
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.entries, 0);
    cr_assert_eq(read_through("gone-b.tar", b, n), SF_CACHE_FROM_FETCH);
    expect_fetched_then_on_disk("gone-a.tar", a, n);
    struct tally t = tally_cache();
    cr_assert_eq(t.entries, 2);
    cr_assert_eq(t.parts, 0);
    free(a);
    free(b);
}

/* The cache directory removed while this process downloads into it: the
 * download cannot be published (its file is gone), but the reader has every
 * byte of it mapped and gets the object; later opens fetch it again into the
 * directory made anew. docs/cache.md says rm under the cache is safe. */
Test(cache, a_download_whose_directory_is_removed_still_serves_its_reader)
{
    size_t n = 768 * 1024;
    unsigned char *d = mock_with_object("prefix=bucket/rm,bandwidth=2M", "rm.tar", n, 74);
    client_c(256 * 1024, 1);
    open_cache(0, SF_REVALIDATE_TRUST);
    struct sf_cache_object *o = open_through("rm.tar");
    struct sf_cache_object_progress p;
    cr_assert_eq(sf_cache_object_wait(o, 1, 30000, &p), SF_OK, "%s", sf_cache_object_errmsg(o));
    cr_assert_eq(p.source, SF_CACHE_FROM_FETCH);
    cr_assert_lt(p.contiguous, n, "the download ended before the directory was removed");
    remove_tree(cdir);
    wait_whole(o, d, n, &p);
    cr_assert_eq(p.contiguous, n);
    sf_cache_object_close(o);
    expect_fetched_then_on_disk("rm.tar", d, n);
    free(d);
}
/* Reads key through a new client and cache in this (child) process: 0 when
 * every byte is right, else 1 with the error in msg. */
static int child_read(const char *key, const unsigned char *want, size_t n, char *msg, size_t len)
{
    client(256 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    struct sf_object_info in = info_of(key);
    struct sf_cache_object *o = NULL;
    sf_status st = sf_cache_open(cache, s3, &in, &o);
    if (st != SF_OK) {
        sf_cache_errmsg(cache, msg, len);
        return 1;
    }
    struct sf_cache_object_progress p;
    st = sf_cache_object_wait(o, n, 30000, &p);
    int bad = st != SF_OK || !p.done || p.contiguous != n ||
              memcmp(sf_cache_object_data(o), want, n) != 0;
    snprintf(msg, len, "%s", st != SF_OK ? sf_cache_object_errmsg(o) : bad ? "wrong bytes" : "");
    sf_cache_object_close(o);
    return bad;
}

/* A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG,
 * as on a full disk) that lets the data in but not the metadata after it:
 * the reader still gets every byte of the object (it has them all, mapped),
 * nothing half-written is left in the cache, and a later open fetches and
 * publishes it. */
Test(cache, a_publish_that_cannot_write_its_metadata_still_serves_the_bytes)
{
    size_t n = 300 * 1024;
    unsigned char *d = mock_with_object(NULL, "full.tar", n, 73);
    int fd;
    pid_t pid = test_fork_piped(&fd);
    cr_assert(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {n + 100, n + 100};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(3);
        char msg[1024] = "";
        int rc = child_read("full.tar", d, n, msg, sizeof(msg));
        if (write(fd, msg, strlen(msg)) < 0)
            _exit(4);
        _exit(rc);
    }
    char msg[1024] = "";
    int status = test_wait_piped(pid, fd, msg, sizeof(msg));
    cr_assert(status != -1);
    cr_assert(WIFEXITED(status), "the reader died of signal %d", WTERMSIG(status));
    cr_assert_eq(WEXITSTATUS(status), 0, "the reader failed: %s", msg);
    struct tally t = tally_cache();
    cr_assert_eq(t.entries + t.parts, 0, "left %d entries, %d parts", t.entries, t.parts);
    client(256 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    expect_fetched_then_on_disk("full.tar", d, n);
    free(d);
}

/* A process that follows another's download (FROM_PEER) when that one is
 * SIGKILLed in the middle: the kernel drops the dead one's flock, the
 * follower takes over at once, resumes from the bytes already on disk and
 * reads the right object; nothing is left locked or half-published. */
Test(cache, a_follower_takes_over_when_the_downloader_is_killed)
{
    size_t n = 640 * 1024;
    unsigned char *d = mock_with_object("prefix=bucket/kill,bandwidth=1M", "kill.tar", n, 75);
    int fd;
    pid_t pid = test_fork_piped(&fd);
    cr_assert(pid >= 0);
    if (pid == 0) {
        client_c(64 * 1024, 1);
        open_cache(0, SF_REVALIDATE_TRUST);
        struct sf_object_info in = info_of("kill.tar");
        struct sf_cache_object *o = NULL;
        struct sf_cache_object_progress p;
        if (sf_cache_open(cache, s3, &in, &o) != SF_OK ||
            sf_cache_object_wait(o, 1, 30000, &p) != SF_OK || p.source != SF_CACHE_FROM_FETCH)
            _exit(2);
        if (write(fd, "o", 1) != 1)
            _exit(3);
        for (;;)
            sf_cache_object_wait(o, n, 30000, &p); /* killed here */
    }
    char c;
    cr_assert_eq(read(fd, &c, 1), 1, "the downloader did not start");
    close(fd);
    client_c(64 * 1024, 1);
    open_cache(0, SF_REVALIDATE_TRUST);
    struct sf_cache_object *o = open_through("kill.tar");
    struct sf_cache_object_progress p;
    cr_assert_eq(sf_cache_object_wait(o, 64 * 1024, 30000, &p), SF_OK);
    cr_assert_eq(p.source, SF_CACHE_FROM_PEER);
    cr_assert_lt(p.contiguous, n, "the download ended before the kill");
    kill(pid, SIGKILL);
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    wait_whole(o, d, n, &p);
    cr_assert_eq(p.source, SF_CACHE_FROM_FETCH, "source %d", p.source);
    sf_cache_object_close(o);
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.resumed, 1, "the follower did not resume the dead one's bytes");
    struct tally t = tally_cache();
    cr_assert_eq(t.entries, 1);
    cr_assert_eq(t.parts, 0);
    cr_assert_eq(read_through("kill.tar", d, n), SF_CACHE_FROM_DISK);
    free(d);
}

/* An entry another process has open and mapped is evicted to make room
 * (a limit smaller than the working set): that process still reads every
 * byte of it right, with no SIGBUS, and the tier stays under its limit. */
Test(cache, an_entry_evicted_while_another_process_reads_it_stays_readable)
{
    start_mock(NULL);
    size_t n = 512 * 1024;
    unsigned char *a = put_object("ev-a.tar", n, 76);
    unsigned char *b = put_object("ev-b.tar", n, 77);
    client(256 * 1024);
    unsigned long long limit = n + n / 2;
    open_cache(limit, SF_REVALIDATE_TRUST);
    cr_assert_eq(read_through("ev-a.tar", a, n), SF_CACHE_FROM_FETCH);
    int opened[2], go[2];
    cr_assert(pipe(opened) == 0 && pipe(go) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(opened[0]);
        close(go[1]);
        /* The parent's client and cache are not the child's to destroy
         * (the client's I/O thread is not here): new ones. */
        client(256 * 1024);
        open_cache(limit, SF_REVALIDATE_TRUST);
        struct sf_object_info in = info_of("ev-a.tar");
        struct sf_cache_object *o = NULL;
        struct sf_cache_object_progress p;
        if (sf_cache_open(cache, s3, &in, &o) != SF_OK ||
            sf_cache_object_wait(o, n, 30000, &p) != SF_OK || p.source != SF_CACHE_FROM_DISK)
            _exit(2);
        char c = 'o';
        if (write(opened[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
            _exit(3);
        _exit(memcmp(sf_cache_object_data(o), a, n) == 0 ? 0 : 1);
    }
    close(opened[1]);
    close(go[0]);
    char c;
    cr_assert_eq(read(opened[0], &c, 1), 1, "the reader could not open the entry");
    cr_assert_eq(read_through("ev-b.tar", b, n), SF_CACHE_FROM_FETCH);
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.evictions, 1);
    cr_assert_eq(cs.entries, 1);
    cr_assert_leq(cache_bytes(NULL), limit);
    cr_assert_eq(write(go[1], "g", 1), 1);
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid);
    cr_assert(WIFEXITED(status), "the reader died of signal %d", WTERMSIG(status));
    cr_assert_eq(WEXITSTATUS(status), 0, "the reader of the evicted entry failed");
    close(opened[0]);
    close(go[1]);
    free(a);
    free(b);
}

/* A child process becomes the downloader of id (n bytes, ETag "e1") in the
 * cache dco names, writes data (when not NULL) and records all n bytes as
 * written, appends tail (when not NULL) after them, and is SIGKILLed. */
static void downloader_killed(const struct sf__disk_cache_options *dco,
                              const struct sf__cache_id *id, const unsigned char *data, size_t n,
                              const char *tail)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        struct sf__disk_cache *dc;
        enum sf__dc_begin_result r;
        struct sf__dc_writer *w;
        char err[512];
        if (sf__disk_cache_open(dco, &dc, err, sizeof(err)) != SF_OK ||
            sf__dc_begin(dc, id, "\"e1\"", n, &r, &w, err, sizeof(err)) != SF_OK ||
            r != SF__DC_OWNER || (data && pwrite(sf__dc_writer_fd(w), data, n, 0) != (ssize_t)n))
            _exit(2);
        sf__dc_writer_progress(w, n);
        if (tail &&
            pwrite(sf__dc_writer_fd(w), tail, strlen(tail), (off_t)n) != (ssize_t)strlen(tail))
            _exit(3);
        raise(SIGKILL);
        _exit(4);
    }
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the child ended %d", status);
}

/* A downloader SIGKILLed in the middle of its publish (all the data written
 * and reported, part of the metadata appended, not yet renamed): the next
 * process finds no entry (the half one is never read as good), becomes the
 * downloader at once (the dead one's lock is gone), does not resume from a
 * file that holds more than the object, and publishes a good entry. */
Test(cache, a_downloader_killed_during_its_publish_leaves_nothing_served)
{
    make_dirs();
    struct sf__disk_cache_options dco = {.dir = cdir};
    struct sf__cache_id id = {"http://h", "bucket", "pub.tar"};
    size_t n = 200 * 1024;
    unsigned char *data = malloc(n);
    cr_assert(data);
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(i * 131 + 7);
    char err[512] = "";
    downloader_killed(&dco, &id, data, n, "{\"format\":1,\"url\":");
    struct sf__disk_cache *dc;
    cr_assert_eq(sf__disk_cache_open(&dco, &dc, err, sizeof(err)), SF_OK, "%s", err);
    int fd;
    struct sf__dc_meta m;
    cr_assert_eq(sf__dc_lookup(dc, &id, "\"e1\"", SF__DC_VERIFY_DATA, &fd, &m, err, sizeof(err)),
                 SF_ERR_NOT_FOUND, "%s", err);
    cr_assert_eq(sf__dc_lookup(dc, &id, NULL, 0, &fd, &m, err, sizeof(err)), SF_ERR_NOT_FOUND);
    enum sf__dc_begin_result r;
    struct sf__dc_writer *w;
    cr_assert_eq(sf__dc_begin(dc, &id, "\"e1\"", n, &r, &w, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_eq(r, SF__DC_OWNER, "the dead downloader's lock is still held");
    cr_assert_eq(sf__dc_writer_resume(w), 0);
    struct stat sb;
    cr_assert(fstat(sf__dc_writer_fd(w), &sb) == 0);
    cr_assert_eq((size_t)sb.st_size, n);
    cr_assert(pwrite(sf__dc_writer_fd(w), data, n, 0) == (ssize_t)n);
    sf__dc_writer_feed(w, 0, data, n);
    cr_assert_eq(sf__dc_writer_publish(w, "s3://bucket/pub.tar", &m, err, sizeof(err)), SF_OK, "%s",
                 err);
    sf__dc_meta_clear(&m);
    cr_assert_eq(sf__dc_lookup(dc, &id, "\"e1\"", SF__DC_VERIFY_DATA, &fd, &m, err, sizeof(err)),
                 SF_OK, "%s", err);
    unsigned char *back = malloc(n);
    cr_assert(back && pread(fd, back, n, 0) == (ssize_t)n);
    cr_assert(memcmp(back, data, n) == 0);
    close(fd);
    sf__dc_meta_clear(&m);
    struct tally t = tally_cache();
    cr_assert_eq(t.entries, 1);
    cr_assert_eq(t.parts, 0);
    sf__disk_cache_close(dc);
    free(back);
    free(data);
}

/* True once pid waits for an flock (a "->" line of /proc/locks). */
static int waits_for_flock(pid_t pid)
{
    FILE *f = fopen("/proc/locks", "r");
    cr_assert_not_null(f);
    char line[256], want[32];
    snprintf(want, sizeof(want), " %d ", (int)pid);
    int found = 0;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, "->") && strstr(line, "FLOCK") && strstr(line, want);
    fclose(f);
    return found;
}

/* A downloader killed with every byte written leaves a record that claims
 * them; its .part then goes (a cleaner). The next downloader replaces the
 * .part with a new, empty file, and a follower that believed the old record
 * read that file's zeros as the object. Now the new downloader withdraws the
 * claim before it touches the file: seen here while it waits for evict.lock,
 * which it takes before it makes the new .part. */
Test(cache, a_new_downloader_withdraws_the_old_claim_before_it_replaces_the_part)
{
    make_dirs();
    struct sf__disk_cache_options dco = {.dir = cdir};
    struct sf__cache_id id = {"http://h", "bucket", "claim.tar"};
    size_t n = 64 * 1024;
    char err[512] = "";
    downloader_killed(&dco, &id, NULL, n, NULL);
    struct sf__disk_cache *dc;
    cr_assert_eq(sf__disk_cache_open(&dco, &dc, err, sizeof(err)), SF_OK, "%s", err);
    char kh[65], part[1024];
    sf__dc_key_hash(&id, kh);
    snprintf(part, sizeof(part), "%s/v1/%.2s/%s.part", cdir, kh, kh);
    cr_assert_eq(unlink(part), 0, "%s: %s", part, strerror(errno));
    struct sf__dc_record rec;
    int alive;
    cr_assert_eq(sf__dc_peek(dc, &id, &rec, &alive), SF_OK);
    cr_assert(rec.state == SF__DC_ST_DOWNLOADING && rec.contiguous == n && !alive);

    int lk = sf__dc_evict_lock(dc);
    cr_assert(lk >= 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        struct sf__disk_cache *dc2;
        enum sf__dc_begin_result r;
        struct sf__dc_writer *w;
        if (sf__disk_cache_open(&dco, &dc2, err, sizeof(err)) != SF_OK ||
            sf__dc_begin(dc2, &id, "\"e1\"", n, &r, &w, err, sizeof(err)) != SF_OK ||
            r != SF__DC_OWNER || sf__dc_writer_resume(w) != 0)
            _exit(2);
        _exit(0);
    }
    /* a hang guard, not a timing: the child blocks at once */
    for (int i = 0; i < 20000 && !waits_for_flock(pid); i++)
        usleep(1000);
    cr_assert(waits_for_flock(pid), "the new downloader never waited for evict.lock");
    cr_assert_eq(sf__dc_peek(dc, &id, &rec, &alive), SF_OK);
    cr_expect(alive, "the new downloader holds the key's lock");
    cr_expect(rec.state != SF__DC_ST_DOWNLOADING || rec.contiguous == 0,
              "while the .part is replaced the record still claims %llu bytes (state %u)",
              (unsigned long long)rec.contiguous, rec.state);
    sf__dc_evict_unlock(lk);
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the new downloader ended %d", status);
    sf__disk_cache_close(dc);
}

/* Four processes read different shards at once through one cache whose limit
 * holds five of the sixteen: every read succeeds with the right bytes, the
 * tier ends under its limit, and each entry that went was evicted once (the
 * evictions add up to what left, no storm). */
Test(cache, processes_sharing_a_small_limit_evict_only_what_must_go)
{
    start_mock(NULL);
    size_t n = 256 * 1024;
    unsigned char *d[16];
    put_numbered_objects(d, 16, "lim-", 2, n, 80);
    unsigned long long limit = 5 * (unsigned long long)sf__dc_entry_reserve(n);
    int pfd[2];
    cr_assert(pipe(pfd) == 0);
    pid_t pids[4];
    for (int c = 0; c < 4; c++) {
        pids[c] = fork();
        cr_assert(pids[c] >= 0);
        if (pids[c] > 0)
            continue;
        close(pfd[0]);
        client(256 * 1024);
        open_cache(limit, SF_REVALIDATE_TRUST);
        for (int i = c; i < 16; i += 4) {
            char k[32];
            snprintf(k, sizeof(k), "lim-%02d.tar", i);
            struct sf_object_info in = info_of(k);
            struct sf_cache_object *o = NULL;
            struct sf_cache_object_progress p;
            if (sf_cache_open(cache, s3, &in, &o) != SF_OK)
                _exit(2);
            sf_status st = sf_cache_object_wait(o, n, 30000, &p);
            if (st != SF_OK || !p.done || memcmp(sf_cache_object_data(o), d[i], n) != 0)
                _exit(3);
            sf_cache_object_close(o);
        }
        struct sf_cache_stats cs;
        if (sf_cache_stats(cache, &cs) != SF_OK)
            _exit(4);
        unsigned long long ev = cs.evictions;
        if (write(pfd[1], &ev, sizeof(ev)) != (ssize_t)sizeof(ev))
            _exit(5);
        _exit(0);
    }
    close(pfd[1]);
    unsigned long long evictions = 0;
    for (int c = 0; c < 4; c++) {
        int status;
        cr_assert(waitpid(pids[c], &status, 0) == pids[c]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "reader %d ended %d", c, status);
        unsigned long long ev;
        cr_assert_eq(read(pfd[0], &ev, sizeof(ev)), (ssize_t)sizeof(ev));
        evictions += ev;
    }
    close(pfd[0]);
    int entries;
    unsigned long long bytes = cache_bytes(&entries);
    cr_assert_leq(bytes, limit, "the tier holds %llu bytes over its limit %llu", bytes, limit);
    cr_assert_eq(tally_cache().parts, 0);
    cr_assert_eq(evictions, 16 - (unsigned long long)entries, "%llu evictions, %d entries left",
                 evictions, entries);
    cr_assert_geq(entries, 4);
    for (int i = 0; i < 16; i++)
        free(d[i]);
}

/* An entry gone (evicted, cleared) whose key's lock file still says
 * "published" from the last download, while a new downloader holds the lock
 * but has not written its record yet (it is reserving space: a scan of a full
 * cache, evictions). Another process waiting on the object keeps waiting for
 * it, rather than looping through lookups until "cache lookups do not
 * settle" fails its read, and takes over when the lock is let go. */
Test(cache, a_stale_published_record_under_a_live_lock_is_waited_on)
{
    unsigned char *d = mock_and_cache("stale.tar", 300 * 1024, 78, 256 * 1024, 4);
    size_t n = 300 * 1024;
    cr_assert_eq(read_through("stale.tar", d, n), SF_CACHE_FROM_FETCH);
    char entry[1400], lock[1400];
    only_entry(entry, sizeof(entry));
    cr_assert(unlink(entry) == 0);
    /* <kh>.lock beside <kh>-<eh>.sf */
    snprintf(lock, sizeof(lock), "%s", entry);
    char *dash = strrchr(lock, '-');
    cr_assert(dash);
    snprintf(dash, sizeof(lock) - (size_t)(dash - lock), ".lock");
    int lfd = open(lock, O_RDWR | O_CLOEXEC);
    cr_assert(lfd >= 0, "%s", lock);
    cr_assert(flock(lfd, LOCK_EX) == 0);
    struct sf_cache_object *o = open_through("stale.tar");
    struct sf_cache_object_progress p;
    sf_status st = sf_cache_object_wait(o, n, 300, &p);
    cr_assert_eq(st, SF_ERR_TIMEOUT, "%s: %s", sf_status_name(st), sf_cache_object_errmsg(o));
    close(lfd); /* the other downloader went away without a record */
    wait_whole(o, d, n, &p);
    sf_cache_object_close(o);
    free(d);
}
