#include <criterion/criterion.h>

#include "shardfeed.h"

#include <limits.h>

static void expect_bytes(const char *text, unsigned long long want)
{
    unsigned long long got = 12345;
    sf_status st = sf_parse_bytes(text, &got);
    cr_expect_eq(st, SF_OK, "sf_parse_bytes(\"%s\") failed: %d", text, (int)st);
    cr_expect_eq(got, want, "sf_parse_bytes(\"%s\") = %llu, want %llu", text, got, want);
}

static void expect_rejected(const char *text)
{
    unsigned long long got = 777;
    cr_expect_eq(sf_parse_bytes(text, &got), SF_ERR_INVALID_ARGUMENT,
                 "sf_parse_bytes(\"%s\") should be rejected", text);
    cr_expect_eq(got, 777, "sf_parse_bytes(\"%s\") wrote *out on failure", text);
}

Test(units, plain_numbers)
{
    expect_bytes("0", 0);
    expect_bytes("1", 1);
    expect_bytes("512", 512);
    expect_bytes("007", 7);
    expect_bytes("18446744073709551615", ULLONG_MAX);
}

Test(units, all_spellings_of_a_unit_are_binary)
{
    const unsigned long long mib8 = 8ull << 20;
    expect_bytes("8M", mib8);
    expect_bytes("8MB", mib8);
    expect_bytes("8MiB", mib8);
    /* "Mi" is accepted as MiB: same unit, one more spelling users type. */
    expect_bytes("8Mi", mib8);
    expect_bytes("8m", mib8);
    expect_bytes("8mb", mib8);
    expect_bytes("8mib", mib8);
    expect_bytes("8MIB", mib8);
    expect_bytes("8mIb", mib8);
}

Test(units, every_unit)
{
    expect_bytes("3B", 3);
    expect_bytes("3b", 3);
    expect_bytes("3K", 3ull << 10);
    expect_bytes("3KiB", 3072);
    expect_bytes("3G", 3ull << 30);
    expect_bytes("3T", 3ull << 40);
    expect_bytes("3P", 3ull << 50);
    expect_bytes("3pib", 3ull << 50);
    expect_bytes("0K", 0);
}

Test(units, largest_values_that_fit)
{
    expect_bytes("16777215T", 16777215ull << 40);
    expect_bytes("16383P", 16383ull << 50);
    expect_bytes("17179869183G", 17179869183ull << 30);
}

Test(units, overflow_rejected)
{
    expect_rejected("18446744073709551616"); /* ULLONG_MAX + 1 */
    expect_rejected("99999999999999999999999");
    expect_rejected("16777216T"); /* 2^24 * 2^40 = 2^64 */
    expect_rejected("16384P");
    expect_rejected("17179869184G");
    expect_rejected("18446744073709551615K");
}

Test(units, unknown_units_rejected)
{
    expect_rejected("16E"); /* no exbibytes, and 16 EiB would not fit anyway */
    expect_rejected("1E");
    expect_rejected("1X");
    expect_rejected("1KK");
    expect_rejected("1MBB");
    expect_rejected("1BM");
    expect_rejected("1iB"); /* "i" needs a unit letter */
    expect_rejected("1i");
    expect_rejected("1KBi"); /* order is unit, i, B */
    expect_rejected("1Mbyte");
    expect_rejected("1kB/s");
}

Test(units, malformed_rejected)
{
    expect_rejected("");
    expect_rejected("M");
    expect_rejected("MiB");
    expect_rejected("1.5G");
    expect_rejected("1,5G");
    expect_rejected("-1");
    expect_rejected("+1");
    expect_rejected(" 8M");
    expect_rejected("8M ");
    expect_rejected("8 M");
    expect_rejected("8\tM");
    expect_rejected("0x10");
    expect_rejected("1e3");
}

Test(units, null_arguments)
{
    unsigned long long v = 1;
    cr_expect_eq(sf_parse_bytes(NULL, &v), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_parse_bytes("8M", NULL), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(v, 1);
}
