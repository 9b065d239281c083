/* The credential provider chain, every provider for real: files in a
 * temporary HOME, container and IMDS endpoints served by the mock server.
 * Criterion runs each test in its own process, so setenv here is local. */
#include <criterion/criterion.h>

#include "s3/credentials.h"
#include "shardfeed.h"
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

/* Strings that must never show up in a message or a log line. */
#define FAKE_SECRET "FAKE-SECRET-never-print-me"
#define FAKE_TOKEN  "FAKE-TOKEN-never-print-me"
#define MOCK_AK     "mock-ak"
#define MOCK_SECRET "mock-secret-never-print-me"
#define AUTH_TOKEN  "container-auth-never-print-me"

static char *tmp;
static char *root;
static char cred_path[700], config_path[700];
static struct mock_proc srv;

/* ------------------------------------------------------------ log capture */

#define MAX_LOGS 64
static struct {
    pthread_mutex_t mu;
    int n;
    enum sf_log_level level[MAX_LOGS];
    char text[MAX_LOGS][2048];
} logs = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void capture_log(void *user, enum sf_log_level level, const char *message)
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

static int count_logs(enum sf_log_level level)
{
    int k = 0;
    for (int i = 0; i < logs.n; i++)
        k += logs.level[i] == level;
    return k;
}

static void expect_no_secret(const char *text, const char *where)
{
    static const char *const secrets[] = {FAKE_SECRET, FAKE_TOKEN,     MOCK_SECRET,
                                          AUTH_TOKEN,  "mock-issued-", NULL};
    for (size_t i = 0; secrets[i]; i++)
        cr_expect(strstr(text, secrets[i]) == NULL, "%s holds a secret: %s", where, text);
}

static void expect_logs_clean(void)
{
    for (int i = 0; i < logs.n; i++)
        expect_no_secret(logs.text[i], "a log line");
}

/* ------------------------------------------------------------ fixture */

static void clean_env(void)
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

static void setup(void)
{
    tmp = test_tmpdir_with_root(&root);
    cr_assert(tmp);
    char path[700];
    snprintf(path, sizeof(path), "%s/home", tmp);
    cr_assert(mkdir(path, 0755) == 0);
    clean_env();
    setenv("HOME", path, 1);
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_CONFIG_FILE");
    snprintf(cred_path, sizeof(cred_path), "%s/home/.aws/credentials", tmp);
    snprintf(config_path, sizeof(config_path), "%s/home/.aws/config", tmp);
    logs.n = 0;
}

static void teardown(void)
{
    mock_env_stop(&srv, &tmp, NULL);
    free(root);
    root = NULL;
}

TestSuite(credentials, .init = setup, .fini = teardown, .timeout = 60);

/* Starts the mock with our key pair and the extra arguments. */
static void start_mock(const char *const *extra)
{
    const char *args[32] = {"--access-key", MOCK_AK, "--secret-key", MOCK_SECRET};
    size_t n = 4;
    for (size_t i = 0; extra && extra[i] && n < 31; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cr_assert(mock_proc_start(&srv, root, args) == 0, "the mock server did not start");
}

static void write_home_file(const char *rel, const char *text)
{
    char dir[700];
    snprintf(dir, sizeof(dir), "%s/home", tmp);
    cr_assert(test_write_file(dir, rel, text, strlen(text)) == 0);
}

static struct sf__cred_options opts(void)
{
    struct sf__cred_options o;
    memset(&o, 0, sizeof(o));
    o.imds_timeout_ms = 2000;
    o.log = capture_log;
    return o;
}

static struct sf__cred_chain *chain_with(const struct sf__cred_options *o)
{
    struct sf__cred_chain *c = NULL;
    cr_assert_eq(sf__cred_chain_new(o, &c), SF_OK);
    cr_assert_not_null(c);
    return c;
}

/* chain_with(opts()). */
static struct sf__cred_chain *default_chain(void)
{
    struct sf__cred_options o = opts();
    return chain_with(&o);
}

static void get_ok(struct sf__cred_chain *c, time_t now, struct sf__credentials *cr)
{
    char err[4096] = "";
    sf_status st = sf__cred_chain_get(c, now, cr, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "get: %s: %s", sf_status_name(st), err);
    expect_no_secret(cr->source, "source");
}

/* get_ok now, from source (why: the failure's note). */
static void get_from(struct sf__cred_chain *c, struct sf__credentials *cr, const char *source,
                     const char *why)
{
    get_ok(c, time(NULL), cr);
    cr_expect_str_eq(cr->source, source, "%s", why);
}

/* cr holds access key id ak with FAKE_SECRET and FAKE_TOKEN. */
static void expect_fake_keys(const struct sf__credentials *cr, const char *ak)
{
    cr_expect_str_eq(cr->access_key_id, ak);
    cr_expect_str_eq(cr->secret_access_key, FAKE_SECRET);
    cr_expect_str_eq(cr->session_token, FAKE_TOKEN);
}

/* cr came from source, issued by the mock (its key pair, a token it made). */
static void expect_issued(const struct sf__credentials *cr, const char *source)
{
    cr_expect_str_eq(cr->source, source);
    cr_expect_str_eq(cr->access_key_id, MOCK_AK);
    cr_expect_str_eq(cr->secret_access_key, MOCK_SECRET);
    cr_expect(strncmp(cr->session_token, "mock-issued-", 12) == 0, "token %s", cr->session_token);
}

/* Expects get to fail; returns the status, the message in err. */
static sf_status get_fail(struct sf__cred_chain *c, time_t now, char *err, size_t err_len)
{
    struct sf__credentials cr;
    sf_status st = sf__cred_chain_get(c, now, &cr, err, err_len);
    cr_assert_neq(st, SF_OK, "get succeeded from %s", cr.source);
    expect_no_secret(err, "the error message");
    return st;
}

/* credentials.NAME from /_mock/stats. */
static int cred_stat(const char *name)
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
static unsigned closed_port(void)
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

static void use_imds(void)
{
    unsetenv("AWS_EC2_METADATA_DISABLED");
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", srv.url, 1);
}

static void use_container_full_uri(void)
{
    char uri[128];
    snprintf(uri, sizeof(uri), "%s/_mock/container-credentials", srv.url);
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri, 1);
}

/* ------------------------------------------------------------ JSON */

Test(credentials, parse_json_container_and_imds_documents)
{
    const char *doc = "{\"AccessKeyId\":\"ASIAEXAMPLE\",\"SecretAccessKey\":\"" FAKE_SECRET
                      "\",\"Token\":\"" FAKE_TOKEN "\",\"Expiration\":\"2026-11-21T12:00:00Z\"}";
    struct sf__credentials cr;
    char err[256] = "";
    cr_assert_eq(sf__credentials_parse_json(doc, strlen(doc), &cr, err, sizeof(err)), SF_OK, "%s",
                 err);
    expect_fake_keys(&cr, "ASIAEXAMPLE");
    cr_expect_eq((long long)cr.expiration, 1795262400LL);
    cr_expect_eq(cr.anonymous, 0);

    const char *imds = "{\"Code\":\"Success\",\"LastUpdated\":\"2024-02-29T00:00:00Z\","
                       "\"Type\":\"AWS-HMAC\",\"AccessKeyId\":\"ASIA2\",\"SecretAccessKey\":\"s\","
                       "\"Token\":\"t\",\"Expiration\":\"2024-02-29T23:59:59.123Z\"}";
    cr_assert_eq(sf__credentials_parse_json(imds, strlen(imds), &cr, err, sizeof(err)), SF_OK, "%s",
                 err);
    cr_expect_eq((long long)cr.expiration, 1709251199LL, "leap day, fraction");

    const char *offset = "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\","
                         "\"Expiration\":\"2026-11-21T14:00:00+02:00\"}";
    cr_assert_eq(sf__credentials_parse_json(offset, strlen(offset), &cr, err, sizeof(err)), SF_OK,
                 "%s", err);
    cr_expect_eq((long long)cr.expiration, 1795262400LL, "offset");
    cr_expect_str_eq(cr.session_token, "", "no Token");

    const char *forever = "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\"}";
    cr_assert_eq(sf__credentials_parse_json(forever, strlen(forever), &cr, err, sizeof(err)),
                 SF_OK);
    cr_expect_eq((long long)cr.expiration, 0LL, "no Expiration: does not expire");
}

Test(credentials, parse_json_rejects_bad_documents_without_quoting_secrets)
{
    static const struct {
        const char *doc;
        sf_status want;
    } cases[] = {
        {"not json " FAKE_SECRET, SF_ERR_PARSE},
        {"[\"" FAKE_SECRET "\"]", SF_ERR_PARSE},
        {"{\"SecretAccessKey\":\"" FAKE_SECRET "\"}", SF_ERR_PARSE},
        {"{\"AccessKeyId\":\"A\"}", SF_ERR_PARSE},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"" FAKE_SECRET
         "\",\"Expiration\":\"tomorrow\"}",
         SF_ERR_PARSE},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"" FAKE_SECRET
         "\",\"Expiration\":\"2026-02-30T00:00:00Z\"}",
         SF_ERR_PARSE},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"" FAKE_SECRET "\",\"Token\":7}",
         SF_ERR_PARSE},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"has space " FAKE_SECRET "\"}", SF_ERR_PARSE},
        {"{\"Code\":\"AssumeRoleUnauthorizedAccess\",\"AccessKeyId\":\"A\","
         "\"SecretAccessKey\":\"" FAKE_SECRET "\"}",
         SF_ERR_ACCESS_DENIED},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sf__credentials cr;
        char err[256] = "";
        sf_status st =
            sf__credentials_parse_json(cases[i].doc, strlen(cases[i].doc), &cr, err, sizeof(err));
        cr_expect_eq(st, cases[i].want, "case %zu: %s (%s)", i, sf_status_name(st), err);
        cr_expect(err[0] != '\0', "case %zu has a message", i);
        expect_no_secret(err, "parse error");
        cr_expect_eq(cr.secret_access_key[0], '\0', "case %zu: no secret left in out", i);
    }

    /* A token longer than the struct holds. */
    size_t n = 5000;
    char *doc = malloc(n + 100);
    cr_assert(doc);
    int head = snprintf(doc, 100, "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\",\"Token\":\"");
    memset(doc + head, 'T', n);
    memcpy(doc + head + n, "\"}", 3);
    struct sf__credentials cr;
    char err[256];
    cr_expect_eq(sf__credentials_parse_json(doc, strlen(doc), &cr, err, sizeof(err)), SF_ERR_LIMIT);
    free(doc);
}

/* ------------------------------------------------------------ local providers */

Test(credentials, explicit_options)
{
    struct sf__cred_options o = opts();
    o.access_key_id = "AKIDEXPLICIT";
    o.secret_access_key = FAKE_SECRET;
    o.session_token = FAKE_TOKEN;
    struct sf__cred_chain *c = chain_with(&o);
    struct sf__credentials cr;
    get_from(c, &cr, "explicit", "");
    expect_fake_keys(&cr, "AKIDEXPLICIT");
    cr_expect_eq((long long)cr.expiration, 0LL);
    sf__cred_chain_destroy(c);
    sf__cred_chain_destroy(NULL);
    expect_logs_clean();
}

Test(credentials, explicit_needs_both_halves)
{
    struct sf__cred_options o = opts();
    o.access_key_id = "AKIDONLY";
    struct sf__cred_chain *c = (struct sf__cred_chain *)1;
    cr_expect_eq(sf__cred_chain_new(&o, &c), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(c);
    o.access_key_id = NULL;
    o.secret_access_key = FAKE_SECRET;
    cr_expect_eq(sf__cred_chain_new(&o, &c), SF_ERR_INVALID_ARGUMENT);
    o.access_key_id = "AKID";
    o.secret_access_key = "with space " FAKE_SECRET;
    cr_expect_eq(sf__cred_chain_new(&o, &c), SF_ERR_INVALID_ARGUMENT);
    cr_expect_geq(count_logs(SF_LOG_ERROR), 3);
    expect_logs_clean();
}

Test(credentials, env_is_read_when_the_chain_is_made)
{
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET, 1);
    setenv("AWS_SESSION_TOKEN", FAKE_TOKEN, 1);
    struct sf__cred_chain *c = default_chain();
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    struct sf__credentials cr;
    get_from(c, &cr, "env", "");
    expect_fake_keys(&cr, "AKIDENV");
    sf__cred_chain_destroy(c);
    expect_logs_clean();
}

Test(credentials, profile_from_files_named_by_aws_profile)
{
    write_home_file(".aws/credentials", "[default]\n"
                                        "aws_access_key_id = AKIDDEFAULT\n"
                                        "aws_secret_access_key = " FAKE_SECRET "\n"
                                        "[team]\n"
                                        "aws_access_key_id = AKIDTEAM\n"
                                        "aws_secret_access_key = " FAKE_SECRET "\n"
                                        "aws_session_token = " FAKE_TOKEN "\n");
    setenv("AWS_PROFILE", "team", 1);
    struct sf__cred_options o = opts();
    struct sf__cred_chain *c = chain_with(&o);
    unsetenv("AWS_PROFILE");
    struct sf__credentials cr;
    get_from(c, &cr, "profile:team", "");
    expect_fake_keys(&cr, "AKIDTEAM");
    sf__cred_chain_destroy(c);

    o.profile = "default";
    c = chain_with(&o);
    get_from(c, &cr, "profile:default", "the option names the profile");
    cr_expect_str_eq(cr.access_key_id, "AKIDDEFAULT");
    sf__cred_chain_destroy(c);
    expect_logs_clean();
}

Test(credentials, profile_in_config_file_only)
{
    write_home_file(".aws/config", "[profile cfg]\n"
                                   "aws_access_key_id = AKIDCFG\n"
                                   "aws_secret_access_key = " FAKE_SECRET "\n");
    struct sf__cred_options o = opts();
    o.profile = "cfg";
    struct sf__cred_chain *c = chain_with(&o);
    struct sf__credentials cr;
    get_ok(c, time(NULL), &cr);
    cr_expect_str_eq(cr.access_key_id, "AKIDCFG");
    sf__cred_chain_destroy(c);
}

Test(credentials, nothing_configured_lists_every_provider)
{
    struct sf__cred_chain *c = default_chain();
    char err[4096] = "";
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    char want_profile[2000];
    snprintf(want_profile, sizeof(want_profile), "profile 'default': not found in %s, %s",
             cred_path, config_path);
    cr_expect(strncmp(err, "no credentials: explicit options not set; ", 42) == 0, "%s", err);
    cr_expect(strstr(err, "AWS_ACCESS_KEY_ID not set") != NULL, "%s", err);
    cr_expect(strstr(err, want_profile) != NULL, "%s", err);
    cr_expect(strstr(err, "container: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") != NULL, "%s", err);
    cr_expect(strstr(err, "imds: disabled by AWS_EC2_METADATA_DISABLED") != NULL, "%s", err);
    sf__cred_chain_destroy(c);
}

Test(credentials, secrets_never_in_error_messages)
{
    /* Half-configured env, a profile with a secret but no key id, a container
     * endpoint that refuses the token: every secret is somewhere. */
    start_mock((const char *[]){"--container-auth-token", "the-right-one", NULL});
    setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET, 1);
    setenv("AWS_SESSION_TOKEN", FAKE_TOKEN, 1);
    write_home_file(".aws/credentials", "[default]\n"
                                        "aws_secret_access_key = " FAKE_SECRET "\n"
                                        "aws_session_token = " FAKE_TOKEN "\n");
    use_container_full_uri();
    setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", AUTH_TOKEN, 1);
    struct sf__cred_chain *c = default_chain();
    char err[4096] = "";
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    cr_expect(strstr(err, "AWS_SECRET_ACCESS_KEY set but AWS_ACCESS_KEY_ID not set") != NULL, "%s",
              err);
    cr_expect(strstr(err, "no aws_access_key_id") != NULL, "%s", err);
    cr_expect(strstr(err, "HTTP 401") != NULL, "%s", err);
    cr_expect_eq(cred_stat("container"), 0, "nothing was issued");
    sf__cred_chain_destroy(c);
    expect_logs_clean();
}

Test(credentials, no_sign_request_touches_nothing)
{
    start_mock(NULL);
    use_imds();
    use_container_full_uri();
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET, 1);
    struct sf__cred_options o = opts();
    o.no_sign_request = 1;
    struct sf__cred_chain *c = chain_with(&o);
    struct sf__credentials cr;
    get_ok(c, time(NULL), &cr);
    cr_expect_eq(cr.anonymous, 1);
    cr_expect_str_eq(cr.source, "anonymous");
    cr_expect_str_eq(cr.access_key_id, "");
    cr_expect_str_eq(cr.secret_access_key, "");
    cr_expect_eq(cred_stat("container"), 0);
    cr_expect_eq(cred_stat("imds_token"), 0);
    sf__cred_chain_destroy(c);
}

/* ------------------------------------------------------------ precedence */

Test(credentials, precedence_explicit_env_profile_container_imds)
{
    start_mock((const char *[]){"--imds-role", "prec-role", NULL});
    use_imds();
    use_container_full_uri();
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET, 1);
    write_home_file(".aws/credentials", "[default]\n"
                                        "aws_access_key_id = AKIDPROFILE\n"
                                        "aws_secret_access_key = " FAKE_SECRET "\n");
    struct sf__credentials cr;
    struct sf__cred_options o = opts();
    o.access_key_id = "AKIDEXPLICIT";
    o.secret_access_key = FAKE_SECRET;
    struct sf__cred_chain *c = chain_with(&o);
    get_from(c, &cr, "explicit", "");
    sf__cred_chain_destroy(c);

    o.access_key_id = o.secret_access_key = NULL;
    c = chain_with(&o);
    get_from(c, &cr, "env", "");
    sf__cred_chain_destroy(c);

    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    c = chain_with(&o);
    get_from(c, &cr, "profile:default", "");
    sf__cred_chain_destroy(c);

    o.profile = "absent";
    c = chain_with(&o);
    get_from(c, &cr, "container", "");
    cr_expect_str_eq(cr.access_key_id, MOCK_AK);
    sf__cred_chain_destroy(c);

    unsetenv("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    c = chain_with(&o);
    get_from(c, &cr, "imds:prec-role", "");
    sf__cred_chain_destroy(c);

    cr_expect_eq(cred_stat("container"), 1, "container asked only when first in line");
    cr_expect_eq(cred_stat("imds_credentials"), 1, "imds asked only when last in line");
    expect_logs_clean();
}

/* ------------------------------------------------------------ container */

Test(credentials, container_full_uri_with_token)
{
    start_mock((const char *[]){"--container-auth-token", AUTH_TOKEN, NULL});
    use_container_full_uri();
    setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", AUTH_TOKEN, 1);
    struct sf__cred_chain *c = default_chain();
    unsetenv("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    unsetenv("AWS_CONTAINER_AUTHORIZATION_TOKEN");
    time_t now = time(NULL);
    struct sf__credentials cr;
    get_ok(c, now, &cr);
    expect_issued(&cr, "container");
    cr_expect(cr.expiration > now + 3000 && cr.expiration <= now + 3601, "expiration in an hour");
    /* Cached: a second get does not ask again. */
    get_ok(c, now, &cr);
    cr_expect_eq(cred_stat("container"), 1);
    sf__cred_chain_destroy(c);
    expect_logs_clean();
}

Test(credentials, container_relative_uri_with_token_file)
{
    start_mock((const char *[]){"--container-path", "/v2/credentials/task-1234",
                                "--container-auth-token", AUTH_TOKEN, NULL});
    setenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/task-1234", 1);
    char token_file[800];
    snprintf(token_file, sizeof(token_file), "%s/token", tmp);
    cr_assert(test_write_file(tmp, "token", "  " AUTH_TOKEN " \n", strlen(AUTH_TOKEN) + 4) == 0);
    setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file, 1);
    setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "the-file-wins", 1);
    struct sf__cred_options o = opts();
    o.container_base_url = srv.url;
    struct sf__cred_chain *c = chain_with(&o);
    struct sf__credentials cr;
    get_from(c, &cr, "container", "");
    cr_expect_str_eq(cr.access_key_id, MOCK_AK);
    sf__cred_chain_destroy(c);

    /* The file is read on every fetch (EKS rotates it). */
    cr_assert(test_write_file(tmp, "token", "wrong-token\n", 12) == 0);
    c = chain_with(&o);
    char err[4096] = "";
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    cr_expect(strstr(err, "container: GET") != NULL && strstr(err, "HTTP 401") != NULL, "%s", err);
    cr_expect(strstr(err, "wrong-token") == NULL, "%s", err);
    sf__cred_chain_destroy(c);
    cr_expect_eq(cred_stat("container"), 1);
}

Test(credentials, container_full_uri_http_only_to_loopback_or_agents)
{
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.170.99/creds?x=1", 1);
    struct sf__cred_options o = opts();
    struct sf__cred_chain *c = chain_with(&o);
    char err[4096] = "";
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    cr_expect(strstr(err, "http is only allowed to a loopback host") != NULL, "%s", err);
    cr_expect(strstr(err, "use https for '169.254.170.99'") != NULL, "%s", err);
    sf__cred_chain_destroy(c);

    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "ftp://127.0.0.1/creds", 1);
    c = chain_with(&o);
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    cr_expect(strstr(err, "must be http or https") != NULL, "%s", err);
    sf__cred_chain_destroy(c);
}

Test(credentials, container_full_uri_loopback_forms_are_allowed)
{
    start_mock(NULL);
    /* 127.0.0.0/8 and localhost pass the rule (the mock listens on
     * 127.0.0.1, so only the rule, not the fetch, is checked for the rest). */
    static const char *const hosts[] = {"127.0.0.1", "localhost", NULL};
    for (size_t i = 0; hosts[i]; i++) {
        char uri[128];
        snprintf(uri, sizeof(uri), "http://%s:%u/_mock/container-credentials", hosts[i], srv.port);
        setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri, 1);
        struct sf__cred_options o = opts();
        struct sf__cred_chain *c = chain_with(&o);
        struct sf__credentials cr;
        get_ok(c, time(NULL), &cr);
        cr_expect_str_eq(cr.source, "container", "%s", hosts[i]);
        sf__cred_chain_destroy(c);
    }
    static const char *const rule_ok[] = {"http://127.9.8.7:1/x", "http://[::1]:1/x",
                                          "http://169.254.170.2:1/x", "http://169.254.170.23:1/x",
                                          NULL};
    for (size_t i = 0; rule_ok[i]; i++) {
        setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", rule_ok[i], 1);
        struct sf__cred_options o = opts();
        o.imds_timeout_ms = 200;
        o.imds_attempts = 1;
        struct sf__cred_chain *c = chain_with(&o);
        char err[4096] = "";
        get_fail(c, time(NULL), err, sizeof(err));
        cr_expect(strstr(err, "only allowed") == NULL, "%s passes the rule: %s", rule_ok[i], err);
        cr_expect(strstr(err, "container: GET http://") != NULL, "%s was asked: %s", rule_ok[i],
                  err);
        sf__cred_chain_destroy(c);
    }
}

static void start_tls_mock(char *cert, size_t cert_len)
{
    char key[800];
    cr_assert(test_make_cert(tmp, cert, cert_len, key, sizeof(key)) == 0);
    const char *extra[] = {"--access-key", MOCK_AK,      "--secret-key",
                           MOCK_SECRET,    "--tls-cert", cert,
                           "--tls-key",    key,          NULL};
    cr_assert(mock_proc_start(&srv, root, extra) == 0, "the TLS mock server did not start");
}

Test(credentials, container_full_uri_https_with_ca_bundle)
{
    char cert[800];
    start_tls_mock(cert, sizeof(cert));
    char uri[128];
    snprintf(uri, sizeof(uri), "https://localhost:%u/_mock/container-credentials", srv.port);
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri, 1);
    struct sf__cred_options o = opts();
    o.ca_bundle = cert;
    struct sf__cred_chain *c = chain_with(&o);
    struct sf__credentials cr;
    get_from(c, &cr, "container", "");
    cr_expect_str_eq(cr.access_key_id, MOCK_AK);
    sf__cred_chain_destroy(c);

    /* Without the bundle the self-signed certificate is refused. */
    o.ca_bundle = NULL;
    c = chain_with(&o);
    char err[4096] = "";
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    cr_expect(strstr(err, "container: GET https://localhost") != NULL, "%s", err);
    sf__cred_chain_destroy(c);
}

/* ------------------------------------------------------------ IMDS */

Test(credentials, imds_v2_token_role_and_credentials)
{
    start_mock((const char *[]){"--imds-role", "train-role", NULL});
    use_imds();
    struct sf__cred_chain *c = default_chain();
    unsetenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    time_t now = time(NULL);
    struct sf__credentials cr;
    get_ok(c, now, &cr);
    expect_issued(&cr, "imds:train-role");
    cr_expect(cr.expiration > now);
    cr_expect_eq(cred_stat("imds_token"), 1);
    cr_expect_eq(cred_stat("imds_role_list"), 1);
    cr_expect_eq(cred_stat("imds_credentials"), 1);

    /* After invalidate the provider is asked again; the IMDS token is reused. */
    sf__cred_chain_invalidate(c);
    char first[4096];
    snprintf(first, sizeof(first), "%s", cr.session_token);
    get_ok(c, now, &cr);
    cr_expect_str_neq(cr.session_token, first);
    cr_expect_eq(cred_stat("imds_token"), 1, "the IMDS token is cached");
    cr_expect_eq(cred_stat("imds_role_list"), 2);
    cr_expect_eq(cred_stat("imds_credentials"), 2);
    sf__cred_chain_destroy(c);
    expect_logs_clean();
}

Test(credentials, imds_disabled_is_case_insensitive)
{
    start_mock(NULL);
    use_imds();
    setenv("AWS_EC2_METADATA_DISABLED", "TrUe", 1);
    struct sf__cred_options o = opts();
    struct sf__cred_chain *c = chain_with(&o);
    char err[4096] = "";
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    cr_expect(strstr(err, "imds: disabled by AWS_EC2_METADATA_DISABLED") != NULL, "%s", err);
    cr_expect_eq(cred_stat("imds_token"), 0);
    sf__cred_chain_destroy(c);

    setenv("AWS_EC2_METADATA_DISABLED", "false", 1);
    c = chain_with(&o);
    struct sf__credentials cr;
    get_from(c, &cr, "imds:mock-role", "'false' does not disable");
    sf__cred_chain_destroy(c);
}

Test(credentials, imds_unreachable_fails_with_the_endpoint_named)
{
    unsetenv("AWS_EC2_METADATA_DISABLED");
    char ep[64];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", closed_port());
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", ep, 1);
    struct sf__cred_options o = opts();
    o.imds_timeout_ms = 500;
    struct sf__cred_chain *c = chain_with(&o);
    char err[4096] = "";
    cr_expect_eq(get_fail(c, time(NULL), err, sizeof(err)), SF_ERR_ACCESS_DENIED);
    char want[128];
    snprintf(want, sizeof(want), "imds: PUT %s/latest/api/token: ", ep);
    cr_expect(strstr(err, want) != NULL, "%s", err);
    cr_expect(strstr(err, "2 attempts, timeout 500 ms each") != NULL, "%s", err);
    sf__cred_chain_destroy(c);
}

/* ------------------------------------------------------------ refresh */

/* A chain whose container credentials the mock issues for ttl_s seconds,
 * refreshed margin_s before they expire (imds_attempts 0: the default). */
static struct sf__cred_chain *issuing_chain(const char *ttl_s, unsigned margin_s,
                                            unsigned imds_attempts)
{
    start_mock((const char *[]){"--issue-ttl-s", ttl_s, NULL});
    use_container_full_uri();
    struct sf__cred_options o = opts();
    o.refresh_margin_s = margin_s;
    if (imds_attempts)
        o.imds_attempts = imds_attempts;
    return chain_with(&o);
}

Test(credentials, refresh_asks_the_same_provider_again)
{
    struct sf__cred_chain *c = issuing_chain("2", 1, 0);
    time_t t0 = time(NULL);
    struct sf__credentials first, cr;
    get_ok(c, t0, &first);
    cr_expect_str_eq(first.source, "container");
    /* A profile earlier in the chain appears: a refresh must not re-walk. */
    write_home_file(".aws/credentials", "[default]\n"
                                        "aws_access_key_id = AKIDPROFILE\n"
                                        "aws_secret_access_key = " FAKE_SECRET "\n");
    get_ok(c, t0, &cr);
    cr_expect_str_eq(cr.session_token, first.session_token, "cached before the margin");
    cr_expect_eq(cred_stat("container"), 1);

    struct timespec pause = {1, 500 * 1000000L};
    nanosleep(&pause, NULL);
    get_from(c, &cr, "container", "");
    cr_expect_str_neq(cr.session_token, first.session_token, "refreshed");
    cr_expect_eq(cred_stat("container"), 2);
    sf__cred_chain_destroy(c);
    expect_logs_clean();
}

Test(credentials, failed_refresh_keeps_valid_credentials_then_fails_when_expired)
{
    struct sf__cred_chain *c = issuing_chain("600", 60, 1);
    struct sf__credentials first, cr;
    get_ok(c, time(NULL), &first);
    cr_assert(first.expiration > 0);
    mock_proc_stop(&srv);

    /* Inside the margin, not expired: the old credentials and a warning. */
    get_ok(c, first.expiration - 30, &cr);
    cr_expect_str_eq(cr.session_token, first.session_token);
    cr_expect_eq(count_logs(SF_LOG_WARN), 1);
    cr_expect(logs.n > 0 && strstr(logs.text[logs.n - 1], "refresh from container failed"), "%s",
              logs.n ? logs.text[logs.n - 1] : "");
    /* Right after a failure the refresh is not retried on every call. */
    get_ok(c, first.expiration - 29, &cr);
    cr_expect_eq(count_logs(SF_LOG_WARN), 1, "backs off after a failed refresh");

    /* Expired: an error, not the stale credentials. */
    char err[4096] = "";
    sf_status st = get_fail(c, first.expiration, err, sizeof(err));
    cr_expect(st == SF_ERR_NETWORK || st == SF_ERR_TIMEOUT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "credentials from container expired at") != NULL, "%s", err);
    cr_expect(strstr(err, "container: GET") != NULL, "%s", err);
    sf__cred_chain_destroy(c);
    expect_logs_clean();
}

Test(credentials, credentials_inside_the_margin_are_not_fetched_on_every_call)
{
    struct sf__cred_chain *c = issuing_chain("30", 300, 0); /* a margin longer than they live */
    time_t now = time(NULL);
    struct sf__credentials first, cr;
    get_ok(c, now, &first);
    get_ok(c, now, &cr);
    get_ok(c, now + 5, &cr);
    cr_expect_str_eq(cr.session_token, first.session_token);
    cr_expect_eq(cred_stat("container"), 1, "not asked again at once");
    get_ok(c, now + 11, &cr);
    cr_expect_str_neq(cr.session_token, first.session_token, "asked again after the pause");
    cr_expect_eq(cred_stat("container"), 2);
    sf__cred_chain_destroy(c);
}

Test(credentials, invalidate_walks_the_chain_again)
{
    start_mock(NULL);
    use_container_full_uri();
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    struct sf__cred_chain *c = default_chain();
    struct sf__credentials cr;
    get_from(c, &cr, "container", "env is half set, so container");
    /* Profiles are read when the chain is walked, so one that appears now
     * is seen only after invalidate. */
    write_home_file(".aws/credentials", "[default]\n"
                                        "aws_access_key_id = AKIDPROFILE\n"
                                        "aws_secret_access_key = " FAKE_SECRET "\n");
    get_from(c, &cr, "container", "cached");
    sf__cred_chain_invalidate(c);
    get_from(c, &cr, "profile:default", "walked from the start");
    cr_expect_str_eq(cr.access_key_id, "AKIDPROFILE");
    cr_expect_eq(cred_stat("container"), 1);
    sf__cred_chain_invalidate(NULL);
    sf__cred_chain_destroy(c);
}

struct racer {
    struct sf__cred_chain *c;
    time_t now;
    sf_status st;
    struct sf__credentials cr;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    char err[512];
    r->st = sf__cred_chain_get(r->c, r->now, &r->cr, err, sizeof(err));
    return NULL;
}

Test(credentials, concurrent_first_gets_fetch_once)
{
    start_mock(NULL);
    use_container_full_uri();
    struct sf__cred_chain *c = default_chain();
    enum { N = 8 };
    struct racer r[N];
    pthread_t th[N];
    time_t now = time(NULL);
    for (int i = 0; i < N; i++) {
        r[i] = (struct racer){.c = c, .now = now};
        cr_assert(pthread_create(&th[i], NULL, race, &r[i]) == 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        cr_expect_eq(r[i].st, SF_OK);
        cr_expect_str_eq(r[i].cr.session_token, r[0].cr.session_token);
    }
    cr_expect_eq(cred_stat("container"), 1, "one fetch for all callers");
    sf__cred_chain_destroy(c);
}

/* ------------------------------------------------------------ a named profile */

static sf_status s3_new_with_profile(const char *profile, char *err, size_t err_len)
{
    struct sf_s3_options so;
    sf_s3_options_init_default(&so);
    so.endpoint_url = "http://127.0.0.1:1";
    so.profile = profile;
    struct sf_s3 *s3 = NULL;
    sf_status st = sf_s3_new(&so, &s3, err, err_len);
    sf_s3_destroy(s3);
    return st;
}

/* aws-cli refuses a profile that does not exist even when the environment
 * holds credentials (a typo must not run as someone else); so do we. */
Test(credentials, an_unknown_profile_is_refused_even_with_env_credentials)
{
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET, 1);
    write_home_file(".aws/credentials", "[team]\n"
                                        "aws_access_key_id = AKIDTEAM\n"
                                        "aws_secret_access_key = " FAKE_SECRET "\n");
    write_home_file(".aws/config", "[profile cfg]\nregion = eu-west-1\n");
    char err[1024] = "";
    sf_status st = s3_new_with_profile("nosuch", err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s: %s", sf_status_name(st), err);
    cr_expect(strstr(err, "profile 'nosuch' not found") && strstr(err, cred_path) &&
                  strstr(err, config_path),
              "%s", err);
    expect_no_secret(err, "error");
    setenv("AWS_PROFILE", "typo", 1);
    err[0] = '\0';
    st = s3_new_with_profile(NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "AWS_PROFILE: %s", sf_status_name(st));
    cr_expect(strstr(err, "'typo'"), "%s", err);
    /* a profile in either file, or none named: the environment's keys serve */
    cr_expect_eq(s3_new_with_profile("team", err, sizeof(err)), SF_OK, "%s", err);
    unsetenv("AWS_PROFILE");
    cr_expect_eq(s3_new_with_profile("cfg", err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_eq(s3_new_with_profile(NULL, err, sizeof(err)), SF_OK, "%s", err);
}
