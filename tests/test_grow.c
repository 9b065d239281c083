#include <criterion/criterion.h>

#include "common/grow.h"

#include <stdint.h>
#include <stdlib.h>

Test(grow, keeps_the_array_while_there_is_room)
{
    size_t cap = 4;
    int *v = malloc(cap * sizeof(*v));
    cr_assert_not_null(v);
    cr_expect_eq(sf__grow(v, 3, &cap, sizeof(*v), 16), v);
    cr_expect_eq(cap, 4);
    free(v);
}

Test(grow, starts_at_first_cap_then_doubles_keeping_the_items)
{
    size_t cap = 0, n = 0;
    int *v = NULL;
    for (int i = 0; i < 100; i++) {
        int *g = sf__grow(v, n, &cap, sizeof(*v), 8);
        cr_assert_not_null(g);
        v = g;
        v[n++] = i;
        if (i == 0)
            cr_expect_eq(cap, 8);
    }
    cr_expect_eq(cap, 128); /* 8, 16, 32, 64, 128 */
    for (int i = 0; i < 100; i++)
        cr_expect_eq(v[i], i);
    free(v);
}

Test(grow, refuses_a_size_that_overflows_and_leaves_the_array)
{
    size_t cap = 4;
    int *v = malloc(cap * sizeof(*v));
    cr_assert_not_null(v);
    size_t huge = SIZE_MAX / 2 + 1; /* doubling wraps */
    size_t before = huge;
    cr_expect_null(sf__grow(v, huge, &before, 1, 8));
    cr_expect_eq(before, huge);
    cr_expect_null(sf__grow(v, 4, &cap, SIZE_MAX / 4, 8)); /* 8 items of SIZE_MAX/4 bytes */
    cr_expect_eq(cap, 4);
    free(v);
}
