/* SigV4's Authorization parsing, its daily key cache across threads, and
 * the canonical request rules of S3. Suite `sigv4` (test_sigv4.c). */
#include "sigv4_fixture.h"

#include <criterion/criterion.h>

#include "s3/sigv4.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* -------------------------------------------------- parse_authorization */

#define GOOD_AUTH                                                                                  \
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "            \
    "SignedHeaders=host;x-amz-date, "                                                              \
    "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"

static sf_status parse(const char *v)
{
    struct sf__sigv4_auth a;
    memset(&a, 0x55, sizeof a);
    sf_status st = sf__sigv4_parse_authorization(v, &a);
    if (st != SF_OK) {
        /* Nothing half-parsed is left behind. */
        static const struct sf__sigv4_auth zero;
        cr_expect(memcmp(&a, &zero, sizeof a) == 0, "auth cleared after failure: %s", v);
    }
    return st;
}

Test(sigv4, parse_authorization_good)
{
    struct sf__sigv4_auth a;
    cr_assert_eq(sf__sigv4_parse_authorization(GOOD_AUTH, &a), SF_OK);
    cr_expect_str_eq(a.access_key_id, "AKIDEXAMPLE");
    cr_expect_str_eq(a.date, "20150830");
    cr_expect_str_eq(a.region, "us-east-1");
    cr_expect_str_eq(a.service, "service");
    cr_expect_str_eq(a.signed_headers, "host;x-amz-date");
    cr_expect_str_eq(a.signature,
                     "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");

    /* Tolerated: no or several spaces/tabs after commas, leading space, other
     * component order, trailing space. */
    const char *ok[] = {
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request,"
        "SignedHeaders=host;x-amz-date,"
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "  AWS4-HMAC-SHA256   Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request ,"
        " \tSignedHeaders=host;x-amz-date ,   "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31  ",
        "AWS4-HMAC-SHA256 "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31, "
        "SignedHeaders=host;x-amz-date, "
        "Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct sf__sigv4_auth b;
        cr_expect_eq(sf__sigv4_parse_authorization(ok[i], &b), SF_OK, "%s", ok[i]);
        cr_expect_eq(memcmp(&a, &b, sizeof a), 0, "same fields: %s", ok[i]);
    }
}

Test(sigv4, parse_authorization_truncated)
{
    size_t n = strlen(GOOD_AUTH);
    char buf[sizeof GOOD_AUTH];
    for (size_t cut = 0; cut < n; cut++) {
        memcpy(buf, GOOD_AUTH, cut);
        buf[cut] = '\0';
        cr_expect_eq(parse(buf), SF_ERR_PARSE, "truncated at %zu: \"%s\"", cut, buf);
    }
    cr_expect_eq(parse(NULL), SF_ERR_PARSE);
    cr_expect_eq(sf__sigv4_parse_authorization(GOOD_AUTH, NULL), SF_ERR_INVALID_ARGUMENT);
}

Test(sigv4, parse_authorization_malformed)
{
    const char *bad[] = {
        "",
        "AWS4-HMAC-SHA256",
        "AWS4-HMAC-SHA256 ",
        "Bearer xyz",
        /* wrong algorithm, or glued to the first component */
        "AWS4-HMAC-SHA1 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        /* missing Signature / SignedHeaders / Credential */
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        /* duplicate, unknown and empty components, trailing comma */
        GOOD_AUTH ", Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        GOOD_AUTH ", Extra=1",
        GOOD_AUTH ",",
        GOOD_AUTH ", ,",
        "AWS4-HMAC-SHA256 , " GOOD_AUTH,
        /* space around '=' */
        "AWS4-HMAC-SHA256 Credential =AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        /* bad credential scopes */
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request/x, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws5_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/2015083/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/2015083x/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830//service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKID\x01XAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        /* bad signed-header lists */
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;;x-amz-date, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=Host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host x, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        /* bad signatures: short, long, upper-case, not hex */
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf3",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf311",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5FA00FA31553B73EBF1942676E86291E8372FF2A2260956D9B8AAE1D763FBF31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbg31",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host, Signature=",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(parse(bad[i]), SF_ERR_PARSE, "accepted: \"%s\"", bad[i]);
}

/* Builds an Authorization value with one field replaced by c repeated n times. */
static char *auth_with_field(int field, size_t n, char c)
{
    char *fill = malloc(n + 1);
    cr_assert_not_null(fill);
    memset(fill, c, n);
    fill[n] = '\0';
    const char *ak = field == 0 ? fill : "AKIDEXAMPLE";
    const char *region = field == 1 ? fill : "us-east-1";
    const char *service = field == 2 ? fill : "s3";
    const char *sh = field == 3 ? fill : "host";
    size_t cap = n + 512;
    char *out = malloc(cap);
    cr_assert_not_null(out);
    int k = snprintf(out, cap,
                     "AWS4-HMAC-SHA256 Credential=%s/20150830/%s/%s/aws4_request, "
                     "SignedHeaders=%s, "
                     "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
                     ak, region, service, sh);
    cr_assert(k > 0 && (size_t)k < cap);
    free(fill);
    return out;
}

Test(sigv4, parse_authorization_field_lengths)
{
    struct sf__sigv4_auth a;
    /* The largest that fits each fixed array, then one more. */
    const size_t fits[] = {sizeof a.access_key_id - 1, sizeof a.region - 1, sizeof a.service - 1,
                           sizeof a.signed_headers - 1};
    for (int field = 0; field < 4; field++) {
        char *v = auth_with_field(field, fits[field], 'a');
        cr_expect_eq(sf__sigv4_parse_authorization(v, &a), SF_OK, "field %d at %zu", field,
                     fits[field]);
        free(v);
        v = auth_with_field(field, fits[field] + 1, 'a');
        cr_expect_eq(parse(v), SF_ERR_PARSE, "field %d at %zu", field, fits[field] + 1);
        free(v);
        v = auth_with_field(field, 100000, 'a');
        cr_expect_eq(parse(v), SF_ERR_PARSE, "field %d very long", field);
        free(v);
    }
}

/* -------------------------------------------------------------- key cache */

static void sign_at(struct sf__sigv4_signer *s, const char *amz_date, const char *secret)
{
    const struct sf__header hdrs[] = {{"host", DOC_HOST}, {"x-amz-date", amz_date}};
    struct sf__sigv4_request req = {"GET", "/k", NULL, hdrs, 2, SF__EMPTY_SHA256};
    struct sf__sigv4_result res;
    cr_assert_eq(sf__sigv4_sign(s, &req, amz_date, &res), SF_OK);
    char date[9];
    memcpy(date, amz_date, 8);
    date[8] = '\0';
    char want[SF__SHA256_HEX_LEN + 1];
    expected_signature(secret, date, s->region, s->service, res.string_to_sign, want);
    cr_expect_str_eq(res.signature, want, "signature at %s", amz_date);
    /* The string to sign really is over this request at this time. */
    char creq_hash[SF__SHA256_HEX_LEN + 1];
    sf__sha256_hex(res.canonical_request, strlen(res.canonical_request), creq_hash);
    char sts[256];
    snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s/%s/%s/aws4_request\n%s", amz_date, date,
             s->region, s->service, creq_hash);
    cr_expect_str_eq(res.string_to_sign, sts);
    sf__sigv4_result_free(&res);
}

Test(sigv4, daily_key_cache)
{
    struct sf__sigv4_signer s;
    doc_signer(&s);
    cr_expect_str_eq(s.key_date, "");
    sign_at(&s, "20150830T123600Z", DOC_SECRET);
    cr_expect_str_eq(s.key_date, "20150830");
    unsigned char key1[32];
    memcpy(key1, s.key, 32);
    sign_at(&s, "20150830T235959Z", DOC_SECRET);
    cr_expect_str_eq(s.key_date, "20150830");
    cr_expect(memcmp(key1, s.key, 32) == 0, "same day, same key");
    sign_at(&s, "20150831T000000Z", DOC_SECRET);
    cr_expect_str_eq(s.key_date, "20150831");
    cr_expect(memcmp(key1, s.key, 32) != 0, "new day, new key");
    sign_at(&s, "20150830T000001Z", DOC_SECRET); /* back to a day no longer cached */
    cr_expect_str_eq(s.key_date, "20150830");
    cr_expect(memcmp(key1, s.key, 32) == 0);
    sf__sigv4_signer_destroy(&s);
}

struct thread_arg {
    struct sf__sigv4_signer *s;
    int fails;
};

static void *sign_thread(void *p)
{
    struct thread_arg *arg = p;
    static const char *const dates[] = {"20150830T123600Z", "20150831T000000Z", "20160229T120000Z"};
    char want[3][SF__SHA256_HEX_LEN + 1];
    for (int i = 0; i < 3; i++) {
        /* Reference signatures from a signer nobody else touches. */
        struct sf__sigv4_signer own;
        sf__sigv4_signer_init(&own, DOC_AK, DOC_SECRET, NULL, "us-east-1", "s3");
        const struct sf__header hdrs[] = {{"host", DOC_HOST}, {"x-amz-date", dates[i]}};
        struct sf__sigv4_request req = {"GET", "/k", NULL, hdrs, 2, SF__EMPTY_SHA256};
        struct sf__sigv4_result res;
        if (sf__sigv4_sign(&own, &req, dates[i], &res) != SF_OK) {
            arg->fails++;
            want[i][0] = '\0';
        } else {
            memcpy(want[i], res.signature, sizeof want[i]);
        }
        sf__sigv4_result_free(&res);
        sf__sigv4_signer_destroy(&own);
    }
    for (int k = 0; k < 300; k++) {
        int i = k % 3;
        const struct sf__header hdrs[] = {{"host", DOC_HOST}, {"x-amz-date", dates[i]}};
        struct sf__sigv4_request req = {"GET", "/k", NULL, hdrs, 2, SF__EMPTY_SHA256};
        struct sf__sigv4_result res;
        if (sf__sigv4_sign(arg->s, &req, dates[i], &res) != SF_OK ||
            strcmp(res.signature, want[i]) != 0)
            arg->fails++;
        sf__sigv4_result_free(&res);
    }
    return NULL;
}

Test(sigv4, shared_signer_across_threads)
{
    struct sf__sigv4_signer s;
    doc_signer(&s);
    pthread_t th[4];
    struct thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){&s, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, sign_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_expect_eq(args[i].fails, 0, "thread %d", i);
    }
    sf__sigv4_signer_destroy(&s);
}

/* ------------------------------------------------ canonical request rules */

/* Signs method/path/query with host and x-amz-date only; returns the
 * canonical request (caller frees). */
static char *canonical(const char *path, const char *query, const struct sf__header *more,
                       size_t n_more)
{
    struct sf__header hdrs[8] = {{"host", "h"}, {"x-amz-date", "20150830T123600Z"}};
    cr_assert_leq(n_more, 6);
    if (n_more)
        memcpy(hdrs + 2, more, n_more * sizeof *more);
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, "AK", "SECRET", NULL, "us-east-1", "s3");
    struct sf__sigv4_request req = {"GET", path, query, hdrs, 2 + n_more, SF__EMPTY_SHA256};
    struct sf__sigv4_result res;
    cr_assert_eq(sf__sigv4_sign(&s, &req, "20150830T123600Z", &res), SF_OK);
    char *creq = res.canonical_request;
    res.canonical_request = NULL;
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
    return creq;
}

static void expect_path(const char *path, const char *want)
{
    char *creq = canonical(path, NULL, NULL, 0);
    char *line = canonical_path_line(creq);
    cr_expect_str_eq(line, want, "path \"%s\"", path);
    free(line);
    free(creq);
}

static void expect_query(const char *query, const char *want)
{
    char *creq = canonical("/", query, NULL, 0);
    const char *line = strchr(strchr(creq, '\n') + 1, '\n') + 1;
    size_t n = strcspn(line, "\n");
    cr_expect(n == strlen(want) && memcmp(line, want, n) == 0, "query \"%s\": got \"%.*s\"",
              query ? query : "(null)", (int)n, line);
    free(creq);
}

Test(sigv4, canonical_path_s3_rules)
{
    expect_path("", "/");
    expect_path(NULL, "/");
    expect_path("/", "/");
    expect_path("/bucket/my key", "/bucket/my%20key");
    expect_path("/bucket/my%20key", "/bucket/my%20key"); /* encoded once, not twice */
    expect_path("/bucket/a+b", "/bucket/a%2Bb");
    expect_path("/bucket/a%2bb", "/bucket/a%2Bb");
    expect_path("/bucket/%7Etilde~", "/bucket/~tilde~");
    expect_path("/bucket/100%", "/bucket/100%25");
    expect_path("/b/./c/../d//e", "/b/./c/../d//e");
    expect_path("/b/\xe1\x88\xb4", "/b/%E1%88%B4");
}

Test(sigv4, canonical_query_rules)
{
    expect_query(NULL, "");
    expect_query("", "");
    expect_query("b=2&a=1&a=0&c", "a=0&a=1&b=2&c=");
    expect_query("x=a+b", "x=a%2Bb");
    expect_query("prefix=my%20dir/&list-type=2", "list-type=2&prefix=my%20dir%2F");
    expect_query("k=%7e&k2=%zz", "k=~&k2=%25zz");
    expect_query("a&&b", "a=&b=");
    expect_query("uploads", "uploads=");
    expect_query("A=1&a=1&B=1", "A=1&B=1&a=1");
    /* Sorted on the encoded key: "%20" (0x25) before "-" (0x2D). */
    expect_query("-=1&%20=2", "%20=2&-=1");
}

Test(sigv4, canonical_header_rules)
{
    const struct sf__header more[] = {
        {"X-Amz-Meta-A", "  lead and   trail\t "},
        {"x-amz-meta-b", "line1\r\n\tline2\n  line3"},
        {"X-AMZ-META-A", "second"},
        {"x-amz-meta-empty", "   "},
    };
    char *creq = canonical("/", NULL, more, 4);
    cr_expect_str_eq(
        creq, "GET\n/\n\n"
              "host:h\n"
              "x-amz-date:20150830T123600Z\n"
              "x-amz-meta-a:lead and trail,second\n"
              "x-amz-meta-b:line1 line2 line3\n"
              "x-amz-meta-empty:\n"
              "\n"
              "host;x-amz-date;x-amz-meta-a;x-amz-meta-b;x-amz-meta-empty\n" SF__EMPTY_SHA256);
    free(creq);
}

Test(sigv4, sign_argument_checks)
{
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, "AK", "SECRET", NULL, "us-east-1", "s3");
    struct sf__sigv4_result res;
    const struct sf__header no_host[] = {{"x-amz-date", "20150830T123600Z"}};
    struct sf__sigv4_request req = {"GET", "/", NULL, no_host, 1, SF__EMPTY_SHA256};
    cr_expect_eq(sf__sigv4_sign(&s, &req, "20150830T123600Z", &res), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(res.authorization);

    const struct sf__header wrong_date[] = {{"host", "h"}, {"x-amz-date", "20150830T123601Z"}};
    req.headers = wrong_date;
    req.n_headers = 2;
    cr_expect_eq(sf__sigv4_sign(&s, &req, "20150830T123600Z", &res), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__sigv4_sign(&s, &req, "not a date", &res), SF_ERR_INVALID_ARGUMENT);

    const struct sf__header bad_name[] = {
        {"host", "h"}, {"x-amz-date", "20150830T123600Z"}, {"bad;name", "v"}};
    req.headers = bad_name;
    req.n_headers = 3;
    cr_expect_eq(sf__sigv4_sign(&s, &req, "20150830T123600Z", &res), SF_ERR_INVALID_ARGUMENT);
    /* Names outside the token set would be signed and then refused by the
     * parser (fuzz_sigv4): refused when signing. */
    static const char *const non_tokens[] = {"a=1", "a\"b", "a(b)", "a/b", "a@b", "a[b]", "{a}"};
    for (size_t i = 0; i < sizeof non_tokens / sizeof non_tokens[0]; i++) {
        const struct sf__header h[] = {
            {"host", "h"}, {"x-amz-date", "20150830T123600Z"}, {non_tokens[i], "v"}};
        req.headers = h;
        req.n_headers = 3;
        cr_expect_eq(sf__sigv4_sign(&s, &req, "20150830T123600Z", &res), SF_ERR_INVALID_ARGUMENT,
                     "header name %s", non_tokens[i]);
    }
    /* Every token character signs, and the header it makes parses. */
    const struct sf__header tokens[] = {
        {"host", "h"}, {"x-amz-date", "20150830T123600Z"}, {"X-A!#$%&'*+-.^_`|~z9", "v"}};
    req.headers = tokens;
    req.n_headers = 3;
    cr_assert_eq(sf__sigv4_sign(&s, &req, "20150830T123600Z", &res), SF_OK);
    struct sf__sigv4_auth auth;
    cr_expect_eq(sf__sigv4_parse_authorization(res.authorization, &auth), SF_OK, "%s",
                 res.authorization);
    sf__sigv4_result_free(&res);

    req.headers = wrong_date;
    req.n_headers = 2;
    req.payload_hash = NULL;
    cr_expect_eq(sf__sigv4_sign(&s, &req, "20150830T123601Z", &res), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__sigv4_sign(&s, NULL, "20150830T123601Z", &res), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__sigv4_sign(&s, &req, "20150830T123601Z", NULL), SF_ERR_INVALID_ARGUMENT);
    sf__sigv4_signer_destroy(&s);
    sf__sigv4_result_free(NULL);
}
