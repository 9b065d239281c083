/*
 * sf_pack(): a folder of files into tar or record shards plus index.json.
 *
 * Three steps: scan the source (every file becomes an entry with its key and
 * field, see include/shardfeed_pack.h), sort the entries by (key, field) and
 * group them into samples, then write the samples in that order into shards
 * of bounded size. Everything that decides bytes (order, tar header fields,
 * index.json) depends only on the files' names and contents, so the same
 * input gives byte-identical output. docs/pack.md explains the decisions.
 */
#include "shardfeed_pack.h"

#include "s3/endpoint.h"
#include "shardfeed.h"
#include "src/pack_reencode.h"
#include "src/record.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define DEFAULT_SHARD_BYTES (256ull << 20)
#define DEFAULT_MAX_FILES   (10ull * 1000 * 1000)
#define MAX_DEPTH           64
#define OUT_BUFFER_BYTES    (1u << 20)
#define TAR_BLOCK           512u
#define INDEX_NAME          "index.json"
#define INDEX_VERSION       1
#define MAX_ZSTD_LEVEL      22
#define DEFAULT_QUALITY     90
#define MIN_MAX_SIDE        16
/* Samples re-encoded ahead of the writer per thread: bounds the memory held. */
#define REENCODE_AHEAD      4

/* One source file. */
struct entry {
    char *rel;      /* path relative to the source, '/'-separated */
    size_t key_len; /* rel[0..key_len) is the sample key, rel[key_len] is the '.' */
    long cls;       /* ImageFolder label, -1 for FLAT */
    uint64_t size;  /* at scan time */
    /* --max-side: the re-encoded JPEG written instead of the file, or NULL */
    unsigned char *re;
    uint64_t re_size;
};

/* One sample: entries [first, first + n) of the sorted array. */
struct sample {
    size_t first, n;
    uint64_t bytes; /* what it adds to a shard (tar: headers + padded data) */
};

struct shard_info {
    char *name;
    uint64_t bytes;
    uint64_t samples;
    uint64_t xxh3;
};

/* The second thread of an s3:// pack: uploads one staged shard at a time. */
struct uploader {
    pthread_t thread;
    int started;
    struct sf_s3 *s3;
    struct sf_s3_upload_options upload;
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t cond;
    char *path; /* the staged shard being uploaded (unlinked after), NULL when idle */
    char *url;
    int quit;
    sf_status status; /* first failure */
    char err[1024];
    unsigned long long done;
};

struct packer {
    const struct sf_pack_options *o;
    const char *src; /* as given */
    char *err;
    size_t err_len;

    /* destination */
    int to_s3;
    char *dest_dir; /* local folder */
    char *dest_url; /* s3://bucket/prefix without a trailing '/' */
    const char *tmp_dir;

    /* scan */
    enum sf_pack_layout layout;
    char **classes;
    size_t n_classes;
    uint64_t *class_counts;
    struct entry *entries;
    size_t n_entries, cap_entries;
    unsigned long long ignored;
    uint64_t source_bytes;
    struct sample *samples;
    size_t n_samples;

    /* writing */
    struct shard_info *shards;
    size_t n_shards, cap_shards;
    unsigned long long files_done;
    uint64_t bytes_done;
    unsigned char *out; /* tar output buffer */
    size_t out_len;
    unsigned char *sample_buf; /* record: the current sample's files */
    size_t sample_cap;
    struct uploader up;
    unsigned long long local_done;
    struct reencoder *re; /* --max-side, else NULL */
};

/* ------------------------------------------------------------ errors */

__attribute__((format(printf, 3, 4))) static sf_status fail(struct packer *p, sf_status st,
                                                            const char *fmt, ...)
{
    /* the first failure is the one worth reporting */
    if (p->err && p->err_len && !p->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, p->err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

static sf_status errno_status(int e)
{
    return e == ENOENT ? SF_ERR_NOT_FOUND : e == ENOMEM ? SF_ERR_NO_MEMORY : SF_ERR_IO;
}

/* ------------------------------------------------------------ public helpers */

SF_API void sf_pack_options_init_default(struct sf_pack_options *o)
{
    memset(o, 0, sizeof(*o));
    o->format = SF_PACK_FORMAT_TAR;
    o->layout = SF_PACK_LAYOUT_AUTO;
    o->shard_bytes = DEFAULT_SHARD_BYTES;
}

SF_API const char *sf_pack_format_name(enum sf_pack_format format)
{
    switch (format) {
    case SF_PACK_FORMAT_TAR: return "tar";
    case SF_PACK_FORMAT_RECORD: return "record";
    }
    return "unknown";
}

SF_API const char *sf_pack_layout_name(enum sf_pack_layout layout)
{
    switch (layout) {
    case SF_PACK_LAYOUT_AUTO: return "auto";
    case SF_PACK_LAYOUT_IMAGEFOLDER: return "imagefolder";
    case SF_PACK_LAYOUT_FLAT: return "flat";
    }
    return "unknown";
}

/* ------------------------------------------------------------ small helpers */

static char *path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int slash = la > 0 && a[la - 1] != '/';
    char *s = malloc(la + (size_t)slash + lb + 1);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    if (slash)
        s[la] = '/';
    memcpy(s + la + (size_t)slash, b, lb + 1);
    return s;
}

static int is_hidden(const char *name)
{
    return name[0] == '.';
}

static uint64_t pad512(uint64_t n)
{
    return (n + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
}

static const char *field_of(const struct entry *e)
{
    return e->rel + e->key_len + 1;
}

/* The bytes an entry puts in a shard: its file's, or its re-encoded JPEG's. */
static uint64_t entry_size(const struct entry *e)
{
    return e->re ? e->re_size : e->size;
}

static int is_jpeg_field(const struct entry *e)
{
    const char *f = field_of(e);
    return !strcasecmp(f, "jpg") || !strcasecmp(f, "jpeg");
}

/*
 * Name patterns: exactly one %u / %0Nu / %Nu / %d (N <= 20) and %% for '%'.
 * Checked here rather than handed to printf, so a user's pattern can never be
 * a format string.
 */
static int pattern_expand(const char *pat, unsigned long long idx, char *out, size_t n)
{
    size_t o = 0;
    int convs = 0;
    for (const char *c = pat; *c; c++) {
        char piece[32];
        size_t plen;
        if (*c != '%') {
            piece[0] = *c;
            plen = 1;
        } else if (c[1] == '%') {
            piece[0] = '%';
            plen = 1;
            c++;
        } else {
            const char *d = c + 1;
            int zero = *d == '0';
            if (zero)
                d++;
            unsigned width = 0;
            while (*d >= '0' && *d <= '9') {
                width = width * 10 + (unsigned)(*d - '0');
                if (width > 20)
                    return -1;
                d++;
            }
            if (*d != 'u' && *d != 'd')
                return -1;
            if (zero)
                snprintf(piece, sizeof(piece), "%0*llu", (int)width, idx);
            else
                snprintf(piece, sizeof(piece), "%*llu", (int)width, idx);
            plen = strlen(piece);
            convs++;
            c = d;
        }
        if (o + plen + 1 > n)
            return -1;
        memcpy(out + o, piece, plen);
        o += plen;
    }
    out[o] = '\0';
    return convs == 1 ? 0 : -1;
}

static const char *default_pattern(enum sf_pack_format format)
{
    return format == SF_PACK_FORMAT_RECORD ? "shard-%06u.sfr" : "shard-%06u.tar";
}

SF_API sf_status sf_pack_shard_name(const char *pattern, enum sf_pack_format format,
                                    unsigned long long index, char *out, size_t n)
{
    if (!out || !n)
        return SF_ERR_INVALID_ARGUMENT;
    out[0] = '\0';
    const char *pat = pattern ? pattern : default_pattern(format);
    char name[NAME_MAX + 1];
    if (!*pat || strchr(pat, '/') || pattern_expand(pat, index, name, sizeof(name)) != 0)
        return SF_ERR_INVALID_ARGUMENT;
    if (name[0] == '.' || !strcmp(name, INDEX_NAME))
        return SF_ERR_INVALID_ARGUMENT;
    if (strlen(name) >= n)
        return SF_ERR_LIMIT;
    memcpy(out, name, strlen(name) + 1);
    return SF_OK;
}

static sf_status check_pattern(struct packer *p, const char *pat)
{
    char name[NAME_MAX + 1];
    if (sf_pack_shard_name(pat, p->o->format, 0, name, sizeof(name)) != SF_OK)
        return fail(p, SF_ERR_INVALID_ARGUMENT,
                    "name pattern '%s': expected one %%u (or %%06u, %%d) for the shard number, "
                    "%%%% for '%%', no '/', not starting with '.', not " INDEX_NAME,
                    pat);
    return SF_OK;
}

/* mkdir -p */
static sf_status make_dirs(struct packer *p, const char *path)
{
    char *s = strdup(path);
    if (!s)
        return SF_ERR_NO_MEMORY;
    sf_status st = SF_OK;
    for (char *c = s + 1;; c++) {
        if (*c != '/' && *c != '\0')
            continue;
        char saved = *c;
        *c = '\0';
        if (mkdir(s, 0755) != 0 && errno != EEXIST) {
            st = fail(p, errno_status(errno), "%s: cannot create the folder: %s", s,
                      strerror(errno));
            break;
        }
        *c = saved;
        if (!saved)
            break;
    }
    free(s);
    if (st == SF_OK) {
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            st = fail(p, SF_ERR_INVALID_ARGUMENT, "%s: not a folder", path);
    }
    return st;
}

/* ------------------------------------------------------------ scan */

static sf_status add_entry(struct packer *p, const char *rel, uint64_t size, long cls)
{
    unsigned long long max = p->o->max_files ? p->o->max_files : DEFAULT_MAX_FILES;
    if (p->n_entries >= max)
        return fail(p, SF_ERR_LIMIT, "%s: more than %llu files (max_files)", p->src, max);
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    const char *dot = strchr(base, '.');
    if (!dot)
        return fail(p, SF_ERR_INVALID_ARGUMENT,
                    "%s/%s: no extension: a file's extension names its field in the sample "
                    "(WebDataset rule), rename or remove it",
                    p->src, rel);
    if (!dot[1])
        return fail(p, SF_ERR_INVALID_ARGUMENT,
                    "%s/%s: ends with '.': the field name after the key would be empty", p->src,
                    rel);
    size_t key_len = (size_t)(dot - rel);
    if (key_len > SF__RECORD_MAX_KEY_BYTES)
        return fail(p, SF_ERR_LIMIT, "%s/%s: the sample key is longer than %u bytes", p->src, rel,
                    SF__RECORD_MAX_KEY_BYTES);
    if (strlen(dot + 1) > SF__RECORD_MAX_NAME_BYTES)
        return fail(p, SF_ERR_LIMIT, "%s/%s: the field name is longer than %u bytes", p->src, rel,
                    SF__RECORD_MAX_NAME_BYTES);
    if (p->n_entries == p->cap_entries) {
        size_t cap = p->cap_entries ? p->cap_entries * 2 : 1024;
        struct entry *e = realloc(p->entries, cap * sizeof(*e));
        if (!e)
            return SF_ERR_NO_MEMORY;
        p->entries = e;
        p->cap_entries = cap;
    }
    char *copy = strdup(rel);
    if (!copy)
        return SF_ERR_NO_MEMORY;
    p->entries[p->n_entries++] = (struct entry){copy, key_len, cls, size, NULL, 0};
    p->source_bytes += size;
    return SF_OK;
}

/* lstat (or stat when links are followed); a link is an error otherwise. */
static sf_status stat_entry(struct packer *p, const char *abs, struct stat *sb)
{
    if (lstat(abs, sb) != 0)
        return fail(p, errno_status(errno), "%s: %s", abs, strerror(errno));
    if (S_ISLNK(sb->st_mode)) {
        if (!p->o->follow_symlinks)
            return fail(p, SF_ERR_INVALID_ARGUMENT,
                        "%s: a symbolic link: not followed unless asked (follow_symlinks, "
                        "--follow-symlinks)",
                        abs);
        if (stat(abs, sb) != 0)
            return fail(p, errno_status(errno), "%s: a symbolic link to nowhere: %s", abs,
                        strerror(errno));
    }
    if (!S_ISREG(sb->st_mode) && !S_ISDIR(sb->st_mode))
        return fail(p, SF_ERR_INVALID_ARGUMENT,
                    "%s: neither a regular file nor a folder (device, FIFO or socket)", abs);
    return SF_OK;
}

static sf_status walk(struct packer *p, const char *abs, const char *rel, int depth, long cls)
{
    if (depth > MAX_DEPTH)
        return fail(p, SF_ERR_LIMIT, "%s: folders nested more than %d deep (a link loop?)", abs,
                    MAX_DEPTH);
    DIR *d = opendir(abs);
    if (!d)
        return fail(p, errno_status(errno), "%s: cannot read the folder: %s", abs, strerror(errno));
    sf_status st = SF_OK;
    struct dirent *de;
    errno = 0;
    while (st == SF_OK && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (is_hidden(de->d_name)) {
            p->ignored++;
            continue;
        }
        char *child = path_join(abs, de->d_name);
        char *child_rel = *rel ? path_join(rel, de->d_name) : strdup(de->d_name);
        struct stat sb;
        if (!child || !child_rel)
            st = SF_ERR_NO_MEMORY;
        else if ((st = stat_entry(p, child, &sb)) != SF_OK)
            ;
        else if (S_ISDIR(sb.st_mode))
            st = walk(p, child, child_rel, depth + 1, cls);
        else
            st = add_entry(p, child_rel, (uint64_t)sb.st_size, cls);
        free(child);
        free(child_rel);
        errno = 0;
    }
    if (st == SF_OK && errno)
        st = fail(p, SF_ERR_IO, "%s: reading the folder: %s", abs, strerror(errno));
    closedir(d);
    return st;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static sf_status check_src(struct packer *p)
{
    struct stat sb;
    if (stat(p->src, &sb) != 0)
        return fail(p, errno_status(errno), "%s: %s", p->src, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return fail(p, SF_ERR_INVALID_ARGUMENT, "%s: not a folder", p->src);
    return SF_OK;
}

static sf_status scan(struct packer *p)
{
    struct stat sb;
    /* the top level decides the layout and, for ImageFolder, the classes */
    DIR *d = opendir(p->src);
    if (!d)
        return fail(p, errno_status(errno), "%s: cannot read the folder: %s", p->src,
                    strerror(errno));
    char **dirs = NULL, *first_file = NULL;
    size_t n_dirs = 0, cap = 0, n_files = 0;
    sf_status st = SF_OK;
    struct dirent *de;
    while (st == SF_OK && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || is_hidden(de->d_name))
            continue;
        char *abs = path_join(p->src, de->d_name);
        if (!abs) {
            st = SF_ERR_NO_MEMORY;
            break;
        }
        st = stat_entry(p, abs, &sb);
        free(abs);
        if (st != SF_OK)
            break;
        if (S_ISDIR(sb.st_mode)) {
            if (n_dirs == cap) {
                cap = cap ? cap * 2 : 64;
                char **v = realloc(dirs, cap * sizeof(*v));
                if (!v) {
                    st = SF_ERR_NO_MEMORY;
                    break;
                }
                dirs = v;
            }
            if (!(dirs[n_dirs] = strdup(de->d_name))) {
                st = SF_ERR_NO_MEMORY;
                break;
            }
            n_dirs++;
        } else if (n_files++ == 0) {
            first_file = strdup(de->d_name);
        }
    }
    closedir(d);
    enum sf_pack_layout layout = p->o->layout;
    if (st == SF_OK && layout == SF_PACK_LAYOUT_AUTO)
        layout = n_dirs > 0 && n_files == 0 ? SF_PACK_LAYOUT_IMAGEFOLDER : SF_PACK_LAYOUT_FLAT;
    p->layout = layout;
    if (st == SF_OK && layout == SF_PACK_LAYOUT_IMAGEFOLDER) {
        if (n_files > 0) {
            st = fail(p, SF_ERR_INVALID_ARGUMENT,
                      "%s/%s: a file at the top of an ImageFolder tree (every file must be in a "
                      "class folder; use the flat layout for other trees)",
                      p->src, first_file ? first_file : "?");
        } else {
            qsort(dirs, n_dirs, sizeof(*dirs), cmp_str);
            p->classes = dirs;
            p->n_classes = n_dirs;
            dirs = NULL;
            p->class_counts = calloc(n_dirs ? n_dirs : 1, sizeof(*p->class_counts));
            if (!p->class_counts)
                st = SF_ERR_NO_MEMORY;
            for (size_t i = 0; st == SF_OK && i < p->n_classes; i++) {
                char *abs = path_join(p->src, p->classes[i]);
                st = abs ? walk(p, abs, p->classes[i], 1, (long)i) : SF_ERR_NO_MEMORY;
                free(abs);
            }
        }
    } else if (st == SF_OK) {
        st = walk(p, p->src, "", 0, -1);
    }
    for (size_t i = 0; dirs && i < n_dirs; i++)
        free(dirs[i]);
    free(dirs);
    free(first_file);
    if (st == SF_OK && p->n_entries == 0)
        st = fail(p, SF_ERR_NOT_FOUND, "%s: no files to pack", p->src);
    return st;
}

/* ------------------------------------------------------------ samples */

static int cmp_entry(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->rel, y->rel, n);
    if (c)
        return c;
    if (x->key_len != y->key_len)
        return x->key_len < y->key_len ? -1 : 1;
    return strcmp(field_of(x), field_of(y));
}

/* ustar holds names up to 100 bytes, or 255 split at a '/' into prefix and name. */
static int ustar_split(const char *name, size_t len, size_t *prefix_len)
{
    if (len <= 100) {
        *prefix_len = 0;
        return 1;
    }
    for (size_t i = len - 1; i > 0; i--) {
        if (name[i] != '/')
            continue;
        if (i > 155)
            continue;
        if (len - i - 1 > 100 || len - i - 1 == 0)
            return 0; /* later slashes only make the name part longer */
        *prefix_len = i;
        return 1;
    }
    return 0;
}

static size_t decimal_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* One pax record "<len> <kw>=<value>\n": its length, which counts itself. */
static size_t pax_record_len(size_t kw_len, size_t value_len)
{
    size_t body = 1 + kw_len + 1 + value_len + 1;
    size_t len = body + 1;
    while (decimal_len(len) + body != len)
        len = decimal_len(len) + body;
    return len;
}

#define TAR_MAX_OCTAL_SIZE 077777777777ull /* 11 octal digits */

/* Bytes of the pax header data a member needs: 0 when ustar holds it. */
static size_t pax_bytes(const char *name, size_t name_len, uint64_t size)
{
    size_t prefix_len, n = 0;
    if (!ustar_split(name, name_len, &prefix_len))
        n += pax_record_len(4, name_len);
    if (size > TAR_MAX_OCTAL_SIZE)
        n += pax_record_len(4, decimal_len(size));
    return n;
}

/* Bytes one tar member adds: pax header and data when needed, header, data. */
static uint64_t tar_member_bytes(const char *name, size_t name_len, uint64_t size)
{
    size_t pax = pax_bytes(name, name_len, size);
    return (pax ? TAR_BLOCK + pad512(pax) : 0) + TAR_BLOCK + pad512(size);
}

static int label_text(long cls, char *out, size_t n)
{
    return snprintf(out, n, "%ld", cls);
}

/* What a sample adds to a shard (tar: headers + padded data). */
static uint64_t sample_bytes(const struct packer *p, const struct sample *smp)
{
    const struct entry *e = &p->entries[smp->first];
    uint64_t bytes = 0;
    for (size_t a = smp->first; a < smp->first + smp->n; a++) {
        const struct entry *x = &p->entries[a];
        if (p->o->format == SF_PACK_FORMAT_TAR)
            bytes += tar_member_bytes(x->rel, strlen(x->rel), entry_size(x));
        else
            bytes += SF__RECORD_FIELD_DESC_BYTES + strlen(field_of(x)) + entry_size(x);
    }
    if (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER) {
        char label[32];
        size_t ll = (size_t)label_text(e->cls, label, sizeof(label));
        if (p->o->format == SF_PACK_FORMAT_TAR)
            bytes += tar_member_bytes(e->rel, e->key_len + 4, ll);
        else
            bytes += SF__RECORD_FIELD_DESC_BYTES + 3 + ll;
    }
    if (p->o->format == SF_PACK_FORMAT_RECORD)
        bytes += SF__RECORD_REC_HEADER_BYTES + 8 + e->key_len + SF__RECORD_INDEX_ENTRY_BYTES;
    return bytes;
}

static sf_status group_samples(struct packer *p)
{
    qsort(p->entries, p->n_entries, sizeof(*p->entries), cmp_entry);
    p->samples = calloc(p->n_entries, sizeof(*p->samples));
    if (!p->samples)
        return SF_ERR_NO_MEMORY;
    int imagefolder = p->layout == SF_PACK_LAYOUT_IMAGEFOLDER;
    for (size_t i = 0; i < p->n_entries;) {
        size_t j = i + 1;
        const struct entry *e = &p->entries[i];
        while (j < p->n_entries && p->entries[j].key_len == e->key_len &&
               !memcmp(p->entries[j].rel, e->rel, e->key_len))
            j++;
        struct sample *s = &p->samples[p->n_samples++];
        s->first = i;
        s->n = j - i;
        /* readers lower-case tar field names, and records are written lower-case */
        for (size_t a = i; a < j; a++) {
            const char *fa = field_of(&p->entries[a]);
            if (imagefolder && !strcasecmp(fa, "cls"))
                return fail(p, SF_ERR_INVALID_ARGUMENT,
                            "%s/%s: an ImageFolder sample's 'cls' field holds its label; "
                            "rename this file",
                            p->src, p->entries[a].rel);
            for (size_t b = a + 1; b < j; b++)
                if (!strcasecmp(fa, field_of(&p->entries[b])))
                    return fail(p, SF_ERR_INVALID_ARGUMENT,
                                "%s/%s and %s/%s: the same field '%s' twice in sample '%.*s' "
                                "(field names are compared without case)",
                                p->src, p->entries[a].rel, p->src, p->entries[b].rel, fa,
                                (int)e->key_len, e->rel);
        }
        if (imagefolder)
            p->class_counts[e->cls]++;
        s->bytes = sample_bytes(p, s);
        i = j;
    }
    return SF_OK;
}

/* ------------------------------------------------------------ uploads */

static void *upload_main(void *arg)
{
    struct uploader *u = arg;
    pthread_mutex_lock(&u->lock);
    for (;;) {
        while (!u->path && !u->quit)
            pthread_cond_wait(&u->cond, &u->lock);
        if (!u->path)
            break;
        char *path = u->path, *url = u->url;
        pthread_mutex_unlock(&u->lock);
        char etag[128];
        sf_status st = sf_s3_upload_file(u->s3, url, path, &u->upload, etag, sizeof(etag));
        char msg[1024] = "";
        if (st != SF_OK)
            sf_s3_errmsg(u->s3, msg, sizeof(msg));
        unlink(path);
        pthread_mutex_lock(&u->lock);
        if (st != SF_OK && u->status == SF_OK) {
            u->status = st;
            snprintf(u->err, sizeof(u->err), "%s", msg[0] ? msg : sf_status_str(st));
        }
        if (st == SF_OK)
            u->done++;
        free(u->path);
        free(u->url);
        u->path = u->url = NULL;
        pthread_cond_broadcast(&u->cond);
    }
    pthread_mutex_unlock(&u->lock);
    return NULL;
}

static sf_status uploader_start(struct packer *p)
{
    struct uploader *u = &p->up;
    u->s3 = p->o->s3;
    sf_s3_upload_options_init_default(&u->upload);
    if (p->o->part_bytes)
        u->upload.part_bytes = p->o->part_bytes;
    pthread_mutex_init(&u->lock, NULL);
    pthread_cond_init(&u->cond, NULL);
    if (pthread_create(&u->thread, NULL, upload_main, u) != 0) {
        pthread_cond_destroy(&u->cond);
        pthread_mutex_destroy(&u->lock);
        return fail(p, SF_ERR_NO_MEMORY, "cannot start the upload thread");
    }
    u->started = 1;
    return SF_OK;
}

/* Waits until the uploader is idle; returns its first failure. */
static sf_status uploader_wait(struct packer *p)
{
    struct uploader *u = &p->up;
    pthread_mutex_lock(&u->lock);
    while (u->path)
        pthread_cond_wait(&u->cond, &u->lock);
    sf_status st = u->status;
    if (st != SF_OK)
        fail(p, st, "%s", u->err);
    pthread_mutex_unlock(&u->lock);
    return st;
}

/* Hands path (taken) over for upload to url (taken) once the previous one is done. */
static sf_status uploader_submit(struct packer *p, char *path, char *url)
{
    sf_status st = uploader_wait(p);
    if (st != SF_OK) {
        unlink(path);
        free(path);
        free(url);
        return st;
    }
    struct uploader *u = &p->up;
    pthread_mutex_lock(&u->lock);
    u->path = path;
    u->url = url;
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->lock);
    return SF_OK;
}

static void uploader_stop(struct packer *p)
{
    struct uploader *u = &p->up;
    if (!u->started)
        return;
    pthread_mutex_lock(&u->lock);
    while (u->path)
        pthread_cond_wait(&u->cond, &u->lock);
    u->quit = 1;
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->lock);
    pthread_join(u->thread, NULL);
    pthread_cond_destroy(&u->cond);
    pthread_mutex_destroy(&u->lock);
    u->started = 0;
}

static unsigned long long shards_done(struct packer *p)
{
    if (!p->to_s3)
        return p->local_done;
    if (!p->up.started)
        return p->up.done; /* the thread is gone */
    pthread_mutex_lock(&p->up.lock);
    unsigned long long n = p->up.done;
    pthread_mutex_unlock(&p->up.lock);
    return n;
}

static sf_status report(struct packer *p)
{
    if (!p->o->progress)
        return SF_OK;
    struct sf_pack_progress pr = {
        .bytes_done = p->bytes_done,
        .bytes_total = p->source_bytes,
        .files_done = p->files_done,
        .files_total = p->n_entries,
        .shards_done = shards_done(p),
    };
    if (p->o->progress(p->o->progress_user, &pr) != 0)
        return fail(p, SF_ERR_CANCELLED, "cancelled by the progress callback");
    return SF_OK;
}

/* ------------------------------------------------------------ shard files */

struct shard {
    char name[NAME_MAX + 1];
    char *tmp_path;
    int fd;
    uint64_t bytes; /* bytes so far (tar: flushed + buffered) */
    uint64_t samples;
    XXH3_state_t *xx; /* tar: hashed as written */
    struct sf__record_writer *rw;
};

static sf_status write_all(struct packer *p, struct shard *s, const void *data, size_t n)
{
    const unsigned char *c = data;
    while (n > 0) {
        ssize_t w = write(s->fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return fail(p, SF_ERR_IO, "%s: write: %s", s->tmp_path,
                        w < 0 ? strerror(errno) : "no progress");
        c += w;
        n -= (size_t)w;
    }
    return SF_OK;
}

static sf_status out_flush(struct packer *p, struct shard *s)
{
    if (!p->out_len)
        return SF_OK;
    XXH3_64bits_update(s->xx, p->out, p->out_len);
    sf_status st = write_all(p, s, p->out, p->out_len);
    p->out_len = 0;
    return st;
}

static sf_status out_put(struct packer *p, struct shard *s, const void *data, size_t n)
{
    const unsigned char *c = data;
    while (n > 0) {
        if (p->out_len == OUT_BUFFER_BYTES) {
            sf_status st = out_flush(p, s);
            if (st != SF_OK)
                return st;
        }
        size_t k = OUT_BUFFER_BYTES - p->out_len;
        if (k > n)
            k = n;
        memcpy(p->out + p->out_len, c, k);
        p->out_len += k;
        c += k;
        n -= k;
        s->bytes += k;
    }
    return SF_OK;
}

static sf_status out_zeros(struct packer *p, struct shard *s, size_t n)
{
    static const unsigned char zeros[TAR_BLOCK];
    while (n > 0) {
        size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
        sf_status st = out_put(p, s, zeros, k);
        if (st != SF_OK)
            return st;
        n -= k;
    }
    return SF_OK;
}

static sf_status shard_open(struct packer *p, struct shard *s, size_t index)
{
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    if (sf_pack_shard_name(p->o->name_pattern, p->o->format, index, s->name, sizeof(s->name)) !=
        SF_OK)
        return fail(p, SF_ERR_INVALID_ARGUMENT, "shard %zu: no valid name from the pattern", index);
    if (p->to_s3) {
        size_t n = strlen(p->tmp_dir) + 64;
        s->tmp_path = malloc(n);
        if (!s->tmp_path)
            return SF_ERR_NO_MEMORY;
        snprintf(s->tmp_path, n, "%s/sfpack-%ld-XXXXXX", p->tmp_dir, (long)getpid());
        s->fd = mkostemp(s->tmp_path, O_CLOEXEC);
        if (s->fd >= 0)
            fchmod(s->fd, 0644);
    } else {
        size_t n = strlen(p->dest_dir) + strlen(s->name) + 64;
        s->tmp_path = malloc(n);
        if (!s->tmp_path)
            return SF_ERR_NO_MEMORY;
        snprintf(s->tmp_path, n, "%s/.%s.sfpack-%ld", p->dest_dir, s->name, (long)getpid());
        s->fd = open(s->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (s->fd < 0)
        return fail(p, errno_status(errno), "%s: cannot create: %s", s->tmp_path, strerror(errno));
    if (p->o->format == SF_PACK_FORMAT_TAR) {
        s->xx = XXH3_createState();
        if (!s->xx || XXH3_64bits_reset(s->xx) != XXH_OK)
            return SF_ERR_NO_MEMORY;
        p->out_len = 0;
        return SF_OK;
    }
    struct sf__record_writer_options wo;
    sf__record_writer_options_init_default(&wo);
    wo.fd = s->fd;
    wo.zstd_level = p->o->zstd_level;
    char err[512] = "";
    sf_status st = sf__record_writer_new(&wo, &s->rw, err, sizeof(err));
    if (st != SF_OK)
        return fail(p, st, "%s: %s", s->tmp_path, err[0] ? err : sf_status_str(st));
    s->bytes = sf__record_writer_bytes(s->rw);
    return SF_OK;
}

/* Frees what shard_open made; removes the temporary file unless it was handed on. */
static void shard_discard(struct shard *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->tmp_path) {
        unlink(s->tmp_path);
        free(s->tmp_path);
        s->tmp_path = NULL;
    }
    XXH3_freeState(s->xx);
    s->xx = NULL;
    sf__record_writer_destroy(s->rw);
    s->rw = NULL;
}

/* XXH3-64 of the whole file, read back (record shards are written by the record writer). */
static sf_status hash_file(struct packer *p, struct shard *s, uint64_t *out)
{
    XXH3_state_t *xx = XXH3_createState();
    if (!xx || XXH3_64bits_reset(xx) != XXH_OK) {
        XXH3_freeState(xx);
        return SF_ERR_NO_MEMORY;
    }
    sf_status st = SF_OK;
    uint64_t off = 0;
    for (;;) {
        ssize_t r = pread(s->fd, p->out, OUT_BUFFER_BYTES, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = fail(p, SF_ERR_IO, "%s: read back: %s", s->tmp_path, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        XXH3_64bits_update(xx, p->out, (size_t)r);
        off += (uint64_t)r;
    }
    if (st == SF_OK && off != s->bytes)
        st = fail(p, SF_ERR_IO, "%s: %" PRIu64 " bytes on disk, %" PRIu64 " written", s->tmp_path,
                  off, s->bytes);
    *out = XXH3_64bits_digest(xx);
    XXH3_freeState(xx);
    return st;
}

static char *object_url(struct packer *p, const char *name)
{
    return path_join(p->dest_url, name);
}

/* Ends the archive or index, then renames into place or hands over for upload. */
static sf_status shard_close(struct packer *p, struct shard *s)
{
    sf_status st = SF_OK;
    uint64_t xxh3 = 0;
    if (p->o->format == SF_PACK_FORMAT_TAR) {
        st = out_zeros(p, s, 2 * TAR_BLOCK);
        if (st == SF_OK)
            st = out_flush(p, s);
        xxh3 = XXH3_64bits_digest(s->xx);
    } else {
        st = sf__record_writer_finish(s->rw);
        if (st != SF_OK)
            fail(p, st, "%s: %s", s->tmp_path, sf__record_writer_errmsg(s->rw));
        else {
            s->bytes = sf__record_writer_bytes(s->rw);
            st = hash_file(p, s, &xxh3);
        }
    }
    if (st != SF_OK)
        return st;
    if (close(s->fd) != 0) {
        s->fd = -1;
        return fail(p, SF_ERR_IO, "%s: close: %s", s->tmp_path, strerror(errno));
    }
    s->fd = -1;
    if (p->n_shards == p->cap_shards) {
        size_t cap = p->cap_shards ? p->cap_shards * 2 : 16;
        struct shard_info *v = realloc(p->shards, cap * sizeof(*v));
        if (!v)
            return SF_ERR_NO_MEMORY;
        p->shards = v;
        p->cap_shards = cap;
    }
    struct shard_info *info = &p->shards[p->n_shards];
    info->name = strdup(s->name);
    if (!info->name)
        return SF_ERR_NO_MEMORY;
    info->bytes = s->bytes;
    info->samples = s->samples;
    info->xxh3 = xxh3;
    p->n_shards++;
    if (p->to_s3) {
        char *url = object_url(p, s->name);
        if (!url)
            return SF_ERR_NO_MEMORY;
        char *path = s->tmp_path;
        s->tmp_path = NULL;
        return uploader_submit(p, path, url);
    }
    char *final = path_join(p->dest_dir, s->name);
    if (!final)
        return SF_ERR_NO_MEMORY;
    if (rename(s->tmp_path, final) != 0)
        st = fail(p, SF_ERR_IO, "%s: cannot rename into place: %s", final, strerror(errno));
    else {
        free(s->tmp_path);
        s->tmp_path = NULL;
        p->local_done++;
    }
    free(final);
    return st;
}

/* ------------------------------------------------------------ tar members */

static void octal(char *field, size_t width, uint64_t v)
{
    /* width-1 digits, zero-padded, then NUL */
    field[width - 1] = '\0';
    for (size_t i = width - 1; i > 0; i--) {
        field[i - 1] = (char)('0' + (v & 7));
        v >>= 3;
    }
}

static void tar_header(unsigned char h[TAR_BLOCK], const char *name, size_t name_len, uint64_t size,
                       char type)
{
    memset(h, 0, TAR_BLOCK);
    size_t prefix_len;
    if (ustar_split(name, name_len, &prefix_len)) {
        if (prefix_len) {
            memcpy(h + 345, name, prefix_len);
            memcpy(h, name + prefix_len + 1, name_len - prefix_len - 1);
        } else {
            memcpy(h, name, name_len);
        }
    } else {
        /* the pax header before carries the whole path */
        memcpy(h, name, 100);
    }
    octal((char *)h + 100, 8, 0644);
    octal((char *)h + 108, 8, 0);
    octal((char *)h + 116, 8, 0);
    octal((char *)h + 124, 12, size > TAR_MAX_OCTAL_SIZE ? 0 : size);
    octal((char *)h + 136, 12, 0); /* mtime 0: output depends on content only */
    h[156] = (unsigned char)type;
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    octal((char *)h + 329, 8, 0);
    octal((char *)h + 337, 8, 0);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < TAR_BLOCK; i++)
        sum += h[i];
    octal((char *)h + 148, 7, sum);
    h[155] = ' ';
}

static sf_status pax_put_record(struct packer *p, struct shard *s, const char *kw,
                                const char *value, size_t value_len)
{
    size_t len = pax_record_len(strlen(kw), value_len);
    char head[64];
    int n = snprintf(head, sizeof(head), "%zu %s=", len, kw);
    sf_status st = out_put(p, s, head, (size_t)n);
    if (st == SF_OK)
        st = out_put(p, s, value, value_len);
    if (st == SF_OK)
        st = out_put(p, s, "\n", 1);
    return st;
}

/* The headers of one member (a pax header first when ustar cannot hold it). */
static sf_status tar_member_start(struct packer *p, struct shard *s, const char *name,
                                  size_t name_len, uint64_t size)
{
    unsigned char h[TAR_BLOCK];
    size_t prefix_len;
    int long_name = !ustar_split(name, name_len, &prefix_len);
    int big = size > TAR_MAX_OCTAL_SIZE;
    sf_status st = SF_OK;
    if (long_name || big) {
        size_t pax = pax_bytes(name, name_len, size);
        /* a fixed name keeps the output deterministic */
        tar_header(h, "././@PaxHeader", 14, pax, 'x');
        st = out_put(p, s, h, TAR_BLOCK);
        if (st == SF_OK && long_name)
            st = pax_put_record(p, s, "path", name, name_len);
        if (st == SF_OK && big) {
            char v[32];
            snprintf(v, sizeof(v), "%" PRIu64, size);
            st = pax_put_record(p, s, "size", v, strlen(v));
        }
        if (st == SF_OK)
            st = out_zeros(p, s, (size_t)(pad512(pax) - pax));
    }
    if (st != SF_OK)
        return st;
    tar_header(h, name, name_len, size, '0');
    return out_put(p, s, h, TAR_BLOCK);
}

/* Opens a source file and checks it is still the size the scan saw. */
static sf_status open_source(struct packer *p, const struct entry *e, char **abs_out, int *fd_out)
{
    char *abs = path_join(p->src, e->rel);
    if (!abs)
        return SF_ERR_NO_MEMORY;
    *abs_out = abs;
    int fd = open(abs, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int er = errno;
        if (fd >= 0)
            close(fd);
        return fail(p, errno_status(er), "%s: cannot read: %s", abs, strerror(er));
    }
    if ((uint64_t)sb.st_size != e->size) {
        close(fd);
        return fail(p, SF_ERR_CHANGED,
                    "%s: changed while packing (%" PRIu64 " bytes when scanned, %lld now)", abs,
                    e->size, (long long)sb.st_size);
    }
    *fd_out = fd;
    return SF_OK;
}

static sf_status read_exact(struct packer *p, int fd, const char *abs, unsigned char *dst, size_t n,
                            uint64_t at)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, dst + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return fail(p, SF_ERR_IO, "%s: read at offset %" PRIu64 ": %s", abs, at + got,
                        strerror(errno));
        if (r == 0)
            return fail(p, SF_ERR_CHANGED, "%s: shrank while packing (at offset %" PRIu64 ")", abs,
                        at + got);
        got += (size_t)r;
    }
    return SF_OK;
}

/* A file's bytes straight into the output buffer, then its padding. */
static sf_status tar_file(struct packer *p, struct shard *s, const struct entry *e)
{
    if (e->re) {
        sf_status st = tar_member_start(p, s, e->rel, strlen(e->rel), e->re_size);
        if (st == SF_OK)
            st = out_put(p, s, e->re, (size_t)e->re_size);
        if (st == SF_OK)
            st = out_zeros(p, s, (size_t)(pad512(e->re_size) - e->re_size));
        return st;
    }
    char *abs = NULL;
    int fd = -1;
    sf_status st = open_source(p, e, &abs, &fd);
    if (st == SF_OK)
        st = tar_member_start(p, s, e->rel, strlen(e->rel), e->size);
    uint64_t done = 0;
    while (st == SF_OK && done < e->size) {
        if (p->out_len == OUT_BUFFER_BYTES && (st = out_flush(p, s)) != SF_OK)
            break;
        size_t k = OUT_BUFFER_BYTES - p->out_len;
        if (k > e->size - done)
            k = (size_t)(e->size - done);
        st = read_exact(p, fd, abs, p->out + p->out_len, k, done);
        p->out_len += k;
        s->bytes += k;
        done += k;
    }
    if (st == SF_OK)
        st = out_zeros(p, s, (size_t)(pad512(e->size) - e->size));
    if (fd >= 0)
        close(fd);
    free(abs);
    return st;
}

static sf_status tar_sample(struct packer *p, struct shard *s, const struct sample *smp)
{
    sf_status st = SF_OK;
    for (size_t i = 0; st == SF_OK && i < smp->n; i++) {
        st = tar_file(p, s, &p->entries[smp->first + i]);
        if (st == SF_OK) {
            p->files_done++;
            p->bytes_done += p->entries[smp->first + i].size;
        }
    }
    const struct entry *e = &p->entries[smp->first];
    if (st == SF_OK && p->layout == SF_PACK_LAYOUT_IMAGEFOLDER) {
        char label[32], name[SF__RECORD_MAX_KEY_BYTES + 8];
        size_t ll = (size_t)label_text(e->cls, label, sizeof(label));
        memcpy(name, e->rel, e->key_len);
        memcpy(name + e->key_len, ".cls", 5);
        st = tar_member_start(p, s, name, e->key_len + 4, ll);
        if (st == SF_OK)
            st = out_put(p, s, label, ll);
        if (st == SF_OK)
            st = out_zeros(p, s, (size_t)(pad512(ll) - ll));
    }
    return st;
}

/* ------------------------------------------------------------ records */

static sf_status record_sample(struct packer *p, struct shard *s, const struct sample *smp)
{
    /* every field of the sample in one buffer: the record writer takes them together */
    uint64_t need = 0;
    size_t names = 0;
    for (size_t i = 0; i < smp->n; i++) {
        need += entry_size(&p->entries[smp->first + i]);
        names += strlen(field_of(&p->entries[smp->first + i])) + 1;
    }
    if (need + names + 64 > SIZE_MAX / 2)
        return fail(p, SF_ERR_LIMIT, "%s/%.*s: sample too large", p->src,
                    (int)p->entries[smp->first].key_len, p->entries[smp->first].rel);
    size_t want = (size_t)need + names + 64;
    if (want > p->sample_cap) {
        size_t cap = p->sample_cap ? p->sample_cap : (1u << 20);
        while (cap < want)
            cap *= 2;
        unsigned char *b = realloc(p->sample_buf, cap);
        if (!b)
            return fail(p, SF_ERR_NO_MEMORY, "%s/%.*s: no memory for a %zu-byte sample", p->src,
                        (int)p->entries[smp->first].key_len, p->entries[smp->first].rel, want);
        p->sample_buf = b;
        p->sample_cap = cap;
    }
    struct sf__record_field_in *fields = calloc(smp->n + 1, sizeof(*fields));
    if (!fields)
        return SF_ERR_NO_MEMORY;
    sf_status st = SF_OK;
    unsigned char *at = p->sample_buf;
    for (size_t i = 0; st == SF_OK && i < smp->n; i++) {
        const struct entry *e = &p->entries[smp->first + i];
        if (e->re) {
            memcpy(at, e->re, (size_t)e->re_size);
        } else {
            char *abs = NULL;
            int fd = -1;
            st = open_source(p, e, &abs, &fd);
            if (st == SF_OK)
                st = read_exact(p, fd, abs, at, (size_t)e->size, 0);
            if (fd >= 0)
                close(fd);
            free(abs);
        }
        fields[i].data = at;
        fields[i].size = (size_t)entry_size(e);
        at += entry_size(e);
        /* lower-case names, as the tar reader presents them */
        char *name = (char *)at;
        const char *f = field_of(e);
        size_t k = 0;
        for (; f[k]; k++)
            name[k] = (char)((f[k] >= 'A' && f[k] <= 'Z') ? f[k] - 'A' + 'a' : f[k]);
        name[k] = '\0';
        fields[i].name = name;
        at += k + 1;
    }
    const struct entry *e0 = &p->entries[smp->first];
    size_t n = smp->n;
    char label[32];
    if (st == SF_OK && p->layout == SF_PACK_LAYOUT_IMAGEFOLDER) {
        size_t ll = (size_t)label_text(e0->cls, label, sizeof(label));
        fields[n].name = "cls";
        fields[n].data = label;
        fields[n].size = ll;
        n++;
    }
    char key[SF__RECORD_MAX_KEY_BYTES + 1];
    memcpy(key, e0->rel, e0->key_len);
    key[e0->key_len] = '\0';
    if (st == SF_OK) {
        st = sf__record_writer_add(s->rw, key, fields, n);
        if (st != SF_OK)
            fail(p, st, "%s: sample '%s': %s", s->tmp_path, key, sf__record_writer_errmsg(s->rw));
        else
            s->bytes = sf__record_writer_bytes(s->rw);
    }
    free(fields);
    if (st == SF_OK) {
        p->files_done += smp->n;
        for (size_t i = 0; i < smp->n; i++)
            p->bytes_done += p->entries[smp->first + i].size;
    }
    return st;
}

/* ------------------------------------------------------------ index.json */

static cJSON *build_index(struct packer *p, uint64_t total_bytes)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "format", sf_pack_format_name(p->o->format));
    cJSON_AddNumberToObject(j, "version", INDEX_VERSION);
    cJSON_AddStringToObject(j, "layout", sf_pack_layout_name(p->layout));
    cJSON_AddStringToObject(j, "compression", p->o->zstd_level ? "zstd" : "none");
    if (p->o->zstd_level)
        cJSON_AddNumberToObject(j, "zstd_level", p->o->zstd_level);
    cJSON_AddStringToObject(j, "checksum", "xxh3_64");
    if (p->o->max_side) {
        cJSON *re = cJSON_AddObjectToObject(j, "reencode");
        cJSON_AddNumberToObject(re, "max_side", p->o->max_side);
        cJSON_AddNumberToObject(re, "quality",
                                p->o->jpeg_quality ? p->o->jpeg_quality : DEFAULT_QUALITY);
    }
    cJSON_AddNumberToObject(j, "shard_size_limit", (double)p->o->shard_bytes);
    cJSON *arr = cJSON_AddArrayToObject(j, "shards");
    for (size_t i = 0; arr && i < p->n_shards; i++) {
        cJSON *s = cJSON_CreateObject();
        char hex[17];
        snprintf(hex, sizeof(hex), "%016" PRIx64, p->shards[i].xxh3);
        cJSON_AddStringToObject(s, "name", p->shards[i].name);
        cJSON_AddNumberToObject(s, "bytes", (double)p->shards[i].bytes);
        cJSON_AddNumberToObject(s, "samples", (double)p->shards[i].samples);
        cJSON_AddStringToObject(s, "xxh3_64", hex);
        cJSON_AddItemToArray(arr, s);
    }
    cJSON_AddNumberToObject(j, "shard_count", (double)p->n_shards);
    cJSON_AddNumberToObject(j, "sample_count", (double)p->n_samples);
    cJSON_AddNumberToObject(j, "file_count", (double)p->n_entries);
    cJSON_AddNumberToObject(j, "bytes", (double)total_bytes);
    cJSON_AddNumberToObject(j, "source_bytes", (double)p->source_bytes);
    if (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER) {
        cJSON *c = cJSON_AddArrayToObject(j, "classes");
        cJSON *cc = cJSON_AddArrayToObject(j, "class_counts");
        for (size_t i = 0; c && cc && i < p->n_classes; i++) {
            cJSON_AddItemToArray(c, cJSON_CreateString(p->classes[i]));
            cJSON_AddItemToArray(cc, cJSON_CreateNumber((double)p->class_counts[i]));
        }
    }
    /* fields seen: lower-cased name -> samples that have it, sorted by name */
    cJSON *fields = cJSON_AddObjectToObject(j, "fields");
    size_t n = p->n_entries + (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER ? 1 : 0);
    char **names = calloc(n ? n : 1, sizeof(*names));
    size_t k = 0;
    int ok = fields && names;
    for (size_t i = 0; ok && i < p->n_entries; i++) {
        names[k] = strdup(field_of(&p->entries[i]));
        if (!names[k]) {
            ok = 0;
            break;
        }
        for (char *c = names[k]; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c - 'A' + 'a');
        k++;
    }
    if (ok) {
        qsort(names, k, sizeof(*names), cmp_str);
        for (size_t i = 0; i < k;) {
            size_t m = i + 1;
            while (m < k && !strcmp(names[m], names[i]))
                m++;
            cJSON_AddNumberToObject(fields, names[i], (double)(m - i));
            i = m;
        }
        if (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER)
            cJSON_AddNumberToObject(fields, "cls", (double)p->n_samples);
    }
    for (size_t i = 0; names && i < k; i++)
        free(names[i]);
    free(names);
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static sf_status write_index(struct packer *p, uint64_t total_bytes)
{
    cJSON *j = build_index(p, total_bytes);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text)
        return fail(p, SF_ERR_NO_MEMORY, "no memory for " INDEX_NAME);
    size_t len = strlen(text);
    text[len++] = '\n'; /* replaces the NUL; the length is what is written */
    sf_status st = SF_OK;
    if (p->to_s3) {
        char *url = object_url(p, INDEX_NAME);
        if (!url)
            st = SF_ERR_NO_MEMORY;
        else if ((st = sf_s3_put(p->o->s3, url, NULL, text, len, NULL, 0)) != SF_OK) {
            char msg[1024];
            sf_s3_errmsg(p->o->s3, msg, sizeof(msg));
            fail(p, st, "%s", msg[0] ? msg : sf_status_str(st));
        }
        free(url);
    } else {
        char *final = path_join(p->dest_dir, INDEX_NAME);
        size_t n = final ? strlen(final) + 64 : 0;
        char *tmp = final ? malloc(n) : NULL;
        if (!tmp) {
            st = SF_ERR_NO_MEMORY;
        } else {
            snprintf(tmp, n, "%s/." INDEX_NAME ".sfpack-%ld", p->dest_dir, (long)getpid());
            struct shard s = {.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
                              .tmp_path = tmp};
            if (s.fd < 0)
                st = fail(p, errno_status(errno), "%s: cannot create: %s", tmp, strerror(errno));
            else
                st = write_all(p, &s, text, len);
            if (s.fd >= 0 && close(s.fd) != 0 && st == SF_OK)
                st = fail(p, SF_ERR_IO, "%s: close: %s", tmp, strerror(errno));
            if (st == SF_OK && rename(tmp, final) != 0)
                st = fail(p, SF_ERR_IO, "%s: cannot rename into place: %s", final, strerror(errno));
            if (st != SF_OK)
                unlink(tmp);
        }
        free(tmp);
        free(final);
    }
    free(text);
    return st;
}

/* ------------------------------------------------------------ the pack */

/* ------------------------------------------------------------ --max-side */

/*
 * Re-encoding is CPU work (a decode, a resize, an encode: tens of ms for a
 * large photo), so a pool of threads does it a few samples ahead of the
 * writer, which still writes the samples in their order: the output is the
 * same bytes whatever the thread count. Each sample's buffers are freed once
 * written, so memory is bounded by REENCODE_AHEAD x threads samples.
 */
struct reencoder {
    struct packer *p;
    struct sf__reencode r;
    pthread_t *threads;
    unsigned n_threads, started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t next;  /* next sample to take */
    size_t limit; /* samples below this may be taken */
    unsigned char *done; /* per sample */
    int quit;
    sf_status st; /* first failure */
    char err[1024];
    /* results */
    unsigned long long images, source_bytes, bytes;
};

/* Reads a whole file (it must still have its scanned size). */
static sf_status slurp(const char *src, const struct entry *e, unsigned char **out, char *err,
                       size_t len)
{
    char *abs = path_join(src, e->rel);
    if (!abs)
        return SF_ERR_NO_MEMORY;
    sf_status st = SF_OK;
    unsigned char *buf = NULL;
    int fd = open(abs, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int er = errno;
        snprintf(err, len, "%s: cannot read: %s", abs, strerror(er));
        st = errno_status(er);
    } else if ((uint64_t)sb.st_size != e->size) {
        snprintf(err, len, "%s: changed while packing (%" PRIu64 " bytes when scanned, %lld now)",
                 abs, e->size, (long long)sb.st_size);
        st = SF_ERR_CHANGED;
    } else if (!(buf = malloc(e->size ? (size_t)e->size : 1))) {
        st = SF_ERR_NO_MEMORY;
        snprintf(err, len, "%s: no memory for %" PRIu64 " bytes", abs, e->size);
    } else {
        size_t got = 0;
        while (st == SF_OK && got < e->size) {
            ssize_t r = read(fd, buf + got, (size_t)e->size - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                snprintf(err, len, "%s: read at offset %zu: %s", abs, got,
                         r < 0 ? strerror(errno) : "the file shrank");
                st = r < 0 ? SF_ERR_IO : SF_ERR_CHANGED;
            } else {
                got += (size_t)r;
            }
        }
    }
    if (fd >= 0)
        close(fd);
    if (st != SF_OK) {
        free(buf);
        buf = NULL;
    }
    free(abs);
    *out = buf;
    return st;
}

/* Re-encodes the JPEG fields of sample i. */
static sf_status reencode_sample(struct reencoder *q, size_t i, char *err, size_t len,
                                 unsigned long long counts[3])
{
    struct packer *p = q->p;
    const struct sample *smp = &p->samples[i];
    for (size_t a = smp->first; a < smp->first + smp->n; a++) {
        struct entry *e = &p->entries[a];
        if (!is_jpeg_field(e))
            continue;
        unsigned char *src = NULL, *out = NULL;
        size_t out_n = 0;
        char why[512] = "";
        sf_status st = slurp(p->src, e, &src, err, len);
        if (st != SF_OK)
            return st;
        st = sf__reencode_jpeg(&q->r, src, (size_t)e->size, &out, &out_n, why, sizeof(why));
        free(src);
        if (st != SF_OK) {
            snprintf(err, len, "%s/%s: cannot re-encode (--max-side %u): %s", p->src, e->rel,
                     q->r.max_side, why);
            return st;
        }
        if (out) {
            e->re = out;
            e->re_size = out_n;
            counts[0]++;
            counts[1] += e->size;
            counts[2] += out_n;
        }
    }
    return SF_OK;
}

static void *reencode_main(void *arg)
{
    struct reencoder *q = arg;
    char err[1024];
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->quit && q->st == SF_OK && q->next >= q->limit)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->quit || q->st != SF_OK)
            break;
        size_t i = q->next++;
        pthread_mutex_unlock(&q->mu);
        unsigned long long counts[3] = {0, 0, 0};
        err[0] = '\0';
        sf_status st = reencode_sample(q, i, err, sizeof(err), counts);
        pthread_mutex_lock(&q->mu);
        if (st != SF_OK && q->st == SF_OK) {
            q->st = st;
            snprintf(q->err, sizeof(q->err), "%s", err[0] ? err : sf_status_str(st));
        }
        q->images += counts[0];
        q->source_bytes += counts[1];
        q->bytes += counts[2];
        q->done[i] = 1;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static sf_status reencoder_start(struct packer *p)
{
    struct reencoder *q = calloc(1, sizeof(*q));
    if (!q)
        return SF_ERR_NO_MEMORY;
    p->re = q;
    q->p = p;
    q->r.max_side = p->o->max_side;
    q->r.quality = p->o->jpeg_quality ? p->o->jpeg_quality : DEFAULT_QUALITY;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    q->n_threads = p->o->threads ? p->o->threads : cores > 0 ? (unsigned)cores : 1;
    if (q->n_threads > 256)
        q->n_threads = 256;
    q->done = calloc(p->n_samples ? p->n_samples : 1, 1);
    q->threads = calloc(q->n_threads, sizeof(*q->threads));
    if (!q->done || !q->threads)
        return SF_ERR_NO_MEMORY;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    for (unsigned t = 0; t < q->n_threads; t++) {
        if (pthread_create(&q->threads[t], NULL, reencode_main, q) != 0)
            return fail(p, SF_ERR_INTERNAL, "pack: cannot start a re-encoding thread");
        q->started++;
    }
    return SF_OK;
}

/* Waits until sample i is re-encoded, letting the pool run ahead of it. */
static sf_status reencoder_wait(struct packer *p, size_t i)
{
    struct reencoder *q = p->re;
    pthread_mutex_lock(&q->mu);
    size_t ahead = (size_t)REENCODE_AHEAD * q->n_threads;
    q->limit = i + ahead < p->n_samples ? i + ahead : p->n_samples;
    pthread_cond_broadcast(&q->cv);
    while (!q->done[i] && q->st == SF_OK)
        pthread_cond_wait(&q->cv, &q->mu);
    sf_status st = q->st;
    pthread_mutex_unlock(&q->mu);
    if (st != SF_OK)
        return fail(p, st, "%s", q->err);
    return SF_OK;
}

static void reencoder_stop(struct packer *p)
{
    struct reencoder *q = p->re;
    if (!q)
        return;
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->quit = 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        for (unsigned t = 0; t < q->started; t++)
            pthread_join(q->threads[t], NULL);
    }
    if (q->threads) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
    }
    free(q->threads);
    free(q->done);
    free(q);
    p->re = NULL;
}

static void free_reencoded(struct packer *p, const struct sample *smp)
{
    for (size_t a = smp->first; a < smp->first + smp->n; a++) {
        free(p->entries[a].re);
        p->entries[a].re = NULL;
    }
}

static sf_status write_shards(struct packer *p)
{
    p->out = malloc(OUT_BUFFER_BYTES);
    if (!p->out)
        return SF_ERR_NO_MEMORY;
    struct shard s;
    memset(&s, 0, sizeof(s));
    s.fd = -1;
    int open_shard = 0;
    /* what a shard costs besides its samples: tar end blocks, or record header + index + footer */
    uint64_t overhead =
        p->o->format == SF_PACK_FORMAT_TAR
            ? 2 * TAR_BLOCK
            : SF__RECORD_HEADER_BYTES + SF__RECORD_INDEX_FIXED_BYTES + SF__RECORD_FOOTER_BYTES;
    uint64_t planned = 0;
    sf_status st = report(p);
    for (size_t i = 0; st == SF_OK && i < p->n_samples; i++) {
        struct sample *smp = &p->samples[i];
        if (p->re) {
            /* The shard boundary depends on the re-encoded sizes. */
            if ((st = reencoder_wait(p, i)) != SF_OK)
                break;
            smp->bytes = sample_bytes(p, smp);
        }
        if (open_shard && planned + smp->bytes + overhead > p->o->shard_bytes) {
            st = shard_close(p, &s);
            shard_discard(&s);
            open_shard = 0;
            if (st != SF_OK)
                break;
        }
        if (!open_shard) {
            st = shard_open(p, &s, p->n_shards);
            if (st != SF_OK) {
                shard_discard(&s);
                break;
            }
            open_shard = 1;
            planned = 0;
        }
        st =
            p->o->format == SF_PACK_FORMAT_TAR ? tar_sample(p, &s, smp) : record_sample(p, &s, smp);
        if (p->re)
            free_reencoded(p, smp);
        planned += smp->bytes;
        s.samples++;
        if (st == SF_OK)
            st = report(p);
    }
    if (open_shard) {
        if (st == SF_OK)
            st = shard_close(p, &s);
        shard_discard(&s);
    }
    return st;
}

static sf_status resolve_dest(struct packer *p, const char *dest_url)
{
    struct sf__locator loc;
    char err[512];
    sf_status st = sf__locator_parse(dest_url, &loc, err, sizeof(err));
    if (st != SF_OK)
        return fail(p, st, "%s", err);
    if (loc.kind == SF__LOC_HTTP) {
        st =
            fail(p, SF_ERR_UNSUPPORTED, "%s: pack writes to a folder or an s3:// prefix", dest_url);
    } else if (loc.kind == SF__LOC_S3) {
        p->to_s3 = 1;
        if (!*loc.bucket)
            st = fail(p, SF_ERR_INVALID_ARGUMENT, "%s: name a bucket", dest_url);
        else if (!p->o->s3)
            st = fail(p, SF_ERR_INVALID_ARGUMENT, "%s: an s3:// destination needs a client (s3)",
                      dest_url);
        else if (p->o->shard_bytes > SF_UPLOAD_MAX_BYTES)
            st = fail(p, SF_ERR_INVALID_ARGUMENT,
                      "shard size %llu: an S3 object holds at most 5 TiB", p->o->shard_bytes);
        else if (p->o->part_bytes && (p->o->part_bytes < SF_UPLOAD_PART_BYTES_MIN ||
                                      p->o->part_bytes > SF_UPLOAD_PART_BYTES_MAX))
            st = fail(p, SF_ERR_INVALID_ARGUMENT, "part size %llu: S3 parts are 5 MiB to 5 GiB",
                      p->o->part_bytes);
        else {
            /* s3://bucket/prefix without trailing slashes; keys are joined with '/' */
            size_t n = strlen(dest_url);
            while (n > 5 && dest_url[n - 1] == '/')
                n--;
            p->dest_url = strndup(dest_url, n);
            if (!p->dest_url)
                st = SF_ERR_NO_MEMORY;
            const char *t = p->o->tmp_dir;
            if (!t || !*t)
                t = getenv("TMPDIR");
            p->tmp_dir = t && *t ? t : "/tmp";
        }
    } else {
        st = make_dirs(p, loc.key);
        char *rs = st == SF_OK ? realpath(p->src, NULL) : NULL;
        char *rd = st == SF_OK ? realpath(loc.key, NULL) : NULL;
        if (st == SF_OK && (!rs || !rd))
            st = fail(p, errno_status(errno), "%s: %s", rs ? loc.key : p->src, strerror(errno));
        if (st == SF_OK) {
            size_t ls = strlen(rs);
            if (!strncmp(rs, rd, ls) && (rd[ls] == '\0' || rd[ls] == '/' || ls == 1))
                st = fail(p, SF_ERR_INVALID_ARGUMENT,
                          "%s is inside %s: the shards would be packed into themselves next time",
                          loc.key, p->src);
        }
        free(rs);
        if (st == SF_OK)
            p->dest_dir = rd;
        else
            free(rd);
    }
    sf__locator_free(&loc);
    return st;
}

static void remove_written(struct packer *p)
{
    if (p->to_s3 || !p->dest_dir)
        return;
    for (size_t i = 0; i < p->n_shards; i++) {
        char *path = path_join(p->dest_dir, p->shards[i].name);
        if (path)
            unlink(path);
        free(path);
    }
}

static void packer_free(struct packer *p)
{
    for (size_t i = 0; i < p->n_entries; i++) {
        free(p->entries[i].rel);
        free(p->entries[i].re);
    }
    free(p->entries);
    for (size_t i = 0; i < p->n_classes; i++)
        free(p->classes[i]);
    free(p->classes);
    free(p->class_counts);
    free(p->samples);
    for (size_t i = 0; i < p->n_shards; i++)
        free(p->shards[i].name);
    free(p->shards);
    free(p->out);
    free(p->sample_buf);
    free(p->dest_dir);
    free(p->dest_url);
}

SF_API sf_status sf_pack(const char *src_dir, const char *dest_url, const struct sf_pack_options *o,
                         struct sf_pack_result *result, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (result)
        memset(result, 0, sizeof(*result));
    struct sf_pack_options def;
    if (!o) {
        sf_pack_options_init_default(&def);
        o = &def;
    }
    struct packer pk;
    memset(&pk, 0, sizeof(pk));
    struct packer *p = &pk;
    p->o = o;
    p->src = src_dir;
    p->err = err;
    p->err_len = err_len;
    if (!src_dir || !*src_dir || !dest_url || !*dest_url)
        return fail(p, SF_ERR_INVALID_ARGUMENT, "pack needs a source folder and a destination");
    sf_status st = SF_OK;
    if (o->format != SF_PACK_FORMAT_TAR && o->format != SF_PACK_FORMAT_RECORD)
        st = fail(p, SF_ERR_INVALID_ARGUMENT, "unknown shard format %d", (int)o->format);
    else if (o->layout != SF_PACK_LAYOUT_AUTO && o->layout != SF_PACK_LAYOUT_IMAGEFOLDER &&
             o->layout != SF_PACK_LAYOUT_FLAT)
        st = fail(p, SF_ERR_INVALID_ARGUMENT, "unknown layout %d", (int)o->layout);
    else if (o->shard_bytes == 0)
        st = fail(p, SF_ERR_INVALID_ARGUMENT, "the shard size must be at least 1 byte");
    else if (o->zstd_level < 0 || o->zstd_level > MAX_ZSTD_LEVEL)
        st = fail(p, SF_ERR_INVALID_ARGUMENT, "zstd level %d: expected 0 (off) to %d",
                  o->zstd_level, MAX_ZSTD_LEVEL);
    else if (o->zstd_level && o->format == SF_PACK_FORMAT_TAR)
        st = fail(p, SF_ERR_UNSUPPORTED,
                  "zstd compresses record shards only: readers stream plain tar (compressed "
                  "tars cannot be read without copies); use the record format");
    else if (o->max_side && o->max_side < MIN_MAX_SIDE)
        st = fail(p, SF_ERR_INVALID_ARGUMENT, "max side %u: expected 0 (keep the JPEGs) or at "
                  "least %d pixels", o->max_side, MIN_MAX_SIDE);
    else if (o->jpeg_quality < 0 || o->jpeg_quality > 100)
        st = fail(p, SF_ERR_INVALID_ARGUMENT, "JPEG quality %d: expected 1 to 100 (0: the "
                  "default, %d)", o->jpeg_quality, DEFAULT_QUALITY);
    else if (o->jpeg_quality && !o->max_side)
        st = fail(p, SF_ERR_INVALID_ARGUMENT, "a JPEG quality is for re-encoding: give the "
                  "max side too (JPEGs at most that large are kept as they are)");
    else if (o->name_pattern)
        st = check_pattern(p, o->name_pattern);
    if (st == SF_OK)
        st = check_src(p);
    if (st == SF_OK)
        st = resolve_dest(p, dest_url);
    if (st == SF_OK)
        st = scan(p);
    if (st == SF_OK)
        st = group_samples(p);
    if (st == SF_OK && p->to_s3)
        st = uploader_start(p);
    if (st == SF_OK && o->max_side)
        st = reencoder_start(p);
    if (st == SF_OK)
        st = write_shards(p);
    unsigned long long re_images = 0, re_source = 0, re_bytes = 0;
    if (p->re) {
        re_images = p->re->images;
        re_source = p->re->source_bytes;
        re_bytes = p->re->bytes;
    }
    reencoder_stop(p);
    if (p->to_s3) {
        /* every shard is uploaded before the index names it */
        uploader_stop(p);
        if (st == SF_OK && p->up.status != SF_OK)
            st = fail(p, p->up.status, "%s", p->up.err);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < p->n_shards; i++)
        total += p->shards[i].bytes;
    if (st == SF_OK)
        st = write_index(p, total);
    if (st == SF_OK)
        st = report(p);
    if (st != SF_OK) {
        if (st == SF_ERR_NO_MEMORY)
            fail(p, st, "out of memory");
        remove_written(p);
    } else if (result) {
        result->format = o->format;
        result->layout = p->layout;
        result->shards = p->n_shards;
        result->samples = p->n_samples;
        result->files = p->n_entries;
        result->source_bytes = p->source_bytes;
        result->shard_bytes = total;
        result->ignored = p->ignored;
        result->classes = p->n_classes;
        result->reencoded = re_images;
        result->reencoded_source_bytes = re_source;
        result->reencoded_bytes = re_bytes;
    }
    packer_free(p);
    return st;
}
