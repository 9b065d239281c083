/* The S3 client (sf_s3_new, stat, list, expand, expand_stat and
 * configuration) and the CLI's ls and stat of patterns, against the mock S3
 * server: every test starts its own server on a free port with a
 * fresh root and stops it; the mock's statistics count the requests. */
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

static struct mock_proc srv;
static char *tmp;      /* holds root/ and scratch files */
static char root[600]; /* the mock's root: bucket "bucket" in it */
static struct sf_s3 *s3;

/* ------------------------------------------------------------ environment */

static void make_root(void)
{
    tmp = mock_env_root(root, sizeof(root));
}

static void start_mock(const char *const *extra)
{
    make_root();
    mock_env_start(&srv, root, extra);
}

static void teardown(void)
{
    sf_s3_destroy(s3);
    s3 = NULL;
    mock_env_stop(&srv, &tmp);
}

TestSuite(s3, .fini = teardown, .timeout = 60);

/* ------------------------------------------------------------ mock admin */

static cJSON *mock_stats(void)
{
    return mock_env_stats(&srv);
}

static double jnum(const cJSON *j, const char *a, const char *b, const char *c)
{
    return mock_env_jnum(j, a, b, c, NULL);
}

static double mock_requests(void)
{
    cJSON *j = mock_stats();
    double n = jnum(j, "requests", NULL, NULL);
    cJSON_Delete(j);
    return n;
}

/* ------------------------------------------------------------ data and client */

/* Writes root/bucket/key with n pseudo-random bytes; returns them (malloc'd). */
static unsigned char *put_object(const char *key, size_t n, unsigned seed)
{
    unsigned char *data = test_put_object(root, "bucket", key, n, seed);
    cr_assert(data, "bucket/%s", key);
    return data;
}

static void put_small(const char *key, size_t n)
{
    free(put_object(key, n, (unsigned)n));
}

static void opts_init(struct sf_s3_options *o)
{
    mock_env_s3_options(o, srv.url);
    o->concurrency = 4;
    o->chunk_bytes = 256 * 1024;
    o->retry_base_ms = 5;
    o->throttle_base_ms = 5;
    o->retry_cap_ms = 200;
    o->connect_timeout_ms = 5000;
}

static void client(const struct sf_s3_options *o)
{
    s3 = mock_env_s3_new(o);
}

static void default_client(void)
{
    struct sf_s3_options o;
    opts_init(&o);
    client(&o);
}

static const char *errmsg(void)
{
    static char buf[1024];
    return sf_s3_errmsg(s3, buf, sizeof(buf));
}

static sf_status fetch_whole(const char *url, const void *want, size_t n)
{
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(s3, url, NULL, &f);
    if (st != SF_OK)
        return st;
    struct sf_fetch_progress p;
    st = sf_fetch_wait(f, ~0ull, -1, &p);
    if (st == SF_OK) {
        cr_expect_eq(p.total, n, "%s", url);
        cr_expect(sf_fetch_data(f) && memcmp(sf_fetch_data(f), want, n) == 0, "%s: bytes differ",
                  url);
    }
    sf_fetch_destroy(f);
    return st;
}

/* ============================================================ stat */

Test(s3, stat_gives_size_etag_and_mtime)
{
    start_mock(NULL);
    default_client();
    size_t n = 123457;
    unsigned char *data = put_object("st/obj.bin", n, 1);
    char etag[35];
    mock_env_etag(data, n, etag);
    struct sf_object_info info;
    sf_status st = sf_s3_stat(s3, "s3://bucket/st/obj.bin", &info);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_expect_eq(info.size, n);
    cr_expect_str_eq(info.etag, etag);
    cr_expect_str_eq(info.url, "s3://bucket/st/obj.bin");
    cr_expect_str_eq(info.key, "st/obj.bin");
    cr_expect_gt(info.last_modified, 1600000000);
    cr_expect_eq(info.is_prefix, 0);
    sf_object_info_clear(&info);
    cr_expect_null(info.url);

    /* an empty object */
    put_small("st/empty", 0);
    cr_assert_eq(sf_s3_stat(s3, "s3://bucket/st/empty", &info), SF_OK, "%s", errmsg());
    cr_expect_eq(info.size, 0);
    cr_expect_str_eq(info.etag, "\"d41d8cd98f00b204e9800998ecf8427e\"");
    sf_object_info_clear(&info);

    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "HeadObject", NULL), 2);
    cr_expect_eq(jnum(j, "requests", NULL, NULL), 2);
    cJSON_Delete(j);
    free(data);
}

Test(s3, stat_of_a_missing_key_is_not_found)
{
    start_mock(NULL);
    default_client();
    struct sf_object_info info;
    sf_status st = sf_s3_stat(s3, "s3://bucket/no/such.bin", &info);
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    cr_expect(strstr(errmsg(), "s3://bucket/no/such.bin"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "404"), "message: %s", errmsg());
    cr_expect_null(info.url);
    cr_expect_eq(mock_requests(), 1, "a 404 is not retried");
    /* a missing bucket too */
    st = sf_s3_stat(s3, "s3://nobucket/k", &info);
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    /* and a local file */
    char path[700];
    snprintf(path, sizeof(path), "%s/missing.bin", tmp);
    cr_expect_eq(sf_s3_stat(s3, path, &info), SF_ERR_NOT_FOUND);
}

Test(s3, stat_of_a_local_file)
{
    make_root();
    struct sf_s3_options o;
    opts_init(&o);
    o.endpoint_url = "http://127.0.0.1:1"; /* never contacted */
    client(&o);
    cr_assert(test_write_file(tmp, "f.bin", "12345", 5) == 0);
    char path[700], url[720];
    snprintf(path, sizeof(path), "%s/f.bin", tmp);
    snprintf(url, sizeof(url), "file://%s", path);
    const char *srcs[] = {path, url};
    for (size_t i = 0; i < 2; i++) {
        struct sf_object_info info;
        cr_assert_eq(sf_s3_stat(s3, srcs[i], &info), SF_OK, "%s: %s", srcs[i], errmsg());
        cr_expect_eq(info.size, 5);
        cr_expect_gt(info.last_modified, 0);
        sf_object_info_clear(&info);
    }
    struct sf_s3_stats s;
    sf_s3_get_stats(s3, &s);
    cr_expect_eq(s.requests, 0);
}

/* ============================================================ list */

static void make_tree(void)
{
    put_small("top.bin", 3);
    put_small("d1/a.bin", 10);
    put_small("d1/b.bin", 11);
    put_small("d2/x/y.bin", 12);
}

Test(s3, list_groups_at_the_next_slash)
{
    start_mock(NULL);
    default_client();
    make_tree();
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_list(s3, "s3://bucket/", 0, 0, &l);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_assert_eq(sf_object_list_count(l), 3);
    int seen_d1 = 0, seen_d2 = 0, seen_top = 0;
    for (size_t i = 0; i < 3; i++) {
        const struct sf_object_info *it = sf_object_list_get(l, i);
        if (!strcmp(it->key, "d1/")) {
            seen_d1++;
            cr_expect_eq(it->is_prefix, 1);
            cr_expect_str_eq(it->url, "s3://bucket/d1/");
        } else if (!strcmp(it->key, "d2/")) {
            seen_d2++;
            cr_expect_eq(it->is_prefix, 1);
        } else if (!strcmp(it->key, "top.bin")) {
            seen_top++;
            cr_expect_eq(it->is_prefix, 0);
            cr_expect_eq(it->size, 3);
            cr_expect_str_eq(it->url, "s3://bucket/top.bin");
        } else {
            cr_expect_fail("unexpected entry %s", it->key);
        }
    }
    cr_expect(seen_d1 == 1 && seen_d2 == 1 && seen_top == 1);
    cr_expect_null(sf_object_list_get(l, 3));
    sf_object_list_destroy(l);

    /* one level down */
    cr_assert_eq(sf_s3_list(s3, "s3://bucket/d1/", 0, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 2);
    cr_expect_str_eq(sf_object_list_get(l, 0)->key, "d1/a.bin");
    cr_expect_str_eq(sf_object_list_get(l, 1)->key, "d1/b.bin");
    cr_expect_eq(sf_object_list_get(l, 1)->size, 11);
    sf_object_list_destroy(l);
}

Test(s3, list_recursive_gives_every_key_in_order)
{
    start_mock(NULL);
    default_client();
    make_tree();
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_list(s3, "s3://bucket", SF_LIST_RECURSIVE, 0, &l), SF_OK, "%s", errmsg());
    const char *want[] = {"d1/a.bin", "d1/b.bin", "d2/x/y.bin", "top.bin"};
    size_t sizes[] = {10, 11, 12, 3};
    cr_assert_eq(sf_object_list_count(l), 4);
    for (size_t i = 0; i < 4; i++) {
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_expect_str_eq(it->key, want[i]);
        cr_expect_eq(it->size, sizes[i]);
        cr_expect_eq(it->is_prefix, 0);
        cr_expect_eq(strlen(it->etag), 34, "%s: etag '%s'", it->key, it->etag);
    }
    sf_object_list_destroy(l);

    /* max_objects is a cap */
    cr_expect_eq(sf_s3_list(s3, "s3://bucket/", SF_LIST_RECURSIVE, 3, &l), SF_ERR_LIMIT);
    cr_expect_null(l);
    cr_expect(strstr(errmsg(), "3"), "message: %s", errmsg());
}

Test(s3, list_buckets)
{
    start_mock(NULL);
    default_client();
    char path[700];
    snprintf(path, sizeof(path), "%s/other-bucket", root);
    cr_assert(mkdir(path, 0755) == 0);
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_list(s3, "s3://", 0, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 2);
    cr_expect_str_eq(sf_object_list_get(l, 0)->key, "bucket");
    cr_expect_str_eq(sf_object_list_get(l, 0)->url, "s3://bucket/");
    cr_expect_eq(sf_object_list_get(l, 0)->is_prefix, 1);
    cr_expect_str_eq(sf_object_list_get(l, 1)->key, "other-bucket");
    sf_object_list_destroy(l);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "ListBuckets", NULL), 1);
    cJSON_Delete(j);
}

Test(s3, list_of_2500_keys_takes_three_pages)
{
    start_mock(NULL);
    default_client();
    for (int i = 0; i < 2500; i++) {
        char key[64];
        snprintf(key, sizeof(key), "many/k-%05d.bin", i);
        char rel[80];
        snprintf(rel, sizeof(rel), "bucket/%s", key);
        cr_assert(test_write_file(root, rel, "xxxxxxx", (size_t)(i % 7)) == 0);
    }
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_list(s3, "s3://bucket/many/", SF_LIST_RECURSIVE, 0, &l);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_assert_eq(sf_object_list_count(l), 2500);
    for (int i = 0; i < 2500; i++) {
        char key[64];
        snprintf(key, sizeof(key), "many/k-%05d.bin", i);
        const struct sf_object_info *it = sf_object_list_get(l, (size_t)i);
        cr_assert_str_eq(it->key, key, "entry %d", i);
        cr_assert_eq(it->size, (unsigned long long)(i % 7), "entry %d", i);
    }
    sf_object_list_destroy(l);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "ListObjectsV2", NULL), 3, "1000 + 1000 + 500 keys");
    cr_expect_eq(jnum(j, "requests", NULL, NULL), 3);
    cJSON_Delete(j);

    /* expansion of the prefix lists the same pages */
    cr_assert_eq(sf_s3_expand(s3, "s3://bucket/many/", 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 2500);
    sf_object_list_destroy(l);
    /* a cap below the count stops the listing */
    cr_expect_eq(sf_s3_list(s3, "s3://bucket/many/", SF_LIST_RECURSIVE, 1500, &l), SF_ERR_LIMIT);
}

Test(s3, keys_with_spaces_plus_percent_ampersand_and_utf8)
{
    start_mock(NULL);
    default_client();
    const char *key = "dir/a b+c%d&e-\xc3\xa9.bin";
    size_t n = 300 * 1024 + 1; /* two ranges */
    unsigned char *data = put_object(key, n, 7);
    put_small("dir/plain.bin", 4);
    char url[256];
    snprintf(url, sizeof(url), "s3://bucket/%s", key);

    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_list(s3, "s3://bucket/dir/", 0, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 2);
    cr_expect_str_eq(sf_object_list_get(l, 0)->key, key);
    cr_expect_str_eq(sf_object_list_get(l, 0)->url, url);
    cr_expect_eq(sf_object_list_get(l, 0)->size, n);
    sf_object_list_destroy(l);

    /* common prefixes are decoded too */
    put_small("odd dir+%&\xc3\xa9/f.bin", 1);
    cr_assert_eq(sf_s3_list(s3, "s3://bucket/", 0, 0, &l), SF_OK, "%s", errmsg());
    int found = 0;
    for (size_t i = 0; i < sf_object_list_count(l); i++) {
        const struct sf_object_info *it = sf_object_list_get(l, i);
        if (it->is_prefix && !strcmp(it->key, "odd dir+%&\xc3\xa9/"))
            found = !strcmp(it->url, "s3://bucket/odd dir+%&\xc3\xa9/");
    }
    cr_expect(found, "the common prefix 'odd dir+%%&\xc3\xa9/' was not listed as is");
    sf_object_list_destroy(l);

    /* a prefix with the odd characters in it */
    cr_assert_eq(sf_s3_list(s3, "s3://bucket/dir/a b+c%d&", 0, 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 1);
    sf_object_list_destroy(l);

    struct sf_object_info info;
    cr_assert_eq(sf_s3_stat(s3, url, &info), SF_OK, "%s", errmsg());
    cr_expect_eq(info.size, n);
    cr_expect_str_eq(info.key, key);
    sf_object_info_clear(&info);
    sf_status st = fetch_whole(url, data, n);
    cr_expect_eq(st, SF_OK, "%s", sf_status_name(st));

    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "status", "403", NULL), 0, "a signature did not match");
    cr_expect_eq(jnum(j, "status", "400", NULL), 0);
    cJSON_Delete(j);
    free(data);
}

/* ============================================================ expand */

Test(s3, expand_brace_patterns_without_network)
{
    start_mock(NULL);
    default_client();
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_expand(s3, "s3://bucket/train-{000..009}.tar", 0, &l);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_assert_eq(sf_object_list_count(l), 10);
    for (size_t i = 0; i < 10; i++) {
        char want[64];
        snprintf(want, sizeof(want), "s3://bucket/train-%03zu.tar", i);
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_expect_str_eq(it->url, want);
        cr_expect_str_eq(it->key, want + strlen("s3://bucket/"));
        cr_expect_eq(it->size, SF_SIZE_UNKNOWN);
        cr_expect_str_eq(it->etag, "");
    }
    sf_object_list_destroy(l);

    /* several braces: the left-most varies slowest */
    cr_assert_eq(sf_s3_expand(s3, "s3://bucket/{x,y}/p-{1..3}.bin", 0, &l), SF_OK, "%s", errmsg());
    const char *want[] = {"x/p-1.bin", "x/p-2.bin", "x/p-3.bin",
                          "y/p-1.bin", "y/p-2.bin", "y/p-3.bin"};
    cr_assert_eq(sf_object_list_count(l), 6);
    for (size_t i = 0; i < 6; i++)
        cr_expect_str_eq(sf_object_list_get(l, i)->key, want[i]);
    sf_object_list_destroy(l);

    /* a cap */
    cr_expect_eq(sf_s3_expand(s3, "s3://bucket/s-{0..99}", 50, &l), SF_ERR_LIMIT);
    cr_expect_null(l);
    /* a syntax error */
    cr_expect_eq(sf_s3_expand(s3, "s3://bucket/s-{0..", 0, &l), SF_ERR_INVALID_ARGUMENT);
    cr_expect_neq(errmsg()[0], '\0');

    cr_expect_eq(mock_requests(), 0, "brace expansion sent requests");
    struct sf_s3_stats s;
    sf_s3_get_stats(s3, &s);
    cr_expect_eq(s.requests, 0);
}

Test(s3, expand_a_prefix_fills_size_and_etag)
{
    start_mock(NULL);
    default_client();
    size_t sizes[] = {5, 0, 4096};
    const char *keys[] = {"ds/a.tar", "ds/b.tar", "ds/sub/c.tar"};
    char etags[3][35];
    for (size_t i = 0; i < 3; i++) {
        unsigned char *d = put_object(keys[i], sizes[i], 100 + (unsigned)i);
        mock_env_etag(d, sizes[i], etags[i]);
        free(d);
    }
    put_small("dsx/not-me.tar", 1);
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_expand(s3, "s3://bucket/ds/", 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 3);
    for (size_t i = 0; i < 3; i++) {
        const struct sf_object_info *it = sf_object_list_get(l, i);
        char url[128];
        snprintf(url, sizeof(url), "s3://bucket/%s", keys[i]);
        cr_expect_str_eq(it->url, url);
        cr_expect_str_eq(it->key, keys[i]);
        cr_expect_eq(it->size, sizes[i], "%s", keys[i]);
        cr_expect_str_eq(it->etag, etags[i], "%s", keys[i]);
        cr_expect_eq(it->is_prefix, 0);
    }
    sf_object_list_destroy(l);

    /* one key: not checked, size unknown */
    cr_assert_eq(sf_s3_expand(s3, "s3://bucket/ds/a.tar", 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 1);
    cr_expect_eq(sf_object_list_get(l, 0)->size, SF_SIZE_UNKNOWN);
    sf_object_list_destroy(l);

    /* an empty prefix */
    cr_expect_eq(sf_s3_expand(s3, "s3://bucket/nothing/", 0, &l), SF_ERR_NOT_FOUND);
    cr_expect(strstr(errmsg(), "nothing"), "message: %s", errmsg());
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "ListObjectsV2", NULL), 2);
    cr_expect_eq(jnum(j, "requests", NULL, NULL), 2);
    cJSON_Delete(j);
}

Test(s3, expand_a_local_directory_sorted_and_recursive)
{
    make_root();
    struct sf_s3_options o;
    opts_init(&o);
    o.endpoint_url = "http://127.0.0.1:1"; /* never contacted */
    client(&o);
    const char *rels[] = {"local/z/y/x.bin", "local/b.bin", "local/a/c.bin", "local/a/b.bin"};
    for (size_t i = 0; i < 4; i++)
        cr_assert(test_write_file(tmp, rels[i], "abcdefgh", i + 1) == 0);
    const char *sorted[] = {"local/a/b.bin", "local/a/c.bin", "local/b.bin", "local/z/y/x.bin"};
    size_t sizes[] = {4, 3, 2, 1};
    char dir[700];
    snprintf(dir, sizeof(dir), "%s/local/", tmp);
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_expand(s3, dir, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 4);
    for (size_t i = 0; i < 4; i++) {
        char want[800];
        snprintf(want, sizeof(want), "%s/%s", tmp, sorted[i]);
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_expect_str_eq(it->key, want);
        cr_expect_eq(it->size, sizes[i], "%s", want);
    }
    sf_object_list_destroy(l);

    /* file:// of the directory, and of one file */
    char url[720];
    snprintf(url, sizeof(url), "file://%s/local", tmp);
    cr_assert_eq(sf_s3_expand(s3, url, 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 4);
    sf_object_list_destroy(l);
    snprintf(url, sizeof(url), "file://%s/local/b.bin", tmp);
    cr_assert_eq(sf_s3_expand(s3, url, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 1);
    cr_expect_eq(sf_object_list_get(l, 0)->size, 2);
    sf_object_list_destroy(l);

    cr_expect_eq(sf_s3_expand(s3, dir, 3, &l), SF_ERR_LIMIT);
    snprintf(dir, sizeof(dir), "%s/nope/", tmp);
    cr_expect_eq(sf_s3_expand(s3, dir, 0, &l), SF_ERR_NOT_FOUND);
}

/* ============================================================ expand_stat */

/* Puts prefix-NNN.tar for n in [0, count) except those in skip (-1 ends it),
 * with size 100 + n; their ETags into etags[n] when etags is not NULL. */
static void put_shards(const char *prefix, int count, const int *skip, char (*etags)[35])
{
    for (int i = 0; i < count; i++) {
        int skipped = 0;
        for (const int *s = skip; s && *s >= 0; s++)
            skipped |= *s == i;
        if (skipped)
            continue;
        char key[128];
        snprintf(key, sizeof(key), "%s%03d.tar", prefix, i);
        unsigned char *d = put_object(key, 100 + (size_t)i, (unsigned)i);
        if (etags)
            mock_env_etag(d, 100 + (size_t)i, etags[i]);
        free(d);
    }
}

Test(s3, expand_stat_of_a_pattern_gives_sizes_and_etags_in_pattern_order)
{
    start_mock(NULL);
    default_client();
    char etags[2][12][35];
    put_shards("ds/a/t-", 12, NULL, etags[0]);
    put_shards("ds/b/t-", 12, NULL, etags[1]);
    put_small("ds/a/t-003.idx", 9); /* neighbours that are not named */
    put_small("ds/a/t-0035.tar", 9);
    put_small("ds/c/t-000.tar", 9);
    /* b before a and a falling range: pattern order, not listing order */
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_expand_stat(s3, "s3://bucket/ds/{b,a}/t-{010..002}.tar", 0, &l);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_assert_eq(sf_object_list_count(l), 18);
    for (size_t i = 0; i < 18; i++) {
        int dir = i < 9 ? 1 : 0, num = 10 - (int)(i % 9);
        char key[64], url[96];
        snprintf(key, sizeof(key), "ds/%c/t-%03d.tar", dir ? 'b' : 'a', num);
        snprintf(url, sizeof(url), "s3://bucket/%s", key);
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_expect_str_eq(it->key, key, "entry %zu", i);
        cr_expect_str_eq(it->url, url, "entry %zu", i);
        cr_expect_eq(it->size, 100 + (unsigned long long)num, "%s", key);
        cr_expect_str_eq(it->etag, etags[dir][num], "%s", key);
        cr_expect_gt(it->last_modified, 1600000000, "%s", key);
        cr_expect_eq(it->is_prefix, 0);
    }
    sf_object_list_destroy(l);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "HeadObject", NULL), 0, "more than 4 keys are listed");
    cr_expect_geq(jnum(j, "operations", "ListObjectsV2", NULL), 1);
    cr_expect_leq(jnum(j, "requests", NULL, NULL), 2, "18 keys in 1000-key pages");
    cJSON_Delete(j);
}

Test(s3, expand_stat_of_a_few_keys_heads_each_one)
{
    start_mock(NULL);
    default_client();
    char etags[12][35];
    put_shards("few/t-", 12, NULL, etags);
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_expand_stat(s3, "s3://bucket/few/t-{007,001,011}.tar", 0, &l);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    int want[] = {7, 1, 11};
    cr_assert_eq(sf_object_list_count(l), 3);
    for (size_t i = 0; i < 3; i++) {
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_expect_eq(it->size, 100 + (unsigned long long)want[i]);
        cr_expect_str_eq(it->etag, etags[want[i]]);
    }
    sf_object_list_destroy(l);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "HeadObject", NULL), 3);
    cr_expect_eq(jnum(j, "operations", "ListObjectsV2", NULL), 0);
    cJSON_Delete(j);

    /* one key, no braces: one HEAD, size known (sf_s3_expand leaves it unknown) */
    cr_assert_eq(sf_s3_expand_stat(s3, "s3://bucket/few/t-004.tar", 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 1);
    cr_expect_eq(sf_object_list_get(l, 0)->size, 104);
    cr_expect_str_eq(sf_object_list_get(l, 0)->etag, etags[4]);
    sf_object_list_destroy(l);
    /* a prefix: the listing, with sizes */
    cr_assert_eq(sf_s3_expand_stat(s3, "s3://bucket/few/", 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 12);
    cr_expect_eq(sf_object_list_get(l, 11)->size, 111);
    sf_object_list_destroy(l);
}

Test(s3, expand_stat_names_the_first_missing_object)
{
    start_mock(NULL);
    default_client();
    int skip[] = {2, 7, -1};
    put_shards("gap/t-", 10, skip, NULL);
    struct sf_object_list *l = (struct sf_object_list *)&skip; /* must be reset to NULL */
    /* listed: 2 and 7 absent, 10 and 11 past the last key */
    sf_status st = sf_s3_expand_stat(s3, "s3://bucket/gap/t-{000..011}.tar", 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    cr_expect_null(l);
    cr_expect(strstr(errmsg(), "s3://bucket/gap/t-002.tar"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "4 of the 12"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "s3://bucket/gap/t-{000..011}.tar"), "message: %s", errmsg());

    /* pattern order decides which one is named first */
    st = sf_s3_expand_stat(s3, "s3://bucket/gap/t-{009..000}.tar", 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND);
    cr_expect(strstr(errmsg(), "s3://bucket/gap/t-007.tar"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "2 of the 10"), "message: %s", errmsg());

    /* HEADed (a few keys) */
    st = sf_s3_expand_stat(s3, "s3://bucket/gap/t-{000..003}.tar", 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND);
    cr_expect_null(l);
    cr_expect(strstr(errmsg(), "s3://bucket/gap/t-002.tar"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "1 of the 4"), "message: %s", errmsg());

    /* one key */
    st = sf_s3_expand_stat(s3, "s3://bucket/gap/t-007.tar", 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND);
    cr_expect(strstr(errmsg(), "s3://bucket/gap/t-007.tar"), "message: %s", errmsg());

    /* every key missing, and a prefix with nothing under it */
    st = sf_s3_expand_stat(s3, "s3://bucket/none/t-{000..009}.tar", 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND);
    cr_expect(strstr(errmsg(), "10 of the 10"), "message: %s", errmsg());
    cr_expect_eq(sf_s3_expand_stat(s3, "s3://bucket/none/", 0, &l), SF_ERR_NOT_FOUND);
    cr_expect_null(l);

    /* a syntax error and a cap are what sf_s3_expand says */
    cr_expect_eq(sf_s3_expand_stat(s3, "s3://bucket/t-{0..", 0, &l), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_s3_expand_stat(s3, "s3://bucket/gap/t-{000..009}.tar", 5, &l), SF_ERR_LIMIT);
    cr_expect_null(l);
    cr_expect_eq(sf_s3_expand_stat(s3, NULL, 0, &l), SF_ERR_INVALID_ARGUMENT);
}

Test(s3, expand_stat_of_2500_keys_lists_pages_not_objects)
{
    start_mock(NULL);
    default_client();
    for (int i = 0; i < 2500; i++) {
        char rel[80];
        snprintf(rel, sizeof(rel), "bucket/many/k-%05d.bin", i);
        cr_assert(test_write_file(root, rel, "xxxxxxx", (size_t)(i % 7)) == 0);
    }
    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_expand_stat(s3, "s3://bucket/many/k-{00000..02499}.bin", 0, &l);
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), errmsg());
    cr_assert_eq(sf_object_list_count(l), 2500);
    for (int i = 0; i < 2500; i++) {
        const struct sf_object_info *it = sf_object_list_get(l, (size_t)i);
        cr_assert_eq(it->size, (unsigned long long)(i % 7), "entry %d", i);
        cr_assert_eq(strlen(it->etag), 34, "entry %d: etag '%s'", i, it->etag);
    }
    sf_object_list_destroy(l);
    struct sf_s3_stats s;
    sf_s3_get_stats(s3, &s);
    cr_expect_leq(s.requests, 3, "%llu requests for 2500 objects in 1000-key pages", s.requests);
    cr_expect_lt(s.requests * 100, 2500);
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "HeadObject", NULL), 0);
    cJSON_Delete(j);

    /* a few keys at the start and one at the end: the listing skips ahead
     * to just before the last key instead of reading the pages between */
    cr_assert_eq(
        sf_s3_expand_stat(s3, "s3://bucket/many/k-{00000,00001,00002,00003,02499}.bin", 0, &l),
        SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 5);
    cr_expect_str_eq(sf_object_list_get(l, 4)->key, "many/k-02499.bin");
    cr_expect_eq(sf_object_list_get(l, 4)->size, 2499 % 7);
    sf_object_list_destroy(l);
    struct sf_s3_stats s2;
    sf_s3_get_stats(s3, &s2);
    cr_expect_eq(s2.requests - s.requests, 2, "%llu listing requests", s2.requests - s.requests);

    /* the same in the middle of a large pattern: one missing key */
    char path[700];
    snprintf(path, sizeof(path), "%s/bucket/many/k-01234.bin", root);
    cr_assert(unlink(path) == 0);
    st = sf_s3_expand_stat(s3, "s3://bucket/many/k-{00000..02499}.bin", 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND);
    cr_expect(strstr(errmsg(), "s3://bucket/many/k-01234.bin"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "1 of the 2500"), "message: %s", errmsg());
}

Test(s3, expand_stat_of_a_local_pattern)
{
    make_root();
    struct sf_s3_options o;
    opts_init(&o);
    o.endpoint_url = "http://127.0.0.1:1"; /* never contacted */
    client(&o);
    for (int i = 0; i < 6; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "loc/s-%d.bin", i);
        cr_assert(test_write_file(tmp, rel, "abcdefgh", (size_t)i + 1) == 0);
    }
    char pat[800];
    snprintf(pat, sizeof(pat), "%s/loc/s-{5..0}.bin", tmp);
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_expand_stat(s3, pat, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 6);
    for (size_t i = 0; i < 6; i++) {
        char want[800];
        snprintf(want, sizeof(want), "%s/loc/s-%zu.bin", tmp, 5 - i);
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_expect_str_eq(it->key, want);
        cr_expect_eq(it->size, 6 - i, "%s", want);
        cr_expect_gt(it->last_modified, 0);
    }
    sf_object_list_destroy(l);

    /* file:// too; a missing file is named */
    snprintf(pat, sizeof(pat), "file://%s/loc/s-{0,1,9,2}.bin", tmp);
    cr_expect_eq(sf_s3_expand_stat(s3, pat, 0, &l), SF_ERR_NOT_FOUND);
    cr_expect_null(l);
    cr_expect(strstr(errmsg(), "/loc/s-9.bin"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "1 of the 4"), "message: %s", errmsg());
    /* a directory in a pattern is not an object */
    snprintf(pat, sizeof(pat), "%s/{loc,loc/s-0.bin}", tmp);
    cr_expect_eq(sf_s3_expand_stat(s3, pat, 0, &l), SF_ERR_INVALID_ARGUMENT);
    /* a directory alone is listed, as sf_s3_expand does */
    snprintf(pat, sizeof(pat), "%s/loc", tmp);
    cr_assert_eq(sf_s3_expand_stat(s3, pat, 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 6);
    sf_object_list_destroy(l);

    struct sf_s3_stats s;
    sf_s3_get_stats(s3, &s);
    cr_expect_eq(s.requests, 0);
}

Test(s3, expand_stat_of_an_http_pattern_heads_each_url)
{
    const char *args[] = {"--anonymous", NULL};
    start_mock(args);
    put_small("web/a.bin", 10);
    put_small("web/b.bin", 20);
    struct sf_s3_options o;
    opts_init(&o);
    o.access_key_id = o.secret_access_key = NULL;
    o.no_sign_request = 1;
    client(&o);
    char pat[200];
    snprintf(pat, sizeof(pat), "%s/bucket/web/{b,a}.bin", srv.url);
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_expand_stat(s3, pat, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 2);
    cr_expect_eq(sf_object_list_get(l, 0)->size, 20);
    cr_expect_eq(sf_object_list_get(l, 1)->size, 10);
    cr_expect_eq(strlen(sf_object_list_get(l, 1)->etag), 34);
    sf_object_list_destroy(l);
    snprintf(pat, sizeof(pat), "%s/bucket/web/{a,c}.bin", srv.url);
    cr_expect_eq(sf_s3_expand_stat(s3, pat, 0, &l), SF_ERR_NOT_FOUND);
    cr_expect(strstr(errmsg(), "/bucket/web/c.bin"), "message: %s", errmsg());
    cJSON *j = mock_stats();
    cr_expect_eq(jnum(j, "operations", "HeadObject", NULL), 4);
    cJSON_Delete(j);
}

/* ============================================================ CLI: ls and stat of patterns */

/* Runs the shardfeed CLI with argv as given (argv[0] is SF_CLI_BIN), stdout
 * and stderr into tmp/TAG.out and tmp/TAG.err; the exit status. */
static int cli_run_argv(const char *tag, const char *const *argv)
{
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        char out[800], err[800];
        snprintf(out, sizeof(out), "%s/%s.out", tmp, tag);
        snprintf(err, sizeof(err), "%s/%s.err", tmp, tag);
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
            _exit(126);
        execv(SF_CLI_BIN, (char *const *)argv);
        _exit(127);
    }
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs the shardfeed CLI with --endpoint-url and args (NULL-terminated);
 * stdout and stderr into tmp/TAG.out and tmp/TAG.err; the exit status. */
static int cli_run(const char *tag, const char *const *args)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = SF_CLI_BIN;
    argv[n++] = args[0];
    argv[n++] = "--endpoint-url";
    argv[n++] = srv.url;
    for (int i = 1; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return cli_run_argv(tag, argv);
}

/* Contents of tmp/TAG.EXT (static buffer). */
static const char *cli_output(const char *tag, const char *ext)
{
    static char buf[1 << 16];
    char path[800];
    snprintf(path, sizeof(path), "%s/%s.%s", tmp, tag, ext);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

Test(s3, cli_ls_of_a_pattern_lists_every_object)
{
    start_mock(NULL);
    put_shards("cli/t-", 6, NULL, NULL);
    put_small("cli/t-003.idx", 1);
    const char *ls[] = {"ls", "s3://bucket/cli/t-{005..000}.tar", NULL};
    cr_assert_eq(cli_run("ls", ls), 0, "%s", cli_output("ls", "err"));
    const char *out = cli_output("ls", "out");
    cr_expect_eq(count_lines(out), 6, "%s", out);
    const char *at = out;
    for (int i = 5; i >= 0; i--) {
        char line[64];
        snprintf(line, sizeof(line), "%12d  cli/t-%03d.tar\n", 100 + i, i);
        const char *hit = strstr(out, line);
        cr_expect(hit && hit >= at, "'%s' missing or out of order in:\n%s", line, out);
        if (hit)
            at = hit;
    }
    cr_expect_null(strstr(out, "t-003.idx"));

    const char *js[] = {"ls", "--json", "s3://bucket/cli/t-{000..005}.tar", NULL};
    cr_assert_eq(cli_run("lsj", js), 0, "%s", cli_output("lsj", "err"));
    cJSON *arr = cJSON_Parse(cli_output("lsj", "out"));
    cr_assert(cJSON_IsArray(arr));
    cr_assert_eq(cJSON_GetArraySize(arr), 6);
    for (int i = 0; i < 6; i++) {
        const cJSON *o = cJSON_GetArrayItem(arr, i);
        cr_expect_eq(jnum(o, "size", NULL, NULL), 100 + i);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "etag");
        cr_expect(cJSON_IsString(e) && strlen(e->valuestring) == 34);
    }
    cJSON_Delete(arr);

    /* a plain prefix is still listed, grouped at '/' */
    put_small("cli/sub/x.bin", 3);
    const char *pre[] = {"ls", "s3://bucket/cli/", NULL};
    cr_assert_eq(cli_run("pre", pre), 0, "%s", cli_output("pre", "err"));
    out = cli_output("pre", "out");
    cr_expect_eq(count_lines(out), 8, "%s", out);
    cr_expect(strstr(out, "PRE  cli/sub/"), "%s", out);
    cr_expect(strstr(out, "cli/t-003.idx"), "%s", out);
}

Test(s3, cli_stat_of_a_pattern_and_of_several_urls)
{
    start_mock(NULL);
    char etags[6][35];
    put_shards("cli/t-", 6, NULL, etags);
    const char *st[] = {"stat", "s3://bucket/cli/t-{000..005}.tar", NULL};
    cr_assert_eq(cli_run("stat", st), 0, "%s", cli_output("stat", "err"));
    const char *out = cli_output("stat", "out");
    for (int i = 0; i < 6; i++) {
        char want[400];
        snprintf(want, sizeof(want),
                 "url:           s3://bucket/cli/t-%03d.tar\nsize:          %d\n"
                 "etag:          %s\n",
                 i, 100 + i, etags[i]);
        cr_expect(strstr(out, want), "no block for %d in:\n%s", i, out);
    }

    const char *two[] = {"stat", "--json", "s3://bucket/cli/t-004.tar",
                         "s3://bucket/cli/t-{001,002}.tar", NULL};
    cr_assert_eq(cli_run("two", two), 0, "%s", cli_output("two", "err"));
    cJSON *arr = cJSON_Parse(cli_output("two", "out"));
    cr_assert(cJSON_IsArray(arr));
    cr_assert_eq(cJSON_GetArraySize(arr), 3);
    cr_expect_eq(jnum(cJSON_GetArrayItem(arr, 0), "size", NULL, NULL), 104);
    cr_expect_eq(jnum(cJSON_GetArrayItem(arr, 1), "size", NULL, NULL), 101);
    cr_expect_eq(jnum(cJSON_GetArrayItem(arr, 2), "size", NULL, NULL), 102);
    cJSON_Delete(arr);

    /* one plain URL: one JSON object, as before */
    const char *one[] = {"stat", "--json", "s3://bucket/cli/t-003.tar", NULL};
    cr_assert_eq(cli_run("one", one), 0, "%s", cli_output("one", "err"));
    cJSON *o = cJSON_Parse(cli_output("one", "out"));
    cr_assert(cJSON_IsObject(o));
    cr_expect_eq(jnum(o, "size", NULL, NULL), 103);
    cJSON_Delete(o);
}

Test(s3, cli_ls_and_stat_of_a_pattern_with_a_missing_object_exit_1)
{
    start_mock(NULL);
    int skip[] = {3, -1};
    put_shards("cli/t-", 6, skip, NULL);
    const char *cmds[] = {"ls", "stat"};
    for (int c = 0; c < 2; c++) {
        const char *args[] = {cmds[c], "s3://bucket/cli/t-{000..005}.tar", NULL};
        cr_assert_eq(cli_run(cmds[c], args), 1, "%s", cmds[c]);
        cr_expect_str_eq(cli_output(cmds[c], "out"), "", "%s printed objects", cmds[c]);
        const char *err = cli_output(cmds[c], "err");
        cr_expect(strstr(err, "s3://bucket/cli/t-003.tar"), "%s: %s", cmds[c], err);
        cr_expect(strstr(err, "SF_ERR_NOT_FOUND"), "%s: %s", cmds[c], err);
    }
    /* a plain missing key and a bad pattern */
    const char *one[] = {"stat", "s3://bucket/cli/t-003.tar", NULL};
    cr_expect_eq(cli_run("one", one), 1);
    cr_expect(strstr(cli_output("one", "err"), "s3://bucket/cli/t-003.tar"), "%s",
              cli_output("one", "err"));
    const char *bad[] = {"ls", "s3://bucket/cli/t-{000..", NULL};
    cr_expect_eq(cli_run("bad", bad), 1);
    cr_expect(strstr(cli_output("bad", "err"), "SF_ERR_INVALID_ARGUMENT"), "%s",
              cli_output("bad", "err"));
}

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
    struct sf_s3_options o;
    opts_init(&o);
    o.access_key_id = o.secret_access_key = NULL;
    o.no_sign_request = 1;
    client(&o);
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
    struct sf_s3_options o;
    opts_init(&o);
    o.access_key_id = o.secret_access_key = NULL;
    o.no_sign_request = 1;
    client(&o);
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
    struct sf_s3_options o;
    opts_init(&o);
    o.access_key_id = o.secret_access_key = NULL;
    o.no_sign_request = 1;
    client(&o);
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

/* ============================================================ CLI: option parsing */

Test(s3, cli_a_missing_option_value_names_the_option)
{
    start_mock(NULL);
    put_small("k", 10);
    const char *conc[] = {"get", "s3://bucket/k", "--concurrency", NULL};
    cr_expect_eq(cli_run("conc", conc), 2);
    const char *err = cli_output("conc", "err");
    cr_expect(strstr(err, "'--concurrency'") && strstr(err, "missing"), "%s", err);
    cr_expect_null(strstr(err, "unknown option"), "%s", err);
    const char *out[] = {"get", "s3://bucket/k", "-o", NULL};
    cr_expect_eq(cli_run("out", out), 2);
    err = cli_output("out", "err");
    cr_expect(strstr(err, "'-o'") && strstr(err, "missing"), "%s", err);
    /* a flag given a value, and an option that does not exist */
    const char *flag[] = {"ls", "s3://bucket/", "--json=yes", NULL};
    cr_expect_eq(cli_run("flag", flag), 2);
    err = cli_output("flag", "err");
    cr_expect(strstr(err, "'--json=yes'") && strstr(err, "takes no value"), "%s", err);
    const char *unk[] = {"ls", "s3://bucket/", "--colour", NULL};
    cr_expect_eq(cli_run("unk", unk), 2);
    err = cli_output("unk", "err");
    cr_expect(strstr(err, "unknown option '--colour'"), "%s", err);
    /* a value the command's own option refuses is bad usage too */
    const char *warm[] = {"warm-cache", "s3://bucket/k", "--max-objects", "0", NULL};
    cr_expect_eq(cli_run("warm", warm), 2, "%s", cli_output("warm", "err"));
}

Test(s3, cli_global_options_before_the_command)
{
    start_mock(NULL);
    put_small("g/k.bin", 42);
    char eq[128];
    snprintf(eq, sizeof(eq), "--endpoint-url=%s", srv.url);
    const char *ls[] = {SF_CLI_BIN, "--endpoint-url", srv.url, "ls", "s3://bucket/g/", NULL};
    cr_assert_eq(cli_run_argv("ls", ls), 0, "%s", cli_output("ls", "err"));
    cr_expect(strstr(cli_output("ls", "out"), "42  g/k.bin"), "%s", cli_output("ls", "out"));
    /* both orders at once, the = form, flags and a short option with its value */
    char dest[800];
    snprintf(dest, sizeof(dest), "%s/k.copy", tmp);
    const char *get[] = {
        SF_CLI_BIN, eq, "--json", "-o", dest, "get", "--concurrency", "2", "s3://bucket/g/k.bin",
        NULL};
    cr_assert_eq(cli_run_argv("get", get), 0, "%s", cli_output("get", "err"));
    struct stat sb;
    cr_expect(stat(dest, &sb) == 0 && sb.st_size == 42);
    cJSON *j = cJSON_Parse(cli_output("get", "out"));
    cr_expect(cJSON_IsObject(j), "%s", cli_output("get", "out"));
    cJSON_Delete(j);
    const char *stat_[] = {SF_CLI_BIN,  "-v",   "--endpoint-url",      srv.url, "--region",
                           "us-east-1", "stat", "s3://bucket/g/k.bin", NULL};
    cr_expect_eq(cli_run_argv("stat", stat_), 0, "%s", cli_output("stat", "err"));
    /* a command's own option before the command, and nothing after the options */
    const char *own[] = {SF_CLI_BIN, "--batch-size", "8", "load", "s3://bucket/g/", NULL};
    cr_expect_eq(cli_run_argv("own", own), 2);
    cr_expect(strstr(cli_output("own", "err"), "'--batch-size'"), "%s", cli_output("own", "err"));
    const char *none[] = {SF_CLI_BIN, "--endpoint-url", srv.url, NULL};
    cr_expect_eq(cli_run_argv("none", none), 2);
    const char *gap[] = {SF_CLI_BIN, "--endpoint-url", NULL};
    cr_expect_eq(cli_run_argv("gap", gap), 2);
    cr_expect(strstr(cli_output("gap", "err"), "missing"), "%s", cli_output("gap", "err"));
}

/* ============================================================ CLI: get to a file on stdout */

/* A download into a regular file on stdout whose every body is cut: ranges
 * land in place, so before the fix the file had the object's full size
 * (holes and all) and looked complete. It is cut back to where it began. */
Test(s3, cli_failed_get_to_a_file_on_stdout_leaves_nothing_that_looks_complete)
{
    const char *faults[] = {"--fault", "prefix=bucket/big,reset=1", NULL};
    start_mock(faults);
    free(put_object("big.bin", 2u << 20, 9));
    char path[800];
    snprintf(path, sizeof(path), "%s/out.bin", tmp);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* stdout opened without O_APPEND, 6 bytes in: the object goes after them */
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fe = open("/dev/null", O_WRONLY);
        if (fd < 0 || fe < 0 || write(fd, "before", 6) != 6 || dup2(fd, 1) < 0 || dup2(fe, 2) < 0)
            _exit(126);
        const char *argv[] = {SF_CLI_BIN,       "get", "--endpoint-url",      srv.url,
                              "--max-attempts", "2",   "--chunk-size",        "256K",
                              "--concurrency",  "4",   "s3://bucket/big.bin", NULL};
        execv(SF_CLI_BIN, (char *const *)argv);
        _exit(127);
    }
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
    struct stat sb;
    cr_assert(stat(path, &sb) == 0);
    cr_expect_eq(sb.st_size, 6, "the failed download left a %lld-byte file", (long long)sb.st_size);
    char head[8] = "";
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    cr_expect_eq(fread(head, 1, 6, f), 6);
    fclose(f);
    cr_expect(memcmp(head, "before", 6) == 0, "the bytes before the download were lost");
}

/* ============================================================ CLI: --json on failure */

/* The whole of stdout is one JSON object with "ok": false and an "error"
 * holding want; returns it (to delete). */
static cJSON *one_failure_object(const char *out, const char *want)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(out, &end, 0);
    cr_assert(cJSON_IsObject(j), "not a JSON object: '%s'", out);
    cr_assert(end && strspn(end, " \n") == strlen(end), "more than one JSON document: '%s'", out);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(j, "ok");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    cr_expect(cJSON_IsFalse(ok), "%s", out);
    cr_expect(cJSON_IsString(e) && strstr(e->valuestring, want), "no '%s' in: %s", want, out);
    return j;
}

Test(s3, cli_json_failure_is_always_one_object_with_the_error)
{
    start_mock(NULL);
    put_small("j/a.bin", 7);
    const char *ls[] = {"ls", "--json", "s3://bucket/j/x-{1..2}.bin", NULL};
    cr_expect_eq(cli_run("ls", ls), 1);
    cJSON_Delete(one_failure_object(cli_output("ls", "out"), "s3://bucket/j/x-1.bin"));

    const char *stat_[] = {"stat", "--json", "s3://bucket/j/a.bin", "s3://bucket/j/gone.bin", NULL};
    cr_expect_eq(cli_run("stat", stat_), 1);
    cJSON *j = one_failure_object(cli_output("stat", "out"), "s3://bucket/j/gone.bin");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "status");
    cr_expect(cJSON_IsString(st) && !strcmp(st->valuestring, "SF_ERR_NOT_FOUND"));
    /* what did succeed is still there */
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "results")), 1);
    cJSON_Delete(j);

    const char *get[] = {"get", "--json", "s3://bucket/j/gone.bin", NULL};
    cr_expect_eq(cli_run("get", get), 1);
    cJSON_Delete(one_failure_object(cli_output("get", "out"), "NoSuchKey"));

    /* failures before any request: the client cannot be made, bad usage */
    const char *prof[] = {"ls", "--json", "--profile", "nosuch", "s3://bucket/", NULL};
    cr_expect_eq(cli_run("prof", prof), 1);
    cJSON_Delete(one_failure_object(cli_output("prof", "out"), "nosuch"));
    const char *usage[] = {"stat", "--json", NULL};
    cr_expect_eq(cli_run("usage", usage), 2);
    cJSON_Delete(one_failure_object(cli_output("usage", "out"), "at least one URL"));

    /* success is unchanged: the object itself */
    const char *ok[] = {"stat", "--json", "s3://bucket/j/a.bin", NULL};
    cr_expect_eq(cli_run("ok", ok), 0);
    j = cJSON_Parse(cli_output("ok", "out"));
    cr_expect_eq(jnum(j, "size", NULL, NULL), 7);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "ok"));
    cJSON_Delete(j);
}
