/* The AWS shared config / credentials files, read from temporary files.
 * Criterion runs every test in its own process, so setenv here is local. */
#include <criterion/criterion.h>

#include "s3/aws_config.h"
#include "support/mock_proc.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *dir;
static char cred_path[600], config_path[600];

static void setup(void)
{
    dir = test_tmpdir();
    cr_assert(dir);
    snprintf(cred_path, sizeof(cred_path), "%s/credentials", dir);
    snprintf(config_path, sizeof(config_path), "%s/config", dir);
    setenv("AWS_SHARED_CREDENTIALS_FILE", cred_path, 1);
    setenv("AWS_CONFIG_FILE", config_path, 1);
    unsetenv("AWS_PROFILE");
}

static void teardown(void)
{
    test_rmtree(dir);
    free(dir);
    dir = NULL;
}

static void write_cred(const char *text)
{
    cr_assert(test_write_file(dir, "credentials", text, strlen(text)) == 0);
}

static void write_config(const char *text)
{
    cr_assert(test_write_file(dir, "config", text, strlen(text)) == 0);
}

/* Loads a profile that must load without error. */
static void load(const char *name, struct sf__aws_profile *p)
{
    char err[512] = "";
    sf_status st = sf__aws_profile_load(name, p, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "load %s: %d %s", name ? name : "(null)", (int)st, err);
}

static void expect_str(const char *got, const char *want, const char *what)
{
    if (!want) {
        cr_expect_null(got, "%s: want NULL, got '%s'", what, got ? got : "");
        return;
    }
    cr_assert_not_null(got, "%s: want '%s', got NULL", what, want);
    cr_expect_str_eq(got, want, "%s", what);
}

TestSuite(aws_config, .init = setup, .fini = teardown);

/* A string field of struct sf__aws_profile, the value a test wants there
 * (NULL: unset) and what names the case. */
struct field_want {
    size_t offset;
    const char *want;
    const char *what;
};
#define FIELD(field, want, what) {offsetof(struct sf__aws_profile, field), want, what}

/* Profile name is found and loads with each field of w[0..n) as it wants. */
static void expect_fields(const char *name, const struct field_want *w, size_t n)
{
    struct sf__aws_profile p;
    load(name, &p);
    cr_expect_eq(p.found, 1, "profile %s", name ? name : "(null)");
    for (size_t i = 0; i < n; i++)
        expect_str(*(char *const *)((const char *)&p + w[i].offset), w[i].want, w[i].what);
    sf__aws_profile_free(&p);
}
#define EXPECT_FIELDS(name, ...)                                                                   \
    expect_fields(name, (const struct field_want[]){__VA_ARGS__},                                  \
                  sizeof((const struct field_want[]){__VA_ARGS__}) / sizeof(struct field_want))
/* Profile name is found and loads with field want (NULL: unset). */
#define EXPECT_FIELD(name, field, want, what) EXPECT_FIELDS(name, FIELD(field, want, what))

Test(aws_config, default_profile_from_credentials_file)
{
    write_cred("[default]\n"
               "aws_access_key_id = AKIDDEFAULT\n"
               "aws_secret_access_key = secret-default\n"
               "aws_session_token = token-default\n"
               "[other]\n"
               "aws_access_key_id = AKIDOTHER\n");
    struct sf__aws_profile p;
    load(NULL, &p);
    cr_expect_eq(p.found, 1);
    expect_str(p.name, "default", "name");
    expect_str(p.aws_access_key_id, "AKIDDEFAULT", "access key");
    expect_str(p.aws_secret_access_key, "secret-default", "secret");
    expect_str(p.aws_session_token, "token-default", "token");
    expect_str(p.region, NULL, "region");
    sf__aws_profile_free(&p);
    cr_expect_null(p.name, "free zeroes the struct");
}

Test(aws_config, named_profile_and_aws_profile_env)
{
    write_cred("[default]\naws_access_key_id = AKIDDEFAULT\n"
               "[work]\naws_access_key_id = AKIDWORK\n");
    struct sf__aws_profile p;
    EXPECT_FIELD("work", aws_access_key_id, "AKIDWORK", "explicit name");

    setenv("AWS_PROFILE", "work", 1);
    load(NULL, &p);
    expect_str(p.name, "work", "AWS_PROFILE names the profile");
    expect_str(p.aws_access_key_id, "AKIDWORK", "AWS_PROFILE");
    sf__aws_profile_free(&p);

    EXPECT_FIELD("default", aws_access_key_id, "AKIDDEFAULT", "an explicit name beats AWS_PROFILE");
}

Test(aws_config, config_needs_profile_prefix_except_default)
{
    write_config("[default]\nregion = eu-west-1\n"
                 "[profile dev]\nregion = us-west-2\n"
                 "[bare]\nregion = ap-south-1\n"
                 "[sso-session dev]\nregion = sa-east-1\n"
                 "[services dev]\nregion = me-south-1\n");
    struct sf__aws_profile p;
    load("default", &p);
    cr_expect_eq(p.found, 1);
    expect_str(p.region, "eu-west-1", "[default]");
    sf__aws_profile_free(&p);

    load("dev", &p);
    cr_expect_eq(p.found, 1);
    expect_str(p.region, "us-west-2", "[profile dev], not [sso-session dev] or [services dev]");
    sf__aws_profile_free(&p);

    load("bare", &p);
    cr_expect_eq(p.found, 0, "[bare] in config is not a profile");
    expect_str(p.region, NULL, "[bare]");
    sf__aws_profile_free(&p);
}

Test(aws_config, credentials_file_takes_names_without_prefix)
{
    write_cred("[profile dev]\naws_access_key_id = AKIDPREFIXED\n"
               "[dev]\naws_access_key_id = AKIDPLAIN\n");
    EXPECT_FIELD("dev", aws_access_key_id, "AKIDPLAIN", "[dev] in credentials");
    EXPECT_FIELD("profile dev", aws_access_key_id, "AKIDPREFIXED",
                 "[profile dev] in credentials is literal");
}

Test(aws_config, profile_default_and_spacing_and_quotes_in_config)
{
    write_config("[profile default]\nregion = r1\n"
                 "[  profile   spaced  ]\nregion = r2\n"
                 "[profile \"quoted name\"]\nregion = r3\n");
    EXPECT_FIELD("default", region, "r1", "[profile default]");
    EXPECT_FIELD("spaced", region, "r2", "blanks inside brackets");
    EXPECT_FIELD("quoted name", region, "r3", "quoted profile name");
}

Test(aws_config, s3_subsection_endpoint_wins_over_top_level)
{
    write_config("[profile minio]\n"
                 "endpoint_url = http://top-level:9000\n"
                 "s3 =\n"
                 "  endpoint_url = http://s3-only:9000\n"
                 "\n"
                 "  addressing_style = path\n"
                 "region = us-east-2\n"
                 "[profile other]\n"
                 "endpoint_url = http://other-top:9000\n"
                 "sts =\n"
                 "    endpoint_url = http://sts:1\n"
                 "    addressing_style = virtual\n");
    EXPECT_FIELDS("minio",
                  FIELD(endpoint_url, "http://s3-only:9000", "s3 sub-section endpoint_url"),
                  FIELD(addressing_style, "path", "s3 addressing_style across a blank line"),
                  FIELD(region, "us-east-2", "a key after the sub-section ends it"));
    EXPECT_FIELDS("other",
                  FIELD(endpoint_url, "http://other-top:9000", "another service's sub-section"),
                  FIELD(addressing_style, NULL, "sts addressing_style is not s3's"));
}

Test(aws_config, comments_whitespace_crlf_and_key_case)
{
    write_config("# leading comment\n"
                 "; another\n"
                 "[default]   ; comment after the header\n"
                 "   # indented comment\n"
                 "\tREGION\t=\t us-west-1   # inline comment\r\n"
                 "ca_bundle = /etc/ca#not-a-comment.pem\r\n"
                 "endpoint_url=http://127.0.0.1:9000;x ; comment\n");
    EXPECT_FIELDS(NULL, FIELD(region, "us-west-1", "trimmed, CRLF, key case, inline comment"),
                  FIELD(ca_bundle, "/etc/ca#not-a-comment.pem", "'#' without a blank before it"),
                  FIELD(endpoint_url, "http://127.0.0.1:9000;x", "';' without a blank before it"));
}

Test(aws_config, credentials_file_overrides_config)
{
    write_config("[profile dev]\n"
                 "aws_access_key_id = AKIDCONFIG\n"
                 "aws_secret_access_key = secret-config\n"
                 "region = eu-central-1\n");
    write_cred("[dev]\n"
               "aws_access_key_id = AKIDCRED\n"
               "aws_secret_access_key = secret-cred\n");
    EXPECT_FIELDS("dev", FIELD(aws_access_key_id, "AKIDCRED", "credentials file wins"),
                  FIELD(aws_secret_access_key, "secret-cred", "credentials file wins"),
                  FIELD(region, "eu-central-1", "config-only keys stay"));
}

Test(aws_config, last_duplicate_wins_and_sections_merge)
{
    write_cred("[default]\n"
               "aws_access_key_id = AKIDFIRST\n"
               "aws_access_key_id = AKIDSECOND\n"
               "[other]\n"
               "aws_access_key_id = AKIDOTHER\n"
               "[default]\n"
               "aws_secret_access_key = secret-later\n");
    EXPECT_FIELDS(NULL, FIELD(aws_access_key_id, "AKIDSECOND", "last duplicate key"),
                  FIELD(aws_secret_access_key, "secret-later", "a repeated section merges"));
}

Test(aws_config, missing_files_are_not_an_error)
{
    struct sf__aws_profile p;
    load(NULL, &p);
    cr_expect_eq(p.found, 0);
    expect_str(p.name, "default", "name");
    expect_str(p.aws_access_key_id, NULL, "no key");
    sf__aws_profile_free(&p);

    write_cred("[default]\naws_access_key_id = AKID\n");
    load("absent", &p);
    cr_expect_eq(p.found, 0, "an existing file without the profile");
    sf__aws_profile_free(&p);
}

Test(aws_config, dev_null_counts_as_absent_and_directory_is_io)
{
    setenv("AWS_CONFIG_FILE", "/dev/null", 1);
    struct sf__aws_profile p;
    load(NULL, &p);
    cr_expect_eq(p.found, 0);
    sf__aws_profile_free(&p);

    setenv("AWS_SHARED_CREDENTIALS_FILE", dir, 1);
    char err[512] = "";
    cr_expect_eq(sf__aws_profile_load(NULL, &p, err, sizeof(err)), SF_ERR_IO);
    cr_expect(strstr(err, dir) != NULL, "the message names the path: %s", err);
    cr_expect_null(p.name, "a failed load leaves the struct empty");
    sf__aws_profile_free(&p);
}

Test(aws_config, over_long_line_is_limit_and_quotes_nothing)
{
    size_t n = 64 * 1024 + 10;
    char *text = malloc(n + 64);
    cr_assert(text);
    int head = snprintf(text, 64, "[default]\naws_secret_access_key = ");
    memset(text + head, 'S', n);
    memcpy(text + head + n, "\n", 2);
    cr_assert(test_write_file(dir, "credentials", text, strlen(text)) == 0);
    free(text);

    struct sf__aws_profile p;
    char err[512] = "";
    cr_expect_eq(sf__aws_profile_load(NULL, &p, err, sizeof(err)), SF_ERR_LIMIT);
    cr_expect(strstr(err, cred_path) != NULL, "names the file: %s", err);
    cr_expect(strstr(err, "line 2") != NULL, "names the line: %s", err);
    cr_expect(strstr(err, "SSSS") == NULL, "quotes no value: %s", err);
    sf__aws_profile_free(&p);
}

Test(aws_config, line_at_the_cap_is_fine)
{
    size_t n = 64 * 1024;
    char *text = malloc(n + 64);
    cr_assert(text);
    int head = snprintf(text, 64, "[default]\n");
    const char *kv = "region = ";
    memcpy(text + head, kv, strlen(kv));
    memset(text + head + strlen(kv), 'r', n - strlen(kv));
    memcpy(text + head + n, "\r\n", 3);
    cr_assert(test_write_file(dir, "config", text, strlen(text)) == 0);
    free(text);
    struct sf__aws_profile p;
    load(NULL, &p);
    cr_assert_not_null(p.region);
    cr_expect_eq(strlen(p.region), n - strlen(kv));
    sf__aws_profile_free(&p);
}

Test(aws_config, over_large_file_is_limit)
{
    size_t n = 4 * 1024 * 1024 + 1;
    char *text = malloc(n);
    cr_assert(text);
    for (size_t i = 0; i < n; i++)
        text[i] = (i % 64 == 63) ? '\n' : '#';
    cr_assert(test_write_file(dir, "config", text, n) == 0);
    free(text);
    struct sf__aws_profile p;
    char err[512] = "";
    cr_expect_eq(sf__aws_profile_load(NULL, &p, err, sizeof(err)), SF_ERR_LIMIT);
    cr_expect(strstr(err, config_path) != NULL, "names the file: %s", err);
    sf__aws_profile_free(&p);
}

Test(aws_config, malformed_line_is_parse_error_without_the_value)
{
    write_cred("[default]\n"
               "aws_access_key_id = AKID\n"
               "this-line-holds-SECRETVALUE-and-no-equals\n");
    struct sf__aws_profile p;
    char err[512] = "";
    cr_expect_eq(sf__aws_profile_load(NULL, &p, err, sizeof(err)), SF_ERR_PARSE);
    cr_expect(strstr(err, "line 3") != NULL, "names the line: %s", err);
    cr_expect(strstr(err, "SECRETVALUE") == NULL, "quotes no value: %s", err);
    sf__aws_profile_free(&p);

    write_cred("aws_access_key_id = before-any-section\n");
    cr_expect_eq(sf__aws_profile_load(NULL, &p, err, sizeof(err)), SF_ERR_PARSE);
    cr_expect(strstr(err, "line 1") != NULL, "%s", err);
    sf__aws_profile_free(&p);

    write_cred("[default\n");
    cr_expect_eq(sf__aws_profile_load(NULL, &p, err, sizeof(err)), SF_ERR_PARSE);
    sf__aws_profile_free(&p);
}

Test(aws_config, load_files_takes_explicit_paths)
{
    write_cred("[x]\naws_access_key_id = AKIDX\n");
    write_config("[profile x]\nregion = r-x\n");
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_CONFIG_FILE");
    setenv("HOME", "/nonexistent-home", 1);
    struct sf__aws_profile p;
    char err[256] = "";
    cr_assert_eq(sf__aws_profile_load_files("x", cred_path, config_path, &p, err, sizeof(err)),
                 SF_OK, "%s", err);
    expect_str(p.aws_access_key_id, "AKIDX", "credentials path");
    expect_str(p.region, "r-x", "config path");
    sf__aws_profile_free(&p);

    cr_assert_eq(sf__aws_profile_load_files("x", NULL, NULL, &p, err, sizeof(err)), SF_OK);
    cr_expect_eq(p.found, 0, "NULL paths: no files");
    sf__aws_profile_free(&p);
}

Test(aws_config, paths_from_home_and_overrides)
{
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    unsetenv("AWS_CONFIG_FILE");
    setenv("HOME", "/home/x", 1);
    char *c = sf__aws_config_path(0), *f = sf__aws_config_path(1);
    expect_str(c, "/home/x/.aws/credentials", "credentials default");
    expect_str(f, "/home/x/.aws/config", "config default");
    free(c);
    free(f);

    setenv("AWS_CONFIG_FILE", "~/elsewhere/cfg", 1);
    f = sf__aws_config_path(1);
    expect_str(f, "/home/x/elsewhere/cfg", "~ expands to HOME");
    free(f);

    unsetenv("HOME");
    c = sf__aws_config_path(0);
    cr_expect_null(c, "no HOME, no override: NULL");
    free(c);
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/etc/creds", 1);
    c = sf__aws_config_path(0);
    expect_str(c, "/etc/creds", "override without HOME");
    free(c);
}

Test(aws_config, values_with_other_keys_and_continuations_are_ignored)
{
    write_config("[default]\n"
                 "cli_pager =\n"
                 "region = us-east-1\n"
                 "  continued = not-a-key\n"
                 "s3 =\n"
                 "  max_concurrent_requests = 20\n"
                 "  endpoint_url = http://sub:1\n");
    EXPECT_FIELDS(NULL, FIELD(region, "us-east-1", "an indented line after a value continues it"),
                  FIELD(endpoint_url, "http://sub:1", "s3 sub-section"));
}

Test(aws_config, s3_endpoint_url_wins_in_any_order_and_either_file)
{
    /* The s3 sub-section comes first and a later top-level endpoint_url in
     * the same profile, then in the credentials file, must not replace it;
     * a later s3 value does (the last one wins). */
    write_config("[default]\n"
                 "s3 =\n"
                 "  endpoint_url = http://s3-first:1\n"
                 "endpoint_url = http://top-after:2\n"
                 "[profile two]\n"
                 "s3 =\n"
                 "  endpoint_url = http://s3-old:3\n"
                 "s3 =\n"
                 "  endpoint_url = http://s3-new:4\n");
    write_cred("[default]\n"
               "endpoint_url = http://top-in-credentials:5\n"
               "[three]\n"
               "endpoint_url = http://top-only:6\n");
    EXPECT_FIELD(NULL, endpoint_url, "http://s3-first:1", "s3 sub-section before the top level");
    EXPECT_FIELD("two", endpoint_url, "http://s3-new:4", "the last s3 sub-section value");
    EXPECT_FIELD("three", endpoint_url, "http://top-only:6", "top level when no s3 value");
}
