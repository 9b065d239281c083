/* What the files of the mock server share: its state, a request's state,
 * the S3 error being answered, and the functions one file calls in another.
 * The API that main.c and the tests use is mock_s3.h. */

#ifndef SF_MOCK_INTERNAL_H
#define SF_MOCK_INTERNAL_H

#include "mock_server/mock_s3.h"

#include "mock_server/checksum.h"
#include "mock_server/chunked.h"
#include "mock_server/faults.h"
#include "mock_server/objects.h"
#include "common/strbuf.h"
#include "s3/sigv4.h"

#include <microhttpd.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define S3_XMLNS       "http://s3.amazonaws.com/doc/2006-03-01/"
#define XML_DECL       "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define MAX_PARAMS     64
#define MAX_SMALL_BODY (4 << 20) /* admin rules, CompleteMultipartUpload's part list */
#define FAULT_HEADER   "x-sfmock-fault"

/* Credential endpoints (mock_creds.c): the token bounds size struct mock_server */
#define IMDS_TOKEN_PATH   "/latest/api/token"
#define MAX_IMDS_TOKENS   256
#define MAX_ISSUED_TOKENS 1024
#define TOKEN_MAX_LEN     96

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
    /* A fault planned for an object PUT: answered once its body is drained */
    int fault_pending;
    struct mock_fault_plan fault_plan;
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
    /* the bucket's region, for an answer that says where the bucket is (a
     * request signed for another region): sent as S3 does, <Region> in the
     * body and x-amz-bucket-region, the only clue a HEAD answer carries.
     * NULL = none; points at the server's configuration. */
    const char *bucket_region;
};

/* mock_s3.c */
int mock_sleep_ms_interruptible(struct mock_server *srv, int ms);
const char *mock_param_get(const struct request *rq, const char *name);
int mock_param_has(const struct request *rq, const char *name);
const char *mock_header(struct MHD_Connection *conn, const char *name);
char *mock_decode_dup(const char *s, size_t n, size_t *len_out);
enum MHD_Result mock_queue(struct request *rq, struct MHD_Connection *conn, int status,
                           struct MHD_Response *resp, uint64_t body_bytes, const char *fault);
enum MHD_Result mock_respond_buffer(struct request *rq, struct MHD_Connection *conn, int status,
                                    const char *content_type, struct sf__strbuf *b,
                                    const char *fault);
enum MHD_Result mock_respond_empty(struct request *rq, struct MHD_Connection *conn, int status);
enum MHD_Result mock_respond_json(struct request *rq, struct MHD_Connection *conn, int status,
                                  const char *json);
enum MHD_Result mock_respond_text(struct request *rq, struct MHD_Connection *conn, int status,
                                  const char *text);
enum MHD_Result mock_respond_405(struct request *rq, struct MHD_Connection *conn,
                                 const char *allow);

/* mock_xml.c */
void mock_xml_escape(struct sf__strbuf *b, const char *s, size_t n);
void mock_xml_elem(struct sf__strbuf *b, const char *tag, const char *value, int url_encode);
/* The request's encoding-type: 1 for "url" (keys go out url-encoded), 0 when
 * absent, -1 with e set (400 InvalidArgument) for any other value. */
int mock_param_url_encoding(const struct request *rq, struct s3_error *e);
void mock_set_error(struct s3_error *e, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
enum MHD_Result mock_respond_error(struct request *rq, struct MHD_Connection *conn,
                                   struct s3_error *e, const char *fault);
enum MHD_Result mock_respond_fault_status(struct request *rq, struct MHD_Connection *conn,
                                          const struct mock_fault_plan *plan);

/* mock_auth.c */
int mock_authenticate(struct request *rq, struct MHD_Connection *conn, struct s3_error *e);

/* mock_creds.c */
int mock_check_session_token(struct mock_server *srv, const char *tok, struct s3_error *e);
enum MHD_Result mock_imds_token(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_imds_metadata(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_container_credentials(struct request *rq, struct MHD_Connection *conn);
int mock_is_container_path(const struct mock_server *srv, const char *path);
int mock_is_imds_path(const char *path);

/* mock_buckets.c */
enum MHD_Result mock_op_list_buckets(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_create_bucket(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_delete_bucket(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_head_bucket(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_bucket_location(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_list_objects(struct request *rq, struct MHD_Connection *conn, int v2);

/* mock_object_ops.c */
void mock_body_ended_early(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_get_object(struct request *rq, struct MHD_Connection *conn, int head);
enum MHD_Result mock_op_delete_object(struct request *rq, struct MHD_Connection *conn);
int mock_make_parents(struct mock_server *srv, const char *bucket, const char *key);
void mock_upload_abort(struct request *rq);
void mock_format_etag(const unsigned char md5[16], char out[MOCK_ETAG_LEN + 1]);
enum MHD_Result mock_respond_stored(struct request *rq, struct MHD_Connection *conn,
                                    const char *etag);
enum MHD_Result mock_op_put_object_begin(struct request *rq, struct MHD_Connection *conn);
int mock_put_consume(struct request *rq, const char *data, size_t n);
enum MHD_Result mock_op_put_object_finish(struct request *rq, struct MHD_Connection *conn,
                                          int failed);

/* mock_upload_body.c */
int mock_parse_decimal_u64(const char *s, uint64_t *out);
int mock_body_checksums_begin(struct request *rq, struct MHD_Connection *conn, int chunked,
                              struct s3_error *e);
int mock_body_chunked_begin(struct request *rq, enum mock_chunked_mode mode, const char *payload,
                            struct s3_error *e);
int mock_body_chunked_end(struct request *rq, int failed, struct s3_error *e);
int mock_body_checksums_end(struct request *rq, struct s3_error *e);

/* mock_multipart.c */
enum MHD_Result mock_respond_no_such_upload(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_upload_part_finish(struct request *rq, struct MHD_Connection *conn,
                                        const unsigned char md5[16]);
enum MHD_Result mock_op_create_upload(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_complete_upload(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_abort_upload(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_list_parts(struct request *rq, struct MHD_Connection *conn);
enum MHD_Result mock_op_list_uploads(struct request *rq, struct MHD_Connection *conn);

/* mock_admin.c */
enum MHD_Result mock_admin(struct request *rq, struct MHD_Connection *conn);

#endif
