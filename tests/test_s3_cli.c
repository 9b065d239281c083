/* The CLI's ls and stat of patterns, its option parsing, get to a file on
 * stdout, and --json on failure, run as the built program against the
 * mock. Suite `s3` (test_s3.c). */
#include "s3_fixture.h"

#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/spawn.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ============================================================ CLI: ls and stat of patterns */

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

Test(s3, cli_ls_of_a_pattern_lists_every_object)
{
    start_mock(NULL);
    put_shards("cli/t-", 6, NULL, NULL);
    put_small("cli/t-003.idx", 1);
    const char *ls[] = {"ls", "s3://bucket/cli/t-{005..000}.tar", NULL};
    cr_assert_eq(cli_run("ls", ls), 0, "%s", cli_output("ls", "err"));
    const char *out = cli_output("ls", "out");
    cr_expect_eq(count_lines(out), 6, "%s", out);
    const char *at = out;
    for (int i = 5; i >= 0; i--) {
        char line[64];
        snprintf(line, sizeof(line), "%12d  cli/t-%03d.tar\n", 100 + i, i);
        const char *hit = strstr(out, line);
        cr_expect(hit && hit >= at, "'%s' missing or out of order in:\n%s", line, out);
        if (hit)
            at = hit;
    }
    cr_expect_null(strstr(out, "t-003.idx"));

    const char *js[] = {"ls", "--json", "s3://bucket/cli/t-{000..005}.tar", NULL};
    cr_assert_eq(cli_run("lsj", js), 0, "%s", cli_output("lsj", "err"));
    cJSON *arr = cJSON_Parse(cli_output("lsj", "out"));
    cr_assert(cJSON_IsArray(arr));
    cr_assert_eq(cJSON_GetArraySize(arr), 6);
    for (int i = 0; i < 6; i++) {
        const cJSON *o = cJSON_GetArrayItem(arr, i);
        cr_expect_eq(jnum(o, "size", NULL, NULL), 100 + i);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "etag");
        cr_expect(cJSON_IsString(e) && strlen(e->valuestring) == 34);
    }
    cJSON_Delete(arr);

    /* a plain prefix is still listed, grouped at '/' */
    put_small("cli/sub/x.bin", 3);
    const char *pre[] = {"ls", "s3://bucket/cli/", NULL};
    cr_assert_eq(cli_run("pre", pre), 0, "%s", cli_output("pre", "err"));
    out = cli_output("pre", "out");
    cr_expect_eq(count_lines(out), 8, "%s", out);
    cr_expect(strstr(out, "PRE  cli/sub/"), "%s", out);
    cr_expect(strstr(out, "cli/t-003.idx"), "%s", out);
}

Test(s3, cli_stat_of_a_pattern_and_of_several_urls)
{
    start_mock(NULL);
    char etags[6][35];
    put_shards("cli/t-", 6, NULL, etags);
    const char *st[] = {"stat", "s3://bucket/cli/t-{000..005}.tar", NULL};
    cr_assert_eq(cli_run("stat", st), 0, "%s", cli_output("stat", "err"));
    const char *out = cli_output("stat", "out");
    for (int i = 0; i < 6; i++) {
        char want[400];
        snprintf(want, sizeof(want),
                 "url:           s3://bucket/cli/t-%03d.tar\nsize:          %d\n"
                 "etag:          %s\n",
                 i, 100 + i, etags[i]);
        cr_expect(strstr(out, want), "no block for %d in:\n%s", i, out);
    }

    const char *two[] = {"stat", "--json", "s3://bucket/cli/t-004.tar",
                         "s3://bucket/cli/t-{001,002}.tar", NULL};
    cr_assert_eq(cli_run("two", two), 0, "%s", cli_output("two", "err"));
    cJSON *arr = cJSON_Parse(cli_output("two", "out"));
    cr_assert(cJSON_IsArray(arr));
    cr_assert_eq(cJSON_GetArraySize(arr), 3);
    cr_expect_eq(jnum(cJSON_GetArrayItem(arr, 0), "size", NULL, NULL), 104);
    cr_expect_eq(jnum(cJSON_GetArrayItem(arr, 1), "size", NULL, NULL), 101);
    cr_expect_eq(jnum(cJSON_GetArrayItem(arr, 2), "size", NULL, NULL), 102);
    cJSON_Delete(arr);

    /* one plain URL: one JSON object, as before */
    const char *one[] = {"stat", "--json", "s3://bucket/cli/t-003.tar", NULL};
    cr_assert_eq(cli_run("one", one), 0, "%s", cli_output("one", "err"));
    cJSON *o = cJSON_Parse(cli_output("one", "out"));
    cr_assert(cJSON_IsObject(o));
    cr_expect_eq(jnum(o, "size", NULL, NULL), 103);
    cJSON_Delete(o);
}

Test(s3, cli_ls_and_stat_of_a_pattern_with_a_missing_object_exit_1)
{
    start_mock(NULL);
    int skip[] = {3, -1};
    put_shards("cli/t-", 6, skip, NULL);
    const char *cmds[] = {"ls", "stat"};
    for (int c = 0; c < 2; c++) {
        const char *args[] = {cmds[c], "s3://bucket/cli/t-{000..005}.tar", NULL};
        cr_assert_eq(cli_run(cmds[c], args), 1, "%s", cmds[c]);
        cr_expect_str_eq(cli_output(cmds[c], "out"), "", "%s printed objects", cmds[c]);
        const char *err = cli_output(cmds[c], "err");
        cr_expect(strstr(err, "s3://bucket/cli/t-003.tar"), "%s: %s", cmds[c], err);
        cr_expect(strstr(err, "SF_ERR_NOT_FOUND"), "%s: %s", cmds[c], err);
    }
    /* a plain missing key and a bad pattern */
    const char *one[] = {"stat", "s3://bucket/cli/t-003.tar", NULL};
    cr_expect_eq(cli_run("one", one), 1);
    cr_expect(strstr(cli_output("one", "err"), "s3://bucket/cli/t-003.tar"), "%s",
              cli_output("one", "err"));
    const char *bad[] = {"ls", "s3://bucket/cli/t-{000..", NULL};
    cr_expect_eq(cli_run("bad", bad), 1);
    cr_expect(strstr(cli_output("bad", "err"), "SF_ERR_INVALID_ARGUMENT"), "%s",
              cli_output("bad", "err"));
}

/* ============================================================ CLI: option parsing */

Test(s3, cli_a_missing_option_value_names_the_option)
{
    start_mock(NULL);
    put_small("k", 10);
    const char *conc[] = {"get", "s3://bucket/k", "--concurrency", NULL};
    cr_expect_eq(cli_run("conc", conc), 2);
    const char *err = cli_output("conc", "err");
    cr_expect(strstr(err, "'--concurrency'") && strstr(err, "missing"), "%s", err);
    cr_expect_null(strstr(err, "unknown option"), "%s", err);
    const char *out[] = {"get", "s3://bucket/k", "-o", NULL};
    cr_expect_eq(cli_run("out", out), 2);
    err = cli_output("out", "err");
    cr_expect(strstr(err, "'-o'") && strstr(err, "missing"), "%s", err);
    /* a flag given a value, and an option that does not exist */
    const char *flag[] = {"ls", "s3://bucket/", "--json=yes", NULL};
    cr_expect_eq(cli_run("flag", flag), 2);
    err = cli_output("flag", "err");
    cr_expect(strstr(err, "'--json=yes'") && strstr(err, "takes no value"), "%s", err);
    const char *unk[] = {"ls", "s3://bucket/", "--colour", NULL};
    cr_expect_eq(cli_run("unk", unk), 2);
    err = cli_output("unk", "err");
    cr_expect(strstr(err, "unknown option '--colour'"), "%s", err);
    /* a value the command's own option refuses is bad usage too */
    const char *warm[] = {"warm-cache", "s3://bucket/k", "--max-objects", "0", NULL};
    cr_expect_eq(cli_run("warm", warm), 2, "%s", cli_output("warm", "err"));
}

Test(s3, cli_global_options_before_the_command)
{
    start_mock(NULL);
    put_small("g/k.bin", 42);
    char eq[128];
    snprintf(eq, sizeof(eq), "--endpoint-url=%s", srv.url);
    const char *ls[] = {SF_CLI_BIN, "--endpoint-url", srv.url, "ls", "s3://bucket/g/", NULL};
    cr_assert_eq(cli_run_argv("ls", ls), 0, "%s", cli_output("ls", "err"));
    cr_expect(strstr(cli_output("ls", "out"), "42  g/k.bin"), "%s", cli_output("ls", "out"));
    /* both orders at once, the = form, flags and a short option with its value */
    char dest[800];
    snprintf(dest, sizeof(dest), "%s/k.copy", tmp);
    const char *get[] = {
        SF_CLI_BIN, eq, "--json", "-o", dest, "get", "--concurrency", "2", "s3://bucket/g/k.bin",
        NULL};
    cr_assert_eq(cli_run_argv("get", get), 0, "%s", cli_output("get", "err"));
    struct stat sb;
    cr_expect(stat(dest, &sb) == 0 && sb.st_size == 42);
    cJSON *j = cJSON_Parse(cli_output("get", "out"));
    cr_expect(cJSON_IsObject(j), "%s", cli_output("get", "out"));
    cJSON_Delete(j);
    const char *stat_[] = {SF_CLI_BIN,  "-v",   "--endpoint-url",      srv.url, "--region",
                           "us-east-1", "stat", "s3://bucket/g/k.bin", NULL};
    cr_expect_eq(cli_run_argv("stat", stat_), 0, "%s", cli_output("stat", "err"));
    /* a command's own option before the command, and nothing after the options */
    const char *own[] = {SF_CLI_BIN, "--batch-size", "8", "load", "s3://bucket/g/", NULL};
    cr_expect_eq(cli_run_argv("own", own), 2);
    cr_expect(strstr(cli_output("own", "err"), "'--batch-size'"), "%s", cli_output("own", "err"));
    const char *none[] = {SF_CLI_BIN, "--endpoint-url", srv.url, NULL};
    cr_expect_eq(cli_run_argv("none", none), 2);
    const char *gap[] = {SF_CLI_BIN, "--endpoint-url", NULL};
    cr_expect_eq(cli_run_argv("gap", gap), 2);
    cr_expect(strstr(cli_output("gap", "err"), "missing"), "%s", cli_output("gap", "err"));
}

/* ============================================================ CLI: get to a file on stdout */

/* Forks argv (SF_CLI_BIN first) with stdout the regular file path, which
 * already holds "before" (opened again with O_APPEND when append), and
 * stderr /dev/null; the child's pid. */
static pid_t spawn_onto_file(const char *path, int append, const char *const *argv)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || write(fd, "before", 6) != 6)
            _exit(126);
        if (append && (close(fd) != 0 || (fd = open(path, O_WRONLY | O_APPEND)) < 0))
            _exit(126);
        int fe = open("/dev/null", O_WRONLY);
        if (fe < 0 || dup2(fd, 1) < 0 || dup2(fe, 2) < 0)
            _exit(126);
        execv(SF_CLI_BIN, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* get of url onto the file path as spawn_onto_file puts it; the exit status. */
static int get_onto_file(const char *url, const char *path, int append)
{
    const char *argv[] = {SF_CLI_BIN,       "get", "--endpoint-url", srv.url,
                          "--max-attempts", "2",   "--chunk-size",   "256K",
                          "--concurrency",  "4",   url,              NULL};
    return test_wait(spawn_onto_file(path, append, argv));
}

/* A download into a regular file on stdout whose every body is cut: ranges
 * land in place, so before the fix the file had the object's full size
 * (holes and all) and looked complete. It is cut back to where it began. */
Test(s3, cli_failed_get_to_a_file_on_stdout_leaves_nothing_that_looks_complete)
{
    const char *faults[] = {"--fault", "prefix=bucket/big,reset=1", NULL};
    start_mock(faults);
    free(put_object("big.bin", 2u << 20, 9));
    char path[800];
    snprintf(path, sizeof(path), "%s/out.bin", tmp);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    /* stdout opened without O_APPEND, 6 bytes in: the object goes after them */
    cr_expect_eq(get_onto_file("s3://bucket/big.bin", path, 0), 1);
    struct stat sb;
    cr_assert(stat(path, &sb) == 0);
    cr_expect_eq(sb.st_size, 6, "the failed download left a %lld-byte file", (long long)sb.st_size);
    char head[8] = "";
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    cr_expect_eq(fread(head, 1, 6, f), 6);
    fclose(f);
    cr_expect(memcmp(head, "before", 6) == 0, "the bytes before the download were lost");
}

/* ============================================================ CLI: --json on failure */

/* The whole of stdout is one JSON object with "ok": false and an "error"
 * holding want; returns it (to delete). */
static cJSON *one_failure_object(const char *out, const char *want)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(out, &end, 0);
    cr_assert(cJSON_IsObject(j), "not a JSON object: '%s'", out);
    cr_assert(end && strspn(end, " \n") == strlen(end), "more than one JSON document: '%s'", out);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(j, "ok");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    cr_expect(cJSON_IsFalse(ok), "%s", out);
    cr_expect(cJSON_IsString(e) && strstr(e->valuestring, want), "no '%s' in: %s", want, out);
    return j;
}

Test(s3, cli_json_failure_is_always_one_object_with_the_error)
{
    start_mock(NULL);
    put_small("j/a.bin", 7);
    const char *ls[] = {"ls", "--json", "s3://bucket/j/x-{1..2}.bin", NULL};
    cr_expect_eq(cli_run("ls", ls), 1);
    cJSON_Delete(one_failure_object(cli_output("ls", "out"), "s3://bucket/j/x-1.bin"));

    const char *stat_[] = {"stat", "--json", "s3://bucket/j/a.bin", "s3://bucket/j/gone.bin", NULL};
    cr_expect_eq(cli_run("stat", stat_), 1);
    cJSON *j = one_failure_object(cli_output("stat", "out"), "s3://bucket/j/gone.bin");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "status");
    cr_expect(cJSON_IsString(st) && !strcmp(st->valuestring, "SF_ERR_NOT_FOUND"));
    /* what did succeed is still there */
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "results")), 1);
    cJSON_Delete(j);

    const char *get[] = {"get", "--json", "s3://bucket/j/gone.bin", NULL};
    cr_expect_eq(cli_run("get", get), 1);
    cJSON_Delete(one_failure_object(cli_output("get", "out"), "NoSuchKey"));

    /* failures before any request: the client cannot be made, bad usage */
    const char *prof[] = {"ls", "--json", "--profile", "nosuch", "s3://bucket/", NULL};
    cr_expect_eq(cli_run("prof", prof), 1);
    cJSON_Delete(one_failure_object(cli_output("prof", "out"), "nosuch"));
    const char *usage[] = {"stat", "--json", NULL};
    cr_expect_eq(cli_run("usage", usage), 2);
    cJSON_Delete(one_failure_object(cli_output("usage", "out"), "at least one URL"));

    /* success is unchanged: the object itself */
    const char *ok[] = {"stat", "--json", "s3://bucket/j/a.bin", NULL};
    cr_expect_eq(cli_run("ok", ok), 0);
    j = cJSON_Parse(cli_output("ok", "out"));
    cr_expect_eq(jnum(j, "size", NULL, NULL), 7);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "ok"));
    cJSON_Delete(j);
}

/* ============================================================ CLI: get interrupted */

/* Polls until path exists with more than min_bytes (the test's timeout
 * bounds it). */
static void wait_for_file(const char *path, long long min_bytes)
{
    struct stat sb;
    while (stat(path, &sb) != 0 || (long long)sb.st_size <= min_bytes)
        usleep(2000);
}

/* A get interrupted by SIGINT while its downloads hang: before the fix the
 * temporary file (at full size, preallocated) stayed next to the
 * destination, and a file on stdout kept the ranges written in place, holes
 * up to the declared size. Now the handler removes the one and cuts the
 * other back, and the program still dies of the signal. */
Test(s3, cli_get_interrupted_leaves_no_temporary_file_and_no_partial_stdout)
{
    const char *faults[] = {"--fault", "prefix=bucket/slow/,bandwidth=64K", NULL};
    start_mock(faults);
    free(put_object("slow/big.bin", 4u << 20, 5)); /* 16 s at 4 x 64 KiB/s */
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    char dir[700], dest[800], part[900], out[800];
    snprintf(dir, sizeof(dir), "%s/dl", tmp);
    cr_assert(mkdir(dir, 0755) == 0);
    snprintf(dest, sizeof(dest), "%s/big.bin", dir);

    const char *argv[] = {SF_CLI_BIN,      "get",          "--endpoint-url",
                          srv.url,         "--chunk-size", "16K",
                          "--concurrency", "4",            "s3://bucket/slow/big.bin",
                          "-o",            dest,           NULL};
    pid_t pid = test_spawn(argv, "/dev/null", "/dev/null");
    cr_assert(pid > 0);
    snprintf(part, sizeof(part), "%s.sfpart-%ld", dest, (long)pid);
    wait_for_file(part, -1);
    cr_assert(kill(pid, SIGINT) == 0);
    cr_expect_eq(test_wait(pid), 128 + SIGINT, "it did not die of the signal");
    struct stat sb;
    cr_expect(stat(part, &sb) != 0, "%s was left behind", part);
    cr_expect(stat(dest, &sb) != 0, "%s appeared", dest);

    /* stdout a regular file, 6 bytes in: cut back to them once ranges landed */
    snprintf(out, sizeof(out), "%s/out.bin", tmp);
    argv[9] = NULL; /* without -o */
    pid = spawn_onto_file(out, 0, argv);
    wait_for_file(out, 6);
    cr_assert(kill(pid, SIGINT) == 0);
    cr_expect_eq(test_wait(pid), 128 + SIGINT, "it did not die of the signal");
    cr_assert(stat(out, &sb) == 0);
    cr_expect_eq(sb.st_size, 6, "the interrupted download left a %lld-byte file",
                 (long long)sb.st_size);
}

/* ============================================================ CLI: stdout closed */

/* Runs the CLI with args after --endpoint-url, descriptor 1 closed and
 * stderr into tmp/closed.err; the exit status. */
static int run_with_stdout_closed(const char *const *args)
{
    const char *argv[16];
    cli_argv(args, argv, 16);
    char err[800];
    snprintf(err, sizeof(err), "%s/closed.err", tmp);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fe < 0 || dup2(fe, 2) < 0)
            _exit(126);
        close(fe);
        close(1);
        execv(SF_CLI_BIN, (char *const *)argv);
        _exit(127);
    }
    return test_wait(pid);
}

/* With stdout closed (`>&-`) the engine's first socket took descriptor 1:
 * before the fix get wrote the object into it, and ls its listing, and
 * both exited 0. Now they fail, saying so; -o FILE still works. */
Test(s3, cli_with_stdout_closed_fails_instead_of_writing_into_a_socket)
{
    start_mock(NULL);
    unsigned char *want = put_object("c/x.bin", 100000, 3);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    const char *get[] = {"get", "s3://bucket/c/x.bin", NULL};
    cr_expect_eq(run_with_stdout_closed(get), 1);
    cr_expect(strstr(cli_output("closed", "err"), "get: stdout is closed"), "stderr: %s",
              cli_output("closed", "err"));
    const char *ls[] = {"ls", "s3://bucket/c/", NULL};
    cr_expect_eq(run_with_stdout_closed(ls), 1);
    cr_expect(strstr(cli_output("closed", "err"), "ls: stdout is closed"), "stderr: %s",
              cli_output("closed", "err"));

    char path[800];
    snprintf(path, sizeof(path), "%s/x.bin", tmp);
    const char *to_file[] = {"get", "s3://bucket/c/x.bin", "-o", path, NULL};
    cr_expect_eq(run_with_stdout_closed(to_file), 0, "%s", cli_output("closed", "err"));
    size_t n = 0;
    unsigned char *got = NULL;
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    got = malloc(100001);
    n = fread(got, 1, 100001, f);
    fclose(f);
    cr_expect(n == 100000 && memcmp(got, want, n) == 0, "the file holds %zu bytes", n);
    free(got);
    free(want);
}

/* ============================================================ CLI: get >> FILE */

/* With O_APPEND every pwrite lands at the end of the file whatever its
 * offset: before the fix the ranges were appended in the order they arrived,
 * a scrambled object, exit 0. Now the object is streamed in order after the
 * bytes already there, and a failed download is cut back to them. */
Test(s3, cli_get_to_a_file_opened_for_appending_keeps_the_bytes_in_order)
{
    const char *faults[] = {"--fault", "prefix=bucket/cut/,reset=1", NULL};
    start_mock(faults);
    size_t n = (2u << 20) + 12345;
    unsigned char *want = put_object("big.bin", n, 4);
    free(put_object("cut/big.bin", n, 4));
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    char path[800];
    snprintf(path, sizeof(path), "%s/app.bin", tmp);

    cr_expect_eq(get_onto_file("s3://bucket/big.bin", path, 1), 0);
    unsigned char *got = malloc(n + 7);
    cr_assert(got);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    size_t k = fread(got, 1, n + 7, f);
    fclose(f);
    cr_expect_eq(k, n + 6, "%zu bytes", k);
    cr_expect(memcmp(got, "before", 6) == 0, "the bytes before were lost");
    cr_expect(k == n + 6 && memcmp(got + 6, want, n) == 0, "the object is not in order");

    cr_expect_eq(get_onto_file("s3://bucket/cut/big.bin", path, 1), 1);
    struct stat sb;
    cr_assert(stat(path, &sb) == 0);
    cr_expect_eq(sb.st_size, 6, "the failed download left a %lld-byte file", (long long)sb.st_size);
    free(got);
    free(want);
}

/* ============================================================ CLI: get --json */

/* get --json where the report and the object would share a stream: before
 * the fix the report followed the object's bytes on stdout (`get --json URL
 * > k` gave k with a JSON line appended, exit 0), and with -o /dev/null (a
 * device, written through descriptor 1) the report went into the device and
 * nothing was printed (-o /dev/full: "stdout: No space left on device").
 * Now stdout holds the object alone and the report is on stderr; with -o
 * DEVICE the report is on stdout, and a failure names the device. */
Test(s3, cli_get_json_report_never_mixes_with_the_object)
{
    start_mock(NULL);
    size_t n = 300000;
    unsigned char *want = put_object("jr/k.bin", n, 6);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);

    const char *to_stdout[] = {"get", "--json", "s3://bucket/jr/k.bin", NULL};
    cr_assert_eq(cli_run("jout", to_stdout), 0, "%s", cli_output("jout", "err"));
    char path[800];
    snprintf(path, sizeof(path), "%s/jout.out", tmp);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    unsigned char *got = malloc(n + 4096);
    cr_assert(got);
    size_t k = fread(got, 1, n + 4096, f);
    fclose(f);
    cr_expect(k == n && memcmp(got, want, n) == 0, "stdout holds %zu bytes, not the object", k);
    cJSON *j = cJSON_Parse(cli_output("jout", "err"));
    cr_expect_eq(jnum(j, "bytes", NULL, NULL), (double)n, "stderr: %s", cli_output("jout", "err"));
    cJSON_Delete(j);

    const char *to_dev[] = {"get", "--json", "s3://bucket/jr/k.bin", "-o", "/dev/null", NULL};
    cr_assert_eq(cli_run("jdev", to_dev), 0, "%s", cli_output("jdev", "err"));
    j = cJSON_Parse(cli_output("jdev", "out"));
    cr_expect_eq(jnum(j, "bytes", NULL, NULL), (double)n, "stdout: %s", cli_output("jdev", "out"));
    cJSON_Delete(j);
    /* a device that fails: the one failure object on stdout, naming it */
    to_dev[4] = "/dev/full";
    cr_assert_eq(cli_run("jfull", to_dev), 1, "%s", cli_output("jfull", "err"));
    cJSON_Delete(one_failure_object(cli_output("jfull", "out"), "/dev/full: No space left"));
    free(got);
    free(want);
}

/* ============================================================ CLI: inspect | head */

/* `inspect URL | head` where SIGPIPE is ignored (some launchers leave it
 * so): before the fix every write failed and inspect went on parsing, and
 * downloading, the whole shard before it exited. Now it stops at the first
 * write that failed and ends as SIGPIPE would, having read a small part. */
Test(s3, cli_inspect_stops_reading_when_its_reader_is_gone)
{
    const char *faults[] = {"--fault", "prefix=bucket/ins/,bandwidth=4M", NULL};
    start_mock(faults);
    char src[700], path[800], dest[700];
    snprintf(src, sizeof(src), "%s/src", tmp);
    cr_assert_eq(mkdir(src, 0755), 0);
    char data[1000];
    memset(data, 'x', sizeof(data));
    for (int i = 0; i < 1200; i++) {
        snprintf(path, sizeof(path), "%s/s%04d.bin", src, i);
        FILE *f = fopen(path, "wb");
        cr_assert(f && fwrite(data, 1, sizeof(data), f) == sizeof(data));
        fclose(f);
    }
    snprintf(dest, sizeof(dest), "%s/bucket/ins", root);
    const char *pack[] = {SF_CLI_BIN, "pack", src, dest, "--no-progress", NULL};
    cr_assert_eq(test_run(pack, "/dev/null", "/dev/null"), 0);
    struct stat sb;
    snprintf(path, sizeof(path), "%s/shard-000000.tar", dest);
    cr_assert_eq(stat(path, &sb), 0);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);

    const char *argv[] = {SF_CLI_BIN,
                          "inspect",
                          "--endpoint-url",
                          srv.url,
                          "--concurrency",
                          "1",
                          "--chunk-size",
                          "64K",
                          "s3://bucket/ins/shard-000000.tar",
                          NULL};
    int op[2];
    cr_assert_eq(pipe(op), 0);
    close(op[0]); /* no reader */
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        signal(SIGPIPE, SIG_IGN);
        int fe = open("/dev/null", O_WRONLY);
        if (fe < 0 || dup2(op[1], 1) < 0 || dup2(fe, 2) < 0)
            _exit(126);
        execv(SF_CLI_BIN, (char *const *)argv);
        _exit(127);
    }
    close(op[1]);
    cr_expect_eq(test_wait(pid), 128 + SIGPIPE);
    cJSON *st = mock_stats();
    double sent = jnum(st, "bytes_sent", NULL, NULL);
    cJSON_Delete(st);
    cr_expect_lt(sent, (double)sb.st_size / 2, "%.0f of the shard's %lld bytes were read", sent,
                 (long long)sb.st_size);
}

/* ============================================================ CLI: get of a long file name */

/* A file name of 250 bytes is valid (NAME_MAX is 255), but its temporary
 * name FILE.sfpart-PID is not: before the fix get failed with "File name
 * too long" for such an object, into a directory or with -o FILE. Now the
 * temporary name is cut to fit, and the file lands under its own name. */
Test(s3, cli_get_of_an_object_with_a_long_file_name)
{
    start_mock(NULL);
    char name[251], key[300], url[400], dir[700], path[1000];
    memset(name, 'n', 250);
    name[250] = '\0';
    snprintf(key, sizeof(key), "long/%s", name);
    unsigned char *want = put_object(key, 5000, 8);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    snprintf(url, sizeof(url), "s3://bucket/%s", key);
    snprintf(dir, sizeof(dir), "%s/dl/", tmp);
    for (int as_file = 0; as_file < 2; as_file++) {
        snprintf(path, sizeof(path), "%s%s", dir, name);
        const char *args[] = {"get", url, "-o", as_file ? path : dir, NULL};
        cr_expect_eq(cli_run("long", args), 0, "%s", cli_output("long", "err"));
        FILE *f = fopen(path, "rb");
        cr_expect(f, "%s was not written", as_file ? "-o FILE" : "-o DIR/");
        if (f) {
            unsigned char got[5001];
            size_t k = fread(got, 1, sizeof(got), f);
            fclose(f);
            cr_expect(k == 5000 && memcmp(got, want, k) == 0, "%zu bytes", k);
            unlink(path);
        }
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)))
            cr_expect(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."), "%s left in %s",
                      e->d_name, dir);
        if (d)
            closedir(d);
    }
    free(want);
}

/* -o into a folder that does not exist: the message began with the
 * temporary name (x.sfpart-PID), not the path the user gave. */
Test(s3, cli_get_into_a_missing_folder_names_the_path_given)
{
    start_mock(NULL);
    free(put_object("k.bin", 3000, 9));
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    char path[800], want[900];
    snprintf(path, sizeof(path), "%s/no-such-folder/k.bin", tmp);
    const char *args[] = {"get", "s3://bucket/k.bin", "-o", path, NULL};
    cr_expect_eq(cli_run("missing", args), 1);
    snprintf(want, sizeof(want), "shardfeed: %s: cannot create", path);
    const char *err = cli_output("missing", "err");
    cr_expect(!strncmp(err, want, strlen(want)), "%s", err);
    cr_expect(strstr(err, "No such file or directory"), "%s", err);
}
