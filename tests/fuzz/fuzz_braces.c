/* Brace patterns (s3/braces.c). The whole input is the pattern (up to its
 * first NUL). A pattern sf__has_braces() calls plain expands to itself. */
#include "fuzz.h"
#include "s3/braces.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *pat = (char *)fz_copy(data, size, 1);
    int has = sf__has_braces(pat);
    char **out = NULL;
    size_t n = 0;
    char err[256];
    err[0] = '\0';
    sf_status st = sf__brace_expand(pat, 4096, &out, &n, err, sizeof err);
    if (st == SF_OK) {
        fz_check(n >= 1 && n <= 4096, "%zu results", n);
        if (!has)
            fz_check(n == 1 && !strcmp(out[0], pat), "a plain pattern does not expand to itself");
        for (size_t i = 0; i < n; i++)
            fz_check(out[i] != NULL, "NULL result");
        sf__strv_free(out, n);
    } else {
        fz_check(out == NULL && n == 0, "results on failure");
        fz_check(err[0] != '\0', "a failure without a message");
        fz_check(has || st == SF_ERR_NO_MEMORY, "a plain pattern fails: %s", err);
    }
    free(pat);
    return 0;
}
