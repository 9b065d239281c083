/* The credentials suite's shared fixture (credentials_fixture.h). */
#include "credentials_fixture.h"

#include <criterion/criterion.h>

#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/test_cert.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

char *tmp;
char *root;
char cred_path[700], config_path[700];
struct mock_proc srv;

/* ------------------------------------------------------------ log capture */

struct cred_logs logs = {.mu = PTHREAD_MUTEX_INITIALIZER};

void capture_log(void *user, enum sf_log_level level, const char *message)
{
    (void)user;
    pthread_mutex_lock(&logs.mu);
    if (logs.n < MAX_LOGS) {
        logs.level[logs.n] = level;
        snprintf(logs.text[logs.n], sizeof(logs.text[0]), "%s", message);
        logs.n++;
    }
    pthread_mutex_unlock(&logs.mu);
}

int count_logs(enum sf_log_level level)
{
    int k = 0;
    for (int i = 0; i < logs.n; i++)
        k += logs.level[i] == level;
    return k;
}

void expect_no_secret(const char *text, const char *where)
{
    static const char *const secrets[] = {FAKE_SECRET, FAKE_TOKEN,     MOCK_SECRET,
                                          AUTH_TOKEN,  "mock-issued-", NULL};
    for (size_t i = 0; secrets[i]; i++)
        cr_expect(strstr(text, secrets[i]) == NULL, "%s holds a secret: %s", where, text);
}

void expect_logs_clean(void)
{
    for (int i = 0; i < logs.n; i++)
        expect_no_secret(logs.text[i], "a log line");
}

/* ------------------------------------------------------------ fixture */

void clean_env(void)
{
    static const char *const vars[] = {"AWS_ACCESS_KEY_ID",
                                       "AWS_SECRET_ACCESS_KEY",
                                       "AWS_SESSION_TOKEN",
                                       "AWS_PROFILE",
                                       "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                                       "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                       "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                                       "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                                       "AWS_EC2_METADATA_SERVICE_ENDPOINT",
                                       "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
                                       "http_proxy",
                                       "HTTP_PROXY",
                                       NULL};
    for (size_t i = 0; vars[i]; i++)
        unsetenv(vars[i]);
    /* Nothing here may ask the real 169.254.169.254; IMDS tests re-enable it. */
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
}

void setup(void)
{
    tmp = test_tmpdir_with_root(&root);
    cr_assert(tmp);
    char home[700];
    cr_assert(test_make_dir(tmp, "home", home, sizeof(home)) == 0);
    clean_env();
    setenv("HOME", home, 1);
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_CONFIG_FILE");
    snprintf(cred_path, sizeof(cred_path), "%s/home/.aws/credentials", tmp);
    snprintf(config_path, sizeof(config_path), "%s/home/.aws/config", tmp);
    logs.n = 0;
}

void teardown(void)
{
    mock_env_stop(&srv, &tmp, NULL);
    free(root);
    root = NULL;
}

/* Starts the mock with our key pair and the extra arguments. */
void start_mock(const char *const *extra)
{
    const char *args[32] = {"--access-key", MOCK_AK, "--secret-key", MOCK_SECRET};
    size_t n = 4;
    for (size_t i = 0; extra && extra[i] && n < 31; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cr_assert(mock_proc_start(&srv, root, args) == 0, "the mock server did not start");
}

void write_home_file(const char *rel, const char *text)
{
    char dir[700];
    snprintf(dir, sizeof(dir), "%s/home", tmp);
    cr_assert(test_write_file(dir, rel, text, strlen(text)) == 0);
}

struct sf__cred_options opts(void)
{
    struct sf__cred_options o;
    memset(&o, 0, sizeof(o));
    o.imds_timeout_ms = 2000;
    o.log = capture_log;
    return o;
}

struct sf__cred_chain *chain_with(const struct sf__cred_options *o)
{
    struct sf__cred_chain *c = NULL;
    cr_assert_eq(sf__cred_chain_new(o, &c), SF_OK);
    cr_assert_not_null(c);
    return c;
}

/* chain_with(opts()). */
struct sf__cred_chain *default_chain(void)
{
    struct sf__cred_options o = opts();
    return chain_with(&o);
}

void get_ok(struct sf__cred_chain *c, time_t now, struct sf__credentials *cr)
{
    char err[4096] = "";
    sf_status st = sf__cred_chain_get(c, now, cr, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "get: %s: %s", sf_status_name(st), err);
    expect_no_secret(cr->source, "source");
}

/* get_ok now, from source (why: the failure's note). */
void get_from(struct sf__cred_chain *c, struct sf__credentials *cr, const char *source,
              const char *why)
{
    get_ok(c, time(NULL), cr);
    cr_expect_str_eq(cr->source, source, "%s", why);
}

/* cr holds access key id ak with FAKE_SECRET and FAKE_TOKEN. */
void expect_fake_keys(const struct sf__credentials *cr, const char *ak)
{
    cr_expect_str_eq(cr->access_key_id, ak);
    cr_expect_str_eq(cr->secret_access_key, FAKE_SECRET);
    cr_expect_str_eq(cr->session_token, FAKE_TOKEN);
}

/* cr came from source, issued by the mock (its key pair, a token it made). */
void expect_issued(const struct sf__credentials *cr, const char *source)
{
    cr_expect_str_eq(cr->source, source);
    cr_expect_str_eq(cr->access_key_id, MOCK_AK);
    cr_expect_str_eq(cr->secret_access_key, MOCK_SECRET);
    cr_expect(strncmp(cr->session_token, "mock-issued-", 12) == 0, "token %s", cr->session_token);
}

/* Expects get to fail; returns the status, the message in err. */
sf_status get_fail(struct sf__cred_chain *c, time_t now, char *err, size_t err_len)
{
    struct sf__credentials cr;
    sf_status st = sf__cred_chain_get(c, now, &cr, err, err_len);
    cr_assert_neq(st, SF_OK, "get succeeded from %s", cr.source);
    expect_no_secret(err, "the error message");
    return st;
}

/* A chain of o (opts() when NULL) whose get now fails with
 * SF_ERR_ACCESS_DENIED, the message (in err) holding frag unless NULL. */
void expect_denied(const struct sf__cred_options *o, const char *frag, char *err, size_t err_len)
{
    struct sf__cred_chain *c = o ? chain_with(o) : default_chain();
    cr_expect_eq(get_fail(c, time(NULL), err, err_len), SF_ERR_ACCESS_DENIED);
    if (frag)
        cr_expect(strstr(err, frag) != NULL, "%s", err);
    sf__cred_chain_destroy(c);
}

/* credentials.NAME from /_mock/stats. */
int cred_stat(const char *name)
{
    cJSON *j = mock_env_stats(&srv);
    cJSON *v =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "credentials"), name);
    cr_assert(cJSON_IsNumber(v), "no credentials.%s in the stats", name);
    int out = (int)v->valuedouble;
    cJSON_Delete(j);
    return out;
}

/* A port nothing listens on: bound, then closed. */
unsigned closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    socklen_t len = sizeof(a);
    cr_assert(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

void use_imds(void)
{
    unsetenv("AWS_EC2_METADATA_DISABLED");
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", srv.url, 1);
}

void use_container_full_uri(void)
{
    char uri[128];
    snprintf(uri, sizeof(uri), "%s/_mock/container-credentials", srv.url);
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri, 1);
}
