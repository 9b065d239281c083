/* Test support for Criterion suites that read what a program wrote: whole
 * files, JSON members, and shell commands. Each fails the test (cr_assert)
 * when it cannot do its part. */
#ifndef SF_TEST_FILES_H
#define SF_TEST_FILES_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* system() of the formatted command; its exit status, -1 when killed. */
int test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The whole file (malloc'd) and its size. */
unsigned char *test_load(const char *path, size_t *size);
/* The whole file as a NUL-terminated string (malloc'd). */
char *test_slurp(const char *path);
/* The file parsed as JSON (cJSON_Delete it). */
cJSON *test_load_json(const char *path);
/* j[name], which must be a number / a string. */
double test_jnum(const cJSON *j, const char *name);
const char *test_jstr(const cJSON *j, const char *name);

#endif
