/* The mock S3 server: the libmicrohttpd daemon (start, TLS, stop), the
 * request lifecycle (the raw target, the query and path, the body, the
 * response queued with its statistics and log line) and the dispatch of
 * each request to its operation. The operations are in mock_buckets.c,
 * mock_object_ops.c, mock_multipart.c, mock_creds.c and mock_admin.c;
 * authentication in mock_auth.c. */

#include "mock_server/mock_s3.h"

#include "mock_server/mock_internal.h"

#include "mock_server/checksum.h"
#include "mock_server/chunked.h"
#include "mock_server/faults.h"
#include "mock_server/objects.h"
#include "mock_server/stats.h"
#include "mock_server/uploads.h"
#include "s3/sigv4.h"
#include "s3/uri.h"
#include "common/strbuf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_ROLE        "mock-role"
#define DEFAULT_ISSUE_TTL_S 3600
#define MAX_PEM_BYTES       (1 << 20)

int mock_sleep_ms_interruptible(struct mock_server *srv, int ms)
{
    while (ms > 0 && !atomic_load(&srv->stopping)) {
        int step = ms < 10 ? ms : 10;
        struct timespec ts = {0, (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
    return atomic_load(&srv->stopping) ? -1 : 0;
}

const char *mock_param_get(const struct request *rq, const char *name)
{
    for (size_t i = 0; i < rq->n_params; i++)
        if (strcmp(rq->params[i].name, name) == 0)
            return rq->params[i].value;
    return NULL;
}

int mock_param_has(const struct request *rq, const char *name)
{
    return mock_param_get(rq, name) != NULL;
}

const char *mock_header(struct MHD_Connection *conn, const char *name)
{
    return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
}

char *mock_decode_dup(const char *s, size_t n, size_t *len_out)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__uri_decode(&b, s, n, 0);
    if (len_out)
        *len_out = b.len;
    return sf__strbuf_take(&b);
}

enum MHD_Result mock_queue(struct request *rq, struct MHD_Connection *conn, int status,
                           struct MHD_Response *resp, uint64_t body_bytes, const char *fault)
{
    struct mock_server *srv = rq->srv;
    if (!resp)
        return MHD_NO;
    char id2[64];
    snprintf(id2, sizeof(id2), "mock/%s", rq->request_id);
    MHD_add_response_header(resp, "x-amz-request-id", rq->request_id);
    MHD_add_response_header(resp, "x-amz-id-2", id2);
    MHD_add_response_header(resp, "Server", "shardfeed-mock-s3");
    enum MHD_Result r = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    rq->done = 1;
    int is_head = strcmp(rq->method, "HEAD") == 0;
    /* The admin endpoints are the observer: they never count themselves;
     * credential endpoints have their own counters.
     * Body faults (reset, stall) are counted when they happen, in body_read. */
    int body_fault = fault && (strcmp(fault, "reset") == 0 || strcmp(fault, "stall") == 0);
    int observer = rq->op && (strcmp(rq->op, "Admin") == 0 || strcmp(rq->op, "Credentials") == 0);
    if (!observer)
        mock_stats_record(srv->stats, rq->op ? rq->op : "Unknown", status, rq->target,
                          is_head ? 0 : body_bytes, rq->up_bytes, body_fault ? NULL : fault);
    if (!srv->cfg.quiet) {
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms =
            (double)(t1.tv_sec - rq->t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - rq->t0.tv_nsec) / 1e6;
        fprintf(stderr, "%s %s %d %s %llu %.1fms%s%s\n", rq->method, rq->uri, status,
                rq->op ? rq->op : "-", (unsigned long long)body_bytes, ms, fault ? " fault=" : "",
                fault ? fault : "");
    }
    return r;
}

enum MHD_Result mock_respond_buffer(struct request *rq, struct MHD_Connection *conn, int status,
                                    const char *content_type, struct sf__strbuf *b,
                                    const char *fault)
{
    size_t len = b->len;
    char *data = sf__strbuf_take(b);
    if (!data)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(data);
        return MHD_NO;
    }
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    return mock_queue(rq, conn, status, resp, len, fault);
}

enum MHD_Result mock_respond_empty(struct request *rq, struct MHD_Connection *conn, int status)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    return mock_queue(rq, conn, status, resp, 0, NULL);
}

static int parse_query(struct request *rq, struct s3_error *e)
{
    if (!rq->query || !*rq->query)
        return 0;
    const char *p = rq->query;
    while (*p) {
        const char *amp = strchr(p, '&');
        size_t n = amp ? (size_t)(amp - p) : strlen(p);
        if (n > 0) {
            if (rq->n_params == MAX_PARAMS) {
                mock_set_error(e, 400, "InvalidArgument", "Too many query parameters");
                return -1;
            }
            const char *eq = memchr(p, '=', n);
            size_t kn = eq ? (size_t)(eq - p) : n;
            struct param *pr = &rq->params[rq->n_params];
            pr->name = mock_decode_dup(p, kn, NULL);
            pr->value = eq ? mock_decode_dup(eq + 1, n - kn - 1, NULL) : strdup("");
            rq->n_params++;
            if (!pr->name || !pr->value) {
                mock_set_error(e, 500, "InternalError", "Out of memory");
                return -1;
            }
        }
        if (!amp)
            break;
        p = amp + 1;
    }
    return 0;
}

static int parse_path(struct request *rq, struct s3_error *e)
{
    const char *p = rq->path;
    if (p[0] != '/') {
        mock_set_error(e, 400, "InvalidURI", "Couldn't parse the specified URI.");
        return -1;
    }
    p++;
    if (!*p)
        return 0; /* service level */
    const char *slash = strchr(p, '/');
    size_t bn = slash ? (size_t)(slash - p) : strlen(p);
    size_t blen = 0;
    rq->bucket = mock_decode_dup(p, bn, &blen);
    if (!rq->bucket || blen != strlen(rq->bucket)) {
        mock_set_error(e, 400, "InvalidBucketName", "The specified bucket is not valid.");
        return -1;
    }
    if (slash && slash[1]) {
        rq->key = mock_decode_dup(slash + 1, strlen(slash + 1), &rq->key_len);
        if (!rq->key) {
            mock_set_error(e, 500, "InternalError", "Out of memory");
            return -1;
        }
    }
    size_t tn = strlen(rq->bucket) + 2 + (rq->key ? rq->key_len : 0);
    rq->target = malloc(tn);
    if (!rq->target) {
        mock_set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    snprintf(rq->target, tn, "%s/%s", rq->bucket, rq->key ? rq->key : "");
    return 0;
}

static enum MHD_Result respond_string(struct request *rq, struct MHD_Connection *conn, int status,
                                      const char *content_type, const char *body)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, body);
    return mock_respond_buffer(rq, conn, status, content_type, &b, NULL);
}

enum MHD_Result mock_respond_json(struct request *rq, struct MHD_Connection *conn, int status,
                                  const char *json)
{
    return respond_string(rq, conn, status, "application/json", json);
}

enum MHD_Result mock_respond_text(struct request *rq, struct MHD_Connection *conn, int status,
                                  const char *text)
{
    return respond_string(rq, conn, status, "text/plain", text);
}

enum MHD_Result mock_respond_405(struct request *rq, struct MHD_Connection *conn, const char *allow)
{
    static const char text[] = "Method Not Allowed\n";
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(sizeof(text) - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
    if (resp) {
        MHD_add_response_header(resp, "Allow", allow);
        MHD_add_response_header(resp, "Content-Type", "text/plain");
    }
    return mock_queue(rq, conn, 405, resp, sizeof(text) - 1, NULL);
}

static const char *const object_subresources[] = {
    "uploads",    "uploadId",   "partNumber", "acl",    "tagging",   "torrent", "retention",
    "legal-hold", "attributes", "restore",    "select", "versionId", NULL,
};

static const char *const list_params[] = {
    "list-type",   "prefix",      "delimiter", "encoding-type", "max-keys", "continuation-token",
    "start-after", "fetch-owner", "marker",    "x-id",          NULL,
};

/* The parameters of the multipart operations on an object. */
static const char *const multipart_params[] = {
    "uploads", "uploadId", "partNumber", "max-parts", "part-number-marker", NULL,
};

static const char *const list_uploads_params[] = {
    "uploads",     "prefix",        "key-marker", "upload-id-marker",
    "max-uploads", "encoding-type", "x-id",       NULL,
};

static int in_list(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return 1;
    return 0;
}

static enum MHD_Result begin(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    const char *m = rq->method;
    int is_get = strcmp(m, "GET") == 0, is_head = strcmp(m, "HEAD") == 0;
    int is_put = strcmp(m, "PUT") == 0, is_del = strcmp(m, "DELETE") == 0;
    int is_post = strcmp(m, "POST") == 0;

    rq->begun = 1;
    if (parse_query(rq, &e) != 0)
        return mock_respond_error(rq, conn, &e, NULL);
    if (mock_is_container_path(srv, rq->path)) {
        rq->op = "Credentials";
        return mock_container_credentials(rq, conn);
    }
    if (mock_is_imds_path(rq->path)) {
        rq->op = "Credentials";
        return strcmp(rq->path, IMDS_TOKEN_PATH) == 0 ? mock_imds_token(rq, conn)
                                                      : mock_imds_metadata(rq, conn);
    }
    if (strncmp(rq->path, "/_mock/", 7) == 0)
        return mock_admin(rq, conn);
    if (parse_path(rq, &e) != 0)
        return mock_respond_error(rq, conn, &e, NULL);

    /* Name the operation first so errors are counted under it. */
    int multipart = 0;
    if (!rq->bucket) {
        rq->op = is_get ? "ListBuckets" : "Unknown";
    } else if (!rq->key) {
        if (is_get && mock_param_has(rq, "location"))
            rq->op = "GetBucketLocation";
        else if (is_get && mock_param_has(rq, "uploads"))
            rq->op = "ListMultipartUploads";
        else if (is_get)
            rq->op = strcmp(mock_param_get(rq, "list-type") ? mock_param_get(rq, "list-type") : "",
                            "2") == 0
                         ? "ListObjectsV2"
                         : "ListObjects";
        else if (is_put)
            rq->op = "CreateBucket";
        else if (is_head)
            rq->op = "HeadBucket";
        else if (is_del)
            rq->op = "DeleteBucket";
        else
            rq->op = "Unknown";
    } else {
        rq->upload_id = mock_param_get(rq, "uploadId");
        multipart = (is_post && mock_param_has(rq, "uploads")) ||
                    (rq->upload_id && (is_post || is_put || is_del || is_get));
        if (is_post && mock_param_has(rq, "uploads"))
            rq->op = "CreateMultipartUpload";
        else if (is_post && rq->upload_id)
            rq->op = "CompleteMultipartUpload";
        else if (is_put && rq->upload_id)
            rq->op = "UploadPart";
        else if (is_del && rq->upload_id)
            rq->op = "AbortMultipartUpload";
        else if (is_get && rq->upload_id)
            rq->op = "ListParts";
        else
            rq->op = is_get    ? "GetObject"
                     : is_head ? "HeadObject"
                     : is_put  ? "PutObject"
                     : is_del  ? "DeleteObject"
                               : "Unknown";
    }

    if (mock_authenticate(rq, conn, &e) != 0)
        return mock_respond_error(rq, conn, &e, NULL);

    if (strcmp(rq->op, "Unknown") == 0) {
        mock_set_error(&e, 501, "NotImplemented", "%s %s is not implemented by the mock", m,
                       rq->bucket ? (rq->key ? "on an object" : "on a bucket") : "on the service");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (!rq->bucket)
        return mock_op_list_buckets(rq, conn);

    if (!mock_bucket_name_valid(rq->bucket)) {
        mock_set_error(&e, 400, "InvalidBucketName", "The specified bucket is not valid.");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (rq->key && !mock_key_valid(rq->key, rq->key_len)) {
        mock_set_error(&e, 400, "InvalidArgument",
                       "The key is not accepted: empty, '.' or '..' segments, a leading '/', NUL "
                       "bytes and the '" MOCK_TMP_PREFIX "' prefix are refused");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    int list_uploads = strcmp(rq->op, "ListMultipartUploads") == 0;
    for (size_t i = 0; i < rq->n_params; i++) {
        const char *name = rq->params[i].name;
        if (strcmp(name, "x-id") == 0)
            continue; /* SDKs tag requests with their operation name */
        if (multipart && in_list(name, multipart_params))
            continue;
        if (list_uploads && in_list(name, list_uploads_params))
            continue;
        int unsupported = list_uploads ? 1
                          : rq->key    ? in_list(name, object_subresources)
                                       : (is_get && !in_list(name, list_params) &&
                                       strcmp(rq->op, "GetBucketLocation") != 0) ||
                                          (!is_get && *name);
        if (unsupported) {
            mock_set_error(&e, 501, "NotImplemented",
                           "The '%s' subresource is not implemented by "
                           "the mock",
                           name);
            return mock_respond_error(rq, conn, &e, NULL);
        }
    }

    if (strcmp(rq->op, "UploadPart") == 0) {
        const char *pn = mock_param_get(rq, "partNumber");
        char *end = NULL;
        unsigned long v = pn && *pn >= '0' && *pn <= '9' ? strtoul(pn, &end, 10) : 0;
        if (!end || *end || v < 1 || v > MOCK_MAX_PART_NUMBER) {
            mock_set_error(&e, 400, "InvalidArgument",
                           "Part number must be an integer between 1 and %d, inclusive",
                           MOCK_MAX_PART_NUMBER);
            return mock_respond_error(rq, conn, &e, NULL);
        }
        rq->part_number = (unsigned)v;
    }
    if (rq->key && !multipart && (is_get || is_head))
        return mock_op_get_object(rq, conn, is_head); /* plans its own faults */

    if (rq->key) {
        struct mock_fault_plan plan;
        char ferr[256];
        enum mock_op_kind kind = multipart && !is_put && !is_del ? MOCK_OP_OTHER
                                 : is_put                        ? MOCK_OP_PUT
                                                                 : MOCK_OP_DELETE;
        /* each part of an upload has its own sequence of fault decisions */
        char part_scope[32];
        snprintf(part_scope, sizeof(part_scope), "part=%u", rq->part_number);
        if (mock_faults_plan(srv->faults, rq->target, rq->part_number ? part_scope : NULL,
                             mock_header(conn, FAULT_HEADER), kind, 0, &plan, ferr,
                             sizeof(ferr)) != SF_OK) {
            mock_set_error(&e, 400, "InvalidArgument", "%s", ferr);
            return mock_respond_error(rq, conn, &e, NULL);
        }
        if (plan.latency_ms && mock_sleep_ms_interruptible(srv, plan.latency_ms) != 0)
            return MHD_NO;
        if (plan.status && is_put) {
            /* Answered after the body, as S3 answers an upload it refuses
             * for its content: an answer from this first callback makes
             * libmicrohttpd close the connection while the client may still
             * be sending, and the client then sees a reset (which it may
             * retry) or the status, by timing. */
            rq->fault_plan = plan;
            rq->fault_pending = 1;
            return MHD_YES;
        }
        if (plan.status)
            return mock_respond_fault_status(rq, conn, &plan);
        if (strcmp(rq->op, "CreateMultipartUpload") == 0)
            return mock_op_create_upload(rq, conn);
        if (strcmp(rq->op, "CompleteMultipartUpload") == 0)
            return mock_op_complete_upload(rq, conn);
        if (strcmp(rq->op, "AbortMultipartUpload") == 0)
            return mock_op_abort_upload(rq, conn);
        if (strcmp(rq->op, "ListParts") == 0)
            return mock_op_list_parts(rq, conn);
        return is_put ? mock_op_put_object_begin(rq, conn) : mock_op_delete_object(rq, conn);
    }
    if (is_put)
        return mock_op_create_bucket(rq, conn);
    if (!mock_bucket_exists(srv->store, rq->bucket)) {
        mock_set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    if (is_head)
        return mock_op_head_bucket(rq, conn);
    if (is_del)
        return mock_op_delete_bucket(rq, conn);
    if (strcmp(rq->op, "GetBucketLocation") == 0)
        return mock_op_bucket_location(rq, conn);
    if (list_uploads)
        return mock_op_list_uploads(rq, conn);
    return mock_op_list_objects(rq, conn, strcmp(rq->op, "ListObjectsV2") == 0);
}

static void request_free(struct request *rq)
{
    if (!rq)
        return;
    mock_upload_abort(rq);
    EVP_MD_CTX_free(rq->up_md5);
    EVP_MD_CTX_free(rq->up_sha);
    mock_chunked_destroy(rq->up_chunked);
    mock_checksums_free(&rq->up_ck);
    for (size_t i = 0; i < rq->n_params; i++) {
        free(rq->params[i].name);
        free(rq->params[i].value);
    }
    sf__strbuf_free(&rq->body);
    free(rq->bucket);
    free(rq->key);
    free(rq->target);
    free(rq->path);
    free(rq->uri);
    free(rq);
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)conn;
    struct mock_server *srv = cls;
    struct request *rq = calloc(1, sizeof(*rq));
    if (!rq)
        return NULL;
    rq->srv = srv;
    rq->up_fd = -1;
    rq->uri = strdup(uri ? uri : "/");
    sf__strbuf_init(&rq->body, MAX_SMALL_BODY);
    clock_gettime(CLOCK_MONOTONIC, &rq->t0);
    snprintf(rq->request_id, sizeof(rq->request_id), "%016llX",
             (unsigned long long)atomic_fetch_add(&srv->next_id, 1) + 1);
    if (!rq->uri) {
        free(rq);
        return NULL;
    }
    char *q = strchr(rq->uri, '?');
    rq->path = q ? strndup(rq->uri, (size_t)(q - rq->uri)) : strdup(rq->uri);
    rq->query = q ? q + 1 : NULL;
    if (!rq->path) {
        free(rq->uri);
        free(rq);
        return NULL;
    }
    return rq;
}

/* An object PUT is checked (signature, bucket) before its body is read, so a
 * refused upload is not received in full. Everything else is handled once
 * the request is complete: libmicrohttpd closes the connection after a
 * response queued from the first callback, and keep-alive matters here. */
static int is_object_put(const struct mock_server *srv, const char *method, const char *path)
{
    if (strcmp(method, "PUT") != 0 || strncmp(path, "/_mock/", 7) == 0 ||
        mock_is_container_path(srv, path) || mock_is_imds_path(path))
        return 0;
    const char *slash = strchr(path + 1, '/');
    return slash && slash[1];
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    (void)cls;
    (void)url;
    (void)version;
    struct request *rq = *req_cls;
    if (!rq)
        return MHD_NO; /* out of memory in on_uri */
    if (!rq->started) {
        rq->started = 1;
        rq->method = method;
        if (is_object_put(rq->srv, method, rq->path))
            return begin(rq, conn);
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rq->done) {
            if (rq->fault_pending) {
                /* drained: the planned fault answers it */
            } else if (rq->up_tmp) {
                /* libmicrohttpd 0.9.75 refuses a response while the body is
                 * still arriving: remember the failure, drain the body, and
                 * answer once it is complete. */
                if (!rq->up_failed &&
                    (rq->up_chunked
                         ? mock_chunked_feed(rq->up_chunked, upload_data, *upload_data_size)
                         : mock_put_consume(rq, upload_data, *upload_data_size)) != 0)
                    rq->up_failed = 1;
            } else {
                /* Small bodies of other requests (admin rules, bucket
                 * configuration); the cap makes the strbuf error sticky. */
                sf__strbuf_append(&rq->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (rq->done)
        return MHD_YES;
    if (!rq->begun)
        return begin(rq, conn);
    if (rq->fault_pending)
        return mock_respond_fault_status(rq, conn, &rq->fault_plan);
    return mock_op_put_object_finish(rq, conn, rq->up_failed);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    struct request *rq = *req_cls;
    if (rq && rq->body_tracked && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        mock_body_ended_early(rq, conn);
    request_free(*req_cls);
    *req_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct mock_server *srv = cls;
    if (srv->cfg.quiet)
        return;
    fputs("mhd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* Reads a whole PEM file, at most MAX_PEM_BYTES, as a NUL-terminated
 * malloc'd string; NULL with the reason in err. */
static char *read_pem(const char *flag, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s %s: %s", flag, path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(MAX_PEM_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_PEM_BYTES + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad || n == 0 || n > MAX_PEM_BYTES) {
        snprintf(err, err_len, "%s %s: %s", flag, path,
                 !buf  ? "out of memory"
                 : bad ? "read error"
                 : n   ? "larger than 1 MiB"
                       : "empty file");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static sf_status tls_load(struct mock_server *srv, char *err, size_t err_len)
{
    const struct mock_config *cfg = &srv->cfg;
    if (!cfg->tls_cert_file && !cfg->tls_key_file)
        return SF_OK;
    if (!cfg->tls_cert_file || !cfg->tls_key_file)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "--tls-cert and --tls-key go together");
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return sf__fail(err, err_len, SF_ERR_UNSUPPORTED,
                        "--tls-cert: this libmicrohttpd (%s) was built without TLS support "
                        "(MHD_FEATURE_TLS); install one built with GnuTLS",
                        MHD_get_version());
    srv->tls_cert_pem = read_pem("--tls-cert", cfg->tls_cert_file, err, err_len);
    if (!srv->tls_cert_pem)
        return SF_ERR_IO;
    srv->tls_key_pem = read_pem("--tls-key", cfg->tls_key_file, err, err_len);
    if (!srv->tls_key_pem)
        return SF_ERR_IO;
    srv->tls = 1;
    return SF_OK;
}

static void server_free(struct mock_server *srv)
{
    sf__sigv4_signer_destroy(&srv->signer);
    mock_stats_destroy(srv->stats);
    mock_uploads_destroy(srv->uploads);
    mock_faults_destroy(srv->faults);
    mock_store_destroy(srv->store);
    pthread_mutex_destroy(&srv->tokens_lock);
    free(srv->tls_cert_pem);
    free(srv->tls_key_pem);
    free(srv);
}

sf_status mock_server_start(const struct mock_config *cfg, struct mock_server **out, char *err,
                            size_t err_len)
{
    struct mock_server *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return SF_ERR_NO_MEMORY;
    srv->cfg = *cfg;
    if (!srv->cfg.imds_role)
        srv->cfg.imds_role = DEFAULT_ROLE;
    if (!srv->cfg.issue_ttl_s)
        srv->cfg.issue_ttl_s = DEFAULT_ISSUE_TTL_S;
    pthread_mutex_init(&srv->tokens_lock, NULL);
    srv->imds_tokens = (struct token_ring){.slots = srv->imds_slots, .cap = MAX_IMDS_TOKENS};
    srv->issued = (struct token_ring){.slots = srv->issued_slots, .cap = MAX_ISSUED_TOKENS};
    /* The signer is initialised before any failure so server_free() can
     * always destroy it. */
    sf__sigv4_signer_init(&srv->signer, cfg->access_key, cfg->secret_key, cfg->session_token,
                          cfg->region, "s3");
    sf_status rc = tls_load(srv, err, err_len);
    if (rc != SF_OK)
        goto fail;
    rc = mock_store_new(cfg->root, &srv->store);
    if (rc != SF_OK) {
        snprintf(err, err_len, "--root %s is not a readable directory", cfg->root);
        goto fail;
    }
    rc = mock_faults_new(cfg->seed, &srv->faults);
    if (rc == SF_OK)
        rc = mock_stats_new(&srv->stats);
    if (rc == SF_OK)
        rc = mock_uploads_new(&srv->uploads);
    if (rc != SF_OK) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < cfg->n_fault_specs; i++) {
        char ferr[256];
        rc = mock_faults_add_rule(srv->faults, cfg->fault_specs[i], ferr, sizeof(ferr));
        if (rc != SF_OK) {
            snprintf(err, err_len, "--fault '%s': %s", cfg->fault_specs[i], ferr);
            goto fail;
        }
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)cfg->port);
    if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) {
        snprintf(err, err_len, "--host %s is not an IPv4 address", cfg->host);
        rc = SF_ERR_INVALID_ARGUMENT;
        goto fail;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    struct MHD_OptionItem tls_opts[] = {
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    if (srv->tls) {
        flags |= MHD_USE_TLS;
        tls_opts[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, srv->tls_cert_pem};
        tls_opts[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, srv->tls_key_pem};
    }
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
        on_mhd_log, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(1024 * 1024), MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)120, MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000, MHD_OPTION_LISTEN_BACKLOG_SIZE,
        (unsigned)1024, MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
    if (!srv->daemon) {
        if (srv->tls)
            snprintf(err, err_len,
                     "cannot start the TLS daemon on %s:%u (is the port free, and do "
                     "--tls-cert and --tls-key hold a matching PEM certificate and key?)",
                     cfg->host, cfg->port);
        else
            snprintf(err, err_len, "cannot listen on %s:%u: %s", cfg->host, cfg->port,
                     strerror(errno));
        rc = SF_ERR_IO;
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = info ? info->port : cfg->port;
    *out = srv;
    return SF_OK;

fail:
    server_free(srv);
    return rc != SF_OK ? rc : SF_ERR_INTERNAL;
}

unsigned mock_server_port(const struct mock_server *srv)
{
    return srv->port;
}

const char *mock_server_scheme(const struct mock_server *srv)
{
    return srv->tls ? "https" : "http";
}

void mock_server_stop(struct mock_server *srv)
{
    if (!srv)
        return;
    atomic_store(&srv->stopping, 1);
    MHD_stop_daemon(srv->daemon);
    server_free(srv);
}
