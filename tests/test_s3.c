/* The S3 client (sf_s3_new, stat, list, expand, expand_stat and
 * configuration) and the CLI's ls and stat of patterns, against the mock S3
 * server: every test starts its own server on a free port with a
 * fresh root and stops it; the mock's statistics count the requests.
 *
 * Suite `s3`, one executable: this file (stat, list, expand, expand_stat),
 * test_s3_config.c (configuration, keys as signed) and test_s3_cli.c (the
 * CLI's ls, stat, get and options), over s3_fixture.c. */
#include "s3_fixture.h"

#include "shardfeed.h"
#include "support/canned_http.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(s3, .fini = s3_teardown, .timeout = 60);

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
    local_client();
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

/* The mock and a client, and 2500 objects many/k-NNNNN.bin of i % 7 bytes. */
static void mock_with_many(void)
{
    start_mock(NULL);
    default_client();
    for (int i = 0; i < 2500; i++) {
        char rel[80];
        snprintf(rel, sizeof(rel), "bucket/many/k-%05d.bin", i);
        cr_assert(test_write_file(root, rel, "xxxxxxx", (size_t)(i % 7)) == 0);
    }
}

Test(s3, list_of_2500_keys_takes_three_pages)
{
    mock_with_many();
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

    expect_no_request_refused();
    free(data);
}

/* Appends five folders of 100 'é' each (1005 bytes): 200 bytes a segment,
 * under NAME_MAX. */
static void append_five_long_segments(char *s)
{
    for (int seg = 0; seg < 5; seg++) {
        for (int i = 0; i < 100; i++)
            strcat(s, "\xc3\xa9");
        strcat(s, "/");
    }
}

/* The longest key S3 takes, 1024 bytes (multi-byte UTF-8 and the characters
 * a URL treats specially, each encoded in the path, the signature and the
 * listing's start-after), works for put, stat, get, ls and the checked
 * expansion; one byte more is refused before any request, naming the limit. */
Test(s3, a_1024_byte_key_works_everywhere_and_1025_is_refused)
{
    start_mock(NULL);
    default_client();
    char key[1100] = "";
    append_five_long_segments(key);
    strcat(key, "+ %~=&?#;x-0123.bin");
    cr_assert_eq(strlen(key), 1024);
    size_t n = 300 * 1024 + 1; /* two ranges */
    unsigned char *data = malloc(n);
    cr_assert(data);
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(i * 131 + 7);
    char url[1200];
    snprintf(url, sizeof(url), "s3://bucket/%s", key);
    char etag[128];
    cr_assert_eq(sf_s3_put(s3, url, NULL, data, n, etag, sizeof(etag)), SF_OK, "%s", errmsg());

    struct sf_object_info info;
    cr_expect_eq(sf_s3_stat(s3, url, &info), SF_OK, "%s", errmsg());
    cr_expect_eq(info.size, n);
    cr_expect_str_eq(info.etag, etag);
    sf_object_info_clear(&info);
    cr_expect_eq(fetch_whole(url, data, n), SF_OK, "%s", errmsg());

    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_list(s3, "s3://bucket/", SF_LIST_RECURSIVE, 0, &l), SF_OK, "%s", errmsg());
    cr_assert_eq(sf_object_list_count(l), 1);
    cr_expect_str_eq(sf_object_list_get(l, 0)->key, key);
    sf_object_list_destroy(l);

    /* more than SF_EXPAND_HEAD_MAX keys: a listing from start-after */
    for (int i = 1; i < 5; i++) {
        char other[1200];
        snprintf(other, sizeof(other), "s3://bucket/%.1016s%d.bin", key, i);
        cr_assert_eq(sf_s3_put(s3, other, NULL, "abc", 3, NULL, 0), SF_OK, "%s", errmsg());
    }
    char pattern[1300];
    snprintf(pattern, sizeof(pattern), "s3://bucket/%.1016s{0123,1,2,3,4}.bin", key);
    cr_expect_eq(sf_s3_expand_stat(s3, pattern, 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 5);
    if (sf_object_list_count(l) == 5) {
        cr_expect_eq(sf_object_list_get(l, 0)->size, n);
        cr_expect_str_eq(sf_object_list_get(l, 0)->etag, etag);
        cr_expect_eq(sf_object_list_get(l, 4)->size, 3);
    }
    sf_object_list_destroy(l);

    char longer[1300];
    snprintf(longer, sizeof(longer), "%sx", url);
    expect_stat_fails(longer, SF_ERR_INVALID_ARGUMENT,
                      (const char *const[]){"longer than 1024 bytes", NULL});
    expect_no_request_refused();
    free(data);
}

/* A message about a key near S3's 1024-byte limit keeps what went wrong:
 * the name came first and whole, and the status, the S3 code and the
 * range fell off the end of the message buffer ("HTTP 404" was lost). Long
 * names are shortened in the middle, their start and end kept. */
Test(s3, a_message_about_a_long_key_keeps_its_status)
{
    start_mock(NULL);
    default_client();
    char url[1200] = "s3://bucket/";
    append_five_long_segments(url);
    strcat(url, "missing-0123456.bin");
    expect_stat_fails(url, SF_ERR_NOT_FOUND,
                      (const char *const[]){"HTTP 404", "missing-0123456.bin", NULL});
    cr_expect_eq(strncmp(errmsg(), "s3://bucket/\xc3\xa9", 14), 0, "message: %s", errmsg());

    expect_fetch_fails(url, SF_ERR_NOT_FOUND, (const char *const[]){"NoSuchKey", "bytes 0-", NULL});
}

/* ============================================================ expand */

typedef sf_status (*expand_fn)(struct sf_s3 *, const char *, size_t, struct sf_object_list **);

/* fn (sf_s3_expand or sf_s3_expand_stat) of source, uncapped, gives n objects. */
static struct sf_object_list *expanded(expand_fn fn, const char *source, size_t n)
{
    struct sf_object_list *l = NULL;
    sf_status st = fn(s3, source, 0, &l);
    cr_assert_eq(st, SF_OK, "%s: %s: %s", source, sf_status_name(st), errmsg());
    cr_assert_eq(sf_object_list_count(l), n, "%s", source);
    return l;
}

Test(s3, expand_brace_patterns_without_network)
{
    start_mock(NULL);
    default_client();
    struct sf_object_list *l = expanded(sf_s3_expand, "s3://bucket/train-{000..009}.tar", 10);
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
    struct sf_object_list *l = expanded(sf_s3_expand, "s3://bucket/ds/", 3);
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
    l = expanded(sf_s3_expand, "s3://bucket/ds/a.tar", 1);
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

/* The n objects of l are the files tmp/rels[i], in that order, of sizes[i] bytes. */
static void expect_local_objects(const struct sf_object_list *l, const char *const *rels,
                                 const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char want[800];
        snprintf(want, sizeof(want), "%s/%s", tmp, rels[i]);
        const struct sf_object_info *it = sf_object_list_get(l, i);
        cr_expect_str_eq(it->key, want);
        cr_expect_eq(it->size, sizes[i], "%s", want);
    }
}

Test(s3, expand_a_local_directory_sorted_and_recursive)
{
    local_client();
    const char *rels[] = {"local/z/y/x.bin", "local/b.bin", "local/a/c.bin", "local/a/b.bin"};
    for (size_t i = 0; i < 4; i++)
        cr_assert(test_write_file(tmp, rels[i], "abcdefgh", i + 1) == 0);
    const char *sorted[] = {"local/a/b.bin", "local/a/c.bin", "local/b.bin", "local/z/y/x.bin"};
    const size_t sizes[] = {4, 3, 2, 1};
    char dir[700];
    snprintf(dir, sizeof(dir), "%s/local/", tmp);
    struct sf_object_list *l = expanded(sf_s3_expand, dir, 4);
    expect_local_objects(l, sorted, sizes, 4);
    sf_object_list_destroy(l);

    /* file:// of the directory, and of one file */
    char url[720];
    snprintf(url, sizeof(url), "file://%s/local", tmp);
    cr_assert_eq(sf_s3_expand(s3, url, 0, &l), SF_OK, "%s", errmsg());
    cr_expect_eq(sf_object_list_count(l), 4);
    sf_object_list_destroy(l);
    snprintf(url, sizeof(url), "file://%s/local/b.bin", tmp);
    l = expanded(sf_s3_expand, url, 1);
    cr_expect_eq(sf_object_list_get(l, 0)->size, 2);
    sf_object_list_destroy(l);

    cr_expect_eq(sf_s3_expand(s3, dir, 3, &l), SF_ERR_LIMIT);
    snprintf(dir, sizeof(dir), "%s/nope/", tmp);
    cr_expect_eq(sf_s3_expand(s3, dir, 0, &l), SF_ERR_NOT_FOUND);
}

/* ============================================================ expand_stat */

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
    struct sf_object_list *l =
        expanded(sf_s3_expand_stat, "s3://bucket/ds/{b,a}/t-{010..002}.tar", 18);
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
    l = expanded(sf_s3_expand_stat, "s3://bucket/few/t-004.tar", 1);
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

    /* a pattern near the key limit: both names are shortened in the middle,
     * so the message still ends with what it says (it was cut before "are
     * missing") */
    char longpat[1100], dirs[901];
    memset(dirs, 'd', 900);
    dirs[900] = '\0';
    snprintf(longpat, sizeof(longpat), "s3://bucket/gap/%s-{000..003}.tar", dirs);
    st = sf_s3_expand_stat(s3, longpat, 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    cr_expect(strstr(errmsg(), "4 of the 4 objects of s3://bucket/gap/dddd"), "message: %s",
              errmsg());
    cr_expect(strstr(errmsg(), "dddd-{000..003}.tar are missing)"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "dddd-000.tar: no such object"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "ddd...ddd"), "message: %s", errmsg());

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
    mock_with_many();
    struct sf_object_list *l =
        expanded(sf_s3_expand_stat, "s3://bucket/many/k-{00000..02499}.bin", 2500);
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
    sf_status st = sf_s3_expand_stat(s3, "s3://bucket/many/k-{00000..02499}.bin", 0, &l);
    cr_expect_eq(st, SF_ERR_NOT_FOUND);
    cr_expect(strstr(errmsg(), "s3://bucket/many/k-01234.bin"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "1 of the 2500"), "message: %s", errmsg());
}

Test(s3, expand_stat_of_a_local_pattern)
{
    local_client();
    for (int i = 0; i < 6; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "loc/s-%d.bin", i);
        cr_assert(test_write_file(tmp, rel, "abcdefgh", (size_t)i + 1) == 0);
    }
    char pat[800];
    snprintf(pat, sizeof(pat), "%s/loc/s-{5..0}.bin", tmp);
    struct sf_object_list *l = expanded(sf_s3_expand_stat, pat, 6);
    const char *in_order[] = {"loc/s-5.bin", "loc/s-4.bin", "loc/s-3.bin",
                              "loc/s-2.bin", "loc/s-1.bin", "loc/s-0.bin"};
    const size_t sizes[] = {6, 5, 4, 3, 2, 1};
    expect_local_objects(l, in_order, sizes, 6);
    for (size_t i = 0; i < 6; i++)
        cr_expect_gt(sf_object_list_get(l, i)->last_modified, 0);
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
    unsigned_client();
    char pat[200];
    snprintf(pat, sizeof(pat), "%s/bucket/web/{b,a}.bin", srv.url);
    struct sf_object_list *l = expanded(sf_s3_expand_stat, pat, 2);
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

/* ============================================================ a listing that never advances */

/* What a buggy S3-compatible store answers to every listing, whatever was
 * asked: a truncated page with one key and the same continuation token. */
#define STUCK_PAGE_BODY                                                                            \
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"                                                   \
    "<ListBucketResult><Name>bucket</Name><Prefix></Prefix><KeyCount>1</KeyCount>"                 \
    "<IsTruncated>true</IsTruncated><NextContinuationToken>same</NextContinuationToken>"           \
    "<Contents><Key>loop/k-00</Key><Size>3</Size><ETag>&quot;0123&quot;</ETag>"                    \
    "<LastModified>2024-01-01T00:00:00.000Z</LastModified></Contents>"                             \
    "</ListBucketResult>"

/* Before the fix both listings asked for the same page for ever, the list
 * growing without bound: the repeated token (ls) and a start-after that
 * does not move (expand_stat) are errors naming the listing. */
Test(s3, a_listing_that_repeats_its_page_is_an_error_not_a_loop)
{
    make_root();
    char answer[1024];
    snprintf(answer, sizeof(answer),
             "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n%s",
             sizeof(STUCK_PAGE_BODY) - 1, STUCK_PAGE_BODY);
    const char *const answers[] = {answer};
    struct canned_http sl;
    canned_http_start(&sl, answers, 1);
    struct sf_s3_options o;
    mock_env_s3_options(&o, sl.url);
    client(&o);

    struct sf_object_list *l = NULL;
    sf_status st = sf_s3_list(s3, "s3://bucket/loop/", SF_LIST_RECURSIVE, 0, &l);
    cr_expect_eq(st, SF_ERR_PARSE, "%s: %s", sf_status_name(st), errmsg());
    cr_expect_null(l);
    cr_expect(strstr(errmsg(), "s3://bucket/loop/"), "message: %s", errmsg());
    cr_expect(strstr(errmsg(), "continuation token"), "message: %s", errmsg());
    cr_expect_leq(canned_http_requests(&sl), 2);

    /* more keys than SF_EXPAND_HEAD_MAX: checked with start-after listings */
    size_t before = canned_http_requests(&sl);
    st = sf_s3_expand_stat(s3, "s3://bucket/loop/k-{00..09}", 0, &l);
    cr_expect_eq(st, SF_ERR_PARSE, "%s: %s", sf_status_name(st), errmsg());
    cr_expect_null(l);
    cr_expect(strstr(errmsg(), "s3://bucket/loop/k-0"), "message: %s", errmsg());
    cr_expect_leq(canned_http_requests(&sl) - before, 2);
    sf_s3_destroy(s3);
    s3 = NULL;
    canned_http_stop(&sl);
}
