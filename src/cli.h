/*
 * Shared pieces of the shardfeed command-line tool: option parsing, error
 * output and the client setup every command uses. The CLI uses the public
 * API only; nothing here is part of the library.
 */
#ifndef SF_CLI_H
#define SF_CLI_H

#include "common/clock.h"
#include "shardfeed.h"

#include <cjson/cJSON.h>
#include <getopt.h>

#define EXIT_USAGE 2

/* getopt values of command-specific options start here. */
#define CLI_OPT_EXTRA 2000

struct cli {
    struct sf_s3_options s3o;
    int json;
    int recursive;
    const char *output;
    int verbose;
    char **args; /* operands after the options */
    int n_args;
};

/*
 * A command's own long options. `longopts` ends with a zeroed entry and uses
 * values >= CLI_OPT_EXTRA; `on_option` gets each one with its argument (NULL
 * for flags) and returns 0, or EXIT_USAGE after printing why.
 */
struct cli_extra {
    const struct option *longopts;
    int (*on_option)(void *ctx, int val, const char *arg);
    void *ctx;
};

/* Parses argv after the command name into c. Returns 0, or EXIT_USAGE. */
int cli_parse_options(int argc, char **argv, struct cli *c, const char *cmd,
                      const struct cli_extra *extra);
int cli_parse_uint(const char *flag, const char *v, unsigned lo, unsigned hi, unsigned *out);

__attribute__((format(printf, 1, 2))) void cli_errorf(const char *fmt, ...);
void cli_log_stderr(void *user, enum sf_log_level level, const char *message);

/* Creates the S3 client from c->s3o; prints the reason and returns 1 on failure. */
int cli_open_client(struct cli *c, struct sf_s3 **s3);
/* Prints the client's last error for status st. */
void cli_report(struct sf_s3 *s3, sf_status st);
void cli_print_json(cJSON *j);

/* The S3 commands (cli_s3.c), run with the common options parsed into c.
 * Each returns the exit status. */
int cli_cmd_ls(struct cli *c);
int cli_cmd_stat(struct cli *c);
int cli_cmd_get(struct cli *c);

/* Commands that live in their own files: argv starts at the command name. */
int cli_cmd_warm_cache(int argc, char **argv);
int cli_cmd_cache(int argc, char **argv);
int cli_cmd_pack(int argc, char **argv);
int cli_cmd_index(int argc, char **argv);
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_load(int argc, char **argv);
int cli_cmd_doctor(int argc, char **argv);
int cli_cmd_tune(int argc, char **argv);

#endif
