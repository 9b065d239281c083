/* The learned-count store (src/counts.c): keys, lookups, torn and damaged
 * lines, several writers. */
#include "src/counts.h"
#include "support/mock_proc.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *tmp;

static void teardown(void)
{
    if (tmp) {
        test_rmtree(tmp);
        free(tmp);
        tmp = NULL;
    }
}

TestSuite(counts, .fini = teardown, .timeout = 60);

static void append_raw(const char *text)
{
    char path[900];
    snprintf(path, sizeof(path), "%s/v1/counts.log", tmp);
    int fd = open(path, O_WRONLY | O_APPEND);
    cr_assert(fd >= 0, "%s", path);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

Test(counts, a_key_names_the_url_the_etag_and_the_size)
{
    struct sf__count_key a = sf__count_key_of("s3://b/k.tar", "\"e1\"", 100);
    struct sf__count_key same = sf__count_key_of("s3://b/k.tar", "\"e1\"", 100);
    cr_assert(a.hi == same.hi && a.lo == same.lo);
    struct sf__count_key other[] = {
        sf__count_key_of("s3://b/k2.tar", "\"e1\"", 100),
        sf__count_key_of("s3://b/k.tar", "\"e2\"", 100),
        sf__count_key_of("s3://b/k.tar", "\"e1\"", 101),
        /* The separators keep "ab"+"c" apart from "a"+"bc". */
        sf__count_key_of("s3://b/k.tar\"", "e1\"", 100),
    };
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
        cr_assert(other[i].hi != a.hi || other[i].lo != a.lo, "key %zu equals the first", i);
}

Test(counts, saved_counts_are_found_and_others_left_alone)
{
    tmp = test_tmpdir();
    cr_assert(tmp);
    struct sf__count_key k[3] = {sf__count_key_of("u0", "e", 1), sf__count_key_of("u1", "e", 1),
                                 sf__count_key_of("u2", "e", 1)};
    uint64_t counts[3] = {7, 7, 7};
    unsigned char found[3] = {0, 0, 0};
    /* No store yet: nothing found, no error. */
    cr_assert_eq(sf__counts_lookup(tmp, k, 3, counts, found), SF_OK);
    cr_assert(!found[0] && !found[1] && !found[2]);
    cr_assert_eq(sf__counts_append(tmp, k[2], 1234567890123ULL), SF_OK);
    cr_assert_eq(sf__counts_append(tmp, k[0], 0), SF_OK);
    cr_assert_eq(sf__counts_lookup(tmp, k, 3, counts, found), SF_OK);
    cr_assert(found[0] && !found[1] && found[2]);
    cr_assert_eq(counts[0], 0u);
    cr_assert_eq(counts[1], 7u, "a count not found is untouched");
    cr_assert_eq(counts[2], 1234567890123ULL);
}

/* A fresh store holding one line, k[0]'s count 10, of the four keys u0..u3;
 * counts and found: what lookup_four found of them. */
struct four_keys {
    struct sf__count_key k[4];
    char path[900]; /* the log */
    off_t one_line; /* its size with k[0]'s line alone */
    uint64_t counts[4];
    unsigned char found[4];
};

static void four_keys_and_one_line(struct four_keys *f)
{
    tmp = test_tmpdir();
    cr_assert(tmp);
    const char *url[4] = {"u0", "u1", "u2", "u3"};
    for (int i = 0; i < 4; i++)
        f->k[i] = sf__count_key_of(url[i], "e", 1);
    cr_assert_eq(sf__counts_append(tmp, f->k[0], 10), SF_OK);
    snprintf(f->path, sizeof(f->path), "%s/v1/counts.log", tmp);
    struct stat sb;
    cr_assert(stat(f->path, &sb) == 0);
    f->one_line = sb.st_size;
}

/* Looks the four keys up; k[0]'s line, the first one, is always found. */
static void lookup_four(struct four_keys *f)
{
    memset(f->counts, 0, sizeof(f->counts));
    memset(f->found, 0, sizeof(f->found));
    cr_assert_eq(sf__counts_lookup(tmp, f->k, 4, f->counts, f->found), SF_OK);
    cr_assert(f->found[0] && f->counts[0] == 10);
}

Test(counts, torn_damaged_and_foreign_lines_are_ignored)
{
    struct four_keys f;
    four_keys_and_one_line(&f);
    /* k[1]: a line whose count was altered (the check no longer agrees). */
    cr_assert_eq(sf__counts_append(tmp, f.k[1], 11), SF_OK);
    FILE *fp = fopen(f.path, "r+");
    cr_assert(fp);
    cr_assert(fseek(fp, (long)(f.one_line + 33), SEEK_SET) == 0);
    cr_assert(fputc('9', fp) != EOF); /* "11" -> "91" */
    fclose(fp);
    append_raw("not a count line\n\n");
    /* k[2]: a torn line (a crash mid-write), then a whole one for k[3]
     * after a newline. */
    cr_assert_eq(sf__counts_append(tmp, f.k[2], 12), SF_OK);
    struct stat sb;
    cr_assert(stat(f.path, &sb) == 0);
    cr_assert(truncate(f.path, sb.st_size - 5) == 0);
    append_raw("\n");
    cr_assert_eq(sf__counts_append(tmp, f.k[3], 13), SF_OK);
    lookup_four(&f);
    cr_assert(!f.found[1], "a damaged line was trusted (count %llu)",
              (unsigned long long)f.counts[1]);
    cr_assert(!f.found[2], "a torn line was trusted (count %llu)", (unsigned long long)f.counts[2]);
    cr_assert(f.found[3] && f.counts[3] == 13);
}

/* A crash mid-append leaves a line with no newline; the next append lands
 * right after it, on the same physical line. That whole line must still be
 * found, whatever came before it (one torn piece or several, even longer
 * than any line). */
Test(counts, a_line_appended_after_a_torn_one_is_kept)
{
    struct four_keys f;
    four_keys_and_one_line(&f);
    /* k[1]: torn after 40 of its bytes (inside the count), no newline. */
    cr_assert_eq(sf__counts_append(tmp, f.k[1], 123456789), SF_OK);
    cr_assert(truncate(f.path, f.one_line + 40) == 0);
    cr_assert_eq(sf__counts_append(tmp, f.k[2], 12), SF_OK);
    /* Torn pieces of 300 bytes in all (longer than any line), then k[3]. */
    for (int i = 0; i < 10; i++)
        append_raw("0123456789abcdef0123456789abcdef");
    cr_assert_eq(sf__counts_append(tmp, f.k[3], 13), SF_OK);
    lookup_four(&f);
    cr_assert(!f.found[1], "a torn line was trusted (count %llu)", (unsigned long long)f.counts[1]);
    cr_assert(f.found[2], "the line after a torn one was lost");
    cr_assert_eq(f.counts[2], 12u);
    cr_assert(f.found[3], "the line after long torn pieces was lost");
    cr_assert_eq(f.counts[3], 13u);
}

Test(counts, writers_in_several_processes_never_mix_their_lines)
{
    tmp = test_tmpdir();
    cr_assert(tmp);
    enum { PROCS = 4, EACH = 200 };
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        cr_assert(pids[p] >= 0);
        if (pids[p] == 0) {
            for (int i = 0; i < EACH; i++) {
                char url[32];
                snprintf(url, sizeof(url), "u%d-%d", p, i);
                if (sf__counts_append(tmp, sf__count_key_of(url, "e", 1), (uint64_t)(p * 1000 + i)))
                    _exit(1);
            }
            _exit(0);
        }
    }
    for (int p = 0; p < PROCS; p++) {
        int status = 0;
        cr_assert(waitpid(pids[p], &status, 0) == pids[p]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    struct sf__count_key *k = calloc(PROCS * EACH, sizeof(*k));
    uint64_t *counts = calloc(PROCS * EACH, sizeof(*counts));
    unsigned char *found = calloc(PROCS * EACH, 1);
    cr_assert(k && counts && found);
    for (int p = 0; p < PROCS; p++)
        for (int i = 0; i < EACH; i++) {
            char url[32];
            snprintf(url, sizeof(url), "u%d-%d", p, i);
            k[p * EACH + i] = sf__count_key_of(url, "e", 1);
        }
    cr_assert_eq(sf__counts_lookup(tmp, k, PROCS * EACH, counts, found), SF_OK);
    for (int p = 0; p < PROCS; p++)
        for (int i = 0; i < EACH; i++) {
            cr_assert(found[p * EACH + i], "u%d-%d not found", p, i);
            cr_assert_eq(counts[p * EACH + i], (uint64_t)(p * 1000 + i));
        }
    free(k);
    free(counts);
    free(found);
}
