/*
 * The disk tier's space (docs/cache.md, "Eviction and the limit"): the byte
 * count in <root>/usage, changed only under evict.lock; scans of the
 * directory; reserving room for a download by evicting the least recently
 * used entries and sweeping abandoned downloads; and the commands that walk
 * the whole tier: listing, removal, usage and clearing.
 */
#include "cache/disk_cache_internal.h"
#include "cache/fdlock.h"
#include "common/endian.h"
#include "common/grow.h"
#include "common/strbuf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#ifdef SF_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h> /* AVX2 XXH3 at run time (see disk_entry.c) */
#endif

/* ------------------------------------------------------------ usage accounting */

/* The tier's byte count lives in <root>/usage, changed only under evict.lock. */
int sf__dc_evict_lock(struct sf__disk_cache *dc)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/evict.lock", dc->root);
    int fd = sf__fdlock_open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return -1;
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            sf__fdlock_close(fd);
            return -1;
        }
    }
    return fd;
}

void sf__dc_evict_unlock(int fd)
{
    sf__fdlock_close(fd); /* drops the flock */
}

/* Returns the stored count, or UINT64_MAX when unknown (missing, unreadable). */
static uint64_t usage_read(struct sf__disk_cache *dc)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/usage", dc->root);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return UINT64_MAX;
    unsigned char b[16];
    ssize_t r = pread(fd, b, sizeof(b), 0);
    close(fd);
    if (r != (ssize_t)sizeof(b) || XXH3_64bits(b, 8) != sf__get_le64(b + 8))
        return UINT64_MAX;
    return sf__get_le64(b);
}

static void usage_write(struct sf__disk_cache *dc, uint64_t v)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/usage", dc->root);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    unsigned char b[16];
    sf__put_le64(b, v);
    sf__put_le64(b + 8, XXH3_64bits(b, 8));
    if (pwrite(fd, b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
        /* A torn count fails its checksum and forces a rescan. */
    }
    close(fd);
}

/* Adds delta (may be negative) to the stored count; unknown stays unknown. */
void sf__dc_usage_add(struct sf__disk_cache *dc, int64_t delta)
{
    int lk = sf__dc_evict_lock(dc);
    if (lk < 0)
        return;
    uint64_t u = usage_read(dc);
    if (u != UINT64_MAX) {
        if (delta < 0 && (uint64_t)-delta > u)
            u = 0;
        else
            u += (uint64_t)delta;
        usage_write(dc, u);
    }
    sf__dc_evict_unlock(lk);
}

/* Deletes path when it is still the file we looked at; returns its size. */
int64_t sf__dc_unlink_same(const char *path, const struct stat *seen)
{
    struct stat now;
    if (lstat(path, &now) != 0 || now.st_ino != seen->st_ino || now.st_dev != seen->st_dev)
        return 0;
    if (unlink(path) != 0)
        return 0;
    return (int64_t)now.st_size;
}

/* ------------------------------------------------------------ scanning and eviction */

struct scan_item {
    char path[PATH_MAX];
    char kh[65];
    int is_part;
    uint64_t size;
    time_t mtime;
    long mtime_ns;
    struct stat st;
};

struct scan {
    struct scan_item *v;
    size_t n, cap;
};

static int scan_push(struct scan *s, const struct scan_item *it)
{
    struct scan_item *v = sf__grow(s->v, s->n, &s->cap, sizeof(*v), 256);
    if (!v)
        return -1;
    s->v = v;
    s->v[s->n++] = *it;
    return 0;
}

/* Every entry and part file under root. A folder that cannot be read (no
 * descriptor left, no memory) fails the scan, naming it and why: its callers
 * write the usage count, evict or clear from what the scan found, and a
 * part of the cache taken for all of it would be a count below what the
 * disk holds (then more than cache_limit) or a clear that said it was
 * done. A key folder removed meanwhile holds nothing. */
static sf_status scan_all(struct sf__disk_cache *dc, struct scan *s, char *err, size_t err_len)
{
    DIR *top = opendir(dc->root);
    if (!top && errno == ENOENT) /* removed with everything in it (rm -rf): nothing */
        return SF_OK;
    if (!top)
        return sf__fail(err, err_len, SF_ERR_IO, "cannot scan the cache directory %s: %s", dc->root,
                        strerror(errno));
    struct dirent *de;
    char sub[PATH_MAX];
    for (;;) {
        errno = 0;
        if ((de = readdir(top)) == NULL)
            break;
        if (strlen(de->d_name) != 2 || sf__dc_hexval(de->d_name[0]) < 0 ||
            sf__dc_hexval(de->d_name[1]) < 0)
            continue;
        if (snprintf(sub, sizeof(sub), "%s/%s", dc->root, de->d_name) >= (int)sizeof(sub))
            continue;
        DIR *d = opendir(sub);
        if (!d && errno == ENOENT)
            continue;
        if (!d)
            goto fail;
        struct dirent *e;
        for (;;) {
            errno = 0;
            if ((e = readdir(d)) == NULL)
                break;
            size_t l = strlen(e->d_name);
            struct scan_item it;
            memset(&it, 0, sizeof(it));
            if (l == 64 + 5 && !strcmp(e->d_name + 64, ".part"))
                it.is_part = 1;
            else if (!(l == 64 + 1 + 32 + 3 && !strcmp(e->d_name + l - 3, SF__DC_ENTRY_SUFFIX)))
                continue;
            if (fstatat(dirfd(d), e->d_name, &it.st, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(it.st.st_mode))
                continue;
            if (snprintf(it.path, sizeof(it.path), "%s/%s", sub, e->d_name) >= (int)sizeof(it.path))
                continue;
            memcpy(it.kh, e->d_name, 64);
            it.kh[64] = 0;
            it.size = (uint64_t)it.st.st_size;
            it.mtime = it.st.st_mtim.tv_sec;
            it.mtime_ns = it.st.st_mtim.tv_nsec;
            if (scan_push(s, &it) != 0) {
                closedir(d);
                closedir(top);
                return sf__fail(err, err_len, SF_ERR_NO_MEMORY,
                                "cannot scan the cache directory %s: out of memory", dc->root);
            }
        }
        int e_read = errno;
        closedir(d);
        if (e_read) {
            errno = e_read;
            goto fail;
        }
    }
    if (errno) {
        snprintf(sub, sizeof(sub), "%s", dc->root);
        goto fail;
    }
    closedir(top);
    return SF_OK;
fail:;
    int e = errno;
    closedir(top);
    return sf__fail(err, err_len, SF_ERR_IO, "cannot scan the cache directory %s: %s", sub,
                    strerror(e));
}

static int by_mtime(const void *a, const void *b)
{
    const struct scan_item *x = a, *y = b;
    if (x->mtime != y->mtime)
        return (x->mtime > y->mtime) - (x->mtime < y->mtime);
    return (x->mtime_ns > y->mtime_ns) - (x->mtime_ns < y->mtime_ns);
}

/* Eviction order: downloads first (only abandoned ones can go: their lock is
 * free), then entries, each least recently used first (docs/cache.md). */
static int eviction_order(const void *a, const void *b)
{
    const struct scan_item *x = a, *y = b;
    if (x->is_part != y->is_part)
        return y->is_part - x->is_part;
    return by_mtime(a, b);
}

/* Locks the key of a part file without waiting; -1 when its owner is alive. */
static int try_key_lock(struct sf__disk_cache *dc, const char *kh)
{
    char path[PATH_MAX];
    if (sf__dc_file_path(dc, kh, ".lock", path, sizeof(path)) != 0)
        return -1;
    int fd = sf__fdlock_open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        sf__fdlock_close(fd);
        return -1;
    }
    return fd;
}

/* Deletes an item; parts only when no process is downloading them. */
static int64_t remove_item(struct sf__disk_cache *dc, const struct scan_item *it,
                           const char *own_kh)
{
    if (!it->is_part)
        return sf__dc_unlink_same(it->path, &it->st);
    if (own_kh && !strcmp(it->kh, own_kh))
        return 0;
    int lk = try_key_lock(dc, it->kh);
    if (lk < 0)
        return 0;
    int64_t n = sf__dc_unlink_same(it->path, &it->st);
    sf__fdlock_close(lk);
    return n;
}

/*
 * Under evict.lock: makes room for `need` bytes (own_kh's part excluded from
 * the count: it is being replaced). Returns SF_OK with the new usage written.
 */
sf_status sf__dc_make_room(struct sf__disk_cache *dc, uint64_t need, const char *own_kh, char *err,
                           size_t err_len)
{
    /* Larger than the whole tier: evicting every entry would not help, so
     * none is evicted. */
    if (dc->o.limit_bytes && need > dc->o.limit_bytes)
        return sf__fail(err, err_len, SF_ERR_LIMIT,
                        "cache_limit %" PRIu64 " bytes cannot hold an entry of %" PRIu64
                        " bytes (the object and its checksums)",
                        dc->o.limit_bytes, need);
    uint64_t u = usage_read(dc);
    if (u != UINT64_MAX && (dc->o.limit_bytes == 0 || u + need <= dc->o.limit_bytes)) {
        usage_write(dc, u + need);
        return SF_OK;
    }
    /* Unknown or over the limit: count exactly, then evict oldest first. */
    struct scan s = {0};
    sf_status st = scan_all(dc, &s, err, err_len);
    if (st != SF_OK) {
        free(s.v);
        return st;
    }
    uint64_t total = 0, busy = 0;
    time_t now = time(NULL);
    for (size_t i = 0; i < s.n; i++) {
        if (s.v[i].is_part && own_kh && !strcmp(s.v[i].kh, own_kh)) {
            s.v[i].size = 0;
            continue;
        }
        /* Abandoned for a long time: sweep it whatever the limit. */
        if (s.v[i].is_part && now - s.v[i].mtime > (time_t)dc->o.stale_part_s) {
            int64_t f = remove_item(dc, &s.v[i], own_kh);
            if (f) {
                dc->n.swept++;
                s.v[i].size = 0;
                continue;
            }
        }
        total += s.v[i].size;
    }
    if (dc->o.limit_bytes && total + need > dc->o.limit_bytes) {
        if (s.n)
            qsort(s.v, s.n, sizeof(*s.v), eviction_order);
        for (size_t i = 0; i < s.n && total + need > dc->o.limit_bytes; i++) {
            if (!s.v[i].size)
                continue;
            int64_t f = remove_item(dc, &s.v[i], own_kh);
            if (f > 0) {
                total -= (uint64_t)f < total ? (uint64_t)f : total;
                if (s.v[i].is_part)
                    dc->n.swept++;
                else {
                    dc->n.evictions++;
                    dc->n.evicted_bytes += (uint64_t)f;
                }
            } else {
                busy += s.v[i].size;
            }
        }
    }
    free(s.v);
    if (dc->o.limit_bytes && total + need > dc->o.limit_bytes) {
        usage_write(dc, total);
        return sf__fail(err, err_len, SF_ERR_LIMIT,
                        "cache_limit %" PRIu64 " bytes cannot hold %" PRIu64 " more: %" PRIu64
                        " bytes are held by downloads in progress",
                        dc->o.limit_bytes, need, busy);
    }
    usage_write(dc, total + need);
    return SF_OK;
}

void sf__dc_unreserve_locked(struct sf__disk_cache *dc, uint64_t need)
{
    uint64_t u = usage_read(dc);
    if (u != UINT64_MAX)
        usage_write(dc, u > need ? u - need : 0);
}

/* ------------------------------------------------------------ listing, clearing */

sf_status sf__dc_foreach(struct sf__disk_cache *dc,
                         int (*fn)(void *user, const char *path, const struct sf__dc_meta *m,
                                   sf_status st, const char *why),
                         void *user, char *err, size_t err_len)
{
    struct scan s = {0};
    sf_status st = scan_all(dc, &s, err, err_len);
    if (st != SF_OK) {
        free(s.v);
        return st;
    }
    if (s.n)
        qsort(s.v, s.n, sizeof(*s.v), by_mtime);
    for (size_t i = 0; i < s.n; i++) {
        if (s.v[i].is_part)
            continue;
        struct sf__dc_meta m;
        memset(&m, 0, sizeof(m));
        char why[512] = "";
        int fd = open(s.v[i].path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        sf_status est =
            fd < 0 ? SF_ERR_IO : sf__dc_read_entry(fd, NULL, NULL, &m, why, sizeof(why));
        if (fd < 0)
            snprintf(why, sizeof(why), "cannot open: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        const char *rel = s.v[i].path + strlen(dc->root) + 1;
        snprintf(m.name, sizeof(m.name), "%s", rel);
        m.last_used = s.v[i].mtime;
        int stop = fn(user, s.v[i].path, &m, est, why);
        sf__dc_meta_clear(&m);
        if (stop)
            break;
    }
    free(s.v);
    return SF_OK;
}

sf_status sf__dc_remove(struct sf__disk_cache *dc, const char *name, const struct stat *checked)
{
    if (strstr(name, "..") || strlen(name) != 2 + 1 + 64 + 1 + 32 + 3)
        return SF_ERR_INVALID_ARGUMENT;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dc->root, name);
    struct stat st;
    if (lstat(path, &st) != 0)
        return SF_ERR_NOT_FOUND;
    if (checked && (st.st_ino != checked->st_ino || st.st_dev != checked->st_dev))
        return SF_ERR_NOT_FOUND;
    int64_t f = sf__dc_unlink_same(path, &st);
    if (f)
        sf__dc_usage_add(dc, -f);
    return f ? SF_OK : SF_ERR_IO;
}

sf_status sf__dc_usage(struct sf__disk_cache *dc, int sweep, struct sf__dc_usage *u, char *err,
                       size_t err_len)
{
    memset(u, 0, sizeof(*u));
    struct scan s = {0};
    sf_status st = scan_all(dc, &s, err, err_len);
    if (st != SF_OK) {
        free(s.v);
        return st;
    }
    time_t now = time(NULL);
    for (size_t i = 0; i < s.n; i++) {
        if (!s.v[i].is_part) {
            u->entries++;
            u->entry_bytes += s.v[i].size;
            continue;
        }
        int lk = try_key_lock(dc, s.v[i].kh);
        if (lk >= 0) {
            if (sweep && now - s.v[i].mtime > (time_t)dc->o.stale_part_s &&
                sf__dc_unlink_same(s.v[i].path, &s.v[i].st)) {
                dc->n.swept++;
                sf__fdlock_close(lk);
                continue;
            }
            sf__fdlock_close(lk);
            u->abandoned_parts++;
        }
        u->parts++;
        u->part_bytes += s.v[i].size;
    }
    free(s.v);
    if (sweep) {
        int lk = sf__dc_evict_lock(dc);
        if (lk >= 0) {
            usage_write(dc, u->entry_bytes + u->part_bytes);
            sf__dc_evict_unlock(lk);
        }
    }
    return SF_OK;
}

sf_status sf__dc_clear(struct sf__disk_cache *dc, uint64_t *removed, char *err, size_t err_len)
{
    *removed = 0;
    int lk = sf__dc_evict_lock(dc);
    if (lk < 0)
        return sf__fail(err, err_len, SF_ERR_IO, "cannot lock %s/evict.lock", dc->root);
    struct scan s = {0};
    sf_status st = scan_all(dc, &s, err, err_len);
    if (st != SF_OK) {
        free(s.v);
        sf__dc_evict_unlock(lk);
        return st;
    }
    uint64_t left = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (remove_item(dc, &s.v[i], NULL))
            (*removed)++;
        else
            left += s.v[i].size;
    }
    free(s.v);
    usage_write(dc, left);
    sf__dc_evict_unlock(lk);
    return SF_OK;
}
