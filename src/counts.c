/* Learned sample counts in the cache directory (src/counts.h). */
#include "src/counts.h"
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#define LOG_NAME "v1/counts.log"

struct sf__count_key sf__count_key_of(const char *url, const char *etag, unsigned long long size)
{
    XXH3_state_t st; /* on the stack: XXH_STATIC_LINKING_ONLY */
    char sz[32];
    int n = snprintf(sz, sizeof sz, "%llu", size);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, url, strlen(url) + 1);
    XXH3_128bits_update(&st, etag ? etag : "", strlen(etag ? etag : "") + 1);
    XXH3_128bits_update(&st, sz, (size_t)n);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    struct sf__count_key k = {h.high64, h.low64};
    return k;
}

static uint32_t line_check(struct sf__count_key k, uint64_t count)
{
    uint64_t w[3] = {k.hi, k.lo, count};
    return (uint32_t)XXH3_64bits(w, sizeof w);
}

static int key_cmp(const struct sf__count_key *a, const struct sf__count_key *b)
{
    if (a->hi != b->hi)
        return a->hi < b->hi ? -1 : 1;
    if (a->lo != b->lo)
        return a->lo < b->lo ? -1 : 1;
    return 0;
}

struct slot {
    struct sf__count_key key;
    size_t index;
};

static int slot_cmp(const void *a, const void *b)
{
    return key_cmp(&((const struct slot *)a)->key, &((const struct slot *)b)->key);
}

/* The longest record: 32 hex digits, ' ', a count of up to 20 digits, ' ',
 * 8 hex digits (the newline not counted). */
#define LINE_CHARS_MAX (32 + 1 + 20 + 1 + 8)

static int hex_field(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i], h;
        if (c >= '0' && c <= '9')
            h = c - '0';
        else if (c >= 'a' && c <= 'f')
            h = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            h = c - 'A' + 10;
        else
            return -1;
        v = v << 4 | (uint64_t)h;
    }
    *out = v;
    return 0;
}

/*
 * The record that ends the line s[0, n) (newline removed), read from its
 * end: a crash (or a full disk) mid-append leaves part of a line with no
 * newline, and the next append lands right after it, so a whole record is
 * always the end of its line and whatever precedes it is ignored. 0 when it
 * parses and its check agrees.
 */
static int parse_tail(const char *s, size_t n, struct sf__count_key *k, uint64_t *count)
{
    uint64_t check, hi, lo, v = 0;
    if (n < 32 + 1 + 1 + 1 + 8 || hex_field(s + n - 8, 8, &check) || s[n - 9] != ' ')
        return -1;
    size_t e = n - 9, b = e;
    while (b > 0 && e - b < 20 && s[b - 1] >= '0' && s[b - 1] <= '9')
        b--;
    if (b == e || b < 33 || s[b - 1] != ' ')
        return -1;
    for (size_t i = b; i < e; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (hex_field(s + b - 33, 16, &hi) || hex_field(s + b - 17, 16, &lo))
        return -1;
    k->hi = hi;
    k->lo = lo;
    if (line_check(*k, v) != (uint32_t)check)
        return -1;
    *count = v;
    return 0;
}

/* Appends p[0, n) to the line's tail, keeping its last LINE_CHARS_MAX bytes. */
static void tail_add(char *tail, size_t *tl, const char *p, size_t n)
{
    if (n >= LINE_CHARS_MAX) {
        memcpy(tail, p + n - LINE_CHARS_MAX, LINE_CHARS_MAX);
        *tl = LINE_CHARS_MAX;
        return;
    }
    if (*tl + n > LINE_CHARS_MAX) {
        size_t drop = *tl + n - LINE_CHARS_MAX;
        memmove(tail, tail + drop, *tl - drop);
        *tl -= drop;
    }
    memcpy(tail + *tl, p, n);
    *tl += n;
}

/* Sets the count of every key in sorted[0, n) equal to k. */
static void found_key(const struct slot *sorted, size_t n, struct sf__count_key k, uint64_t count,
                      uint64_t *counts, unsigned char *found)
{
    size_t a = 0, b = n;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        int c = key_cmp(&sorted[m].key, &k);
        if (c < 0)
            a = m + 1;
        else
            b = m;
    }
    /* Several shards may share a key only if they are the same object. */
    for (; a < n && key_cmp(&sorted[a].key, &k) == 0; a++) {
        counts[sorted[a].index] = count;
        found[sorted[a].index] = 1;
    }
}

sf_status sf__counts_lookup(const char *dir, const struct sf__count_key *keys, size_t n,
                            uint64_t *counts, unsigned char *found)
{
    if (!dir || n == 0)
        return SF_OK;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, LOG_NAME) >= (int)sizeof path)
        return SF_ERR_INVALID_ARGUMENT;
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT ? SF_OK : SF_ERR_IO;
    struct slot *sorted = malloc(n * sizeof *sorted);
    if (!sorted) {
        fclose(f);
        return SF_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        sorted[i].key = keys[i];
        sorted[i].index = i;
    }
    qsort(sorted, n, sizeof *sorted, slot_cmp);
    /* Physical lines of any length, each ending at a newline; only the
     * last LINE_CHARS_MAX bytes of one can hold its record. */
    char buf[16384], tail[LINE_CHARS_MAX];
    size_t tl = 0, got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        const char *p = buf, *end = buf + got;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            const char *q = nl ? nl : end;
            tail_add(tail, &tl, p, (size_t)(q - p));
            p = nl ? nl + 1 : end;
            if (!nl)
                break;
            struct sf__count_key k;
            uint64_t count;
            int ok = parse_tail(tail, tl, &k, &count) == 0;
            tl = 0;
            if (!ok)
                continue; /* torn, damaged or foreign */
            found_key(sorted, n, k, count, counts, found);
        }
    }
    int read_error = ferror(f);
    free(sorted);
    fclose(f);
    return read_error ? SF_ERR_IO : SF_OK;
}

sf_status sf__counts_append(const char *dir, struct sf__count_key key, uint64_t count)
{
    if (!dir)
        return SF_ERR_INVALID_ARGUMENT;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/v1", dir) >= (int)sizeof path)
        return SF_ERR_INVALID_ARGUMENT;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return SF_ERR_IO;
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return SF_ERR_IO;
    snprintf(path, sizeof path, "%s/%s", dir, LOG_NAME);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return SF_ERR_IO;
    char line[128];
    int len = snprintf(line, sizeof line, "%016" PRIx64 "%016" PRIx64 " %" PRIu64 " %08" PRIx32 "\n",
                       key.hi, key.lo, count, line_check(key, count));
    /* One write: appended whole or (crash, full disk) torn and ignored. */
    ssize_t w = write(fd, line, (size_t)len);
    int e = errno;
    close(fd);
    if (w != len)
        return e == ENOSPC ? SF_ERR_LIMIT : SF_ERR_IO;
    return SF_OK;
}

/* ------------------------------------------------------------ probe */

#include "shardfeed_shard.h"

static int is_remote(const char *url)
{
    return !strncmp(url, "s3://", 5) || !strncmp(url, "http://", 7) ||
           !strncmp(url, "https://", 8);
}

/* Reads bytes [0, len) of obj into buf. */
static sf_status read_head(struct sf_s3 *s3, const struct sf_object_info *obj, unsigned char *buf,
                           size_t len, char *err, size_t err_len)
{
    if (!is_remote(obj->url)) {
        const char *path = !strncmp(obj->url, "file://", 7) ? obj->url + 7 : obj->url;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(err, err_len, "%s: %s", path, strerror(errno));
            return sf__errno_status(errno);
        }
        size_t got = 0;
        while (got < len) {
            ssize_t r = pread(fd, buf + got, len - got, (off_t)got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        close(fd);
        if (got < len) {
            snprintf(err, err_len, "%s: short read at offset %zu", path, got);
            return SF_ERR_IO;
        }
        return SF_OK;
    }
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.buffer = buf;
    fo.buffer_bytes = len;
    fo.offset = 0;
    fo.length = len;
    fo.size = obj->size;
    if (obj->etag[0])
        fo.etag = obj->etag;
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(s3, obj->url, &fo, &f);
    if (st != SF_OK) {
        char m[512];
        sf_s3_errmsg(s3, m, sizeof m);
        snprintf(err, err_len, "%s: %s", obj->url, m[0] ? m : sf_status_str(st));
        return st;
    }
    struct sf_fetch_progress p;
    sf_fetch_wait(f, len, -1, &p);
    st = p.done && p.status != SF_OK ? p.status : SF_OK;
    if (st != SF_OK)
        snprintf(err, err_len, "%s", sf_fetch_errmsg(f));
    sf_fetch_destroy(f);
    return st;
}

sf_status sf__probe_bytes_per_sample(struct sf_s3 *s3, const struct sf_object_info *obj,
                                     double *bytes_per_sample, char *err, size_t err_len)
{
    unsigned long long size = obj->size;
    *bytes_per_sample = 0;
    if (size == SF_SIZE_UNKNOWN || size == 0) {
        *bytes_per_sample = 1;
        return SF_OK;
    }
    for (size_t window = 1u << 20;; window *= 4) {
        size_t len = size < window ? (size_t)size : window;
        unsigned char *buf = malloc(len);
        if (!buf)
            return SF_ERR_NO_MEMORY;
        sf_status st = read_head(s3, obj, buf, len, err, err_len);
        if (st != SF_OK) {
            free(buf);
            return st;
        }
        struct sf_shard_reader_options ro;
        sf_shard_reader_options_init_default(&ro);
        ro.name = obj->url;
        struct sf_shard_reader *r = NULL;
        st = sf_shard_reader_new(&ro, &r, err, err_len);
        if (st == SF_OK)
            st = sf_shard_reader_feed(r, buf, len, len == size ? size : SF_SIZE_UNKNOWN);
        unsigned long long n = 0, end = 0;
        while (st == SF_OK) {
            struct sf_sample s;
            enum sf_shard_event ev;
            st = sf_shard_reader_next(r, &s, &ev);
            if (st != SF_OK || ev != SF_SHARD_SAMPLE)
                break;
            n++;
            end = s.end;
        }
        if (st != SF_OK)
            snprintf(err, err_len, "%s", sf_shard_reader_errmsg(r));
        sf_shard_reader_destroy(r);
        free(buf);
        if (st != SF_OK)
            return st;
        if (len == size) {
            /* The whole shard: exact for it. */
            *bytes_per_sample = n ? (double)size / (double)n : (double)size;
            return SF_OK;
        }
        if (n >= 8 || window >= (16u << 20)) {
            *bytes_per_sample = n ? (double)end / (double)n : (double)size;
            return SF_OK;
        }
    }
}
