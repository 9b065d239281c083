/*
 * Downloads into the disk tier (docs/cache.md, "Publishing and sharing
 * between processes", "Checksums as the bytes arrive"): becoming the one
 * downloader of a key (sf__dc_begin), the progress record in <kh>.lock that
 * other processes read to follow it, the XXH3-64 of each 4 MiB block computed
 * as the bytes land (sf__dc_writer_feed), and the atomic publish.
 */
#include "cache/disk_cache_internal.h"
#include "cache/fdlock.h"
#include "common/endian.h"
#include "common/file.h"
#include "common/io.h"
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
#include <unistd.h>
#include <xxhash.h>
#ifdef SF_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h> /* AVX2 XXH3 at run time (see disk_entry.c) */
#endif

#define RECORD_BYTES  256
#define FEED_GAPS     8 /* written-ahead runs tracked per block */
#define SCRATCH_BYTES (256u * 1024)

static const char RECORD_MAGIC[8] = {'S', 'F', 'L', 'O', 'C', 'K', '0', '1'};

/* One 4 MiB block of a download, hashed as its bytes arrive. */
enum feed_state { FB_OPEN = 0, FB_DONE, FB_FILE /* hashed from the file at publish */ };
struct feed_run {
    uint32_t lo, hi; /* block-relative bytes written but not hashed yet */
};
struct feed_block {
    XXH3_state_t *st;     /* while partly hashed */
    struct feed_run *run; /* FEED_GAPS entries, while some bytes wait */
    uint64_t digest;      /* FB_DONE */
    uint32_t hashed;      /* bytes [0, hashed) of the block are in st */
    uint8_t state;        /* enum feed_state */
    uint8_t n_run;
};

struct sf__dc_writer {
    struct sf__disk_cache *dc;
    char kh[65];
    char endpoint[512], bucket[256], key[1024];
    char etag[SF__DC_ETAG_MAX];
    uint64_t size, resume, reserved;
    int fd;      /* the .part file */
    int lock_fd; /* flock()ed <kh>.lock */
    /* In-stream checksums (sf__dc_writer_feed; the feeding thread only
     * while the download runs). fb is NULL when it could not be allocated:
     * every block is then hashed from the file. */
    struct feed_block *fb;
    size_t n_fb;
    unsigned char *scratch; /* catch-up reads */
    uint64_t catch_up_bytes;
};

/* ------------------------------------------------------------ progress records */

static void record_encode(const struct sf__dc_record *r, unsigned char *b)
{
    memset(b, 0, RECORD_BYTES);
    memcpy(b, RECORD_MAGIC, 8);
    sf__put_le32(b + 8, SF__DC_FORMAT_VERSION);
    sf__put_le32(b + 12, r->state);
    sf__put_le64(b + 16, r->size);
    sf__put_le64(b + 24, r->contiguous);
    sf__put_le64(b + 32, r->pid);
    snprintf((char *)b + 40, SF__DC_ETAG_MAX, "%s", r->etag);
    sf__put_le64(b + RECORD_BYTES - 8, XXH3_64bits(b, RECORD_BYTES - 8));
}

static int record_read(int fd, struct sf__dc_record *r)
{
    unsigned char b[RECORD_BYTES];
    /* The writer rewrites the record in place; a torn read fails the check. */
    for (int attempt = 0; attempt < 5; attempt++) {
        if (pread(fd, b, sizeof(b), 0) != (ssize_t)sizeof(b))
            return -1;
        if (memcmp(b, RECORD_MAGIC, 8) != 0 || sf__get_le32(b + 8) != SF__DC_FORMAT_VERSION)
            return -1;
        if (XXH3_64bits(b, RECORD_BYTES - 8) != sf__get_le64(b + RECORD_BYTES - 8))
            continue;
        memset(r, 0, sizeof(*r));
        r->state = sf__get_le32(b + 12);
        r->size = sf__get_le64(b + 16);
        r->contiguous = sf__get_le64(b + 24);
        r->pid = sf__get_le64(b + 32);
        memcpy(r->etag, b + 40, SF__DC_ETAG_MAX);
        r->etag[SF__DC_ETAG_MAX - 1] = 0;
        return 0;
    }
    return -1;
}

static void record_write(int fd, const struct sf__dc_record *r)
{
    unsigned char b[RECORD_BYTES];
    record_encode(r, b);
    if (pwrite(fd, b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
        /* Followers then see a stale record and keep polling or take over. */
    }
}

sf_status sf__dc_peek(struct sf__disk_cache *dc, const struct sf__cache_id *id,
                      struct sf__dc_record *rec, int *owner_alive)
{
    char kh[65], path[PATH_MAX];
    sf__dc_key_hash(id, kh);
    *owner_alive = 0;
    if (sf__dc_file_path(dc, kh, ".lock", path, sizeof(path)) != 0)
        return SF_ERR_LIMIT;
    int fd = sf__fdlock_open(path, O_RDONLY, 0);
    if (fd < 0)
        return SF_ERR_NOT_FOUND;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0)
        *owner_alive = errno == EWOULDBLOCK;
    int r = record_read(fd, rec);
    sf__fdlock_close(fd);
    return r == 0 ? SF_OK : SF_ERR_NOT_FOUND;
}

int sf__dc_open_part(struct sf__disk_cache *dc, const struct sf__cache_id *id)
{
    char kh[65], path[PATH_MAX];
    sf__dc_key_hash(id, kh);
    if (sf__dc_file_path(dc, kh, ".part", path, sizeof(path)) != 0)
        return -1;
    return open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
}

/* ------------------------------------------------------------ downloading */

static uint64_t meta_reserve(uint64_t size)
{
    /* JSON text per block ("0123456789abcdef", = 19 bytes) plus fixed fields. */
    return 8192 + (uint64_t)sf__dc_n_blocks(size) * 20 + SF__DC_TRAILER_BYTES;
}

uint64_t sf__dc_entry_reserve(uint64_t size)
{
    return size + meta_reserve(size);
}

sf_status sf__dc_begin(struct sf__disk_cache *dc, const struct sf__cache_id *id, const char *etag,
                       uint64_t size, enum sf__dc_begin_result *result, struct sf__dc_writer **out,
                       char *err, size_t err_len)
{
    *out = NULL;
    *result = SF__DC_BUSY;
    if (!etag || !etag[0] || strlen(etag) >= SF__DC_ETAG_MAX)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "caching %s needs the object's ETag (got none or one too long)",
                        id->key ? id->key : "");
    struct sf__dc_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return SF_ERR_NO_MEMORY;
    w->dc = dc;
    w->fd = w->lock_fd = -1;
    sf__dc_key_hash(id, w->kh);
    snprintf(w->endpoint, sizeof(w->endpoint), "%s", id->endpoint ? id->endpoint : "");
    snprintf(w->bucket, sizeof(w->bucket), "%s", id->bucket ? id->bucket : "");
    snprintf(w->key, sizeof(w->key), "%s", id->key ? id->key : "");
    snprintf(w->etag, sizeof(w->etag), "%s", etag);
    w->size = size;
    w->n_fb = sf__dc_n_blocks(size);
    w->fb = w->n_fb ? calloc(w->n_fb, sizeof(*w->fb)) : NULL; /* NULL: hash at publish */

    char sub[PATH_MAX], lock_path[PATH_MAX], part_path[PATH_MAX];
    sf_status st = SF_OK;
    if (sf__dc_sub_path(dc, w->kh, sub, sizeof(sub)) ||
        sf__dc_file_path(dc, w->kh, ".lock", lock_path, sizeof(lock_path)) ||
        sf__dc_file_path(dc, w->kh, ".part", part_path, sizeof(part_path))) {
        st = sf__fail(err, err_len, SF_ERR_LIMIT, "cache path too long");
        goto fail;
    }
    if (sf__dc_mkdir_sub(sub) != 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "cannot create %s: %s", sub, strerror(errno));
        goto fail;
    }
    w->lock_fd = sf__fdlock_open(lock_path, O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
    if (w->lock_fd < 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "cannot open %s: %s", lock_path, strerror(errno));
        goto fail;
    }
    if (flock(w->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) {
            st =
                sf__fail(err, err_len, SF_ERR_IO, "cannot lock %s: %s", lock_path, strerror(errno));
            goto fail;
        }
        *result = SF__DC_BUSY;
        goto none;
    }
    /* Someone may have published it between our lookup and the lock. */
    {
        int efd;
        struct sf__dc_meta m;
        char e2[256];
        uint64_t hits = dc->n.hits, misses = dc->n.misses; /* the caller counted its lookup */
        sf_status lst =
            sf__dc_lookup_kh(dc, id, w->kh, etag, SF__DC_NO_TOUCH, &efd, &m, e2, sizeof(e2));
        dc->n.hits = hits;
        dc->n.misses = misses;
        if (lst == SF_OK) {
            close(efd);
            sf__dc_meta_clear(&m);
            *result = SF__DC_PUBLISHED;
            goto none;
        }
    }
    struct sf__dc_record rec;
    struct stat pst;
    if (record_read(w->lock_fd, &rec) != 0)
        memset(&rec, 0, sizeof(rec)); /* none yet, or unreadable: nothing claimed */
    if (rec.state == SF__DC_ST_DOWNLOADING && rec.size == size && !strcmp(rec.etag, etag) &&
        rec.contiguous <= size && lstat(part_path, &pst) == 0 && S_ISREG(pst.st_mode) &&
        (uint64_t)pst.st_size == size)
        w->resume = rec.contiguous;
    if (!w->resume && rec.state != SF__DC_ST_IDLE) {
        /* An earlier downloader's record would go on claiming its bytes
         * while the .part below is replaced by a new, empty one: a follower
         * opening that file in the meantime read zeros as the object. The
         * record says "nothing yet" before the file changes. */
        memset(&rec, 0, sizeof(rec));
        record_write(w->lock_fd, &rec);
    }

    int lk = sf__dc_evict_lock(dc);
    if (lk < 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "cannot lock %s/evict.lock: %s", dc->root,
                      strerror(errno));
        goto fail;
    }
    w->reserved = sf__dc_entry_reserve(size);
    uint64_t need = w->resume ? meta_reserve(size) : w->reserved;
    st = sf__dc_make_room(dc, need, w->kh, err, err_len);
    if (st == SF_OK) {
        w->fd = open(part_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        /* Leftover bytes not resumed are dropped by starting a new file,
         * never by truncating that one: a process that followed the old
         * download may still have it mapped, and would fault (SIGBUS)
         * reading past a shorter end, or read zeros. A new (empty) file is
         * not truncated either: on ext4 a truncate to 0 arms auto_da_alloc,
         * and the last close of the entry then starts writeback of all its
         * pages on the closing thread (CPU taken from the decoders,
         * docs/cache.md). The blocks are reserved (sf__preallocate): a full
         * disk fails here rather than halfway. */
        struct stat fst;
        if (w->fd >= 0 && !w->resume && fstat(w->fd, &fst) == 0 && fst.st_size != 0) {
            close(w->fd);
            w->fd = unlink(part_path) == 0 || errno == ENOENT
                        ? open(part_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)
                        : -1;
        }
        if (w->fd < 0 || fstat(w->fd, &fst) != 0 || ftruncate(w->fd, (off_t)size) != 0 ||
            sf__preallocate(w->fd, size) != 0) {
            st = sf__fail(err, err_len, SF_ERR_IO, "cannot create %s: %s", part_path,
                          strerror(errno));
            /* Give the reservation back (evict.lock is still held here). */
            sf__dc_unreserve_locked(dc, need);
        } else {
            fchmod(w->fd, 0600);
        }
    }
    sf__dc_evict_unlock(lk);
    if (st != SF_OK)
        goto fail;
    if (w->resume)
        dc->n.resumed++;
    memset(&rec, 0, sizeof(rec));
    rec.state = SF__DC_ST_DOWNLOADING;
    rec.size = size;
    rec.contiguous = w->resume;
    rec.pid = (uint64_t)getpid();
    snprintf(rec.etag, sizeof(rec.etag), "%s", etag);
    record_write(w->lock_fd, &rec);
    *result = SF__DC_OWNER;
    *out = w;
    return SF_OK;
none:
    sf__fdlock_close(w->lock_fd);
    free(w->fb);
    free(w);
    return SF_OK;
fail:
    if (w->fd >= 0)
        close(w->fd);
    sf__fdlock_close(w->lock_fd);
    free(w->fb);
    free(w);
    return st;
}

int sf__dc_writer_fd(const struct sf__dc_writer *w)
{
    return w->fd;
}

uint64_t sf__dc_writer_resume(const struct sf__dc_writer *w)
{
    return w->resume;
}

void sf__dc_writer_progress(struct sf__dc_writer *w, uint64_t contiguous)
{
    struct sf__dc_record rec;
    memset(&rec, 0, sizeof(rec));
    rec.state = SF__DC_ST_DOWNLOADING;
    rec.size = w->size;
    rec.contiguous = contiguous;
    rec.pid = (uint64_t)getpid();
    snprintf(rec.etag, sizeof(rec.etag), "%s", w->etag);
    record_write(w->lock_fd, &rec);
}

/* ------------------------------------------------------------ in-stream checksums */

static uint32_t block_len(const struct sf__dc_writer *w, size_t b)
{
    uint64_t off = (uint64_t)b * SF__DC_BLOCK_BYTES;
    return (uint32_t)(w->size - off < SF__DC_BLOCK_BYTES ? w->size - off : SF__DC_BLOCK_BYTES);
}

static void fb_release(struct feed_block *fb)
{
    if (fb->st)
        XXH3_freeState(fb->st);
    fb->st = NULL;
    free(fb->run);
    fb->run = NULL;
    fb->n_run = 0;
}

/* Gives up on hashing the block in-stream: publish reads it from the file. */
static void fb_to_file(struct feed_block *fb)
{
    fb_release(fb);
    fb->state = FB_FILE;
}

static void fb_finish(struct sf__dc_writer *w, size_t b)
{
    struct feed_block *fb = &w->fb[b];
    if (fb->hashed != block_len(w, b))
        return;
    fb->digest = XXH3_64bits_digest(fb->st);
    fb_release(fb);
    fb->state = FB_DONE;
}

/* Hashes bytes [lo, hi) of block b from the file: they were written ahead
 * of a gap that is now filled. */
static int fb_hash_file(struct sf__dc_writer *w, size_t b, uint32_t lo, uint32_t hi)
{
    if (!w->scratch && !(w->scratch = malloc(SCRATCH_BYTES)))
        return -1;
    uint64_t base = (uint64_t)b * SF__DC_BLOCK_BYTES;
    while (lo < hi) {
        size_t want = hi - lo < SCRATCH_BYTES ? hi - lo : SCRATCH_BYTES;
        ssize_t r = pread(w->fd, w->scratch, want, (off_t)(base + lo));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        XXH3_64bits_update(w->fb[b].st, w->scratch, (size_t)r);
        lo += (uint32_t)r;
        w->catch_up_bytes += (uint64_t)r;
    }
    return 0;
}

static void fb_feed(struct sf__dc_writer *w, size_t b, uint32_t rel, const unsigned char *p,
                    uint32_t k)
{
    struct feed_block *fb = &w->fb[b];
    if (fb->state == FB_FILE)
        return;
    /* Bytes given twice may differ on disk from what was hashed. */
    if (fb->state == FB_DONE || rel < fb->hashed) {
        fb_to_file(fb);
        return;
    }
    for (unsigned i = 0; i < fb->n_run; i++) {
        if (rel < fb->run[i].hi && fb->run[i].lo < rel + k) {
            fb_to_file(fb);
            return;
        }
    }
    if (rel > fb->hashed) {
        /* Ahead of a gap: the bytes wait in the file. */
        for (unsigned i = 0; i < fb->n_run; i++) {
            if (fb->run[i].hi == rel) {
                fb->run[i].hi = rel + k;
                return;
            }
        }
        if (!fb->run && !(fb->run = malloc(FEED_GAPS * sizeof(*fb->run)))) {
            fb_to_file(fb);
            return;
        }
        if (fb->n_run == FEED_GAPS) {
            fb_to_file(fb);
            return;
        }
        fb->run[fb->n_run].lo = rel;
        fb->run[fb->n_run].hi = rel + k;
        fb->n_run++;
        return;
    }
    if (rel == 0 && k == block_len(w, b)) { /* the whole block at once */
        fb->digest = XXH3_64bits(p, k);
        fb->hashed = k;
        fb->state = FB_DONE;
        return;
    }
    if (!fb->st) {
        fb->st = XXH3_createState();
        if (!fb->st || XXH3_64bits_reset(fb->st) != XXH_OK) {
            fb_to_file(fb);
            return;
        }
    }
    XXH3_64bits_update(fb->st, p, k);
    fb->hashed += k;
    /* Runs that were waiting on this gap follow from the file. */
    for (unsigned i = 0; i < fb->n_run;) {
        if (fb->run[i].lo != fb->hashed) {
            i++;
            continue;
        }
        uint32_t lo = fb->run[i].lo, hi = fb->run[i].hi;
        fb->run[i] = fb->run[--fb->n_run];
        if (fb_hash_file(w, b, lo, hi) != 0) {
            fb_to_file(fb);
            return;
        }
        fb->hashed = hi;
        i = 0;
    }
    fb_finish(w, b);
}

void sf__dc_writer_feed(struct sf__dc_writer *w, uint64_t offset, const void *data, size_t n)
{
    if (!w->fb)
        return;
    const unsigned char *p = data;
    while (n > 0 && offset < w->size) {
        size_t b = (size_t)(offset / SF__DC_BLOCK_BYTES);
        uint32_t rel = (uint32_t)(offset - (uint64_t)b * SF__DC_BLOCK_BYTES);
        uint32_t room = block_len(w, b) - rel;
        uint32_t k = n < room ? (uint32_t)n : room;
        fb_feed(w, b, rel, p, k);
        offset += k;
        p += k;
        n -= k;
    }
}

/* Hashes block b of the file (publish, for blocks not hashed in-stream),
 * with pread through the writer's scratch buffer: not through a mapping,
 * which would fault (SIGBUS) if another program cut the file short now. */
static sf_status hash_block_fd(struct sf__dc_writer *w, size_t b, uint64_t *out, char *err,
                               size_t err_len)
{
    uint64_t off = (uint64_t)b * SF__DC_BLOCK_BYTES;
    size_t n = (size_t)(w->size - off < SF__DC_BLOCK_BYTES ? w->size - off : SF__DC_BLOCK_BYTES);
    XXH3_state_t *s = XXH3_createState();
    if (!s || (!w->scratch && !(w->scratch = malloc(SCRATCH_BYTES)))) {
        XXH3_freeState(s);
        return SF_ERR_NO_MEMORY;
    }
    XXH3_64bits_reset(s);
    sf_status st = SF_OK;
    for (size_t done = 0; st == SF_OK && done < n; done += SCRATCH_BYTES) {
        size_t k = n - done < SCRATCH_BYTES ? n - done : SCRATCH_BYTES;
        st = sf__dc_pread_full(w->fd, w->scratch, k, off + done, err, err_len);
        if (st == SF_OK)
            XXH3_64bits_update(s, w->scratch, k);
    }
    if (st == SF_OK)
        *out = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return st;
}

static void writer_free(struct sf__dc_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    sf__fdlock_close(w->lock_fd); /* drops the key lock */
    for (size_t i = 0; w->fb && i < w->n_fb; i++)
        fb_release(&w->fb[i]);
    free(w->fb);
    free(w->scratch);
    free(w);
}

void sf__dc_writer_abort(struct sf__dc_writer *w, int keep_part)
{
    if (!w)
        return;
    if (!keep_part) {
        char path[PATH_MAX];
        struct stat st;
        if (sf__dc_file_path(w->dc, w->kh, ".part", path, sizeof(path)) == 0 &&
            fstat(w->fd, &st) == 0) {
            int64_t f = sf__dc_unlink_same(path, &st);
            if (f)
                sf__dc_usage_add(w->dc, -(int64_t)w->reserved);
        }
        struct sf__dc_record rec;
        memset(&rec, 0, sizeof(rec));
        rec.state = SF__DC_ST_IDLE;
        record_write(w->lock_fd, &rec);
    }
    writer_free(w);
}

/* Removes every other ETag of the key once a new one is published. */
static void remove_other_versions(struct sf__disk_cache *dc, const char *kh, const char *keep)
{
    char sub[PATH_MAX];
    if (sf__dc_sub_path(dc, kh, sub, sizeof(sub)) != 0)
        return;
    DIR *d = opendir(sub);
    if (!d)
        return;
    struct dirent *de;
    int64_t freed = 0;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l != 64 + 1 + 32 + 3 || strncmp(de->d_name, kh, 64) ||
            strcmp(de->d_name + l - 3, SF__DC_ENTRY_SUFFIX))
            continue;
        char rel[SF__DC_NAME_MAX];
        if (snprintf(rel, sizeof(rel), "%.2s/%s", kh, de->d_name) >= (int)sizeof(rel))
            continue;
        if (!strcmp(rel, keep))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            unlinkat(dirfd(d), de->d_name, 0) == 0)
            freed += st.st_size;
    }
    closedir(d);
    if (freed)
        sf__dc_usage_add(dc, -freed);
}

sf_status sf__dc_writer_publish(struct sf__dc_writer *w, const char *url,
                                struct sf__dc_meta *meta_out, char *err, size_t err_len)
{
    struct sf__disk_cache *dc = w->dc;
    size_t nb = sf__dc_n_blocks(w->size);
    uint64_t *blocks = nb ? malloc(nb * sizeof(uint64_t)) : NULL;
    char *mj = NULL;
    sf_status st = SF_OK;
    if (nb && !blocks) {
        st = SF_ERR_NO_MEMORY;
        goto fail;
    }
    /* Blocks hashed as they arrived need no read back; the others (a
     * resumed prefix, bytes written twice, no observer) are read now. */
    char why[256];
    uint64_t from_file = 0;
    for (size_t i = 0; i < nb; i++) {
        if (w->fb && w->fb[i].state == FB_DONE) {
            blocks[i] = w->fb[i].digest;
            continue;
        }
        st = hash_block_fd(w, i, &blocks[i], why, sizeof(why));
        if (st != SF_OK) {
            st = sf__fail(err, err_len, st, "cannot read back %s for its checksum: %s", url, why);
            goto fail;
        }
        from_file++;
    }
    int64_t created = sf__dc_now_unix();
    const struct sf__cache_id id = {w->endpoint, w->bucket, w->key};
    unsigned char t[SF__DC_TRAILER_BYTES];
    st = sf__dc_entry_encode(&id, w->etag, url, w->size, created, blocks, nb, &mj, t);
    if (st != SF_OK)
        goto fail;
    size_t ml = strlen(mj);
    if (sf__pwrite_full(w->fd, mj, ml, w->size, NULL) != 0 ||
        sf__pwrite_full(w->fd, t, sizeof(t), w->size + ml, NULL) != 0 ||
        ftruncate(w->fd, (off_t)(w->size + ml + sizeof(t))) != 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "cannot write the cache entry for %s: %s", url,
                      strerror(errno));
        goto fail;
    }
    if (dc->o.fsync && fsync(w->fd) != 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "fsync of the cache entry for %s: %s", url,
                      strerror(errno));
        goto fail;
    }
    char name[SF__DC_NAME_MAX], part[PATH_MAX], final[PATH_MAX];
    sf__dc_entry_name(w->kh, w->etag, name, sizeof(name));
    sf__dc_file_path(dc, w->kh, ".part", part, sizeof(part));
    snprintf(final, sizeof(final), "%s/%s", dc->root, name);
    if (rename(part, final) != 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "cannot publish %s as %s: %s", url, final,
                      strerror(errno));
        goto fail;
    }
    if (dc->o.fsync) {
        char sub[PATH_MAX];
        sf__dc_sub_path(dc, w->kh, sub, sizeof(sub));
        int dfd = open(sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    int64_t delta = (int64_t)(w->size + ml + sizeof(t)) - (int64_t)w->reserved;
    if (delta)
        sf__dc_usage_add(dc, delta);
    remove_other_versions(dc, w->kh, name);
    struct sf__dc_record rec;
    memset(&rec, 0, sizeof(rec));
    rec.state = SF__DC_ST_PUBLISHED;
    rec.size = rec.contiguous = w->size;
    rec.pid = (uint64_t)getpid();
    snprintf(rec.etag, sizeof(rec.etag), "%s", w->etag);
    record_write(w->lock_fd, &rec);
    dc->n.published++;
    dc->n.file_hashed_blocks += from_file;
    dc->n.stream_hashed_blocks += nb - from_file;
    dc->n.catch_up_bytes += w->catch_up_bytes;
    if (meta_out) {
        memset(meta_out, 0, sizeof(*meta_out));
        meta_out->size = w->size;
        meta_out->checksum = sf__get_le64(t + 24);
        meta_out->created = meta_out->last_used = created;
        snprintf(meta_out->etag, sizeof(meta_out->etag), "%s", w->etag);
        snprintf(meta_out->url, sizeof(meta_out->url), "%s", url);
        snprintf(meta_out->name, sizeof(meta_out->name), "%s", name);
        meta_out->blocks = blocks;
        meta_out->n_blocks = nb;
        blocks = NULL;
    }
    free(blocks);
    free(mj);
    writer_free(w);
    return SF_OK;
fail:
    free(blocks);
    free(mj);
    sf__dc_writer_abort(w, 0);
    return st;
}
