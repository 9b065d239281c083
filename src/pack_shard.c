/*
 * pack's shard files: a shard is written to a temporary file (tar through a
 * buffer hashed as it goes, records through the record writer), then renamed
 * into place or handed to the uploader.
 */
#include "src/pack_internal.h"
#include "src/index_json.h"
#include "common/file.h"
#include "common/io.h"
#include "common/grow.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

sf_status sf__pack_write_all(struct packer *p, struct shard *s, const void *data, size_t n)
{
    int rc = sf__write_full(s->fd, data, n, NULL);
    if (rc)
        return sf__pack_fail(p, SF_ERR_IO, "%s: write: %s", s->tmp_path,
                             rc < 0 ? strerror(errno) : "no progress");
    return SF_OK;
}

sf_status sf__pack_out_flush(struct packer *p, struct shard *s)
{
    if (!p->out_len)
        return SF_OK;
    XXH3_64bits_update(s->xx, p->out, p->out_len);
    sf_status st = sf__pack_write_all(p, s, p->out, p->out_len);
    p->out_len = 0;
    return st;
}

sf_status sf__pack_out_put(struct packer *p, struct shard *s, const void *data, size_t n)
{
    const unsigned char *c = data;
    while (n > 0) {
        if (p->out_len == OUT_BUFFER_BYTES) {
            sf_status st = sf__pack_out_flush(p, s);
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

sf_status sf__pack_out_zeros(struct packer *p, struct shard *s, size_t n)
{
    static const unsigned char zeros[TAR_BLOCK];
    while (n > 0) {
        size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
        sf_status st = sf__pack_out_put(p, s, zeros, k);
        if (st != SF_OK)
            return st;
        n -= k;
    }
    return SF_OK;
}

sf_status sf__pack_shard_open(struct packer *p, struct shard *s, size_t index)
{
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    if (sf_pack_shard_name(p->o->name_pattern, p->o->format, index, s->name, sizeof(s->name)) !=
        SF_OK)
        return sf__pack_fail(p, SF_ERR_INVALID_ARGUMENT,
                             "shard %zu: no valid name from the pattern", index);
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
        return sf__pack_fail(p, sf__pack_errno_status(errno), "%s: cannot create: %s", s->tmp_path,
                             strerror(errno));
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
        return sf__pack_fail(p, st, "%s: %s", s->tmp_path, err[0] ? err : sf_status_str(st));
    s->bytes = sf__record_writer_bytes(s->rw);
    return SF_OK;
}

/* Frees what shard_open made; removes the temporary file unless it was handed on. */
void sf__pack_shard_discard(struct shard *s)
{
    sf__temp_discard(&s->fd, &s->tmp_path);
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
            st = sf__pack_fail(p, SF_ERR_IO, "%s: read back: %s", s->tmp_path, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        XXH3_64bits_update(xx, p->out, (size_t)r);
        off += (uint64_t)r;
    }
    if (st == SF_OK && off != s->bytes)
        st = sf__pack_fail(p, SF_ERR_IO, "%s: %" PRIu64 " bytes on disk, %" PRIu64 " written",
                           s->tmp_path, off, s->bytes);
    *out = XXH3_64bits_digest(xx);
    XXH3_freeState(xx);
    return st;
}

char *sf__pack_object_url(struct packer *p, const char *name)
{
    return sf__pack_path_join(p->dest_url, name);
}

/*
 * An index.json left by an earlier pack into this folder names shards with
 * their old sizes, counts and checksums; the shards of this run replace some
 * of them, and a failure removes those again. So the old index goes before
 * the first shard is renamed into place (the new one comes last): a reader
 * never finds an index naming a shard that is gone or different.
 */
static sf_status remove_old_index(struct packer *p)
{
    char *path = sf__pack_path_join(p->dest_dir, SF__INDEX_JSON_NAME);
    if (!path)
        return SF_ERR_NO_MEMORY;
    sf_status st = SF_OK;
    if (unlink(path) != 0 && errno != ENOENT)
        st = sf__pack_fail(p, sf__pack_errno_status(errno),
                           "%s: cannot remove the earlier pack's index: %s", path, strerror(errno));
    free(path);
    return st;
}

/* Ends the archive or index, then renames into place or hands over for upload. */
sf_status sf__pack_shard_close(struct packer *p, struct shard *s)
{
    sf_status st = SF_OK;
    uint64_t xxh3 = 0;
    if (p->o->format == SF_PACK_FORMAT_TAR) {
        st = sf__pack_out_zeros(p, s, 2 * TAR_BLOCK);
        if (st == SF_OK)
            st = sf__pack_out_flush(p, s);
        xxh3 = XXH3_64bits_digest(s->xx);
    } else {
        st = sf__record_writer_finish(s->rw);
        if (st != SF_OK)
            sf__pack_fail(p, st, "%s: %s", s->tmp_path, sf__record_writer_errmsg(s->rw));
        else {
            s->bytes = sf__record_writer_bytes(s->rw);
            st = hash_file(p, s, &xxh3);
        }
    }
    if (st != SF_OK)
        return st;
    if (close(s->fd) != 0) {
        s->fd = -1;
        return sf__pack_fail(p, SF_ERR_IO, "%s: close: %s", s->tmp_path, strerror(errno));
    }
    s->fd = -1;
    struct shard_info *v = sf__grow(p->shards, p->n_shards, &p->cap_shards, sizeof(*v), 16);
    if (!v)
        return SF_ERR_NO_MEMORY;
    p->shards = v;
    struct shard_info *info = &p->shards[p->n_shards];
    info->name = strdup(s->name);
    if (!info->name)
        return SF_ERR_NO_MEMORY;
    info->bytes = s->bytes;
    info->samples = s->samples;
    info->xxh3 = xxh3;
    p->n_shards++;
    if (p->to_s3) {
        if (p->n_shards == 1 && (st = sf__pack_s3_clear_old_index(p)) != SF_OK)
            return st; /* the first shard: nothing went up yet */
        char *url = sf__pack_object_url(p, s->name);
        if (!url)
            return SF_ERR_NO_MEMORY;
        char *path = s->tmp_path;
        s->tmp_path = NULL;
        return sf__pack_uploader_submit(p, path, url);
    }
    if (p->local_done == 0 && (st = remove_old_index(p)) != SF_OK)
        return st;
    char *final = sf__pack_path_join(p->dest_dir, s->name);
    if (!final)
        return SF_ERR_NO_MEMORY;
    if (rename(s->tmp_path, final) != 0)
        st =
            sf__pack_fail(p, SF_ERR_IO, "%s: cannot rename into place: %s", final, strerror(errno));
    else {
        free(s->tmp_path);
        s->tmp_path = NULL;
        p->local_done++;
    }
    free(final);
    return st;
}
