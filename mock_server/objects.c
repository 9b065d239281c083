#include "mock_server/objects.h"

#include "s3/sigv4.h"
#include "common/grow.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ETAG_CACHE_BUCKETS 4096
#define ETAG_CACHE_MAX     1000000
#define MAX_LIST_DEPTH     64

struct etag_item {
    struct etag_item *next;
    dev_t dev;
    ino_t ino;
    uint64_t size;
    int64_t mtime_ns;
    char etag[MOCK_ETAG_LEN + 1];
};

struct mock_store {
    char *root;
    pthread_mutex_t lock; /* guards cache and n_cached */
    struct etag_item *cache[ETAG_CACHE_BUCKETS];
    size_t n_cached;
};

sf_status mock_store_new(const char *root, struct mock_store **out)
{
    struct stat sb;
    if (stat(root, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return SF_ERR_NOT_FOUND;
    struct mock_store *st = calloc(1, sizeof(*st));
    if (!st)
        return SF_ERR_NO_MEMORY;
    st->root = strdup(root);
    if (!st->root) {
        free(st);
        return SF_ERR_NO_MEMORY;
    }
    size_t n = strlen(st->root);
    while (n > 1 && st->root[n - 1] == '/')
        st->root[--n] = '\0';
    pthread_mutex_init(&st->lock, NULL);
    *out = st;
    return SF_OK;
}

void mock_store_destroy(struct mock_store *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < ETAG_CACHE_BUCKETS; i++) {
        struct etag_item *it = st->cache[i];
        while (it) {
            struct etag_item *next = it->next;
            free(it);
            it = next;
        }
    }
    pthread_mutex_destroy(&st->lock);
    free(st->root);
    free(st);
}

const char *mock_store_root(const struct mock_store *st)
{
    return st->root;
}

int mock_bucket_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n < 3 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
        if (!ok)
            return 0;
    }
    if (name[0] == '.' || name[0] == '-' || name[n - 1] == '.' || name[n - 1] == '-')
        return 0;
    return strstr(name, "..") == NULL;
}

int mock_key_valid(const char *key, size_t len)
{
    if (len == 0 || len > 1024 || memchr(key, '\0', len))
        return 0;
    const char *p = key;
    const char *end = key + len;
    while (p <= end) {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        const char *seg_end = slash ? slash : end;
        size_t seg = (size_t)(seg_end - p);
        if (seg == 0)
            return 0; /* leading '/', '//' or trailing '/' */
        if ((seg == 1 && p[0] == '.') || (seg == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (seg >= sizeof(MOCK_TMP_PREFIX) - 1 &&
            memcmp(p, MOCK_TMP_PREFIX, sizeof(MOCK_TMP_PREFIX) - 1) == 0)
            return 0;
        if (!slash)
            break;
        p = slash + 1;
    }
    return 1;
}

char *mock_store_path(const struct mock_store *st, const char *bucket, const char *key)
{
    size_t n = strlen(st->root) + 1 + strlen(bucket) + (key ? 1 + strlen(key) : 0) + 1;
    char *path = malloc(n);
    if (!path)
        return NULL;
    if (key)
        snprintf(path, n, "%s/%s/%s", st->root, bucket, key);
    else
        snprintf(path, n, "%s/%s", st->root, bucket);
    return path;
}

int mock_bucket_exists(const struct mock_store *st, const char *bucket)
{
    char *path = mock_store_path(st, bucket, NULL);
    struct stat sb;
    int ok = path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    free(path);
    return ok;
}

static int64_t stat_mtime_ns(const struct stat *sb)
{
    return (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

static size_t etag_slot(dev_t dev, ino_t ino)
{
    uint64_t h = (uint64_t)dev * 0x9E3779B97F4A7C15ull ^ (uint64_t)ino * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h >> 32) % ETAG_CACHE_BUCKETS;
}

static sf_status md5_of_fd(int fd, uint64_t size, unsigned char md[16])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return SF_ERR_NO_MEMORY;
    sf_status rc = SF_OK;
    size_t buf_len = 1 << 20;
    unsigned char *buf = malloc(buf_len);
    if (!buf || !EVP_DigestInit_ex(ctx, EVP_md5(), NULL)) {
        rc = buf ? SF_ERR_INTERNAL : SF_ERR_NO_MEMORY;
        goto out;
    }
    uint64_t off = 0;
    while (off < size) {
        size_t want = size - off < buf_len ? (size_t)(size - off) : buf_len;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            rc = SF_ERR_IO;
            goto out;
        }
        EVP_DigestUpdate(ctx, buf, (size_t)got);
        off += (uint64_t)got;
    }
    unsigned int len = 0;
    if (!EVP_DigestFinal_ex(ctx, md, &len) || len != 16)
        rc = SF_ERR_INTERNAL;
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    return rc;
}

#define SIDECAR_PREFIX MOCK_TMP_PREFIX "etag-"

/* dir/name -> dir/.sfmock-etag-name (malloc'd) */
static char *sidecar_path(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    size_t n = strlen(path) + sizeof(SIDECAR_PREFIX);
    char *out = malloc(n);
    if (out)
        snprintf(out, n, "%.*s" SIDECAR_PREFIX "%s", (int)dir_len, path, path + dir_len);
    return out;
}

/* The sidecar holds one line: "ETAG INODE SIZE MTIME_NS". */
static int sidecar_read(const char *path, const struct stat *sb, char out[MOCK_ETAG_LEN + 1])
{
    char *side = sidecar_path(path);
    int fd = side ? open(side, O_RDONLY | O_CLOEXEC) : -1;
    free(side);
    if (fd < 0)
        return -1;
    char buf[256];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char etag[MOCK_ETAG_LEN + 2];
    unsigned long long ino, size;
    long long mtime_ns;
    if (sscanf(buf, "%41s %llu %llu %lld", etag, &ino, &size, &mtime_ns) != 4 ||
        strlen(etag) > MOCK_ETAG_LEN || etag[0] != '"')
        return -1;
    if (ino != (unsigned long long)sb->st_ino || size != (unsigned long long)sb->st_size ||
        mtime_ns != (long long)stat_mtime_ns(sb))
        return -1; /* the file changed behind the mock's back */
    memcpy(out, etag, strlen(etag) + 1);
    return 0;
}

sf_status mock_store_persist_etag(const char *path, const struct stat *sb, const char *etag)
{
    char *side = sidecar_path(path);
    size_t n = side ? strlen(side) + sizeof(".tmp-XXXXXX") : 0;
    char *tmp = side ? malloc(n) : NULL;
    if (!tmp) {
        free(side);
        return SF_ERR_NO_MEMORY;
    }
    snprintf(tmp, n, "%s.tmp-XXXXXX", side);
    int fd = mkostemp(tmp, O_CLOEXEC);
    char line[256];
    int len = snprintf(line, sizeof line, "%s %llu %llu %lld\n", etag,
                       (unsigned long long)sb->st_ino, (unsigned long long)sb->st_size,
                       (long long)stat_mtime_ns(sb));
    int ok = fd >= 0 && len > 0 && (size_t)len < sizeof line &&
             write(fd, line, (size_t)len) == len && fchmod(fd, 0644) == 0 && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    if (ok && rename(tmp, side) != 0)
        ok = 0;
    if (!ok && fd >= 0)
        unlink(tmp);
    free(tmp);
    free(side);
    return ok ? SF_OK : SF_ERR_IO;
}

void mock_store_forget_etag(const char *path)
{
    char *side = sidecar_path(path);
    if (side)
        unlink(side);
    free(side);
}

sf_status mock_store_etag(struct mock_store *st, const char *path, int fd, const struct stat *sb,
                          char out[MOCK_ETAG_LEN + 1])
{
    size_t slot = etag_slot(sb->st_dev, sb->st_ino);
    int64_t mtime_ns = stat_mtime_ns(sb);
    pthread_mutex_lock(&st->lock);
    for (struct etag_item *it = st->cache[slot]; it; it = it->next) {
        if (it->dev == sb->st_dev && it->ino == sb->st_ino && it->size == (uint64_t)sb->st_size &&
            it->mtime_ns == mtime_ns) {
            memcpy(out, it->etag, MOCK_ETAG_LEN + 1);
            pthread_mutex_unlock(&st->lock);
            return SF_OK;
        }
    }
    pthread_mutex_unlock(&st->lock);

    if (path && sidecar_read(path, sb, out) == 0) {
        mock_store_set_etag(st, sb, out);
        return SF_OK;
    }
    /* Hash outside the lock: two threads may hash the same file once each,
     * which is cheaper than serializing every first GET. */
    unsigned char md[16];
    sf_status rc = md5_of_fd(fd, (uint64_t)sb->st_size, md);
    if (rc != SF_OK)
        return rc;
    out[0] = '"';
    sf__hex_encode(md, 16, out + 1);
    out[33] = '"';
    out[34] = '\0';

    mock_store_set_etag(st, sb, out); /* a failure leaves the answer right, just not cached */
    return SF_OK;
}

void mock_store_set_etag(struct mock_store *st, const struct stat *sb, const char *etag)
{
    size_t slot = etag_slot(sb->st_dev, sb->st_ino);
    struct etag_item *item = malloc(sizeof(*item));
    if (!item)
        return;
    item->dev = sb->st_dev;
    item->ino = sb->st_ino;
    item->size = (uint64_t)sb->st_size;
    item->mtime_ns = stat_mtime_ns(sb);
    snprintf(item->etag, sizeof(item->etag), "%s", etag);
    pthread_mutex_lock(&st->lock);
    /* Replace a stale entry for the same inode instead of growing the chain. */
    struct etag_item **pp = &st->cache[slot];
    while (*pp) {
        if ((*pp)->dev == item->dev && (*pp)->ino == item->ino) {
            struct etag_item *old = *pp;
            *pp = old->next;
            free(old);
            st->n_cached--;
            break;
        }
        pp = &(*pp)->next;
    }
    if (st->n_cached < ETAG_CACHE_MAX) {
        item->next = st->cache[slot];
        st->cache[slot] = item;
        st->n_cached++;
        item = NULL;
    }
    pthread_mutex_unlock(&st->lock);
    free(item);
}

struct list_ctx {
    const char *prefix;
    size_t prefix_len;
    struct mock_entry *entries;
    size_t n, cap;
    sf_status err;
};

static void list_add(struct list_ctx *c, const char *key, const struct stat *sb)
{
    struct mock_entry *e = sf__grow(c->entries, c->n, &c->cap, sizeof(*e), 256);
    if (!e) {
        c->err = SF_ERR_NO_MEMORY;
        return;
    }
    c->entries = e;
    char *k = strdup(key);
    if (!k) {
        c->err = SF_ERR_NO_MEMORY;
        return;
    }
    c->entries[c->n++] = (struct mock_entry){
        .key = k,
        .size = (uint64_t)sb->st_size,
        .mtime = sb->st_mtim.tv_sec,
        .dev = sb->st_dev,
        .ino = sb->st_ino,
        .mtime_ns = stat_mtime_ns(sb),
    };
}

/* Walks dir (whose key prefix is rel, "" or ending in '/'), adding files
 * whose key starts with c->prefix. Subtrees that cannot match are skipped. */
static void list_walk(struct list_ctx *c, int dir_fd, char *rel, size_t rel_len, int depth)
{
    DIR *d = fdopendir(dir_fd);
    if (!d) {
        close(dir_fd);
        return;
    }
    struct dirent *de;
    while (c->err == SF_OK && (de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        if (strncmp(name, MOCK_TMP_PREFIX, sizeof(MOCK_TMP_PREFIX) - 1) == 0)
            continue;
        size_t name_len = strlen(name);
        if (rel_len + name_len + 2 > 1100)
            continue; /* longer than any valid key */
        memcpy(rel + rel_len, name, name_len + 1);
        size_t key_len = rel_len + name_len;
        struct stat sb;
        if (fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        /* A symlink to a file is an object; a symlink to a directory is not
         * walked, so a link loop cannot make a listing spin. */
        if (S_ISLNK(sb.st_mode) && (fstatat(dirfd(d), name, &sb, 0) != 0 || !S_ISREG(sb.st_mode)))
            continue;
        if (S_ISDIR(sb.st_mode)) {
            if (depth >= MAX_LIST_DEPTH)
                continue;
            rel[key_len] = '/';
            rel[key_len + 1] = '\0';
            /* Descend only if keys below can start with the prefix. */
            size_t cmp = key_len + 1 < c->prefix_len ? key_len + 1 : c->prefix_len;
            if (memcmp(rel, c->prefix, cmp) != 0)
                continue;
            int sub = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (sub >= 0)
                list_walk(c, sub, rel, key_len + 1, depth + 1);
        } else if (S_ISREG(sb.st_mode)) {
            if (key_len >= c->prefix_len && memcmp(rel, c->prefix, c->prefix_len) == 0)
                list_add(c, rel, &sb);
        }
    }
    closedir(d);
}

static int entry_cmp(const void *a, const void *b)
{
    const struct mock_entry *x = a, *y = b;
    return strcmp(x->key, y->key);
}

sf_status mock_store_list(const struct mock_store *st, const char *bucket, const char *prefix,
                          struct mock_listing *out)
{
    memset(out, 0, sizeof(*out));
    char *path = mock_store_path(st, bucket, NULL);
    if (!path)
        return SF_ERR_NO_MEMORY;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(path);
    if (fd < 0)
        return SF_ERR_NOT_FOUND;
    struct list_ctx c = {.prefix = prefix, .prefix_len = strlen(prefix)};
    char rel[1200];
    rel[0] = '\0';
    list_walk(&c, fd, rel, 0, 0);
    if (c.err != SF_OK) {
        struct mock_listing tmp = {c.entries, c.n};
        mock_listing_free(&tmp);
        return c.err;
    }
    if (c.n > 1)
        qsort(c.entries, c.n, sizeof(*c.entries), entry_cmp);
    out->entries = c.entries;
    out->n = c.n;
    return SF_OK;
}

void mock_listing_free(struct mock_listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->entries[i].key);
    free(l->entries);
    l->entries = NULL;
    l->n = 0;
}

void mock_format_iso8601(time_t t, char out[32])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
}

void mock_format_http_date(time_t t, char out[40])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    /* strftime's %a/%b follow the C locale, which the server never changes. */
    strftime(out, 40, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}
