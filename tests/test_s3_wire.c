/* Answers real S3-compatible stores give that the mock does not: redirects
 * to the bucket's region, bare ETags, listing pages without keys. Each test
 * serves canned answers (tests/support/canned_http.h) and looks at what the
 * client asked. Suite `s3` (test_s3.c). */
#include "s3_fixture.h"

#include "shardfeed.h"
#include "support/canned_http.h"
#include "support/mock_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct canned_http canned;

/* make_root (the AWS environment isolated) and a client of the canned
 * server, signing for us-east-1, at most max_attempts per request. */
static void canned_client(const char *const *answers, size_t n, unsigned max_attempts)
{
    make_root();
    canned_http_start(&canned, answers, n);
    struct sf_s3_options o;
    mock_env_s3_fast(&o, canned.url, 2, 256 * 1024);
    o.region = "us-east-1";
    o.max_attempts = max_attempts;
    client(&o);
}

static void canned_done(void)
{
    sf_s3_destroy(s3);
    s3 = NULL;
    canned_http_stop(&canned);
}

static sf_status fetch_all(const char *url, const struct sf_fetch_options *o, struct sf_fetch **f)
{
    sf_status st = sf_fetch_start(s3, url, o, f);
    if (st == SF_OK)
        st = sf_fetch_wait(*f, SF_SIZE_UNKNOWN, -1, NULL);
    return st;
}

/* Fetches s3://bucket/k.bin, 10 bytes (If-Match etag unless NULL), which
 * must come whole as 0123456789. Returns the fetch (the caller destroys
 * it), NULL when it failed. */
static struct sf_fetch *fetch_ten_bytes(const char *etag)
{
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.size = 10;
    o.etag = etag;
    struct sf_fetch *f = NULL;
    sf_status st = fetch_all("s3://bucket/k.bin", &o, &f);
    cr_expect_eq(st, SF_OK, "%s: %s", sf_status_name(st), f ? sf_fetch_errmsg(f) : errmsg());
    if (st != SF_OK) {
        sf_fetch_destroy(f);
        return NULL;
    }
    cr_expect(memcmp(sf_fetch_data(f), "0123456789", 10) == 0);
    return f;
}

/* ============================================================ redirects */

#define PERMANENT_REDIRECT_BODY                                                                    \
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>PermanentRedirect</Code>"            \
    "<Message>The bucket you are attempting to access must be addressed using the specified "      \
    "endpoint. Please send all future requests to this endpoint.</Message>"                        \
    "<Endpoint>bucket.s3.eu-west-1.amazonaws.com</Endpoint><Bucket>bucket</Bucket>"                \
    "<RequestId>R2</RequestId><HostId>H</HostId></Error>"

#define TEMPORARY_REDIRECT_BODY                                                                    \
    "<Error><Code>TemporaryRedirect</Code><Message>Please re-send this request to the "            \
    "specified temporary endpoint. Continue to use the original request endpoint for future "      \
    "requests.</Message><Endpoint>bucket.s3-us-east-1.amazonaws.com</Endpoint>"                    \
    "<Bucket>bucket</Bucket></Error>"

/* A bucket in another region answers 301 with the region in
 * x-amz-bucket-region (the whole of a HEAD answer) and <Endpoint> in a GET's
 * body; a new bucket may answer 307. The request was signed for this host
 * and region: it is not sent again anywhere (not even to the Location), and
 * the message says which region to set. A stat said only "HTTP 301". */
Test(s3, redirects_are_not_followed_and_name_the_region_or_endpoint)
{
    static const char *const answers[] = {
        "HTTP/1.1 301 Moved Permanently\r\nx-amz-bucket-region: eu-west-1\r\n"
        "x-amz-request-id: R1\r\nLocation: http://127.0.0.1:1/elsewhere\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 301 Moved Permanently\r\nx-amz-bucket-region: eu-west-1\r\n"
        "Location: http://127.0.0.1:1/elsewhere\r\nContent-Type: application/xml\r\n"
        "Connection: close\r\n\r\n" PERMANENT_REDIRECT_BODY,
        "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:1/elsewhere\r\n"
        "Content-Type: application/xml\r\nConnection: close\r\n\r\n" TEMPORARY_REDIRECT_BODY,
    };
    canned_client(answers, 3, 1);

    expect_stat_fails(
        "s3://bucket/k.bin", SF_ERR_HTTP,
        (const char *const[]){"HTTP 301", "region 'eu-west-1'", "signed for 'us-east-1'", NULL});
    cr_expect_eq(canned_http_requests(&canned), 1);

    expect_fetch_fails("s3://bucket/k.bin", SF_ERR_HTTP,
                       (const char *const[]){"PermanentRedirect", "region 'eu-west-1'", NULL});
    cr_expect_eq(canned_http_requests(&canned), 2);

    expect_fetch_fails("s3://bucket/k.bin", SF_ERR_HTTP,
                       (const char *const[]){"TemporaryRedirect",
                                             "endpoint bucket.s3-us-east-1.amazonaws.com", NULL});
    cr_expect_eq(canned_http_requests(&canned), 3, "no redirect was followed");
    canned_done();
}

/* ============================================================ ETags */

/* Some stores answer a bare ETag header (`ETag: 0123abcd`) while S3-style
 * listings quote it: the range read as a changed object (SF_ERR_CHANGED).
 * Both are one ETag; If-Match goes out quoted. */
Test(s3, a_bare_etag_header_matches_the_quoted_etag_of_a_listing)
{
    static const char *const answers[] = {
        "HTTP/1.1 206 Partial Content\r\nETag: 0123abcd\r\nContent-Range: bytes 0-9/10\r\n"
        "Content-Length: 10\r\nConnection: close\r\n\r\n0123456789",
    };
    canned_client(answers, 1, 1);
    struct sf_fetch *f = fetch_ten_bytes("\"0123abcd\"");
    if (f)
        cr_expect_str_eq(sf_fetch_etag(f), "\"0123abcd\"");
    sf_fetch_destroy(f);
    char req[4096];
    canned_http_request(&canned, 0, req, sizeof(req));
    cr_expect(strstr(req, "\r\nIf-Match: \"0123abcd\"\r\n"), "request: %s", req);
    canned_done();
}

/* ============================================================ ranged answers */

/* A 206 whose Content-Range is not the range asked for (bytes 5-9 for 0-9)
 * is not taken as it: nothing of it is written, the range is asked again. */
Test(s3, a_206_for_another_range_is_not_taken_for_the_one_asked)
{
    static const char *const answers[] = {
        "HTTP/1.1 206 Partial Content\r\nETag: \"e1\"\r\nContent-Range: bytes 5-9/10\r\n"
        "Content-Length: 5\r\nConnection: close\r\n\r\n56789",
        "HTTP/1.1 206 Partial Content\r\nETag: \"e1\"\r\nContent-Range: bytes 0-9/10\r\n"
        "Content-Length: 10\r\nConnection: close\r\n\r\n0123456789",
    };
    canned_client(answers, 2, 3);
    sf_fetch_destroy(fetch_ten_bytes(NULL));
    cr_expect_eq(canned_http_requests(&canned), 2);
    canned_done();
}

/* S3 stores an object's Content-Encoding and answers it with the stored
 * bytes: they are what a fetch gives, never decoded (no Accept-Encoding is
 * sent; a body that is not gzip at all would fail a decoder). */
Test(s3, a_content_encoding_gzip_object_is_fetched_as_stored)
{
    static const char *const answers[] = {
        "HTTP/1.1 206 Partial Content\r\nETag: \"e1\"\r\nContent-Encoding: gzip\r\n"
        "Content-Range: bytes 0-9/10\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
        "\x1f\x8bnot-gzip",
    };
    canned_client(answers, 1, 1);
    struct sf_fetch *f = NULL;
    sf_status st = fetch_all("s3://bucket/k.gz", NULL, &f);
    cr_expect_eq(st, SF_OK, "%s: %s", sf_status_name(st), f ? sf_fetch_errmsg(f) : errmsg());
    if (st == SF_OK)
        cr_expect(memcmp(sf_fetch_data(f), "\x1f\x8bnot-gzip", 10) == 0);
    sf_fetch_destroy(f);
    char req[4096];
    canned_http_request(&canned, 0, req, sizeof(req));
    cr_expect_null(strcasestr(req, "Accept-Encoding"), "request: %s", req);
    canned_done();
}

/* ============================================================ listings */

#define LIST_HEAD                                                                                  \
    "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nConnection: close\r\n\r\n"                \
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult "                               \
    "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>bucket</Name>"                        \
    "<EncodingType>url</EncodingType>"
#define LIST_ENTRY(k)                                                                              \
    "<Contents><Key>" k "</Key><Size>3</Size><ETag>&quot;e" k "&quot;</ETag>"                      \
    "<LastModified>2024-01-01T00:00:00.000Z</LastModified></Contents>"
/* S3 may end a page before max-keys, even with no key at all, while it scans
 * past deleted objects: IsTruncated true and a token, nothing else. */
#define EMPTY_PAGE                                                                                 \
    LIST_HEAD "<KeyCount>0</KeyCount><IsTruncated>true</IsTruncated>"                              \
              "<NextContinuationToken>t+/=1</NextContinuationToken></ListBucketResult>"
#define FULL_PAGE                                                                                  \
    LIST_HEAD "<KeyCount>5</KeyCount><IsTruncated>false</IsTruncated>" LIST_ENTRY("p/k-0")         \
        LIST_ENTRY("p/k-1") LIST_ENTRY("p/k-2") LIST_ENTRY("p/k-3")                                \
            LIST_ENTRY("p/k-4") "</ListBucketResult>"

/* A truncated page without keys goes on with its continuation token (sent
 * encoded: '+', '/' and '=' are not literal in a query). The checked
 * expansion of a pattern (more keys than SF_EXPAND_HEAD_MAX) moves by
 * start-after from the last key seen and had none: it failed with
 * "truncated listing without keys". */
Test(s3, a_truncated_page_without_keys_goes_on_with_its_token)
{
    static const char *const answers[] = {EMPTY_PAGE, FULL_PAGE, EMPTY_PAGE, FULL_PAGE};
    canned_client(answers, 4, 1);
    char req[4096];

    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_list(s3, "s3://bucket/p/", SF_LIST_RECURSIVE, 0, &l);
    cr_expect_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_expect_eq(sf_object_list_count(l), 5);
    sf_object_list_destroy(l);
    l = NULL;
    cr_assert_eq(canned_http_requests(&canned), 2);
    canned_http_request(&canned, 1, req, sizeof(req));
    cr_expect(strstr(req, "continuation-token=t%2B%2F%3D1"), "request: %s", req);

    st = sf_s3_expand_stat(s3, "s3://bucket/p/k-{0..4}", 0, &l);
    cr_expect_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_expect_eq(sf_object_list_count(l), 5);
    const struct sf_object_info *it = sf_object_list_get(l, 4);
    if (it) {
        cr_expect_str_eq(it->key, "p/k-4");
        cr_expect_eq(it->size, 3);
        cr_expect_str_eq(it->etag, "\"ep/k-4\"");
    }
    sf_object_list_destroy(l);
    cr_expect_eq(canned_http_requests(&canned), 4);
    canned_http_request(&canned, 3, req, sizeof(req));
    cr_expect(strstr(req, "continuation-token=t%2B%2F%3D1"), "request: %s", req);
    canned_done();
}

/* ============================================================ keys on the wire */

/* S3 keys are opaque and S3 does not normalise paths: a leading '/', "//",
 * "." segments and the characters a URL gives meaning to go out as the key's
 * bytes, percent-encoded once (the mock refuses the first three, so only the
 * request line shows it). */
Test(s3, odd_keys_go_out_as_their_bytes)
{
    static const char *const answers[] = {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    };
    canned_client(answers, 1, 1);
    const char *keys[][2] = {
        {"s3://bucket//lead", "HEAD /bucket//lead HTTP/1.1\r\n"},
        {"s3://bucket/a//b/", "HEAD /bucket/a//b/ HTTP/1.1\r\n"},
        {"s3://bucket/a/./b/../c", "HEAD /bucket/a/./b/../c HTTP/1.1\r\n"},
        {"s3://bucket/sp ace+%=&?#~\xc3\xa9",
         "HEAD /bucket/sp%20ace%2B%25%3D%26%3F%23~%C3%A9 HTTP/1.1\r\n"},
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        struct sf_object_info info;
        sf_status st = sf_s3_stat(s3, keys[i][0], &info);
        cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s: %s", keys[i][0], sf_status_name(st));
        char req[4096];
        canned_http_request(&canned, i, req, sizeof(req));
        cr_expect_eq(strncmp(req, keys[i][1], strlen(keys[i][1])), 0, "%s: sent %.120s", keys[i][0],
                     req);
    }
    canned_done();
}
