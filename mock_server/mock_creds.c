/* The credential endpoints: IMDSv2 (token, role, credentials) and
 * container credentials (ECS / EKS Pod Identity), and the session tokens
 * they hand out, which mock_check_session_token accepts on signed requests. */

#include "mock_server/mock_internal.h"

#include "mock_server/stats.h"
#include "s3/sigv4.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IMDS_META_PREFIX       "/latest/meta-data/"
#define IMDS_CREDS_PATH        "/latest/meta-data/iam/security-credentials/"
#define IMDS_TTL_HEADER        "X-aws-ec2-metadata-token-ttl-seconds"
#define IMDS_TOKEN_HEADER      "X-aws-ec2-metadata-token"
#define IMDS_MAX_TTL_S         21600
#define DEFAULT_CONTAINER_PATH "/_mock/container-credentials"

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
int mock_check_session_token(struct mock_server *srv, const char *tok, struct s3_error *e)
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
            mock_set_error(e, 400, "ExpiredToken", "The provided token has expired.");
            return -1;
        }
    }
    mock_set_error(e, 403, "InvalidToken", "The provided token is malformed or otherwise invalid.");
    return -1;
}

/* A credential document: the mock's key pair with a freshly issued token.
 * imds adds the fields of an IMDS answer, else RoleArn (ECS). */
static enum MHD_Result respond_credentials(struct request *rq, struct MHD_Connection *conn,
                                           int imds)
{
    struct mock_server *srv = rq->srv;
    char token[TOKEN_MAX_LEN], expiration[32], now[32];
    if (issue_session_token(srv, token, expiration) != 0)
        return mock_respond_text(rq, conn, 500, "cannot make a random token\n");
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
    enum MHD_Result r = mock_respond_json(rq, conn, 200, json);
    free(json);
    return r;
}

/* PUT /latest/api/token: an IMDSv2 session token for 1..21600 s. */
enum MHD_Result mock_imds_token(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    if (strcmp(rq->method, "PUT") != 0)
        return mock_respond_405(rq, conn, "PUT");
    /* Like EC2: a token request that went through a proxy is refused, so a
     * token never leaves the instance. */
    if (mock_header(conn, "X-Forwarded-For"))
        return mock_respond_text(rq, conn, 403, "Forbidden\n");
    const char *ttl_s = mock_header(conn, IMDS_TTL_HEADER);
    char *end = NULL;
    long ttl = -1;
    if (ttl_s && *ttl_s >= '0' && *ttl_s <= '9') {
        errno = 0;
        ttl = strtol(ttl_s, &end, 10);
        if (*end || errno)
            ttl = -1;
    }
    if (ttl < 1 || ttl > IMDS_MAX_TTL_S)
        return mock_respond_text(rq, conn, 400,
                                 "Bad Request: " IMDS_TTL_HEADER " must be an integer 1..21600\n");
    char token[TOKEN_MAX_LEN];
    if (random_hex(24, token) != 0)
        return mock_respond_text(rq, conn, 500, "cannot make a random token\n");
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
    return mock_queue(rq, conn, 200, resp, n, NULL);
}

/* GET /latest/meta-data/...: IMDSv2 only, so every answer needs a token. */
enum MHD_Result mock_imds_metadata(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    if (strcmp(rq->method, "GET") != 0)
        return mock_respond_405(rq, conn, "GET");
    const char *tok = mock_header(conn, IMDS_TOKEN_HEADER);
    if (!tok || ring_check(srv, &srv->imds_tokens, tok) != TOKEN_VALID)
        return mock_respond_text(rq, conn, 401, "Unauthorized\n");
    if (strcmp(rq->path, IMDS_CREDS_PATH) == 0) {
        char list[256];
        snprintf(list, sizeof(list), "%s\n", srv->cfg.imds_role);
        mock_stats_credential(srv->stats, "imds_role_list");
        return mock_respond_text(rq, conn, 200, list);
    }
    if (strncmp(rq->path, IMDS_CREDS_PATH, strlen(IMDS_CREDS_PATH)) == 0) {
        const char *raw = rq->path + strlen(IMDS_CREDS_PATH);
        char *role = mock_decode_dup(raw, strlen(raw), NULL);
        int known = role && strcmp(role, srv->cfg.imds_role) == 0;
        free(role);
        if (known)
            return respond_credentials(rq, conn, 1);
    }
    return mock_respond_text(rq, conn, 404, "Not Found\n");
}

/* GET on the container-credentials path (ECS / EKS Pod Identity style). */
enum MHD_Result mock_container_credentials(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    if (strcmp(rq->method, "GET") != 0)
        return mock_respond_405(rq, conn, "GET");
    const char *want = srv->cfg.container_auth_token;
    const char *got = mock_header(conn, "Authorization");
    if (want && (!got || strcmp(got, want) != 0))
        return mock_respond_text(rq, conn, 401,
                                 "Unauthorized: the Authorization header does not match "
                                 "--container-auth-token\n");
    return respond_credentials(rq, conn, 0);
}

int mock_is_container_path(const struct mock_server *srv, const char *path)
{
    return strcmp(path, DEFAULT_CONTAINER_PATH) == 0 ||
           (srv->cfg.container_path && strcmp(path, srv->cfg.container_path) == 0);
}

int mock_is_imds_path(const char *path)
{
    return strcmp(path, IMDS_TOKEN_PATH) == 0 ||
           strncmp(path, IMDS_META_PREFIX, strlen(IMDS_META_PREFIX)) == 0;
}
