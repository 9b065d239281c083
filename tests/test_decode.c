#include <criterion/criterion.h>
Test(decode, placeholder) { cr_assert(1); }
