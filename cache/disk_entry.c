/*
 * The disk tier's entry format (docs/cache.md, "Layout"): the object's bytes,
 * a JSON metadata block, then a 64-byte trailer (magic, version, metadata
 * length, data size, digest of the block list, metadata checksum, creation
 * time, the trailer's own checksum, end magic). Writing the metadata and
 * trailer, reading them back, and checking the data against the XXH3-64 of
 * each 4 MiB block.
 */
#include "cache/disk_cache_internal.h"
#include "common/endian.h"
#include "common/file.h"
#include "common/io.h"
#include "common/strbuf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#ifdef SF_HAVE_XXH_DISPATCH
/* The same XXH3, with AVX2 picked at run time when the CPU has it: about 3x
 * the plain entry points of a libxxhash built for baseline x86-64 (checked
 * by CMake; the header maps the XXH3_* names onto them). */
#include <xxh_x86dispatch.h>
#endif

#define META_MAX_BYTES (64u << 20) /* 16M blocks of 4 MiB: a 64 TiB object */

static const char TRAILER_MAGIC[8] = {'S', 'F', 'C', 'A', 'C', 'H', 'E', '1'};
static const char TRAILER_END[8] = {'S', 'F', 'C', 'E', 'N', 'D', '0', '1'};

/* ------------------------------------------------------------ trailer + metadata */

void sf__dc_meta_clear(struct sf__dc_meta *meta)
{
    free(meta->blocks);
    meta->blocks = NULL;
    meta->n_blocks = 0;
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

static const char *json_str(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Whether a string of the JSON text t[0, n) holds an escaped NUL: our
 * metadata never does (its strings were C strings), and cJSON would cut the
 * identity there ("key\u0000x" compared as "key"). */
static int has_nul_escape(const char *t, size_t n)
{
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '"')
            in_string = !in_string;
        else if (in_string && t[i] == '\\') {
            if (i + 5 < n && !memcmp(t + i + 1, "u0000", 5))
                return 1;
            i++; /* the escaped character */
        }
    }
    return 0;
}

sf_status sf__dc_entry_encode(const struct sf__cache_id *id, const char *etag, const char *url,
                              uint64_t size, int64_t created, const uint64_t *blocks, size_t nb,
                              char **meta_json, unsigned char t[SF__DC_TRAILER_BYTES])
{
    *meta_json = NULL;
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = j ? cJSON_AddArrayToObject(j, "blocks") : NULL;
    if (!arr) {
        cJSON_Delete(j);
        return SF_ERR_NO_MEMORY;
    }
    cJSON_AddNumberToObject(j, "format", SF__DC_FORMAT_VERSION);
    cJSON_AddStringToObject(j, "url", url);
    cJSON_AddStringToObject(j, "endpoint", id->endpoint);
    cJSON_AddStringToObject(j, "bucket", id->bucket);
    cJSON_AddStringToObject(j, "key", id->key);
    cJSON_AddStringToObject(j, "etag", etag);
    cJSON_AddNumberToObject(j, "size", (double)size);
    cJSON_AddNumberToObject(j, "created", (double)created);
    cJSON_AddNumberToObject(j, "block_bytes", SF__DC_BLOCK_BYTES);
    cJSON_AddStringToObject(j, "checksum", "xxh3-64");
    for (size_t i = 0; i < nb; i++) {
        char hx[17];
        snprintf(hx, sizeof(hx), "%016" PRIx64, blocks[i]);
        cJSON_AddItemToArray(arr, cJSON_CreateString(hx));
    }
    char *mj = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!mj)
        return SF_ERR_NO_MEMORY;
    size_t ml = strlen(mj);
    memset(t, 0, SF__DC_TRAILER_BYTES);
    memcpy(t, TRAILER_MAGIC, 8);
    sf__put_le32(t + 8, SF__DC_FORMAT_VERSION);
    sf__put_le32(t + 12, (uint32_t)ml);
    sf__put_le64(t + 16, size);
    sf__put_le64(t + 24, blocks_digest(blocks, nb));
    sf__put_le64(t + 32, XXH3_64bits(mj, ml));
    sf__put_le64(t + 40, (uint64_t)created);
    sf__put_le64(t + 48, XXH3_64bits(t, 48));
    memcpy(t + 56, TRAILER_END, 8);
    *meta_json = mj;
    return SF_OK;
}

sf_status sf__dc_read_entry(int fd, const struct sf__cache_id *id, const char *want_etag,
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
    /* A file that ends before the size fstat just gave was cut meanwhile: a
     * corrupt entry (fetched again), not an I/O error (the open would fail). */
    char rerr[160];
    sf_status rst = sf__dc_pread_full(fd, t, sizeof(t), toff, rerr, sizeof(rerr));
    if (rst != SF_OK)
        return sf__fail(why, why_len, rst, "cannot read the trailer at offset %" PRIu64 ": %s",
                        toff, rerr);
    if (memcmp(t, TRAILER_MAGIC, 8) != 0 || memcmp(t + 56, TRAILER_END, 8) != 0)
        return sf__fail(why, why_len, SF_ERR_CORRUPT,
                        "bad trailer magic at offset %" PRIu64 " of a file of %" PRIu64
                        " bytes (cut short, or not an entry)",
                        toff, fsize);
    if (XXH3_64bits(t, 48) != sf__get_le64(t + 48))
        return sf__fail(why, why_len, SF_ERR_CORRUPT,
                        "trailer checksum mismatch at offset %" PRIu64, toff);
    uint32_t version = sf__get_le32(t + 8);
    uint32_t meta_len = sf__get_le32(t + 12);
    uint64_t size = sf__get_le64(t + 16);
    if (version != SF__DC_FORMAT_VERSION)
        return sf__fail(why, why_len, SF_ERR_CORRUPT, "entry format %u, expected %d", version,
                        SF__DC_FORMAT_VERSION);
    if (meta_len > META_MAX_BYTES || size > fsize || fsize - size != (uint64_t)meta_len + 64)
        return sf__fail(why, why_len, SF_ERR_CORRUPT,
                        "sizes disagree: data %" PRIu64 " + metadata %u + 64 != file %" PRIu64,
                        size, meta_len, fsize);
    char *mj = malloc((size_t)meta_len + 1);
    if (!mj)
        return SF_ERR_NO_MEMORY;
    rst = sf__dc_pread_full(fd, (unsigned char *)mj, meta_len, size, rerr, sizeof(rerr));
    if (rst != SF_OK) {
        free(mj);
        return sf__fail(why, why_len, rst, "cannot read metadata at offset %" PRIu64 ": %s", size,
                        rerr);
    }
    mj[meta_len] = 0;
    if (XXH3_64bits(mj, meta_len) != sf__get_le64(t + 32)) {
        free(mj);
        return sf__fail(why, why_len, SF_ERR_CORRUPT,
                        "metadata checksum mismatch at offset %" PRIu64, size);
    }
    if (has_nul_escape(mj, meta_len)) {
        free(mj);
        return sf__fail(why, why_len, SF_ERR_CORRUPT,
                        "metadata at offset %" PRIu64 " holds a NUL character (\\u0000)", size);
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
        st2 = sf__fail(why, why_len, SF_ERR_CORRUPT, "entry has ETag %s, expected %s", etag,
                       want_etag);
        goto out;
    }
    size_t nb = sf__dc_n_blocks(size);
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
            int h = sf__dc_hexval(s[k]);
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
        st2 =
            sf__fail(why, why_len, SF_ERR_CORRUPT, "block list does not match the trailer digest");
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

/* ------------------------------------------------------------ checking the data */

sf_status sf__dc_pread_full(int fd, unsigned char *buf, size_t n, uint64_t off, char *err,
                            size_t err_len)
{
    size_t got;
    int rc = sf__pread_full(fd, buf, n, off, &got);
    if (rc)
        return sf__fail(err, err_len, rc > 0 ? SF_ERR_CORRUPT : SF_ERR_IO,
                        "short read at offset %" PRIu64 "%s%s", off + got, rc < 0 ? ": " : "",
                        rc < 0 ? strerror(errno) : "");
    return SF_OK;
}

/* Bytes read at a time while hashing: the piece stays in L2 between the
 * copy and the hash. */
#define HASH_PIECE_BYTES (256u << 10)

/*
 * Hashes bytes [0, size) of fd in blocks; blocks (may be NULL) gets each
 * block's XXH3-64, and the first block that differs from expect (may be
 * NULL) is SF_ERR_CORRUPT naming its bytes.
 *
 * With pread, not through a mapping: a mapping faults (SIGBUS, the process
 * dies) when another program cuts the file short while it is read, where
 * pread returns a short read, so an entry truncated during its check is a
 * corrupt entry like any other. The bytes are in the page cache either way
 * (just written, or about to be read); copied in pieces of 256 KiB, they are
 * hashed while in L2: measured no slower than hashing the mapping in place
 * (page faults and giving the pages back cost what the copy costs), and
 * nothing of the entry stays mapped.
 */
static sf_status hash_fd(int fd, uint64_t size, uint64_t *blocks, const uint64_t *expect, char *err,
                         size_t err_len)
{
    unsigned char *buf = malloc(HASH_PIECE_BYTES);
    XXH3_state_t *s = XXH3_createState();
    sf_status st = buf && s ? SF_OK : SF_ERR_NO_MEMORY;
    for (size_t i = 0; st == SF_OK && i < sf__dc_n_blocks(size); i++) {
        uint64_t off = (uint64_t)i * SF__DC_BLOCK_BYTES;
        size_t n = (size_t)(size - off < SF__DC_BLOCK_BYTES ? size - off : SF__DC_BLOCK_BYTES);
        XXH3_64bits_reset(s);
        for (size_t done = 0; st == SF_OK && done < n; done += HASH_PIECE_BYTES) {
            size_t k = n - done < HASH_PIECE_BYTES ? n - done : HASH_PIECE_BYTES;
            st = sf__dc_pread_full(fd, buf, k, off + done, err, err_len);
            if (st == SF_OK)
                XXH3_64bits_update(s, buf, k);
        }
        if (st != SF_OK)
            break;
        uint64_t h = XXH3_64bits_digest(s);
        if (blocks)
            blocks[i] = h;
        if (expect && expect[i] != h)
            st =
                sf__fail(err, err_len, SF_ERR_CORRUPT,
                         "data checksum mismatch in bytes %" PRIu64 "..%" PRIu64, off, off + n - 1);
    }
    XXH3_freeState(s);
    free(buf);
    return st;
}

sf_status sf__dc_verify_fd(int fd, const struct sf__dc_meta *meta, char *err, size_t err_len)
{
    return hash_fd(fd, meta->size, NULL, meta->blocks, err, err_len);
}
