/* shardfeed command-line tool. Uses the public API only. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void cli_usage(FILE *f)
{
    fputs("usage: shardfeed [options] COMMAND [options]\n"
          "\n"
          "Commands:\n"
          "  ls URL        list objects and prefixes (s3://bucket/prefix, s3:// for buckets);\n"
          "                a brace pattern lists each object it names (all must exist)\n"
          "  get URL...    download objects to a file, a directory or stdout\n"
          "  stat URL...   size, ETag and modification time of objects; a brace pattern\n"
          "                gives every object it names (a missing one is an error)\n"
          "  warm-cache URL...   download shards into the local cache before a job\n"
          "                (also installed as the program `warm-cache`)\n"
          "  cache ls|stats|verify|clear   look after the local cache\n"
          "  pack SRC DEST pack a folder (ImageFolder or flat) into tar or record shards\n"
          "                plus index.json, in a folder or under s3://bucket/prefix\n"
          "  inspect URL   list the samples of one shard with their fields and sizes\n"
          "  index URL...  read existing tar/record shards once and write the index.json\n"
          "                pack would have written (counts, sizes, checksums) beside them\n"
          "  load URL...   run epochs through the loader (fetch, decode, batch, GPU) and\n"
          "                report images/s and where time goes (`shardfeed load --help`)\n"
          "  doctor URL... measure each stage on your data and name the one that starves the\n"
          "                step, and the knob to turn (`shardfeed doctor --help`)\n"
          "  tune URL...   search decode threads, concurrency, chunk size and prefetch depths\n"
          "                and write the best as a --config file (`shardfeed tune --help`)\n"
          "  version       the library version and what this build supports (--json: one object)\n"
          "  help          this text\n"
          "\n"
          "URLs: s3://bucket/key, s3://bucket/prefix/ (every object below it),\n"
          "      s3://bucket/train-{000000..000099}.tar (brace patterns), http(s)://...,\n"
          "      file:///path or a plain path.\n"
          "\n"
          "Options (all commands that talk to a store; before or after the command):\n"
          "  --endpoint-url URL     S3 endpoint (default: AWS_ENDPOINT_URL_S3,\n"
          "                         AWS_ENDPOINT_URL, profile endpoint_url, else AWS)\n"
          "  --region R             signing region (AWS_REGION, profile, us-east-1)\n"
          "  --profile P            profile in ~/.aws/credentials and ~/.aws/config\n"
          "  --no-sign-request      anonymous requests, no credential lookup\n"
          "  --addressing path|virtual|auto   bucket in the path or the host name\n"
          "  --ca-bundle FILE       PEM CA certificates (AWS_CA_BUNDLE)\n"
          "  --insecure             do not verify TLS certificates\n"
          "  --http2                offer HTTP/2 over TLS\n"
          "  --concurrency N        requests in flight in total (default 32)\n"
          "  --io-threads N         I/O threads sharing them, each its own connections\n"
          "                         (default 0: the CPUs usable, at most 4)\n"
          "  --chunk-size SIZE      bytes per ranged GET: 8M, 8MiB, 512K (default 8M)\n"
          "  --max-attempts N       attempts per request, first included (default 10)\n"
          "  --stall-timeout-ms N   abort and retry a transfer without progress (30000)\n"
          "  --connect-timeout-ms N TCP + TLS connect limit per attempt (10000)\n"
          "  --first-byte-timeout-ms N  abort and retry an attempt with no answer (15000)\n"
          "  --request-timeout-ms N fail a request that got no byte this long, retries\n"
          "                         included, naming the endpoint (45000; 0 = off)\n"
          "  --json                 machine-readable output\n"
          "  -v, --verbose          log retries and throttling on stderr (twice: debug)\n"
          "\n"
          "ls:  -r, --recursive     every key, no grouping at '/' (a pattern lists its keys)\n"
          "stat: --json             one object for one plain URL, else an array\n"
          "get: -o, --output PATH   file, directory (with several objects, or ending in\n"
          "                         '/'), or '-' for stdout (the default for one object)\n"
          "pack: --format tar|record           shard format (default tar)\n"
          "      --shard-size SIZE             close a shard before it would pass SIZE\n"
          "                                    (default 256M)\n"
          "      --zstd[=LEVEL]                compress records with zstd (record format;\n"
          "                                    level 1-22, default 3)\n"
          "      --layout auto|imagefolder|flat   class folders -> 'cls' labels, or\n"
          "                                    WebDataset-style keys (default auto)\n"
          "      --name-pattern PAT            shard names, one %u (default shard-%06u.tar)\n"
          "      --follow-symlinks             follow links (default: a link is an error)\n"
          "      --tmp-dir DIR                 staging folder for s3:// uploads (TMPDIR)\n"
          "      --part-size SIZE              s3://: a shard over SIZE is uploaded in\n"
          "                                    parts of SIZE, 4 at a time (default 64M;\n"
          "                                    5M to 5G)\n"
          "      --no-progress                 no progress bar or lines on stderr\n"
          "      --max-side N                  shrink JPEGs with a side over N px to N and\n"
          "                                    encode them again (default: keep every byte)\n"
          "      --quality Q                   quality of re-encoded JPEGs, 1-100 (90)\n"
          "      --threads N                   re-encoding threads (default: the cores)\n"
          "inspect: --json                     one JSON object with every sample\n"
          "index: -o, --output FILE|s3://URL   where to write (default: index.json in the\n"
          "                                    folder of the first shard)\n"
          "       --dry-run                    print the index on stdout, write nothing\n"
          "       --parallel N                 shards read at once (default 8)\n"
          "       --window SIZE                memory per shard being read (default 8M)\n"
          "       --no-progress                no progress bar (shown on a terminal only)\n"
          "\n"
          "warm-cache, cache:\n"
          "  --cache-dir DIR        cache directory (default $XDG_CACHE_HOME/shardfeed,\n"
          "                         else ~/.cache/shardfeed)\n"
          "  --cache-limit SIZE     evict least recently used entries above this, e.g. 50G\n"
          "                         (default 0: no limit); warm-cache refuses data that\n"
          "                         cannot fit\n"
          "  --verify               hash cached entries before skipping them\n"
          "  --dry-run              say what would be fetched, fetch nothing\n"
          "  --max-objects N        shards downloading at once (default 8)\n"
          "  --revalidate trust|head   trust cached copies (default) or HEAD each one\n"
          "  --fsync                fsync each entry when it is published\n"
          "  --progress auto|bar|lines|off   progress on stderr (auto: bar on a TTY)\n"
          "\n"
          "Exit status: 0 on success, 1 when an operation failed or its output could\n"
          "not be written (the reason is on stderr), 2 on bad usage; a pipe whose reader\n"
          "went away (`| head`) ends it quietly, as SIGPIPE does (141 in a shell).\n"
          "\n"
          "The local S3-compatible test server is a separate program,\n"
          "shardfeed-mock-s3 (see docs/mock-server.md).\n",
          f);
}

/* The CLI's own process-wide state, which the library never has: the first
 * error reported (it becomes "error" in --json output), the last JSON
 * document, held back until the exit status is known, and what became of
 * stdout (closed by the caller; a failed write already reported). */
static char first_error[2048];
static cJSON *held_json;
static int stdout_closed, stdout_reported;

/* A descriptor 0, 1 or 2 the caller closed (`>&-`, `2>&-`, `<&-`) would be
 * the number of the first file or socket the command opens (a shard being
 * written, a cache entry, a connection), and what is printed would go into
 * it. /dev/null takes its place first: read-only on 0 and 1, so that writes
 * to a closed stdout fail and are reported (cli_finish_stdout), write-only
 * on 2, whose messages have nowhere else to go. */
static void guard_std_fds(void)
{
    for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
            continue;
        if (fd == STDOUT_FILENO)
            stdout_closed = 1;
        /* the lowest free descriptor: fd itself, those below are open by now */
        if (open("/dev/null", fd == STDERR_FILENO ? O_WRONLY : O_RDONLY) < 0)
            return; /* nothing better to do: the command runs as it would have */
    }
}

int cli_stdout_closed(void)
{
    return stdout_closed;
}

void cli_stdout_failed(int err)
{
    if (err == EPIPE) {
        /* The reader went away (`| head`): the end a shell pipeline expects,
         * quietly, with the status of SIGPIPE's default action (141 in a
         * shell), also when the caller left SIGPIPE ignored. */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        signal(SIGPIPE, SIG_DFL);
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        raise(SIGPIPE);
        _exit(128 + SIGPIPE); /* not reached */
    }
    if (stdout_reported)
        return;
    stdout_reported = 1;
    if (stdout_closed)
        cli_errorf("stdout is closed, and there was output to write");
    else
        cli_errorf("stdout: %s", err ? strerror(err) : "write error");
}

/* What the command printed is its result: a write that failed (a full disk,
 * a closed stdout, EIO) fails the command rather than exit 0 with the output
 * lost. Returns rc, or 1 when rc was 0 and stdout failed. */
static int cli_finish_stdout(int rc)
{
    errno = 0;
    int e = fflush(stdout) != 0 ? errno : 0;
    if (!ferror(stdout))
        return rc;
    if (e == 0) {
        /* An earlier write failed, as a long text went out, and its errno is
         * gone (stdio dropped those bytes). A pipe without a reader still
         * says so: POLLERR on its end. */
        struct pollfd p = {.fd = STDOUT_FILENO, .events = POLLOUT};
        if (poll(&p, 1, 0) == 1 && (p.revents & POLLERR))
            e = EPIPE;
    }
    cli_stdout_failed(e);
    return rc ? rc : 1;
}

void cli_errorf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof(first_error)];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "shardfeed: %s\n", msg);
    if (!first_error[0])
        snprintf(first_error, sizeof(first_error), "%s", msg);
}

void cli_log_stderr(void *user, enum sf_log_level level, const char *message)
{
    (void)user;
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "shardfeed: %s: %s\n", names[level <= SF_LOG_DEBUG ? level : SF_LOG_DEBUG],
            message);
}

int cli_fail_status(const char *cmd, const char *msg, sf_status st)
{
    const char *text = msg[0] ? msg : sf_status_str(st);
    if (cmd)
        cli_errorf("%s: %s (%s)", cmd, text, sf_status_name(st));
    else
        cli_errorf("%s (%s)", text, sf_status_name(st));
    return 1;
}

int cli_open_client(struct cli *c, struct sf_s3 **s3)
{
    char err[512] = "";
    sf_status st = sf_s3_new(&c->s3o, s3, err, sizeof(err));
    return st != SF_OK ? cli_fail_status(NULL, err, st) : 0;
}

void cli_report(struct sf_s3 *s3, sf_status st)
{
    char msg[1024];
    cli_fail_status(NULL, sf_s3_errmsg(s3, msg, sizeof(msg)), st);
}

static void print_now(const cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    if (s) {
        puts(s);
        free(s);
    }
}

void cli_print_json(cJSON *j)
{
    /* Held until the command returns (cli_json_finish): a failure turns it
     * into the one object that carries the error. An earlier one goes out. */
    if (held_json) {
        print_now(held_json);
        cJSON_Delete(held_json);
    }
    held_json = j;
}

/* --json and a failure: exactly one JSON object on stdout with "ok": false,
 * "error" (the first error reported), "status" (the SF_ERR_ name when the
 * message ends with one) and "exit"; what the command printed is kept in it
 * (an array under "results"). */
static void cli_json_finish(int rc, int json)
{
    cJSON *j = held_json;
    held_json = NULL;
    if (rc != 0 && json) {
        char msg[sizeof(first_error)], status[64] = "";
        /* warm-cache reports its failures in its own list, not on stderr */
        const cJSON *fl = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "failures"), 0);
        const cJSON *fe = cJSON_GetObjectItemCaseSensitive(fl, "error");
        const cJSON *fs = cJSON_GetObjectItemCaseSensitive(fl, "status");
        if (!first_error[0] && cJSON_IsString(fe))
            snprintf(msg, sizeof(msg), "%s%s%s%s", fe->valuestring, cJSON_IsString(fs) ? " (" : "",
                     cJSON_IsString(fs) ? fs->valuestring : "", cJSON_IsString(fs) ? ")" : "");
        else
            snprintf(msg, sizeof(msg), "%s", first_error[0] ? first_error : "failed");
        size_t n = strlen(msg);
        char *open = strstr(msg, " (SF_");
        for (char *o = open; o; o = strstr(o + 1, " (SF_"))
            open = o; /* the last one */
        if (open && n > 0 && msg[n - 1] == ')' && (size_t)(msg + n - open) < sizeof(status)) {
            snprintf(status, sizeof(status), "%.*s", (int)(msg + n - open - 3), open + 2);
            *open = '\0';
        }
        if (!cJSON_IsObject(j)) {
            cJSON *o = cJSON_CreateObject();
            if (o && j)
                cJSON_AddItemToObject(o, "results", j);
            else
                cJSON_Delete(j);
            j = o;
        }
        if (j && !cJSON_GetObjectItemCaseSensitive(j, "error")) {
            cJSON_DeleteItemFromObjectCaseSensitive(j, "ok");
            cJSON_AddBoolToObject(j, "ok", 0);
            cJSON_AddStringToObject(j, "error", msg);
            if (status[0] && !cJSON_GetObjectItemCaseSensitive(j, "status"))
                cJSON_AddStringToObject(j, "status", status);
        }
        if (j && !cJSON_GetObjectItemCaseSensitive(j, "exit"))
            cJSON_AddNumberToObject(j, "exit", rc);
    }
    if (j) {
        print_now(j);
        cJSON_Delete(j);
    }
    /* flushed and checked by cli_finish_stdout: a flush here would take
     * the error's errno with it */
}

/* ------------------------------------------------------------ main */

/* The commands that parse their own flags (argv from the command name on). */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} own_parsers[] = {
    {"warm-cache", cli_cmd_warm_cache}, {"cache", cli_cmd_cache}, {"pack", cli_cmd_pack},
    {"inspect", cli_cmd_inspect},       {"index", cli_cmd_index}, {"load", cli_cmd_load},
    {"doctor", cli_cmd_doctor},         {"tune", cli_cmd_tune},
};

/* The S3 commands: only the options every command takes. */
static const struct {
    const char *name;
    int (*run)(struct cli *c);
} s3_commands[] = {
    {"ls", cli_cmd_ls},
    {"get", cli_cmd_get},
    {"stat", cli_cmd_stat},
};

/* `version [--json]`: a word it does not know is refused, so that a script
 * that asked for JSON never parses the text form. */
static int cmd_version(int argc, char **argv)
{
    int json = 0, takes_next;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: shardfeed version [--json]\n");
            return 0;
        } else if (cli_common_flag(argv[i], &takes_next)) {
            /* taken, as every command takes them, and unused: nothing is requested */
            if (takes_next && ++i >= argc) {
                cli_errorf("option '%s' needs a value, and it is missing", argv[i - 1]);
                return EXIT_USAGE;
            }
        } else {
            cli_errorf("version: unknown argument '%s' (it takes --json and the options every "
                       "command takes)",
                       argv[i]);
            return EXIT_USAGE;
        }
    }
    int cuda = sf_cuda_compiled();
    int devices = cuda ? sf_cuda_device_count() : 0;
    if (json) {
        cJSON *j = cJSON_CreateObject(), *c = NULL;
        if (!cJSON_AddStringToObject(j, "version", sf_version()) ||
            !(c = cJSON_AddObjectToObject(j, "cuda")) ||
            !cJSON_AddBoolToObject(c, "compiled", cuda) ||
            !cJSON_AddNumberToObject(c, "devices", devices)) {
            cJSON_Delete(j);
            cli_errorf("version: out of memory");
            return 1;
        }
        cli_print_json(j);
        return 0;
    }
    printf("shardfeed %s\n", sf_version());
    printf("cuda: %s", cuda ? "compiled in" : "not compiled in");
    if (cuda)
        printf(", %d device(s) visible", devices);
    printf("\n");
    return 0;
}

static int run(int argc, char **argv);

int main(int argc, char **argv)
{
    guard_std_fds();
    int json = 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        json |= !strcmp(argv[i], "--json");
    int rc = run(argc, argv);
    cli_json_finish(rc, json);
    return cli_finish_stdout(rc);
}

static int run(int argc, char **argv)
{
    /* Installed also as `warm-cache`: the program name selects the command,
     * and every word after it is the command's (`warm-cache --cache-dir D URL`). */
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    if (!strcmp(prog, "warm-cache"))
        return cli_cmd_warm_cache(argc, argv);
    if (argc < 2) {
        cli_usage(stderr);
        return EXIT_USAGE;
    }
    /* Global options may come first, as with aws-cli and s5cmd
     * (`shardfeed --endpoint-url URL ls s3://b/`): they are moved after the
     * command, where every command parses them. */
    static char **moved; /* reachable until exit, as argv is */
    if (argv[1][0] == '-' && argv[1][1] != '\0' && strcmp(argv[1], "--help") != 0 &&
        strcmp(argv[1], "-h") != 0 && strcmp(argv[1], "--version") != 0) {
        int i = 1;
        while (i < argc && argv[i][0] == '-' && argv[i][1] != '\0') {
            int takes_next;
            if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
                break; /* help wins, with or without a command */
            if (!cli_common_flag(argv[i], &takes_next)) {
                cli_errorf("unknown option '%s' before the command (only the options every "
                           "command takes may come first; see `shardfeed help`)",
                           argv[i]);
                return EXIT_USAGE;
            }
            if (takes_next && i + 1 >= argc) {
                cli_errorf("option '%s' needs a value, and it is missing", argv[i]);
                return EXIT_USAGE;
            }
            i += takes_next ? 2 : 1;
        }
        if (i >= argc) {
            cli_errorf("no command after the options");
            cli_usage(stderr);
            return EXIT_USAGE;
        }
        moved = malloc(((size_t)argc + 1) * sizeof(*moved));
        if (!moved)
            return 1;
        int n = 0;
        moved[n++] = argv[0];
        moved[n++] = argv[i];
        for (int k = 1; k < i; k++)
            moved[n++] = argv[k];
        for (int k = i + 1; k < argc; k++)
            moved[n++] = argv[k];
        moved[n] = NULL;
        argv = moved; /* lives until exit */
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof(own_parsers) / sizeof(own_parsers[0]); i++)
        if (!strcmp(cmd, own_parsers[i].name))
            return own_parsers[i].run(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0)
        return cmd_version(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        cli_usage(stdout);
        return 0;
    }
    int (*fn)(struct cli *) = NULL;
    for (size_t i = 0; i < sizeof(s3_commands) / sizeof(s3_commands[0]); i++)
        if (!strcmp(cmd, s3_commands[i].name))
            fn = s3_commands[i].run;
    if (!fn) {
        cli_errorf("unknown command '%s'", cmd);
        cli_usage(stderr);
        return EXIT_USAGE;
    }
    struct cli c;
    int rc = cli_parse_options(argc - 1, argv + 1, &c, cmd, NULL, 0);
    if (rc)
        return rc;
    return fn(&c);
}

static const int stop_signals[CLI_STOP_SIGNALS] = {SIGINT, SIGTERM, SIGHUP};

void cli_catch_stop_signals(void (*handler)(int), struct sigaction old[CLI_STOP_SIGNALS])
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < CLI_STOP_SIGNALS; i++)
        sigaddset(&sa.sa_mask, stop_signals[i]);
    for (size_t i = 0; i < CLI_STOP_SIGNALS; i++) {
        sigaction(stop_signals[i], NULL, &old[i]);
        if (old[i].sa_handler != SIG_IGN)
            sigaction(stop_signals[i], &sa, NULL);
    }
}

void cli_restore_stop_signals(const struct sigaction old[CLI_STOP_SIGNALS])
{
    for (size_t i = 0; i < CLI_STOP_SIGNALS; i++)
        sigaction(stop_signals[i], &old[i], NULL);
}
