/* Answers real S3-compatible stores give that the mock does not: bare
 * ETags. Each test
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
 * server, signing for us-east-1, one attempt per request. */
static void canned_client(const char *const *answers, size_t n)
{
    make_root();
    canned_http_start(&canned, answers, n);
    struct sf_s3_options o;
    mock_env_s3_fast(&o, canned.url, 2, 256 * 1024);
    o.region = "us-east-1";
    o.max_attempts = 1;
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
    canned_client(answers, 1);
    struct sf_fetch_options o;
    sf_fetch_options_init_default(&o);
    o.size = 10;
    o.etag = "\"0123abcd\"";
    struct sf_fetch *f = NULL;
    sf_status st = fetch_all("s3://bucket/k.bin", &o, &f);
    cr_expect_eq(st, SF_OK, "%s: %s", sf_status_name(st), f ? sf_fetch_errmsg(f) : errmsg());
    if (st == SF_OK) {
        cr_expect(memcmp(sf_fetch_data(f), "0123456789", 10) == 0);
        cr_expect_str_eq(sf_fetch_etag(f), "\"0123abcd\"");
    }
    sf_fetch_destroy(f);
    char req[4096];
    canned_http_request(&canned, 0, req, sizeof(req));
    cr_expect(strstr(req, "\r\nIf-Match: \"0123abcd\"\r\n"), "request: %s", req);
    canned_done();
}
