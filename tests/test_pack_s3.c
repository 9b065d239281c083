/* sf_pack to S3 (the mock): uploads, puts from memory and files, multipart
 * shards with retries and aborts. Suite `pack` (test_pack.c). */
#include "pack_fixture.h"

#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "shardfeed_shard.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

/* ============================================================ S3 */

/* No file in dir has a name starting with prefix (staged files left). */
static void expect_none_named(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_expect(strncmp(de->d_name, prefix, strlen(prefix)) != 0, "%s left in %s", de->d_name,
                  dir);
    closedir(d);
}

Test(pack, upload_to_s3_then_get_back_identical)
{
    make_imagefolder();
    start_mock();
    /* the second shard's first PUT fails: it is retried with the whole body */
    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/ds/train-0001&fault=500&count=1", NULL),
                 200);
    struct sf_pack_options o;
    s3_options(&o, 64 * 1024);
    o.name_pattern = "train-%04u.tar";
    char err[1024];
    struct sf_pack_result res;
    sf_status st = do_pack("s3://bucket/ds/", &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_assert_gt(res.shards, 2);
    cr_expect_eq(mock_count("PutObject", NULL), res.shards + 2, "shards + index + one retry");
    cr_expect_eq(mock_count(NULL, "500"), 1);

    /* the same pack to a local folder: the objects must be byte-identical */
    o.s3 = NULL;
    char local[800];
    dest_path(local, sizeof(local), "local");
    cr_assert_eq(do_pack(local, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    check_pack(local, "tar", 1, o.shard_bytes, NULL);
    static char names[256][256];
    size_t n = list_shards(local, names, 256);
    cr_assert_eq(n, res.shards);
    for (size_t i = 0; i <= n; i++) {
        const char *name = i < n ? names[i] : "index.json";
        char url[600], path[1200];
        snprintf(url, sizeof(url), "s3://bucket/ds/%s", name);
        path_in(path, sizeof(path), local, name);
        size_t got_n, want_n;
        unsigned char *got = get_object(url, &got_n);
        unsigned char *want = test_load(path, &want_n);
        cr_expect(got_n == want_n && memcmp(got, want, want_n) == 0, "%s differs", url);
        free(got);
        free(want);
    }
    /* no staged shard is left behind */
    expect_none_named(tmp, "sfpack-");
}

Test(pack, a_failed_upload_fails_the_pack)
{
    make_flat();
    start_mock();
    struct sf_pack_options o;
    s3_options(&o, 16 * 1024);
    char err[1024];
    /* a bucket that does not exist: 404 NoSuchBucket, not retried */
    sf_status st = do_pack("s3://nobucket/ds", &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s: %s", sf_status_name(st), err);
    cr_expect(strstr(err, "s3://nobucket/ds/shard-000000.tar") && strstr(err, "404"), "message: %s",
              err);
    cr_expect_eq(mock_count("PutObject", NULL), 1, "stopped at the first failure");
}

Test(pack, s3_put_from_memory_and_from_a_file)
{
    start_mock();
    size_t n = 3 * 1024 * 1024 + 17; /* several reads of the body */
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 42);
    char path[800], etag[128];
    dest_path(path, sizeof(path), "body.bin");
    cr_assert_eq(test_write_file(tmp, "body.bin", data, n), 0);

    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/mem.bin", NULL, data, n, etag, sizeof(etag)), SF_OK);
    cr_expect_eq(etag[0], '"', "ETag: %s", etag);
    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/file.bin", path, NULL, 0, NULL, 0), SF_OK);
    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/empty", NULL, NULL, 0, NULL, 0), SF_OK);
    const char *urls[] = {"s3://bucket/a/mem.bin", "s3://bucket/a/file.bin"};
    for (int i = 0; i < 2; i++) {
        size_t got_n;
        unsigned char *got = get_object(urls[i], &got_n);
        cr_expect(got_n == n && memcmp(got, data, n) == 0, "%s differs", urls[i]);
        free(got);
    }
    size_t got_n;
    free(get_object("s3://bucket/a/empty", &got_n));
    cr_expect_eq(got_n, 0);

    /* a 503 and a 500, then success: the whole body is sent again each time */
    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/a/retry&fault=503&count=1", NULL), 200);
    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/a/retry&fault=500&count=1", NULL), 200);
    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/retry.bin", path, NULL, 0, NULL, 0), SF_OK);
    unsigned char *got = get_object("s3://bucket/a/retry.bin", &got_n);
    cr_expect(got_n == n && memcmp(got, data, n) == 0, "retried upload differs");
    free(got);
    struct sf_s3_stats ss;
    sf_s3_get_stats(s3, &ss);
    cr_expect_geq(ss.retries, 2);

    /* errors */
    char msg[1024];
    dest_path(path, sizeof(path), "missing.bin");
    cr_expect_eq(sf_s3_put(s3, "s3://bucket/a/x", path, NULL, 0, NULL, 0), SF_ERR_NOT_FOUND);
    cr_expect(strstr(sf_s3_errmsg(s3, msg, sizeof(msg)), "missing.bin"), "message: %s", msg);
    cr_expect_eq(sf_s3_put(s3, "/tmp/local", NULL, data, 1, NULL, 0), SF_ERR_UNSUPPORTED);
    cr_expect_eq(sf_s3_put(s3, "s3://bucket/a/x", path, data, 1, NULL, 0), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_s3_put(s3, "s3://bucket/a/x", NULL, NULL, 5, NULL, 0), SF_ERR_INVALID_ARGUMENT);

    /* a wrong secret: the signature is refused, not retried */
    struct sf_s3_options so;
    sf_s3_options_init_default(&so);
    so.endpoint_url = srv.url;
    so.access_key_id = "mock-access-key";
    so.secret_access_key = "wrong-secret";
    struct sf_s3 *bad = NULL;
    cr_assert_eq(sf_s3_new(&so, &bad, NULL, 0), SF_OK);
    sf_status st = sf_s3_put(bad, "s3://bucket/a/denied", NULL, data, 100, NULL, 0);
    cr_expect(st == SF_ERR_SIGNATURE || st == SF_ERR_ACCESS_DENIED, "%s", sf_status_name(st));
    cr_expect(strstr(sf_s3_errmsg(bad, msg, sizeof(msg)), "SignatureDoesNotMatch"), "message: %s",
              msg);
    sf_s3_destroy(bad);
    free(data);
}

/* ------------------------------------------------------------ multipart */

Test(pack, large_shards_go_up_in_parts_with_retries_and_match_a_local_pack)
{
    make_large();
    start_mock();
    /* half of the requests to the second shard fail with 500 (seeded): parts
     * are retried one by one */
    const char *rule = "prefix=bucket/mp/shard-000001,p500=0.5";
    char *body = NULL;
    struct s3_call c = {
        .method = "POST", .target = "/_mock/faults", .body = rule, .body_len = strlen(rule)};
    struct s3_resp r;
    cr_assert(s3_call(srv.url, &c, &r) == 0 && r.status == 200);
    s3_resp_free(&r);
    struct sf_pack_options o;
    large_options(&o);
    char err[1024] = "";
    struct sf_pack_result res;
    sf_status st = do_pack("s3://bucket/mp/", &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_assert_eq(res.shards, 2);
    cr_expect_geq(mock_count("CompleteMultipartUpload", NULL), 2, "one per shard, and retries");
    cr_expect_eq(mock_count("PutObject", NULL), 1, "index.json only: the shards went in parts");
    cr_expect_gt(mock_count(NULL, "500"), 0, "faults were injected");
    cr_expect_gt(mock_key_count("bucket/mp/shard-000001.tar", "UploadPart"), 3,
                 "a failed part was sent again");
    cr_expect_eq(uploads_in_progress(), 0);

    o.s3 = NULL;
    char local[800];
    dest_path(local, sizeof(local), "local");
    cr_assert_eq(do_pack(local, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    static char names[16][256];
    size_t n = list_shards(local, names, 16);
    cr_assert_eq(n, 2);
    for (size_t i = 0; i < n; i++) {
        char url[4400], path[4400], target[4400], etag[128] = "", want[128];
        snprintf(url, sizeof(url), "s3://bucket/mp/%s", names[i]);
        path_in(path, sizeof(path), local, names[i]);
        size_t got_n, want_n;
        unsigned char *got = get_object(url, &got_n);
        unsigned char *data = test_load(path, &want_n);
        cr_assert_gt(want_n, 10u << 20);
        cr_expect(got_n == want_n && memcmp(got, data, want_n) == 0, "%s differs", url);
        snprintf(target, sizeof(target), "/bucket/mp/%s", names[i]);
        cr_expect_eq(signed_call("HEAD", target, NULL, etag, sizeof(etag)), 200);
        multipart_etag_of(data, want_n, 5u << 20, want, sizeof(want));
        cr_expect_str_eq(etag, want, "%s: the ETag of 3 parts of 5 MiB", url);
        cr_expect(strstr(etag, "-3\""), "%s", etag);
        free(got);
        free(data);
    }
    free(body);
}

Test(pack, a_part_that_fails_for_good_aborts_the_upload)
{
    make_large();
    start_mock();
    /* the first PUT of the first shard is its first part: a 400 is not retried */
    cr_assert_eq(
        admin("POST", "/_mock/fault?prefix=bucket/mp/shard-000000&fault=400&count=1", NULL), 200);
    struct sf_pack_options o;
    large_options(&o);
    char err[1024] = "";
    sf_status st = do_pack("s3://bucket/mp/", &o, NULL, err, sizeof(err));
    cr_expect_neq(st, SF_OK);
    cr_expect(strstr(err, "s3://bucket/mp/shard-000000.tar") && strstr(err, "part ") &&
                  strstr(err, "400"),
              "message: %s", err);
    cr_expect_eq(mock_count("AbortMultipartUpload", NULL), 1);
    cr_expect_eq(mock_count("CompleteMultipartUpload", NULL), 0);
    cr_expect_eq(uploads_in_progress(), 0, "no upload left in progress");
    char *body = NULL;
    cr_expect_eq(signed_call("HEAD", "/bucket/mp/shard-000000.tar", &body, NULL, 0), 404);
    free(body);
    /* no part file is left in the mock's bucket either */
    char dir[900];
    snprintf(dir, sizeof(dir), "%s/root/bucket", tmp);
    expect_none_named(dir, ".sfmock-");
}

Test(pack, bad_part_sizes_are_refused)
{
    make_flat();
    start_mock();
    struct sf_pack_options o;
    s3_options(&o, 0);
    o.part_bytes = 1 << 20;
    char err[1024] = "";
    cr_expect_eq(do_pack("s3://bucket/x", &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "part size"), "%s", err);
    o.part_bytes = 0;
    o.shard_bytes = (5ull << 40) + 1;
    err[0] = '\0';
    cr_expect_eq(do_pack("s3://bucket/x", &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "5 TiB"), "%s", err);
    o.shard_bytes = 6ull << 30; /* over one PUT's 5 GiB: fine with parts */
    cr_expect_eq(do_pack("s3://bucket/x", &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    struct sf_s3_upload_options uo;
    sf_s3_upload_options_init_default(&uo);
    cr_expect_eq(uo.part_bytes, 64ull << 20);
    uo.part_bytes = 4ull << 20;
    cr_expect_eq(sf_s3_upload_file(s3, "s3://bucket/y", "/etc/hostname", &uo, NULL, 0),
                 SF_ERR_INVALID_ARGUMENT);
}

/* Every shard the index (a file of the mock's bucket) names is there, with
 * the size and XXH3-64 the index gives it. */
static void expect_index_describes_the_objects(const char *index)
{
    cJSON *idx = test_load_json(index);
    const cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(idx, "shards"))
    {
        const char *name = cJSON_GetObjectItemCaseSensitive(sh, "name")->valuestring;
        char path[1200];
        snprintf(path, sizeof(path), "%.*s%s", (int)(strrchr(index, '/') - index + 1), index,
                 name);
        size_t n = 0;
        unsigned char *data = test_load(path, &n);
        cr_assert(data, "index.json names %s, which is not there", name);
        char hex[17];
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)XXH3_64bits(data, n));
        cr_expect_eq((double)n, cJSON_GetObjectItemCaseSensitive(sh, "bytes")->valuedouble,
                     "index.json describes %s as it was before this pack", name);
        cr_expect_str_eq(hex, cJSON_GetObjectItemCaseSensitive(sh, "xxh3_64")->valuestring,
                         "index.json describes %s as it was before this pack", name);
        free(data);
    }
    cJSON_Delete(idx);
}

/* The S3 side of a failed pack over an earlier one: the second pack (other
 * shard boundaries, so other bytes under the same names) uploads two shards
 * over the old ones, then the third is refused for good. No index.json may
 * be left under the prefix that describes shards other than the ones
 * there (it did: the loader then failed on the sizes, SF_ERR_CHANGED,
 * until the data was packed again). */
Test(pack, a_failed_s3_pack_over_an_old_one_leaves_no_stale_index)
{
    make_imagefolder();
    start_mock();
    struct sf_pack_options o;
    s3_options(&o, 32 * 1024);
    char err[1024] = "";
    struct sf_pack_result res;
    cr_assert_eq(do_pack("s3://bucket/ds/", &o, &res, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_gt(res.shards, 3);

    char index[900];
    snprintf(index, sizeof(index), "%s/root/bucket/ds/index.json", tmp);

    /* the old index cannot be replaced: the pack stops before any shard
     * goes up, and the old index still describes the objects */
    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/ds/index.json&fault=400&count=1", NULL),
                 200);
    o.shard_bytes = 20 * 1024;
    const double puts = mock_count("PutObject", NULL);
    sf_status st = do_pack("s3://bucket/ds/", &o, NULL, err, sizeof(err));
    cr_expect_neq(st, SF_OK);
    cr_expect(strstr(err, "s3://bucket/ds/index.json: cannot replace the earlier pack's index"),
              "%s", err);
    cr_expect_eq(mock_count("PutObject", NULL), puts + 1, "only the refused index PUT");
    expect_index_describes_the_objects(index);

    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/ds/shard-000002&fault=400&count=1", NULL),
                 200);
    st = do_pack("s3://bucket/ds/", &o, NULL, err, sizeof(err));
    cr_assert_neq(st, SF_OK, "the queued 400 did not fail the pack");
    cr_expect(strstr(err, "shard-000002.tar") != NULL, "%s", err);

    if (access(index, F_OK) == 0)
        expect_index_describes_the_objects(index);

    /* packed again, whole: the index is the new pack's, every shard in it */
    cr_assert_eq(do_pack("s3://bucket/ds/", &o, &res, err, sizeof(err)), SF_OK, "%s", err);
    cJSON *idx = test_load_json(index);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(idx, "shard_count")->valuedouble,
                 (double)res.shards);
    cJSON_Delete(idx);
    expect_index_describes_the_objects(index);
}

/* ============================================================ CLI */
