/* The S3 client's configuration against the mock: refused options, path
 * style, regions, credentials from the environment, unsigned requests, keys
 * signed as they are. Suite `s3` (test_s3.c). */
#include "s3_fixture.h"

#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ============================================================ configuration */

static void expect_bad_option(void (*edit)(struct sf_s3_options *), const char *word)
{
    struct sf_s3_options o;
    opts_init(&o);
    edit(&o);
    char err[512] = "";
    struct sf_s3 *c = (struct sf_s3 *)&err; /* must be reset to NULL */
    sf_status st = sf_s3_new(&o, &c, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s: %s", word, sf_status_name(st));
    cr_expect_null(c, "%s", word);
    cr_expect(strstr(err, word), "message for %s: '%s'", word, err);
    if (st == SF_OK)
        sf_s3_destroy(c);
}

static void zero_concurrency(struct sf_s3_options *o)
{
    o->concurrency = 0;
}
static void tiny_chunk(struct sf_s3_options *o)
{
    o->chunk_bytes = 10;
}
static void zero_attempts(struct sf_s3_options *o)
{
    o->max_attempts = 0;
}
static void half_credentials(struct sf_s3_options *o)
{
    o->secret_access_key = NULL;
}

Test(s3, invalid_options_are_refused_with_a_message)
{
    make_root();
    snprintf(srv.url, sizeof(srv.url), "http://127.0.0.1:1");
    expect_bad_option(zero_concurrency, "concurrency");
    expect_bad_option(tiny_chunk, "chunk_bytes");
    expect_bad_option(zero_attempts, "max_attempts");
    expect_bad_option(half_credentials, "secret_access_key");
    cr_expect_eq(sf_s3_new(NULL, NULL, NULL, 0), SF_ERR_INVALID_ARGUMENT);
}

Test(s3, path_style_addressing_against_the_mock)
{
    start_mock(NULL);
    struct sf_s3_options o;
    opts_init(&o);
    o.addressing = SF_ADDRESSING_PATH;
    client(&o);
    unsigned char *d = put_object("p/obj.bin", 1000, 9);
    struct sf_object_info info;
    cr_assert_eq(sf_s3_stat(s3, "s3://bucket/p/obj.bin", &info), SF_OK, "%s", errmsg());
    cr_expect_eq(info.size, 1000);
    sf_object_info_clear(&info);
    cr_expect_eq(fetch_whole("s3://bucket/p/obj.bin", d, 1000), SF_OK);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "keys", "bucket/p/obj.bin", "requests"), 2,
                 "the path named bucket and key");
    cJSON_Delete(j);
    free(d);
}

Test(s3, region_from_aws_region_is_used_in_signing)
{
    start_mock(NULL); /* expects us-east-1 */
    put_small("r.bin", 10);
    setenv("AWS_REGION", "eu-west-3", 1);
    struct sf_s3_options o;
    opts_init(&o);
    client(&o);
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_list(s3, "s3://bucket/", 0, 0, &l);
    cr_expect_neq(st, SF_OK);
    cr_expect(strstr(errmsg(), "AuthorizationHeaderMalformed"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "region 'eu-west-3'"), "message: %s", errmsg());
    cr_expect_eq(mock_requests(), 1, "a 400 is not retried");
    sf_s3_destroy(s3);
    s3 = NULL;

    /* the option wins over the environment */
    o.region = "us-east-1";
    client(&o);
    cr_assert_eq(sf_s3_list(s3, "s3://bucket/", 0, 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 1);
    sf_object_list_destroy(l);
}

/* S3 answers a request signed for another region with the bucket's region:
 * x-amz-bucket-region, which is all a HEAD answer carries, or <Region> in a
 * body. A stat (HEAD) said only "HTTP 400"; every wrong-region answer now
 * names the region to set, and nothing is re-sent elsewhere. */
Test(s3, a_wrong_region_answer_names_the_buckets_region)
{
    start_mock((const char *const[]){"--region", "eu-central-1", NULL});
    put_small("r.bin", 10);
    struct sf_s3_options o;
    opts_init(&o);
    o.region = "us-west-2";
    client(&o);
    expect_stat_fails("s3://bucket/r.bin", SF_ERR_INVALID_ARGUMENT,
                      (const char *const[]){"s3://bucket/r.bin", "HTTP 400",
                                            "region 'eu-central-1'", "signed for 'us-west-2'",
                                            NULL});

    /* a GET: the <Region> of the body (the header says the same) */
    expect_fetch_fails(
        "s3://bucket/r.bin", SF_ERR_INVALID_ARGUMENT,
        (const char *const[]){"AuthorizationHeaderMalformed", "region 'eu-central-1'", NULL});
    cr_expect_eq(mock_requests(), 2, "a 400 is not retried");
}

Test(s3, region_from_aws_region_matches_a_mock_in_that_region)
{
    const char *args[] = {"--region", "eu-west-3", NULL};
    start_mock(args);
    put_small("r.bin", 10);
    setenv("AWS_REGION", "eu-west-3", 1);
    struct sf_s3_options o;
    opts_init(&o);
    client(&o);
    struct sf_object_info info;
    cr_assert_eq(sf_s3_stat(s3, "s3://bucket/r.bin", &info), SF_OK, "%s", errmsg());
    cr_expect_eq(info.size, 10);
    sf_object_info_clear(&info);
    sf_s3_destroy(s3);
    s3 = NULL;
    /* AWS_DEFAULT_REGION when AWS_REGION is not set */
    unsetenv("AWS_REGION");
    setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
    client(&o);
    cr_assert_eq(sf_s3_stat(s3, "s3://bucket/r.bin", &info), SF_OK, "%s", errmsg());
    sf_object_info_clear(&info);
}

Test(s3, credentials_from_environment_variables)
{
    start_mock(NULL);
    unsigned char *d = put_object("env.bin", 2000, 11);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    struct sf_s3_options o;
    opts_init(&o);
    o.access_key_id = o.secret_access_key = NULL;
    client(&o);
    struct sf_object_info info;
    cr_assert_eq(sf_s3_stat(s3, "s3://bucket/env.bin", &info), SF_OK, "%s", errmsg());
    cr_expect_eq(info.size, 2000);
    sf_object_info_clear(&info);
    cr_expect_eq(fetch_whole("s3://bucket/env.bin", d, 2000), SF_OK);
    sf_s3_destroy(s3);
    s3 = NULL;

    /* a wrong secret from the environment is refused, and not repeated */
    setenv("AWS_SECRET_ACCESS_KEY", "env-wrong-secret-Q9", 1);
    client(&o);
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_list(s3, "s3://bucket/", 0, 0, &l);
    cr_expect(st == SF_ERR_SIGNATURE || st == SF_ERR_ACCESS_DENIED, "%s", sf_status_name(st));
    cr_expect(strstr(errmsg(), "SignatureDoesNotMatch"), "message: %s", errmsg());
    cr_expect_null(strstr(errmsg(), "env-wrong-secret-Q9"), "message: %s", errmsg());
    free(d);
}

Test(s3, unsigned_requests_to_a_mock_that_wants_signatures_are_denied)
{
    start_mock(NULL);
    put_small("priv.bin", 10);
    unsigned_client();
    struct sf_object_info info;
    sf_status st = sf_s3_stat(s3, "s3://bucket/priv.bin", &info);
    cr_expect_eq(st, SF_ERR_ACCESS_DENIED, "%s: %s", sf_status_name(st), errmsg());
    struct sf_object_list *l = NULL;
    st = sf_s3_list(s3, "s3://bucket/", 0, 0, &l);
    cr_expect_eq(st, SF_ERR_ACCESS_DENIED, "%s: %s", sf_status_name(st), errmsg());
    cr_expect(strstr(errmsg(), "AccessDenied"), "message: %s", errmsg());
    cr_expect_eq(mock_requests(), 2, "a 403 is not retried");
}

Test(s3, unsigned_requests_to_an_anonymous_mock_work)
{
    const char *args[] = {"--anonymous", NULL};
    start_mock(args);
    unsigned char *d = put_object("pub.bin", 700, 12);
    unsigned_client();
    struct sf_object_info info;
    cr_assert_eq(sf_s3_stat(s3, "s3://bucket/pub.bin", &info), SF_OK, "%s", errmsg());
    cr_expect_eq(info.size, 700);
    sf_object_info_clear(&info);
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_list(s3, "s3://bucket/", 0, 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 1);
    sf_object_list_destroy(l);
    cr_expect_eq(fetch_whole("s3://bucket/pub.bin", d, 700), SF_OK);
    free(d);
}

/* ============================================================ keys as signed */

/* "odd/../x" is a key of its own: sent as signed, never squashed into "x"
 * (the mock refuses such keys with 400 InvalidArgument; S3 would look the
 * literal key up). Anonymous, so a normalised path would be answered. */
Test(s3, dot_dot_in_a_key_is_sent_as_is_never_normalised)
{
    const char *args[] = {"--anonymous", NULL};
    start_mock(args);
    unsigned char *d = put_object("x", 700, 3);
    free(d);
    put_small("odd/y", 5);
    unsigned_client();
    struct sf_object_info info;
    memset(&info, 0, sizeof(info));
    sf_status st = sf_s3_stat(s3, "s3://bucket/odd/../x", &info);
    cr_expect_neq(st, SF_OK, "stat of odd/../x answered x's size %llu", info.size);
    sf_object_info_clear(&info);
    struct sf_fetch *f = NULL;
    st = sf_fetch_start(s3, "s3://bucket/odd/../x", NULL, &f);
    if (st == SF_OK) {
        struct sf_fetch_progress p;
        st = sf_fetch_wait(f, ~0ull, -1, &p);
        sf_fetch_destroy(f);
    }
    cr_expect_neq(st, SF_OK, "get of odd/../x returned x");

    const char *get[] = {"get", "--no-sign-request", "s3://bucket/odd/../x", NULL};
    cr_expect_eq(cli_run("get", get), 1, "%s", cli_output("get", "err"));
    cr_expect_eq(strlen(cli_output("get", "out")), 0, "get printed bytes of another object");
    cr_expect(strstr(cli_output("get", "err"), "odd/../x"), "%s", cli_output("get", "err"));
    const char *stat_[] = {"stat", "--no-sign-request", "s3://bucket/odd/./x", NULL};
    cr_expect_eq(cli_run("stat", stat_), 1, "%s", cli_output("stat", "out"));
}
