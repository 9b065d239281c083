/* The CLI's flag tables (src/cli_flags.c): every kind of value is checked
 * the same way, bad usage exits 2 and the message names the flag, the value
 * and, for numbers, the range. Nothing here reaches a server. */
#include "shardfeed.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* argv (32 entries) as argv0 then args (NULL-terminated, at most 30). */
static void make_argv(const char **argv, const char *argv0, const char *const *args)
{
    argv[0] = argv0;
    size_t n = 1;
    for (; args[n - 1]; n++)
        cr_assert_lt(n, 31);
    memcpy(argv + 1, args, n * sizeof(*argv));
}

/* Reads fd to its end into buf (NUL-terminated), closes it and waits for
 * pid; returns its wait status. */
static int read_all_and_reap(int fd, char *buf, size_t buf_len, pid_t pid)
{
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, buf + got, buf_len - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return status;
}

/* rm -rf dir, which must succeed. */
static void remove_tree(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Runs the CLI as argv0 with argv (NULL-terminated, without the program);
 * what it writes on out_fd (1 or 2) goes into buf, the other stream is
 * dropped. Returns the exit status. */
static int run_as(const char *argv0, const char *const *args, int out_fd, char *buf, size_t buf_len)
{
    const char *argv[32];
    make_argv(argv, argv0, args);
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 3 - out_fd);
        dup2(fd[1], out_fd);
        close(fd[0]);
        close(fd[1]);
        execv(SF_CLI_BIN, (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    int status = read_all_and_reap(fd[0], buf, buf_len, pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs the CLI with argv (NULL-terminated, without the program); its stderr
 * goes into err. Returns the exit status. */
static int run(const char *const *args, char *err, size_t err_len)
{
    return run_as(SF_CLI_BIN, args, 2, err, err_len);
}

struct bad {
    const char *args[8];
    const char *words[3]; /* each must be in the message */
};

static void expect_usage_errors(const struct bad *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char err[4096];
        int rc = run(b[i].args, err, sizeof(err));
        cr_expect_eq(rc, 2, "%s %s: exit %d, stderr: %s", b[i].args[0], b[i].words[0], rc, err);
        for (int w = 0; w < 3 && b[i].words[w]; w++)
            cr_expect(strstr(err, b[i].words[w]), "%s: '%s' missing from: %s", b[i].args[0],
                      b[i].words[w], err);
    }
}

Test(cli, a_bad_value_of_each_kind_names_the_flag_and_the_value)
{
    const struct bad bad[] = {
        /* unsigned, common to every command */
        {{"ls", "s3://b/", "--concurrency", "many", NULL}, {"--concurrency", "'many'"}},
        /* int (pack's own), and a loader option's signed int */
        {{"pack", "a", "b", "--quality", "9x", NULL}, {"pack: --quality", "'9x'"}},
        {{"load", "s3://b/", "--rank", "two", NULL}, {"load: --rank", "'two'"}},
        /* a count, and a loader option that takes no sign */
        {{"load", "s3://b/", "--max-batches", "-3", NULL}, {"--max-batches", "'-3'"}},
        {{"load", "s3://b/", "--batch-size", "-1", NULL}, {"--batch-size", "'-1'", "non-negative"}},
        /* sizes */
        {{"get", "s3://b/k", "--chunk-size", "12X", NULL}, {"--chunk-size", "'12X'", "size"}},
        {{"warm-cache", "s3://b/", "--cache-limit", "lots", NULL}, {"--cache-limit", "'lots'"}},
        {{"load", "s3://b/", "--cache-limit", "lots", NULL}, {"load: --cache-limit", "'lots'"}},
        /* reals, and three of them */
        {{"load", "s3://b/", "--hflip", "half", NULL}, {"--hflip", "'half'", "a number"}},
        {{"load", "s3://b/", "--step-ms", "", NULL}, {"--step-ms", "''"}},
        {{"load", "s3://b/", "--mean", "1,2", NULL}, {"--mean", "'1,2'", "three numbers"}},
        /* a string that may not be empty */
        {{"warm-cache", "s3://b/", "--cache-dir", "", NULL}, {"--cache-dir", "''"}},
        /* get -o '' downloaded into a hidden ".sfpart-PID" in the current
         * folder, then failed to rename it onto '' */
        {{"get", "s3://b/k", "-o", "", NULL}, {"--output", "''"}},
        /* choices list what they take */
        {{"ls", "s3://b/", "--addressing", "sideways", NULL},
         {"--addressing", "'sideways'", "path, virtual or auto"}},
        {{"pack", "a", "b", "--layout", "trees", NULL},
         {"--layout", "'trees'", "auto, imagefolder or flat"}},
        {{"cache", "ls", "--progress", "loud", NULL}, {"--progress", "'loud'", "lines or off"}},
        /* flags take no value, and a value may not be missing */
        {{"ls", "s3://b/", "--insecure=1", NULL}, {"'--insecure=1'", "takes no value"}},
        {{"load", "s3://b/", "--no-drop-last=yes", NULL}, {"'--no-drop-last=yes'", "no value"}},
        {{"index", "s3://b/", "--window", NULL}, {"'--window'", "missing"}},
    };
    expect_usage_errors(bad, sizeof(bad) / sizeof(bad[0]));
}

Test(cli, out_of_range_numbers_are_refused_with_the_range)
{
    char conc[64], zstd[64];
    snprintf(conc, sizeof(conc), "%u", SF_S3_CONCURRENCY_MAX + 1);
    snprintf(zstd, sizeof(zstd), "--zstd=%d", SF_PACK_ZSTD_LEVEL_MAX + 1);
    char conc_range[64], zstd_range[64], par_range[64], warm_range[64];
    snprintf(conc_range, sizeof(conc_range), "1..%u", SF_S3_CONCURRENCY_MAX);
    snprintf(zstd_range, sizeof(zstd_range), "1..%d", SF_PACK_ZSTD_LEVEL_MAX);
    snprintf(par_range, sizeof(par_range), "1..%u", SF_INDEX_PARALLEL_MAX);
    snprintf(warm_range, sizeof(warm_range), "1..%u", SF_WARM_MAX_OBJECTS_MAX);
    const struct bad bad[] = {
        {{"ls", "s3://b/", "--concurrency", "0", NULL}, {"--concurrency", "'0'", conc_range}},
        {{"ls", "s3://b/", "--concurrency", conc, NULL}, {"--concurrency", conc_range}},
        {{"ls", "s3://b/", "--stall-timeout-ms", "3600001", NULL},
         {"--stall-timeout-ms", "1..3600000"}},
        {{"pack", "a", "b", "--format", "record", zstd, NULL}, {"--zstd", zstd_range}},
        {{"pack", "a", "b", "--max-side", "8", NULL}, {"--max-side", "16..65535"}},
        {{"index", "s3://b/", "--parallel", "0", NULL}, {"--parallel", par_range}},
        {{"warm-cache", "s3://b/", "--max-objects", "257", NULL}, {"--max-objects", warm_range}},
        {{"load", "s3://b/", "--epochs", "0", NULL}, {"--epochs", "1..1000000"}},
        /* sizes name theirs in units */
        {{"get", "s3://b/k", "--chunk-size", "6G", NULL}, {"--chunk-size", "from 1K to 5G"}},
        {{"pack", "a", "b", "--part-size", "4M", NULL}, {"--part-size", "from 5M to 5G"}},
        {{"index", "s3://b/", "--window", "17G", NULL}, {"--window", "from 64K to 16G"}},
        {{"pack", "a", "b", "--shard-size", "100", NULL}, {"--shard-size", "at least 1K"}},
        /* reals */
        {{"doctor", "s3://b/", "--seconds", "0.05", NULL}, {"--seconds", "0.1..3600"}},
        {{"tune", "s3://b/", "--budget-s", "3601", NULL}, {"--budget-s", "1..3600"}},
        {{"load", "s3://b/", "--step-ms", "-1", NULL}, {"--step-ms", "0..60000"}},
    };
    expect_usage_errors(bad, sizeof(bad) / sizeof(bad[0]));
}

/* The bounds themselves are allowed: the command gets past its options and
 * fails for want of a server (1), not for bad usage (2). */
Test(cli, values_at_the_limits_are_accepted)
{
    char conc[32], chunk[32];
    snprintf(conc, sizeof(conc), "%u", SF_S3_CONCURRENCY_MAX);
    snprintf(chunk, sizeof(chunk), "%llu", SF_S3_CHUNK_BYTES_MAX);
    const char *args[] = {"ls",
                          "s3://b/",
                          "--endpoint-url=http://127.0.0.1:1",
                          "--no-sign-request",
                          "--max-attempts",
                          "1",
                          "--concurrency",
                          conc,
                          "--chunk-size",
                          chunk,
                          "--first-byte-timeout-ms",
                          "0",
                          "-v",
                          NULL};
    char err[4096];
    cr_expect_eq(run(args, err, sizeof(err)), 1, "%s", err);
    cr_expect_null(strstr(err, "expected"), "%s", err);
}

/* A word that does not start with a digit is not a number, whatever strtoull
 * makes of it: " -1" would be 2^64 - 1 and reach the library as such. */
Test(cli, numbers_with_leading_blanks_or_signs_are_refused)
{
    const struct bad bad[] = {
        {{"load", "s3://b/", "--seed", " -1", NULL}, {"load: --seed", "' -1'"}},
        {{"warm-cache", "s3://b/", "--max-objects", " 8", NULL}, {"--max-objects", "' 8'"}},
    };
    expect_usage_errors(bad, sizeof(bad) / sizeof(bad[0]));
}

/* An unknown letter inside a group of short options (-xv) is named as such,
 * not blamed on the word before it. */
Test(cli, an_unknown_short_option_in_a_group_is_named)
{
    const struct bad bad[] = {
        {{"ls", "--json", "-xv", "s3://b/", NULL}, {"unknown option '-x'"}},
        {{"cache", "ls", "--verify", "-qv", NULL}, {"unknown option '-q'"}},
    };
    expect_usage_errors(bad, sizeof(bad) / sizeof(bad[0]));
}

/* `cache` takes its subcommand among its options, as every command does,
 * so the options every command takes may come before the command too. */
Test(cli, cache_subcommand_after_the_options_and_its_help)
{
    char dir[] = "/tmp/sf-cli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char out[8192];
    const char *a1[] = {"--json", "cache", "stats", "--cache-dir", dir, NULL};
    cr_expect_eq(run_as(SF_CLI_BIN, a1, 1, out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "\"entries\":0"), "%s", out);
    const char *a2[] = {"cache", "--cache-dir", dir, "stats", NULL};
    cr_expect_eq(run_as(SF_CLI_BIN, a2, 1, out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "entries: 0"), "%s", out);
    for (int h = 0; h < 2; h++) {
        const char *a3[] = {"cache", h ? "-h" : "--help", NULL};
        cr_expect_eq(run_as(SF_CLI_BIN, a3, 1, out, sizeof(out)), 0);
        cr_expect(strstr(out, "usage:") && strstr(out, "cache ls|stats|verify|clear"), "%s", out);
    }
    const struct bad bad[] = {
        {{"cache", "--cache-dir", dir, NULL}, {"cache", "expected ls, stats, verify or clear"}},
        {{"cache", "stats", "ls", "--cache-dir", dir, NULL}, {"unexpected argument 'ls'"}},
        {{"cache", "--cache-dir", dir, "sweep", NULL}, {"unknown subcommand 'sweep'"}},
    };
    expect_usage_errors(bad, sizeof(bad) / sizeof(bad[0]));
    /* A --cache-dir that does not exist (a typo) is no cache: it was made,
     * empty, and reported as such. Exit 1 naming it, nothing made. */
    char missing[64], err[4096];
    snprintf(missing, sizeof(missing), "%s/typo", dir);
    for (int i = 0; i < 4; i++) {
        const char *subs[] = {"ls", "stats", "verify", "clear"};
        const char *a4[] = {"cache", subs[i], "--cache-dir", missing, NULL};
        cr_expect_eq(run(a4, err, sizeof(err)), 1, "cache %s: %s", subs[i], err);
        cr_expect(strstr(err, missing) && strstr(err, "no such folder"), "%s", err);
        struct stat sb;
        cr_expect_neq(stat(missing, &sb), 0, "cache %s made %s", subs[i], missing);
    }
    remove_tree(dir);
}

/* Installed as `warm-cache`, the program is the command: its own options
 * may come first (`warm-cache --cache-dir D URL`). No server here, so it
 * gets past its options and fails for want of one (1), not usage (2). */
Test(cli, warm_cache_by_its_own_name_takes_its_options_first)
{
    char dir[] = "/tmp/sf-cli-XXXXXX";
    cr_assert(mkdtemp(dir));
    const char *args[] = {"--cache-dir",    dir,
                          "--dry-run",      "--no-sign-request",
                          "--endpoint-url", "http://127.0.0.1:1",
                          "--max-attempts", "1",
                          "s3://b/k",       NULL};
    char err[4096];
    cr_expect_eq(run_as("/usr/bin/warm-cache", args, 2, err, sizeof(err)), 1, "%s", err);
    cr_expect_null(strstr(err, "option"), "%s", err);
    const char *help[] = {"--help", NULL};
    char out[8192];
    cr_expect_eq(run_as("warm-cache", help, 1, out, sizeof(out)), 0);
    cr_expect(strstr(out, "usage:"), "%s", out);
    remove_tree(dir);
}

/* --help is an answer, not an error: each command's text goes to stdout
 * (`shardfeed load --help | less`) with exit 0. */
Test(cli, help_of_each_command_is_on_stdout)
{
    const char *cmds[][2] = {
        {"ls", "usage: shardfeed"},        {"warm-cache", "usage: shardfeed"},
        {"load", "usage: shardfeed load"}, {"doctor", "usage: shardfeed doctor"},
        {"tune", "usage: shardfeed tune"}, {"pack", "usage: shardfeed"},
        {"index", "usage: shardfeed"},     {"inspect", "usage: shardfeed"}};
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        const char *args[] = {cmds[i][0], "--help", NULL};
        char out[16384];
        cr_expect_eq(run_as(SF_CLI_BIN, args, 1, out, sizeof(out)), 0, "%s --help", cmds[i][0]);
        cr_expect(strstr(out, cmds[i][1]), "%s --help: stdout is: %s", cmds[i][0], out);
    }
}

/* `version --json` printed the text form, which a script then failed to
 * parse, and `version --bogus` exited 0. Now --json gives one object whose
 * version is the library's, the options every command takes are taken, and
 * any other word is refused (exit 2, naming it). */
Test(cli, version_in_json_and_its_arguments)
{
    const char *args[] = {"version", "--json", NULL};
    char out[4096];
    cr_assert_eq(run_as(SF_CLI_BIN, args, 1, out, sizeof(out)), 0, "stdout: %s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "not JSON: %s", out);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version");
    const cJSON *cuda = cJSON_GetObjectItemCaseSensitive(j, "cuda");
    cr_expect(cJSON_IsString(v) && !strcmp(v->valuestring, sf_version()), "%s", out);
    cr_expect(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(cuda, "compiled")), "%s", out);
    cr_expect_eq(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cuda, "compiled")),
                 sf_cuda_compiled() != 0);
    cr_expect(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(cuda, "devices")), "%s", out);
    cJSON_Delete(j);

    const char *global[] = {"--endpoint-url", "http://127.0.0.1:1", "version", NULL};
    cr_expect_eq(run_as(SF_CLI_BIN, global, 1, out, sizeof(out)), 0);
    char want[128];
    snprintf(want, sizeof(want), "shardfeed %s\n", sf_version());
    cr_expect_eq(strncmp(out, want, strlen(want)), 0, "stdout: %s", out);

    const struct bad b[] = {
        {{"version", "--bogus", NULL}, {"version", "'--bogus'"}},
        {{"version", "extra", NULL}, {"'extra'"}},
        {{"version", "--region", NULL}, {"'--region'", "missing"}},
    };
    expect_usage_errors(b, sizeof(b) / sizeof(b[0]));
}

/* --config names what is wrong with the file: a folder, or one too big (the
 * error of an earlier call was printed instead). */
Test(cli, a_config_that_cannot_be_read_says_why)
{
    char dir[] = "/tmp/sf-cli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char big[64];
    snprintf(big, sizeof(big), "%s/big.json", dir);
    int fd = open(big, O_WRONLY | O_CREAT, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 40 << 20), 0); /* sparse */
    close(fd);
    const struct bad bad[] = {
        {{"load", "s3://b/", "--config", dir, NULL}, {"--config", "Is a directory"}},
        {{"load", "s3://b/", "--config", big, NULL}, {"--config", "big.json", "32 MiB"}},
    };
    expect_usage_errors(bad, sizeof(bad) / sizeof(bad[0]));
    unlink(big);
    rmdir(dir);
}

/* ============================================================ output that cannot be written */

enum out_kind { OUT_FULL, OUT_CLOSED, OUT_NO_READER };

/* Runs the CLI with args, descriptor 1 as kind says (/dev/full; closed; a
 * pipe whose reader is gone, with SIGPIPE ignored as some launchers leave
 * it) and stderr into err. Returns the exit status, or 128 + the signal
 * that ended it. */
static int run_out(enum out_kind kind, const char *const *args, char *err, size_t err_len)
{
    const char *argv[32];
    make_argv(argv, SF_CLI_BIN, args);
    int ep[2], op[2] = {-1, -1};
    cr_assert_eq(pipe(ep), 0);
    if (kind == OUT_NO_READER) {
        cr_assert_eq(pipe(op), 0);
        close(op[0]); /* before the fork: no reader anywhere */
    }
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(ep[1], 2);
        close(ep[0]);
        close(ep[1]);
        if (kind == OUT_FULL) {
            int f = open("/dev/full", O_WRONLY);
            if (f < 0 || dup2(f, 1) < 0)
                _exit(126);
            close(f);
        } else if (kind == OUT_CLOSED) {
            close(1);
        } else {
            signal(SIGPIPE, SIG_IGN); /* kept across exec */
            dup2(op[1], 1);
            close(op[1]);
        }
        execv(SF_CLI_BIN, (char *const *)argv);
        _exit(127);
    }
    close(ep[1]);
    if (op[1] >= 0)
        close(op[1]);
    int status = read_all_and_reap(ep[0], err, err_len, pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A folder with one file packed into dir/shards; the shard's path in shard. */
static void make_shard(const char *dir, char *shard, size_t len)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/src", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/src/a.bin", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fputs("sample bytes", f);
    fclose(f);
    char src[256], dest[256], err[4096];
    snprintf(src, sizeof(src), "%s/src", dir);
    snprintf(dest, sizeof(dest), "%s/shards", dir);
    const char *args[] = {"pack", src, dest, "--no-progress", NULL};
    cr_assert_eq(run(args, err, sizeof(err)), 0, "%s", err);
    snprintf(shard, len, "%s/shard-000000.tar", dest);
}

/* Before the fix every command but `index --dry-run` (and ls, stat and get
 * of a closed stdout) exited 0 when what it printed was lost: `tune >
 * best.json` on a full disk gave an empty file and status 0. Now the write
 * error fails the command, exit 1, naming stdout. */
Test(cli, output_that_cannot_be_written_fails_the_command)
{
    char dir[] = "/tmp/sf-cli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char shard[300], dest[300], cache[300];
    make_shard(dir, shard, sizeof(shard));
    snprintf(dest, sizeof(dest), "%s/again", dir);
    snprintf(cache, sizeof(cache), "%s/cache", dir);
    cr_assert_eq(mkdir(cache, 0700), 0); /* cache commands look at caches, never make one */
    char src[300];
    snprintf(src, sizeof(src), "%s/src", dir);
    const char *const cmds[][8] = {
        {"help", NULL},
        {"version", NULL},
        {"load", "--help", NULL},
        {"inspect", shard, NULL},
        {"inspect", "--json", shard, NULL},
        {"index", shard, "--dry-run", NULL},
        {"pack", src, dest, "--no-progress", NULL},
        {"pack", src, dest, "--no-progress", "--json", NULL},
        {"cache", "stats", "--cache-dir", cache, NULL},
        {"cache", "ls", "--json", "--cache-dir", cache, NULL},
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char err[8192];
        int rc = run_out(OUT_FULL, cmds[i], err, sizeof(err));
        cr_expect_eq(rc, 1, "%s %s > /dev/full: exit %d, stderr: %s", cmds[i][0], cmds[i][1], rc,
                     err);
        /* the reason, unless the failed write was in the middle of a long text */
        cr_expect(strstr(err, "stdout: No space left on device") ||
                      (!strcmp(cmds[i][0], "help") && strstr(err, "stdout: write error")),
                  "%s %s: stderr: %s", cmds[i][0], cmds[i][1], err);
        cr_expect_null(strstr(strstr(err, "stdout:") ? strstr(err, "stdout:") + 1 : err, "stdout:"),
                       "%s %s: reported twice: %s", cmds[i][0], cmds[i][1], err);
        rc = run_out(OUT_CLOSED, cmds[i], err, sizeof(err));
        cr_expect_eq(rc, 1, "%s %s >&-: exit %d, stderr: %s", cmds[i][0], cmds[i][1], rc, err);
        cr_expect(strstr(err, "stdout is closed"), "%s %s >&-: stderr: %s", cmds[i][0], cmds[i][1],
                  err);
    }
    remove_tree(dir);
}

/* The reader of a pipe gone (`| head -1`) with SIGPIPE ignored: before the
 * fix most commands exited 0 having lost their output, and index --dry-run
 * printed "stdout: Broken pipe". Now every one ends as SIGPIPE ends it,
 * without a word on stderr. */
Test(cli, a_pipe_without_reader_ends_quietly_as_sigpipe_does)
{
    char dir[] = "/tmp/sf-cli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char shard[300];
    make_shard(dir, shard, sizeof(shard));
    const char *const cmds[][4] = {
        {"help", NULL},
        {"inspect", shard, NULL},
        {"index", shard, "--dry-run", NULL},
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char err[8192];
        int rc = run_out(OUT_NO_READER, cmds[i], err, sizeof(err));
        cr_expect_eq(rc, 128 + SIGPIPE, "%s: exit %d, stderr: %s", cmds[i][0], rc, err);
        cr_expect_str_empty(err, "%s: stderr: %s", cmds[i][0], err);
    }
    remove_tree(dir);
}
