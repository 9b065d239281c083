/* shardfeed load: runs epochs through the loader and reports its speed.
 *
 * Every loader option has a flag of the same name (`--batch-size` for
 * batch_size); the flags are turned into a JSON object and applied with
 * sf_loader_options_from_json(), so the CLI, the JSON file (--config) and
 * the C struct cannot drift apart. */
#include "cli.h"
#include "common/file.h"
#include "common/io.h"
#include "src/pipeline_rate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Loader options as flags, into the JSON object under their own names
 * ("batch_size" for --batch-size); a boolean's --no- form sets false. Their
 * ranges and enum values are the library's to check. */
#define LOADER(name, kind) {name, 0, kind, .json = 1, .negatable = (kind) == CLI_SET}
static const struct cli_flag load_flags[] = {
    LOADER("batch-size", CLI_U64),
    LOADER("decode-threads", CLI_U64),
    LOADER("prefetch-batches", CLI_U64),
    LOADER("prefetch-shards", CLI_U64),
    LOADER("shuffle-buffer", CLI_U64),
    LOADER("initial-fill", CLI_U64),
    LOADER("seed", CLI_U64),
    LOADER("epoch", CLI_U64),
    LOADER("rank", CLI_INT),
    LOADER("world-size", CLI_INT),
    LOADER("epoch-policy", CLI_STR),
    LOADER("learned-counts", CLI_STR),
    LOADER("partition", CLI_STR),
    LOADER("drop-last", CLI_SET),
    LOADER("ram-only", CLI_SET),
    LOADER("require-end-marker", CLI_SET),
    LOADER("cache-dir", CLI_STR),
    LOADER("cache-limit", CLI_SIZE),
    LOADER("ram-cache-limit", CLI_SIZE),
    LOADER("max-shard-bytes", CLI_SIZE),
    LOADER("size", CLI_U64),
    LOADER("width", CLI_U64),
    LOADER("height", CLI_U64),
    LOADER("crop", CLI_STR),
    LOADER("scale-min", CLI_REAL),
    LOADER("scale-max", CLI_REAL),
    LOADER("ratio-min", CLI_REAL),
    LOADER("ratio-max", CLI_REAL),
    LOADER("center-fraction", CLI_REAL),
    LOADER("hflip", CLI_REAL),
    LOADER("layout", CLI_STR),
    LOADER("dtype", CLI_STR),
    LOADER("mean", CLI_REAL3),
    LOADER("std", CLI_REAL3),
    LOADER("max-side", CLI_U64),
    LOADER("max-pixels", CLI_U64),
    LOADER("max-scans", CLI_U64),
    LOADER("image-fields", CLI_STR),
    LOADER("label-fields", CLI_STR),
    LOADER("extra-fields", CLI_STR),
    LOADER("max-extra-bytes", CLI_SIZE),
    LOADER("on-error", CLI_STR),
    LOADER("device", CLI_STR),
    LOADER("cuda-device", CLI_INT),
    LOADER("normalize-on-device", CLI_SET),
    LOADER("sync-device", CLI_SET),
};
#undef LOADER

struct load_ctx {
    cJSON *set; /* flags given, as loader JSON */
    unsigned epochs;
    const char *config;
    unsigned long long max_batches;
    double step_ms;
    int digest;
    int doctor;       /* 1: shardfeed doctor, 2: shardfeed tune */
    double budget_s;  /* tune */
    double autotune_s; /* load --autotune: tune first within this budget */
    double seconds;   /* doctor: per stage */
};

#define AT(member, ctype) CLI_AT(struct load_ctx, member, ctype)
/* The flags of load, doctor and tune that are no loader option. */
static const struct cli_flag run_flags[] = {
    {"epochs", 0, CLI_UINT, .off = AT(epochs, unsigned), .lo = 1, .hi = 1000000},
    {"config", 0, CLI_STR, .off = AT(config, const char *)},
    {"max-batches", 0, CLI_U64, .off = AT(max_batches, unsigned long long)},
    {"step-ms", 0, CLI_REAL, .off = AT(step_ms, double), .min = 0, .max = 60000},
};
static const struct cli_flag load_only_flags[] = {
    {"digest", 0, CLI_SET, .off = AT(digest, int)},
    {"autotune", 0, CLI_REAL, .off = AT(autotune_s, double), .min = 1, .max = 3600},
};
static const struct cli_flag doctor_flags[] = {
    {"seconds", 0, CLI_REAL, .off = AT(seconds, double), .min = 0.1, .max = 3600},
};
static const struct cli_flag tune_flags[] = {
    {"budget-s", 0, CLI_REAL, .off = AT(budget_s, double), .min = 1, .max = 3600},
};
#undef AT

static void load_usage(FILE *f)
{
    fputs(
        "usage: shardfeed load URL... [options]\n"
        "Runs epochs through the loader (fetch, cache, parse, decode, batch, GPU copy)\n"
        "and prints images/s, images delivered, the consumer's wait share and the\n"
        "per-stage rates. Options carry the loader's option names (docs/loader.md):\n"
        "  --batch-size N (256)  --epochs N (1)  --decode-threads N (cores)\n"
        "  --prefetch-batches N (4)  --prefetch-shards N (4)  --shuffle-buffer N (1000)\n"
        "  --seed N  --epoch N  --rank N  --world-size N  --epoch-policy pad|drop|uneven\n"
        "  --initial-fill N (100)  --partition shards|samples  --drop-last  --ram-only\n"
        "  --learned-counts auto|never|always (counts learned in earlier runs; docs/sampling.md)\n"
        "  --cache-dir DIR  --cache-limit SIZE  --ram-cache-limit SIZE  --max-shard-bytes SIZE (4G)\n"
        "  --size N | --width N --height N  --crop random_resized|center|none\n"
        "  --scale-min F --scale-max F --ratio-min F --ratio-max F --center-fraction F\n"
        "  --hflip P  --layout chw|hwc  --dtype uint8|float32  --mean a,b,c --std a,b,c\n"
        "  --image-fields 'jpg;jpeg'  --label-fields 'cls;json;txt'  --extra-fields LIST\n"
        "  --max-extra-bytes SIZE (16M)\n"
        "  --on-error fail|skip  --device auto|host|cuda|emulated  --cuda-device N\n"
        "  --no-normalize-on-device  --sync-device  --max-side N --max-pixels N --max-scans N\n"
        "  --require-end-marker   a tar shard without its end-of-archive blocks (cut at a\n"
        "                         member boundary looks the same) is an error, not a warning\n"
        "  --config FILE          loader options as a JSON object (flags win)\n"
        "  --max-batches N        stop after N batches in all\n"
        "  --step-ms MS           simulate a training step of MS per batch (wait share)\n"
        "  --digest               print a digest of every batch's pixels and labels\n"
        "  --autotune S           first tune decode threads, concurrency, chunk size and\n"
        "                         prefetch depths within about S seconds (shardfeed tune),\n"
        "                         then run with them; flags and --concurrency/--chunk-size\n"
        "                         given still win\n"
        "  --json                 one JSON object on stdout\n"
        "  plus the S3 options of `shardfeed help` (--endpoint-url, --concurrency,\n"
        "  --chunk-size, ...).\n"
        "Exit status: 0 done, 1 the loader failed (the message names the shard, key\n"
        "and offset), 2 bad usage.\n",
        f);
}

static void doctor_usage(FILE *f)
{
    fputs("usage: shardfeed doctor URL... [loader options] [--step-ms MS] [--seconds S] [--json]\n"
          "Measures each stage of the pipeline on its own, on your data and options (fetch,\n"
          "read, decode, assembly, device copy; S seconds each, default 2), then the whole\n"
          "pipeline with a training step of MS per batch (none: as fast as it can), and\n"
          "names the stage that bounds it and the knob to turn (docs/doctor.md).\n"
          "Takes every option of `shardfeed load` but --digest and --autotune (see\n"
          "`shardfeed load --help`).\n"
          "Exit status: 0 done, 1 a stage failed (the message names the object), 2 bad usage.\n",
          f);
}

static void tune_usage(FILE *f)
{
    fputs("usage: shardfeed tune URL... [loader options] [--budget-s S] [-o config.json] [--json]\n"
          "Searches decode threads, concurrency, chunk size and the prefetch depths against\n"
          "your store and data in about S seconds (default 20), checks the whole pipeline\n"
          "with the result against the options given, and writes the options as JSON for\n"
          "--config / config= (stdout without -o). docs/doctor.md \"Autotune\".\n"
          "Takes every option of `shardfeed load` but --digest and --autotune (see\n"
          "`shardfeed load --help`).\n"
          "Exit status: 0 done, 1 a measurement failed (the message names the object), 2 bad\n"
          "usage.\n",
          f);
}

#define CONFIG_MAX_BYTES (32u << 20)

/* Whether path can be written: an existing file (not a folder), or a new
 * one in a folder that can be written; errno says why not. Only an early
 * warning: sf__write_file_whole() does the write and says if it fails. */
static int writable_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        errno = EISDIR; /* access() would let a folder pass */
        return 0;
    }
    if (access(path, W_OK) == 0)
        return 1;
    if (errno != ENOENT)
        return 0;
    const char *slash = strrchr(path, '/');
    if (!slash)
        return access(".", W_OK) == 0;
    char dir[4096];
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof(dir)) {
        errno = ENAMETOOLONG;
        return 0;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    return access(dir, W_OK) == 0;
}

/* The whole file, NUL-terminated (the caller frees it), or NULL with errno:
 * EFBIG over CONFIG_MAX_BYTES, EISDIR and other read errors as read gave
 * them (fread's 0 is not the end of a file it could not read). */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    int e = buf ? 0 : ENOMEM;
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            e = ferror(f) ? (errno ? errno : EIO) : 0;
            break;
        }
        if (n == cap) {
            char *nb = cap < CONFIG_MAX_BYTES ? realloc(buf, cap * 2 + 1) : NULL;
            if (!nb) {
                e = cap < CONFIG_MAX_BYTES ? ENOMEM : EFBIG;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (e) {
        free(buf);
        errno = e;
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

/* FNV-1a 64 over a batch's pixels, labels and flags (--digest). */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void sleep_ms(double ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1000),
                          (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6)};
    nanosleep(&ts, NULL);
}

static int run_doctor(struct sf_loader_options *o, const struct load_ctx *lc, int json);
static int run_tune(struct sf_loader_options *o, const struct load_ctx *lc, int json,
                    const char *output);

/* load --autotune: sf_tune on the options as given, the tuned knobs applied
 * over the config file, then the flags again and the S3 flags given, so
 * that whatever the user set explicitly wins (as Python's autotune=). */
static sf_status autotune(struct sf_loader_options *o, const struct load_ctx *lc,
                          const struct cli *c, const char *flags_json, void *keep[2])
{
    char err[2048] = "";
    struct sf_tune_result r;
    o->sources = (const char *const *)c->args;
    o->source_count = (size_t)c->n_args;
    sf_status st = sf_tune(o, lc->autotune_s, &r, err, sizeof(err));
    if (st != SF_OK) {
        cli_errorf("load: autotune: %s (%s)", err[0] ? err : sf_status_str(st),
                   sf_status_name(st));
        return st;
    }
    /* Strings in the options point into these: freed after the open. */
    st = sf_loader_options_from_json(o, r.config_json, &keep[0], err, sizeof(err));
    if (st == SF_OK)
        st = sf_loader_options_from_json(o, flags_json, &keep[1], err, sizeof(err));
    if (st != SF_OK) {
        cli_errorf("load: autotune: %s", err);
        return st;
    }
    cli_s3_flags_over(&o->s3, c);
    fprintf(stderr, "load: autotune: %s in %.1f s (%u measurements)%s\n", r.config_json,
            r.seconds, r.points, r.kept_given ? "; the options given were kept" : "");
    return SF_OK;
}

/* --json on failure: one object with the error, whatever failed. */
static void print_json_error(const char *msg, sf_status st)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "ok", 0);
    cJSON_AddStringToObject(j, "error", msg && msg[0] ? msg : sf_status_str(st));
    cJSON_AddStringToObject(j, "status", sf_status_name(st));
    cli_print_json(j);
}

/* A failure once the options were checked (exit 1, not bad usage): the
 * message on stderr and, with --json, the object that carries it. */
static int command_failed(const char *cmd, const char *err, sf_status st, int json)
{
    cli_fail_status(cmd, err, st);
    if (json)
        print_json_error(err, st);
    return 1;
}

/* doctor: 0 load, 1 doctor, 2 tune. On f: stdout for --help, stderr after
 * bad usage. */
static void usage_of(int doctor, FILE *f)
{
    if (doctor == 2)
        tune_usage(f);
    else if (doctor)
        doctor_usage(f);
    else
        load_usage(f);
}

static int load_or_doctor(int argc, char **argv, int doctor)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_of(doctor, stdout);
            return 0;
        }
    struct load_ctx lc = {.set = cJSON_CreateObject(), .epochs = 1, .doctor = doctor, .seconds = 2};
    if (!lc.set)
        return 1;
    struct cli c;
    const struct cli_flags sets[] = {
        CLI_FLAGS(load_flags, NULL, lc.set),
        CLI_FLAGS(run_flags, &lc, NULL),
        doctor == 2 ? (struct cli_flags)CLI_FLAGS(tune_flags, &lc, NULL)
        : doctor    ? (struct cli_flags)CLI_FLAGS(doctor_flags, &lc, NULL)
                    : (struct cli_flags)CLI_FLAGS(load_only_flags, &lc, NULL),
    };
    const char *name = doctor == 2 ? "tune" : doctor ? "doctor" : "load";
    int rc = cli_parse_options(argc, argv, &c, name, sets, sizeof(sets) / sizeof(sets[0]));
    if (rc) {
        cJSON_Delete(lc.set);
        return rc;
    }
    if (c.n_args < 1) {
        cli_errorf("%s: expected at least one shard URL, pattern or prefix", name);
        usage_of(doctor, stderr);
        cJSON_Delete(lc.set);
        return EXIT_USAGE;
    }

    /* tune -o: a path it cannot write is said before the budget is spent. */
    if (doctor == 2 && c.output && strcmp(c.output, "-") && !writable_path(c.output)) {
        cli_errorf("tune: -o %s: %s", c.output, strerror(errno));
        cJSON_Delete(lc.set);
        return EXIT_USAGE;
    }

    struct sf_loader_options o;
    sf_loader_options_init_default(&o);
    o.s3 = c.s3o;
    if (c.verbose) {
        o.log = cli_log_stderr;
        o.log_level = c.verbose >= 2 ? SF_LOG_DEBUG : SF_LOG_INFO;
    } else {
        o.log = cli_log_stderr;
        o.log_level = SF_LOG_WARN;
    }
    char err[2048] = "";
    void *keep_cfg = NULL, *keep_flags = NULL;
    if (lc.config) {
        char *text = read_file(lc.config);
        if (!text) {
            if (errno == EFBIG)
                cli_errorf("--config %s: reaches the %u MiB limit of a configuration", lc.config,
                           CONFIG_MAX_BYTES >> 20);
            else
                cli_errorf("--config %s: %s", lc.config, strerror(errno ? errno : EIO));
            cJSON_Delete(lc.set);
            return EXIT_USAGE;
        }
        sf_status st = sf_loader_options_from_json(&o, text, &keep_cfg, err, sizeof(err));
        free(text);
        if (st != SF_OK) {
            cli_errorf("--config %s: %s", lc.config, err);
            cJSON_Delete(lc.set);
            return EXIT_USAGE;
        }
        cli_s3_flags_over(&o.s3, &c);
    }
    char *flags_json = cJSON_PrintUnformatted(lc.set);
    cJSON_Delete(lc.set);
    sf_status st = flags_json
                       ? sf_loader_options_from_json(&o, flags_json, &keep_flags, err, sizeof(err))
                       : SF_ERR_NO_MEMORY;
    void *keep_tuned[2] = {NULL, NULL};
    if (st == SF_OK && lc.autotune_s > 0) {
        st = autotune(&o, &lc, &c, flags_json, keep_tuned);
        if (st != SF_OK) {
            free(flags_json);
            sf_loader_options_free_json(keep_cfg);
            sf_loader_options_free_json(keep_flags);
            sf_loader_options_free_json(keep_tuned[0]);
            sf_loader_options_free_json(keep_tuned[1]);
            return 1;
        }
    }
    free(flags_json);
    if (st != SF_OK) {
        /* "option 'batch_size': bad value" -> name the flag */
        cli_errorf("%s: %s (flags use the option names with '-' for '_')", name, err);
        sf_loader_options_free_json(keep_cfg);
        return EXIT_USAGE;
    }
    o.sources = (const char *const *)c.args;
    o.source_count = (size_t)c.n_args;
    /* Bad options are bad usage (2); once they hold, any failure, an HTTP 400
     * from the server included, is an operation that failed (1). */
    st = sf_loader_options_check(&o, err, sizeof(err));
    if (st != SF_OK) {
        cli_errorf("%s: %s (%s)", name, err, sf_status_name(st));
        if (c.json)
            print_json_error(err, st);
        sf_loader_options_free_json(keep_cfg);
        sf_loader_options_free_json(keep_flags);
        sf_loader_options_free_json(keep_tuned[0]);
        sf_loader_options_free_json(keep_tuned[1]);
        return EXIT_USAGE;
    }
    if (doctor) {
        int drc = doctor == 2 ? run_tune(&o, &lc, c.json, c.output) : run_doctor(&o, &lc, c.json);
        sf_loader_options_free_json(keep_cfg);
        sf_loader_options_free_json(keep_flags);
        return drc;
    }

    double t_open = sf__now_s();
    struct sf_loader *l = NULL;
    st = sf_loader_open(&o, &l, err, sizeof(err));
    sf_loader_options_free_json(keep_cfg);
    sf_loader_options_free_json(keep_flags);
    sf_loader_options_free_json(keep_tuned[0]);
    sf_loader_options_free_json(keep_tuned[1]);
    if (st != SF_OK)
        return command_failed("load", err, st, c.json);
    uint64_t digest = 0xcbf29ce484222325ULL;
    unsigned long long batches = 0, images = 0, pads = 0;
    double first_batch_s = -1;
    sf_status fail_st = SF_OK;
    uint64_t first_epoch = o.sampler.epoch;
    for (unsigned e = 0; e < lc.epochs && fail_st == SF_OK; e++) {
        if (e > 0 && (st = sf_loader_set_epoch(l, first_epoch + e)) != SF_OK) {
            fail_st = st;
            break;
        }
        for (;;) {
            if (lc.max_batches && batches >= lc.max_batches)
                break;
            struct sf_batch b;
            st = sf_loader_next(l, &b);
            if (st == SF_END_OF_EPOCH)
                break; /* any other status is a failure, never an end */
            if (st != SF_OK) {
                fail_st = st;
                break;
            }
            if (first_batch_s < 0)
                first_batch_s = sf__now_s() - t_open;
            batches++;
            images += b.size;
            for (size_t i = 0; i < b.size; i++)
                pads += (b.flags[i] & SF_SAMPLE_PAD) != 0;
            if (lc.digest) {
                digest = fnv(digest, b.images, b.size * b.image_bytes);
                digest = fnv(digest, b.labels, b.size * sizeof(*b.labels));
                digest = fnv(digest, b.flags, b.size * sizeof(*b.flags));
            }
            sleep_ms(lc.step_ms);
            sf_loader_release(l, &b);
        }
        if (lc.max_batches && batches >= lc.max_batches)
            break;
    }
    double seconds = sf__now_s() - t_open;
    struct sf_loader_stats s;
    sf_loader_get_stats(l, &s);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    unsigned long long rss = (unsigned long long)ru.ru_maxrss * 1024ULL;
    struct sf_loader_report rep;
    sf_loader_report(l, &rep);
    /* One wait share, the report's: the wait over the time from the first
     * next() on. consumer_wait_s / seconds would count the open (listing,
     * index.json) as time the step did not wait. */
    const double wait_share = rep.wait_share;
    if (fail_st != SF_OK) {
        cli_errorf("load: %s (%s)", sf_loader_errmsg(l), sf_status_name(fail_st));
    }
    if (c.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddBoolToObject(j, "ok", fail_st == SF_OK);
        if (fail_st != SF_OK) {
            cJSON_AddStringToObject(j, "error", sf_loader_errmsg(l));
            cJSON_AddStringToObject(j, "status", sf_status_name(fail_st));
        }
        cJSON_AddNumberToObject(j, "epochs", lc.epochs);
        cJSON_AddNumberToObject(j, "shards", (double)sf_loader_shard_count(l));
        cJSON_AddNumberToObject(j, "images", (double)images);
        cJSON_AddNumberToObject(j, "batches", (double)batches);
        cJSON_AddNumberToObject(j, "pads", (double)pads);
        cJSON_AddNumberToObject(j, "skipped", (double)s.samples_skipped);
        cJSON_AddNumberToObject(j, "dropped", (double)s.dropped_samples);
        cJSON_AddNumberToObject(j, "shards_without_end_marker",
                                (double)s.shards_without_end_marker);
        cJSON_AddNumberToObject(j, "seconds", seconds);
        if (first_batch_s < 0)
            cJSON_AddNullToObject(j, "first_batch_s"); /* no batch came */
        else
            cJSON_AddNumberToObject(j, "first_batch_s", first_batch_s);
        cJSON_AddNumberToObject(j, "images_per_s", seconds > 0 ? (double)images / seconds : 0);
        cJSON_AddNumberToObject(j, "consumer_wait_s", s.consumer_wait_s);
        cJSON_AddNumberToObject(j, "consumer_wait_share", wait_share);
        cJSON_AddNumberToObject(j, "read_per_s", s.read_per_s);
        cJSON_AddNumberToObject(j, "decode_per_s", s.decode_per_s);
        cJSON_AddNumberToObject(j, "decode_busy_s", s.decode_busy_s);
        cJSON_AddNumberToObject(j, "read_busy_s", s.read_busy_s);
        cJSON_AddNumberToObject(j, "gpu_copy_s", s.gpu_copy_s);
        cJSON_AddNumberToObject(j, "fetch_mib_per_s", s.fetch_mib_per_s);
        cJSON_AddNumberToObject(j, "bytes_fetched", (double)s.bytes_fetched);
        cJSON_AddNumberToObject(j, "bytes_read", (double)s.bytes_read);
        cJSON_AddNumberToObject(j, "requests", (double)s.requests);
        cJSON_AddNumberToObject(j, "retries", (double)s.retries);
        cJSON_AddNumberToObject(j, "cache_hits", (double)s.cache_hits);
        cJSON_AddNumberToObject(j, "cache_misses", (double)s.cache_misses);
        cJSON_AddNumberToObject(j, "decode_threads", s.decode_threads);
        cJSON_AddBoolToObject(j, "on_device", s.on_device);
        cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)rss);
        cJSON *r = cJSON_AddObjectToObject(j, "report");
        cJSON_AddNumberToObject(r, "span_s", rep.span_s);
        cJSON_AddNumberToObject(r, "wait_share", rep.wait_share);
        cJSON_AddNumberToObject(r, "wait_p50_ms", rep.wait_p50_ms);
        cJSON_AddNumberToObject(r, "wait_p99_ms", rep.wait_p99_ms);
        cJSON_AddNumberToObject(r, "wait_max_ms", rep.wait_max_ms);
        cJSON_AddNumberToObject(r, "first_wait_s", rep.first_wait_s);
        cJSON_AddNumberToObject(r, "step_per_s", rep.step_per_s);
        cJSON_AddNumberToObject(r, "decode_per_thread_per_s", rep.decode_per_thread_per_s);
        cJSON_AddNumberToObject(r, "decode_busy", rep.decode_busy);
        cJSON_AddNumberToObject(r, "read_busy", rep.read_busy);
        cJSON_AddNumberToObject(r, "device_busy", rep.device_busy);
        cJSON_AddStringToObject(r, "bound", sf_stage_name(rep.bound));
        cJSON_AddBoolToObject(r, "starving", rep.starving);
        cJSON_AddStringToObject(r, "verdict", rep.verdict);
        if (lc.digest) {
            char hex[17];
            snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)digest);
            cJSON_AddStringToObject(j, "digest", hex);
        }
        cli_print_json(j);
    } else {
        printf("load: %llu images in %llu batches, %u epoch(s), %.2f s: %.1f images/s\n", images,
               batches, lc.epochs, seconds, seconds > 0 ? (double)images / seconds : 0.0);
        char first[48] = "no batch came";
        if (first_batch_s >= 0)
            snprintf(first, sizeof(first), "first batch after %.2f s", first_batch_s);
        printf("  consumer waited %.2f s (%.1f %% of the time from its first next()); %s\n",
               rep.wait_s, 100.0 * wait_share, first);
        printf("  stages: read %.1f samples/s, decode %.1f images/s on %u threads (busy %.2f "
               "s), fetch %.1f MiB/s\n",
               s.read_per_s, s.decode_per_s, s.decode_threads, s.decode_busy_s, s.fetch_mib_per_s);
        printf("  shards %zu, cache hits %llu, misses %llu, requests %llu, retries %llu; "
               "skipped %llu, pads %llu, dropped %llu; %s; peak RSS %.1f MiB\n",
               sf_loader_shard_count(l), (unsigned long long)s.cache_hits,
               (unsigned long long)s.cache_misses, (unsigned long long)s.requests,
               (unsigned long long)s.retries, (unsigned long long)s.samples_skipped, pads,
               (unsigned long long)s.dropped_samples, s.on_device ? "batches on the GPU" : "host batches", (double)rss / 1048576.0);
        printf("  batch waits: p50 %.2f ms, p99 %.2f ms, max %.2f ms; %s\n", rep.wait_p50_ms,
               rep.wait_p99_ms, rep.wait_max_ms, rep.verdict);
        if (s.shards_without_end_marker)
            printf("  %llu tar shard(s) read without their end-of-archive blocks (see "
                   "--require-end-marker)\n",
                   (unsigned long long)s.shards_without_end_marker);
        if (lc.digest)
            printf("  digest %016llx\n", (unsigned long long)digest);
    }
    if (rep.starving && fail_st == SF_OK)
        fprintf(stderr, "load: warning: the step waited for data %.1f %% of the time: %s\n",
                100.0 * rep.wait_share, rep.verdict);
    sf_loader_close(l);
    return fail_st == SF_OK ? 0 : 1;
}

int cli_cmd_load(int argc, char **argv)
{
    return load_or_doctor(argc, argv, 0);
}

int cli_cmd_doctor(int argc, char **argv)
{
    return load_or_doctor(argc, argv, 1);
}

/* The simulated training step (--step-ms) after each batch; user: the ms. */
static void sleep_step(void *user)
{
    sleep_ms(*(const double *)user);
}

/* The whole pipeline with the step, for `seconds` (whole epochs as needed). */
static sf_status doctor_pipeline(struct sf_loader_options *o, const struct load_ctx *lc,
                                 double seconds, double *per_s, struct sf_loader_report *rep,
                                 int *in_cache, char *err, size_t err_len)
{
    struct sf_loader *l = NULL;
    sf_status st = sf_loader_open(o, &l, err, err_len);
    if (st != SF_OK)
        return st;
    double step_ms = lc->step_ms;
    st = sf__pipeline_rate(l, o->sampler.epoch, seconds, sleep_step, &step_ms, per_s, err, err_len);
    struct sf_loader_stats s;
    sf_loader_get_stats(l, &s);
    sf_loader_report(l, rep);
    *in_cache = s.bytes_fetched == 0;
    sf_loader_close(l);
    return st;
}

static int run_doctor(struct sf_loader_options *o, const struct load_ctx *lc, int json)
{
    static const enum sf_stage shown[] = {SF_STAGE_FETCH, SF_STAGE_READ, SF_STAGE_DECODE,
                                          SF_STAGE_ASSEMBLY, SF_STAGE_DEVICE};
    struct sf_doctor_result r;
    char err[2048] = "";
    sf_status st = sf_doctor_measure(o, lc->seconds, &r, err, sizeof(err));
    double pipe = 0;
    struct sf_loader_report rep;
    memset(&rep, 0, sizeof(rep));
    int in_cache = 0;
    if (st == SF_OK)
        st = doctor_pipeline(o, lc, 2 * lc->seconds, &pipe, &rep, &in_cache, err, sizeof(err));
    if (st != SF_OK)
        return command_failed("doctor", err, st, json);
    const unsigned bs = o->batch_size ? o->batch_size : 256;
    const double step = lc->step_ms > 0 ? 1000.0 * bs / lc->step_ms : 0;
    sf_doctor_conclude(&r, step, pipe, &rep, in_cache);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddBoolToObject(j, "ok", 1);
        cJSON *stages = cJSON_AddObjectToObject(j, "stages");
        for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
            cJSON *sj = cJSON_AddObjectToObject(stages, sf_stage_name(shown[i]));
            cJSON_AddNumberToObject(sj, "samples_per_s", r.stage_per_s[shown[i]]);
            cJSON_AddBoolToObject(sj, "measured", r.stage_per_s[shown[i]] > 0);
            cJSON_AddStringToObject(sj, "how", r.stage_note[shown[i]]);
        }
        cJSON_AddNumberToObject(j, "step_per_s", r.step_per_s);
        cJSON_AddNumberToObject(j, "pipeline_per_s", r.pipeline_per_s);
        cJSON_AddNumberToObject(j, "wait_share", r.wait_share);
        cJSON_AddNumberToObject(j, "wait_p50_ms", rep.wait_p50_ms);
        cJSON_AddNumberToObject(j, "wait_p99_ms", rep.wait_p99_ms);
        cJSON_AddNumberToObject(j, "decode_per_thread_per_s", r.decode_per_thread_per_s);
        cJSON_AddNumberToObject(j, "decode_threads", r.decode_threads);
        cJSON_AddNumberToObject(j, "cores", r.cores);
        cJSON_AddNumberToObject(j, "fetch_mib_per_s", r.fetch_mib_per_s);
        cJSON_AddNumberToObject(j, "fetch_mib_per_s_more", r.fetch_mib_per_s_more);
        cJSON_AddNumberToObject(j, "concurrency", r.concurrency);
        cJSON_AddNumberToObject(j, "concurrency_more", r.concurrency_more);
        cJSON_AddNumberToObject(j, "bytes_per_sample", r.bytes_per_sample);
        cJSON_AddNumberToObject(j, "max_side_speedup", r.max_side_speedup);
        cJSON_AddNumberToObject(j, "max_side_bytes", r.max_side_bytes);
        cJSON_AddBoolToObject(j, "data_in_cache", in_cache);
        cJSON_AddStringToObject(j, "bound", r.bound == SF_STAGE_NONE ? "step" : sf_stage_name(r.bound));
        cJSON_AddStringToObject(j, "verdict", r.verdict);
        cli_print_json(j);
        return 0;
    }
    printf("%-10s %14s  %s\n", "stage", "samples/s", "measured as");
    if (step > 0)
        printf("%-10s %14.0f  the step alone (--step-ms %.1f, batch %u)\n", "step", step,
               lc->step_ms, bs);
    else
        printf("%-10s %14s  no --step-ms: the step takes no time\n", "step", "-");
    for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
        const enum sf_stage s = shown[i];
        if (r.stage_per_s[s] > 0)
            printf("%-10s %14.0f  %s%s\n", sf_stage_name(s), r.stage_per_s[s], r.stage_note[s],
                   s == SF_STAGE_FETCH && !r.fetch_counts ? " (data in the cache: not a bound)"
                                                          : "");
        else
            printf("%-10s %14s  %s\n", sf_stage_name(s), "-", r.stage_note[s]);
    }
    printf("%-10s %14.0f  the whole loader with the step, %.1f s; the step waited %.1f %% "
           "(batch wait p50 %.2f ms, p99 %.2f ms)\n",
           "pipeline", pipe, 2 * lc->seconds, 100.0 * r.wait_share, rep.wait_p50_ms,
           rep.wait_p99_ms);
    printf("bound: %s\n", r.bound == SF_STAGE_NONE ? "step" : sf_stage_name(r.bound));
    printf("%s\n", r.verdict);
    return 0;
}

int cli_cmd_tune(int argc, char **argv)
{
    return load_or_doctor(argc, argv, 2);
}

static int run_tune(struct sf_loader_options *o, const struct load_ctx *lc, int json,
                    const char *output)
{
    struct sf_tune_result r;
    char err[2048] = "";
    sf_status st = sf_tune(o, lc->budget_s, &r, err, sizeof(err));
    if (st != SF_OK)
        return command_failed("tune", err, st, json);
    if (output && !strcmp(output, "-"))
        output = NULL; /* stdout, as without -o */
    if (output) {
        size_t n = strlen(r.config_json) + 2;
        char *text = malloc(n);
        if (text)
            snprintf(text, n, "%s\n", r.config_json);
        if (!text || sf__write_file_whole(output, text, strlen(text)) != 0) {
            cli_errorf("tune: -o %s: %s", output, strerror(text ? errno : ENOMEM));
            free(text);
            return 1;
        }
        free(text);
    }
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddBoolToObject(j, "ok", 1);
        cJSON *cfg = cJSON_Parse(r.config_json);
        if (cfg)
            cJSON_AddItemToObject(j, "config", cfg);
        cJSON_AddNumberToObject(j, "decode_per_s", r.decode_per_s);
        cJSON_AddNumberToObject(j, "fetch_mib_per_s", r.fetch_mib_per_s);
        cJSON_AddNumberToObject(j, "tuned_per_s", r.tuned_per_s);
        cJSON_AddNumberToObject(j, "given_per_s", r.given_per_s);
        cJSON_AddBoolToObject(j, "kept_given", r.kept_given);
        cJSON_AddNumberToObject(j, "points", r.points);
        cJSON_AddNumberToObject(j, "seconds", r.seconds);
        cJSON_AddStringToObject(j, "trace", r.trace);
        cli_print_json(j);
        return 0;
    }
    if (!output)
        printf("%s\n", r.config_json);
    fprintf(stderr,
            "tune: %u measurements in %.1f s: %s\n"
            "tune: pipeline %.0f samples/s with these options, %.0f with the ones given%s%s%s\n",
            r.points, r.seconds, r.trace, r.tuned_per_s, r.given_per_s,
            r.kept_given ? " (kept the given ones)" : "", output ? "; written to " : "",
            output ? output : "");
    return 0;
}
