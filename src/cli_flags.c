/* Flag tables (struct cli_flag in cli.h): the options every command takes,
 * and the one parser that reads any command's table, checks values and
 * ranges and says what was wrong. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* The options every command takes; also accepted before the command. */
static const struct cli_choice addressing[] = {
    {"path", SF_ADDRESSING_PATH},
    {"virtual", SF_ADDRESSING_VIRTUAL},
    {"auto", SF_ADDRESSING_AUTO},
    {NULL, 0},
};

#define S3(member, ctype) CLI_AT(struct cli, s3o.member, ctype)
static const struct cli_flag common[] = {
    {"endpoint-url", 0, CLI_STR, .off = S3(endpoint_url, const char *)},
    {"region", 0, CLI_STR, .off = S3(region, const char *)},
    {"profile", 0, CLI_STR, .off = S3(profile, const char *)},
    {"no-sign-request", 0, CLI_SET, .off = S3(no_sign_request, int)},
    {"addressing", 0, CLI_CHOICE, .off = S3(addressing, int), .choices = addressing},
    {"ca-bundle", 0, CLI_STR, .off = S3(ca_bundle, const char *)},
    {"insecure", 0, CLI_SET, .off = S3(insecure, int)},
    {"http2", 0, CLI_SET, .off = S3(http2, int)},
    {"concurrency", 0, CLI_UINT, .off = S3(concurrency, unsigned), .lo = 1,
     .hi = SF_S3_CONCURRENCY_MAX},
    {"io-threads", 0, CLI_UINT, .off = S3(io_threads, unsigned), .lo = 0, /* 0: automatic */
     .hi = SF_S3_IO_THREADS_MAX},
    {"chunk-size", 0, CLI_SIZE, .off = S3(chunk_bytes, unsigned long long),
     .lo = SF_S3_CHUNK_BYTES_MIN, .hi = SF_S3_CHUNK_BYTES_MAX},
    {"max-attempts", 0, CLI_UINT, .off = S3(max_attempts, unsigned), .lo = 1,
     .hi = SF_S3_MAX_ATTEMPTS_MAX},
    {"stall-timeout-ms", 0, CLI_UINT, .off = S3(stall_timeout_ms, unsigned), .lo = 1,
     .hi = SF_S3_TIMEOUT_MS_MAX},
    {"connect-timeout-ms", 0, CLI_UINT, .off = S3(connect_timeout_ms, unsigned), .lo = 1,
     .hi = SF_S3_TIMEOUT_MS_MAX},
    {"first-byte-timeout-ms", 0, CLI_UINT, .off = S3(first_byte_timeout_ms, unsigned), .lo = 0,
     .hi = SF_S3_TIMEOUT_MS_MAX},
    {"request-timeout-ms", 0, CLI_UINT, .off = S3(request_timeout_ms, unsigned), .lo = 0,
     .hi = SF_S3_TIMEOUT_MS_MAX},
    {"json", 0, CLI_SET, .off = CLI_AT(struct cli, json, int)},
    {"recursive", 'r', CLI_SET, .off = CLI_AT(struct cli, recursive, int)},
    {"output", 'o', CLI_STR, .off = CLI_AT(struct cli, output, const char *), .lo = 1},
    {"verbose", 'v', CLI_COUNT, .off = CLI_AT(struct cli, verbose, int)},
    {"help", 'h', CLI_HELP, .off = 0},
};
#undef S3
#define N_COMMON (sizeof(common) / sizeof(common[0]))
_Static_assert(N_COMMON <= 64, "struct cli's `given` has a bit per common option");

static int takes_value(const struct cli_flag *f)
{
    return f->kind != CLI_SET && f->kind != CLI_COUNT && f->kind != CLI_HELP;
}

/* The size of the field a flag of kind k stores (CLI_AT checks it). */
static size_t value_size(enum cli_kind k)
{
    switch (k) {
    case CLI_UINT: return sizeof(unsigned);
    case CLI_U64:
    case CLI_SIZE: return sizeof(unsigned long long);
    case CLI_REAL: return sizeof(double);
    case CLI_STR: return sizeof(const char *);
    default: return sizeof(int);
    }
}

void cli_s3_flags_over(struct sf_s3_options *s3, const struct cli *c)
{
    const size_t at = offsetof(struct cli, s3o);
    for (size_t i = 0; i < N_COMMON; i++) {
        const struct cli_flag *f = &common[i];
        if ((c->given >> i & 1) && f->off >= at && f->off < at + sizeof(c->s3o))
            memcpy((char *)s3 + (f->off - at), (const char *)c + f->off, value_size(f->kind));
    }
}

const struct cli_flag *cli_common_flag(const char *arg, int *takes_next)
{
    *takes_next = 0;
    if (arg[0] != '-' || arg[1] == '\0')
        return NULL;
    if (arg[1] != '-') {
        /* short options: -v, -vv, -r, -o PATH / -oPATH */
        const struct cli_flag *f = NULL;
        for (const char *p = arg + 1; *p; p++) {
            f = NULL;
            for (size_t i = 0; i < N_COMMON && !f; i++)
                if (common[i].short_name == *p)
                    f = &common[i];
            if (!f)
                return NULL;
            if (takes_value(f)) {
                *takes_next = p[1] == '\0';
                return f;
            }
        }
        return f;
    }
    const char *name = arg + 2;
    size_t n = strcspn(name, "=");
    for (size_t i = 0; i < N_COMMON; i++)
        if (strlen(common[i].name) == n && !strncmp(common[i].name, name, n)) {
            *takes_next = takes_value(&common[i]) && !common[i].bare && name[n] != '=';
            return &common[i];
        }
    return NULL;
}

/* ------------------------------------------------------------ values */

/* A size in the largest unit that divides it: 5M, 64K, 16G, 1000. */
static const char *size_text(unsigned long long b, char *buf, size_t len)
{
    static const char units[] = "KMGTPE";
    int u = -1;
    while (b && b % 1024 == 0 && u < 5) {
        b /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, len, "%llu", b);
    else
        snprintf(buf, len, "%llu%c", b, units[u]);
    return buf;
}

/* What the flag takes, for its error message: "an integer in 1..1024". */
static void expected(const struct cli_flag *f, char *buf, size_t len)
{
    char a[32], b[32];
    size_t n = 0;
    switch (f->kind) {
    case CLI_UINT:
    case CLI_INT:
    case CLI_U64:
        if (f->hi)
            snprintf(buf, len, "an integer in %llu..%llu", f->lo, f->hi);
        else if (f->kind == CLI_INT)
            snprintf(buf, len, "an integer");
        else if (f->lo)
            snprintf(buf, len, "an integer of at least %llu", f->lo);
        else
            snprintf(buf, len, "a non-negative integer");
        return;
    case CLI_SIZE:
        /* sf_parse_bytes(): units are binary, with or without "i" and "B" */
        if (f->hi)
            snprintf(buf, len, "a size from %s to %s (bytes, or a unit: 64K, 8M, 5GiB)",
                     size_text(f->lo, a, sizeof(a)), size_text(f->hi, b, sizeof(b)));
        else if (f->lo)
            snprintf(buf, len, "a size of at least %s (bytes, or a unit: 64K, 8M, 5GiB)",
                     size_text(f->lo, a, sizeof(a)));
        else
            snprintf(buf, len, "a size (bytes, or a unit: 64K, 8M, 5GiB)");
        return;
    case CLI_REAL:
        if (f->min != 0 || f->max != 0)
            snprintf(buf, len, "a number in %g..%g", f->min, f->max);
        else
            snprintf(buf, len, "a number");
        return;
    case CLI_REAL3: snprintf(buf, len, "three numbers a,b,c"); return;
    case CLI_STR: snprintf(buf, len, "a value that is not empty"); return;
    case CLI_CHOICE:
        buf[0] = '\0';
        for (const struct cli_choice *c = f->choices; c->name; c++) {
            const char *sep = c == f->choices ? "" : c[1].name ? ", " : " or ";
            int w = snprintf(buf + n, len - n, "%s%s", sep, c->name);
            if (w < 0 || (size_t)w >= len - n)
                return;
            n += (size_t)w;
        }
        return;
    default: snprintf(buf, len, "no value"); return;
    }
}

/* Reads a decimal integer; 0 when arg is one (a leading '-' only if signed).
 * It starts with a digit or that '-': strtoull also takes blanks and a sign,
 * and would read " -1" as 2^64 - 1. */
static int read_integer(const char *arg, int is_signed, long long *s, unsigned long long *u)
{
    const char *digits = is_signed && arg[0] == '-' ? arg + 1 : arg;
    if (*digits < '0' || *digits > '9')
        return -1;
    char *end;
    errno = 0;
    if (is_signed)
        *s = strtoll(arg, &end, 10);
    else
        *u = strtoull(arg, &end, 10);
    return !*end && !errno ? 0 : -1;
}

/* The value of f given as arg (NULL for a flag without one, neg for its
 * --no- form) into the struct at base or the JSON object j. Returns 0, or
 * EXIT_USAGE after saying why. */
static int set_flag(const char *cmd, const struct cli_flag *f, const char *arg, int neg, void *base,
                    cJSON *j)
{
    union {
        int i;
        unsigned u;
        unsigned long long ull;
        double d;
        const char *s;
    } v;
    double d3[3];
    cJSON *item = NULL;
    int ok = 1;
    if (!arg)
        arg = f->bare;
    switch (f->kind) {
    case CLI_SET:
        v.i = !neg;
        item = f->json ? cJSON_CreateBool(!neg) : NULL;
        break;
    case CLI_COUNT:
        memcpy(&v.i, (char *)base + f->off, sizeof(v.i));
        v.i++;
        break;
    case CLI_HELP: cli_usage(stdout); exit(0);
    case CLI_UINT:
    case CLI_U64:
    case CLI_SIZE: {
        unsigned long long x = 0, top = f->kind == CLI_UINT ? UINT_MAX : ULLONG_MAX;
        if (f->kind == CLI_SIZE) {
            ok = sf_parse_bytes(arg, &x) == SF_OK;
            if (f->json) {
                item = cJSON_CreateString(arg); /* the library parses it and names the key */
                break;
            }
        } else {
            long long unused;
            ok = read_integer(arg, 0, &unused, &x) == 0;
        }
        ok = ok && x >= f->lo && x <= (f->hi ? f->hi : top);
        if (f->kind == CLI_UINT)
            v.u = (unsigned)x;
        else
            v.ull = x;
        item = f->json ? cJSON_CreateNumber((double)x) : NULL;
        break;
    }
    case CLI_INT: {
        long long x = 0;
        unsigned long long unused;
        ok = read_integer(arg, 1, &x, &unused) == 0 && x >= INT_MIN && x <= INT_MAX;
        if (f->hi)
            ok = ok && x >= (long long)f->lo && x <= (long long)f->hi;
        v.i = (int)x;
        item = f->json ? cJSON_CreateNumber((double)x) : NULL;
        break;
    }
    case CLI_REAL: {
        char *end;
        v.d = strtod(arg, &end);
        ok = arg[0] && !*end && (f->min == 0 && f->max == 0 ? 1 : v.d >= f->min && v.d <= f->max);
        item = f->json ? cJSON_CreateNumber(v.d) : NULL;
        break;
    }
    case CLI_REAL3: {
        const char *p = arg;
        char *end;
        for (int k = 0; k < 3 && ok; k++) {
            d3[k] = strtod(p, &end);
            ok = end != p && (k < 2 ? *end == ',' : !*end);
            p = end + 1;
        }
        item = f->json && ok ? cJSON_CreateDoubleArray(d3, 3) : NULL;
        break;
    }
    case CLI_STR:
        v.s = arg;
        ok = !(f->lo && !arg[0]);
        item = f->json ? cJSON_CreateString(arg) : NULL;
        break;
    case CLI_CHOICE: {
        const struct cli_choice *c = f->choices;
        while (c->name && strcmp(c->name, arg))
            c++;
        ok = c->name != NULL;
        v.i = ok ? c->value : 0;
        item = f->json && ok ? cJSON_CreateString(arg) : NULL;
        break;
    }
    }
    if (!ok) {
        char what[256];
        expected(f, what, sizeof(what));
        cli_errorf("%s: --%s: expected %s, got '%s'", cmd, f->name, what, arg);
        cJSON_Delete(item);
        return EXIT_USAGE;
    }
    if (!f->json) {
        memcpy((char *)base + f->off, &v, value_size(f->kind));
        return 0;
    }
    if (!item) {
        cli_errorf("%s: out of memory", cmd);
        return EXIT_USAGE;
    }
    char key[64];
    size_t n = strlen(f->name);
    if (n >= sizeof(key))
        abort(); /* a table's mistake, not user input */
    for (size_t i = 0; i <= n; i++)
        key[i] = f->name[i] == '-' ? '_' : f->name[i];
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    cJSON_AddItemToObject(j, key, item);
    return 0;
}

/* ------------------------------------------------------------ argv */

/* getopt values: OPT_BASE + the index of the flag in `slot` */
#define OPT_BASE  1000
#define MAX_SLOTS 256

struct slot {
    const struct cli_flag *f;
    void *base;
    cJSON *json;
    int neg;                 /* --no-NAME */
    unsigned long long mark; /* for struct cli's `given`: its bit (0: not a common option) */
};

int cli_parse_options(int argc, char **argv, struct cli *c, const char *cmd,
                      const struct cli_flags *sets, size_t n_sets)
{
    struct slot slot[MAX_SLOTS];
    struct option longopts[MAX_SLOTS + 1];
    char no_names[MAX_SLOTS][64];
    char shorts[2 * N_COMMON + 2] = ":"; /* ':' first: a missing value is ':', not '?' */
    size_t n = 0, ns = 1;
    memset(c, 0, sizeof(*c));
    sf_s3_options_init_default(&c->s3o);
    struct cli_flags all[8];
    if (n_sets + 1 > sizeof(all) / sizeof(all[0]))
        abort(); /* a programming error, not user input */
    all[0] = (struct cli_flags)CLI_FLAGS(common, c, NULL);
    for (size_t s = 0; s < n_sets; s++)
        all[s + 1] = sets[s];
    for (size_t s = 0; s <= n_sets; s++)
        for (size_t i = 0; i < all[s].n; i++) {
            const struct cli_flag *f = &all[s].flag[i];
            if (n + 2 >= MAX_SLOTS)
                abort();
            int has_arg = !takes_value(f) ? no_argument
                          : f->bare       ? optional_argument
                                          : required_argument;
            const unsigned long long mark = s == 0 ? 1ULL << i : 0;
            slot[n] = (struct slot){f, all[s].base, all[s].json, 0, mark};
            longopts[n] = (struct option){f->name, has_arg, NULL, OPT_BASE + (int)n};
            n++;
            if (f->negatable) {
                snprintf(no_names[n], sizeof(no_names[n]), "no-%s", f->name);
                slot[n] = (struct slot){f, all[s].base, all[s].json, 1, mark};
                longopts[n] = (struct option){no_names[n], no_argument, NULL, OPT_BASE + (int)n};
                n++;
            }
            if (f->short_name) {
                shorts[ns++] = f->short_name;
                if (takes_value(f))
                    shorts[ns++] = ':';
            }
        }
    memset(&longopts[n], 0, sizeof(longopts[n]));
    shorts[ns] = '\0';
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
        const struct slot *sl = NULL;
        if (ch >= OPT_BASE && ch < OPT_BASE + (int)n)
            sl = &slot[ch - OPT_BASE];
        for (size_t i = 0; !sl && ch > 0 && ch < 128 && ch != ':' && ch != '?' && i < n; i++)
            if (slot[i].f->short_name == ch)
                sl = &slot[i];
        if (sl) {
            if (set_flag(cmd, sl->f, optarg, sl->neg, sl->base, sl->json))
                return EXIT_USAGE;
            c->given |= sl->mark;
            continue;
        }
        /* optopt is the letter of a short option; a long option's value is
         * OPT_BASE + its slot (0 when unknown). argv[optind - 1] is not
         * always the word at fault: a letter inside -xv leaves optind on
         * that word. */
        int short_opt = optopt > 0 && optopt < OPT_BASE;
        if (ch == ':') {
            if (short_opt)
                cli_errorf("%s: option '-%c' needs a value, and it is missing", cmd, optopt);
            else
                cli_errorf("%s: option '%s' needs a value, and it is missing", cmd,
                           argv[optind - 1]);
        } else if (short_opt) {
            cli_errorf("%s: unknown option '-%c'", cmd, optopt);
        } else if (optopt) {
            /* a known long option given a value it does not take */
            cli_errorf("%s: option '%s' takes no value", cmd, argv[optind - 1]);
        } else {
            cli_errorf("%s: unknown option '%s'", cmd, argv[optind - 1]);
        }
        return EXIT_USAGE;
    }
    c->args = argv + optind;
    c->n_args = argc - optind;
    c->s3o.log = c->verbose ? cli_log_stderr : NULL;
    c->s3o.log_level = c->verbose >= 2 ? SF_LOG_DEBUG : c->verbose ? SF_LOG_INFO : SF_LOG_ERROR;
    return 0;
}
