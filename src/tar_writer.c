/*
 * pack's tar writer: ustar members (with a pax header for a long name or a
 * size over 8 GiB), mode 0644, owner 0, mtime 0, so the bytes depend only on
 * the names and contents. src/tar_reader.c reads them.
 */
#include "src/pack_internal.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t pad512(uint64_t n)
{
    return (n + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
}

/* ------------------------------------------------------------ sizes */

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
uint64_t sf__tar_member_bytes(const char *name, size_t name_len, uint64_t size)
{
    size_t pax = pax_bytes(name, name_len, size);
    return (pax ? TAR_BLOCK + pad512(pax) : 0) + TAR_BLOCK + pad512(size);
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
    sf_status st = sf__pack_out_put(p, s, head, (size_t)n);
    if (st == SF_OK)
        st = sf__pack_out_put(p, s, value, value_len);
    if (st == SF_OK)
        st = sf__pack_out_put(p, s, "\n", 1);
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
        st = sf__pack_out_put(p, s, h, TAR_BLOCK);
        if (st == SF_OK && long_name)
            st = pax_put_record(p, s, "path", name, name_len);
        if (st == SF_OK && big) {
            char v[32];
            snprintf(v, sizeof(v), "%" PRIu64, size);
            st = pax_put_record(p, s, "size", v, strlen(v));
        }
        if (st == SF_OK)
            st = sf__pack_out_zeros(p, s, (size_t)(pad512(pax) - pax));
    }
    if (st != SF_OK)
        return st;
    tar_header(h, name, name_len, size, '0');
    return sf__pack_out_put(p, s, h, TAR_BLOCK);
}

/* A file's bytes straight into the output buffer, then its padding. */
static sf_status tar_file(struct packer *p, struct shard *s, const struct entry *e)
{
    if (e->re) {
        sf_status st = tar_member_start(p, s, e->rel, strlen(e->rel), e->re_size);
        if (st == SF_OK)
            st = sf__pack_out_put(p, s, e->re, (size_t)e->re_size);
        if (st == SF_OK)
            st = sf__pack_out_zeros(p, s, (size_t)(pad512(e->re_size) - e->re_size));
        return st;
    }
    char *abs = NULL;
    int fd = -1;
    sf_status st = sf__pack_open_source(p, e, &abs, &fd);
    if (st == SF_OK)
        st = tar_member_start(p, s, e->rel, strlen(e->rel), e->size);
    uint64_t done = 0;
    while (st == SF_OK && done < e->size) {
        if (p->out_len == OUT_BUFFER_BYTES && (st = sf__pack_out_flush(p, s)) != SF_OK)
            break;
        size_t k = OUT_BUFFER_BYTES - p->out_len;
        if (k > e->size - done)
            k = (size_t)(e->size - done);
        st = sf__pack_read_exact(p, fd, abs, p->out + p->out_len, k, done);
        p->out_len += k;
        s->bytes += k;
        done += k;
    }
    if (st == SF_OK)
        st = sf__pack_out_zeros(p, s, (size_t)(pad512(e->size) - e->size));
    if (fd >= 0)
        close(fd);
    free(abs);
    return st;
}

sf_status sf__tar_sample(struct packer *p, struct shard *s, const struct sample *smp)
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
        size_t ll = (size_t)sf__pack_label_text(e->cls, label, sizeof(label));
        memcpy(name, e->rel, e->key_len);
        memcpy(name + e->key_len, ".cls", 5);
        st = tar_member_start(p, s, name, e->key_len + 4, ll);
        if (st == SF_OK)
            st = sf__pack_out_put(p, s, label, ll);
        if (st == SF_OK)
            st = sf__pack_out_zeros(p, s, (size_t)(pad512(ll) - ll));
    }
    return st;
}
