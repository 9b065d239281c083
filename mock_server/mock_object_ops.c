/* Object operations: GetObject and HeadObject (conditions, ranges, sendfile or
 * a paced callback body with faults), DeleteObject, and PutObject (the
 * temporary file, its MD5 and SHA-256, the ETag answer) whose body path is
 * shared with UploadPart. The objects themselves live in objects.c. */

#include "mock_server/mock_internal.h"

#include "mock_server/checksum.h"
#include "mock_server/chunked.h"
#include "mock_server/faults.h"
#include "mock_server/objects.h"
#include "mock_server/stats.h"
#include "mock_server/uploads.h"
#include "s3/sigv4.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/io.h"
#include "common/strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_PUT_BYTES (5ull << 30) /* S3's single-PUT limit */
#define BODY_BLOCK    (256 * 1024)

/* ETag comparison for If-Match / If-None-Match: a list of quoted or bare
 * tags, or "*". */
static int etag_matches(const char *cond, const char *etag_quoted)
{
    const char *bare = etag_quoted + 1;
    size_t bare_len = strlen(etag_quoted) - 2;
    const char *p = cond;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n > 0 && p[n - 1] == ' ')
            n--;
        const char *t = p;
        if (n >= 2 && t[0] == 'W' && t[1] == '/') {
            t += 2;
            n -= 2;
        }
        if (n >= 2 && t[0] == '"' && t[n - 1] == '"') {
            t++;
            n -= 2;
        }
        if ((n == 1 && t[0] == '*') || (n == bare_len && memcmp(t, bare, n) == 0))
            return 1;
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

enum range_result { RANGE_NONE, RANGE_OK, RANGE_UNSATISFIABLE };

/* Parses one "bytes=" range as S3 does: anything malformed or with several
 * ranges is ignored (whole object). */
static enum range_result parse_range(const char *h, uint64_t size, uint64_t *start, uint64_t *end)
{
    if (!h || strncmp(h, "bytes=", 6) != 0)
        return RANGE_NONE;
    const char *p = h + 6;
    if (strchr(p, ','))
        return RANGE_NONE;
    const char *dash = strchr(p, '-');
    if (!dash)
        return RANGE_NONE;
    char *e1;
    errno = 0;
    if (dash == p) { /* suffix: bytes=-n */
        if (dash[1] < '0' || dash[1] > '9')
            return RANGE_NONE;
        unsigned long long n = strtoull(dash + 1, &e1, 10);
        if (*e1)
            return RANGE_NONE;
        if (errno == ERANGE)
            n = ~0ull; /* a suffix longer than any object: the whole object */
        if (n == 0 || size == 0)
            return RANGE_UNSATISFIABLE;
        *start = n >= size ? 0 : size - n;
        *end = size - 1;
        return RANGE_OK;
    }
    if (*p < '0' || *p > '9')
        return RANGE_NONE;
    unsigned long long a = strtoull(p, &e1, 10);
    if (e1 != dash || errno)
        return RANGE_NONE;
    unsigned long long b;
    if (dash[1] == '\0') {
        b = size ? size - 1 : 0;
    } else {
        if (dash[1] < '0' || dash[1] > '9')
            return RANGE_NONE;
        char *e2;
        b = strtoull(dash + 1, &e2, 10);
        if (*e2)
            return RANGE_NONE;
        if (errno == ERANGE)
            b = ~0ull; /* past any object's end: clamped below */
        if (b < a)
            return RANGE_NONE;
        if (size && b >= size)
            b = size - 1;
    }
    if (a >= size)
        return RANGE_UNSATISFIABLE;
    *start = a;
    *end = b;
    return RANGE_OK;
}

/* The bytes the peer has acknowledged on conn's socket (Linux TCP_INFO). */
static int tcp_bytes_acked(struct MHD_Connection *conn, uint64_t *out)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return -1;
    struct tcp_info ti;
    memset(&ti, 0, sizeof(ti));
    socklen_t len = sizeof(ti);
    if (getsockopt(ci->connect_fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked))
        return -1;
    *out = ti.tcpi_bytes_acked;
    return 0;
}

/* A GET body that ended early: takes back from bytes_sent what did not go
 * out. What went out is what the peer's TCP acknowledged since the answer
 * was queued (the headers included), and for callback bodies at most what
 * was handed to libmicrohttpd. A reset fault counted its bytes exactly
 * (reset_connection() waits until they left) and its disconnected socket
 * has no TCP counters left. */
void mock_body_ended_early(struct request *rq, struct MHD_Connection *conn)
{
    uint64_t sent = rq->body_counted;
    if (rq->body_is_callback && rq->body_handed < sent)
        sent = rq->body_handed;
    uint64_t acked;
    if (rq->have_tcp_start && !rq->body_reset && tcp_bytes_acked(conn, &acked) == 0 &&
        acked >= rq->tcp_acked_start && acked - rq->tcp_acked_start < sent)
        sent = acked - rq->tcp_acked_start;
    if (sent < rq->body_counted)
        mock_stats_unsent(rq->srv->stats, rq->body_counted - sent);
}

struct body_src {
    struct mock_server *srv;
    struct MHD_Connection *conn;
    uint64_t *handed; /* the request's count of bytes handed over */
    int *reset;       /* set when a reset fault cuts the connection */
    int fd;
    uint64_t offset;
    uint64_t len;
    int64_t reset_at;
    int64_t stall_at;
    int stall_ms;
    int stalled;
    uint64_t bandwidth;
    double t_start;
};

/*
 * Resets the connection after exactly the bytes handed out so far: first
 * wait (bounded) until the kernel has sent them all, since an RST discards
 * whatever is still queued; then disconnect the socket, which makes Linux
 * send RST at once. libmicrohttpd's own shutdown and close that follow find
 * the socket already disconnected and can no longer send a FIN first.
 */
static void reset_connection(struct body_src *b)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(b->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    mock_stats_fault(b->srv->stats, "reset");
    *b->reset = 1;
    if (!ci)
        return;
    int fd = ci->connect_fd;
    for (int waited_ms = 0; waited_ms < 5000; waited_ms += 2) {
        int queued = 0;
        if (ioctl(fd, SIOCOUTQ, &queued) != 0 || queued == 0)
            break;
        if (mock_sleep_ms_interruptible(b->srv, 2) != 0)
            break;
    }
    struct sockaddr unspec;
    memset(&unspec, 0, sizeof(unspec));
    unspec.sa_family = AF_UNSPEC;
    connect(fd, &unspec, sizeof(unspec));
    if (!b->srv->cfg.quiet)
        fprintf(stderr, "fault: connection reset after %llu body bytes\n",
                (unsigned long long)b->reset_at);
}

static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct body_src *b = cls;
    if (pos >= b->len)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (b->reset_at >= 0 && pos >= (uint64_t)b->reset_at) {
        reset_connection(b);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (b->stall_at >= 0 && !b->stalled && pos >= (uint64_t)b->stall_at) {
        b->stalled = 1;
        mock_stats_fault(b->srv->stats, "stall");
        if (!b->srv->cfg.quiet)
            fprintf(stderr, "fault: stalling %d ms after %llu body bytes\n", b->stall_ms,
                    (unsigned long long)pos);
        if (mock_sleep_ms_interruptible(b->srv, b->stall_ms) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    uint64_t n = b->len - pos;
    if (n > max)
        n = max;
    if (b->reset_at >= 0 && n > (uint64_t)b->reset_at - pos)
        n = (uint64_t)b->reset_at - pos;
    if (b->stall_at >= 0 && !b->stalled && n > (uint64_t)b->stall_at - pos)
        n = (uint64_t)b->stall_at - pos;
    if (b->bandwidth) {
        uint64_t slice = b->bandwidth / 20 + 1; /* ~50 ms of data per write */
        if (n > slice)
            n = slice;
        double due = b->t_start + (double)(pos + n) / (double)b->bandwidth;
        double wait = due - sf__now_s();
        if (wait > 0 && mock_sleep_ms_interruptible(b->srv, (int)(wait * 1000.0) + 1) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (n == 0)
        return 0;
    ssize_t got;
    do
        got = pread(b->fd, buf, (size_t)n, (off_t)(b->offset + pos));
    while (got < 0 && errno == EINTR);
    if (got <= 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    *b->handed = pos + (uint64_t)got;
    return got;
}

static void body_free(void *cls)
{
    struct body_src *b = cls;
    close(b->fd);
    free(b);
}

static void changed_etag(const char *etag, char out[MOCK_ETAG_LEN + 1])
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s/changed", etag);
    char hex[SF__SHA256_HEX_LEN + 1];
    sf__sha256_hex(buf, strlen(buf), hex);
    out[0] = '"';
    memcpy(out + 1, hex, 32);
    out[33] = '"';
    out[34] = '\0';
}

enum MHD_Result mock_op_get_object(struct request *rq, struct MHD_Connection *conn, int head)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    char *path = mock_store_path(srv->store, rq->bucket, rq->key);
    if (!path)
        return MHD_NO;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    struct stat sb;
    int missing = fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode);
    uint64_t size = missing ? 0 : (uint64_t)sb.st_size;

    const char *range_h = mock_header(conn, "Range");
    uint64_t start = 0, end = size ? size - 1 : 0;
    enum range_result rr = missing ? RANGE_NONE : parse_range(range_h, size, &start, &end);
    uint64_t body_len = rr == RANGE_OK ? end - start + 1 : size;

    struct mock_fault_plan plan;
    char ferr[256];
    if (mock_faults_plan(srv->faults, rq->target, range_h, mock_header(conn, FAULT_HEADER),
                         head ? MOCK_OP_HEAD : MOCK_OP_GET, body_len, &plan, ferr,
                         sizeof(ferr)) != SF_OK) {
        if (fd >= 0)
            close(fd);
        mock_set_error(&e, 400, "InvalidArgument", "%s", ferr);
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (plan.latency_ms && mock_sleep_ms_interruptible(srv, plan.latency_ms) != 0) {
        if (fd >= 0)
            close(fd);
        return MHD_NO;
    }
    if (plan.status) {
        if (fd >= 0)
            close(fd);
        return mock_respond_fault_status(rq, conn, &plan);
    }
    if (missing) {
        if (fd >= 0)
            close(fd);
        if (!mock_bucket_exists(srv->store, rq->bucket))
            mock_set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        else
            mock_set_error(&e, 404, "NoSuchKey", "The specified key does not exist.");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    char etag[MOCK_ETAG_LEN + 1];
    char *obj_path = mock_store_path(srv->store, rq->bucket, rq->key);
    sf_status etag_st = mock_store_etag(srv->store, obj_path, fd, &sb, etag);
    free(obj_path);
    if (etag_st != SF_OK) {
        close(fd);
        mock_set_error(&e, 500, "InternalError", "Cannot read the object");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    const char *fault = NULL;
    if (plan.etag_changed) {
        changed_etag(etag, etag);
        fault = "etag_changed";
    }
    const char *if_match = mock_header(conn, "If-Match");
    const char *if_none = mock_header(conn, "If-None-Match");
    if (if_match && !etag_matches(if_match, etag)) {
        close(fd);
        mock_set_error(&e, 412, "PreconditionFailed",
                       "At least one of the pre-conditions you specified did not hold");
        e.extra_xml = strdup("<Condition>If-Match</Condition>");
        return mock_respond_error(rq, conn, &e, fault);
    }
    char last_mod[40];
    mock_format_http_date(sb.st_mtim.tv_sec, last_mod);
    if (if_none && etag_matches(if_none, etag)) {
        close(fd);
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (resp) {
            MHD_add_response_header(resp, "ETag", etag);
            MHD_add_response_header(resp, "Last-Modified", last_mod);
        }
        return mock_queue(rq, conn, 304, resp, 0, fault);
    }
    if (rr == RANGE_UNSATISFIABLE) {
        close(fd);
        mock_set_error(&e, 416, "InvalidRange", "The requested range is not satisfiable");
        struct sf__strbuf x;
        sf__strbuf_init(&x, 0);
        mock_xml_elem(&x, "RangeRequested", range_h, 0);
        sf__strbuf_printf(&x, "<ActualObjectSize>%llu</ActualObjectSize>",
                          (unsigned long long)size);
        e.extra_xml = sf__strbuf_take(&x);
        return mock_respond_error(rq, conn, &e, NULL);
    }
    int ranged = rr == RANGE_OK;
    if (ranged && plan.no206) {
        ranged = 0;
        start = 0;
        body_len = size;
        fault = "no206";
    }
    if (plan.reset_at >= 0 && (uint64_t)plan.reset_at >= body_len)
        plan.reset_at = body_len ? (int64_t)body_len - 1 : -1;
    if (plan.reset_at >= 0)
        fault = "reset";
    if (plan.stall_at >= 0)
        fault = "stall";

    struct MHD_Response *resp;
    int body_faults = !head && (plan.reset_at >= 0 || plan.stall_at >= 0 || plan.bandwidth);
    if (body_faults) {
        struct body_src *src = calloc(1, sizeof(*src));
        if (!src) {
            close(fd);
            return MHD_NO;
        }
        *src = (struct body_src){
            .srv = srv,
            .conn = conn,
            .handed = &rq->body_handed,
            .reset = &rq->body_reset,
            .fd = fd,
            .offset = start,
            .len = body_len,
            .reset_at = plan.reset_at,
            .stall_at = plan.stall_at,
            .stall_ms = plan.stall_ms,
            .bandwidth = plan.bandwidth,
            .t_start = sf__now_s(),
        };
        resp = MHD_create_response_from_callback(body_len, BODY_BLOCK, body_read, src, body_free);
        if (!resp)
            body_free(src);
    } else {
        /* The response owns fd from here; plain GETs go out with sendfile. */
        resp = MHD_create_response_from_fd_at_offset64(body_len, fd, start);
        if (!resp)
            close(fd);
    }
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "ETag", etag);
    MHD_add_response_header(resp, "Last-Modified", last_mod);
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    MHD_add_response_header(resp, "Content-Type", "binary/octet-stream");
    if (ranged) {
        if (plan.no_content_range) {
            fault = "no_content_range";
        } else {
            char cr[96];
            snprintf(cr, sizeof(cr), "bytes %llu-%llu/%llu", (unsigned long long)start,
                     (unsigned long long)(start + body_len - 1), (unsigned long long)size);
            MHD_add_response_header(resp, "Content-Range", cr);
        }
    }
    uint64_t sent = plan.reset_at >= 0 && !head ? (uint64_t)plan.reset_at : body_len;
    if (!head && sent > 0) {
        rq->body_tracked = 1;
        rq->body_counted = sent;
        rq->body_is_callback = body_faults;
        rq->have_tcp_start = tcp_bytes_acked(conn, &rq->tcp_acked_start) == 0;
    }
    return mock_queue(rq, conn, ranged ? 206 : 200, resp, sent, fault);
}

/* Removes now-empty directories between a deleted key and its bucket. */
static void prune_parents(struct mock_server *srv, const char *bucket, const char *key)
{
    char *k = strdup(key);
    if (!k)
        return;
    char *slash;
    while ((slash = strrchr(k, '/')) != NULL) {
        *slash = '\0';
        char *dir = mock_store_path(srv->store, bucket, k);
        int rc = dir ? rmdir(dir) : -1;
        free(dir);
        if (rc != 0)
            break;
    }
    free(k);
}

enum MHD_Result mock_op_delete_object(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    if (!mock_bucket_exists(rq->srv->store, rq->bucket)) {
        mock_set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    char *path = mock_store_path(rq->srv->store, rq->bucket, rq->key);
    if (!path)
        return MHD_NO;
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && unlink(path) == 0) {
        mock_store_forget_etag(path);
        prune_parents(rq->srv, rq->bucket, rq->key);
    }
    free(path);
    return mock_respond_empty(rq, conn, 204);
}

/* mkdir -p for the directories of key inside the bucket. */
int mock_make_parents(struct mock_server *srv, const char *bucket, const char *key)
{
    char *k = strdup(key);
    if (!k)
        return -1;
    for (char *p = strchr(k, '/'); p; p = strchr(p + 1, '/')) {
        *p = '\0';
        char *dir = mock_store_path(srv->store, bucket, k);
        int rc = dir ? mkdir(dir, 0755) : -1;
        int err = errno;
        free(dir);
        *p = '/';
        if (rc != 0 && err != EEXIST) {
            free(k);
            return -1;
        }
    }
    free(k);
    return 0;
}

void mock_upload_abort(struct request *rq)
{
    sf__temp_discard(&rq->up_fd, &rq->up_tmp);
}

void mock_format_etag(const unsigned char md5[16], char out[MOCK_ETAG_LEN + 1])
{
    out[0] = '"';
    sf__hex_encode(md5, 16, out + 1);
    out[33] = '"';
    out[34] = '\0';
}

/* The answer of a stored PutObject or UploadPart: its ETag and, as S3, the
 * checksums that were checked. */
enum MHD_Result mock_respond_stored(struct request *rq, struct MHD_Connection *conn,
                                    const char *etag)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp) {
        MHD_add_response_header(resp, "ETag", etag);
        for (int i = 0; i < MOCK_CK_COUNT; i++)
            if (rq->up_ck_echo[i][0])
                MHD_add_response_header(resp, mock_checksum_header(i), rq->up_ck_echo[i]);
    }
    return mock_queue(rq, conn, 200, resp, 0, NULL);
}

enum MHD_Result mock_op_put_object_begin(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (mock_header(conn, "x-amz-copy-source")) {
        mock_set_error(&e, 501, "NotImplemented", "%s is not supported by the mock",
                       rq->part_number ? "UploadPartCopy" : "CopyObject");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (!mock_bucket_exists(srv->store, rq->bucket)) {
        mock_set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    const char *payload = mock_header(conn, "x-amz-content-sha256");
    enum mock_chunked_mode chunked_mode;
    int chunked = mock_chunked_mode_of(payload, &chunked_mode) == 0;
    /* an aws-chunked body's size is the decoded one */
    const char *clen =
        mock_header(conn, chunked ? "x-amz-decoded-content-length" : "Content-Length");
    if (chunked && !mock_parse_decimal_u64(clen, &rq->up_decoded_len)) {
        mock_set_error(&e, 411, "MissingContentLength",
                       "An aws-chunked upload of %s needs x-amz-decoded-content-length (a decimal "
                       "byte count)",
                       rq->target);
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (clen && strtoull(clen, NULL, 10) > MAX_PUT_BYTES) {
        mock_set_error(&e, 400, "EntityTooLarge",
                       "Your proposed upload exceeds the maximum "
                       "allowed size");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (rq->part_number &&
        mock_uploads_check(srv->uploads, rq->bucket, rq->key, rq->upload_id) != SF_OK)
        return mock_respond_no_such_upload(rq, conn);
    if (payload && strlen(payload) == SF__SHA256_HEX_LEN) {
        rq->up_check_sha = 1;
        memcpy(rq->up_expect_sha, payload, SF__SHA256_HEX_LEN + 1);
    }
    if (mock_body_checksums_begin(rq, conn, chunked, &e) != 0)
        return mock_respond_error(rq, conn, &e, NULL);
    if (chunked && mock_body_chunked_begin(rq, chunked_mode, payload, &e) != 0)
        return mock_respond_error(rq, conn, &e, NULL);
    char *dir = mock_store_path(srv->store, rq->bucket, NULL);
    /* a part's file keeps its temporary name until the upload ends */
    const char *kind = rq->part_number ? "part" : "upload";
    size_t n = dir ? strlen(dir) + sizeof("/" MOCK_TMP_PREFIX "upload-XXXXXX") : 0;
    rq->up_tmp = dir ? malloc(n) : NULL;
    if (!rq->up_tmp) {
        free(dir);
        return MHD_NO;
    }
    snprintf(rq->up_tmp, n, "%s/" MOCK_TMP_PREFIX "%s-XXXXXX", dir, kind);
    free(dir);
    rq->up_fd = mkostemp(rq->up_tmp, O_CLOEXEC);
    rq->up_md5 = EVP_MD_CTX_new();
    rq->up_sha = EVP_MD_CTX_new();
    if (rq->up_fd < 0 || !rq->up_md5 || !rq->up_sha ||
        !EVP_DigestInit_ex(rq->up_md5, EVP_md5(), NULL) ||
        !EVP_DigestInit_ex(rq->up_sha, EVP_sha256(), NULL)) {
        if (rq->up_fd < 0) {
            free(rq->up_tmp);
            rq->up_tmp = NULL;
        }
        mock_upload_abort(rq);
        mock_set_error(&e, 500, "InternalError", "Cannot create the upload file: %s",
                       strerror(errno));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    return MHD_YES; /* body follows */
}

int mock_put_consume(struct request *rq, const char *data, size_t n)
{
    if (rq->up_fd < 0)
        return -1;
    if (rq->up_bytes + n > MAX_PUT_BYTES) {
        rq->up_too_large = 1;
        return -1;
    }
    if (sf__write_full(rq->up_fd, data, n, NULL) != 0)
        return -1;
    EVP_DigestUpdate(rq->up_md5, data, n);
    EVP_DigestUpdate(rq->up_sha, data, n);
    if (rq->up_ck_on)
        mock_checksums_update(&rq->up_ck, data, n);
    rq->up_bytes += n;
    return 0;
}

enum MHD_Result mock_op_put_object_finish(struct request *rq, struct MHD_Connection *conn,
                                          int failed)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (rq->up_chunked && rq->up_fd >= 0 && mock_body_chunked_end(rq, failed, &e) != 0) {
        mock_upload_abort(rq);
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (failed || rq->up_fd < 0) {
        mock_upload_abort(rq);
        if (rq->up_too_large)
            mock_set_error(&e, 400, "EntityTooLarge",
                           "Your proposed upload exceeds the maximum "
                           "allowed size");
        else
            mock_set_error(&e, 500, "InternalError", "Writing the upload failed");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    unsigned char md5[16], sha[32];
    unsigned int l1 = 0, l2 = 0;
    EVP_DigestFinal_ex(rq->up_md5, md5, &l1);
    EVP_DigestFinal_ex(rq->up_sha, sha, &l2);
    char sha_hex[SF__SHA256_HEX_LEN + 1];
    sf__hex_encode(sha, 32, sha_hex);
    if (rq->up_check_sha && strcmp(sha_hex, rq->up_expect_sha) != 0) {
        mock_upload_abort(rq);
        mock_set_error(
            &e, 400, "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    const char *content_md5 = mock_header(conn, "Content-MD5");
    if (content_md5) {
        unsigned char dec[64];
        size_t in_len = strlen(content_md5);
        int dl = in_len == 24 ? EVP_DecodeBlock(dec, (const unsigned char *)content_md5, 24) : -1;
        /* 24 base64 chars decode to 18 bytes, the last two being padding. */
        if (dl != 18 || memcmp(dec, md5, 16) != 0) {
            mock_upload_abort(rq);
            mock_set_error(&e, 400, "BadDigest",
                           "The Content-MD5 you specified did not match what we received.");
            return mock_respond_error(rq, conn, &e, NULL);
        }
    }
    if (mock_body_checksums_end(rq, &e) != 0) {
        mock_upload_abort(rq);
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (rq->part_number)
        return mock_upload_part_finish(rq, conn, md5);
    /* mkostemp makes 0600 files; objects are plain readable files like the rest. */
    if (fchmod(rq->up_fd, 0644) != 0 || fsync(rq->up_fd) != 0 || close(rq->up_fd) != 0) {
        rq->up_fd = -1;
        mock_upload_abort(rq);
        mock_set_error(&e, 500, "InternalError", "Writing the upload failed");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    rq->up_fd = -1;
    char *final = mock_store_path(srv->store, rq->bucket, rq->key);
    if (!final || mock_make_parents(srv, rq->bucket, rq->key) != 0 ||
        rename(rq->up_tmp, final) != 0) {
        int err = errno;
        free(final);
        mock_upload_abort(rq);
        if (err == EISDIR || err == ENOTDIR || err == EEXIST || err == ENOTEMPTY)
            mock_set_error(&e, 400, "InvalidArgument",
                           "The key conflicts with a key prefix already "
                           "stored (the mock keeps objects as files)");
        else
            mock_set_error(&e, 500, "InternalError", "Publishing the upload failed: %s",
                           strerror(err));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    mock_store_forget_etag(final); /* a multipart object's ETag goes with it */
    free(final);
    free(rq->up_tmp);
    rq->up_tmp = NULL;
    char etag[MOCK_ETAG_LEN + 1];
    mock_format_etag(md5, etag);
    return mock_respond_stored(rq, conn, etag);
}
