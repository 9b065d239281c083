/* The credential provider chain, every provider for real: files in a
 * temporary HOME, container and IMDS endpoints served by the mock server.
 * Criterion runs each test in its own process, so setenv here is local.
 *
 * One suite, `credentials`, in one executable: this file (the JSON
 * documents, the local providers, precedence), test_credentials_remote.c
 * (container and IMDS providers, refresh) and credentials_fixture.c. */
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

TestSuite(credentials, .init = setup, .fini = teardown, .timeout = 60);

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
        /* Not a leap year: this day does not exist (it was read as March 1st). */
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"" FAKE_SECRET
         "\",\"Expiration\":\"2026-02-29T00:00:00Z\"}",
         SF_ERR_PARSE},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"" FAKE_SECRET
         "\",\"Expiration\":\"2100-02-29T00:00:00Z\"}",
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

/* cJSON keeps C strings: "\u0000" in a string (or a raw NUL byte) ended it
 * there, so {"AccessKeyId":"AKIA\u0000junk"} signed as "AKIA" and a token
 * lost its tail without a word. Refused naming the field, never its value;
 * an escaped backslash before "u0000" is no NUL. */
Test(credentials, parse_json_refuses_a_nul_in_a_string_naming_the_field)
{
    static const struct {
        const char *doc;
        const char *named;
    } cases[] = {
        {"{\"AccessKeyId\":\"AKIA\\u0000junk\",\"SecretAccessKey\":\"" FAKE_SECRET "\"}",
         "AccessKeyId holds a NUL"},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"" FAKE_SECRET "\\u0000x\"}",
         "SecretAccessKey holds a NUL"},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"" FAKE_SECRET "\",\"Token\":\"t\\u0000"
         "x\",\"Expiration\":\"2026-11-21T12:00:00Z\"}",
         "Token holds a NUL"},
        {"{\"Code\":\"Success\\u0000no\",\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\"}",
         "Code holds a NUL"},
        {"{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\",\"Expiration\":"
         "\"2026-11-21T12:00:00Z\\u0000junk\"}",
         "Expiration holds a NUL"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sf__credentials cr;
        char err[256] = "";
        sf_status st =
            sf__credentials_parse_json(cases[i].doc, strlen(cases[i].doc), &cr, err, sizeof(err));
        cr_expect_eq(st, SF_ERR_PARSE, "case %zu: %s (%s)", i, sf_status_name(st), err);
        cr_expect(strstr(err, cases[i].named), "case %zu: %s", i, err);
        expect_no_secret(err, "NUL refusal");
        cr_expect_eq(cr.access_key_id[0], '\0', "case %zu: nothing left in out", i);
    }

    /* A raw NUL byte inside a string: the length says where the document ends. */
    static const char raw[] = "{\"AccessKeyId\":\"AKIA\0junk\",\"SecretAccessKey\":\"s\"}";
    struct sf__credentials cr;
    char err[256] = "";
    cr_expect_eq(sf__credentials_parse_json(raw, sizeof(raw) - 1, &cr, err, sizeof(err)),
                 SF_ERR_PARSE);
    cr_expect(strstr(err, "NUL byte at offset 20"), "%s", err);

    /* "\\u0000" is a backslash and "u0000": kept as such. */
    const char *escaped = "{\"AccessKeyId\":\"A\\\\u0000\",\"SecretAccessKey\":\"s\"}";
    sf_status st = sf__credentials_parse_json(escaped, strlen(escaped), &cr, err, sizeof(err));
    cr_expect(st != SF_OK || strcmp(cr.access_key_id, "A\\u0000") == 0, "%s", cr.access_key_id);
    cr_expect(!strstr(err, "holds a NUL"), "%s", err);
}

/* cJSON's allocations in this test process, each with its size in front,
 * so that a freed block can be searched for what should have been wiped. */
static int tail_seen;
static void *sized_malloc(size_t n)
{
    size_t *b = malloc(sizeof(size_t) + n);
    if (!b)
        return NULL;
    b[0] = n;
    return b + 1;
}
static void sized_free(void *p)
{
    if (!p)
        return;
    size_t *b = (size_t *)p - 1;
    if (memmem(p, b[0], "TAILOFSECRET", 12))
        tail_seen++;
    free(b);
}

/* A secret with "\u0000" in it is refused, and cJSON's copy of it was wiped
 * only up to the NUL (strlen): the tail went back to the heap as it was.
 * Now the document is parsed with those escapes masked, so no freed block
 * holds any of it (parse_json_refuses_a_nul_in_a_string_naming_the_field
 * checks that "\\u0000", a backslash then u0000, is still kept). */
Test(credentials, a_refused_secret_with_a_nul_is_wiped_whole)
{
    cJSON_Hooks hooks = {sized_malloc, sized_free};
    cJSON_InitHooks(&hooks);
    const char *docs[] = {
        "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\\u0000TAILOFSECRET\"}",
        "{\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\",\"Token\":\"t\\u0000TAILOFSECRET\"}",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        struct sf__credentials cr;
        char err[256] = "";
        tail_seen = 0;
        cr_expect_eq(sf__credentials_parse_json(docs[i], strlen(docs[i]), &cr, err, sizeof(err)),
                     SF_ERR_PARSE, "case %zu: %s", i, err);
        cr_expect(strstr(err, "holds a NUL"), "case %zu: %s", i, err);
        cr_expect_eq(tail_seen, 0, "case %zu: the secret's tail was freed unwiped", i);
    }
    cJSON_InitHooks(NULL);
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
    char err[4096] = "";
    expect_denied(NULL, "AWS_ACCESS_KEY_ID not set", err, sizeof(err));
    char want_profile[2000];
    snprintf(want_profile, sizeof(want_profile), "profile 'default': not found in %s, %s",
             cred_path, config_path);
    cr_expect(strncmp(err, "no credentials: explicit options not set; ", 42) == 0, "%s", err);
    cr_expect(strstr(err, want_profile) != NULL, "%s", err);
    cr_expect(strstr(err, "container: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") != NULL, "%s", err);
    cr_expect(strstr(err, "imds: disabled by AWS_EC2_METADATA_DISABLED") != NULL, "%s", err);
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
    char err[4096] = "";
    expect_denied(NULL, "AWS_SECRET_ACCESS_KEY set but AWS_ACCESS_KEY_ID not set", err,
                  sizeof(err));
    cr_expect(strstr(err, "no aws_access_key_id") != NULL, "%s", err);
    cr_expect(strstr(err, "HTTP 401") != NULL, "%s", err);
    cr_expect_eq(cred_stat("container"), 0, "nothing was issued");
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
