#include <criterion/criterion.h>
Test(loader, placeholder) { cr_assert(1); }
