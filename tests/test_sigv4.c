/* SigV4 signing (s3/sigv4.c): AWS's own test suite, dates and hashes.
 * Suite `sigv4`, one executable: this file, test_sigv4_sign.c (the S3
 * documentation's vectors, signing and verifying requests) and
 * test_sigv4_rules.c (Authorization parsing, the key cache, canonical
 * request rules), over sigv4_fixture.c. */
#include "sigv4_fixture.h"

#include <criterion/criterion.h>

#include "common/dirnames.h"
#include "s3/sigv4.h"

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef SF_TEST_DATA
#error "SF_TEST_DATA must name the tests/data folder"
#endif

#define SUITE_DIR SF_TEST_DATA "/sigv4-test-suite/v4"

/* The AWS suite holds 38 cases: 32 apply to S3 as they are, and 6 normalize
 * dot-segments or "//" in the path, which S3 never does. */
#define SUITE_CASES_TOTAL          38
#define SUITE_CASES_AS_IS          32
#define SUITE_CASES_NOT_NORMALIZED 6

/* ----------------------------------------------------------------- helpers */

static char *read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    for (;;) {
        if (cap - len < 1024) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    if (len_out)
        *len_out = len;
    return buf;
}

static char *read_case_file(const char *dir, const char *name)
{
    char path[1024];
    int n = snprintf(path, sizeof path, "%s/%s/%s", SUITE_DIR, dir, name);
    cr_assert(n > 0 && (size_t)n < sizeof path);
    char *s = read_file(path, NULL);
    cr_assert_not_null(s, "cannot read %s", path);
    /* The expected-output files have no trailing newline; be tolerant. */
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r'))
        s[--len] = '\0';
    return s;
}

/* ------------------------------------------------- raw HTTP request parser */

#define MAX_HEADERS 32

/* sig is the request as the signer takes it (its headers are headers[],
 * its payload_hash NULL): the tests set the hash and pass it on. */
struct raw_request {
    char *buf; /* owns every string below */
    struct sf__sigv4_request sig;
    struct sf__header headers[MAX_HEADERS];
    const char *body;
    size_t body_len;
};

static void add_header(struct raw_request *r, const char *name, const char *value)
{
    cr_assert_lt(r->sig.n_headers, MAX_HEADERS);
    r->headers[r->sig.n_headers].name = name;
    r->headers[r->sig.n_headers].value = value;
    r->sig.n_headers++;
}

/* Parses the suite's request.txt format in place: a request line whose
 * target may hold spaces, header lines (continuation lines that start with
 * whitespace stay part of the value, line breaks included, for the signer to
 * fold), a blank line, the body. */
static void parse_raw_request(const char *text, size_t len, struct raw_request *r)
{
    memset(r, 0, sizeof *r);
    r->sig.headers = r->headers;
    r->buf = malloc(len + 1);
    cr_assert_not_null(r->buf);
    memcpy(r->buf, text, len);
    r->buf[len] = '\0';
    char *p = r->buf, *end = r->buf + len;

    char *eol = memchr(p, '\n', (size_t)(end - p));
    char *line_end = eol ? eol : end;
    *line_end = '\0';
    if (line_end > p && line_end[-1] == '\r')
        line_end[-1] = '\0';
    char *sp1 = strchr(p, ' ');
    char *sp2 = strrchr(p, ' ');
    cr_assert(sp1 && sp2 && sp1 < sp2, "bad request line: %s", p);
    *sp1 = '\0';
    *sp2 = '\0';
    r->sig.method = p;
    r->sig.path = sp1 + 1;
    char *q = strchr(sp1 + 1, '?');
    if (q) {
        *q = '\0';
        r->sig.query = q + 1;
    }
    p = eol ? eol + 1 : end;

    while (p < end) {
        eol = memchr(p, '\n', (size_t)(end - p));
        line_end = eol ? eol : end;
        if (line_end == p || (line_end == p + 1 && *p == '\r')) {
            if (eol) {
                r->body = eol + 1;
                r->body_len = (size_t)(end - (eol + 1));
            }
            break;
        }
        while (eol && eol + 1 < end && (eol[1] == ' ' || eol[1] == '\t')) {
            eol = memchr(eol + 1, '\n', (size_t)(end - (eol + 1)));
            line_end = eol ? eol : end;
        }
        *line_end = '\0';
        if (line_end > p && line_end[-1] == '\r')
            line_end[-1] = '\0';
        char *colon = strchr(p, ':');
        cr_assert_not_null(colon, "header line without ':': %s", p);
        *colon = '\0';
        add_header(r, p, colon + 1);
        p = eol ? eol + 1 : end;
    }
    if (!r->body)
        r->body = "";
}

static const char *find_header(const struct raw_request *r, const char *name)
{
    for (size_t i = 0; i < r->sig.n_headers; i++) {
        if (strcasecmp(r->headers[i].name, name) == 0)
            return r->headers[i].value;
    }
    return NULL;
}

/* ----------------------------------------------------------- suite context */

struct suite_context {
    cJSON *root;
    const char *access_key_id, *secret, *token, *region, *service;
    char amz_date[SF__AMZ_DATE_LEN + 1];
    int sign_body, omit_session_token, normalize;
};

static const char *json_str(const cJSON *obj, const char *key, int required)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item && !required)
        return NULL;
    cr_assert(cJSON_IsString(item), "context.json: \"%s\" is not a string", key);
    return item->valuestring;
}

static int json_bool(const cJSON *obj, const char *key)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return item && cJSON_IsTrue(item);
}

static void load_context(const char *dir, struct suite_context *c)
{
    memset(c, 0, sizeof *c);
    char *text = read_case_file(dir, "context.json");
    c->root = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(c->root, "%s: context.json does not parse", dir);
    const cJSON *cred = cJSON_GetObjectItemCaseSensitive(c->root, "credentials");
    cr_assert(cJSON_IsObject(cred), "%s: no credentials", dir);
    c->access_key_id = json_str(cred, "access_key_id", 1);
    c->secret = json_str(cred, "secret_access_key", 1);
    c->token = json_str(cred, "token", 0);
    c->region = json_str(c->root, "region", 1);
    c->service = json_str(c->root, "service", 1);
    c->sign_body = json_bool(c->root, "sign_body");
    c->omit_session_token = json_bool(c->root, "omit_session_token");
    c->normalize = json_bool(c->root, "normalize");

    /* "2015-08-30T12:36:00Z" -> "20150830T123600Z" */
    const char *ts = json_str(c->root, "timestamp", 1);
    size_t k = 0;
    for (const char *p = ts; *p; p++) {
        if (*p == '-' || *p == ':')
            continue;
        cr_assert_lt(k, (size_t)SF__AMZ_DATE_LEN, "%s: timestamp %s", dir, ts);
        c->amz_date[k++] = *p;
    }
    c->amz_date[k] = '\0';
    time_t t;
    cr_assert_eq(sf__sigv4_parse_date(c->amz_date, &t), SF_OK, "%s: timestamp %s", dir, ts);
}

/* Whether S3 and the generic suite canonicalize path differently: the generic
 * one removes "." and ".." segments and collapses "//". */
static int path_needs_normalization(const char *path)
{
    if (strstr(path, "//"))
        return 1;
    const char *seg = path;
    while (seg) {
        if (*seg == '/')
            seg++;
        const char *next = strchr(seg, '/');
        size_t n = next ? (size_t)(next - seg) : strlen(seg);
        if ((n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            return 1;
        seg = next;
    }
    return 0;
}

struct signed_case {
    struct suite_context ctx;
    struct raw_request req;
    char payload_hash[SF__SHA256_HEX_LEN + 1];
    struct sf__sigv4_result res;
};

/* Signs one case the way the suite describes it. */
static void sign_case(const char *dir, struct signed_case *sc)
{
    load_context(dir, &sc->ctx);
    size_t len = 0;
    char path[1024];
    int n = snprintf(path, sizeof path, "%s/%s/request.txt", SUITE_DIR, dir);
    cr_assert(n > 0 && (size_t)n < sizeof path);
    char *text = read_file(path, &len);
    cr_assert_not_null(text, "cannot read %s", path);
    parse_raw_request(text, len, &sc->req);
    free(text);

    sf__sha256_hex(sc->req.body, sc->req.body_len, sc->payload_hash);
    if (sc->req.body_len == 0)
        cr_assert_str_eq(sc->payload_hash, SF__EMPTY_SHA256);

    add_header(&sc->req, "X-Amz-Date", sc->ctx.amz_date);
    if (sc->ctx.token && !sc->ctx.omit_session_token)
        add_header(&sc->req, "X-Amz-Security-Token", sc->ctx.token);
    if (sc->ctx.sign_body)
        add_header(&sc->req, "x-amz-content-sha256", sc->payload_hash);

    struct sf__sigv4_signer s;
    /* post-sts-header-after signs without the token even though one exists. */
    sf__sigv4_signer_init(&s, sc->ctx.access_key_id, sc->ctx.secret,
                          sc->ctx.omit_session_token ? NULL : sc->ctx.token, sc->ctx.region,
                          sc->ctx.service);
    struct sf__sigv4_request req = sc->req.sig;
    req.payload_hash = sc->payload_hash;
    sf_status st = sf__sigv4_sign(&s, &req, sc->ctx.amz_date, &sc->res);
    sf__sigv4_signer_destroy(&s);
    cr_assert_eq(st, SF_OK, "%s: sign returned %d", dir, (int)st);
}

static void signed_case_free(struct signed_case *sc)
{
    sf__sigv4_result_free(&sc->res);
    free(sc->req.buf);
    cJSON_Delete(sc->ctx.root);
}

/* Parses header-signed-request.txt and checks the server side accepts it. */
static void verify_case(const char *dir, const struct signed_case *sc)
{
    size_t len = 0;
    char path[1024];
    int n = snprintf(path, sizeof path, "%s/%s/header-signed-request.txt", SUITE_DIR, dir);
    cr_assert(n > 0 && (size_t)n < sizeof path);
    char *text = read_file(path, &len);
    cr_assert_not_null(text);
    struct raw_request wire;
    parse_raw_request(text, len, &wire);
    free(text);

    const char *authz = find_header(&wire, "Authorization");
    const char *amz_date = find_header(&wire, "X-Amz-Date");
    cr_assert_not_null(authz, "%s: no Authorization", dir);
    cr_assert_not_null(amz_date, "%s: no X-Amz-Date", dir);
    struct sf__sigv4_auth auth;
    cr_assert_eq(sf__sigv4_parse_authorization(authz, &auth), SF_OK, "%s: %s", dir, authz);

    char payload_hash[SF__SHA256_HEX_LEN + 1];
    sf__sha256_hex(wire.body, wire.body_len, payload_hash);
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, sc->ctx.access_key_id, sc->ctx.secret, NULL, sc->ctx.region,
                          sc->ctx.service);
    struct sf__sigv4_request req = wire.sig; /* Authorization too: it is not signed */
    req.payload_hash = payload_hash;
    struct sf__sigv4_result res;
    sf_status st = sf__sigv4_verify(&s, &auth, &req, amz_date, &res);
    cr_expect_eq(st, SF_OK, "%s: verify returned %d", dir, (int)st);
    if (res.canonical_request)
        cr_expect_str_eq(res.canonical_request, sc->res.canonical_request, "%s: verify creq", dir);
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
    free(wire.buf);
}

/* sf__dirnames filter: the suite's case folders (those with a request.txt). */
static int is_case(const char *suite, const char *name, void *user)
{
    (void)user;
    if (name[0] == '.')
        return 0;
    char probe[1024];
    int n = snprintf(probe, sizeof probe, "%s/%s/request.txt", suite, name);
    cr_assert(n > 0 && (size_t)n < sizeof probe);
    FILE *f = fopen(probe, "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

Test(sigv4, aws_test_suite)
{
    char **names;
    size_t n_names;
    cr_assert_eq(sf__dirnames(SUITE_DIR, is_case, NULL, &names, &n_names), 0,
                 "test data folder %s is missing", SUITE_DIR);

    size_t as_is = 0, not_normalized = 0;
    for (size_t i = 0; i < n_names; i++) {
        const char *dir = names[i];
        struct signed_case sc;
        memset(&sc, 0, sizeof sc);
        sign_case(dir, &sc);
        char *want_creq = read_case_file(dir, "header-canonical-request.txt");

        if (sc.ctx.normalize && path_needs_normalization(sc.req.sig.path)) {
            /* The generic suite normalizes this path; S3 must not. */
            char *line = canonical_path_line(sc.res.canonical_request);
            cr_expect_str_eq(line, sc.req.sig.path, "%s: S3 keeps the path as sent", dir);
            cr_expect_str_neq(sc.res.canonical_request, want_creq,
                              "%s: matched the normalized form", dir);
            free(line);
            /* The "-unnormalized" sibling expects exactly what S3 signs. */
            size_t dlen = strlen(dir);
            const char *suffix = "-normalized";
            size_t slen = strlen(suffix);
            if (dlen > slen && strcmp(dir + dlen - slen, suffix) == 0) {
                char sibling[512];
                int n =
                    snprintf(sibling, sizeof sibling, "%.*s-unnormalized", (int)(dlen - slen), dir);
                cr_assert(n > 0 && (size_t)n < sizeof sibling);
                char *sib_creq = read_case_file(sibling, "header-canonical-request.txt");
                cr_expect_str_eq(sc.res.canonical_request, sib_creq, "%s vs %s", dir, sibling);
                free(sib_creq);
            }
            not_normalized++;
        } else {
            char *want_sts = read_case_file(dir, "header-string-to-sign.txt");
            char *want_sig = read_case_file(dir, "header-signature.txt");
            char *signed_req = read_case_file(dir, "header-signed-request.txt");
            const char *authz = strstr(signed_req, "\nAuthorization:");
            cr_assert_not_null(authz, "%s: no Authorization line", dir);
            authz += strlen("\nAuthorization:");
            const char *authz_end = strchr(authz, '\n');
            size_t authz_len = authz_end ? (size_t)(authz_end - authz) : strlen(authz);

            cr_expect_str_eq(sc.res.canonical_request, want_creq, "%s: canonical request", dir);
            cr_expect_str_eq(sc.res.string_to_sign, want_sts, "%s: string to sign", dir);
            cr_expect_str_eq(sc.res.signature, want_sig, "%s: signature", dir);
            cr_expect(strlen(sc.res.authorization) == authz_len &&
                          memcmp(sc.res.authorization, authz, authz_len) == 0,
                      "%s: Authorization\n got: %s\nwant: %.*s", dir, sc.res.authorization,
                      (int)authz_len, authz);
            verify_case(dir, &sc);
            free(want_sts);
            free(want_sig);
            free(signed_req);
            as_is++;
        }
        free(want_creq);
        signed_case_free(&sc);
    }
    sf__strv_free(names, n_names);
    cr_expect_eq(n_names, SUITE_CASES_TOTAL, "cases found on disk");
    cr_expect_eq(as_is, SUITE_CASES_AS_IS, "cases checked against the suite's output");
    cr_expect_eq(not_normalized, SUITE_CASES_NOT_NORMALIZED, "cases checked as not normalized");
}

/* ------------------------------------------------------------ dates, hashes */

Test(sigv4, date_format_and_parse_round_trip)
{
    char buf[SF__AMZ_DATE_LEN + 1];
    sf__sigv4_format_date(0, buf);
    cr_expect_str_eq(buf, "19700101T000000Z");
    sf__sigv4_format_date(1440938160, buf);
    cr_expect_str_eq(buf, "20150830T123600Z");
    sf__sigv4_format_date(951825599, buf); /* 2000-02-29T11:59:59Z */
    cr_expect_str_eq(buf, "20000229T115959Z");

    const time_t samples[] = {
        0,          1,          59,         86399,      86400,     951825599,
        1440938160, 1440979199, 1440979200, 2147483647, 4102444800 /* 2100-01-01 */};
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        time_t back = -1;
        sf__sigv4_format_date(samples[i], buf);
        cr_expect_eq(sf__sigv4_parse_date(buf, &back), SF_OK, "%s", buf);
        cr_expect_eq(back, samples[i], "%s", buf);
    }
    time_t t;
    cr_expect_eq(sf__sigv4_parse_date("20150830T123600Z", &t), SF_OK);
    cr_expect_eq(t, 1440938160);
}

Test(sigv4, date_parse_rejects_malformed)
{
    const char *bad[] = {
        "",
        "20150830T123600",
        "20150830T123600Z0",
        "20150830 123600Z",
        "20150830T123600z",
        "2015083OT123600Z",
        "20151330T000000Z",
        "20150001T000000Z",
        "20150800T000000Z",
        "20150230T000000Z",
        "20150229T000000Z", /* 2015 is not a leap year */
        "20150431T000000Z",
        "20150830T240000Z",
        "20150830T126000Z",
        "20150830T123660Z",
        "-0150830T123600Z",
        "2015-08-30T12:36:00Z",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        time_t t = 12345;
        cr_expect_eq(sf__sigv4_parse_date(bad[i], &t), SF_ERR_PARSE, "accepted \"%s\"", bad[i]);
        cr_expect_eq(t, 12345, "output untouched on failure");
    }
    time_t t;
    cr_expect_eq(sf__sigv4_parse_date(NULL, &t), SF_ERR_PARSE);
    cr_expect_eq(sf__sigv4_parse_date("20150830T123600Z", NULL), SF_ERR_INVALID_ARGUMENT);
}

Test(sigv4, sha256_and_hex)
{
    char out[SF__SHA256_HEX_LEN + 1];
    sf__sha256_hex("", 0, out);
    cr_expect_str_eq(out, SF__EMPTY_SHA256);
    sf__sha256_hex(NULL, 0, out);
    cr_expect_str_eq(out, SF__EMPTY_SHA256);
    sf__sha256_hex("abc", 3, out);
    cr_expect_str_eq(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const unsigned char bytes[] = {0x00, 0x0f, 0xa5, 0xff};
    char hex[9];
    sf__hex_encode(bytes, 4, hex);
    cr_expect_str_eq(hex, "000fa5ff");
}
