/* The credentials suite (test_credentials.c): the providers that ask an
 * endpoint (container, IMDS, both served by the mock) and refresh. */
#include "credentials_fixture.h"

#include <criterion/criterion.h>

#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/spawn.h"
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
    char err[4096] = "";
    expect_denied(&o, "container: GET", err, sizeof(err));
    cr_expect(strstr(err, "HTTP 401") != NULL, "%s", err);
    cr_expect(strstr(err, "wrong-token") == NULL, "%s", err);
    cr_expect_eq(cred_stat("container"), 1);
}

/* A process out of descriptors asking the container endpoint got curl's
 * "Couldn't connect to server", as if the endpoint were down. Now the
 * message says socket() failed for want of a descriptor, and what to do. */
Test(credentials, a_process_out_of_descriptors_is_told_so)
{
    start_mock(NULL);
    use_container_full_uri();
    int fd;
    pid_t pid = test_fork_piped(&fd);
    cr_assert(pid >= 0);
    if (pid == 0) {
        alarm(30);
        struct sf__cred_chain *c = default_chain();
        if (test_use_up_descriptors(64) != 0)
            _exit(90);
        char err[4096] = "";
        sf_status st = get_fail(c, time(NULL), err, sizeof(err));
        dprintf(fd, "%s: %s", sf_status_name(st), err);
        _exit(st == SF_OK ? 1 : 0);
    }
    char msg[4096] = "";
    int ws = test_wait_piped(pid, fd, msg, sizeof(msg));
    cr_assert(ws != -1 && WIFEXITED(ws), "the child ended %d: %s", ws, msg);
    cr_expect_eq(WEXITSTATUS(ws), 0, "%s", msg);
    cr_expect(strstr(msg, "container: GET"), "%s", msg);
    cr_expect(strstr(msg, "no file descriptor left"), "%s", msg);
}

Test(credentials, container_full_uri_http_only_to_loopback_or_agents)
{
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.170.99/creds?x=1", 1);
    char err[4096] = "";
    expect_denied(NULL, "http is only allowed to a loopback host", err, sizeof(err));
    cr_expect(strstr(err, "use https for '169.254.170.99'") != NULL, "%s", err);

    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "ftp://127.0.0.1/creds", 1);
    expect_denied(NULL, "must be http or https", err, sizeof(err));
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
    char err[4096] = "";
    expect_denied(&o, "container: GET https://localhost", err, sizeof(err));
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
    char err[4096] = "";
    expect_denied(NULL, "imds: disabled by AWS_EC2_METADATA_DISABLED", err, sizeof(err));
    cr_expect_eq(cred_stat("imds_token"), 0);

    setenv("AWS_EC2_METADATA_DISABLED", "false", 1);
    struct sf__cred_chain *c = default_chain();
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
    char want[128];
    snprintf(want, sizeof(want), "imds: PUT %s/latest/api/token: ", ep);
    char err[4096] = "";
    expect_denied(&o, want, err, sizeof(err));
    cr_expect(strstr(err, "2 attempts, timeout 500 ms each") != NULL, "%s", err);
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
