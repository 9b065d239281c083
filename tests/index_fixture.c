/* The index suite's fixture (index_fixture.h). */
#include "index_fixture.h"
#include "shardfeed.h"
#include "src/index_json.h"
#include "support/files.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

char *tmp;
char bucket[800];
struct mock_proc srv;
struct sf_s3 *s3;

void index_setup(void)
{
    char root[700];
    tmp = mock_env_root(root, sizeof(root));
    snprintf(bucket, sizeof(bucket), "%s/bucket", root);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
}

void index_teardown(void)
{
    mock_env_stop(&srv, &tmp, &s3);
    memset(&srv, 0, sizeof(srv));
}

uint64_t file_xxh3(const char *path, size_t *size)
{
    unsigned char *b = test_load(path, size);
    uint64_t h = XXH3_64bits(b, *size);
    free(b);
    return h;
}

const cJSON *jget(const cJSON *j, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    cr_assert(x, "no '%s'", name);
    return x;
}

void in_bucket(char *out, size_t n, const char *rel)
{
    int r = snprintf(out, n, "%s/%s", bucket, rel);
    cr_assert(r > 0 && (size_t)r < n);
}

void mkdirs(const char *dir)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s", dir);
    for (char *s = strchr(p + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(p, 0755);
        *s = '/';
    }
    mkdir(p, 0755);
}

void put_random(const char *dir, const char *rel, size_t size, unsigned seed)
{
    mkdirs(dir);
    unsigned char *b = malloc(size ? size : 1);
    cr_assert(b);
    test_fill(b, size, seed);
    cr_assert_eq(test_write_file(dir, rel, b, size), 0, "%s/%s", dir, rel);
    free(b);
}

void put_sample(const char *dir, const char *stem, size_t size, unsigned seed, const char *ext1,
                const char *text1, const char *ext2, const char *text2)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "%s.jpg", stem);
    put_random(dir, rel, size, seed);
    snprintf(rel, sizeof(rel), "%s.%s", stem, ext1);
    cr_assert_eq(test_write_file(dir, rel, text1, strlen(text1)), 0);
    if (ext2) {
        snprintf(rel, sizeof(rel), "%s.%s", stem, ext2);
        cr_assert_eq(test_write_file(dir, rel, text2, strlen(text2)), 0);
    }
}

void start_mock(const char *const *extra)
{
    char root[800];
    snprintf(root, sizeof(root), "%s/root", tmp);
    mock_env_start(&srv, root, extra);
    struct sf_s3_options so;
    mock_env_s3_fast(&so, srv.url, 8, 1 << 20);
    so.retry_cap_ms = 100;
    so.retry_quota = 100000;
    so.max_attempts = 20;
    s3 = mock_env_s3_new(&so);
}

double mock_stat(const char *group, const char *name)
{
    cJSON *j = mock_env_stats(&srv);
    double n = mock_env_jnum(j, group ? group : name, group ? name : NULL, NULL, NULL);
    cJSON_Delete(j);
    return n;
}

sf_status run_index(const char *source, const struct sf_index_options *o,
                    struct sf_index_result *res, cJSON **json, char *err, size_t err_len)
{
    const char *sources[] = {source};
    sf_status st = sf_index_shards(s3, sources, 1, o, res, err, err_len);
    if (json)
        *json = st == SF_OK ? cJSON_Parse(res->json) : NULL;
    if (st == SF_OK)
        cr_assert(json == NULL || *json, "not JSON: %s", res->json);
    return st;
}

/* The object at url through the engine, as a NUL-terminated string. */
char *get_text(const char *url)
{
    struct sf_fetch *f = NULL;
    cr_assert_eq(sf_fetch_start(s3, url, NULL, &f), SF_OK, "%s", url);
    struct sf_fetch_progress p;
    sf_status st = sf_fetch_wait(f, ~0ull, -1, &p);
    cr_assert_eq(st, SF_OK, "%s: %s", url, sf_fetch_errmsg(f));
    char *s = malloc(p.total + 1);
    cr_assert(s);
    memcpy(s, sf_fetch_data(f), p.total);
    s[p.total] = '\0';
    sf_fetch_destroy(f);
    return s;
}

void make_flat(const char *dir, int n, size_t jpg_base)
{
    for (int i = 0; i < n; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "%06d.jpg", i);
        put_random(dir, rel, jpg_base + (size_t)i * 997 % 9000, (unsigned)i + 1);
        snprintf(rel, sizeof(rel), "%06d.txt", i);
        char text[2048]; /* compressible: zstd records shrink */
        int len = 0;
        while (len < 1500)
            len += snprintf(text + len, sizeof(text) - (size_t)len, "caption %d, ", i);
        cr_assert_eq(test_write_file(dir, rel, text, (size_t)len), 0);
        if (i % 3 == 0) {
            snprintf(rel, sizeof(rel), "%06d.seg.png", i);
            put_random(dir, rel, 700, (unsigned)i + 500);
        }
    }
}

void expect_same_as_pack(const cJSON *mine, const cJSON *pack)
{
    cr_expect_str_eq(test_jstr(mine, "format"), test_jstr(pack, "format"));
    cr_expect_str_eq(test_jstr(mine, "compression"), test_jstr(pack, "compression"));
    cr_expect_str_eq(test_jstr(mine, "checksum"), "xxh3_64");
    cr_expect_eq(test_jnum(mine, "version"), 1);
    cr_expect_eq(test_jnum(mine, "shard_count"), test_jnum(pack, "shard_count"));
    cr_expect_eq(test_jnum(mine, "sample_count"), test_jnum(pack, "sample_count"));
    cr_expect_eq(test_jnum(mine, "bytes"), test_jnum(pack, "bytes"));
    const cJSON *a = jget(mine, "shards"), *b = jget(pack, "shards");
    cr_assert_eq(cJSON_GetArraySize(a), cJSON_GetArraySize(b));
    for (int i = 0; i < cJSON_GetArraySize(a); i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i), *y = cJSON_GetArrayItem(b, i);
        cr_expect_str_eq(test_jstr(x, "name"), test_jstr(y, "name"));
        cr_expect_eq(test_jnum(x, "bytes"), test_jnum(y, "bytes"), "%s", test_jstr(y, "name"));
        cr_expect_eq(test_jnum(x, "samples"), test_jnum(y, "samples"), "%s", test_jstr(y, "name"));
        cr_expect_str_eq(test_jstr(x, "xxh3_64"), test_jstr(y, "xxh3_64"), "%s",
                         test_jstr(y, "name"));
    }
    cr_expect(cJSON_Compare(jget(mine, "fields"), jget(pack, "fields"), 1), "fields differ");
}

void expect_loader_counts(const char *json, const char *source, const cJSON *shards)
{
    struct sf_object_list *l = NULL;
    cr_assert_eq(sf_s3_expand(s3, source, 0, &l), SF_OK);
    size_t n = 0;
    const struct sf_object_info *objs[64];
    for (size_t i = 0; i < sf_object_list_count(l); i++) {
        const struct sf_object_info *o = sf_object_list_get(l, i);
        size_t k = strlen(o->key);
        if (k > 4 && (!strcmp(o->key + k - 4, ".tar") || !strcmp(o->key + k - 4, ".sfr"))) {
            cr_assert_lt(n, 64u);
            objs[n++] = o;
        }
    }
    cr_assert_eq((int)n, cJSON_GetArraySize(shards));
    uint64_t counts[64];
    int all = 0;
    char err[256] = "";
    cr_expect_eq(sf__index_json_counts(json, NULL, objs, n, counts, &all, err, sizeof err), SF_OK,
                 "%s", err);
    cr_expect_eq(all, 1, "the loader does not take its counts from the index");
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(counts[i], test_jnum(cJSON_GetArrayItem(shards, (int)i), "samples"));
    sf_object_list_destroy(l);
}
