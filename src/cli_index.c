/* shardfeed index: index.json for shards that were not made by pack. Public API only. */
#include "cli.h"
#include "progress.h"
#include "shardfeed_pack.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct index_args {
    struct sf_index_options o;
    int dry_run;
    int no_progress;
};

static const struct cli_flag index_flags[] = {
    {"dry-run", 0, CLI_SET, .off = CLI_AT(struct index_args, dry_run, int)},
    {"parallel", 0, CLI_UINT, .off = CLI_AT(struct index_args, o.parallel, unsigned), .lo = 1,
     .hi = SF_INDEX_PARALLEL_MAX},
    {"window", 0, CLI_SIZE, .off = CLI_AT(struct index_args, o.window_bytes, unsigned long long),
     .lo = SF_INDEX_WINDOW_BYTES_MIN, .hi = SF_INDEX_WINDOW_BYTES_MAX},
    {"no-progress", 0, CLI_SET, .off = CLI_AT(struct index_args, no_progress, int)},
};

static int on_index_progress(void *user, const struct sf_index_progress *p)
{
    cli_progress_update(user, p->bytes_done, p->bytes_total, p->shards_done, p->shards_total);
    return 0;
}

static int is_http(const char *url)
{
    return !strncmp(url, "http://", 7) || !strncmp(url, "https://", 8);
}

int cli_cmd_index(int argc, char **argv)
{
    struct index_args a;
    memset(&a, 0, sizeof(a));
    sf_index_options_init_default(&a.o);
    const struct cli_flags set = CLI_FLAGS(index_flags, &a, NULL);
    struct cli c;
    int rc = cli_parse_options(argc, argv, &c, "index", &set, 1);
    if (rc)
        return rc;
    if (c.n_args < 1) {
        cli_errorf("index: expected at least one shard URL, pattern or prefix");
        return EXIT_USAGE;
    }
    const char *out = c.output;
    if (out && (!*out || is_http(out))) {
        cli_errorf("index: -o: expected a local path or an s3:// URL, got '%s'", out);
        return EXIT_USAGE;
    }
    int to_stdout = a.dry_run || (out && !strcmp(out, "-"));
    if (out && strcmp(out, "-"))
        a.o.index_url = out;
    struct sf_s3 *s3 = NULL;
    if (cli_open_client(&c, &s3))
        return 1;
    struct cli_progress *bar = NULL;
    if (!a.no_progress && isatty(STDERR_FILENO)) {
        bar = cli_progress_new(stderr, CLI_PROGRESS_BAR, "index", "shards", 5.0);
        if (bar) {
            a.o.progress = on_index_progress;
            a.o.progress_user = bar;
        }
    }
    struct sf_index_result res;
    char err[1024] = "";
    double t0 = sf__now_s();
    sf_status st = sf_index_shards(s3, (const char *const *)c.args, (size_t)c.n_args, &a.o, &res,
                                   err, sizeof(err));
    double secs = sf__now_s() - t0;
    cli_progress_finish(bar); /* and frees it */
    if (st != SF_OK) {
        cli_fail_status("index", err, st);
        sf_s3_destroy(s3);
        return 1;
    }
    if (to_stdout) {
        fwrite(res.json, 1, res.json_len, stdout);
        if (fflush(stdout) != 0) {
            cli_stdout_failed(errno);
            rc = 1;
        }
    } else if (is_http(res.index_url)) {
        cli_errorf("index: %s: cannot write over http(s); name a local path or s3:// URL with "
                   "-o, or use --dry-run",
                   res.index_url);
        rc = 1;
    } else if ((st = sf_index_result_save(s3, &res, err, sizeof(err))) != SF_OK) {
        rc = cli_fail_status("index", err, st);
    }
    sf_s3_destroy(s3);
    double mib_s = secs > 0 ? (double)res.bytes / 1048576.0 / secs : 0;
    if (rc == 0 && !to_stdout) {
        if (c.json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "index", res.index_url);
            cJSON_AddNumberToObject(o, "shards", (double)res.shards);
            cJSON_AddNumberToObject(o, "tar_shards", (double)res.tar_shards);
            cJSON_AddNumberToObject(o, "record_shards", (double)res.record_shards);
            cJSON_AddNumberToObject(o, "counted_by_index", (double)res.counted_by_index);
            cJSON_AddNumberToObject(o, "samples", (double)res.samples);
            cJSON_AddNumberToObject(o, "bytes", (double)res.bytes);
            cJSON_AddNumberToObject(o, "seconds", secs);
            cJSON_AddNumberToObject(o, "mib_per_s", mib_s);
            cli_print_json(o);
        } else {
            char b[32];
            cli_format_bytes((double)res.bytes, b, sizeof(b));
            printf("indexed %llu shard%s (%llu tar, %llu record): %llu samples, %s, %.2f s, "
                   "%.1f MiB/s\n",
                   res.shards, res.shards == 1 ? "" : "s", res.tar_shards, res.record_shards,
                   res.samples, b, secs, mib_s);
            printf("index: %s\n", res.index_url);
        }
    }
    sf_index_result_clear(&res);
    return rc;
}
