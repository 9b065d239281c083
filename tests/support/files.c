#include "support/files.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

int test_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

unsigned char *test_load(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    cr_assert(b);
    cr_assert(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return b;
}

char *test_slurp(const char *path)
{
    size_t n;
    unsigned char *b = test_load(path, &n);
    char *s = realloc(b, n + 1);
    cr_assert(s);
    s[n] = '\0';
    return s;
}

cJSON *test_load_json(const char *path)
{
    size_t n;
    unsigned char *b = test_load(path, &n);
    cJSON *j = cJSON_ParseWithLength((const char *)b, n);
    free(b);
    cr_assert(j, "%s: not JSON", path);
    return j;
}

double test_jnum(const cJSON *j, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    cr_assert(cJSON_IsNumber(x), "no number '%s'", name);
    return x->valuedouble;
}

const char *test_jstr(const cJSON *j, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    cr_assert(cJSON_IsString(x), "no string '%s'", name);
    return x->valuestring;
}
