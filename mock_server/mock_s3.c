#include "mock_server/mock_s3.h"

#include "mock_server/checksum.h"
#include "mock_server/chunked.h"
#include "mock_server/faults.h"
#include "mock_server/objects.h"
#include "mock_server/stats.h"
#include "mock_server/uploads.h"
#include "s3/sigv4.h"
#include "common/strbuf.h"
#include "s3/uri.h"
#include "s3/xml.h"
#include "common/clock.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S3_XMLNS       "http://s3.amazonaws.com/doc/2006-03-01/"
#define XML_DECL       "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define MAX_SKEW_S     (15 * 60)
#define MAX_PARAMS     64
#define MAX_HEADERS    128
#define MAX_SMALL_BODY (4 << 20)    /* admin rules, CompleteMultipartUpload's part list */
#define MAX_PUT_BYTES  (5ull << 30) /* S3's single-PUT limit */
#define BODY_BLOCK     (256 * 1024)
#define FAULT_HEADER   "x-sfmock-fault"

/* Credential endpoints */
#define IMDS_TOKEN_PATH        "/latest/api/token"
#define IMDS_META_PREFIX       "/latest/meta-data/"
#define IMDS_CREDS_PATH        "/latest/meta-data/iam/security-credentials/"
#define IMDS_TTL_HEADER        "X-aws-ec2-metadata-token-ttl-seconds"
#define IMDS_TOKEN_HEADER      "X-aws-ec2-metadata-token"
#define IMDS_MAX_TTL_S         21600
#define DEFAULT_CONTAINER_PATH "/_mock/container-credentials"
#define DEFAULT_ROLE           "mock-role"
#define DEFAULT_ISSUE_TTL_S    3600
#define MAX_IMDS_TOKENS        256
#define MAX_ISSUED_TOKENS      1024
#define TOKEN_MAX_LEN          96
#define MAX_PEM_BYTES          (1 << 20)

/* A token the server handed out, valid until expires_s (CLOCK_REALTIME). */
struct timed_token {
    char text[TOKEN_MAX_LEN];
    double expires_s;
};

/* The newest tokens, bounded: when full, the oldest is overwritten. */
struct token_ring {
    struct timed_token *slots;
    size_t cap;
    size_t next; /* slot written next */
    size_t n;    /* slots in use */
};

enum token_state { TOKEN_UNKNOWN, TOKEN_VALID, TOKEN_EXPIRED };

struct mock_server {
    struct MHD_Daemon *daemon;
    struct mock_config cfg;
    struct mock_store *store;
    struct mock_faults *faults;
    struct mock_stats *stats;
    struct mock_uploads *uploads;
    struct sf__sigv4_signer signer;
    atomic_int stopping;
    atomic_ullong next_id;
    unsigned port;
    int tls;
    char *tls_cert_pem; /* kept until the daemon stops */
    char *tls_key_pem;
    pthread_mutex_t tokens_lock; /* guards the fields below */
    struct token_ring imds_tokens;
    struct token_ring issued;
    unsigned long long issued_count;
    struct timed_token imds_slots[MAX_IMDS_TOKENS];
    struct timed_token issued_slots[MAX_ISSUED_TOKENS];
};

struct param {
    char *name;
    char *value;
};

struct request {
    struct mock_server *srv;
    char *uri;         /* raw request target, from the URI log callback */
    char *path;        /* raw path (before '?') */
    const char *query; /* raw query (after '?') or NULL; points into uri */
    int started;
    int done; /* a response was queued */
    struct param params[MAX_PARAMS];
    size_t n_params;
    char *bucket; /* decoded; NULL for "/" */
    char *key;    /* decoded; NULL for bucket requests */
    size_t key_len;
    char *target; /* "bucket/key" or "bucket/" for faults and stats */
    const char *op;
    const char *method;
    char request_id[17];
    struct timespec t0;
    /* PutObject */
    int up_fd;
    char *up_tmp;
    EVP_MD_CTX *up_md5;
    EVP_MD_CTX *up_sha;
    uint64_t up_bytes;
    int up_check_sha;
    int up_failed; /* a write failed: the rest of the body is discarded */
    int up_too_large;
    char up_expect_sha[SF__SHA256_HEX_LEN + 1];
    /* aws-chunked bodies: the decoder, the declared decoded length */
    struct mock_chunked *up_chunked;
    const char *up_chunked_mode; /* the x-amz-content-sha256 value, for stats */
    uint64_t up_decoded_len;
    /* x-amz-checksum-*: computed for the algorithms in up_ck.want; the
     * values a header gave (header_mask) or x-amz-trailer announced */
    struct mock_checksums up_ck;
    int up_ck_on;
    unsigned up_ck_header_mask;
    unsigned up_ck_trailer_mask;
    char up_ck_given[MOCK_CK_COUNT][MOCK_CK_B64_MAX];
    char up_ck_echo[MOCK_CK_COUNT][MOCK_CK_B64_MAX]; /* checked values, echoed */
    /* the verified Authorization, for the chunk signatures */
    int auth_signed;
    struct sf__sigv4_auth auth;
    char amz_date[SF__AMZ_DATE_LEN + 1];
    int begun;              /* begin() ran */
    struct sf__strbuf body; /* bodies of requests other than object PUTs */
    /* UploadPart: the part number (0 for PutObject) and upload id */
    unsigned part_number;
    const char *upload_id; /* points into params */
    /* A GET body is counted whole when queued; when the transfer ends early
     * (the client closed, a reset), on_completed takes back what was not
     * sent, so bytes_sent counts the bytes that really went out. */
    int body_tracked;
    uint64_t body_counted; /* bytes_sent added when queued */
    int body_is_callback;
    uint64_t body_handed; /* callback bodies: bytes handed to libmicrohttpd */
    int body_reset;       /* a reset fault cut the connection (its TCP_INFO is gone) */
    int have_tcp_start;
    uint64_t tcp_acked_start; /* tcpi_bytes_acked of the socket when queued */
};

/* An S3 error to answer with. */
struct s3_error {
    int status;
    const char *code;
    char message[512];
    char *extra_xml; /* malloc'd, appended inside <Error>, may be NULL */
};

/* ------------------------------------------------------------------ utils */

static int sleep_ms_interruptible(struct mock_server *srv, int ms)
{
    while (ms > 0 && !atomic_load(&srv->stopping)) {
        int step = ms < 10 ? ms : 10;
        struct timespec ts = {0, (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
    return atomic_load(&srv->stopping) ? -1 : 0;
}

static void xml_escape(struct sf__strbuf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '&': sf__strbuf_puts(b, "&amp;"); break;
        case '<': sf__strbuf_puts(b, "&lt;"); break;
        case '>': sf__strbuf_puts(b, "&gt;"); break;
        case '"': sf__strbuf_puts(b, "&quot;"); break;
        case '\'': sf__strbuf_puts(b, "&apos;"); break;
        default:
            if (c < 0x20 && c != '\t' && c != '\n')
                sf__strbuf_printf(b, "&#x%X;", c);
            else
                sf__strbuf_putc(b, (char)c);
        }
    }
}

/* <tag>escaped value</tag>, url-encoded first when url_encode. */
static void xml_elem(struct sf__strbuf *b, const char *tag, const char *value, int url_encode)
{
    sf__strbuf_printf(b, "<%s>", tag);
    if (url_encode) {
        struct sf__strbuf enc;
        sf__strbuf_init(&enc, 0);
        sf__uri_encode(&enc, value, strlen(value), 1);
        xml_escape(b, sf__strbuf_str(&enc), enc.len);
        sf__strbuf_free(&enc);
    } else {
        xml_escape(b, value, strlen(value));
    }
    sf__strbuf_printf(b, "</%s>", tag);
}

static const char *param_get(const struct request *rq, const char *name)
{
    for (size_t i = 0; i < rq->n_params; i++)
        if (strcmp(rq->params[i].name, name) == 0)
            return rq->params[i].value;
    return NULL;
}

static int param_has(const struct request *rq, const char *name)
{
    return param_get(rq, name) != NULL;
}

static const char *header(struct MHD_Connection *conn, const char *name)
{
    return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
}

static char *decode_dup(const char *s, size_t n, size_t *len_out)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__uri_decode(&b, s, n, 0);
    if (len_out)
        *len_out = b.len;
    return sf__strbuf_take(&b);
}

static void set_error(struct s3_error *e, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void set_error(struct s3_error *e, int status, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
}

/* -------------------------------------------------------------- responses */

static enum MHD_Result queue(struct request *rq, struct MHD_Connection *conn, int status,
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

static enum MHD_Result respond_buffer(struct request *rq, struct MHD_Connection *conn, int status,
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
    return queue(rq, conn, status, resp, len, fault);
}

static enum MHD_Result respond_empty(struct request *rq, struct MHD_Connection *conn, int status)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    return queue(rq, conn, status, resp, 0, NULL);
}

static enum MHD_Result respond_error(struct request *rq, struct MHD_Connection *conn,
                                     struct s3_error *e, const char *fault)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<Error>");
    xml_elem(&b, "Code", e->code, 0);
    xml_elem(&b, "Message", e->message, 0);
    if (rq->bucket)
        xml_elem(&b, "BucketName", rq->bucket, 0);
    if (rq->key)
        xml_elem(&b, "Key", rq->key, 0);
    struct sf__strbuf res;
    sf__strbuf_init(&res, 0);
    sf__uri_decode(&res, rq->path ? rq->path : "/", rq->path ? strlen(rq->path) : 1, 0);
    xml_elem(&b, "Resource", sf__strbuf_str(&res), 0);
    sf__strbuf_free(&res);
    xml_elem(&b, "RequestId", rq->request_id, 0);
    if (e->extra_xml)
        sf__strbuf_puts(&b, e->extra_xml);
    sf__strbuf_puts(&b, "</Error>");
    free(e->extra_xml);
    e->extra_xml = NULL;
    if (strcmp(rq->method, "HEAD") == 0) {
        /* S3 answers HEAD errors without a body; libmicrohttpd drops it anyway. */
        sf__strbuf_free(&b);
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (resp)
            MHD_add_response_header(resp, "x-amz-error-code", e->code);
        return queue(rq, conn, e->status, resp, 0, fault);
    }
    return respond_buffer(rq, conn, e->status, "application/xml", &b, fault);
}

static enum MHD_Result respond_fault_status(struct request *rq, struct MHD_Connection *conn,
                                            const struct mock_fault_plan *plan)
{
    struct s3_error e = {0};
    if (plan->status == 400)
        set_error(&e, 400, "InvalidRequest", "A 400 forced by a queued or header fault.");
    else if (plan->status == 500)
        set_error(&e, 500, "InternalError", "We encountered an internal error. Please try again.");
    else
        set_error(&e, 503, "SlowDown", "Please reduce your request rate.");
    const char *fault = plan->status == 400   ? "400"
                        : plan->status == 500 ? "500"
                        : plan->throttled     ? "rate_limit"
                                              : "503";
    return respond_error(rq, conn, &e, fault);
}

/* --------------------------------------------------------- request setup */

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
                set_error(e, 400, "InvalidArgument", "Too many query parameters");
                return -1;
            }
            const char *eq = memchr(p, '=', n);
            size_t kn = eq ? (size_t)(eq - p) : n;
            struct param *pr = &rq->params[rq->n_params];
            pr->name = decode_dup(p, kn, NULL);
            pr->value = eq ? decode_dup(eq + 1, n - kn - 1, NULL) : strdup("");
            rq->n_params++;
            if (!pr->name || !pr->value) {
                set_error(e, 500, "InternalError", "Out of memory");
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
        set_error(e, 400, "InvalidURI", "Couldn't parse the specified URI.");
        return -1;
    }
    p++;
    if (!*p)
        return 0; /* service level */
    const char *slash = strchr(p, '/');
    size_t bn = slash ? (size_t)(slash - p) : strlen(p);
    size_t blen = 0;
    rq->bucket = decode_dup(p, bn, &blen);
    if (!rq->bucket || blen != strlen(rq->bucket)) {
        set_error(e, 400, "InvalidBucketName", "The specified bucket is not valid.");
        return -1;
    }
    if (slash && slash[1]) {
        rq->key = decode_dup(slash + 1, strlen(slash + 1), &rq->key_len);
        if (!rq->key) {
            set_error(e, 500, "InternalError", "Out of memory");
            return -1;
        }
    }
    size_t tn = strlen(rq->bucket) + 2 + (rq->key ? rq->key_len : 0);
    rq->target = malloc(tn);
    if (!rq->target) {
        set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    snprintf(rq->target, tn, "%s/%s", rq->bucket, rq->key ? rq->key : "");
    return 0;
}

struct header_vec {
    struct sf__header h[MAX_HEADERS];
    size_t n;
    int overflow;
};

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    struct header_vec *hv = cls;
    if (hv->n == MAX_HEADERS) {
        hv->overflow = 1;
        return MHD_NO;
    }
    hv->h[hv->n].name = key;
    hv->h[hv->n].value = value ? value : "";
    hv->n++;
    return MHD_YES;
}

/* ----------------------------------------------------------------- tokens */

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "YYYY-MM-DDTHH:MM:SSZ", the form of IMDS and ECS credential documents. */
static void format_aws_time(double t, char out[32])
{
    time_t secs = (time_t)t;
    struct tm tm;
    gmtime_r(&secs, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* n random bytes as 2n hex digits into out (2n + 1 bytes). */
static int random_hex(size_t n, char *out)
{
    unsigned char raw[32];
    if (n > sizeof(raw) || RAND_bytes(raw, (int)n) != 1)
        return -1;
    sf__hex_encode(raw, n, out);
    return 0;
}

static void ring_add(struct token_ring *r, const char *text, double expires_s)
{
    struct timed_token *t = &r->slots[r->next];
    snprintf(t->text, sizeof(t->text), "%s", text);
    t->expires_s = expires_s;
    r->next = (r->next + 1) % r->cap;
    if (r->n < r->cap)
        r->n++;
}

static enum token_state ring_check(struct mock_server *srv, const struct token_ring *r,
                                   const char *text)
{
    enum token_state st = TOKEN_UNKNOWN;
    double now = wall_s();
    pthread_mutex_lock(&srv->tokens_lock);
    for (size_t i = 0; i < r->n; i++) {
        if (strcmp(r->slots[i].text, text) == 0) {
            st = now < r->slots[i].expires_s ? TOKEN_VALID : TOKEN_EXPIRED;
            break;
        }
    }
    pthread_mutex_unlock(&srv->tokens_lock);
    return st;
}

/* A fresh session token for the mock's own key pair, valid for issue_ttl_s.
 * Writes the token and its expiration ("YYYY-MM-DDTHH:MM:SSZ"). */
static int issue_session_token(struct mock_server *srv, char token[TOKEN_MAX_LEN],
                               char expiration[32])
{
    char hex[33];
    if (random_hex(16, hex) != 0)
        return -1;
    double expires = wall_s() + (double)srv->cfg.issue_ttl_s;
    pthread_mutex_lock(&srv->tokens_lock);
    snprintf(token, TOKEN_MAX_LEN, "mock-issued-%llu-%s", ++srv->issued_count, hex);
    ring_add(&srv->issued, token, expires);
    pthread_mutex_unlock(&srv->tokens_lock);
    format_aws_time(expires, expiration);
    return 0;
}

/* x-amz-security-token of a signed request: the configured --session-token
 * or an issued, unexpired token. A request without one passes only when no
 * --session-token is configured. */
static int check_session_token(struct mock_server *srv, const char *tok, struct s3_error *e)
{
    if (!tok) {
        if (!srv->cfg.session_token)
            return 0;
    } else {
        if (srv->cfg.session_token && strcmp(tok, srv->cfg.session_token) == 0)
            return 0;
        enum token_state st = ring_check(srv, &srv->issued, tok);
        if (st == TOKEN_VALID)
            return 0;
        if (st == TOKEN_EXPIRED) {
            mock_stats_credential(srv->stats, "expired_token_rejections");
            set_error(e, 400, "ExpiredToken", "The provided token has expired.");
            return -1;
        }
    }
    set_error(e, 403, "InvalidToken", "The provided token is malformed or otherwise invalid.");
    return -1;
}

static int authenticate(struct request *rq, struct MHD_Connection *conn, struct s3_error *e)
{
    struct mock_server *srv = rq->srv;
    const char *authz = header(conn, "Authorization");
    if (!authz) {
        if (param_has(rq, "X-Amz-Signature")) {
            set_error(e, 501, "NotImplemented", "Presigned URLs are not supported by the mock.");
            return -1;
        }
        if (srv->cfg.anonymous)
            return 0;
        set_error(e, 403, "AccessDenied", "Access Denied: the request is not signed.");
        return -1;
    }
    struct sf__sigv4_auth auth;
    if (sf__sigv4_parse_authorization(authz, &auth) != SF_OK) {
        set_error(e, 400, "AuthorizationHeaderMalformed",
                  "The authorization header is malformed; expected AWS4-HMAC-SHA256 "
                  "Credential=..., SignedHeaders=..., Signature=...");
        return -1;
    }
    if (strcmp(auth.access_key_id, srv->cfg.access_key) != 0) {
        set_error(e, 403, "InvalidAccessKeyId",
                  "The AWS Access Key Id you provided does not exist in our records.");
        return -1;
    }
    if (strcmp(auth.region, srv->cfg.region) != 0 || strcmp(auth.service, "s3") != 0) {
        set_error(e, 400, "AuthorizationHeaderMalformed",
                  "The authorization header is malformed; the region '%s' is wrong; "
                  "expecting '%s' (service '%s', expecting 's3')",
                  auth.region, srv->cfg.region, auth.service);
        return -1;
    }
    const char *amz_date = header(conn, "x-amz-date");
    time_t t;
    if (!amz_date || sf__sigv4_parse_date(amz_date, &t) != SF_OK) {
        set_error(e, 403, "AccessDenied",
                  "AWS authentication requires a valid Date or x-amz-date header");
        return -1;
    }
    time_t now = time(NULL);
    if (t > now + MAX_SKEW_S || t < now - MAX_SKEW_S) {
        set_error(e, 403, "RequestTimeTooSkewed",
                  "The difference between the request time (%s) and the current time is too "
                  "large.",
                  amz_date);
        return -1;
    }
    const char *payload = header(conn, "x-amz-content-sha256");
    if (!payload) {
        set_error(e, 400, "InvalidRequest",
                  "Missing required header for this request: x-amz-content-sha256");
        return -1;
    }
    enum mock_chunked_mode chunked_mode;
    int streaming = mock_chunked_mode_of(payload, &chunked_mode) == 0;
    if (!streaming && strncmp(payload, "STREAMING-", 10) == 0) {
        set_error(e, 501, "NotImplemented",
                  "aws-chunked payloads of the form %s are not supported by the mock", payload);
        return -1;
    }
    if (!streaming && strcmp(payload, SF__UNSIGNED_PAYLOAD) != 0) {
        size_t n = strlen(payload);
        int hex = n == SF__SHA256_HEX_LEN;
        for (size_t i = 0; hex && i < n; i++)
            hex = (payload[i] >= '0' && payload[i] <= '9') ||
                  (payload[i] >= 'a' && payload[i] <= 'f');
        if (!hex) {
            set_error(e, 400, "InvalidArgument",
                      "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, "
                      "STREAMING-... or a lower-case hex SHA-256");
            return -1;
        }
    }
    if (check_session_token(srv, header(conn, "x-amz-security-token"), e) != 0)
        return -1;
    struct header_vec hv = {.n = 0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, &hv);
    if (hv.overflow) {
        set_error(e, 400, "InvalidRequest", "Too many request headers");
        return -1;
    }
    struct sf__sigv4_request sreq = {
        .method = rq->method,
        .path = rq->path,
        .query = rq->query,
        .headers = hv.h,
        .n_headers = hv.n,
        .payload_hash = payload,
    };
    struct sf__sigv4_result res = {0};
    sf_status rc = sf__sigv4_verify(&srv->signer, &auth, &sreq, amz_date, &res);
    if (rc == SF_OK) {
        sf__sigv4_result_free(&res);
        rq->auth_signed = 1;
        rq->auth = auth;
        snprintf(rq->amz_date, sizeof rq->amz_date, "%s", amz_date);
        return 0;
    }
    if (rc == SF_ERR_SIGNATURE || rc == SF_ERR_PARSE) {
        set_error(e, 403, "SignatureDoesNotMatch",
                  "The request signature we calculated does not match the signature you "
                  "provided. Check your key and signing method.");
        struct sf__strbuf x;
        sf__strbuf_init(&x, 0);
        sf__strbuf_puts(&x, "<AWSAccessKeyId>");
        xml_escape(&x, auth.access_key_id, strlen(auth.access_key_id));
        sf__strbuf_puts(&x, "</AWSAccessKeyId>");
        if (res.string_to_sign)
            xml_elem(&x, "StringToSign", res.string_to_sign, 0);
        xml_elem(&x, "SignatureProvided", auth.signature, 0);
        if (res.canonical_request)
            xml_elem(&x, "CanonicalRequest", res.canonical_request, 0);
        e->extra_xml = sf__strbuf_take(&x);
    } else {
        set_error(e, 500, "InternalError", "Signature verification failed: %s", sf_status_str(rc));
    }
    sf__sigv4_result_free(&res);
    return -1;
}

/* ------------------------------------------------------------ operations */

static enum MHD_Result op_list_buckets(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    DIR *d = opendir(mock_store_root(srv->store));
    if (!d) {
        set_error(&e, 500, "InternalError", "Cannot read the server root");
        return respond_error(rq, conn, &e, NULL);
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!mock_bucket_name_valid(de->d_name) || !mock_bucket_exists(srv->store, de->d_name))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, cap * sizeof(*nn));
            if (!nn)
                break;
            names = nn;
        }
        names[n] = strdup(de->d_name);
        if (names[n])
            n++;
    }
    closedir(d);
    for (size_t i = 1; i < n; i++) /* few buckets: insertion sort */
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL
                    "<ListAllMyBucketsResult xmlns=\"" S3_XMLNS "\">"
                    "<Owner><ID>mock</ID><DisplayName>mock</DisplayName></Owner><Buckets>");
    for (size_t i = 0; i < n; i++) {
        char *path = mock_store_path(srv->store, names[i], NULL);
        struct stat sb;
        char when[32] = "1970-01-01T00:00:00.000Z";
        if (path && stat(path, &sb) == 0)
            mock_format_iso8601(sb.st_mtim.tv_sec, when);
        free(path);
        sf__strbuf_puts(&b, "<Bucket>");
        xml_elem(&b, "Name", names[i], 0);
        xml_elem(&b, "CreationDate", when, 0);
        sf__strbuf_puts(&b, "</Bucket>");
        free(names[i]);
    }
    free(names);
    sf__strbuf_puts(&b, "</Buckets></ListAllMyBucketsResult>");
    return respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

static enum MHD_Result op_create_bucket(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    char *path = mock_store_path(rq->srv->store, rq->bucket, NULL);
    if (!path)
        return MHD_NO;
    int rc = mkdir(path, 0755);
    int err = errno;
    free(path);
    if (rc != 0) {
        if (err == EEXIST)
            set_error(&e, 409, "BucketAlreadyOwnedByYou",
                      "Your previous request to create the named bucket succeeded and you "
                      "already own it.");
        else
            set_error(&e, 500, "InternalError", "mkdir failed: %s", strerror(err));
        return respond_error(rq, conn, &e, NULL);
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp) {
        char loc[128];
        snprintf(loc, sizeof(loc), "/%s", rq->bucket);
        MHD_add_response_header(resp, "Location", loc);
    }
    return queue(rq, conn, 200, resp, 0, NULL);
}

static enum MHD_Result op_delete_bucket(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    char *path = mock_store_path(rq->srv->store, rq->bucket, NULL);
    if (!path)
        return MHD_NO;
    int rc = rmdir(path);
    int err = errno;
    free(path);
    if (rc != 0) {
        if (err == ENOENT)
            set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        else if (err == ENOTEMPTY || err == EEXIST)
            set_error(&e, 409, "BucketNotEmpty", "The bucket you tried to delete is not empty");
        else
            set_error(&e, 500, "InternalError", "rmdir failed: %s", strerror(err));
        return respond_error(rq, conn, &e, NULL);
    }
    return respond_empty(rq, conn, 204);
}

static enum MHD_Result op_head_bucket(struct request *rq, struct MHD_Connection *conn)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp)
        MHD_add_response_header(resp, "x-amz-bucket-region", rq->srv->cfg.region);
    return queue(rq, conn, 200, resp, 0, NULL);
}

static enum MHD_Result op_bucket_location(struct request *rq, struct MHD_Connection *conn)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<LocationConstraint xmlns=\"" S3_XMLNS "\">");
    if (strcmp(rq->srv->cfg.region, "us-east-1") != 0)
        xml_escape(&b, rq->srv->cfg.region, strlen(rq->srv->cfg.region));
    sf__strbuf_puts(&b, "</LocationConstraint>");
    return respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

/* Continuation tokens are 'K' (a key) or 'P' (a common prefix) + hex. */
static char *token_encode(char kind, const char *s)
{
    size_t n = strlen(s);
    char *t = malloc(2 * n + 2);
    if (!t)
        return NULL;
    t[0] = kind;
    sf__hex_encode((const unsigned char *)s, n, t + 1);
    return t;
}

static char *token_decode(const char *t, char *kind)
{
    size_t n = strlen(t);
    if (n < 1 || (t[0] != 'K' && t[0] != 'P') || (n - 1) % 2 != 0 || n > 4096)
        return NULL;
    char *s = malloc((n - 1) / 2 + 1);
    if (!s)
        return NULL;
    for (size_t i = 0; i < (n - 1) / 2; i++) {
        int hi = sf__hex_digit_value((unsigned char)t[1 + 2 * i]);
        int lo = sf__hex_digit_value((unsigned char)t[2 + 2 * i]);
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            free(s);
            return NULL;
        }
        s[i] = (char)(hi * 16 + lo);
    }
    s[(n - 1) / 2] = '\0';
    *kind = t[0];
    return s;
}

static enum MHD_Result op_list_objects(struct request *rq, struct MHD_Connection *conn, int v2)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    const char *prefix = param_get(rq, "prefix");
    const char *delim = param_get(rq, "delimiter");
    const char *enc = param_get(rq, "encoding-type");
    const char *max_s = param_get(rq, "max-keys");
    const char *token = v2 ? param_get(rq, "continuation-token") : NULL;
    const char *start_after = param_get(rq, v2 ? "start-after" : "marker");
    if (!prefix)
        prefix = "";
    if (delim && !*delim)
        delim = NULL;
    int url = 0;
    if (enc) {
        if (strcmp(enc, "url") != 0) {
            set_error(&e, 400, "InvalidArgument", "Invalid Encoding Method specified in Request");
            return respond_error(rq, conn, &e, NULL);
        }
        url = 1;
    }
    long max_keys = 1000;
    if (max_s) {
        char *end;
        errno = 0;
        max_keys = strtol(max_s, &end, 10);
        if (end == max_s || *end || errno || max_keys < 0) {
            set_error(&e, 400, "InvalidArgument",
                      "Provided max-keys not an integer or within "
                      "integer range");
            return respond_error(rq, conn, &e, NULL);
        }
        if (max_keys > 1000)
            max_keys = 1000;
    }
    char resume_kind = 0;
    char *resume = NULL;
    if (token) {
        resume = token_decode(token, &resume_kind);
        if (!resume) {
            set_error(&e, 400, "InvalidArgument", "The continuation token provided is incorrect");
            return respond_error(rq, conn, &e, NULL);
        }
    } else if (start_after && *start_after) {
        resume = strdup(start_after);
        resume_kind = 'K';
    }

    struct mock_listing l;
    sf_status rc = mock_store_list(srv->store, rq->bucket, prefix, &l);
    if (rc != SF_OK) {
        free(resume);
        if (rc == SF_ERR_NOT_FOUND)
            set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        else
            set_error(&e, 500, "InternalError", "Listing failed: %s", sf_status_str(rc));
        return respond_error(rq, conn, &e, NULL);
    }

    struct sf__strbuf items;
    sf__strbuf_init(&items, 256u << 20);
    size_t plen = strlen(prefix), dlen = delim ? strlen(delim) : 0;
    long count = 0;
    int truncated = 0;
    char *last_cp = NULL;   /* the last common prefix emitted */
    char *last_item = NULL; /* the last key or prefix emitted */
    char last_kind = 0;
    for (size_t i = 0; i < l.n; i++) {
        const char *k = l.entries[i].key;
        const char *cp_end = NULL;
        if (delim) {
            const char *hit = strstr(k + plen, delim);
            if (hit)
                cp_end = hit + dlen;
        }
        /* Resume after the marker / token / start-after: a key that rolls
         * up into a common prefix is compared as that prefix, so a page that
         * ended on "a/" does not emit "a/" again (S3 semantics). */
        if (resume) {
            size_t cmp_len = cp_end ? (size_t)(cp_end - k) : strlen(k);
            size_t rlen = strlen(resume);
            int c = memcmp(k, resume, cmp_len < rlen ? cmp_len : rlen);
            if (c < 0 || (c == 0 && cmp_len <= rlen))
                continue;
            if (resume_kind == 'P' && strncmp(k, resume, rlen) == 0)
                continue;
        }
        if (cp_end && last_cp && strncmp(k, last_cp, strlen(last_cp)) == 0 &&
            strlen(last_cp) == (size_t)(cp_end - k))
            continue; /* rolled up into the prefix just emitted */
        if (count >= max_keys) {
            truncated = max_keys > 0;
            break;
        }
        if (cp_end) {
            free(last_cp);
            last_cp = strndup(k, (size_t)(cp_end - k));
            free(last_item);
            last_item = last_cp ? strdup(last_cp) : NULL;
            last_kind = 'P';
            if (!last_cp || !last_item) {
                sf__strbuf_free(&items);
                mock_listing_free(&l);
                free(resume);
                free(last_cp);
                free(last_item);
                return MHD_NO;
            }
            sf__strbuf_puts(&items, "<CommonPrefixes>");
            xml_elem(&items, "Prefix", last_cp, url);
            sf__strbuf_puts(&items, "</CommonPrefixes>");
        } else {
            char etag[MOCK_ETAG_LEN + 1] = "\"\"";
            char *path = mock_store_path(srv->store, rq->bucket, k);
            int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
            struct stat sb;
            if (fd >= 0 && fstat(fd, &sb) == 0)
                mock_store_etag(srv->store, path, fd, &sb, etag);
            if (fd >= 0)
                close(fd);
            free(path);
            char when[32];
            mock_format_iso8601(l.entries[i].mtime, when);
            sf__strbuf_puts(&items, "<Contents>");
            xml_elem(&items, "Key", k, url);
            xml_elem(&items, "LastModified", when, 0);
            xml_elem(&items, "ETag", etag, 0);
            sf__strbuf_printf(&items, "<Size>%llu</Size><StorageClass>STANDARD</StorageClass>",
                              (unsigned long long)l.entries[i].size);
            sf__strbuf_puts(&items, "</Contents>");
            free(last_item);
            last_item = strdup(k);
            last_kind = 'K';
        }
        count++;
    }
    mock_listing_free(&l);
    free(last_cp);

    struct sf__strbuf b;
    sf__strbuf_init(&b, 256u << 20);
    sf__strbuf_puts(&b, XML_DECL "<ListBucketResult xmlns=\"" S3_XMLNS "\">");
    xml_elem(&b, "Name", rq->bucket, 0);
    xml_elem(&b, "Prefix", prefix, url);
    if (delim)
        xml_elem(&b, "Delimiter", delim, url);
    sf__strbuf_printf(&b, "<MaxKeys>%ld</MaxKeys>", max_keys);
    if (url)
        xml_elem(&b, "EncodingType", "url", 0);
    sf__strbuf_printf(&b, "<IsTruncated>%s</IsTruncated>", truncated ? "true" : "false");
    if (v2) {
        sf__strbuf_printf(&b, "<KeyCount>%ld</KeyCount>", count);
        if (token)
            xml_elem(&b, "ContinuationToken", token, 0);
        if (start_after)
            xml_elem(&b, "StartAfter", start_after, url);
        if (truncated && last_item) {
            char *next = token_encode(last_kind, last_item);
            if (next)
                xml_elem(&b, "NextContinuationToken", next, 0);
            free(next);
        }
    } else {
        xml_elem(&b, "Marker", start_after ? start_after : "", url);
        if (truncated && last_item)
            xml_elem(&b, "NextMarker", last_item, url);
    }
    free(last_item);
    free(resume);
    sf__strbuf_append(&b, sf__strbuf_str(&items), items.len);
    sf__strbuf_free(&items);
    sf__strbuf_puts(&b, "</ListBucketResult>");
    if (b.err != SF_OK) {
        sf__strbuf_free(&b);
        set_error(&e, 500, "InternalError", "Listing too large");
        return respond_error(rq, conn, &e, NULL);
    }
    return respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

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
static void body_ended_early(struct request *rq, struct MHD_Connection *conn)
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
        if (sleep_ms_interruptible(b->srv, 2) != 0)
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
        if (sleep_ms_interruptible(b->srv, b->stall_ms) != 0)
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
        if (wait > 0 && sleep_ms_interruptible(b->srv, (int)(wait * 1000.0) + 1) != 0)
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

static enum MHD_Result op_get_object(struct request *rq, struct MHD_Connection *conn, int head)
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

    const char *range_h = header(conn, "Range");
    uint64_t start = 0, end = size ? size - 1 : 0;
    enum range_result rr = missing ? RANGE_NONE : parse_range(range_h, size, &start, &end);
    uint64_t body_len = rr == RANGE_OK ? end - start + 1 : size;

    struct mock_fault_plan plan;
    char ferr[256];
    if (mock_faults_plan(srv->faults, rq->target, range_h, header(conn, FAULT_HEADER),
                         head ? MOCK_OP_HEAD : MOCK_OP_GET, body_len, &plan, ferr,
                         sizeof(ferr)) != SF_OK) {
        if (fd >= 0)
            close(fd);
        set_error(&e, 400, "InvalidArgument", "%s", ferr);
        return respond_error(rq, conn, &e, NULL);
    }
    if (plan.latency_ms && sleep_ms_interruptible(srv, plan.latency_ms) != 0) {
        if (fd >= 0)
            close(fd);
        return MHD_NO;
    }
    if (plan.status) {
        if (fd >= 0)
            close(fd);
        return respond_fault_status(rq, conn, &plan);
    }
    if (missing) {
        if (fd >= 0)
            close(fd);
        if (!mock_bucket_exists(srv->store, rq->bucket))
            set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        else
            set_error(&e, 404, "NoSuchKey", "The specified key does not exist.");
        return respond_error(rq, conn, &e, NULL);
    }
    char etag[MOCK_ETAG_LEN + 1];
    char *obj_path = mock_store_path(srv->store, rq->bucket, rq->key);
    sf_status etag_st = mock_store_etag(srv->store, obj_path, fd, &sb, etag);
    free(obj_path);
    if (etag_st != SF_OK) {
        close(fd);
        set_error(&e, 500, "InternalError", "Cannot read the object");
        return respond_error(rq, conn, &e, NULL);
    }
    const char *fault = NULL;
    if (plan.etag_changed) {
        changed_etag(etag, etag);
        fault = "etag_changed";
    }
    const char *if_match = header(conn, "If-Match");
    const char *if_none = header(conn, "If-None-Match");
    if (if_match && !etag_matches(if_match, etag)) {
        close(fd);
        set_error(&e, 412, "PreconditionFailed",
                  "At least one of the pre-conditions you specified did not hold");
        e.extra_xml = strdup("<Condition>If-Match</Condition>");
        return respond_error(rq, conn, &e, fault);
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
        return queue(rq, conn, 304, resp, 0, fault);
    }
    if (rr == RANGE_UNSATISFIABLE) {
        close(fd);
        set_error(&e, 416, "InvalidRange", "The requested range is not satisfiable");
        struct sf__strbuf x;
        sf__strbuf_init(&x, 0);
        xml_elem(&x, "RangeRequested", range_h, 0);
        sf__strbuf_printf(&x, "<ActualObjectSize>%llu</ActualObjectSize>",
                          (unsigned long long)size);
        e.extra_xml = sf__strbuf_take(&x);
        return respond_error(rq, conn, &e, NULL);
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
    return queue(rq, conn, ranged ? 206 : 200, resp, sent, fault);
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

static enum MHD_Result op_delete_object(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    if (!mock_bucket_exists(rq->srv->store, rq->bucket)) {
        set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return respond_error(rq, conn, &e, NULL);
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
    return respond_empty(rq, conn, 204);
}

/* mkdir -p for the directories of key inside the bucket. */
static int make_parents(struct mock_server *srv, const char *bucket, const char *key)
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

static enum MHD_Result respond_no_such_upload(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    set_error(&e, 404, "NoSuchUpload",
              "The specified upload does not exist. The upload ID may be invalid, or the upload "
              "may have been aborted or completed.");
    struct sf__strbuf x;
    sf__strbuf_init(&x, 0);
    xml_elem(&x, "UploadId", rq->upload_id ? rq->upload_id : "", 0);
    e.extra_xml = sf__strbuf_take(&x);
    return respond_error(rq, conn, &e, NULL);
}

static enum MHD_Result upload_part_finish(struct request *rq, struct MHD_Connection *conn,
                                          const unsigned char md5[16]);

static void upload_abort(struct request *rq)
{
    if (rq->up_fd >= 0) {
        close(rq->up_fd);
        rq->up_fd = -1;
    }
    if (rq->up_tmp) {
        unlink(rq->up_tmp);
        free(rq->up_tmp);
        rq->up_tmp = NULL;
    }
}

static int parse_decimal_u64(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9' || strlen(s) > 19)
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return 0;
    *out = v;
    return 1;
}

/* The x-amz-checksum-* headers of an upload, and the checksums x-amz-trailer
 * announces for an aws-chunked one: which to compute while the body streams. */
static int checksums_begin(struct request *rq, struct MHD_Connection *conn, int chunked,
                           struct s3_error *e)
{
    for (int i = 0; i < MOCK_CK_COUNT; i++) {
        const char *v = header(conn, mock_checksum_header(i));
        if (!v)
            continue;
        if (strlen(v) >= MOCK_CK_B64_MAX) {
            set_error(e, 400, "InvalidRequest", "Value for %s header is invalid (%s).",
                      mock_checksum_header(i), rq->target);
            return -1;
        }
        rq->up_ck_header_mask |= 1u << i;
        snprintf(rq->up_ck_given[i], MOCK_CK_B64_MAX, "%s", v);
    }
    const char *trailer = chunked ? header(conn, "x-amz-trailer") : NULL;
    while (trailer && *trailer) {
        while (*trailer == ' ' || *trailer == ',')
            trailer++;
        size_t n = strcspn(trailer, ", ");
        char name[64];
        if (n > 0 && n < sizeof name) {
            memcpy(name, trailer, n);
            name[n] = '\0';
            int alg = mock_checksum_from_header(name);
            if (alg >= 0)
                rq->up_ck_trailer_mask |= 1u << alg;
        }
        trailer += n;
    }
    unsigned want = rq->up_ck_header_mask | rq->up_ck_trailer_mask;
    if (!want)
        return 0;
    rq->up_ck_on = 1;
    if (mock_checksums_init(&rq->up_ck, want) != 0) {
        set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    return 0;
}

static int put_consume(struct request *rq, const char *data, size_t n);

/* Where an aws-chunked decoder puts the decoded bytes. */
static int chunked_sink(void *cls, const char *data, size_t n)
{
    struct request *rq = cls;
    if (put_consume(rq, data, n) == 0)
        return 0;
    if (rq->up_too_large)
        mock_chunked_fail(rq->up_chunked, 400, "EntityTooLarge",
                          "Your proposed upload exceeds the maximum allowed size");
    return -1;
}

static int chunked_begin(struct request *rq, enum mock_chunked_mode mode, const char *payload,
                         struct s3_error *e)
{
    if (mode != MOCK_CHUNKED_UNSIGNED_TRAILER && !rq->auth_signed) {
        set_error(e, 400, "InvalidRequest",
                  "%s needs a signed request (the chunks are signed with its signature)",
                  payload);
        return -1;
    }
    struct mock_chunked_config cfg = {
        .mode = mode,
        .sink = chunked_sink,
        .sink_cls = rq,
        .signer = &rq->srv->signer,
        .amz_date = rq->amz_date,
        .scope_date = rq->auth.date,
        .region = rq->auth.region,
        .service = rq->auth.service,
        .seed_signature = rq->auth.signature,
    };
    rq->up_chunked = mock_chunked_new(&cfg);
    if (!rq->up_chunked) {
        set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    rq->up_chunked_mode = mode == MOCK_CHUNKED_UNSIGNED_TRAILER ? "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
                          : mode == MOCK_CHUNKED_SIGNED ? "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
                                                        : "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
    return 0;
}

/* An aws-chunked body that ended: complete, of the declared length, with
 * every announced trailer; the trailers' checksums join the headers'. */
static int chunked_end(struct request *rq, int failed, struct s3_error *e)
{
    struct mock_chunked *c = rq->up_chunked;
    if (failed || mock_chunked_finish(c) != 0) {
        int status;
        const char *code, *msg;
        mock_chunked_error(c, &status, &code, &msg);
        set_error(e, status, code, "%s (%s)", msg, rq->target);
        return -1;
    }
    uint64_t got = mock_chunked_decoded_bytes(c);
    if (got != rq->up_decoded_len) {
        set_error(e, 400, "IncompleteBody",
                  "You did not provide the number of bytes specified by the "
                  "x-amz-decoded-content-length HTTP header: it says %llu, the aws-chunked "
                  "body of %s decoded to %llu",
                  (unsigned long long)rq->up_decoded_len, rq->target, (unsigned long long)got);
        return -1;
    }
    size_t n = 0;
    const struct mock_trailer *t = mock_chunked_trailers(c, &n);
    unsigned seen = 0;
    for (size_t i = 0; i < n; i++) {
        int alg = mock_checksum_from_header(t[i].name);
        if (alg < 0)
            continue; /* a checksum the mock cannot compute, or another trailer */
        if (!(rq->up_ck_trailer_mask & (1u << alg))) {
            set_error(e, 400, "MalformedTrailerError",
                      "The trailer %s of %s was not announced in x-amz-trailer", t[i].name,
                      rq->target);
            return -1;
        }
        if (strlen(t[i].value) >= MOCK_CK_B64_MAX) {
            set_error(e, 400, "InvalidRequest", "Value for %s trailer is invalid (%s).",
                      t[i].name, rq->target);
            return -1;
        }
        seen |= 1u << alg;
        snprintf(rq->up_ck_given[alg], MOCK_CK_B64_MAX, "%s", t[i].value);
    }
    if (seen != rq->up_ck_trailer_mask) {
        set_error(e, 400, "MalformedTrailerError",
                  "The request of %s announced a checksum trailer in x-amz-trailer that the "
                  "body did not carry",
                  rq->target);
        return -1;
    }
    mock_stats_count(rq->srv->stats, "aws_chunked", rq->up_chunked_mode);
    return 0;
}

/* Checks the computed checksums against the given ones (headers, trailers);
 * the checked values are kept to be echoed in the answer. */
static int checksums_end(struct request *rq, struct s3_error *e)
{
    if (!rq->up_ck_on)
        return 0;
    char got[MOCK_CK_COUNT][MOCK_CK_B64_MAX];
    if (mock_checksums_final(&rq->up_ck, got) != 0) {
        set_error(e, 500, "InternalError", "Computing the checksum of %s failed", rq->target);
        return -1;
    }
    for (int i = 0; i < MOCK_CK_COUNT; i++) {
        if (!(rq->up_ck.want & (1u << i)))
            continue;
        if (strcmp(got[i], rq->up_ck_given[i]) != 0) {
            set_error(e, 400, "BadDigest",
                      "The %s you specified did not match the calculated checksum (%s: given "
                      "%s, computed %s).",
                      mock_checksum_name(i), rq->target, rq->up_ck_given[i], got[i]);
            return -1;
        }
        memcpy(rq->up_ck_echo[i], got[i], MOCK_CK_B64_MAX);
    }
    for (int i = 0; i < MOCK_CK_COUNT; i++)
        if (rq->up_ck.want & (1u << i))
            mock_stats_count(rq->srv->stats, "checksums", mock_checksum_name(i));
    return 0;
}

static void format_etag(const unsigned char md5[16], char out[MOCK_ETAG_LEN + 1])
{
    out[0] = '"';
    sf__hex_encode(md5, 16, out + 1);
    out[33] = '"';
    out[34] = '\0';
}

/* The answer of a stored PutObject or UploadPart: its ETag and, as S3, the
 * checksums that were checked. */
static enum MHD_Result respond_stored(struct request *rq, struct MHD_Connection *conn,
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
    return queue(rq, conn, 200, resp, 0, NULL);
}

static enum MHD_Result op_put_object_begin(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (header(conn, "x-amz-copy-source")) {
        set_error(&e, 501, "NotImplemented", "%s is not supported by the mock",
                  rq->part_number ? "UploadPartCopy" : "CopyObject");
        return respond_error(rq, conn, &e, NULL);
    }
    if (!mock_bucket_exists(srv->store, rq->bucket)) {
        set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return respond_error(rq, conn, &e, NULL);
    }
    const char *payload = header(conn, "x-amz-content-sha256");
    enum mock_chunked_mode chunked_mode;
    int chunked = mock_chunked_mode_of(payload, &chunked_mode) == 0;
    /* an aws-chunked body's size is the decoded one */
    const char *clen = header(conn, chunked ? "x-amz-decoded-content-length" : "Content-Length");
    if (chunked && !parse_decimal_u64(clen, &rq->up_decoded_len)) {
        set_error(&e, 411, "MissingContentLength",
                  "An aws-chunked upload of %s needs x-amz-decoded-content-length (a decimal "
                  "byte count)",
                  rq->target);
        return respond_error(rq, conn, &e, NULL);
    }
    if (clen && strtoull(clen, NULL, 10) > MAX_PUT_BYTES) {
        set_error(&e, 400, "EntityTooLarge",
                  "Your proposed upload exceeds the maximum "
                  "allowed size");
        return respond_error(rq, conn, &e, NULL);
    }
    if (rq->part_number &&
        mock_uploads_check(srv->uploads, rq->bucket, rq->key, rq->upload_id) != SF_OK)
        return respond_no_such_upload(rq, conn);
    if (payload && strlen(payload) == SF__SHA256_HEX_LEN) {
        rq->up_check_sha = 1;
        memcpy(rq->up_expect_sha, payload, SF__SHA256_HEX_LEN + 1);
    }
    if (checksums_begin(rq, conn, chunked, &e) != 0)
        return respond_error(rq, conn, &e, NULL);
    if (chunked && chunked_begin(rq, chunked_mode, payload, &e) != 0)
        return respond_error(rq, conn, &e, NULL);
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
        upload_abort(rq);
        set_error(&e, 500, "InternalError", "Cannot create the upload file: %s", strerror(errno));
        return respond_error(rq, conn, &e, NULL);
    }
    return MHD_YES; /* body follows */
}

static int put_consume(struct request *rq, const char *data, size_t n)
{
    if (rq->up_fd < 0)
        return -1;
    if (rq->up_bytes + n > MAX_PUT_BYTES) {
        rq->up_too_large = 1;
        return -1;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(rq->up_fd, data + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    EVP_DigestUpdate(rq->up_md5, data, n);
    EVP_DigestUpdate(rq->up_sha, data, n);
    if (rq->up_ck_on)
        mock_checksums_update(&rq->up_ck, data, n);
    rq->up_bytes += n;
    return 0;
}

static enum MHD_Result op_put_object_finish(struct request *rq, struct MHD_Connection *conn,
                                            int failed)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (rq->up_chunked && rq->up_fd >= 0 && chunked_end(rq, failed, &e) != 0) {
        upload_abort(rq);
        return respond_error(rq, conn, &e, NULL);
    }
    if (failed || rq->up_fd < 0) {
        upload_abort(rq);
        if (rq->up_too_large)
            set_error(&e, 400, "EntityTooLarge",
                      "Your proposed upload exceeds the maximum "
                      "allowed size");
        else
            set_error(&e, 500, "InternalError", "Writing the upload failed");
        return respond_error(rq, conn, &e, NULL);
    }
    unsigned char md5[16], sha[32];
    unsigned int l1 = 0, l2 = 0;
    EVP_DigestFinal_ex(rq->up_md5, md5, &l1);
    EVP_DigestFinal_ex(rq->up_sha, sha, &l2);
    char sha_hex[SF__SHA256_HEX_LEN + 1];
    sf__hex_encode(sha, 32, sha_hex);
    if (rq->up_check_sha && strcmp(sha_hex, rq->up_expect_sha) != 0) {
        upload_abort(rq);
        set_error(&e, 400, "XAmzContentSHA256Mismatch",
                  "The provided 'x-amz-content-sha256' header does not match what was computed.");
        return respond_error(rq, conn, &e, NULL);
    }
    const char *content_md5 = header(conn, "Content-MD5");
    if (content_md5) {
        unsigned char dec[64];
        size_t in_len = strlen(content_md5);
        int dl = in_len == 24 ? EVP_DecodeBlock(dec, (const unsigned char *)content_md5, 24) : -1;
        /* 24 base64 chars decode to 18 bytes, the last two being padding. */
        if (dl != 18 || memcmp(dec, md5, 16) != 0) {
            upload_abort(rq);
            set_error(&e, 400, "BadDigest",
                      "The Content-MD5 you specified did not match what we received.");
            return respond_error(rq, conn, &e, NULL);
        }
    }
    if (checksums_end(rq, &e) != 0) {
        upload_abort(rq);
        return respond_error(rq, conn, &e, NULL);
    }
    if (rq->part_number)
        return upload_part_finish(rq, conn, md5);
    /* mkostemp makes 0600 files; objects are plain readable files like the rest. */
    if (fchmod(rq->up_fd, 0644) != 0 || fsync(rq->up_fd) != 0 || close(rq->up_fd) != 0) {
        rq->up_fd = -1;
        upload_abort(rq);
        set_error(&e, 500, "InternalError", "Writing the upload failed");
        return respond_error(rq, conn, &e, NULL);
    }
    rq->up_fd = -1;
    char *final = mock_store_path(srv->store, rq->bucket, rq->key);
    if (!final || make_parents(srv, rq->bucket, rq->key) != 0 || rename(rq->up_tmp, final) != 0) {
        int err = errno;
        free(final);
        upload_abort(rq);
        if (err == EISDIR || err == ENOTDIR || err == EEXIST || err == ENOTEMPTY)
            set_error(&e, 400, "InvalidArgument",
                      "The key conflicts with a key prefix already "
                      "stored (the mock keeps objects as files)");
        else
            set_error(&e, 500, "InternalError", "Publishing the upload failed: %s", strerror(err));
        return respond_error(rq, conn, &e, NULL);
    }
    mock_store_forget_etag(final); /* a multipart object's ETag goes with it */
    free(final);
    free(rq->up_tmp);
    rq->up_tmp = NULL;
    char etag[MOCK_ETAG_LEN + 1];
    format_etag(md5, etag);
    return respond_stored(rq, conn, etag);
}

/* -------------------------------------------------------------- multipart */

/* The end of an UploadPart whose body was received and checked: the
 * temporary file becomes the part. */
static enum MHD_Result upload_part_finish(struct request *rq, struct MHD_Connection *conn,
                                          const unsigned char md5[16])
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (fsync(rq->up_fd) != 0 || close(rq->up_fd) != 0) {
        rq->up_fd = -1;
        upload_abort(rq);
        set_error(&e, 500, "InternalError", "Writing part %u failed", rq->part_number);
        return respond_error(rq, conn, &e, NULL);
    }
    rq->up_fd = -1;
    struct mock_part part = {
        .number = rq->part_number,
        .size = rq->up_bytes,
        .mtime = time(NULL),
        .path = rq->up_tmp,
    };
    memcpy(part.md5, md5, 16);
    sf_status st = mock_uploads_add_part(srv->uploads, rq->bucket, rq->key, rq->upload_id, &part);
    if (st == SF_ERR_NOT_FOUND) {
        upload_abort(rq);
        return respond_no_such_upload(rq, conn);
    }
    if (st != SF_OK) {
        upload_abort(rq);
        if (st == SF_ERR_LIMIT)
            set_error(&e, 400, "InvalidRequest",
                      "The mock holds at most %d parts of uploads in progress; complete or abort "
                      "some uploads",
                      MOCK_MAX_PARTS_TOTAL);
        else
            set_error(&e, 500, "InternalError", "Recording part %u failed: %s", rq->part_number,
                      sf_status_str(st));
        return respond_error(rq, conn, &e, NULL);
    }
    rq->up_tmp = NULL; /* the registry owns the file now */
    char etag[MOCK_ETAG_LEN + 1];
    format_etag(md5, etag);
    return respond_stored(rq, conn, etag);
}

static enum MHD_Result op_create_upload(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (!mock_bucket_exists(srv->store, rq->bucket)) {
        set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return respond_error(rq, conn, &e, NULL);
    }
    char id[MOCK_UPLOAD_ID_LEN + 1];
    sf_status st = mock_uploads_create(srv->uploads, rq->bucket, rq->key, id);
    if (st != SF_OK) {
        if (st == SF_ERR_LIMIT)
            set_error(&e, 400, "InvalidRequest",
                      "The mock holds at most %d multipart uploads in progress; complete or "
                      "abort some first",
                      MOCK_MAX_UPLOADS);
        else
            set_error(&e, 500, "InternalError", "Cannot start the upload: %s", sf_status_str(st));
        return respond_error(rq, conn, &e, NULL);
    }
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<InitiateMultipartUploadResult xmlns=\"" S3_XMLNS "\">");
    xml_elem(&b, "Bucket", rq->bucket, 0);
    xml_elem(&b, "Key", rq->key, 0);
    xml_elem(&b, "UploadId", id, 0);
    sf__strbuf_puts(&b, "</InitiateMultipartUploadResult>");
    return respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

/* Compares a part's ETag as a client sends it (quoted or bare, any case). */
static int part_etag_matches(const char *given, const unsigned char md5[16])
{
    size_t n = strlen(given);
    if (n >= 2 && given[0] == '"' && given[n - 1] == '"') {
        given++;
        n -= 2;
    }
    char hex[33];
    sf__hex_encode(md5, 16, hex);
    return n == 32 && strncasecmp(given, hex, 32) == 0;
}

/* errno of a failed publish that means the key clashes with a key prefix
 * (a file where a folder is needed, or the reverse): 400, set in e. */
static int key_conflict(int err, struct s3_error *e)
{
    if (err != EISDIR && err != ENOTDIR && err != EEXIST && err != ENOTEMPTY)
        return 0;
    set_error(e, 400, "InvalidArgument",
              "The key conflicts with a key prefix already stored (the mock keeps objects as "
              "files)");
    return 1;
}

/* Concatenates the listed parts into a temporary file in the bucket and
 * publishes it as the key, with the multipart ETag pinned. */
static int assemble_object(struct request *rq, const struct mock_part *const *use, size_t n,
                           const char *etag, struct s3_error *e)
{
    struct mock_server *srv = rq->srv;
    char *dir = mock_store_path(srv->store, rq->bucket, NULL);
    size_t len = dir ? strlen(dir) + sizeof("/" MOCK_TMP_PREFIX "upload-XXXXXX") : 0;
    char *tmp = dir ? malloc(len) : NULL;
    if (!tmp) {
        free(dir);
        set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    snprintf(tmp, len, "%s/" MOCK_TMP_PREFIX "upload-XXXXXX", dir);
    free(dir);
    int out = mkostemp(tmp, O_CLOEXEC);
    if (out < 0) {
        set_error(e, 500, "InternalError", "Cannot create the object file: %s", strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = 1;
    uint64_t total = 0;
    for (size_t i = 0; ok && i < n; i++) {
        int in = open(use[i]->path, O_RDONLY | O_CLOEXEC);
        uint64_t left = use[i]->size;
        while (in >= 0 && left > 0) {
            ssize_t c =
                copy_file_range(in, NULL, out, NULL, left > (1u << 30) ? (1u << 30) : left, 0);
            if (c < 0 && errno == EINTR)
                continue;
            if (c <= 0)
                break;
            left -= (uint64_t)c;
        }
        if (in < 0 || left > 0) {
            set_error(e, 500, "InternalError", "Copying part %u into the object failed: %s",
                      use[i]->number, in < 0 ? strerror(errno) : "short copy");
            ok = 0;
        }
        if (in >= 0)
            close(in);
        total += use[i]->size;
    }
    struct stat sb;
    if (ok && (fchmod(out, 0644) != 0 || fsync(out) != 0 || fstat(out, &sb) != 0 ||
               (uint64_t)sb.st_size != total)) {
        set_error(e, 500, "InternalError", "Writing the object failed");
        ok = 0;
    }
    if (ok)
        mock_store_set_etag(srv->store, &sb, etag);
    close(out);
    char *final = ok ? mock_store_path(srv->store, rq->bucket, rq->key) : NULL;
    if (ok && !final) {
        set_error(e, 500, "InternalError", "Out of memory");
        ok = 0;
    }
    /* the sidecar first: the object never appears without its ETag */
    if (ok && (make_parents(srv, rq->bucket, rq->key) != 0 ||
               mock_store_persist_etag(final, &sb, etag) != SF_OK)) {
        int err = errno;
        if (!key_conflict(err, e))
            set_error(e, 500, "InternalError", "Persisting the ETag of %s failed: %s",
                      rq->target, strerror(err));
        ok = 0;
    }
    if (ok && rename(tmp, final) != 0) {
        int err = errno;
        if (!key_conflict(err, e))
            set_error(e, 500, "InternalError", "Publishing the object failed: %s", strerror(err));
        mock_store_forget_etag(final);
        ok = 0;
    }
    if (!ok)
        unlink(tmp);
    free(final);
    free(tmp);
    return ok ? 0 : -1;
}

static enum MHD_Result op_complete_upload(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (rq->body.err != SF_OK) {
        set_error(&e, 400, "MalformedXML", "The part list is larger than the mock's %d bytes",
                  MAX_SMALL_BODY);
        return respond_error(rq, conn, &e, NULL);
    }
    const char *payload = header(conn, "x-amz-content-sha256");
    if (payload && strlen(payload) == SF__SHA256_HEX_LEN) {
        char hex[SF__SHA256_HEX_LEN + 1];
        sf__sha256_hex(rq->body.data ? rq->body.data : "", rq->body.len, hex);
        if (strcmp(hex, payload) != 0) {
            set_error(&e, 400, "XAmzContentSHA256Mismatch",
                      "The provided 'x-amz-content-sha256' header does not match what was "
                      "computed.");
            return respond_error(rq, conn, &e, NULL);
        }
    }
    struct sf__xml_part *given = NULL;
    size_t n_given = 0;
    char xerr[256] = "";
    sf_status st =
        sf__xml_parse_complete(sf__strbuf_str(&rq->body), rq->body.len, MOCK_MAX_PART_NUMBER,
                               &given, &n_given, xerr, sizeof(xerr));
    if (st != SF_OK || n_given == 0) {
        free(given);
        set_error(&e, 400, "MalformedXML",
                  "The XML you provided was not well-formed or did not validate against our "
                  "published schema (%s)",
                  st != SF_OK ? xerr : "no <Part>");
        return respond_error(rq, conn, &e, NULL);
    }
    struct mock_part *parts = NULL;
    size_t n_parts = 0;
    st = mock_uploads_parts(srv->uploads, rq->bucket, rq->key, rq->upload_id, 1, &parts, &n_parts);
    if (st != SF_OK) {
        free(given);
        if (st == SF_ERR_NOT_FOUND)
            return respond_no_such_upload(rq, conn);
        set_error(&e, 500, "InternalError", "%s", sf_status_str(st));
        return respond_error(rq, conn, &e, NULL);
    }
    /* The checks of S3 (and MinIO): ascending order first, then each part
     * exists with that ETag, then every part but the last is >= 5 MiB. */
    const struct mock_part **use = calloc(n_given, sizeof(*use));
    int bad = !use;
    if (bad)
        set_error(&e, 500, "InternalError", "Out of memory");
    for (size_t i = 1; !bad && i < n_given; i++) {
        if (given[i].number <= given[i - 1].number) {
            set_error(&e, 400, "InvalidPartOrder",
                      "The list of parts was not in ascending order. The parts list must be "
                      "specified in order by part number. (part %u after part %u)",
                      given[i].number, given[i - 1].number);
            bad = 1;
        }
    }
    for (size_t i = 0; !bad && i < n_given; i++) {
        const struct mock_part *found = NULL;
        for (size_t j = 0; j < n_parts && !found; j++)
            if (parts[j].number == given[i].number)
                found = &parts[j];
        if (!found || !part_etag_matches(given[i].etag, found->md5)) {
            set_error(&e, 400, "InvalidPart",
                      "One or more of the specified parts could not be found. The part may not "
                      "have been uploaded, or the specified entity tag may not match the part's "
                      "entity tag. (part %u: %s)",
                      given[i].number, found ? "ETag differs" : "not uploaded");
            struct sf__strbuf x;
            sf__strbuf_init(&x, 0);
            xml_elem(&x, "UploadId", rq->upload_id, 0);
            sf__strbuf_printf(&x, "<PartNumber>%u</PartNumber>", given[i].number);
            xml_elem(&x, "ETag", given[i].etag, 0);
            e.extra_xml = sf__strbuf_take(&x);
            bad = 1;
        }
        use[i] = found;
    }
    for (size_t i = 0; !bad && i + 1 < n_given; i++) {
        if (use[i]->size < MOCK_MIN_PART_BYTES) {
            set_error(&e, 400, "EntityTooSmall",
                      "Your proposed upload is smaller than the minimum allowed object size. "
                      "(part %u: %llu bytes, every part but the last needs %llu)",
                      use[i]->number, (unsigned long long)use[i]->size, MOCK_MIN_PART_BYTES);
            struct sf__strbuf x;
            sf__strbuf_init(&x, 0);
            sf__strbuf_printf(&x,
                              "<ProposedSize>%llu</ProposedSize><MinSizeAllowed>%llu"
                              "</MinSizeAllowed><PartNumber>%u</PartNumber>",
                              (unsigned long long)use[i]->size, MOCK_MIN_PART_BYTES,
                              use[i]->number);
            xml_elem(&x, "ETag", given[i].etag, 0);
            e.extra_xml = sf__strbuf_take(&x);
            bad = 1;
        }
    }
    char etag[MOCK_ETAG_LEN + 1];
    if (!bad) {
        /* S3's multipart ETag: MD5 of the parts' binary MD5s, then "-N" */
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        unsigned char md[16];
        unsigned int md_len = 0;
        if (!ctx || !EVP_DigestInit_ex(ctx, EVP_md5(), NULL)) {
            set_error(&e, 500, "InternalError", "MD5 failed");
            bad = 1;
        }
        for (size_t i = 0; !bad && i < n_given; i++)
            EVP_DigestUpdate(ctx, use[i]->md5, 16);
        if (!bad && (!EVP_DigestFinal_ex(ctx, md, &md_len) || md_len != 16)) {
            set_error(&e, 500, "InternalError", "MD5 failed");
            bad = 1;
        }
        EVP_MD_CTX_free(ctx);
        if (!bad) {
            char hex[33];
            sf__hex_encode(md, 16, hex);
            snprintf(etag, sizeof(etag), "\"%s-%zu\"", hex, n_given);
            bad = assemble_object(rq, use, n_given, etag, &e) != 0;
        }
    }
    free(use);
    free(given);
    mock_parts_free(parts, n_parts);
    mock_uploads_end_complete(srv->uploads, rq->upload_id, !bad);
    if (bad)
        return respond_error(rq, conn, &e, NULL);
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<CompleteMultipartUploadResult xmlns=\"" S3_XMLNS "\">");
    struct sf__strbuf loc;
    sf__strbuf_init(&loc, 0);
    sf__strbuf_printf(&loc, "%s://%s%s", mock_server_scheme(srv),
                      header(conn, "Host") ? header(conn, "Host") : "localhost", rq->path);
    xml_elem(&b, "Location", sf__strbuf_str(&loc), 0);
    sf__strbuf_free(&loc);
    xml_elem(&b, "Bucket", rq->bucket, 0);
    xml_elem(&b, "Key", rq->key, 0);
    xml_elem(&b, "ETag", etag, 0);
    sf__strbuf_puts(&b, "</CompleteMultipartUploadResult>");
    return respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

static enum MHD_Result op_abort_upload(struct request *rq, struct MHD_Connection *conn)
{
    if (mock_uploads_abort(rq->srv->uploads, rq->bucket, rq->key, rq->upload_id) != SF_OK)
        return respond_no_such_upload(rq, conn);
    return respond_empty(rq, conn, 204);
}

/* A query parameter that must be an integer in [lo, hi] when present. */
static int param_uint(struct request *rq, const char *name, unsigned long lo, unsigned long hi,
                      unsigned long *out, struct s3_error *e)
{
    const char *v = param_get(rq, name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    unsigned long x = strtoul(v, &end, 10);
    if (!*v || *v == '-' || *end || errno || x < lo || x > hi) {
        set_error(e, 400, "InvalidArgument", "%s must be an integer from %lu to %lu", name, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static enum MHD_Result op_list_parts(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    unsigned long max_parts = 1000, marker = 0;
    if (param_uint(rq, "max-parts", 0, 2147483647ul, &max_parts, &e) != 0 ||
        param_uint(rq, "part-number-marker", 0, 2147483647ul, &marker, &e) != 0)
        return respond_error(rq, conn, &e, NULL);
    if (max_parts > 1000)
        max_parts = 1000;
    struct mock_part *parts = NULL;
    size_t n = 0;
    sf_status st =
        mock_uploads_parts(srv->uploads, rq->bucket, rq->key, rq->upload_id, 0, &parts, &n);
    if (st == SF_ERR_NOT_FOUND)
        return respond_no_such_upload(rq, conn);
    if (st != SF_OK) {
        set_error(&e, 500, "InternalError", "%s", sf_status_str(st));
        return respond_error(rq, conn, &e, NULL);
    }
    struct sf__strbuf items;
    sf__strbuf_init(&items, 0);
    unsigned long count = 0;
    unsigned last = 0;
    int truncated = 0;
    for (size_t i = 0; i < n; i++) {
        if (parts[i].number <= marker)
            continue;
        if (count == max_parts) {
            truncated = 1;
            break;
        }
        char when[32], etag[MOCK_ETAG_LEN + 1];
        mock_format_iso8601(parts[i].mtime, when);
        format_etag(parts[i].md5, etag);
        sf__strbuf_printf(&items, "<Part><PartNumber>%u</PartNumber>", parts[i].number);
        xml_elem(&items, "LastModified", when, 0);
        xml_elem(&items, "ETag", etag, 0);
        sf__strbuf_printf(&items, "<Size>%llu</Size></Part>", (unsigned long long)parts[i].size);
        last = parts[i].number;
        count++;
    }
    mock_parts_free(parts, n);
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<ListPartsResult xmlns=\"" S3_XMLNS "\">");
    xml_elem(&b, "Bucket", rq->bucket, 0);
    xml_elem(&b, "Key", rq->key, 0);
    xml_elem(&b, "UploadId", rq->upload_id, 0);
    sf__strbuf_puts(&b, "<Initiator><ID>mock</ID><DisplayName>mock</DisplayName></Initiator>"
                        "<Owner><ID>mock</ID><DisplayName>mock</DisplayName></Owner>"
                        "<StorageClass>STANDARD</StorageClass>");
    sf__strbuf_printf(&b,
                      "<PartNumberMarker>%lu</PartNumberMarker><NextPartNumberMarker>%u"
                      "</NextPartNumberMarker><MaxParts>%lu</MaxParts><IsTruncated>%s"
                      "</IsTruncated>",
                      marker, last, max_parts, truncated ? "true" : "false");
    sf__strbuf_append(&b, sf__strbuf_str(&items), items.len);
    sf__strbuf_free(&items);
    sf__strbuf_puts(&b, "</ListPartsResult>");
    return respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

static enum MHD_Result op_list_uploads(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    const char *prefix = param_get(rq, "prefix");
    const char *key_marker = param_get(rq, "key-marker");
    const char *id_marker = param_get(rq, "upload-id-marker");
    const char *enc = param_get(rq, "encoding-type");
    if (!prefix)
        prefix = "";
    if (!key_marker)
        key_marker = "";
    if (enc && strcmp(enc, "url") != 0) {
        set_error(&e, 400, "InvalidArgument", "Invalid Encoding Method specified in Request");
        return respond_error(rq, conn, &e, NULL);
    }
    int url = enc != NULL;
    unsigned long max_uploads = 1000;
    if (param_uint(rq, "max-uploads", 0, 2147483647ul, &max_uploads, &e) != 0)
        return respond_error(rq, conn, &e, NULL);
    if (max_uploads > 1000)
        max_uploads = 1000;
    struct mock_upload_info *v = NULL;
    size_t n = 0;
    if (mock_uploads_list(srv->uploads, rq->bucket, prefix, &v, &n) != SF_OK)
        return MHD_NO;
    struct sf__strbuf items;
    sf__strbuf_init(&items, 0);
    unsigned long count = 0;
    int truncated = 0;
    const struct mock_upload_info *last = NULL;
    for (size_t i = 0; i < n; i++) {
        /* after the markers: keys past key-marker, or the same key past
         * upload-id-marker (S3 ignores the id marker without a key marker) */
        int c = strcmp(v[i].key, key_marker);
        if (*key_marker && (c < 0 || (c == 0 && (!id_marker || strcmp(v[i].id, id_marker) <= 0))))
            continue;
        if (count == max_uploads) {
            truncated = 1;
            break;
        }
        char when[32];
        mock_format_iso8601(v[i].initiated, when);
        sf__strbuf_puts(&items, "<Upload>");
        xml_elem(&items, "Key", v[i].key, url);
        xml_elem(&items, "UploadId", v[i].id, 0);
        sf__strbuf_puts(&items, "<Initiator><ID>mock</ID><DisplayName>mock</DisplayName>"
                                "</Initiator><Owner><ID>mock</ID><DisplayName>mock</DisplayName>"
                                "</Owner><StorageClass>STANDARD</StorageClass>");
        xml_elem(&items, "Initiated", when, 0);
        sf__strbuf_puts(&items, "</Upload>");
        last = &v[i];
        count++;
    }
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<ListMultipartUploadsResult xmlns=\"" S3_XMLNS "\">");
    xml_elem(&b, "Bucket", rq->bucket, 0);
    xml_elem(&b, "KeyMarker", key_marker, url);
    xml_elem(&b, "UploadIdMarker", id_marker ? id_marker : "", 0);
    if (truncated && last) {
        xml_elem(&b, "NextKeyMarker", last->key, url);
        xml_elem(&b, "NextUploadIdMarker", last->id, 0);
    }
    xml_elem(&b, "Prefix", prefix, url);
    if (url)
        xml_elem(&b, "EncodingType", "url", 0);
    sf__strbuf_printf(&b, "<MaxUploads>%lu</MaxUploads><IsTruncated>%s</IsTruncated>", max_uploads,
                      truncated ? "true" : "false");
    sf__strbuf_append(&b, sf__strbuf_str(&items), items.len);
    sf__strbuf_free(&items);
    sf__strbuf_puts(&b, "</ListMultipartUploadsResult>");
    mock_upload_infos_free(v, n);
    return respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

/* ------------------------------------------------------------------ json */

static enum MHD_Result respond_json(struct request *rq, struct MHD_Connection *conn, int status,
                                    const char *json)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, json);
    return respond_buffer(rq, conn, status, "application/json", &b, NULL);
}

/* ------------------------------------------------------------ credentials */

static enum MHD_Result respond_text(struct request *rq, struct MHD_Connection *conn, int status,
                                    const char *text)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, text);
    return respond_buffer(rq, conn, status, "text/plain", &b, NULL);
}

static enum MHD_Result respond_405(struct request *rq, struct MHD_Connection *conn,
                                   const char *allow)
{
    static const char text[] = "Method Not Allowed\n";
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(sizeof(text) - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
    if (resp) {
        MHD_add_response_header(resp, "Allow", allow);
        MHD_add_response_header(resp, "Content-Type", "text/plain");
    }
    return queue(rq, conn, 405, resp, sizeof(text) - 1, NULL);
}

/* A credential document: the mock's key pair with a freshly issued token.
 * imds adds the fields of an IMDS answer, else RoleArn (ECS). */
static enum MHD_Result respond_credentials(struct request *rq, struct MHD_Connection *conn,
                                           int imds)
{
    struct mock_server *srv = rq->srv;
    char token[TOKEN_MAX_LEN], expiration[32], now[32];
    if (issue_session_token(srv, token, expiration) != 0)
        return respond_text(rq, conn, 500, "cannot make a random token\n");
    format_aws_time(wall_s(), now);
    cJSON *doc = cJSON_CreateObject();
    if (!doc)
        return MHD_NO;
    if (imds) {
        cJSON_AddStringToObject(doc, "Code", "Success");
        cJSON_AddStringToObject(doc, "LastUpdated", now);
        cJSON_AddStringToObject(doc, "Type", "AWS-HMAC");
    } else {
        char arn[256];
        snprintf(arn, sizeof(arn), "arn:aws:iam::000000000000:role/%s", srv->cfg.imds_role);
        cJSON_AddStringToObject(doc, "RoleArn", arn);
    }
    cJSON_AddStringToObject(doc, "AccessKeyId", srv->cfg.access_key);
    cJSON_AddStringToObject(doc, "SecretAccessKey", srv->cfg.secret_key);
    cJSON_AddStringToObject(doc, "Token", token);
    cJSON_AddStringToObject(doc, "Expiration", expiration);
    char *json = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!json)
        return MHD_NO;
    mock_stats_credential(srv->stats, imds ? "imds_credentials" : "container");
    enum MHD_Result r = respond_json(rq, conn, 200, json);
    free(json);
    return r;
}

/* PUT /latest/api/token: an IMDSv2 session token for 1..21600 s. */
static enum MHD_Result imds_token(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    if (strcmp(rq->method, "PUT") != 0)
        return respond_405(rq, conn, "PUT");
    /* Like EC2: a token request that went through a proxy is refused, so a
     * token never leaves the instance. */
    if (header(conn, "X-Forwarded-For"))
        return respond_text(rq, conn, 403, "Forbidden\n");
    const char *ttl_s = header(conn, IMDS_TTL_HEADER);
    char *end = NULL;
    long ttl = -1;
    if (ttl_s && *ttl_s >= '0' && *ttl_s <= '9') {
        errno = 0;
        ttl = strtol(ttl_s, &end, 10);
        if (*end || errno)
            ttl = -1;
    }
    if (ttl < 1 || ttl > IMDS_MAX_TTL_S)
        return respond_text(rq, conn, 400,
                            "Bad Request: " IMDS_TTL_HEADER " must be an integer 1..21600\n");
    char token[TOKEN_MAX_LEN];
    if (random_hex(24, token) != 0)
        return respond_text(rq, conn, 500, "cannot make a random token\n");
    pthread_mutex_lock(&srv->tokens_lock);
    ring_add(&srv->imds_tokens, token, wall_s() + (double)ttl);
    pthread_mutex_unlock(&srv->tokens_lock);
    mock_stats_credential(srv->stats, "imds_token");
    size_t n = strlen(token);
    char *body = strdup(token);
    struct MHD_Response *resp =
        body ? MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    char ttl_text[16];
    snprintf(ttl_text, sizeof(ttl_text), "%ld", ttl);
    MHD_add_response_header(resp, "Content-Type", "text/plain");
    MHD_add_response_header(resp, IMDS_TTL_HEADER, ttl_text);
    return queue(rq, conn, 200, resp, n, NULL);
}

/* GET /latest/meta-data/...: IMDSv2 only, so every answer needs a token. */
static enum MHD_Result imds_metadata(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    if (strcmp(rq->method, "GET") != 0)
        return respond_405(rq, conn, "GET");
    const char *tok = header(conn, IMDS_TOKEN_HEADER);
    if (!tok || ring_check(srv, &srv->imds_tokens, tok) != TOKEN_VALID)
        return respond_text(rq, conn, 401, "Unauthorized\n");
    if (strcmp(rq->path, IMDS_CREDS_PATH) == 0) {
        char list[256];
        snprintf(list, sizeof(list), "%s\n", srv->cfg.imds_role);
        mock_stats_credential(srv->stats, "imds_role_list");
        return respond_text(rq, conn, 200, list);
    }
    if (strncmp(rq->path, IMDS_CREDS_PATH, strlen(IMDS_CREDS_PATH)) == 0) {
        const char *raw = rq->path + strlen(IMDS_CREDS_PATH);
        char *role = decode_dup(raw, strlen(raw), NULL);
        int known = role && strcmp(role, srv->cfg.imds_role) == 0;
        free(role);
        if (known)
            return respond_credentials(rq, conn, 1);
    }
    return respond_text(rq, conn, 404, "Not Found\n");
}

/* GET on the container-credentials path (ECS / EKS Pod Identity style). */
static enum MHD_Result container_credentials(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    if (strcmp(rq->method, "GET") != 0)
        return respond_405(rq, conn, "GET");
    const char *want = srv->cfg.container_auth_token;
    const char *got = header(conn, "Authorization");
    if (want && (!got || strcmp(got, want) != 0))
        return respond_text(rq, conn, 401,
                            "Unauthorized: the Authorization header does not match "
                            "--container-auth-token\n");
    return respond_credentials(rq, conn, 0);
}

static int is_container_path(const struct mock_server *srv, const char *path)
{
    return strcmp(path, DEFAULT_CONTAINER_PATH) == 0 ||
           (srv->cfg.container_path && strcmp(path, srv->cfg.container_path) == 0);
}

static int is_imds_path(const char *path)
{
    return strcmp(path, IMDS_TOKEN_PATH) == 0 ||
           strncmp(path, IMDS_META_PREFIX, strlen(IMDS_META_PREFIX)) == 0;
}

/* ------------------------------------------------------------------ admin */

static enum MHD_Result admin(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    const char *what = rq->path + strlen("/_mock/");
    int get = strcmp(rq->method, "GET") == 0;
    int post = strcmp(rq->method, "POST") == 0 || strcmp(rq->method, "PUT") == 0;
    rq->op = "Admin";
    char err[512];
    if (get && strcmp(what, "stats") == 0) {
        char *json = mock_stats_json(srv->stats);
        if (!json)
            return MHD_NO;
        enum MHD_Result r = respond_json(rq, conn, 200, json);
        free(json);
        return r;
    }
    if (get && strcmp(what, "health") == 0)
        return respond_json(rq, conn, 200, "{\"ok\":true}");
    if (post && strcmp(what, "reset") == 0) {
        mock_stats_reset(srv->stats);
        return respond_json(rq, conn, 200, "{\"ok\":true}");
    }
    if (get && strcmp(what, "faults") == 0) {
        char *text = mock_faults_describe(srv->faults);
        if (!text)
            return MHD_NO;
        struct sf__strbuf b;
        sf__strbuf_init(&b, 0);
        sf__strbuf_puts(&b, text);
        free(text);
        return respond_buffer(rq, conn, 200, "text/plain", &b, NULL);
    }
    if (post && strcmp(what, "faults") == 0) {
        if (rq->body.err != SF_OK)
            return respond_json(rq, conn, 413, "{\"error\":\"body too large\"}");
        if (mock_faults_set_rules(srv->faults, sf__strbuf_str(&rq->body), err, sizeof(err)) !=
            SF_OK) {
            struct sf__strbuf b;
            sf__strbuf_init(&b, 0);
            sf__strbuf_puts(&b, err);
            return respond_buffer(rq, conn, 400, "text/plain", &b, NULL);
        }
        return respond_json(rq, conn, 200, "{\"ok\":true}");
    }
    if (post && strcmp(what, "fault") == 0) {
        const char *prefix = param_get(rq, "prefix");
        const char *fault = param_get(rq, "fault");
        const char *count_s = param_get(rq, "count");
        long count = count_s ? strtol(count_s, NULL, 10) : 1;
        if (!prefix)
            prefix = "";
        if (!fault || count < 1 || count > 1000000 ||
            mock_faults_queue(srv->faults, prefix, fault, (unsigned)count, err, sizeof(err)) !=
                SF_OK) {
            struct sf__strbuf b;
            sf__strbuf_init(&b, 0);
            sf__strbuf_puts(&b, fault ? err : "missing fault parameter");
            return respond_buffer(rq, conn, 400, "text/plain", &b, NULL);
        }
        return respond_json(rq, conn, 200, "{\"ok\":true}");
    }
    return respond_json(rq, conn, 404, "{\"error\":\"no such admin endpoint\"}");
}

/* --------------------------------------------------------------- routing */

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
        return respond_error(rq, conn, &e, NULL);
    if (is_container_path(srv, rq->path)) {
        rq->op = "Credentials";
        return container_credentials(rq, conn);
    }
    if (is_imds_path(rq->path)) {
        rq->op = "Credentials";
        return strcmp(rq->path, IMDS_TOKEN_PATH) == 0 ? imds_token(rq, conn)
                                                      : imds_metadata(rq, conn);
    }
    if (strncmp(rq->path, "/_mock/", 7) == 0)
        return admin(rq, conn);
    if (parse_path(rq, &e) != 0)
        return respond_error(rq, conn, &e, NULL);

    /* Name the operation first so errors are counted under it. */
    int multipart = 0;
    if (!rq->bucket) {
        rq->op = is_get ? "ListBuckets" : "Unknown";
    } else if (!rq->key) {
        if (is_get && param_has(rq, "location"))
            rq->op = "GetBucketLocation";
        else if (is_get && param_has(rq, "uploads"))
            rq->op = "ListMultipartUploads";
        else if (is_get)
            rq->op = strcmp(param_get(rq, "list-type") ? param_get(rq, "list-type") : "", "2") == 0
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
        rq->upload_id = param_get(rq, "uploadId");
        multipart = (is_post && param_has(rq, "uploads")) ||
                    (rq->upload_id && (is_post || is_put || is_del || is_get));
        if (is_post && param_has(rq, "uploads"))
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

    if (authenticate(rq, conn, &e) != 0)
        return respond_error(rq, conn, &e, NULL);

    if (strcmp(rq->op, "Unknown") == 0) {
        set_error(&e, 501, "NotImplemented", "%s %s is not implemented by the mock", m,
                  rq->bucket ? (rq->key ? "on an object" : "on a bucket") : "on the service");
        return respond_error(rq, conn, &e, NULL);
    }
    if (!rq->bucket)
        return op_list_buckets(rq, conn);

    if (!mock_bucket_name_valid(rq->bucket)) {
        set_error(&e, 400, "InvalidBucketName", "The specified bucket is not valid.");
        return respond_error(rq, conn, &e, NULL);
    }
    if (rq->key && !mock_key_valid(rq->key, rq->key_len)) {
        set_error(&e, 400, "InvalidArgument",
                  "The key is not accepted: empty, '.' or '..' segments, a leading '/', NUL "
                  "bytes and the '" MOCK_TMP_PREFIX "' prefix are refused");
        return respond_error(rq, conn, &e, NULL);
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
            set_error(&e, 501, "NotImplemented",
                      "The '%s' subresource is not implemented by "
                      "the mock",
                      name);
            return respond_error(rq, conn, &e, NULL);
        }
    }

    if (strcmp(rq->op, "UploadPart") == 0) {
        const char *pn = param_get(rq, "partNumber");
        char *end = NULL;
        unsigned long v = pn && *pn >= '0' && *pn <= '9' ? strtoul(pn, &end, 10) : 0;
        if (!end || *end || v < 1 || v > MOCK_MAX_PART_NUMBER) {
            set_error(&e, 400, "InvalidArgument",
                      "Part number must be an integer between 1 and %d, inclusive",
                      MOCK_MAX_PART_NUMBER);
            return respond_error(rq, conn, &e, NULL);
        }
        rq->part_number = (unsigned)v;
    }
    if (rq->key && !multipart && (is_get || is_head))
        return op_get_object(rq, conn, is_head); /* plans its own faults */

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
                             header(conn, FAULT_HEADER), kind, 0, &plan, ferr,
                             sizeof(ferr)) != SF_OK) {
            set_error(&e, 400, "InvalidArgument", "%s", ferr);
            return respond_error(rq, conn, &e, NULL);
        }
        if (plan.latency_ms && sleep_ms_interruptible(srv, plan.latency_ms) != 0)
            return MHD_NO;
        if (plan.status)
            return respond_fault_status(rq, conn, &plan);
        if (strcmp(rq->op, "CreateMultipartUpload") == 0)
            return op_create_upload(rq, conn);
        if (strcmp(rq->op, "CompleteMultipartUpload") == 0)
            return op_complete_upload(rq, conn);
        if (strcmp(rq->op, "AbortMultipartUpload") == 0)
            return op_abort_upload(rq, conn);
        if (strcmp(rq->op, "ListParts") == 0)
            return op_list_parts(rq, conn);
        return is_put ? op_put_object_begin(rq, conn) : op_delete_object(rq, conn);
    }
    if (is_put)
        return op_create_bucket(rq, conn);
    if (!mock_bucket_exists(srv->store, rq->bucket)) {
        set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return respond_error(rq, conn, &e, NULL);
    }
    if (is_head)
        return op_head_bucket(rq, conn);
    if (is_del)
        return op_delete_bucket(rq, conn);
    if (strcmp(rq->op, "GetBucketLocation") == 0)
        return op_bucket_location(rq, conn);
    if (list_uploads)
        return op_list_uploads(rq, conn);
    return op_list_objects(rq, conn, strcmp(rq->op, "ListObjectsV2") == 0);
}

static void request_free(struct request *rq)
{
    if (!rq)
        return;
    upload_abort(rq);
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
        is_container_path(srv, path) || is_imds_path(path))
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
            if (rq->up_tmp) {
                /* libmicrohttpd 0.9.75 refuses a response while the body is
                 * still arriving: remember the failure, drain the body, and
                 * answer once it is complete. */
                if (!rq->up_failed &&
                    (rq->up_chunked ? mock_chunked_feed(rq->up_chunked, upload_data,
                                                        *upload_data_size)
                                    : put_consume(rq, upload_data, *upload_data_size)) != 0)
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
    return op_put_object_finish(rq, conn, rq->up_failed);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    struct request *rq = *req_cls;
    if (rq && rq->body_tracked && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        body_ended_early(rq, conn);
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
    if (!cfg->tls_cert_file || !cfg->tls_key_file) {
        snprintf(err, err_len, "--tls-cert and --tls-key go together");
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, err_len,
                 "--tls-cert: this libmicrohttpd (%s) was built without TLS support "
                 "(MHD_FEATURE_TLS); install one built with GnuTLS",
                 MHD_get_version());
        return SF_ERR_UNSUPPORTED;
    }
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
