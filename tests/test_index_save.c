/* sf_index_result_save: where an index.json goes (a local file renamed into
 * place, an S3 object, never http). */
#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* These tests belong to the index suite (test_index.c runs its setup); each
 * keeps its own temporary root, and a server only where it needs one. */
struct save_env {
    char *tmp;
    char root[700];
    struct mock_proc srv;
    struct sf_s3 *s3;
};

static void env_begin(struct save_env *e)
{
    memset(e, 0, sizeof(*e));
    e->tmp = mock_env_root(e->root, sizeof(e->root));
}

static void env_end(struct save_env *e)
{
    mock_env_stop(&e->srv, &e->tmp, &e->s3);
}

static const char json[] = "{\"shards\": []}\n";

static struct sf_index_result result_for(char *url)
{
    struct sf_index_result r;
    memset(&r, 0, sizeof(r));
    r.json = (char *)json;
    r.json_len = sizeof(json) - 1;
    r.index_url = url;
    return r;
}

/* The number of entries of dir other than . and .. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    static char buf[256];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(index, save_to_a_local_path_writes_the_whole_text_and_leaves_no_temporary_file)
{
    struct save_env e;
    env_begin(&e);
    char dir[800], path[900], url[920];
    snprintf(dir, sizeof(dir), "%s/bucket", e.root);
    snprintf(path, sizeof(path), "%s/index.json", dir);
    FILE *old = fopen(path, "w");
    cr_assert(old);
    fputs("an older, longer index that the new one replaces whole\n", old);
    fclose(old);
    struct sf_index_result r = result_for(path);
    char err[512] = "";
    cr_assert_eq(sf_index_result_save(NULL, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_str_eq(read_text(path), json);
    cr_expect_eq(entries(dir), 1, "only index.json is left in %s", dir);
    snprintf(url, sizeof(url), "file://%s", path);
    r = result_for(url);
    cr_assert_eq(sf_index_result_save(NULL, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_str_eq(read_text(path), json);
    env_end(&e);
}

Test(index, save_into_a_missing_folder_is_not_found_and_named)
{
    struct save_env e;
    env_begin(&e);
    char path[900];
    snprintf(path, sizeof(path), "%s/no-such-folder/index.json", e.root);
    struct sf_index_result r = result_for(path);
    char err[1024] = "";
    cr_expect_eq(sf_index_result_save(NULL, &r, err, sizeof(err)), SF_ERR_NOT_FOUND);
    cr_expect(strstr(err, "no-such-folder") && strstr(err, "cannot create"), "%s", err);
    env_end(&e);
}

Test(index, save_over_http_or_to_s3_without_a_client_is_refused)
{
    struct sf_index_result r = result_for("https://example.com/x/index.json");
    char err[512] = "";
    cr_expect_eq(sf_index_result_save(NULL, &r, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "https://example.com/x/index.json"), "%s", err);
    r = result_for("s3://bucket/index.json");
    cr_expect_eq(sf_index_result_save(NULL, &r, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "s3://bucket/index.json"), "%s", err);
    cr_expect_eq(sf_index_result_save(NULL, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
}

Test(index, save_to_an_s3_url_is_one_put_and_a_missing_bucket_is_named)
{
    struct save_env e;
    env_begin(&e);
    mock_env_start(&e.srv, e.root, NULL);
    struct sf_s3_options so;
    mock_env_s3_options(&so, e.srv.url);
    e.s3 = mock_env_s3_new(&so);
    struct sf_index_result r = result_for("s3://bucket/train/index.json");
    char err[1024] = "", path[900];
    cr_assert_eq(sf_index_result_save(e.s3, &r, err, sizeof(err)), SF_OK, "%s", err);
    snprintf(path, sizeof(path), "%s/bucket/train/index.json", e.root);
    cr_expect_str_eq(read_text(path), json);
    r = result_for("s3://no-such-bucket/index.json");
    cr_expect_neq(sf_index_result_save(e.s3, &r, err, sizeof(err)), SF_OK);
    cr_expect(strstr(err, "no-such-bucket"), "%s", err);
    env_end(&e);
}
