/*
 * pack's inputs: the scan of the source folder (layout, classes, one entry
 * per file), the grouping of the sorted entries into samples with their size
 * in a shard, and the reading of a source file when it is written.
 */
#include "src/pack_internal.h"
#include "common/grow.h"
#include "common/strv.h"
#include "common/file.h"
#include "common/io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_MAX_FILES (10ull * 1000 * 1000)
#define MAX_DEPTH         64

/* ------------------------------------------------------------ entries */

static int is_hidden(const char *name)
{
    return name[0] == '.';
}

const char *sf__pack_field_of(const struct entry *e)
{
    return e->rel + e->key_len + 1;
}

/* The bytes an entry puts in a shard: its file's, or its re-encoded JPEG's. */
uint64_t sf__pack_entry_size(const struct entry *e)
{
    return e->re ? e->re_size : e->size;
}

/* ------------------------------------------------------------ scan */

static sf_status add_entry(struct packer *p, const char *rel, uint64_t size, long cls)
{
    unsigned long long max = p->o->max_files ? p->o->max_files : DEFAULT_MAX_FILES;
    if (p->n_entries >= max)
        return sf__pack_fail(p, SF_ERR_LIMIT, "%s: more than %llu files (max_files)", p->src, max);
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    const char *dot = strchr(base, '.');
    if (!dot)
        return sf__pack_fail(
            p, SF_ERR_INVALID_ARGUMENT,
            "%s/%s: no extension: a file's extension names its field in the sample "
            "(WebDataset rule), rename or remove it",
            p->src, rel);
    if (!dot[1])
        return sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                             "%s/%s: ends with '.': the field name after the key would be empty",
                             p->src, rel);
    size_t key_len = (size_t)(dot - rel);
    if (key_len > SF__RECORD_MAX_KEY_BYTES)
        return sf__pack_fail(p, SF_ERR_LIMIT, "%s/%s: the sample key is longer than %u bytes",
                             p->src, rel, SF__RECORD_MAX_KEY_BYTES);
    if (strlen(dot + 1) > SF__RECORD_MAX_NAME_BYTES)
        return sf__pack_fail(p, SF_ERR_LIMIT, "%s/%s: the field name is longer than %u bytes",
                             p->src, rel, SF__RECORD_MAX_NAME_BYTES);
    struct entry *e = sf__grow(p->entries, p->n_entries, &p->cap_entries, sizeof(*e), 1024);
    if (!e)
        return SF_ERR_NO_MEMORY;
    p->entries = e;
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
        return sf__pack_fail(p, sf__pack_errno_status(errno), "%s: %s", abs, strerror(errno));
    if (S_ISLNK(sb->st_mode)) {
        if (!p->o->follow_symlinks)
            return sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                                 "%s: a symbolic link: not followed unless asked (follow_symlinks, "
                                 "--follow-symlinks)",
                                 abs);
        if (stat(abs, sb) != 0)
            return sf__pack_fail(p, sf__pack_errno_status(errno),
                                 "%s: a symbolic link to nowhere: %s", abs, strerror(errno));
    }
    if (!S_ISREG(sb->st_mode) && !S_ISDIR(sb->st_mode))
        return sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                             "%s: neither a regular file nor a folder (device, FIFO or socket)",
                             abs);
    return SF_OK;
}

static sf_status walk(struct packer *p, const char *abs, const char *rel, int depth, long cls)
{
    if (depth > MAX_DEPTH)
        return sf__pack_fail(p, SF_ERR_LIMIT, "%s: folders nested more than %d deep (a link loop?)",
                             abs, MAX_DEPTH);
    DIR *d = opendir(abs);
    if (!d)
        return sf__pack_fail(p, sf__pack_errno_status(errno), "%s: cannot read the folder: %s", abs,
                             strerror(errno));
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
        char *child = sf__pack_path_join(abs, de->d_name);
        char *child_rel = *rel ? sf__pack_path_join(rel, de->d_name) : strdup(de->d_name);
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
        st = sf__pack_fail(p, SF_ERR_IO, "%s: reading the folder: %s", abs, strerror(errno));
    closedir(d);
    return st;
}

int sf__pack_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

sf_status sf__pack_check_src(struct packer *p)
{
    struct stat sb;
    if (stat(p->src, &sb) != 0)
        return sf__pack_fail(p, sf__pack_errno_status(errno), "%s: %s", p->src, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT, "%s: not a folder", p->src);
    return SF_OK;
}

sf_status sf__pack_scan(struct packer *p)
{
    struct stat sb;
    /* the top level decides the layout and, for ImageFolder, the classes */
    DIR *d = opendir(p->src);
    if (!d)
        return sf__pack_fail(p, sf__pack_errno_status(errno), "%s: cannot read the folder: %s",
                             p->src, strerror(errno));
    char **dirs = NULL, *first_file = NULL;
    size_t n_dirs = 0, cap = 0, n_files = 0;
    unsigned long long top_hidden = 0;
    sf_status st = SF_OK;
    struct dirent *de;
    while (st == SF_OK && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (is_hidden(de->d_name)) {
            top_hidden++;
            continue;
        }
        char *abs = sf__pack_path_join(p->src, de->d_name);
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
        /* the classes' walks start below the top; the flat walk counts these itself */
        p->ignored += top_hidden;
        if (n_files > 0) {
            st = sf__pack_fail(
                p, SF_ERR_INVALID_ARGUMENT,
                "%s/%s: a file at the top of an ImageFolder tree (every file must be in a "
                "class folder; use the flat layout for other trees)",
                p->src, first_file ? first_file : "?");
        } else {
            qsort(dirs, n_dirs, sizeof(*dirs), sf__pack_cmp_str);
            p->classes = dirs;
            p->n_classes = n_dirs;
            dirs = NULL;
            p->class_counts = calloc(n_dirs ? n_dirs : 1, sizeof(*p->class_counts));
            if (!p->class_counts)
                st = SF_ERR_NO_MEMORY;
            for (size_t i = 0; st == SF_OK && i < p->n_classes; i++) {
                char *abs = sf__pack_path_join(p->src, p->classes[i]);
                st = abs ? walk(p, abs, p->classes[i], 1, (long)i) : SF_ERR_NO_MEMORY;
                free(abs);
            }
        }
    } else if (st == SF_OK) {
        st = walk(p, p->src, "", 0, -1);
    }
    sf__strv_free(dirs, n_dirs);
    free(first_file);
    if (st == SF_OK && p->n_entries == 0)
        st = sf__pack_fail(p, SF_ERR_NOT_FOUND, "%s: no files to pack", p->src);
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
    return strcmp(sf__pack_field_of(x), sf__pack_field_of(y));
}

int sf__pack_label_text(long cls, char *out, size_t n)
{
    return snprintf(out, n, "%ld", cls);
}

/* What a sample adds to a shard (tar: headers + padded data). */
uint64_t sf__pack_sample_bytes(const struct packer *p, const struct sample *smp)
{
    const struct entry *e = &p->entries[smp->first];
    uint64_t bytes = 0;
    for (size_t a = smp->first; a < smp->first + smp->n; a++) {
        const struct entry *x = &p->entries[a];
        if (p->o->format == SF_PACK_FORMAT_TAR)
            bytes += sf__tar_member_bytes(x->rel, strlen(x->rel), sf__pack_entry_size(x));
        else
            bytes +=
                SF__RECORD_FIELD_DESC_BYTES + strlen(sf__pack_field_of(x)) + sf__pack_entry_size(x);
    }
    if (p->layout == SF_PACK_LAYOUT_IMAGEFOLDER) {
        char label[32];
        size_t ll = (size_t)sf__pack_label_text(e->cls, label, sizeof(label));
        if (p->o->format == SF_PACK_FORMAT_TAR)
            bytes += sf__tar_member_bytes(e->rel, e->key_len + 4, ll);
        else
            bytes += SF__RECORD_FIELD_DESC_BYTES + 3 + ll;
    }
    if (p->o->format == SF_PACK_FORMAT_RECORD)
        bytes += SF__RECORD_REC_HEADER_BYTES + 8 + e->key_len + SF__RECORD_INDEX_ENTRY_BYTES;
    return bytes;
}

sf_status sf__pack_group_samples(struct packer *p)
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
            const char *fa = sf__pack_field_of(&p->entries[a]);
            if (imagefolder && !strcasecmp(fa, "cls"))
                return sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                                     "%s/%s: an ImageFolder sample's 'cls' field holds its label; "
                                     "rename this file",
                                     p->src, p->entries[a].rel);
            for (size_t b = a + 1; b < j; b++)
                if (!strcasecmp(fa, sf__pack_field_of(&p->entries[b])))
                    return sf__pack_fail(
                        p, SF_ERR_INVALID_ARGUMENT,
                        "%s/%s and %s/%s: the same field '%s' twice in sample '%.*s' "
                        "(field names are compared without case)",
                        p->src, p->entries[a].rel, p->src, p->entries[b].rel, fa, (int)e->key_len,
                        e->rel);
        }
        if (imagefolder)
            p->class_counts[e->cls]++;
        s->bytes = sf__pack_sample_bytes(p, s);
        i = j;
    }
    return SF_OK;
}

/* ------------------------------------------------------------ reading the sources */

/* Opens a source file and checks it is still the size the scan saw. */
sf_status sf__pack_open_source(struct packer *p, const struct entry *e, char **abs_out, int *fd_out)
{
    char *abs = sf__pack_path_join(p->src, e->rel);
    if (!abs)
        return SF_ERR_NO_MEMORY;
    *abs_out = abs;
    struct stat sb;
    int fd = sf__open_stat(abs, &sb);
    if (fd < 0) {
        int er = errno;
        return sf__pack_fail(p, sf__pack_errno_status(er), "%s: cannot read: %s", abs,
                             strerror(er));
    }
    if ((uint64_t)sb.st_size != e->size) {
        close(fd);
        return sf__pack_fail(p, SF_ERR_CHANGED,
                             "%s: changed while packing (%" PRIu64 " bytes when scanned, %lld now)",
                             abs, e->size, (long long)sb.st_size);
    }
    *fd_out = fd;
    return SF_OK;
}

sf_status sf__pack_read_exact(struct packer *p, int fd, const char *abs, unsigned char *dst,
                              size_t n, uint64_t at)
{
    size_t got;
    int rc = sf__read_full(fd, dst, n, &got);
    if (rc < 0)
        return sf__pack_fail(p, SF_ERR_IO, "%s: read at offset %" PRIu64 ": %s", abs, at + got,
                             strerror(errno));
    if (rc > 0)
        return sf__pack_fail(p, SF_ERR_CHANGED, "%s: shrank while packing (at offset %" PRIu64 ")",
                             abs, at + got);
    return SF_OK;
}
