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
#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#define EXIT_USAGE 2

struct cli {
    struct sf_s3_options s3o;
    unsigned long long given; /* bit i: argv gave the i-th common option (cli_flags.c) */
    int json;
    int recursive;
    const char *output;
    int verbose;
    char **args; /* operands after the options */
    int n_args;
};

/*
 * Flags are declared in tables, one per command (struct cli_flag), and parsed
 * by cli_parse_options(): value syntax, range checks and the messages naming
 * the flag and its value are written once, in cli_flags.c. Where the library
 * defines a limit, the table uses its constant (SF_S3_*, SF_PACK_*, ...).
 */
enum cli_kind {
    CLI_SET,    /* no value: int = 1 (0 for --no-NAME when negatable) */
    CLI_COUNT,  /* no value, may repeat: int counts them (-v -v) */
    CLI_HELP,   /* no value: prints `shardfeed help` and exits 0 */
    CLI_UINT,   /* unsigned, decimal, in lo..hi (hi 0: up to UINT_MAX) */
    CLI_INT,    /* int, decimal, in lo..hi (hi 0: any int, negative too) */
    CLI_U64,    /* unsigned long long, decimal, in lo..hi (hi 0: no bound) */
    CLI_SIZE,   /* unsigned long long bytes (8M, 8MiB, 512K), in lo..hi (hi 0: no bound) */
    CLI_REAL,   /* double in min..max (both 0: any number) */
    CLI_REAL3,  /* three numbers a,b,c (into JSON only) */
    CLI_STR,    /* const char * into argv; lo 1: not empty */
    CLI_CHOICE, /* int: the value of the name given, from choices */
};

struct cli_choice {
    const char *name;
    int value;
};

struct cli_flag {
    const char *name; /* the long option, without "--" */
    char short_name;  /* -X, or 0 */
    enum cli_kind kind;
    /* Where the value goes: the field at `off` in the struct given with the
     * table (CLI_AT), or with `json` set, the JSON object given with the
     * table under the flag's name with '_' for '-' (loader options: the
     * library checks their ranges). A CLI_SIZE into JSON stays the text
     * given, which the library parses. */
    size_t off;
    int json;
    unsigned long long lo, hi;
    double min, max;
    const struct cli_choice *choices; /* CLI_CHOICE: ends with a NULL name */
    const char *bare; /* the value of the flag given alone (--zstd): its value is optional */
    int negatable;    /* CLI_SET: --no-NAME too */
};

/* offsetof(type, member), refused at compile time unless the member has the
 * size of ctype, the type the flag's kind stores (unsigned for CLI_UINT,
 * int for CLI_SET, CLI_COUNT, CLI_INT and CLI_CHOICE, unsigned long long for
 * CLI_U64 and CLI_SIZE, double for CLI_REAL, const char * for CLI_STR). */
#define CLI_AT(type, member, ctype)                                                                \
    (offsetof(type, member) +                                                                      \
     0 * sizeof(char[sizeof(((type *)0)->member) == sizeof(ctype) ? 1 : -1]))

/* One command's table, the struct its fields are in and the JSON object its
 * json flags go into (either may be NULL when no flag uses it). */
struct cli_flags {
    const struct cli_flag *flag;
    size_t n;
    void *base;
    cJSON *json;
};
#define CLI_FLAGS(table, base_, json_) {(table), sizeof(table) / sizeof((table)[0]), (base_), (json_)}

/* Parses argv after the command name into c: the options every command
 * takes, then those of the n_sets tables in sets. Returns 0, or EXIT_USAGE
 * after printing why (naming the flag, the value and what it takes). */
int cli_parse_options(int argc, char **argv, struct cli *c, const char *cmd,
                      const struct cli_flags *sets, size_t n_sets);
/* The option every command takes that argv word arg names (-v, --region=X,
 * -oPATH ...), else NULL; *takes_next: its value is the next word. */
const struct cli_flag *cli_common_flag(const char *arg, int *takes_next);
/* Puts over s3 the S3 options the command line gave (their values in
 * c->s3o), whatever their value: options applied after cli_parse_options
 * (a --config file, tuned ones) do not replace what the user typed. */
void cli_s3_flags_over(struct sf_s3_options *s3, const struct cli *c);
void cli_usage(FILE *f);

__attribute__((format(printf, 1, 2))) void cli_errorf(const char *fmt, ...);
/* A failure as every command prints it: "cmd: msg (SF_ERR_...)", with st's
 * text when msg is empty and no "cmd: " when cmd is NULL. Returns 1, the
 * exit status of a command that failed. */
int cli_fail_status(const char *cmd, const char *msg, sf_status st);
void cli_log_stderr(void *user, enum sf_log_level level, const char *message);

/* Whether descriptor 1 was closed when the program started (`>&-`); it
 * then holds /dev/null, read-only, so that writes fail. */
int cli_stdout_closed(void);
/* A write to stdout failed with errno err (0: unknown): EPIPE ends the
 * program as SIGPIPE does, quietly; anything else is reported once
 * ("stdout: ...") and the caller fails the command. */
void cli_stdout_failed(int err);

/* The signals that stop a long command: Ctrl-C, kill, a closed terminal. */
#define CLI_STOP_SIGNALS 3
/* Catches the stop signals with handler, once each (SA_RESETHAND: a second
 * one has the default action), the others blocked while it runs; a signal
 * the shell made us ignore (nohup, `&` without job control) stays ignored.
 * The old actions go to old, for cli_restore_stop_signals(). */
void cli_catch_stop_signals(void (*handler)(int), struct sigaction old[CLI_STOP_SIGNALS]);
void cli_restore_stop_signals(const struct sigaction old[CLI_STOP_SIGNALS]);

/* Creates the S3 client from c->s3o; prints the reason and returns 1 on failure. */
int cli_open_client(struct cli *c, struct sf_s3 **s3);
/* Prints the client's last error for status st. */
void cli_report(struct sf_s3 *s3, sf_status st);
/* Prints j (held until the command's exit status is known) and takes it:
 * the caller does not free it. NULL prints nothing. */
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
