/*
 * pack's record path: one sample's files gathered into one buffer and handed
 * to the record writer (src/record.c).
 */
#include "src/pack_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

sf_status sf__pack_record_sample(struct packer *p, struct shard *s, const struct sample *smp)
{
    /* every field of the sample in one buffer: the record writer takes them together */
    uint64_t need = 0;
    size_t names = 0;
    for (size_t i = 0; i < smp->n; i++) {
        need += sf__pack_entry_size(&p->entries[smp->first + i]);
        names += strlen(sf__pack_field_of(&p->entries[smp->first + i])) + 1;
    }
    if (need + names + 64 > SIZE_MAX / 2)
        return sf__pack_fail(p, SF_ERR_LIMIT, "%s/%.*s: sample too large", p->src,
                             (int)p->entries[smp->first].key_len, p->entries[smp->first].rel);
    size_t want = (size_t)need + names + 64;
    if (want > p->sample_cap) {
        size_t cap = p->sample_cap ? p->sample_cap : (1u << 20);
        while (cap < want)
            cap *= 2;
        unsigned char *b = realloc(p->sample_buf, cap);
        if (!b)
            return sf__pack_fail(p, SF_ERR_NO_MEMORY, "%s/%.*s: no memory for a %zu-byte sample",
                                 p->src, (int)p->entries[smp->first].key_len,
                                 p->entries[smp->first].rel, want);
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
            st = sf__pack_open_source(p, e, &abs, &fd);
            if (st == SF_OK)
                st = sf__pack_read_exact(p, fd, abs, at, (size_t)e->size, 0);
            if (fd >= 0)
                close(fd);
            free(abs);
        }
        fields[i].data = at;
        fields[i].size = (size_t)sf__pack_entry_size(e);
        at += sf__pack_entry_size(e);
        /* lower-case names, as the tar reader presents them */
        char *name = (char *)at;
        const char *f = sf__pack_field_of(e);
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
        size_t ll = (size_t)sf__pack_label_text(e0->cls, label, sizeof(label));
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
            sf__pack_fail(p, st, "%s: sample '%s': %s", s->tmp_path, key,
                          sf__record_writer_errmsg(s->rw));
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
