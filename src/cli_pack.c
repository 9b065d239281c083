/* shardfeed pack and shardfeed inspect. Public API only. */
#include "cli.h"
#include "progress.h"
#include "shardfeed_pack.h"
#include "shardfeed_shard.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ pack */

struct pack_args {
    struct sf_pack_options o;
    int no_progress;
};

static const struct cli_choice formats[] = {
    {"tar", SF_PACK_FORMAT_TAR},
    {"record", SF_PACK_FORMAT_RECORD},
    {NULL, 0},
};

static const struct cli_choice layouts[] = {
    {"auto", SF_PACK_LAYOUT_AUTO},
    {"imagefolder", SF_PACK_LAYOUT_IMAGEFOLDER},
    {"flat", SF_PACK_LAYOUT_FLAT},
    {NULL, 0},
};

/* The CLI's own bounds: shards under 1K (one tar header and a little) and
 * sides over 65535 (JPEG's largest) are mistakes. */
#define AT(member, ctype) CLI_AT(struct pack_args, o.member, ctype)
static const struct cli_flag pack_flags[] = {
    {"format", 0, CLI_CHOICE, .off = AT(format, int), .choices = formats},
    {"shard-size", 0, CLI_SIZE, .off = AT(shard_bytes, unsigned long long), .lo = 1024},
    {"zstd", 0, CLI_INT, .off = AT(zstd_level, int), .lo = 1, .hi = SF_PACK_ZSTD_LEVEL_MAX,
     .bare = "3" /* the default level */},
    {"layout", 0, CLI_CHOICE, .off = AT(layout, int), .choices = layouts},
    {"name-pattern", 0, CLI_STR, .off = AT(name_pattern, const char *)},
    {"follow-symlinks", 0, CLI_SET, .off = AT(follow_symlinks, int)},
    {"tmp-dir", 0, CLI_STR, .off = AT(tmp_dir, const char *)},
    {"no-progress", 0, CLI_SET, .off = CLI_AT(struct pack_args, no_progress, int)},
    {"max-side", 0, CLI_UINT, .off = AT(max_side, unsigned), .lo = SF_PACK_MAX_SIDE_MIN,
     .hi = 65535},
    {"quality", 0, CLI_INT, .off = AT(jpeg_quality, int), .lo = 1, .hi = SF_PACK_JPEG_QUALITY_MAX},
    {"threads", 0, CLI_UINT, .off = AT(threads, unsigned), .lo = 1, .hi = SF_PACK_THREADS_MAX},
    {"part-size", 0, CLI_SIZE, .off = AT(part_bytes, unsigned long long),
     .lo = SF_UPLOAD_PART_BYTES_MIN, .hi = SF_UPLOAD_PART_BYTES_MAX},
};
#undef AT

/* ------------------------------------------------------------ interrupted pack */

/* SIGINT, SIGTERM or SIGHUP while pack writes cancels it through the
 * progress callback, so the library's failure path runs: no index.json,
 * the shards this run renamed into a local DEST removed, and the staged
 * shards of an s3:// pack (each up to --shard-size, in TMPDIR) deleted.
 * Dying at once left those behind. Then the program dies of the signal. A
 * second signal kills at once (SA_RESETHAND); before the first progress
 * call (the scan) nothing is written, and the first one kills at once too. */
static volatile sig_atomic_t pack_signal;  /* the signal that came, 0 for none */
static volatile sig_atomic_t pack_writing; /* the first progress call came */

static void on_pack_signal(int sig)
{
    if (!pack_writing) {
        raise(sig); /* blocked here: delivered on return, with the default action */
        return;
    }
    pack_signal = sig;
    static const char note[] = "shardfeed: pack: interrupted: removing what this run wrote "
                               "(again to stop at once)\n";
    if (write(STDERR_FILENO, note, sizeof(note) - 1) < 0) {
        /* nothing to do from here */
    }
}

static int on_pack_progress(void *user, const struct sf_pack_progress *p)
{
    pack_writing = 1;
    cli_progress_update(user, p->bytes_done, p->bytes_total, p->files_done, p->files_total);
    return pack_signal != 0;
}

int cli_cmd_pack(int argc, char **argv)
{
    struct pack_args a;
    memset(&a, 0, sizeof(a));
    sf_pack_options_init_default(&a.o);
    const struct cli_flags set = CLI_FLAGS(pack_flags, &a, NULL);
    struct cli c;
    int rc = cli_parse_options(argc, argv, &c, "pack", &set, 1);
    if (rc)
        return rc;
    if (c.n_args != 2) {
        cli_errorf("pack: expected SRC and DEST, got %d operand(s)", c.n_args);
        return EXIT_USAGE;
    }
    if (a.o.zstd_level && a.o.format == SF_PACK_FORMAT_TAR) {
        cli_errorf("pack: --zstd compresses record shards only (readers stream plain tar): add "
                   "--format record");
        return EXIT_USAGE;
    }
    if (a.o.jpeg_quality && !a.o.max_side) {
        cli_errorf("pack: --quality is the quality of re-encoded JPEGs: add --max-side N "
                   "(JPEGs with no side over N are kept byte for byte)");
        return EXIT_USAGE;
    }
    char name[NAME_MAX + 1];
    if (a.o.name_pattern &&
        sf_pack_shard_name(a.o.name_pattern, a.o.format, 0, name, sizeof(name)) != SF_OK) {
        cli_errorf("pack: --name-pattern '%s': expected one %%u (or %%06u, %%d) for the shard "
                   "number, %%%% for '%%', no '/', not starting with '.'",
                   a.o.name_pattern);
        return EXIT_USAGE;
    }
    const char *src = c.args[0], *dest = c.args[1];
    struct sf_s3 *s3 = NULL;
    if (!strncmp(dest, "s3://", 5)) {
        if (cli_open_client(&c, &s3))
            return 1;
        a.o.s3 = s3;
    }
    struct cli_progress *bar = NULL;
    if (!a.no_progress)
        bar = cli_progress_new(stderr, CLI_PROGRESS_AUTO, "pack", "files", 5.0);
    /* always: it is also where a signal cancels the pack */
    a.o.progress = on_pack_progress;
    a.o.progress_user = bar;
    struct sf_pack_result res;
    char err[1024] = "";
    struct sigaction old_sa[CLI_STOP_SIGNALS];
    cli_catch_stop_signals(on_pack_signal, old_sa);
    double t0 = sf__now_s();
    sf_status st = sf_pack(src, dest, &a.o, &res, err, sizeof(err));
    double secs = sf__now_s() - t0;
    cli_restore_stop_signals(old_sa);
    cli_progress_finish(bar); /* and frees it */
    sf_s3_destroy(s3);
    if (st != SF_OK && pack_signal) {
        if (st != SF_ERR_CANCELLED)
            cli_fail_status("pack", err, st);
        cli_errorf("pack: interrupted: no index.json was written%s",
                   a.o.s3 ? "; shards already uploaded stay, the staged ones were removed"
                          : ", and the shards of this run were removed");
        raise(pack_signal); /* its default action again: the status says how pack ended */
        return 1;
    }
    if (st != SF_OK)
        return cli_fail_status("pack", err, st);
    double mib_s = secs > 0 ? (double)res.source_bytes / 1048576.0 / secs : 0;
    if (c.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "source", src);
        cJSON_AddStringToObject(o, "dest", dest);
        cJSON_AddStringToObject(o, "format", sf_pack_format_name(res.format));
        cJSON_AddStringToObject(o, "layout", sf_pack_layout_name(res.layout));
        cJSON_AddNumberToObject(o, "zstd_level", a.o.zstd_level);
        cJSON_AddNumberToObject(o, "shards", (double)res.shards);
        cJSON_AddNumberToObject(o, "samples", (double)res.samples);
        cJSON_AddNumberToObject(o, "files", (double)res.files);
        cJSON_AddNumberToObject(o, "classes", (double)res.classes);
        cJSON_AddNumberToObject(o, "ignored", (double)res.ignored);
        cJSON_AddNumberToObject(o, "source_bytes", (double)res.source_bytes);
        cJSON_AddNumberToObject(o, "bytes", (double)res.shard_bytes);
        cJSON_AddNumberToObject(o, "seconds", secs);
        cJSON_AddNumberToObject(o, "mib_per_s", mib_s);
        cJSON_AddNumberToObject(o, "max_side", a.o.max_side);
        cJSON_AddNumberToObject(o, "reencoded", (double)res.reencoded);
        cJSON_AddNumberToObject(o, "reencoded_source_bytes", (double)res.reencoded_source_bytes);
        cJSON_AddNumberToObject(o, "reencoded_bytes", (double)res.reencoded_bytes);
        cli_print_json(o);
    } else {
        char in[32], out[32];
        cli_format_bytes((double)res.source_bytes, in, sizeof(in));
        cli_format_bytes((double)res.shard_bytes, out, sizeof(out));
        printf("packed %llu files (%s) into %llu %s shard%s: %llu samples, %s, %.2f s, "
               "%.1f MiB/s\n",
               res.files, in, res.shards, sf_pack_format_name(res.format),
               res.shards == 1 ? "" : "s", res.samples, out, secs, mib_s);
        if (res.layout == SF_PACK_LAYOUT_IMAGEFOLDER)
            printf("layout imagefolder: %llu classes, labels in the 'cls' field\n", res.classes);
        else
            printf("layout flat\n");
        if (res.ignored)
            printf("ignored %llu hidden entr%s (names starting with '.')\n", res.ignored,
                   res.ignored == 1 ? "y" : "ies");
        if (a.o.max_side) {
            char b0[32], b1[32];
            cli_format_bytes((double)res.reencoded_source_bytes, b0, sizeof(b0));
            cli_format_bytes((double)res.reencoded_bytes, b1, sizeof(b1));
            printf("re-encoded %llu JPEG%s over %u px at quality %d: %s -> %s\n", res.reencoded,
                   res.reencoded == 1 ? "" : "s", a.o.max_side,
                   a.o.jpeg_quality ? a.o.jpeg_quality : 90, b0, b1);
        }
        printf("index: %s%sindex.json\n", dest, dest[strlen(dest) - 1] == '/' ? "" : "/");
    }
    return 0;
}

/* ------------------------------------------------------------ inspect */

/* Small printable values (labels, short text) are shown, not only sized. */
static int printable(const unsigned char *d, size_t n)
{
    if (n == 0 || n > 24)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (d[i] < 0x20 || d[i] > 0x7e || d[i] == '"' || d[i] == '\\')
            return 0;
    return 1;
}

struct field_count {
    char *name;
    unsigned long long n;
};

static int count_field(struct field_count **v, size_t *n, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*v)[i].name, name)) {
            (*v)[i].n++;
            return 0;
        }
    struct field_count *w = realloc(*v, (*n + 1) * sizeof(**v));
    if (!w)
        return -1;
    *v = w;
    w[*n].name = strdup(name);
    w[*n].n = 1;
    if (!w[*n].name)
        return -1;
    (*n)++;
    return 0;
}

static const char *format_name(enum sf_shard_format f)
{
    return f == SF_SHARD_FORMAT_TAR ? "tar" : f == SF_SHARD_FORMAT_RECORD ? "record" : "unknown";
}

int cli_cmd_inspect(int argc, char **argv)
{
    struct cli c;
    int rc = cli_parse_options(argc, argv, &c, "inspect", NULL, 0);
    if (rc)
        return rc;
    if (c.n_args != 1) {
        cli_errorf("inspect: expected one SHARD_URL, got %d", c.n_args);
        return EXIT_USAGE;
    }
    const char *url = c.args[0];
    struct sf_s3 *s3;
    if (cli_open_client(&c, &s3))
        return 1;
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(s3, url, NULL, &f);
    if (st != SF_OK) {
        cli_report(s3, st);
        sf_s3_destroy(s3);
        return 1;
    }
    struct sf_shard_reader_options ro;
    sf_shard_reader_options_init_default(&ro);
    ro.name = url;
    struct sf_shard_reader *r = NULL;
    char err[512] = "";
    st = sf_shard_reader_new(&ro, &r, err, sizeof(err));
    if (st != SF_OK) {
        cli_fail_status("inspect", err, st);
        sf_fetch_destroy(f);
        sf_s3_destroy(s3);
        return 1;
    }
    cJSON *out = c.json ? cJSON_CreateObject() : NULL;
    cJSON *jsamples = out ? cJSON_AddArrayToObject(out, "samples") : NULL;
    struct field_count *fields = NULL;
    size_t n_fields = 0;
    unsigned long long samples = 0, total = SF_SIZE_UNKNOWN, fed = 0;
    int fetch_failed = 0, fed_once = 0;
    rc = 0;
    /* parse as the bytes arrive: the reader says how many it needs next */
    for (;;) {
        struct sf_sample smp;
        enum sf_shard_event ev;
        st = sf_shard_reader_next(r, &smp, &ev);
        if (st != SF_OK) {
            rc = 1;
            break;
        }
        if (ev == SF_SHARD_END)
            break;
        if (ev == SF_SHARD_NEED_MORE) {
            struct sf_fetch_progress pg;
            unsigned long long want = sf_shard_reader_wanted(r);
            sf_status fst = sf_fetch_wait(f, want, -1, &pg);
            if (fst != SF_OK) {
                cli_errorf("inspect: %s (%s)", sf_fetch_errmsg(f), sf_status_name(fst));
                fetch_failed = 1;
                rc = 1;
                break;
            }
            if (fed_once && pg.contiguous == fed && pg.done) {
                /* nothing more will come; a reader that still waits is a bug */
                cli_errorf("inspect: %s: the reader waits for byte %llu of %llu", url, want,
                           pg.total);
                fetch_failed = 1;
                rc = 1;
                break;
            }
            total = pg.total;
            fed = pg.contiguous;
            fed_once = 1;
            st = sf_shard_reader_feed(r, sf_fetch_data(f), pg.contiguous, pg.total);
            if (st != SF_OK) {
                rc = 1;
                break;
            }
            continue;
        }
        samples++;
        cJSON *js = NULL, *jf = NULL;
        if (out) {
            js = cJSON_CreateObject();
            cJSON_AddStringToObject(js, "key", smp.key);
            cJSON_AddNumberToObject(js, "offset", (double)smp.offset);
            jf = cJSON_AddArrayToObject(js, "fields");
            cJSON_AddItemToArray(jsamples, js);
        } else {
            printf("%s", smp.key);
        }
        for (size_t i = 0; i < smp.field_count; i++) {
            const struct sf_sample_field *fl = &smp.fields[i];
            int show = printable(fl->data, fl->size);
            if (count_field(&fields, &n_fields, fl->name) != 0) {
                cli_errorf("inspect: out of memory");
                rc = 1;
                break;
            }
            if (jf) {
                cJSON *x = cJSON_CreateObject();
                cJSON_AddStringToObject(x, "name", fl->name);
                cJSON_AddNumberToObject(x, "size", (double)fl->size);
                if (show) {
                    char v[32];
                    snprintf(v, sizeof(v), "%.*s", (int)fl->size, (const char *)fl->data);
                    cJSON_AddStringToObject(x, "value", v);
                }
                cJSON_AddItemToArray(jf, x);
            } else if (show) {
                printf("  %s=\"%.*s\"", fl->name, (int)fl->size, (const char *)fl->data);
            } else {
                printf("  %s:%zu", fl->name, fl->size);
            }
        }
        if (!out)
            putchar('\n');
        if (rc)
            break;
        if (ferror(stdout)) {
            /* the output is gone (a reader that left with SIGPIPE ignored, a
             * full disk): reading on would fetch the rest of the shard for
             * nothing; main reports it */
            rc = 1;
            fetch_failed = 1; /* no summary to print either */
            break;
        }
    }
    int corrupt = rc && !fetch_failed && st != SF_OK;
    if (corrupt) {
        unsigned long long off = sf_shard_reader_error_offset(r);
        cli_errorf("inspect: %s (%s)", sf_shard_reader_errmsg(r), sf_status_name(st));
        if (out) {
            /* cli_json_finish adds it only beside its own "error" */
            cJSON_AddBoolToObject(out, "ok", 0);
            cJSON_AddStringToObject(out, "error", sf_shard_reader_errmsg(r));
            cJSON_AddStringToObject(out, "status", sf_status_name(st));
            if (off != SF_SIZE_UNKNOWN)
                cJSON_AddNumberToObject(out, "error_offset", (double)off);
        }
    }
    struct sf_shard_stats ss;
    sf_shard_reader_stats(r, &ss);
    const char *fmt = format_name(sf_shard_reader_format(r));
    if (out) {
        cJSON_AddStringToObject(out, "url", url);
        cJSON_AddStringToObject(out, "format", fmt);
        if (total != SF_SIZE_UNKNOWN)
            cJSON_AddNumberToObject(out, "bytes", (double)total);
        cJSON_AddNumberToObject(out, "sample_count", (double)samples);
        cJSON *jc = cJSON_AddObjectToObject(out, "fields");
        for (size_t i = 0; jc && i < n_fields; i++)
            cJSON_AddNumberToObject(jc, fields[i].name, (double)fields[i].n);
        unsigned long long skipped =
            ss.skipped_dirs + ss.skipped_links + ss.skipped_other + ss.skipped_unnamed;
        cJSON_AddNumberToObject(out, "skipped_members", (double)skipped);
        cJSON_AddBoolToObject(out, "missing_end_marker", ss.missing_end_marker);
        cJSON_AddBoolToObject(out, "lone_zero_block", ss.lone_zero_block);
        cli_print_json(out);
    } else if (!fetch_failed) {
        printf("-- %s: %s, ", url, fmt);
        if (total != SF_SIZE_UNKNOWN)
            printf("%llu bytes, ", total);
        printf("%llu samples%s", samples, corrupt ? " before the error" : "");
        for (size_t i = 0; i < n_fields; i++)
            printf("%s%s (%llu)", i ? ", " : "; fields: ", fields[i].name, fields[i].n);
        putchar('\n');
        unsigned long long skipped =
            ss.skipped_dirs + ss.skipped_links + ss.skipped_other + ss.skipped_unnamed;
        if (skipped)
            printf("-- %llu tar members skipped (folders, links, special files, or names "
                   "without key or extension)\n",
                   skipped);
        /* accepted as GNU tar accepts them (docs/FORMAT.md), but a shard cut
         * short at a member boundary looks the same: this is where to see it */
        if (ss.missing_end_marker)
            printf("-- the tar ends without its end-of-archive blocks (two zero blocks): "
                   "complete only if its writer left them out\n");
        else if (ss.lone_zero_block)
            printf("-- the tar ends after one zero block of its two end-of-archive blocks\n");
    }
    for (size_t i = 0; i < n_fields; i++)
        free(fields[i].name);
    free(fields);
    sf_shard_reader_destroy(r);
    sf_fetch_destroy(f);
    sf_s3_destroy(s3);
    return rc;
}
