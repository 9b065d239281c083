#include <criterion/criterion.h>

#include "s3/braces.h"
#include "shardfeed_s3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Expands pattern and checks the exact list of results, in order. */
static void expect_expansion(const char *pattern, const char *const *want, size_t want_n)
{
    char **v = NULL;
    size_t n = 0;
    char err[256] = "";
    sf_status st = sf__brace_expand(pattern, 0, &v, &n, err, sizeof err);
    cr_assert_eq(st, SF_OK, "expand(\"%s\") failed: %d %s", pattern, (int)st, err);
    cr_expect_eq(n, want_n, "expand(\"%s\") gave %zu results, want %zu", pattern, n, want_n);
    for (size_t i = 0; i < n && i < want_n; i++)
        cr_expect_str_eq(v[i], want[i], "expand(\"%s\")[%zu]", pattern, i);
    sf__strv_free(v, n);
}

#define EXPECT_EXPANSION(pattern, ...)                                                             \
    do {                                                                                           \
        static const char *const want_[] = {__VA_ARGS__};                                          \
        expect_expansion(pattern, want_, sizeof want_ / sizeof want_[0]);                          \
    } while (0)

/* Expects a failure with status want and a message containing every
 * fragment given (e.g. the column). */
static void expect_error(const char *pattern, size_t max_results, sf_status want, const char *frag1,
                         const char *frag2)
{
    char *sentinel = NULL;
    char **v = &sentinel; /* must be reset to NULL */
    size_t n = 99;
    char err[256] = "";
    sf_status st = sf__brace_expand(pattern, max_results, &v, &n, err, sizeof err);
    cr_expect_eq(st, want, "expand(\"%s\") = %d, want %d (%s)", pattern, (int)st, (int)want, err);
    cr_expect_null(v, "expand(\"%s\") left *out set on failure", pattern);
    cr_expect_eq(n, 0);
    if (frag1)
        cr_expect(strstr(err, frag1) != NULL, "expand(\"%s\") message \"%s\" lacks \"%s\"", pattern,
                  err, frag1);
    if (frag2)
        cr_expect(strstr(err, frag2) != NULL, "expand(\"%s\") message \"%s\" lacks \"%s\"", pattern,
                  err, frag2);
    cr_expect(sf__has_braces(pattern), "has_braces(\"%s\") must be 1 for an error", pattern);
}

Test(braces, webdataset_shard_pattern_exact)
{
    EXPECT_EXPANSION("s3://b/train-{000000..000003}.tar", "s3://b/train-000000.tar",
                     "s3://b/train-000001.tar", "s3://b/train-000002.tar",
                     "s3://b/train-000003.tar");
}

Test(braces, large_padded_range_count_and_ends)
{
    char **v = NULL;
    size_t n = 0;
    cr_assert_eq(sf__brace_expand("train-{000000..001023}.tar", 0, &v, &n, NULL, 0), SF_OK);
    cr_assert_eq(n, 1024);
    cr_expect_str_eq(v[0], "train-000000.tar");
    cr_expect_str_eq(v[9], "train-000009.tar");
    cr_expect_str_eq(v[10], "train-000010.tar");
    cr_expect_str_eq(v[1023], "train-001023.tar");
    sf__strv_free(v, n);
}

Test(braces, unpadded_range)
{
    EXPECT_EXPANSION("{1..10}", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10");
    EXPECT_EXPANSION("a{8..11}b", "a8b", "a9b", "a10b", "a11b");
    EXPECT_EXPANSION("{5..5}", "5");
    /* A lone "0" is not a leading zero (braceexpand's rule). */
    EXPECT_EXPANSION("{0..10}", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10");
}

Test(braces, padding_uses_the_longer_bound_when_either_has_a_leading_zero)
{
    EXPECT_EXPANSION("{07..10}", "07", "08", "09", "10");
    EXPECT_EXPANSION("{1..003}", "001", "002", "003");
    EXPECT_EXPANSION(
        "{00..100}", "000", "001", "002", "003", "004", "005", "006", "007", "008", "009", "010",
        "011", "012", "013", "014", "015", "016", "017", "018", "019", "020", "021", "022", "023",
        "024", "025", "026", "027", "028", "029", "030", "031", "032", "033", "034", "035", "036",
        "037", "038", "039", "040", "041", "042", "043", "044", "045", "046", "047", "048", "049",
        "050", "051", "052", "053", "054", "055", "056", "057", "058", "059", "060", "061", "062",
        "063", "064", "065", "066", "067", "068", "069", "070", "071", "072", "073", "074", "075",
        "076", "077", "078", "079", "080", "081", "082", "083", "084", "085", "086", "087", "088",
        "089", "090", "091", "092", "093", "094", "095", "096", "097", "098", "099", "100");
}

Test(braces, descending_ranges)
{
    EXPECT_EXPANSION("{10..7}", "10", "9", "8", "7");
    EXPECT_EXPANSION("x{003..000}", "x003", "x002", "x001", "x000");
}

Test(braces, lists_including_empty_items)
{
    EXPECT_EXPANSION("{a,b,c}", "a", "b", "c");
    EXPECT_EXPANSION("index.html{,.backup}", "index.html", "index.html.backup");
    EXPECT_EXPANSION("x{,}y", "xy", "xy");
    /* A comma wins over "..": these are list items, not a range. */
    EXPECT_EXPANSION("{1..2,a..b}", "1..2", "a..b");
}

Test(braces, product_order_leftmost_slowest)
{
    EXPECT_EXPANSION("x{a,b}-{1..2}", "xa-1", "xa-2", "xb-1", "xb-2");
    EXPECT_EXPANSION("{a,b}{c,d}{e,f}", "ace", "acf", "ade", "adf", "bce", "bcf", "bde", "bdf");
}

Test(braces, three_brace_product_count)
{
    char **v = NULL;
    size_t n = 0;
    cr_assert_eq(
        sf__brace_expand("s3://b/{train,val,test}/{00..11}-{a,b,c,d,e}.tar", 0, &v, &n, NULL, 0),
        SF_OK);
    cr_expect_eq(n, 3 * 12 * 5);
    cr_expect_str_eq(v[0], "s3://b/train/00-a.tar");
    cr_expect_str_eq(v[1], "s3://b/train/00-b.tar");
    cr_expect_str_eq(v[5], "s3://b/train/01-a.tar");
    cr_expect_str_eq(v[60], "s3://b/val/00-a.tar");
    cr_expect_str_eq(v[n - 1], "s3://b/test/11-e.tar");
    sf__strv_free(v, n);
}

Test(braces, text_without_braces_is_returned_as_is)
{
    EXPECT_EXPANSION("s3://bucket/plain.tar", "s3://bucket/plain.tar");
    EXPECT_EXPANSION("", "");
    EXPECT_EXPANSION("a..b,c", "a..b,c");
    cr_expect_eq(sf__has_braces("s3://bucket/plain.tar"), 0);
    cr_expect_eq(sf__has_braces(""), 0);
    cr_expect_eq(sf__has_braces(NULL), 0);
}

Test(braces, brace_without_comma_or_range_is_literal)
{
    EXPECT_EXPANSION("a{b}c", "a{b}c");
    EXPECT_EXPANSION("{}", "{}");
    EXPECT_EXPANSION("{x}-{1,2}", "{x}-1", "{x}-2");
    EXPECT_EXPANSION("{1,2}{x}{3,4}", "1{x}3", "1{x}4", "2{x}3", "2{x}4");
    cr_expect_eq(sf__has_braces("a{b}c"), 0);
    cr_expect_eq(sf__has_braces("a{b}c{1,2}"), 1);
    cr_expect_eq(sf__has_braces("{0..3}"), 1);
}

Test(braces, unbalanced_braces_name_the_column)
{
    expect_error("train-{000..009.tar", 0, SF_ERR_INVALID_ARGUMENT, "unbalanced '{'", "column 7");
    expect_error("abc}", 0, SF_ERR_INVALID_ARGUMENT, "unbalanced '}'", "column 4");
    expect_error("{a,b}}", 0, SF_ERR_INVALID_ARGUMENT, "unbalanced '}'", "column 6");
    expect_error("{", 0, SF_ERR_INVALID_ARGUMENT, "column 1", NULL);
}

Test(braces, nested_braces_rejected)
{
    expect_error("x{a,{b,c}}", 0, SF_ERR_INVALID_ARGUMENT, "nested", "column 5");
}

Test(braces, bad_ranges_rejected)
{
    expect_error("{1..}", 0, SF_ERR_INVALID_ARGUMENT, "empty range bound", "column 5");
    expect_error("{..3}", 0, SF_ERR_INVALID_ARGUMENT, "empty range bound", "column 2");
    expect_error("ab{a..b}", 0, SF_ERR_INVALID_ARGUMENT, "only numeric ranges", "column 4");
    expect_error("{1..z}", 0, SF_ERR_INVALID_ARGUMENT, "\"z\"", "column 5");
    expect_error("{-1..3}", 0, SF_ERR_INVALID_ARGUMENT, "not a non-negative integer", NULL);
    expect_error("{1..10..2}", 0, SF_ERR_INVALID_ARGUMENT, "steps", "column 7");
    /* 19 digits: refused before any arithmetic could overflow. */
    expect_error("{0..1234567890123456789}", 0, SF_ERR_INVALID_ARGUMENT, "18 digits", "column 5");
}

Test(braces, eighteen_digit_bounds_work)
{
    EXPECT_EXPANSION("{999999999999999998..999999999999999999}", "999999999999999998",
                     "999999999999999999");
}

Test(braces, huge_range_fails_fast_with_limit)
{
    /* Must not try to allocate a billion entries: the count is checked first. */
    expect_error("{0..999999999}", 0, SF_ERR_LIMIT, "max_results", "column 1");
    expect_error("{0..999999999999999999}", 0, SF_ERR_LIMIT, "max_results", NULL);
    /* The product, not each brace, is what counts. */
    expect_error("{0..9999}-{0..9999}", 0, SF_ERR_LIMIT, "column 11", NULL);
}

Test(braces, max_results_is_exact)
{
    char **v = NULL;
    size_t n = 0;
    cr_expect_eq(sf__brace_expand("{1..4}{a,b}", 8, &v, &n, NULL, 0), SF_OK);
    cr_expect_eq(n, 8);
    sf__strv_free(v, n);
    expect_error("{1..4}{a,b}", 7, SF_ERR_LIMIT, "max_results (7)", NULL);
}

Test(braces, total_bytes_are_capped)
{
    /* 10 million results (the default limit) of > 110 bytes each is over
     * 1 GiB: refused up front. */
    char pattern[256];
    memset(pattern, 'x', 120);
    strcpy(pattern + 120, "{0000000..9999999}");
    expect_error(pattern, 0, SF_ERR_LIMIT, "bytes", NULL);
}

Test(braces, null_arguments)
{
    char **v = NULL;
    size_t n = 0;
    char err[64];
    cr_expect_eq(sf__brace_expand(NULL, 0, &v, &n, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__brace_expand("a", 0, NULL, &n, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__brace_expand("a", 0, &v, NULL, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    /* err is optional. */
    cr_expect_eq(sf__brace_expand("{", 0, &v, &n, NULL, 0), SF_ERR_INVALID_ARGUMENT);
    sf__strv_free(NULL, 0);
}

/* The public test the CLI and the Python tools use: a pattern exactly when
 * the expansion fails or yields something other than the URL itself. */
Test(braces, public_is_pattern_agrees_with_expansion)
{
    static const char *const urls[] = {
        "s3://b/train-{000..009}.tar", "s3://b/{a,b}/x.tar", "s3://b/plain.tar", "s3://b/x{y}.tar",
        "{}", "", "abc}", "{a", "{{a,b}}", "x-{1..1}", "a..b,c", "{1,2}{x}", "{..}", "{,}",
    };
    for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        char **v = NULL;
        size_t n = 0;
        char err[256] = "";
        sf_status st = sf__brace_expand(urls[i], 0, &v, &n, err, sizeof err);
        int names_itself = st == SF_OK && n == 1 && strcmp(v[0], urls[i]) == 0;
        cr_expect_eq(sf_s3_is_pattern(urls[i]), !names_itself, "sf_s3_is_pattern(\"%s\")",
                     urls[i]);
        sf__strv_free(v, n);
    }
    cr_expect_eq(sf_s3_is_pattern(NULL), 0);
}
