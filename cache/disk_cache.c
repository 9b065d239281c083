/*
 * Disk tier (docs/cache.md): opening the directory, the names of a key's
 * files (key and ETag hashes, paths) and lookup of published entries. The
 * entry format is in disk_entry.c, downloads in disk_write.c, the byte count
 * and eviction in disk_evict.c.
 */
#include "cache/disk_cache_internal.h"
#include "common/strbuf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ names */

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
void sf__dc_key_hash(const struct sf__cache_id *id, char kh[65])
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

void sf__dc_entry_name(const char *kh, const char *etag, char *out, size_t n)
{
    char eh[33];
    etag_hash(etag, eh);
    snprintf(out, n, "%.2s/%s-%s%s", kh, kh, eh, SF__DC_ENTRY_SUFFIX);
}

int sf__dc_mkdir(const char *path)
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
            if (sf__dc_mkdir(tmp) != 0)
                return -1;
            *p = '/';
        }
    }
    return sf__dc_mkdir(tmp);
}

int sf__dc_mkdir_sub(const char *path)
{
    if (sf__dc_mkdir(path) == 0)
        return 0;
    /* The tier itself is gone (rm -rf of the cache directory while processes
     * use it): made again, as sf__disk_cache_open would, so later downloads
     * are cached rather than failing. */
    return errno == ENOENT ? mkdir_p(path) : -1;
}

int sf__dc_sub_path(const struct sf__disk_cache *dc, const char *kh, char *out, size_t n)
{
    return snprintf(out, n, "%s/%.2s", dc->root, kh) < (int)n ? 0 : -1;
}

int sf__dc_file_path(const struct sf__disk_cache *dc, const char *kh, const char *suffix, char *out,
                     size_t n)
{
    return snprintf(out, n, "%s/%.2s/%s%s", dc->root, kh, kh, suffix) < (int)n ? 0 : -1;
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

/* ------------------------------------------------------------ lookup */

/* Newest <kh>-*.sf in the key's directory, into name (relative to root). */
static int find_any_version(struct sf__disk_cache *dc, const char *kh, char *name, size_t n)
{
    char sub[PATH_MAX];
    if (sf__dc_sub_path(dc, kh, sub, sizeof(sub)) != 0)
        return -1;
    DIR *d = opendir(sub);
    if (!d)
        return -1;
    struct dirent *de;
    time_t best = 0;
    int found = -1;
    size_t sl = strlen(SF__DC_ENTRY_SUFFIX);
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l != 64 + 1 + 32 + sl || strncmp(de->d_name, kh, 64) != 0 || de->d_name[64] != '-' ||
            strcmp(de->d_name + l - sl, SF__DC_ENTRY_SUFFIX) != 0)
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

sf_status sf__dc_lookup_kh(struct sf__disk_cache *dc, const struct sf__cache_id *id, const char *kh,
                           const char *etag, unsigned flags, int *fd_out, struct sf__dc_meta *meta,
                           char *err, size_t err_len)
{
    *fd_out = -1;
    char name[SF__DC_NAME_MAX], path[PATH_MAX];
    if (etag && etag[0])
        sf__dc_entry_name(kh, etag, name, sizeof(name));
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
    sf_status st = sf__dc_read_entry(fd, id, etag, meta, why, sizeof(why));
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
        int64_t freed = have ? sf__dc_unlink_same(path, &seen) : 0;
        if (freed)
            sf__dc_usage_add(dc, -freed);
        dc->n.corrupt++;
        return sf__fail(err, err_len, SF_ERR_CORRUPT,
                        "cache entry %s for %s/%s failed verification (%s); deleted, it will be "
                        "fetched again",
                        name, id->bucket ? id->bucket : "", id->key ? id->key : "", why);
    }
    snprintf(meta->name, sizeof(meta->name), "%s", name);
    if (!(flags & SF__DC_NO_TOUCH)) {
        futimens(fd, NULL); /* the LRU clock: last use is the mtime */
        meta->last_used = sf__dc_now_unix();
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
    sf__dc_key_hash(id, kh);
    return sf__dc_lookup_kh(dc, id, kh, etag, flags, fd, meta, err, err_len);
}
