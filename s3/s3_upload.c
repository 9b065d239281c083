/*
 * Uploads through the public S3 client: sf_s3_put() (one PUT of a file or
 * of memory) and sf_s3_upload_file() (one PUT up to the part size, else a
 * multipart upload whose parts go out in parallel).
 */
#include "s3/etag.h"
#include "s3/fetch.h"
#include "s3/s3_client_impl.h"
#include "s3/sigv4.h"
#include "common/strbuf.h"
#include "common/file.h"
#include "s3/uri.h"
#include "s3/xml.h"
#include "shardfeed_s3.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ put */

#define HASH_READ_BYTES (1u << 20)

/* Hex SHA-256 of len bytes of fd from offset, read with pread(). */
static sf_status sha256_fd(int fd, uint64_t offset, uint64_t len, char out[SF__SHA256_HEX_LEN + 1],
                           char *msg, size_t msg_len)
{
    unsigned char *buf = malloc(HASH_READ_BYTES);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    sf_status st = SF_OK;
    if (!buf || !ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        snprintf(msg, msg_len, "cannot set up SHA-256");
        st = SF_ERR_NO_MEMORY;
    }
    uint64_t done = 0;
    while (st == SF_OK && done < len) {
        size_t want = len - done < HASH_READ_BYTES ? (size_t)(len - done) : HASH_READ_BYTES;
        ssize_t r = pread(fd, buf, want, (off_t)(offset + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(msg, msg_len, "read at offset %" PRIu64 ": %s", offset + done,
                     r < 0 ? strerror(errno) : "the file shrank");
            st = r < 0 ? SF_ERR_IO : SF_ERR_CHANGED;
            break;
        }
        EVP_DigestUpdate(ctx, buf, (size_t)r);
        done += (uint64_t)r;
    }
    unsigned char md[32];
    unsigned int md_len = 0;
    if (st == SF_OK && (!EVP_DigestFinal_ex(ctx, md, &md_len) || md_len != 32)) {
        snprintf(msg, msg_len, "SHA-256 failed");
        st = SF_ERR_INTERNAL;
    }
    if (st == SF_OK)
        sf__hex_encode(md, 32, out);
    EVP_MD_CTX_free(ctx);
    free(buf);
    return st;
}

SF_API sf_status sf_s3_put(struct sf_s3 *s3, const char *url, const char *path, const void *data,
                           size_t len, char *etag_out, size_t etag_len)
{
    if (etag_out && etag_len)
        etag_out[0] = '\0';
    if (!s3 || !url)
        return SF_ERR_INVALID_ARGUMENT;
    if (path && data)
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT,
                              "%s: a PUT body is a file or memory, not both", url);
    if (!path && !data && len)
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: %zu body bytes at NULL", url, len);
    struct sf__locator loc;
    sf_status st = sf__s3_parse_url(s3, url, &loc);
    if (st != SF_OK)
        return st;
    if (loc.kind != SF__LOC_S3 || !*loc.bucket || !*loc.key) {
        sf__locator_free(&loc);
        return sf__s3_set_err(s3, SF_ERR_UNSUPPORTED, "%s: PUT needs s3://bucket/key", url);
    }
    char hash[SF__SHA256_HEX_LEN + 1];
    struct sf__body body = {.data = data, .fd = -1, .len = len, .sha256_hex = hash};
    if (path) {
        struct stat sb;
        body.fd = sf__open_stat(path, &sb);
        if (body.fd < 0) {
            int e = errno;
            st = sf__s3_set_err(s3, sf__errno_status(e), "%s: %s", path, strerror(e));
        } else if (!S_ISREG(sb.st_mode)) {
            st = sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: not a regular file", path);
        } else {
            body.len = (uint64_t)sb.st_size;
        }
    }
    if (st == SF_OK && body.len > SF_PUT_MAX_BYTES)
        st = sf__s3_set_err(s3, SF_ERR_LIMIT, "%s: %" PRIu64 " bytes, over the 5 GiB of one PUT",
                            url, body.len);
    if (st == SF_OK && path) {
        char msg[512];
        st = sha256_fd(body.fd, 0, body.len, hash, msg, sizeof(msg));
        if (st != SF_OK)
            sf__s3_set_err(s3, st, "%s: %s", path, msg);
    } else if (st == SF_OK) {
        sf__sha256_hex(data ? data : "", len, hash);
    }
    if (st == SF_OK)
        st = sf__s3_ensure_creds(s3, loc.display);
    if (st == SF_OK) {
        struct sf__response r;
        st = sf__engine_call_body(s3->engine, "PUT", &loc, NULL, &body, 4096, &r);
        if (st != SF_OK)
            sf__s3_set_err(s3, st, "%s", r.errmsg);
        else if (etag_out && etag_len)
            snprintf(etag_out, etag_len, "%s", r.etag);
        sf__response_free(&r);
    }
    if (body.fd >= 0)
        close(body.fd);
    sf__locator_free(&loc);
    return st;
}

/* ------------------------------------------------------------ multipart upload */

#define UPLOAD_PARALLEL_DEFAULT 4u
#define UPLOAD_PARALLEL_MAX     64u
#define UPLOAD_ID_MAX           1024
#define UPLOAD_SMALL_BODY       (64u << 10)

SF_API void sf_s3_upload_options_init_default(struct sf_s3_upload_options *o)
{
    memset(o, 0, sizeof(*o));
    o->part_bytes = SF_UPLOAD_PART_BYTES_DEFAULT;
    o->parallel_parts = UPLOAD_PARALLEL_DEFAULT;
}

/* One multipart upload in progress; the part workers share it. */
struct mpu {
    struct sf_s3 *s3;
    const struct sf__locator *loc;
    int fd;
    uint64_t size, part_bytes;
    unsigned n_parts;
    char *query_id; /* the upload id, URI-encoded for the query */
    char (*etags)[128];
    pthread_mutex_t lock; /* guards the fields below */
    unsigned next;        /* index of the next part to send */
    sf_status st;         /* first failure */
    char err[1024];
};

static void mpu_fail(struct mpu *m, sf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void mpu_fail(struct mpu *m, sf_status st, const char *fmt, ...)
{
    pthread_mutex_lock(&m->lock);
    if (m->st == SF_OK) {
        m->st = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->err, sizeof(m->err), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&m->lock);
}

static void *mpu_worker(void *arg)
{
    struct mpu *m = arg;
    for (;;) {
        pthread_mutex_lock(&m->lock);
        int stop = m->st != SF_OK || m->next == m->n_parts;
        unsigned i = m->next;
        if (!stop)
            m->next++;
        pthread_mutex_unlock(&m->lock);
        if (stop)
            break;
        uint64_t off = (uint64_t)i * m->part_bytes;
        uint64_t len = m->size - off < m->part_bytes ? m->size - off : m->part_bytes;
        char hash[SF__SHA256_HEX_LEN + 1], msg[512];
        sf_status st = sha256_fd(m->fd, off, len, hash, msg, sizeof(msg));
        if (st != SF_OK) {
            mpu_fail(m, st, "%s: part %u of %u (offset %" PRIu64 "): %s", m->loc->display, i + 1,
                     m->n_parts, off, msg);
            break;
        }
        char query[UPLOAD_ID_MAX * 3 + 64];
        snprintf(query, sizeof(query), "partNumber=%u&uploadId=%s", i + 1, m->query_id);
        struct sf__body body = {.fd = m->fd, .offset = off, .len = len, .sha256_hex = hash};
        struct sf__response r;
        st = sf__engine_call_body(m->s3->engine, "PUT", m->loc, query, &body, 4096, &r);
        if (st == SF_OK && !r.etag[0])
            st = SF_ERR_HTTP;
        if (st != SF_OK)
            mpu_fail(m, st, "part %u of %u (offset %" PRIu64 ", %" PRIu64 " bytes): %s", i + 1,
                     m->n_parts, off, len,
                     r.errmsg[0] ? r.errmsg : "the server's answer has no ETag");
        else
            snprintf(m->etags[i], sizeof(m->etags[i]), "%s", r.etag);
        sf__response_free(&r);
        if (st != SF_OK)
            break;
    }
    return NULL;
}

static void xml_text(struct sf__strbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '&')
            sf__strbuf_puts(b, "&amp;");
        else if (*s == '<')
            sf__strbuf_puts(b, "&lt;");
        else if (*s == '>')
            sf__strbuf_puts(b, "&gt;");
        else
            sf__strbuf_putc(b, *s);
    }
}

/* The <ETag> of a CompleteMultipartUploadResult, with &quot; decoded, in
 * the one form of s3/etag.h. */
static void complete_etag(const struct sf__strbuf *body, char *out, size_t out_len)
{
    out[0] = '\0';
    const char *s = sf__strbuf_str(body);
    const char *a = strstr(s, "<ETag>");
    const char *z = a ? strstr(a, "</ETag>") : NULL;
    if (!z)
        return;
    size_t o = 0;
    for (const char *p = a + 6; p < z && o + 1 < out_len;) {
        if (!strncmp(p, "&quot;", 6)) {
            out[o++] = '"';
            p += 6;
        } else if (!strncmp(p, "&#34;", 5)) {
            out[o++] = '"';
            p += 5;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    sf__etag_canon(out, out_len, out, o); /* as the headers' ETags are read */
}

/* Starts the upload: the server's UploadId, URI-encoded into *query_id. */
static sf_status mpu_create(struct sf_s3 *s3, const struct sf__locator *loc, char **query_id)
{
    struct sf__body empty = {.data = "", .fd = -1, .len = 0, .sha256_hex = SF__EMPTY_SHA256};
    struct sf__response r;
    sf_status st =
        sf__engine_call_body(s3->engine, "POST", loc, "uploads", &empty, UPLOAD_SMALL_BODY, &r);
    if (st != SF_OK) {
        sf__s3_set_err(s3, st, "starting the multipart upload: %s", r.errmsg);
        sf__response_free(&r);
        return st;
    }
    char id[UPLOAD_ID_MAX], err[256];
    st = sf__xml_parse_initiate(sf__strbuf_str(&r.body), r.body.len, id, sizeof(id), err,
                                sizeof(err));
    sf__response_free(&r);
    if (st != SF_OK)
        return sf__s3_set_err(s3, st, "%s: CreateMultipartUpload answer: %s", loc->display, err);
    struct sf__strbuf q;
    sf__strbuf_init(&q, 0);
    sf__uri_encode(&q, id, strlen(id), 1);
    *query_id = sf__strbuf_take(&q);
    return *query_id ? SF_OK : SF_ERR_NO_MEMORY;
}

static sf_status mpu_complete(struct mpu *m, char *etag_out, size_t etag_len)
{
    struct sf__strbuf x;
    sf__strbuf_init(&x, 0);
    sf__strbuf_puts(&x,
                    "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for (unsigned i = 0; i < m->n_parts; i++) {
        sf__strbuf_printf(&x, "<Part><PartNumber>%u</PartNumber><ETag>", i + 1);
        xml_text(&x, m->etags[i]);
        sf__strbuf_puts(&x, "</ETag></Part>");
    }
    sf__strbuf_puts(&x, "</CompleteMultipartUpload>");
    if (x.err != SF_OK) {
        sf__strbuf_free(&x);
        return sf__s3_set_err(m->s3, SF_ERR_NO_MEMORY, "%s: out of memory", m->loc->display);
    }
    char hash[SF__SHA256_HEX_LEN + 1];
    sf__sha256_hex(sf__strbuf_str(&x), x.len, hash);
    struct sf__body body = {.data = sf__strbuf_str(&x), .fd = -1, .len = x.len, .sha256_hex = hash};
    char query[UPLOAD_ID_MAX * 3 + 32];
    snprintf(query, sizeof(query), "uploadId=%s", m->query_id);
    struct sf__response r;
    sf_status st =
        sf__engine_call_body(m->s3->engine, "POST", m->loc, query, &body, UPLOAD_SMALL_BODY, &r);
    sf__strbuf_free(&x);
    if (st != SF_OK) {
        sf__s3_set_err(m->s3, st, "completing the multipart upload of %u parts: %s", m->n_parts,
                       r.errmsg);
    } else {
        /* S3 may answer 200 and still fail: the error is then in the body */
        struct sf__s3_error e;
        if (sf__xml_parse_error(sf__strbuf_str(&r.body), r.body.len, &e) == SF_OK) {
            st = SF_ERR_HTTP;
            sf__s3_set_err(m->s3, st, "%s: completing the multipart upload: %s: %s",
                           m->loc->display, e.code, e.message);
        } else if (etag_out && etag_len) {
            complete_etag(&r.body, etag_out, etag_len);
        }
    }
    sf__response_free(&r);
    return st;
}

/* Aborts the upload so no part stays stored; appends a failure to the message. */
static void mpu_abort(struct mpu *m)
{
    char query[UPLOAD_ID_MAX * 3 + 32];
    snprintf(query, sizeof(query), "uploadId=%s", m->query_id);
    struct sf__response r;
    sf_status st = sf__engine_call(m->s3->engine, "DELETE", m->loc, query, 4096, &r);
    if (st != SF_OK) {
        char msg[1024];
        sf_s3_errmsg(m->s3, msg, sizeof(msg));
        sf__s3_set_err(m->s3, SF_OK,
                       "%s (and aborting the upload failed, its parts may stay stored: %s)", msg,
                       r.errmsg);
    }
    sf__response_free(&r);
}

SF_API sf_status sf_s3_upload_file(struct sf_s3 *s3, const char *url, const char *path,
                                   const struct sf_s3_upload_options *o, char *etag_out,
                                   size_t etag_len)
{
    if (etag_out && etag_len)
        etag_out[0] = '\0';
    if (!s3 || !url || !path)
        return SF_ERR_INVALID_ARGUMENT;
    struct sf_s3_upload_options def;
    sf_s3_upload_options_init_default(&def);
    if (!o)
        o = &def;
    uint64_t part = o->part_bytes ? o->part_bytes : SF_UPLOAD_PART_BYTES_DEFAULT;
    unsigned parallel = o->parallel_parts ? o->parallel_parts : UPLOAD_PARALLEL_DEFAULT;
    if (part < SF_UPLOAD_PART_BYTES_MIN || part > SF_UPLOAD_PART_BYTES_MAX)
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT,
                              "%s: part size %" PRIu64 " is outside S3's 5 MiB..5 GiB", url, part);
    if (parallel > UPLOAD_PARALLEL_MAX)
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: %u parallel parts, at most %u", url,
                              parallel, UPLOAD_PARALLEL_MAX);
    struct stat sb;
    int fd = sf__open_stat(path, &sb);
    if (fd < 0) {
        int e = errno;
        return sf__s3_set_err(s3, sf__errno_status(e), "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size <= part) {
        close(fd);
        return sf_s3_put(s3, url, path, NULL, 0, etag_out, etag_len);
    }
    if (size > SF_UPLOAD_MAX_BYTES) {
        close(fd);
        return sf__s3_set_err(s3, SF_ERR_LIMIT,
                              "%s: %" PRIu64 " bytes, over S3's 5 TiB for one object", url, size);
    }
    if ((size + part - 1) / part > SF_UPLOAD_MAX_PARTS) {
        /* the smallest whole number of MiB that fits in 10,000 parts */
        uint64_t mib = 1ull << 20;
        part = ((size + SF_UPLOAD_MAX_PARTS - 1) / SF_UPLOAD_MAX_PARTS + mib - 1) / mib * mib;
    }
    struct sf__locator loc;
    sf_status st = sf__s3_parse_url(s3, url, &loc);
    if (st != SF_OK) {
        close(fd);
        return st;
    }
    if (loc.kind != SF__LOC_S3 || !*loc.bucket || !*loc.key) {
        close(fd);
        sf__locator_free(&loc);
        return sf__s3_set_err(s3, SF_ERR_UNSUPPORTED, "%s: an upload needs s3://bucket/key", url);
    }
    struct mpu m = {
        .s3 = s3,
        .loc = &loc,
        .fd = fd,
        .size = size,
        .part_bytes = part,
        .n_parts = (unsigned)((size + part - 1) / part),
    };
    pthread_mutex_init(&m.lock, NULL);
    m.etags = calloc(m.n_parts, sizeof(*m.etags));
    st = m.etags ? sf__s3_ensure_creds(s3, loc.display) : SF_ERR_NO_MEMORY;
    if (st == SF_OK)
        st = mpu_create(s3, &loc, &m.query_id);
    if (st == SF_OK) {
        if (parallel > m.n_parts)
            parallel = m.n_parts;
        pthread_t threads[UPLOAD_PARALLEL_MAX];
        unsigned started = 0;
        for (; started < parallel; started++)
            if (pthread_create(&threads[started], NULL, mpu_worker, &m) != 0)
                break;
        if (started == 0)
            mpu_fail(&m, SF_ERR_NO_MEMORY, "%s: cannot start an upload thread", loc.display);
        for (unsigned i = 0; i < started; i++)
            pthread_join(threads[i], NULL);
        st = m.st;
        if (st != SF_OK)
            sf__s3_set_err(s3, st, "%s", m.err);
        else
            st = mpu_complete(&m, etag_out, etag_len);
        if (st != SF_OK)
            mpu_abort(&m);
    }
    free(m.query_id);
    free(m.etags);
    pthread_mutex_destroy(&m.lock);
    close(fd);
    sf__locator_free(&loc);
    return st;
}
