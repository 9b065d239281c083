/* The mock S3 server as a credential provider: IMDS tokens and roles,
 * container credentials, issued session tokens, counters. Suites
 * `mock_server` and `mock_server_cfg` (test_mock_server.c). */
#include "mock_server_fixture.h"
#include "s3/sigv4.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/test_cert.h"

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ credentials */

#define ROLES_PATH "/latest/meta-data/iam/security-credentials/"
#define TTL_HEADER "X-aws-ec2-metadata-token-ttl-seconds"

/* The body of a 200 application/json answer, parsed. */
static cJSON *get_json(const char *target, const char *const *headers)
{
    struct s3_resp r;
    cr_assert_eq(plain("GET", target, headers, &r), 200, "GET %s: %ld %s", target, r.status,
                 sf__strbuf_str(&r.body));
    char ct[64] = "";
    s3_resp_header(&r, "Content-Type", ct, sizeof(ct));
    cr_expect_str_eq(ct, "application/json");
    cJSON *j = cJSON_Parse(sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_assert(j, "the answer is not JSON");
    return j;
}

static const char *json_str(const cJSON *j, const char *name)
{
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, name));
    cr_assert(v, "no string field %s", name);
    return v;
}

/* "YYYY-MM-DDTHH:MM:SSZ" as a time_t; -1 when malformed. */
static time_t parse_aws_time(const char *s)
{
    struct tm tm = {0};
    char z = 0;
    if (strlen(s) != 20 ||
        sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &z) != 7 ||
        z != 'Z')
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return timegm(&tm);
}

/* PUT /latest/api/token with this TTL; the token into out. */
static void imds_token(const char *ttl, char *out, size_t out_len)
{
    char hdr[96];
    snprintf(hdr, sizeof(hdr), TTL_HEADER ": %s", ttl);
    const char *h[] = {hdr, NULL};
    struct s3_resp r;
    cr_assert_eq(plain("PUT", "/latest/api/token", h, &r), 200, "%s", sf__strbuf_str(&r.body));
    cr_assert(r.body.len > 16 && r.body.len < out_len, "token of %zu bytes", r.body.len);
    memcpy(out, r.body.data, r.body.len);
    out[r.body.len] = '\0';
    char echoed[32] = "";
    s3_resp_header(&r, TTL_HEADER, echoed, sizeof(echoed));
    cr_expect_str_eq(echoed, ttl);
    s3_resp_free(&r);
}

/* GET with X-aws-ec2-metadata-token (none when token is NULL). */
static long imds_get(const char *target, const char *token, struct s3_resp *r)
{
    char hdr[256];
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", token ? token : "");
    const char *h[] = {hdr, NULL};
    return plain("GET", target, token ? h : NULL, r);
}

/* The IMDS credential document of role, through a fresh token. */
static cJSON *imds_credentials(const char *role)
{
    char tok[128], hdr[256], target[256];
    imds_token("60", tok, sizeof(tok));
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", tok);
    snprintf(target, sizeof(target), ROLES_PATH "%s", role);
    const char *h[] = {hdr, NULL};
    return get_json(target, h);
}

/* A signed GET with the key pair and token of a credential document. */
static long get_with(const cJSON *doc, const char *target, struct s3_resp *r)
{
    struct s3_creds c = {json_str(doc, "AccessKeyId"), json_str(doc, "SecretAccessKey"),
                         json_str(doc, "Token"), NULL};
    struct s3_call sc = {.method = "GET", .target = target, .creds = &c};
    s3_call(srv.url, &sc, r);
    return r->status;
}

/* A signed GET with the test key pair and this session token. */
static long get_with_token(const char *token, const char *target, struct s3_resp *r)
{
    struct s3_creds c = {"test-ak", "test-secret", token, NULL};
    struct s3_call sc = {.method = "GET", .target = target, .creds = &c};
    s3_call(srv.url, &sc, r);
    return r->status;
}

static double cred_stat(cJSON *st, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItem(st, "credentials"), name);
    cr_assert(cJSON_IsNumber(v), "no credentials.%s in the stats", name);
    return v->valuedouble;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

Test(mock_server, imds_token_role_and_credentials_flow)
{
    char tok[128];
    imds_token("21600", tok, sizeof(tok));
    struct s3_resp r;
    cr_assert_eq(imds_get(ROLES_PATH, tok, &r), 200);
    cr_expect_str_eq(sf__strbuf_str(&r.body), "mock-role\n");
    char ct[64] = "";
    s3_resp_header(&r, "Content-Type", ct, sizeof(ct));
    cr_expect_str_eq(ct, "text/plain");
    s3_resp_free(&r);

    char hdr[256];
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", tok);
    const char *h[] = {hdr, NULL};
    time_t before = time(NULL);
    cJSON *doc = get_json(ROLES_PATH "mock-role", h);
    time_t after = time(NULL);
    cr_expect_str_eq(json_str(doc, "Code"), "Success");
    cr_expect_str_eq(json_str(doc, "Type"), "AWS-HMAC");
    cr_expect_str_eq(json_str(doc, "AccessKeyId"), "test-ak");
    cr_expect_str_eq(json_str(doc, "SecretAccessKey"), "test-secret");
    cr_expect(strncmp(json_str(doc, "Token"), "mock-issued-", 12) == 0, "%s",
              json_str(doc, "Token"));
    time_t exp = parse_aws_time(json_str(doc, "Expiration"));
    cr_expect(exp >= before + 3600 && exp <= after + 3600, "Expiration %s, now %lld",
              json_str(doc, "Expiration"), (long long)before);
    time_t updated = parse_aws_time(json_str(doc, "LastUpdated"));
    cr_expect(updated >= before && updated <= after, "LastUpdated %s",
              json_str(doc, "LastUpdated"));
    /* The same IMDS token serves again, and each document has a new token. */
    cJSON *again = get_json(ROLES_PATH "mock-role", h);
    cr_expect_str_neq(json_str(doc, "Token"), json_str(again, "Token"));
    cJSON_Delete(again);
    cJSON_Delete(doc);
}

Test(mock_server, imds_refuses_bad_requests)
{
    struct s3_resp r;
    const char *bad_ttls[] = {TTL_HEADER ": 0",
                              TTL_HEADER ": 21601",
                              TTL_HEADER ": 12abc",
                              TTL_HEADER ": -5",
                              TTL_HEADER ": 99999999999999999999",
                              NULL};
    cr_expect_eq(plain("PUT", "/latest/api/token", NULL, &r), 400, "no TTL header");
    s3_resp_free(&r);
    for (size_t i = 0; bad_ttls[i]; i++) {
        const char *h[] = {bad_ttls[i], NULL};
        cr_expect_eq(plain("PUT", "/latest/api/token", h, &r), 400, "%s", bad_ttls[i]);
        s3_resp_free(&r);
    }
    const char *proxied[] = {TTL_HEADER ": 60", "X-Forwarded-For: 10.0.0.1", NULL};
    cr_expect_eq(plain("PUT", "/latest/api/token", proxied, &r), 403);
    s3_resp_free(&r);
    cr_expect_eq(plain("GET", "/latest/api/token", NULL, &r), 405);
    s3_resp_free(&r);

    char tok[128];
    imds_token("60", tok, sizeof(tok));
    cr_expect_eq(imds_get(ROLES_PATH, NULL, &r), 401, "no token");
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH, "not-a-token", &r), 401, "unknown token");
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "mock-role", NULL, &r), 401);
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "other-role", tok, &r), 404);
    s3_resp_free(&r);
    cr_expect_eq(imds_get("/latest/meta-data/ami-id", tok, &r), 404);
    s3_resp_free(&r);

    /* Refused requests are not counted: only the one token was issued. */
    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "imds_token"), 1);
    cr_expect_eq(cred_stat(st, "imds_role_list"), 0);
    cr_expect_eq(cred_stat(st, "imds_credentials"), 0);
    cJSON_Delete(st);
}

Test(mock_server_cfg, imds_token_expires_and_role_is_configurable)
{
    const char *args[] = {"--imds-role", "trainer", NULL};
    start_with(args);
    char tok[128];
    imds_token("1", tok, sizeof(tok));
    struct s3_resp r;
    cr_assert_eq(imds_get(ROLES_PATH, tok, &r), 200);
    cr_expect_str_eq(sf__strbuf_str(&r.body), "trainer\n");
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "mock-role", tok, &r), 404);
    s3_resp_free(&r);
    cr_expect_eq(imds_get(ROLES_PATH "trainer", tok, &r), 200);
    s3_resp_free(&r);
    sleep_ms(2100);
    cr_expect_eq(imds_get(ROLES_PATH, tok, &r), 401, "the token outlived its TTL");
    s3_resp_free(&r);
}

Test(mock_server_cfg, container_credentials_require_the_exact_authorization)
{
    const char *args[] = {"--container-auth-token",
                          "Bearer s3cr3t",
                          "--container-path",
                          "/v2/credentials/abc",
                          "--issue-ttl-s",
                          "120",
                          NULL};
    start_with(args);
    const char *paths[] = {"/_mock/container-credentials", "/v2/credentials/abc"};
    const char *wrong[] = {"Authorization: Bearer s3cr3t2", "Authorization: bearer s3cr3t",
                           "Authorization: s3cr3t"};
    struct s3_resp r;
    for (size_t i = 0; i < 2; i++) {
        cr_expect_eq(plain("GET", paths[i], NULL, &r), 401, "%s without Authorization", paths[i]);
        char ct[64] = "";
        s3_resp_header(&r, "Content-Type", ct, sizeof(ct));
        cr_expect_str_eq(ct, "text/plain");
        cJSON *not_json = cJSON_Parse(sf__strbuf_str(&r.body));
        cr_expect(!cJSON_IsObject(not_json), "a 401 carries no credentials");
        cJSON_Delete(not_json);
        s3_resp_free(&r);
        for (size_t j = 0; j < 3; j++) {
            const char *h[] = {wrong[j], NULL};
            cr_expect_eq(plain("GET", paths[i], h, &r), 401, "%s", wrong[j]);
            s3_resp_free(&r);
        }
        const char *right[] = {"Authorization: Bearer s3cr3t", NULL};
        time_t before = time(NULL);
        cJSON *doc = get_json(paths[i], right);
        cr_expect_str_eq(json_str(doc, "AccessKeyId"), "test-ak");
        cr_expect_str_eq(json_str(doc, "SecretAccessKey"), "test-secret");
        cr_expect(strncmp(json_str(doc, "Token"), "mock-issued-", 12) == 0);
        time_t exp = parse_aws_time(json_str(doc, "Expiration"));
        cr_expect(exp >= before + 120 && exp <= time(NULL) + 120, "Expiration %s",
                  json_str(doc, "Expiration"));
        cJSON_Delete(doc);
    }
    const char *right[] = {"Authorization: Bearer s3cr3t", NULL};
    cr_expect_eq(plain("POST", paths[0], right, &r), 405);
    s3_resp_free(&r);
    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "container"), 2);
    cJSON_Delete(st);
}

Test(mock_server, issued_tokens_authenticate_signed_requests)
{
    cr_assert(test_write_file(root, "bucket1/k", "value", 5) == 0);
    struct s3_resp r;
    /* No --container-auth-token: the endpoint needs no Authorization. */
    cJSON *ecs = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(ecs, "/bucket1/k", &r), 200, "%s", sf__strbuf_str(&r.body));
    cr_expect_eq(r.body.len, 5);
    s3_resp_free(&r);
    cJSON *ec2 = imds_credentials("mock-role");
    cr_expect_eq(get_with(ec2, "/bucket1/k", &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);

    get_with_token("mock-issued-999-00000000000000000000000000000000", "/bucket1/k", &r);
    expect_error(&r, 403, "InvalidToken");
    s3_resp_free(&r);
    /* An issued token does not replace the signature. */
    struct s3_creds bad = {"test-ak", "wrong-secret", json_str(ecs, "Token"), NULL};
    struct s3_call c = {.method = "GET", .target = "/bucket1/k", .creds = &bad};
    expect_sent_error(&c, 403, "SignatureDoesNotMatch");
    cJSON_Delete(ecs);
    cJSON_Delete(ec2);
}

Test(mock_server_cfg, expired_issued_token_answers_expired_token)
{
    const char *args[] = {"--issue-ttl-s", "1", NULL};
    start_with_k(args);
    struct s3_resp r;
    cJSON *doc = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(doc, "/bucket1/k", &r), 200, "fresh: %s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    sleep_ms(2100);
    get_with(doc, "/bucket1/k", &r);
    expect_error(&r, 400, "ExpiredToken");
    char msg[128] = "";
    s3_xml_value(&r, "Message", msg, sizeof(msg));
    cr_expect_str_eq(msg, "The provided token has expired.");
    s3_resp_free(&r);
    cJSON_Delete(doc);
    /* A new issuance works again. */
    doc = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(doc, "/bucket1/k", &r), 200);
    s3_resp_free(&r);
    cJSON_Delete(doc);

    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "expired_token_rejections"), 1);
    cr_expect_eq(cred_stat(st, "container"), 2);
    cr_expect_eq(key_status(st, "bucket1/k", "400"), 1);
    cr_expect_eq(key_status(st, "bucket1/k", "200"), 2);
    cJSON_Delete(st);
}

Test(mock_server_cfg, configured_session_token_and_issued_tokens_both_pass)
{
    const char *args[] = {"--session-token", "tok123", NULL};
    start_with_k(args);
    struct s3_resp r;
    cr_expect_eq(get_with_token("tok123", "/bucket1/k", &r), 200);
    s3_resp_free(&r);
    cJSON *doc = get_json("/_mock/container-credentials", NULL);
    cr_expect_eq(get_with(doc, "/bucket1/k", &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cJSON_Delete(doc);
    expect_call_error("GET", "/bucket1/k", NULL, 403, "InvalidToken");
    get_with_token("tok1234", "/bucket1/k", &r);
    expect_error(&r, 403, "InvalidToken");
    s3_resp_free(&r);
}

Test(mock_server, credential_counters_are_exact_and_reset)
{
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    char t1[128], t2[128];
    imds_token("60", t1, sizeof(t1));
    imds_token("120", t2, sizeof(t2));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(imds_get(ROLES_PATH, i % 2 ? t1 : t2, &r), 200);
        s3_resp_free(&r);
    }
    cJSON *ec2 = imds_credentials("mock-role"); /* a third token */
    cJSON *ecs = get_json("/_mock/container-credentials", NULL);
    cJSON_Delete(get_json("/_mock/container-credentials", NULL));
    /* refused: none of these count */
    cr_assert_eq(imds_get(ROLES_PATH, "bogus", &r), 401);
    s3_resp_free(&r);
    cr_assert_eq(plain("PUT", "/latest/api/token", NULL, &r), 400);
    s3_resp_free(&r);
    cr_assert_eq(plain("DELETE", "/_mock/container-credentials", NULL, &r), 405);
    s3_resp_free(&r);
    /* one S3 request: the only one in the S3 counters */
    cr_assert_eq(get_with(ecs, "/bucket1/k", &r), 200);
    s3_resp_free(&r);

    cJSON *st = stats();
    cr_expect_eq(cred_stat(st, "imds_token"), 3);
    cr_expect_eq(cred_stat(st, "imds_role_list"), 3);
    cr_expect_eq(cred_stat(st, "imds_credentials"), 1);
    cr_expect_eq(cred_stat(st, "container"), 2);
    cr_expect_eq(cred_stat(st, "expired_token_rejections"), 0);
    cr_expect_eq(cJSON_GetObjectItem(st, "requests")->valuedouble, 1);
    cJSON *ops = cJSON_GetObjectItem(st, "operations");
    cr_expect_eq(cJSON_GetArraySize(ops), 1, "S3 operations other than GetObject counted");
    cJSON *get = cJSON_GetObjectItem(ops, "GetObject");
    cr_expect(get && get->valuedouble == 1, "one GetObject");
    cJSON_Delete(st);

    cr_assert_eq(admin_post("/_mock/reset", NULL), 200);
    st = stats();
    const char *names[] = {"imds_token", "imds_role_list", "imds_credentials", "container",
                           "expired_token_rejections"};
    for (size_t i = 0; i < 5; i++)
        cr_expect_eq(cred_stat(st, names[i]), 0, "%s after reset", names[i]);
    cJSON_Delete(st);
    /* Reset clears counters, not the issued tokens. */
    cr_expect_eq(get_with(ec2, "/bucket1/k", &r), 200);
    s3_resp_free(&r);
    cJSON_Delete(ec2);
    cJSON_Delete(ecs);
}
