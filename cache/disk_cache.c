/* Disk tier: verified entries, atomic publish, flock-coordinated downloads. */
#include "cache/disk_cache.h"
#include "cache/fdlock.h"
#include "common/endian.h"
#include "common/strbuf.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#ifdef SF_HAVE_XXH_DISPATCH
/* The same XXH3, with AVX2 picked at run time when the CPU has it: about 3x
 * the plain entry points of a libxxhash built for baseline x86-64 (checked
 * by CMake; the header maps the XXH3_* names onto them). */
#include <xxh_x86dispatch.h>
#endif

#define RECORD_BYTES   256
#define META_MAX_BYTES (64u << 20) /* 16M blocks of 4 MiB: a 64 TiB object */
#define ENTRY_SUFFIX   ".sf"
#define FEED_GAPS      8 /* written-ahead runs tracked per block */
#define SCRATCH_BYTES  (256u * 1024)

static const char TRAILER_MAGIC[8] = {'S', 'F', 'C', 'A', 'C', 'H', 'E', '1'};
static const char TRAILER_END[8] = {'S', 'F', 'C', 'E', 'N', 'D', '0', '1'};
static const char RECORD_MAGIC[8] = {'S', 'F', 'L', 'O', 'C', 'K', '0', '1'};

struct sf__disk_cache {
    struct sf__disk_cache_options o;
    char root[PATH_MAX - 128]; /* <dir>/v1 */
    struct sf__dc_counters n;
};

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

/* ------------------------------------------------------------ helpers */

static void sha256_hex(const void *data, size_t n, char *out, size_t hex_chars)
{
    unsigned char md[32];
    unsigned int md_len = 0;
    EVP_Digest(data, n, md, &md_len, EVP_sha256(), NULL);
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < hex_chars / 2 && i < 32; i++) {
        out[2 * i] = hx[md[i] >> 4];
        out[2 * i + 1] = hx[md[i] & 15];
    }
    out[hex_chars] = 0;
}

/* kh: SHA-256 over the version and the three identity strings, NUL-separated. */
static void key_hash(const struct sf__cache_id *id, char kh[65])
{
    char buf[4096];
    int n = snprintf(buf, sizeof(buf), "shardfeed-cache-v%d", SF__DC_FORMAT_VERSION);
    size_t len = (size_t)n + 1;
    const char *parts[3] = {id->endpoint ? id->endpoint : "", id->bucket ? id->bucket : "",
                            id->key ? id->key : ""};
    size_t need = len;
    for (int i = 0; i < 3; i++)
        need += strlen(parts[i]) + 1;
    char *p = need <= sizeof(buf) ? buf : malloc(need);
    if (!p) { /* cannot happen for sane keys; fall back to hashing a prefix */
        p = buf;
        need = sizeof(buf);
    }
    if (p != buf)
        memcpy(p, buf, len);
    for (int i = 0; i < 3 && len < need; i++) {
        size_t l = strlen(parts[i]);
        if (len + l + 1 > need)
            l = need - len - 1;
        memcpy(p + len, parts[i], l);
        len += l;
        p[len++] = 0;
    }
    sha256_hex(p, len, kh, 64);
    if (p != buf)
        free(p);
}

static void etag_hash(const char *etag, char eh[33])
{
    sha256_hex(etag, strlen(etag), eh, 32);
}

static int mkdir_0700(const char *path)
{
    if (mkdir(path, 0700) == 0 || errno == EEXIST)
        return 0;
    return -1;
}

static int mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
        return -1;
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir_0700(tmp) != 0)
                return -1;
            *p = '/';
        }
    }
    return mkdir_0700(tmp);
}

static int sub_path(const struct sf__disk_cache *dc, const char *kh, char *out, size_t n)
{
    return snprintf(out, n, "%s/%.2s", dc->root, kh) < (int)n ? 0 : -1;
}

static int file_path(const struct sf__disk_cache *dc, const char *kh, const char *suffix, char *out,
                     size_t n)
{
    return snprintf(out, n, "%s/%.2s/%s%s", dc->root, kh, kh, suffix) < (int)n ? 0 : -1;
}

static int64_t now_unix(void)
{
    return (int64_t)time(NULL);
}

/* ------------------------------------------------------------ open */

sf_status sf__dc_default_dir(char *out, size_t n)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') {
        if (snprintf(out, n, "%s/shardfeed", xdg) >= (int)n)
            return SF_ERR_LIMIT;
        return SF_OK;
    }
    const char *home = getenv("HOME");
    if (!home || !home[0])
        return SF_ERR_NOT_FOUND;
    if (snprintf(out, n, "%s/.cache/shardfeed", home) >= (int)n)
        return SF_ERR_LIMIT;
    return SF_OK;
}

sf_status sf__disk_cache_open(const struct sf__disk_cache_options *o, struct sf__disk_cache **out,
                              char *err, size_t err_len)
{
    *out = NULL;
    if (!o->dir || !o->dir[0])
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "cache_dir is empty");
    struct sf__disk_cache *dc = calloc(1, sizeof(*dc));
    if (!dc)
        return SF_ERR_NO_MEMORY;
    dc->o = *o;
    dc->o.dir = NULL;
    if (dc->o.stale_part_s == 0)
        dc->o.stale_part_s = 24 * 3600;
    if (snprintf(dc->root, sizeof(dc->root), "%s/v%d", o->dir, SF__DC_FORMAT_VERSION) >=
        (int)sizeof(dc->root)) {
        free(dc);
        return sf__fail(err, err_len, SF_ERR_LIMIT, "cache_dir '%s' is too long", o->dir);
    }
    if (mkdir_p(dc->root) != 0) {
        int e = errno;
        free(dc);
        return sf__fail(err, err_len, SF_ERR_IO, "cannot create cache directory '%s': %s", o->dir,
                    strerror(e));
    }
    struct stat st;
    if (stat(dc->root, &st) != 0 || !S_ISDIR(st.st_mode) || access(dc->root, W_OK | X_OK) != 0) {
        free(dc);
        return sf__fail(err, err_len, SF_ERR_IO, "cache directory '%s' is not a writable directory",
                    o->dir);
    }
    *out = dc;
    return SF_OK;
}

void sf__disk_cache_close(struct sf__disk_cache *dc)
{
    free(dc);
}

const char *sf__disk_cache_root(const struct sf__disk_cache *dc)
{
    return dc->root;
}

void sf__dc_counters(const struct sf__disk_cache *dc, struct sf__dc_counters *out)
{
    *out = dc->n;
}

void sf__dc_meta_clear(struct sf__dc_meta *meta)
{
    free(meta->blocks);
    meta->blocks = NULL;
    meta->n_blocks = 0;
}

/* ------------------------------------------------------------ usage accounting */

/* The tier's byte count lives in <root>/usage, changed only under evict.lock. */
static int evict_lock(struct sf__disk_cache *dc)
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

static void evict_unlock(int fd)
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
static void usage_add(struct sf__disk_cache *dc, int64_t delta)
{
    int lk = evict_lock(dc);
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
    evict_unlock(lk);
}

/* Deletes path when it is still the file we looked at; returns its size. */
static int64_t unlink_same(const char *path, const struct stat *seen)
{
    struct stat now;
    if (lstat(path, &now) != 0 || now.st_ino != seen->st_ino || now.st_dev != seen->st_dev)
        return 0;
    if (unlink(path) != 0)
        return 0;
    return (int64_t)now.st_size;
}

/* ------------------------------------------------------------ trailer + metadata */

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static uint64_t blocks_digest(const uint64_t *blocks, size_t n)
{
    XXH3_state_t *s = XXH3_createState();
    if (!s)
        return 0;
    XXH3_64bits_reset(s);
    for (size_t i = 0; i < n; i++) {
        unsigned char b[8];
        sf__put_le64(b, blocks[i]);
        XXH3_64bits_update(s, b, 8);
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

static size_t n_blocks_for(uint64_t size)
{
    return (size_t)((size + SF__DC_BLOCK_BYTES - 1) / SF__DC_BLOCK_BYTES);
}

static const char *json_str(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/*
 * Reads and checks the trailer and metadata of an open entry. why/offset say
 * what failed. Fills meta (blocks allocated).
 */
static sf_status read_entry(int fd, const struct sf__cache_id *id, const char *want_etag,
                            struct sf__dc_meta *meta, char *why, size_t why_len)
{
    memset(meta, 0, sizeof(*meta));
    struct stat st;
    if (fstat(fd, &st) != 0)
        return sf__fail(why, why_len, SF_ERR_IO, "fstat: %s", strerror(errno));
    uint64_t fsize = (uint64_t)st.st_size;
    if (fsize < SF__DC_TRAILER_BYTES)
        return sf__fail(why, why_len, SF_ERR_CORRUPT, "file of %" PRIu64 " bytes has no trailer",
                    fsize);
    unsigned char t[SF__DC_TRAILER_BYTES];
    uint64_t toff = fsize - SF__DC_TRAILER_BYTES;
    if (pread(fd, t, sizeof(t), (off_t)toff) != (ssize_t)sizeof(t))
        return sf__fail(why, why_len, SF_ERR_IO, "cannot read the trailer at offset %" PRIu64, toff);
    if (memcmp(t, TRAILER_MAGIC, 8) != 0 || memcmp(t + 56, TRAILER_END, 8) != 0)
        return sf__fail(why, why_len, SF_ERR_CORRUPT, "bad trailer magic at offset %" PRIu64, toff);
    if (XXH3_64bits(t, 48) != sf__get_le64(t + 48))
        return sf__fail(why, why_len, SF_ERR_CORRUPT, "trailer checksum mismatch at offset %" PRIu64,
                    toff);
    uint32_t version = sf__get_le32(t + 8);
    uint32_t meta_len = sf__get_le32(t + 12);
    uint64_t size = sf__get_le64(t + 16);
    if (version != SF__DC_FORMAT_VERSION)
        return sf__fail(why, why_len, SF_ERR_CORRUPT, "entry format %u, expected %d", version,
                    SF__DC_FORMAT_VERSION);
    if (meta_len > META_MAX_BYTES || size > fsize || fsize - size != (uint64_t)meta_len + 64)
        return sf__fail(why, why_len, SF_ERR_CORRUPT,
                    "sizes disagree: data %" PRIu64 " + metadata %u + 64 != file %" PRIu64, size,
                    meta_len, fsize);
    char *mj = malloc((size_t)meta_len + 1);
    if (!mj)
        return SF_ERR_NO_MEMORY;
    if (pread(fd, mj, meta_len, (off_t)size) != (ssize_t)meta_len) {
        free(mj);
        return sf__fail(why, why_len, SF_ERR_IO, "cannot read metadata at offset %" PRIu64, size);
    }
    mj[meta_len] = 0;
    if (XXH3_64bits(mj, meta_len) != sf__get_le64(t + 32)) {
        free(mj);
        return sf__fail(why, why_len, SF_ERR_CORRUPT, "metadata checksum mismatch at offset %" PRIu64,
                    size);
    }
    cJSON *j = cJSON_ParseWithLength(mj, meta_len);
    free(mj);
    sf_status st2 = SF_OK;
    const char *etag = j ? json_str(j, "etag") : NULL;
    const char *url = j ? json_str(j, "url") : NULL;
    const char *ep = j ? json_str(j, "endpoint") : NULL;
    const char *bk = j ? json_str(j, "bucket") : NULL;
    const char *key = j ? json_str(j, "key") : NULL;
    const cJSON *blocks = j ? cJSON_GetObjectItemCaseSensitive(j, "blocks") : NULL;
    if (!etag || !url || !ep || !bk || !key || !cJSON_IsArray(blocks)) {
        st2 = sf__fail(why, why_len, SF_ERR_CORRUPT, "metadata at offset %" PRIu64 " is incomplete",
                   size);
        goto out;
    }
    if (id && (strcmp(ep, id->endpoint ? id->endpoint : "") ||
               strcmp(bk, id->bucket ? id->bucket : "") || strcmp(key, id->key ? id->key : ""))) {
        st2 = sf__fail(why, why_len, SF_ERR_CORRUPT, "entry belongs to another object (%s)", url);
        goto out;
    }
    if (want_etag && want_etag[0] && strcmp(etag, want_etag) != 0) {
        st2 = sf__fail(why, why_len, SF_ERR_CORRUPT, "entry has ETag %s, expected %s", etag, want_etag);
        goto out;
    }
    size_t nb = n_blocks_for(size);
    if ((size_t)cJSON_GetArraySize(blocks) != nb) {
        st2 = sf__fail(why, why_len, SF_ERR_CORRUPT, "metadata lists %d blocks for %zu",
                   cJSON_GetArraySize(blocks), nb);
        goto out;
    }
    meta->blocks = nb ? malloc(nb * sizeof(uint64_t)) : NULL;
    if (nb && !meta->blocks) {
        st2 = SF_ERR_NO_MEMORY;
        goto out;
    }
    meta->n_blocks = nb;
    size_t i = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, blocks)
    {
        const char *s = cJSON_IsString(b) ? b->valuestring : "";
        uint64_t v = 0;
        int ok = strlen(s) == 16;
        for (int k = 0; ok && k < 16; k++) {
            int h = hexval(s[k]);
            ok = h >= 0;
            v = v << 4 | (uint64_t)(h < 0 ? 0 : h);
        }
        if (!ok) {
            st2 = sf__fail(why, why_len, SF_ERR_CORRUPT, "metadata block %zu is malformed", i);
            goto out;
        }
        meta->blocks[i++] = v;
    }
    if (blocks_digest(meta->blocks, nb) != sf__get_le64(t + 24)) {
        st2 = sf__fail(why, why_len, SF_ERR_CORRUPT, "block list does not match the trailer digest");
        goto out;
    }
    meta->size = size;
    meta->checksum = sf__get_le64(t + 24);
    meta->created = (int64_t)sf__get_le64(t + 40);
    meta->last_used = (int64_t)st.st_mtime;
    snprintf(meta->etag, sizeof(meta->etag), "%s", etag);
    snprintf(meta->url, sizeof(meta->url), "%s", url);
out:
    cJSON_Delete(j);
    if (st2 != SF_OK)
        sf__dc_meta_clear(meta);
    return st2;
}

sf_status sf__dc_verify_mem(const void *data, const struct sf__dc_meta *meta, char *err,
                            size_t err_len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < meta->n_blocks; i++) {
        uint64_t off = (uint64_t)i * SF__DC_BLOCK_BYTES;
        uint64_t n = meta->size - off < SF__DC_BLOCK_BYTES ? meta->size - off : SF__DC_BLOCK_BYTES;
        if (XXH3_64bits(p + off, (size_t)n) != meta->blocks[i])
            return sf__fail(err, err_len, SF_ERR_CORRUPT,
                        "data checksum mismatch in bytes %" PRIu64 "..%" PRIu64, off, off + n - 1);
    }
    return SF_OK;
}

/* Hashes bytes [0, size) of fd in blocks; blocks must hold n_blocks_for(size). */
static sf_status hash_fd(int fd, uint64_t size, uint64_t *blocks, const uint64_t *expect, char *err,
                         size_t err_len)
{
    /* Through a read-only mapping: the bytes are in the page cache (just
     * written, or about to be read), so this hashes them where they are
     * instead of copying them out with pread. */
    struct stat sb;
    /* Only when the file holds every byte: a mapping past its end faults. */
    if (size && size <= SIZE_MAX && fstat(fd, &sb) == 0 && (uint64_t)sb.st_size >= size) {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) {
            madvise(m, (size_t)size, MADV_SEQUENTIAL);
            sf_status mst = SF_OK;
            for (size_t i = 0; i < n_blocks_for(size); i++) {
                uint64_t off = (uint64_t)i * SF__DC_BLOCK_BYTES;
                size_t n =
                    (size_t)(size - off < SF__DC_BLOCK_BYTES ? size - off : SF__DC_BLOCK_BYTES);
                uint64_t h = XXH3_64bits((const unsigned char *)m + off, n);
                if (blocks)
                    blocks[i] = h;
                if (expect && expect[i] != h) {
                    mst = sf__fail(err, err_len, SF_ERR_CORRUPT,
                               "data checksum mismatch in bytes %" PRIu64 "..%" PRIu64, off,
                               off + n - 1);
                    break;
                }
            }
            munmap(m, (size_t)size);
            return mst;
        }
    }
    unsigned char *buf = malloc(SF__DC_BLOCK_BYTES);
    if (!buf)
        return SF_ERR_NO_MEMORY;
    sf_status st = SF_OK;
    for (size_t i = 0; i < n_blocks_for(size); i++) {
        uint64_t off = (uint64_t)i * SF__DC_BLOCK_BYTES;
        size_t n = (size_t)(size - off < SF__DC_BLOCK_BYTES ? size - off : SF__DC_BLOCK_BYTES);
        size_t got = 0;
        while (got < n) {
            ssize_t r = pread(fd, buf + got, n - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                st = sf__fail(err, err_len, r == 0 ? SF_ERR_CORRUPT : SF_ERR_IO,
                          "short read at offset %" PRIu64 "%s%s", off + got, r ? ": " : "",
                          r ? strerror(errno) : "");
                goto out;
            }
            got += (size_t)r;
        }
        uint64_t h = XXH3_64bits(buf, n);
        if (blocks)
            blocks[i] = h;
        if (expect && expect[i] != h) {
            st = sf__fail(err, err_len, SF_ERR_CORRUPT,
                      "data checksum mismatch in bytes %" PRIu64 "..%" PRIu64, off, off + n - 1);
            goto out;
        }
    }
out:
    free(buf);
    return st;
}

sf_status sf__dc_verify_fd(int fd, const struct sf__dc_meta *meta, char *err, size_t err_len)
{
    return hash_fd(fd, meta->size, NULL, meta->blocks, err, err_len);
}

/* ------------------------------------------------------------ lookup */

/* Newest <kh>-*.sf in the key's directory, into name (relative to root). */
static int find_any_version(struct sf__disk_cache *dc, const char *kh, char *name, size_t n)
{
    char sub[PATH_MAX];
    if (sub_path(dc, kh, sub, sizeof(sub)) != 0)
        return -1;
    DIR *d = opendir(sub);
    if (!d)
        return -1;
    struct dirent *de;
    time_t best = 0;
    int found = -1;
    size_t sl = strlen(ENTRY_SUFFIX);
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l != 64 + 1 + 32 + sl || strncmp(de->d_name, kh, 64) != 0 || de->d_name[64] != '-' ||
            strcmp(de->d_name + l - sl, ENTRY_SUFFIX) != 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (found < 0 || st.st_mtime > best) {
            best = st.st_mtime;
            snprintf(name, n, "%.2s/%s", kh, de->d_name);
            found = 0;
        }
    }
    closedir(d);
    return found;
}

static void entry_name(const char *kh, const char *etag, char *out, size_t n)
{
    char eh[33];
    etag_hash(etag, eh);
    snprintf(out, n, "%.2s/%s-%s%s", kh, kh, eh, ENTRY_SUFFIX);
}

static sf_status lookup_kh(struct sf__disk_cache *dc, const struct sf__cache_id *id, const char *kh,
                           const char *etag, unsigned flags, int *fd_out, struct sf__dc_meta *meta,
                           char *err, size_t err_len)
{
    *fd_out = -1;
    char name[SF__DC_NAME_MAX], path[PATH_MAX];
    if (etag && etag[0])
        entry_name(kh, etag, name, sizeof(name));
    else if (find_any_version(dc, kh, name, sizeof(name)) != 0) {
        dc->n.misses++;
        return sf__fail(err, err_len, SF_ERR_NOT_FOUND, "not cached");
    }
    snprintf(path, sizeof(path), "%s/%s", dc->root, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        dc->n.misses++;
        if (errno == ENOENT)
            return sf__fail(err, err_len, SF_ERR_NOT_FOUND, "not cached");
        return sf__fail(err, err_len, SF_ERR_IO, "cannot open cache entry %s: %s", path,
                    strerror(errno));
    }
    char why[512];
    sf_status st = read_entry(fd, id, etag, meta, why, sizeof(why));
    if (st == SF_OK && (flags & SF__DC_VERIFY_DATA))
        st = sf__dc_verify_fd(fd, meta, why, sizeof(why));
    if (st != SF_OK) {
        struct stat seen;
        int have = fstat(fd, &seen) == 0;
        close(fd);
        sf__dc_meta_clear(meta);
        dc->n.misses++;
        if (st != SF_ERR_CORRUPT)
            return sf__fail(err, err_len, st, "cache entry %s: %s", path, why);
        /* A bad entry is never served: delete it so it is fetched again. */
        int64_t freed = have ? unlink_same(path, &seen) : 0;
        if (freed)
            usage_add(dc, -freed);
        dc->n.corrupt++;
        return sf__fail(err, err_len, SF_ERR_CORRUPT,
                    "cache entry %s for %s/%s failed verification (%s); deleted, it will be "
                    "fetched again",
                    name, id->bucket ? id->bucket : "", id->key ? id->key : "", why);
    }
    snprintf(meta->name, sizeof(meta->name), "%s", name);
    if (!(flags & SF__DC_NO_TOUCH)) {
        futimens(fd, NULL); /* the LRU clock: last use is the mtime */
        meta->last_used = now_unix();
    }
    dc->n.hits++;
    *fd_out = fd;
    return SF_OK;
}

sf_status sf__dc_lookup(struct sf__disk_cache *dc, const struct sf__cache_id *id, const char *etag,
                        unsigned flags, int *fd, struct sf__dc_meta *meta, char *err,
                        size_t err_len)
{
    char kh[65];
    key_hash(id, kh);
    return lookup_kh(dc, id, kh, etag, flags, fd, meta, err, err_len);
}

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
    key_hash(id, kh);
    *owner_alive = 0;
    if (file_path(dc, kh, ".lock", path, sizeof(path)) != 0)
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
    key_hash(id, kh);
    if (file_path(dc, kh, ".part", path, sizeof(path)) != 0)
        return -1;
    return open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
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
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        struct scan_item *v = realloc(s->v, cap * sizeof(*v));
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = *it;
    return 0;
}

/* Every entry and part file under root. */
static sf_status scan_all(struct sf__disk_cache *dc, struct scan *s)
{
    DIR *top = opendir(dc->root);
    if (!top)
        return SF_ERR_IO;
    struct dirent *de;
    while ((de = readdir(top)) != NULL) {
        if (strlen(de->d_name) != 2 || hexval(de->d_name[0]) < 0 || hexval(de->d_name[1]) < 0)
            continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof(sub), "%s/%s", dc->root, de->d_name) >= (int)sizeof(sub))
            continue;
        DIR *d = opendir(sub);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            struct scan_item it;
            memset(&it, 0, sizeof(it));
            if (l == 64 + 5 && !strcmp(e->d_name + 64, ".part"))
                it.is_part = 1;
            else if (!(l == 64 + 1 + 32 + 3 && !strcmp(e->d_name + l - 3, ENTRY_SUFFIX)))
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
                return SF_ERR_NO_MEMORY;
            }
        }
        closedir(d);
    }
    closedir(top);
    return SF_OK;
}

static int by_mtime(const void *a, const void *b)
{
    const struct scan_item *x = a, *y = b;
    if (x->mtime != y->mtime)
        return (x->mtime > y->mtime) - (x->mtime < y->mtime);
    return (x->mtime_ns > y->mtime_ns) - (x->mtime_ns < y->mtime_ns);
}

/* Locks the key of a part file without waiting; -1 when its owner is alive. */
static int try_key_lock(struct sf__disk_cache *dc, const char *kh)
{
    char path[PATH_MAX];
    if (file_path(dc, kh, ".lock", path, sizeof(path)) != 0)
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
        return unlink_same(it->path, &it->st);
    if (own_kh && !strcmp(it->kh, own_kh))
        return 0;
    int lk = try_key_lock(dc, it->kh);
    if (lk < 0)
        return 0;
    int64_t n = unlink_same(it->path, &it->st);
    sf__fdlock_close(lk);
    return n;
}

/*
 * Under evict.lock: makes room for `need` bytes (own_kh's part excluded from
 * the count: it is being replaced). Returns SF_OK with the new usage written.
 */
static sf_status make_room(struct sf__disk_cache *dc, uint64_t need, const char *own_kh, char *err,
                           size_t err_len)
{
    uint64_t u = usage_read(dc);
    if (u != UINT64_MAX && (dc->o.limit_bytes == 0 || u + need <= dc->o.limit_bytes)) {
        usage_write(dc, u + need);
        return SF_OK;
    }
    /* Unknown or over the limit: count exactly, then evict oldest first. */
    struct scan s = {0};
    sf_status st = scan_all(dc, &s);
    if (st != SF_OK) {
        free(s.v);
        return sf__fail(err, err_len, st, "cannot scan the cache directory %s", dc->root);
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
            qsort(s.v, s.n, sizeof(*s.v), by_mtime);
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

/* ------------------------------------------------------------ downloading */

static uint64_t meta_reserve(uint64_t size)
{
    /* JSON text per block ("0123456789abcdef", = 19 bytes) plus fixed fields. */
    return 8192 + (uint64_t)n_blocks_for(size) * 20 + SF__DC_TRAILER_BYTES;
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
    key_hash(id, w->kh);
    snprintf(w->endpoint, sizeof(w->endpoint), "%s", id->endpoint ? id->endpoint : "");
    snprintf(w->bucket, sizeof(w->bucket), "%s", id->bucket ? id->bucket : "");
    snprintf(w->key, sizeof(w->key), "%s", id->key ? id->key : "");
    snprintf(w->etag, sizeof(w->etag), "%s", etag);
    w->size = size;
    w->n_fb = n_blocks_for(size);
    w->fb = w->n_fb ? calloc(w->n_fb, sizeof(*w->fb)) : NULL; /* NULL: hash at publish */

    char sub[PATH_MAX], lock_path[PATH_MAX], part_path[PATH_MAX];
    sf_status st = SF_OK;
    if (sub_path(dc, w->kh, sub, sizeof(sub)) ||
        file_path(dc, w->kh, ".lock", lock_path, sizeof(lock_path)) ||
        file_path(dc, w->kh, ".part", part_path, sizeof(part_path))) {
        st = sf__fail(err, err_len, SF_ERR_LIMIT, "cache path too long");
        goto fail;
    }
    if (mkdir_0700(sub) != 0) {
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
            st = sf__fail(err, err_len, SF_ERR_IO, "cannot lock %s: %s", lock_path, strerror(errno));
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
        sf_status lst = lookup_kh(dc, id, w->kh, etag, SF__DC_NO_TOUCH, &efd, &m, e2, sizeof(e2));
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
    if (record_read(w->lock_fd, &rec) == 0 && rec.state == SF__DC_ST_DOWNLOADING &&
        rec.size == size && !strcmp(rec.etag, etag) && rec.contiguous <= size &&
        lstat(part_path, &pst) == 0 && S_ISREG(pst.st_mode) && (uint64_t)pst.st_size == size)
        w->resume = rec.contiguous;

    int lk = evict_lock(dc);
    if (lk < 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "cannot lock %s/evict.lock: %s", dc->root,
                  strerror(errno));
        goto fail;
    }
    w->reserved = size + meta_reserve(size);
    uint64_t need = w->resume ? meta_reserve(size) : w->reserved;
    st = make_room(dc, need, w->kh, err, err_len);
    if (st == SF_OK) {
        w->fd = open(part_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        /* Leftover bytes not resumed are dropped, but a new (empty) file is
         * not truncated: on ext4 a truncate to 0 arms auto_da_alloc, and the
         * last close of the entry then starts writeback of all its pages on
         * the closing thread (CPU taken from the decoders, docs/cache.md).
         * fallocate: the download's writes find their blocks allocated
         * (cheaper per page than delayed allocation) and a full disk fails
         * here rather than halfway; where it is not supported the file stays
         * sparse, as before. */
        struct stat fst;
        if (w->fd < 0 || fstat(w->fd, &fst) != 0 ||
            (!w->resume && fst.st_size != 0 && ftruncate(w->fd, 0) != 0) ||
            ftruncate(w->fd, (off_t)size) != 0 ||
            (size && fallocate(w->fd, 0, 0, (off_t)size) != 0 && errno == ENOSPC)) {
            st = sf__fail(err, err_len, SF_ERR_IO, "cannot create %s: %s", part_path, strerror(errno));
            /* Give the reservation back (evict.lock is still held here). */
            uint64_t u = usage_read(dc);
            if (u != UINT64_MAX)
                usage_write(dc, u > need ? u - need : 0);
        } else {
            fchmod(w->fd, 0600);
        }
    }
    evict_unlock(lk);
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

/* Hashes block b of the file (publish, for blocks not hashed in-stream). */
static sf_status hash_block_fd(int fd, uint64_t size, size_t b, uint64_t *out, char *err,
                               size_t err_len)
{
    uint64_t off = (uint64_t)b * SF__DC_BLOCK_BYTES;
    size_t n = (size_t)(size - off < SF__DC_BLOCK_BYTES ? size - off : SF__DC_BLOCK_BYTES);
    void *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)off);
    if (m != MAP_FAILED) {
        *out = XXH3_64bits(m, n);
        munmap(m, n);
        return SF_OK;
    }
    unsigned char *buf = malloc(n);
    if (!buf)
        return SF_ERR_NO_MEMORY;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(buf);
            return sf__fail(err, err_len, r == 0 ? SF_ERR_CORRUPT : SF_ERR_IO,
                        "short read at offset %" PRIu64 "%s%s", off + got, r ? ": " : "",
                        r ? strerror(errno) : "");
        }
        got += (size_t)r;
    }
    *out = XXH3_64bits(buf, n);
    free(buf);
    return SF_OK;
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
        if (file_path(w->dc, w->kh, ".part", path, sizeof(path)) == 0 && fstat(w->fd, &st) == 0) {
            int64_t f = unlink_same(path, &st);
            if (f)
                usage_add(w->dc, -(int64_t)w->reserved);
        }
        struct sf__dc_record rec;
        memset(&rec, 0, sizeof(rec));
        rec.state = SF__DC_ST_IDLE;
        record_write(w->lock_fd, &rec);
    }
    writer_free(w);
}

static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
    const char *c = p;
    while (n) {
        ssize_t r = pwrite(fd, c, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Removes every other ETag of the key once a new one is published. */
static void remove_other_versions(struct sf__disk_cache *dc, const char *kh, const char *keep)
{
    char sub[PATH_MAX];
    if (sub_path(dc, kh, sub, sizeof(sub)) != 0)
        return;
    DIR *d = opendir(sub);
    if (!d)
        return;
    struct dirent *de;
    int64_t freed = 0;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l != 64 + 1 + 32 + 3 || strncmp(de->d_name, kh, 64) ||
            strcmp(de->d_name + l - 3, ENTRY_SUFFIX))
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
        usage_add(dc, -freed);
}

sf_status sf__dc_writer_publish(struct sf__dc_writer *w, const char *url,
                                struct sf__dc_meta *meta_out, char *err, size_t err_len)
{
    struct sf__disk_cache *dc = w->dc;
    size_t nb = n_blocks_for(w->size);
    uint64_t *blocks = nb ? malloc(nb * sizeof(uint64_t)) : NULL;
    char *mj = NULL;
    cJSON *j = NULL;
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
        st = hash_block_fd(w->fd, w->size, i, &blocks[i], why, sizeof(why));
        if (st != SF_OK) {
            st = sf__fail(err, err_len, st, "cannot read back %s for its checksum: %s", url, why);
            goto fail;
        }
        from_file++;
    }
    int64_t created = now_unix();
    j = cJSON_CreateObject();
    cJSON *arr = j ? cJSON_AddArrayToObject(j, "blocks") : NULL;
    if (!arr) {
        st = SF_ERR_NO_MEMORY;
        goto fail;
    }
    cJSON_AddNumberToObject(j, "format", SF__DC_FORMAT_VERSION);
    cJSON_AddStringToObject(j, "url", url);
    cJSON_AddStringToObject(j, "endpoint", w->endpoint);
    cJSON_AddStringToObject(j, "bucket", w->bucket);
    cJSON_AddStringToObject(j, "key", w->key);
    cJSON_AddStringToObject(j, "etag", w->etag);
    cJSON_AddNumberToObject(j, "size", (double)w->size);
    cJSON_AddNumberToObject(j, "created", (double)created);
    cJSON_AddNumberToObject(j, "block_bytes", SF__DC_BLOCK_BYTES);
    cJSON_AddStringToObject(j, "checksum", "xxh3-64");
    for (size_t i = 0; i < nb; i++) {
        char hx[17];
        snprintf(hx, sizeof(hx), "%016" PRIx64, blocks[i]);
        cJSON_AddItemToArray(arr, cJSON_CreateString(hx));
    }
    mj = cJSON_PrintUnformatted(j);
    if (!mj) {
        st = SF_ERR_NO_MEMORY;
        goto fail;
    }
    size_t ml = strlen(mj);
    unsigned char t[SF__DC_TRAILER_BYTES];
    memset(t, 0, sizeof(t));
    memcpy(t, TRAILER_MAGIC, 8);
    sf__put_le32(t + 8, SF__DC_FORMAT_VERSION);
    sf__put_le32(t + 12, (uint32_t)ml);
    sf__put_le64(t + 16, w->size);
    sf__put_le64(t + 24, blocks_digest(blocks, nb));
    sf__put_le64(t + 32, XXH3_64bits(mj, ml));
    sf__put_le64(t + 40, (uint64_t)created);
    sf__put_le64(t + 48, XXH3_64bits(t, 48));
    memcpy(t + 56, TRAILER_END, 8);
    if (write_all(w->fd, mj, ml, w->size) != 0 ||
        write_all(w->fd, t, sizeof(t), w->size + ml) != 0 ||
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
    entry_name(w->kh, w->etag, name, sizeof(name));
    file_path(dc, w->kh, ".part", part, sizeof(part));
    snprintf(final, sizeof(final), "%s/%s", dc->root, name);
    if (rename(part, final) != 0) {
        st = sf__fail(err, err_len, SF_ERR_IO, "cannot publish %s as %s: %s", url, final,
                  strerror(errno));
        goto fail;
    }
    if (dc->o.fsync) {
        char sub[PATH_MAX];
        sub_path(dc, w->kh, sub, sizeof(sub));
        int dfd = open(sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    int64_t delta = (int64_t)(w->size + ml + sizeof(t)) - (int64_t)w->reserved;
    if (delta)
        usage_add(dc, delta);
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
    cJSON_Delete(j);
    writer_free(w);
    return SF_OK;
fail:
    free(blocks);
    free(mj);
    cJSON_Delete(j);
    sf__dc_writer_abort(w, 0);
    return st;
}

/* ------------------------------------------------------------ listing, clearing */

sf_status sf__dc_foreach(struct sf__disk_cache *dc,
                         int (*fn)(void *user, const char *path, const struct sf__dc_meta *m,
                                   sf_status st, const char *why),
                         void *user, char *err, size_t err_len)
{
    struct scan s = {0};
    sf_status st = scan_all(dc, &s);
    if (st != SF_OK) {
        free(s.v);
        return sf__fail(err, err_len, st, "cannot scan the cache directory %s", dc->root);
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
        sf_status est = fd < 0 ? SF_ERR_IO : read_entry(fd, NULL, NULL, &m, why, sizeof(why));
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

sf_status sf__dc_remove(struct sf__disk_cache *dc, const char *name)
{
    if (strstr(name, "..") || strlen(name) != 2 + 1 + 64 + 1 + 32 + 3)
        return SF_ERR_INVALID_ARGUMENT;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dc->root, name);
    struct stat st;
    if (lstat(path, &st) != 0)
        return SF_ERR_NOT_FOUND;
    int64_t f = unlink_same(path, &st);
    if (f)
        usage_add(dc, -f);
    return f ? SF_OK : SF_ERR_IO;
}

sf_status sf__dc_usage(struct sf__disk_cache *dc, int sweep, struct sf__dc_usage *u, char *err,
                       size_t err_len)
{
    memset(u, 0, sizeof(*u));
    struct scan s = {0};
    sf_status st = scan_all(dc, &s);
    if (st != SF_OK) {
        free(s.v);
        return sf__fail(err, err_len, st, "cannot scan the cache directory %s", dc->root);
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
                unlink_same(s.v[i].path, &s.v[i].st)) {
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
        int lk = evict_lock(dc);
        if (lk >= 0) {
            usage_write(dc, u->entry_bytes + u->part_bytes);
            evict_unlock(lk);
        }
    }
    return SF_OK;
}

sf_status sf__dc_clear(struct sf__disk_cache *dc, uint64_t *removed, char *err, size_t err_len)
{
    *removed = 0;
    int lk = evict_lock(dc);
    if (lk < 0)
        return sf__fail(err, err_len, SF_ERR_IO, "cannot lock %s/evict.lock", dc->root);
    struct scan s = {0};
    sf_status st = scan_all(dc, &s);
    if (st != SF_OK) {
        free(s.v);
        evict_unlock(lk);
        return sf__fail(err, err_len, st, "cannot scan the cache directory %s", dc->root);
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
    evict_unlock(lk);
    return SF_OK;
}
