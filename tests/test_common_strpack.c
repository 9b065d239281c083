#include <criterion/criterion.h>

#include "common/strpack.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

Test(common_strpack, copies_each_string_in_one_block)
{
    const char text[] = "bucket/and/more";
    char *a = (char *)1, *b = (char *)1, *c = (char *)1, *d = (char *)1, *mem = NULL;
    const struct sf__strpack_item it[] = {
        {text, 6, &a},                              /* a prefix: n bytes, not up to a NUL */
        {"", 0, &b},                                /* empty, but present */
        {NULL, 99, &c},                             /* absent: stays NULL whatever n says */
        {"display", sf__strpack_len("display"), &d}, /* a whole string */
    };
    cr_assert_eq(sf__strpack(&mem, it, 4), 0);
    cr_assert(mem);
    cr_expect_str_eq(a, "bucket");
    cr_expect_str_eq(b, "");
    cr_expect_null(c);
    cr_expect_str_eq(d, "display");
    /* all in the block, in order, each NUL-terminated, none overlapping */
    cr_expect_eq(a, mem);
    cr_expect_eq(b, a + 7);
    cr_expect_eq(d, b + 1);
    cr_expect_neq(a, text, "a copy, not the source");
    free(mem);
}

Test(common_strpack, nothing_to_pack_is_an_empty_block)
{
    char *x = (char *)1, *mem = NULL;
    const struct sf__strpack_item it[] = {{NULL, 0, &x}};
    cr_assert_eq(sf__strpack(&mem, it, 1), 0);
    cr_expect(mem, "a block to free, even with nothing in it");
    cr_expect_null(x);
    free(mem);
    cr_expect_eq(sf__strpack_len(NULL), 0u);
}

Test(common_strpack, lengths_past_size_max_are_refused_with_every_field_null)
{
    /* as out of memory: nothing allocated, nothing copied */
    char *x = (char *)1, *y = (char *)1, *mem = (char *)1;
    const struct sf__strpack_item it[] = {{"x", SIZE_MAX - 3, &x}, {"y", 5, &y}};
    cr_assert_eq(sf__strpack(&mem, it, 2), -1);
    cr_expect_null(mem);
    cr_expect_null(x);
    cr_expect_null(y);
}
