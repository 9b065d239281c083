#include "support/mock_env.h"

#include "support/s3_client.h"

#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

char *mock_env_root(char *root, size_t root_len)
{
    char *tmp = test_tmpdir();
    cr_assert(tmp);
    test_isolate_aws_env(tmp);
    cr_assert(test_make_dir(tmp, "root", root, root_len) == 0, "%s/root", tmp);
    cr_assert(test_make_dir(root, "bucket", NULL, 0) == 0, "%s/bucket", root);
    return tmp;
}

void mock_env_start(struct mock_proc *srv, const char *root, const char *const *extra)
{
    cr_assert(mock_proc_start(srv, root, extra) == 0, "the mock server did not start");
}

void mock_env_stop(struct mock_proc *srv, char **tmp, struct sf_s3 **s3)
{
    if (s3) {
        sf_s3_destroy(*s3);
        *s3 = NULL;
    }
    if (srv->pid > 0)
        mock_proc_stop(srv);
    srv->pid = 0;
    if (*tmp) {
        test_rmtree(*tmp);
        free(*tmp);
        *tmp = NULL;
    }
}

unsigned char *mock_env_put(const char *root, const char *key, size_t n, unsigned seed)
{
    unsigned char *data = test_put_object(root, "bucket", key, n, seed);
    cr_assert(data, "bucket/%s", key);
    return data;
}

long mock_env_admin(const struct mock_proc *srv, const char *method, const char *path_query,
                    const char *body, char **out)
{
    long st = mock_admin(srv->url, method, path_query, body, out);
    cr_assert(st >= 0, "%s %s: no answer", method, path_query);
    return st;
}

cJSON *mock_env_stats(const struct mock_proc *srv)
{
    char *body = NULL;
    cr_assert_eq(mock_env_admin(srv, "GET", "/_mock/stats", NULL, &body), 200);
    cJSON *j = cJSON_Parse(body);
    free(body);
    cr_assert(j);
    return j;
}

double mock_env_jnum(const cJSON *j, const char *a, const char *b, const char *c, const char *d)
{
    const char *path[] = {a, b, c, d};
    for (size_t i = 0; i < 4 && path[i] && j; i++)
        j = cJSON_GetObjectItemCaseSensitive(j, path[i]);
    return j && cJSON_IsNumber(j) ? j->valuedouble : 0;
}

void mock_env_s3_options(struct sf_s3_options *o, const char *endpoint_url)
{
    sf_s3_options_init_default(o);
    o->endpoint_url = endpoint_url;
    o->access_key_id = "mock-access-key";
    o->secret_access_key = "mock-secret-key";
}

void mock_env_s3_fast(struct sf_s3_options *o, const char *endpoint_url, unsigned concurrency,
                      unsigned long long chunk_bytes)
{
    mock_env_s3_options(o, endpoint_url);
    o->concurrency = concurrency;
    o->chunk_bytes = chunk_bytes;
    o->retry_base_ms = 5;
    o->throttle_base_ms = 5;
    o->retry_cap_ms = 200;
}

void mock_env_s3_unsigned(struct sf_s3_options *o)
{
    o->access_key_id = o->secret_access_key = NULL;
    o->no_sign_request = 1;
}

struct sf_s3 *mock_env_s3_new(const struct sf_s3_options *o)
{
    struct sf_s3 *s3 = NULL;
    char err[512] = "";
    sf_status st = sf_s3_new(o, &s3, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "sf_s3_new: %s: %s", sf_status_name(st), err);
    return s3;
}

struct sf_s3 *mock_env_s3_from(void (*init)(struct sf_s3_options *), int unsigned_requests)
{
    struct sf_s3_options o;
    init(&o);
    if (unsigned_requests)
        mock_env_s3_unsigned(&o);
    return mock_env_s3_new(&o);
}

void mock_env_etag(const void *data, size_t n, char out[35])
{
    unsigned char d[16];
    unsigned int len = 16;
    cr_assert(EVP_Digest(data, n, d, &len, EVP_md5(), NULL) == 1);
    out[0] = '"';
    for (int i = 0; i < 16; i++)
        snprintf(out + 1 + 2 * i, 3, "%02x", d[i]);
    out[33] = '"';
    out[34] = '\0';
}
