/* SigV4 against the S3 documentation's vectors (requests, chunks,
 * trailers), signing requests, and verifying them as the mock does.
 * Suite `sigv4` (test_sigv4.c). */
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

/* ------------------------------------------------- S3 documentation vector */

/* A chunk (or, with trailer, the trailer) signed on the chain at prev, at
 * the documentation's date. */
static sf_status doc_sign_chunk(struct sf__sigv4_signer *s, const char *prev, int trailer,
                                const char *hash, char sig[SF__SHA256_HEX_LEN + 1])
{
    return sf__sigv4_sign_chunk(s, DOC_DATE, "20130524", "us-east-1", "s3", prev, trailer, hash,
                                sig);
}

Test(sigv4, s3_doc_get_object_vector)
{
    struct sf__sigv4_signer s;
    doc_signer(&s);
    const struct sf__header hdrs[] = {
        {"Host", DOC_HOST},
        {"Range", "bytes=0-9"},
        {"x-amz-content-sha256", SF__EMPTY_SHA256},
        {"x-amz-date", DOC_DATE},
    };
    struct sf__sigv4_request req = {"GET", "/test.txt", NULL, hdrs, 4, SF__EMPTY_SHA256};
    struct sf__sigv4_result res;
    cr_assert_eq(sf__sigv4_sign(&s, &req, DOC_DATE, &res), SF_OK);
    cr_expect_str_eq(res.canonical_request,
                     "GET\n/test.txt\n\n"
                     "host:examplebucket.s3.amazonaws.com\n"
                     "range:bytes=0-9\n"
                     "x-amz-content-sha256:" SF__EMPTY_SHA256 "\n"
                     "x-amz-date:20130524T000000Z\n\n"
                     "host;range;x-amz-content-sha256;x-amz-date\n" SF__EMPTY_SHA256);
    cr_expect_str_eq(res.string_to_sign,
                     "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
                     "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
    cr_expect_str_eq(res.signature, DOC_SIG);
    cr_expect_str_eq(res.signed_headers, "host;range;x-amz-content-sha256;x-amz-date");
    cr_expect_str_eq(res.authorization,
                     "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                     "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                     "Signature=" DOC_SIG);
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
}

/* AWS's "Transferring Payload in Multiple Chunks" example: 66560 bytes of
 * 'a' sent as chunks of 65536, 1024 and 0 bytes. The seed signature is the
 * request's own; each chunk's signature chains on the previous one. */
#define CHUNK_SEED "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"

Test(sigv4, s3_doc_chunked_seed_signature)
{
    struct sf__sigv4_signer s;
    doc_signer(&s);
    const struct sf__header hdrs[] = {
        {"Host", "s3.amazonaws.com"},
        {"x-amz-date", DOC_DATE},
        {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
        {"Content-Encoding", "aws-chunked"},
        {"Content-Length", "66824"},
        {"x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"},
        {"x-amz-decoded-content-length", "66560"},
    };
    struct sf__sigv4_request req = {"PUT", "/examplebucket/chunkObject.txt", NULL, hdrs, 7,
                                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"};
    struct sf__sigv4_result res;
    cr_assert_eq(sf__sigv4_sign(&s, &req, DOC_DATE, &res), SF_OK);
    cr_expect_str_eq(res.signature, CHUNK_SEED);
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
}

/* Signs AWS's three example chunks (65536, 1024 and 0 bytes of 'a') on the
 * chain seeded by seed, expecting want[i]; leaves the last signature in prev. */
static void doc_chunk_chain(struct sf__sigv4_signer *s, const char *seed, const char *const want[3],
                            char prev[SF__SHA256_HEX_LEN + 1])
{
    static char data[65536];
    memset(data, 'a', sizeof data);
    const size_t sizes[3] = {65536, 1024, 0};
    memcpy(prev, seed, SF__SHA256_HEX_LEN + 1);
    for (int i = 0; i < 3; i++) {
        char hash[SF__SHA256_HEX_LEN + 1], sig[SF__SHA256_HEX_LEN + 1];
        sf__sha256_hex(data, sizes[i], hash);
        cr_assert_eq(doc_sign_chunk(s, prev, 0, hash, sig),
                     SF_OK);
        cr_expect_str_eq(sig, want[i], "chunk %d", i);
        memcpy(prev, sig, SF__SHA256_HEX_LEN + 1);
    }
}

Test(sigv4, s3_doc_chunk_signatures_chain)
{
    struct sf__sigv4_signer s;
    doc_signer(&s);
    const char *const want[3] = {
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
    };
    char prev[SF__SHA256_HEX_LEN + 1];
    doc_chunk_chain(&s, CHUNK_SEED, want, prev);
    /* The second chunk signed on another chain (the seed) does not match. */
    char data[1024], hash[SF__SHA256_HEX_LEN + 1], sig[SF__SHA256_HEX_LEN + 1];
    memset(data, 'a', sizeof data);
    sf__sha256_hex(data, sizeof data, hash);
    cr_assert_eq(doc_sign_chunk(&s, CHUNK_SEED, 0, hash, sig),
                 SF_OK);
    cr_expect_str_neq(sig, want[1]);
    cr_expect_eq(doc_sign_chunk(&s, "abc", 0, hash, sig),
                 SF_ERR_INVALID_ARGUMENT);
    sf__sigv4_signer_destroy(&s);
}

/* AWS's trailing-headers example: the same 66560 bytes sent as
 * STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER, with the trailer
 * "x-amz-checksum-crc32c:sOO8/Q==" signed after the final chunk. */
Test(sigv4, s3_doc_trailer_signature)
{
    struct sf__sigv4_signer s;
    doc_signer(&s);
    const char *const want[3] = {
        "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
        "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
        "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
    };
    char prev[SF__SHA256_HEX_LEN + 1], hash[SF__SHA256_HEX_LEN + 1], sig[SF__SHA256_HEX_LEN + 1];
    doc_chunk_chain(&s, "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e", want,
                    prev);
    const char trailer[] = "x-amz-checksum-crc32c:sOO8/Q==\n";
    sf__sha256_hex(trailer, sizeof trailer - 1, hash);
    cr_assert_eq(
        doc_sign_chunk(&s, prev, 1, hash, sig),
        SF_OK);
    cr_expect_str_eq(sig, "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435");
    sf__sigv4_signer_destroy(&s);
}

Test(sigv4, sign_request_adds_date_and_payload_headers)
{
    struct sf__sigv4_signer s;
    doc_signer(&s);
    const struct sf__header hdrs[] = {{"Host", DOC_HOST}, {"Range", "bytes=0-9"}};
    struct sf__sigv4_request req = {"GET", "/test.txt", NULL, hdrs, 2, SF__EMPTY_SHA256};
    time_t now;
    cr_assert_eq(sf__sigv4_parse_date(DOC_DATE, &now), SF_OK);
    char amz_date[SF__AMZ_DATE_LEN + 1];
    struct sf__header extra[3];
    size_t n_extra = 99;
    struct sf__sigv4_result res;
    cr_assert_eq(sf__sigv4_sign_request(&s, &req, now, amz_date, extra, &n_extra, &res), SF_OK);
    cr_expect_str_eq(amz_date, DOC_DATE);
    cr_assert_eq(n_extra, 2);
    cr_expect_str_eq(extra[0].name, "x-amz-date");
    cr_expect_str_eq(extra[0].value, DOC_DATE);
    cr_expect_str_eq(extra[1].name, "x-amz-content-sha256");
    cr_expect_str_eq(extra[1].value, SF__EMPTY_SHA256);
    cr_expect_str_eq(res.signature, DOC_SIG, "same as the documented vector");
    sf__sigv4_result_free(&res);

    /* Adding x-amz-date by hand as well would send it twice. */
    const struct sf__header dup[] = {{"Host", DOC_HOST}, {"X-Amz-Date", DOC_DATE}};
    struct sf__sigv4_request req2 = {"GET", "/test.txt", NULL, dup, 2, SF__EMPTY_SHA256};
    cr_expect_eq(sf__sigv4_sign_request(&s, &req2, now, amz_date, extra, &n_extra, &res),
                 SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(n_extra, 0);
    cr_expect_null(res.authorization);
    sf__sigv4_signer_destroy(&s);
}

Test(sigv4, sign_request_adds_token_header)
{
    const char *token = "FQoGZXIvYXdzEXAMPLETOKEN/+=";
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, DOC_AK, DOC_SECRET, token, "us-east-1", "s3");
    const struct sf__header hdrs[] = {{"Host", DOC_HOST}};
    struct sf__sigv4_request req = {"GET", "/test.txt", NULL, hdrs, 1, SF__UNSIGNED_PAYLOAD};
    char amz_date[SF__AMZ_DATE_LEN + 1];
    struct sf__header extra[3];
    size_t n_extra = 0;
    struct sf__sigv4_result res;
    cr_assert_eq(sf__sigv4_sign_request(&s, &req, 1440938160, amz_date, extra, &n_extra, &res),
                 SF_OK);
    cr_expect_str_eq(amz_date, "20150830T123600Z");
    cr_assert_eq(n_extra, 3);
    cr_expect_str_eq(extra[1].value, SF__UNSIGNED_PAYLOAD);
    cr_expect_str_eq(extra[2].name, "x-amz-security-token");
    cr_expect_str_eq(extra[2].value, token);
    cr_expect_str_eq(res.signed_headers,
                     "host;x-amz-content-sha256;x-amz-date;x-amz-security-token");
    cr_expect_not_null(strstr(res.canonical_request, "\nx-amz-security-token:" /* trimmed */
                                                     "FQoGZXIvYXdzEXAMPLETOKEN/+=\n"));
    cr_expect(strstr(res.canonical_request, "\n" SF__UNSIGNED_PAYLOAD) != NULL);

    /* The server sees the four headers and accepts the request. */
    struct sf__header wire[4] = {hdrs[0], extra[0], extra[1], extra[2]};
    struct sf__sigv4_request wreq = {"GET", "/test.txt", NULL, wire, 4, SF__UNSIGNED_PAYLOAD};
    struct sf__sigv4_auth auth;
    cr_assert_eq(sf__sigv4_parse_authorization(res.authorization, &auth), SF_OK);
    struct sf__sigv4_result vres;
    cr_expect_eq(sf__sigv4_verify(&s, &auth, &wreq, amz_date, &vres), SF_OK);
    sf__sigv4_result_free(&vres);
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
}

/* --------------------------------------------------------------- verify */

struct verify_fixture {
    struct sf__sigv4_signer signer;
    struct sf__header hdrs[6];
    size_t n_hdrs;
    struct sf__sigv4_request req;
    struct sf__sigv4_result res;
    struct sf__sigv4_auth auth;
};

static void fixture_sign(struct verify_fixture *f)
{
    sf__sigv4_signer_init(&f->signer, DOC_AK, DOC_SECRET, NULL, "us-east-1", "s3");
    f->hdrs[0] = (struct sf__header){"Host", DOC_HOST};
    f->hdrs[1] = (struct sf__header){"Range", "bytes=0-9"};
    f->hdrs[2] = (struct sf__header){"x-amz-content-sha256", SF__EMPTY_SHA256};
    f->hdrs[3] = (struct sf__header){"x-amz-date", DOC_DATE};
    f->hdrs[4] = (struct sf__header){"X-Amz-Meta-Tag", "one"};
    f->hdrs[5] = (struct sf__header){"x-amz-meta-tag", "two"};
    f->n_hdrs = 6;
    f->req = (struct sf__sigv4_request){"GET",   "/bucket/my%20key", "list-type=2&prefix=a%2Fb",
                                        f->hdrs, f->n_hdrs,          SF__EMPTY_SHA256};
    cr_assert_eq(sf__sigv4_sign(&f->signer, &f->req, DOC_DATE, &f->res), SF_OK);
    cr_assert_eq(sf__sigv4_parse_authorization(f->res.authorization, &f->auth), SF_OK);
}

static sf_status fixture_verify(struct verify_fixture *f, struct sf__sigv4_signer *s,
                                const struct sf__sigv4_request *req)
{
    struct sf__sigv4_result res;
    sf_status st = sf__sigv4_verify(s, &f->auth, req, DOC_DATE, &res);
    if (st == SF_OK || st == SF_ERR_SIGNATURE)
        cr_expect_not_null(res.canonical_request, "out is filled for OK and SIGNATURE");
    sf__sigv4_result_free(&res);
    return st;
}

static void fixture_free(struct verify_fixture *f)
{
    sf__sigv4_result_free(&f->res);
    sf__sigv4_signer_destroy(&f->signer);
}

Test(sigv4, verify_accepts_signed_request)
{
    struct verify_fixture f;
    fixture_sign(&f);
    cr_expect_str_eq(f.auth.access_key_id, DOC_AK);
    cr_expect_str_eq(f.auth.date, "20130524");
    cr_expect_str_eq(f.auth.region, "us-east-1");
    cr_expect_str_eq(f.auth.service, "s3");
    cr_expect_str_eq(f.auth.signed_headers, "host;range;x-amz-content-sha256;x-amz-date;"
                                            "x-amz-meta-tag");
    cr_expect_eq(fixture_verify(&f, &f.signer, &f.req), SF_OK);

    /* Unsigned extra headers and other name case do not matter; another
     * encoding of the same path does not either. */
    struct sf__header wire[8];
    memcpy(wire, f.hdrs, sizeof f.hdrs);
    wire[0].name = "HOST";
    wire[6] = (struct sf__header){"User-Agent", "test/1.0"};
    wire[7] = (struct sf__header){"Authorization", f.res.authorization};
    struct sf__sigv4_request req = f.req;
    req.headers = wire;
    req.n_headers = 8;
    req.path = "/bucket/my key";
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_OK);

    /* A fresh verifier (empty key cache) agrees. */
    struct sf__sigv4_signer v;
    sf__sigv4_signer_init(&v, DOC_AK, DOC_SECRET, NULL, "us-east-1", "s3");
    cr_expect_eq(fixture_verify(&f, &v, &f.req), SF_OK);
    sf__sigv4_signer_destroy(&v);
    fixture_free(&f);
}

Test(sigv4, verify_rejects_tampered_header_value)
{
    struct verify_fixture f;
    fixture_sign(&f);
    struct sf__header wire[6];
    memcpy(wire, f.hdrs, sizeof f.hdrs);
    wire[1].value = "bytes=0-99";
    struct sf__sigv4_request req = f.req;
    req.headers = wire;
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);

    /* Repeated header: order and every value are signed. */
    memcpy(wire, f.hdrs, sizeof f.hdrs);
    wire[4].value = "two";
    wire[5].value = "one";
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);
    req.n_headers = 5; /* drop the second x-amz-meta-tag */
    memcpy(wire, f.hdrs, sizeof f.hdrs);
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);

    /* Payload hash and method are signed too. */
    req = f.req;
    req.payload_hash = SF__UNSIGNED_PAYLOAD;
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);
    req = f.req;
    req.method = "PUT";
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);
    fixture_free(&f);
}

Test(sigv4, verify_rejects_wrong_secret)
{
    struct verify_fixture f;
    fixture_sign(&f);
    struct sf__sigv4_signer v;
    sf__sigv4_signer_init(&v, DOC_AK, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEZ", NULL, "us-east-1",
                          "s3");
    cr_expect_eq(fixture_verify(&f, &v, &f.req), SF_ERR_SIGNATURE);
    sf__sigv4_signer_destroy(&v);
    fixture_free(&f);
}

Test(sigv4, verify_rejects_wrong_path_and_query)
{
    struct verify_fixture f;
    fixture_sign(&f);
    struct sf__sigv4_request req = f.req;
    req.path = "/bucket/my%20key2";
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);
    req.path = "/bucket/my+key"; /* '+' is not a space in a path */
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);
    req.path = "/bucket/./my%20key"; /* no normalization */
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);
    req = f.req;
    req.query = "list-type=2&prefix=a%2Fc";
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_SIGNATURE);
    req.query = "prefix=a/b&list-type=2"; /* same parameters, other order and encoding */
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_OK);
    fixture_free(&f);
}

Test(sigv4, verify_rejects_missing_signed_header)
{
    struct verify_fixture f;
    fixture_sign(&f);
    struct sf__header wire[6];
    memcpy(wire, f.hdrs, sizeof f.hdrs);
    wire[1] = wire[5]; /* Range gone */
    struct sf__sigv4_request req = f.req;
    req.headers = wire;
    req.n_headers = 5;
    cr_expect_eq(fixture_verify(&f, &f.signer, &req), SF_ERR_PARSE);
    fixture_free(&f);
}

Test(sigv4, verify_requires_host_signed)
{
    struct verify_fixture f;
    fixture_sign(&f);
    struct sf__sigv4_auth auth;
    cr_assert_eq(sf__sigv4_parse_authorization("AWS4-HMAC-SHA256 Credential=" DOC_AK
                                               "/20130524/us-east-1/s3/aws4_request, "
                                               "SignedHeaders=range;x-amz-date, Signature=" DOC_SIG,
                                               &auth),
                 SF_OK);
    struct sf__sigv4_result res;
    cr_expect_eq(sf__sigv4_verify(&f.signer, &auth, &f.req, DOC_DATE, &res), SF_ERR_PARSE);
    sf__sigv4_result_free(&res);
    fixture_free(&f);
}

Test(sigv4, verify_rejects_other_access_key_and_scope_day)
{
    struct verify_fixture f;
    fixture_sign(&f);
    struct sf__sigv4_signer v;
    sf__sigv4_signer_init(&v, "AKIAOTHERKEYEXAMPLE", DOC_SECRET, NULL, "us-east-1", "s3");
    cr_expect_eq(fixture_verify(&f, &v, &f.req), SF_ERR_ACCESS_DENIED);
    sf__sigv4_signer_destroy(&v);

    struct sf__sigv4_result res;
    cr_expect_eq(sf__sigv4_verify(&f.signer, &f.auth, &f.req, "20130525T000000Z", &res),
                 SF_ERR_PARSE, "scope day differs from x-amz-date");
    sf__sigv4_result_free(&res);
    cr_expect_eq(sf__sigv4_verify(&f.signer, &f.auth, &f.req, "garbage", &res), SF_ERR_PARSE);
    sf__sigv4_result_free(&res);
    fixture_free(&f);
}

Test(sigv4, verify_other_region_does_not_touch_cache)
{
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, DOC_AK, DOC_SECRET, NULL, "eu-west-1", "s3");
    struct verify_fixture f; /* signed for us-east-1 */
    fixture_sign(&f);
    struct sf__sigv4_result res;
    cr_expect_eq(sf__sigv4_verify(&s, &f.auth, &f.req, DOC_DATE, &res), SF_OK,
                 "verification uses the scope the client named");
    sf__sigv4_result_free(&res);
    cr_expect_str_eq(s.key_date, "", "a foreign scope's key is not cached");
    sf__sigv4_signer_destroy(&s);
    fixture_free(&f);
}
