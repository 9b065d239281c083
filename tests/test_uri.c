#include <criterion/criterion.h>

#include "common/strbuf.h"
#include "s3/uri.h"

#include <stdlib.h>
#include <string.h>

/* Encodes src and returns a malloc'd copy of the result (or NULL on error). */
static char *encode(const char *src, size_t n, int keep_slash)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf_status st = sf__uri_encode(&b, src, n, keep_slash);
    cr_assert_eq(st, SF_OK, "encode failed: %d", (int)st);
    return sf__strbuf_take(&b);
}

static void expect_encoded(const char *src, int keep_slash, const char *want)
{
    char *got = encode(src, strlen(src), keep_slash);
    cr_assert_not_null(got);
    cr_expect_str_eq(got, want, "encode(\"%s\", keep_slash=%d)", src, keep_slash);
    free(got);
}

/* Decodes src into b (reset first) and checks the exact bytes. */
static void expect_decoded(const char *src, int plus_is_space, const char *want, size_t want_len)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_assert_eq(sf__uri_decode(&b, src, strlen(src), plus_is_space), SF_OK);
    cr_expect_eq(b.len, want_len, "decode(\"%s\") length %zu, want %zu", src, b.len, want_len);
    if (b.len == want_len)
        cr_expect(memcmp(sf__strbuf_str(&b), want, want_len) == 0, "decode(\"%s\") bytes", src);
    cr_expect_eq(sf__strbuf_str(&b)[b.len], '\0', "decoded output is NUL-terminated");
    sf__strbuf_free(&b);
}

Test(uri, encode_space_is_percent20_and_plus_is_percent2B)
{
    expect_encoded("a b", 0, "a%20b");
    expect_encoded("a+b", 0, "a%2Bb");
    expect_encoded("a+b c", 1, "a%2Bb%20c");
}

Test(uri, encode_keeps_unreserved)
{
    const char *unreserved = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    expect_encoded(unreserved, 0, unreserved);
    expect_encoded(unreserved, 1, unreserved);
}

Test(uri, encode_reserved_and_specials_upper_hex)
{
    expect_encoded("!*'();:@&=$,?#[]%", 0, "%21%2A%27%28%29%3B%3A%40%26%3D%24%2C%3F%23%5B%5D%25");
    /* Upper-case hex, never lower-case. */
    expect_encoded("\xab\xcd\xef", 0, "%AB%CD%EF");
}

Test(uri, encode_utf8_bytes)
{
    /* U+1234 is E1 88 B4 in UTF-8; "é" is C3 A9. */
    expect_encoded("\xe1\x88\xb4", 1, "%E1%88%B4");
    expect_encoded("caf\xc3\xa9/x", 1, "caf%C3%A9/x");
}

Test(uri, encode_slash_depends_on_keep_slash)
{
    expect_encoded("/bucket/a/b", 1, "/bucket/a/b");
    expect_encoded("/bucket/a/b", 0, "%2Fbucket%2Fa%2Fb");
    expect_encoded("//", 1, "//");
}

Test(uri, encode_nul_and_control_bytes)
{
    char *got = encode("a\0b\n", 4, 0);
    cr_assert_not_null(got);
    cr_expect_str_eq(got, "a%00b%0A");
    free(got);
}

Test(uri, encode_empty_appends_nothing)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_assert_eq(sf__strbuf_puts(&b, "x"), SF_OK);
    cr_expect_eq(sf__uri_encode(&b, "", 0, 1), SF_OK);
    cr_expect_eq(sf__uri_encode(&b, NULL, 0, 1), SF_OK);
    cr_expect_str_eq(sf__strbuf_str(&b), "x");
    sf__strbuf_free(&b);
}

Test(uri, encode_long_input_crosses_chunks)
{
    /* Long enough to need several internal flushes; every byte expands. */
    size_t n = 5000;
    char *src = malloc(n);
    cr_assert_not_null(src);
    memset(src, ' ', n);
    char *got = encode(src, n, 0);
    cr_assert_not_null(got);
    cr_expect_eq(strlen(got), 3 * n);
    for (size_t i = 0; i < n; i++) {
        if (memcmp(got + 3 * i, "%20", 3) != 0) {
            cr_expect_fail("byte %zu not %%20", i);
            break;
        }
    }
    free(got);
    free(src);
}

Test(uri, decode_basic)
{
    expect_decoded("a%20b", 0, "a b", 3);
    expect_decoded("%E1%88%B4", 0, "\xe1\x88\xb4", 3);
    expect_decoded("%e1%88%b4", 0, "\xe1\x88\xb4", 3); /* lower-case hex too */
    expect_decoded("plain", 0, "plain", 5);
    expect_decoded("", 0, "", 0);
}

Test(uri, decode_plus_only_with_plus_is_space)
{
    expect_decoded("a+b", 0, "a+b", 3);
    expect_decoded("a+b", 1, "a b", 3);
    expect_decoded("a%2Bb", 1, "a+b", 3); /* an encoded plus stays a plus */
}

Test(uri, decode_bad_percent_sequences_kept_literally)
{
    expect_decoded("%", 0, "%", 1);
    expect_decoded("abc%", 0, "abc%", 4);
    expect_decoded("%4", 0, "%4", 2);
    expect_decoded("%zz", 0, "%zz", 3);
    expect_decoded("%4g%41", 0, "%4gA", 4);
    expect_decoded("%%41", 0, "%A", 2);
    expect_decoded("100%", 1, "100%", 4);
}

Test(uri, decode_nul_in_output_uses_len)
{
    expect_decoded("a%00b", 0, "a\0b", 3);
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_assert_eq(sf__uri_decode(&b, "%00%00", 6, 0), SF_OK);
    cr_expect_eq(b.len, 2);
    cr_expect_eq(strlen(sf__strbuf_str(&b)), 0, "a C string view stops at the NUL");
    sf__strbuf_free(&b);
}

Test(uri, decode_then_encode_round_trips)
{
    const char *wire = "/bucket/my%20key%2Bplus/%E1%88%B4";
    struct sf__strbuf dec;
    sf__strbuf_init(&dec, 0);
    cr_assert_eq(sf__uri_decode(&dec, wire, strlen(wire), 0), SF_OK);
    cr_expect_str_eq(sf__strbuf_str(&dec), "/bucket/my key+plus/\xe1\x88\xb4");
    char *enc = encode(dec.data, dec.len, 1);
    cr_assert_not_null(enc);
    cr_expect_str_eq(enc, wire);
    free(enc);
    sf__strbuf_free(&dec);
}

Test(uri, encode_respects_buffer_cap)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 8);
    /* Three bytes expand to nine: over the cap of eight. */
    cr_expect_eq(sf__uri_encode(&b, "   ", 3, 0), SF_ERR_LIMIT);
    cr_expect_eq(b.err, SF_ERR_LIMIT);
    sf__strbuf_free(&b);
}

Test(uri, null_arguments)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_expect_eq(sf__uri_encode(NULL, "a", 1, 0), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__uri_decode(NULL, "a", 1, 0), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__uri_encode(&b, NULL, 1, 0), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__uri_decode(&b, NULL, 1, 0), SF_ERR_INVALID_ARGUMENT);
    sf__strbuf_free(&b);
}

/* ------------------------------------------------------------------ strbuf */

Test(strbuf, empty_buffer_reads_as_empty_string)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_expect_null(b.data);
    cr_expect_str_eq(sf__strbuf_str(&b), "");
    char *s = sf__strbuf_take(&b);
    cr_assert_not_null(s);
    cr_expect_str_eq(s, "");
    free(s);
    sf__strbuf_free(&b);
}

Test(strbuf, zero_max_means_64_mib)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_expect_eq(b.max_bytes, (size_t)64 * 1024 * 1024);
    sf__strbuf_free(&b);
}

Test(strbuf, append_puts_putc_printf)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_expect_eq(sf__strbuf_append(&b, "ab", 2), SF_OK);
    cr_expect_eq(sf__strbuf_puts(&b, "cd"), SF_OK);
    cr_expect_eq(sf__strbuf_putc(&b, 'e'), SF_OK);
    cr_expect_eq(sf__strbuf_printf(&b, "-%d-%s-%05.1f", 42, "x", 3.14159), SF_OK);
    cr_expect_str_eq(sf__strbuf_str(&b), "abcde-42-x-003.1");
    cr_expect_eq(b.len, strlen("abcde-42-x-003.1"));
    cr_expect_eq(b.err, SF_OK);
    sf__strbuf_free(&b);
}

Test(strbuf, printf_grows_past_initial_capacity)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_assert_eq(sf__strbuf_puts(&b, "x"), SF_OK);
    /* Longer than the first allocation, so the retry path runs. */
    cr_assert_eq(sf__strbuf_printf(&b, "%0500d|%s", 7, "end"), SF_OK);
    cr_expect_eq(b.len, 1 + 500 + 4);
    cr_expect_eq(sf__strbuf_str(&b)[500], '7');
    cr_expect_str_eq(sf__strbuf_str(&b) + 501, "|end");
    sf__strbuf_free(&b);
}

Test(strbuf, cap_is_exact_and_error_is_sticky)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 5);
    cr_expect_eq(sf__strbuf_puts(&b, "12345"), SF_OK, "exactly max_bytes fits");
    cr_expect_eq(sf__strbuf_putc(&b, '6'), SF_ERR_LIMIT);
    cr_expect_eq(b.err, SF_ERR_LIMIT);
    cr_expect_str_eq(sf__strbuf_str(&b), "12345", "a failed append changes nothing");
    /* Sticky: even appends that would fit now fail, and nothing is added. */
    cr_expect_eq(sf__strbuf_append(&b, "", 0), SF_ERR_LIMIT);
    cr_expect_eq(sf__strbuf_printf(&b, "%s", ""), SF_ERR_LIMIT);
    cr_expect_eq(b.len, 5);
    cr_expect_null(sf__strbuf_take(&b), "take fails after an error");
    /* Reset clears the error and the contents, keeping the cap. */
    sf__strbuf_reset(&b);
    cr_expect_eq(b.err, SF_OK);
    cr_expect_eq(b.len, 0);
    cr_expect_str_eq(sf__strbuf_str(&b), "");
    cr_expect_eq(sf__strbuf_puts(&b, "abc"), SF_OK);
    cr_expect_eq(sf__strbuf_printf(&b, "%s", "def"), SF_ERR_LIMIT);
    cr_expect_str_eq(sf__strbuf_str(&b), "abc");
    sf__strbuf_free(&b);
}

Test(strbuf, printf_cap_checked_when_fitting_allocation)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 10);
    cr_assert_eq(sf__strbuf_puts(&b, "1234"), SF_OK);
    /* The allocation has room for more than the cap allows. */
    cr_expect_eq(sf__strbuf_printf(&b, "%s", "1234567"), SF_ERR_LIMIT);
    cr_expect_str_eq(sf__strbuf_str(&b), "1234");
    cr_expect_eq(b.len, 4);
    sf__strbuf_free(&b);
}

Test(strbuf, take_leaves_buffer_empty)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_assert_eq(sf__strbuf_puts(&b, "hello"), SF_OK);
    char *s = sf__strbuf_take(&b);
    cr_assert_not_null(s);
    cr_expect_str_eq(s, "hello");
    cr_expect_null(b.data);
    cr_expect_eq(b.len, 0);
    cr_expect_str_eq(sf__strbuf_str(&b), "");
    cr_expect_eq(sf__strbuf_puts(&b, "again"), SF_OK, "usable after take");
    cr_expect_str_eq(sf__strbuf_str(&b), "again");
    free(s);
    sf__strbuf_free(&b);
}

Test(strbuf, binary_data_with_nul)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_assert_eq(sf__strbuf_append(&b, "a\0b", 3), SF_OK);
    cr_expect_eq(b.len, 3);
    cr_expect(memcmp(b.data, "a\0b", 4) == 0);
    sf__strbuf_free(&b);
}

Test(strbuf, large_growth)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 100000);
    for (int i = 0; i < 10000; i++)
        cr_assert_eq(sf__strbuf_puts(&b, "0123456789"), SF_OK);
    cr_expect_eq(b.len, 100000);
    cr_expect_eq(sf__strbuf_putc(&b, 'x'), SF_ERR_LIMIT);
    cr_expect_leq(b.cap, 100001, "never allocates past the cap");
    sf__strbuf_free(&b);
}

Test(strbuf, null_string_is_invalid_and_sticky)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    cr_expect_eq(sf__strbuf_puts(&b, NULL), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__strbuf_puts(&b, "x"), SF_ERR_INVALID_ARGUMENT);
    sf__strbuf_free(&b);
    sf__strbuf_free(NULL);
    sf__strbuf_reset(NULL);
}
