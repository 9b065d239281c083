/* shardfeed warm-cache and shardfeed cache ls|stats|verify|clear. */
#include "cli.h"
#include "progress.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct cache_flags {
    struct sf_cache_options co;
    int verify;
    int dry_run;
    unsigned max_objects;
    enum cli_progress_mode progress;
};

static const struct cli_choice revalidate[] = {
    {"trust", SF_REVALIDATE_TRUST},
    {"head", SF_REVALIDATE_HEAD},
    {NULL, 0},
};

static const struct cli_choice progress[] = {
    {"auto", CLI_PROGRESS_AUTO},
    {"bar", CLI_PROGRESS_BAR},
    {"lines", CLI_PROGRESS_LINES},
    {"off", CLI_PROGRESS_OFF},
    {NULL, 0},
};

#define AT(member, ctype) CLI_AT(struct cache_flags, member, ctype)
static const struct cli_flag cache_flags[] = {
    {"cache-dir", 0, CLI_STR, .off = AT(co.dir, const char *), .lo = 1},
    {"cache-limit", 0, CLI_SIZE, .off = AT(co.limit_bytes, unsigned long long)},
    {"verify", 0, CLI_SET, .off = AT(verify, int)},
    {"dry-run", 0, CLI_SET, .off = AT(dry_run, int)},
    {"max-objects", 0, CLI_UINT, .off = AT(max_objects, unsigned), .lo = 1,
     .hi = SF_WARM_MAX_OBJECTS_MAX},
    {"fsync", 0, CLI_SET, .off = AT(co.fsync, int)},
    {"revalidate", 0, CLI_CHOICE, .off = AT(co.revalidate, int), .choices = revalidate},
    {"progress", 0, CLI_CHOICE, .off = AT(progress, int), .choices = progress},
};
#undef AT

static int parse(int argc, char **argv, const char *cmd, struct cli *c, struct cache_flags *f)
{
    memset(f, 0, sizeof(*f));
    sf_cache_options_init_default(&f->co);
    f->progress = CLI_PROGRESS_AUTO;
    const struct cli_flags set = CLI_FLAGS(cache_flags, f, NULL);
    int rc = cli_parse_options(argc, argv, c, cmd, &set, 1);
    if (rc)
        return rc;
    if (c->verbose) {
        f->co.log = cli_log_stderr;
        f->co.log_level = c->verbose >= 2 ? SF_LOG_DEBUG : SF_LOG_INFO;
    }
    return 0;
}

static int open_cache(struct cache_flags *f, struct sf_cache **cache)
{
    char err[1024] = "";
    sf_status st = sf_cache_new(&f->co, cache, err, sizeof(err));
    return st != SF_OK ? cli_fail_status("cache", err, st) : 0;
}

/* ------------------------------------------------------------ warm-cache */

struct warm_ui {
    struct cli_progress *bar;
    int json;
    cJSON *failed; /* [{url, status, error}] */
    cJSON *planned;
    unsigned long long n_failed;
};

static void warm_progress(void *user, const struct sf_warm_stats *s)
{
    struct warm_ui *ui = user;
    /* Bytes: what was cached plus what arrived, out of everything. */
    unsigned long long have = s->bytes_total - s->bytes_to_fetch + s->bytes_fetched;
    cli_progress_update(ui->bar, have, s->bytes_total, s->objects_done, s->objects_total);
}

static void warm_object(void *user, const struct sf_object_info *obj, enum sf_warm_outcome out,
                        sf_status st, const char *msg)
{
    struct warm_ui *ui = user;
    if (out == SF_WARM_FAILED) {
        ui->n_failed++;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "url", obj->url);
        cJSON_AddStringToObject(e, "status", sf_status_name(st));
        cJSON_AddStringToObject(e, "error", msg);
        cJSON_AddItemToArray(ui->failed, e);
    } else if (out == SF_WARM_WOULD_FETCH) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "url", obj->url);
        cJSON_AddNumberToObject(e, "size", (double)obj->size);
        cJSON_AddItemToArray(ui->planned, e);
    }
}

/* A copy of in that the caller clears (sf_object_info_clear); -1 when out
 * of memory. */
static int copy_object(struct sf_object_info *dst, const struct sf_object_info *in)
{
    *dst = *in;
    dst->url = strdup(in->url);
    dst->key = strdup(in->key ? in->key : "");
    if (dst->url && dst->key)
        return 0;
    sf_object_info_clear(dst);
    return -1;
}

static void free_objects(struct sf_object_info *objs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sf_object_info_clear(&objs[i]);
    free(objs);
}

/* Pointers into one array: by URL, then by place, so the first of equal
 * URLs sorts first. */
static int by_url(const void *a, const void *b)
{
    const struct sf_object_info *x = *(const struct sf_object_info *const *)a;
    const struct sf_object_info *y = *(const struct sf_object_info *const *)b;
    int d = strcmp(x->url, y->url);
    return d ? d : (x > y) - (x < y);
}

/* An object named twice (a prefix and one of its keys, overlapping
 * patterns) is warmed once: later copies are dropped, the order kept.
 * Otherwise it counts twice against the limit and its second copy waits
 * on the first as on another process. Out of memory: left as it is. */
static void drop_repeats(struct sf_object_info *objs, size_t *n)
{
    struct sf_object_info **by = malloc(*n * sizeof(*by));
    unsigned char *dup = calloc(*n, 1);
    if (by && dup) {
        for (size_t i = 0; i < *n; i++)
            by[i] = &objs[i];
        qsort(by, *n, sizeof(*by), by_url);
        for (size_t i = 1; i < *n; i++)
            dup[by[i] - objs] = !strcmp(by[i]->url, by[i - 1]->url);
        size_t k = 0;
        for (size_t i = 0; i < *n; i++) {
            if (dup[i])
                sf_object_info_clear(&objs[i]);
            else
                objs[k++] = objs[i];
        }
        *n = k;
    }
    free(by);
    free(dup);
}

/* Expands every URL into one list of the objects a training run reads from
 * it (sf_warm_wants: a listing gives its shards, prefixes left out), which the
 * caller frees (free_objects) whatever the result. Returns 0, or 1 after
 * printing why. */
static int expand_all(struct sf_s3 *s3, const struct cli *c, struct sf_object_info **objs,
                      size_t *n)
{
    size_t cap = 0;
    int rc = 0;
    for (int a = 0; a < c->n_args && !rc; a++) {
        struct sf_object_list *l = NULL;
        sf_status st = sf_s3_expand(s3, c->args[a], 0, &l);
        if (st != SF_OK) {
            cli_report(s3, st);
            return 1;
        }
        size_t k = sf_object_list_count(l);
        if (*n + k > cap) {
            size_t nc = (*n + k) * 2;
            struct sf_object_info *v = realloc(*objs, nc * sizeof(*v));
            if (!v) {
                cli_errorf("warm-cache: out of memory");
                rc = 1;
            } else {
                *objs = v;
                cap = nc;
            }
        }
        for (size_t i = 0; !rc && i < k; i++) {
            const struct sf_object_info *in = sf_object_list_get(l, i);
            if (!sf_warm_wants(c->args[a], in))
                continue; /* a prefix, or index.json beside the shards */
            if (copy_object(&(*objs)[*n], in)) {
                cli_errorf("warm-cache: out of memory");
                rc = 1;
                break;
            }
            (*n)++;
        }
        sf_object_list_destroy(l);
    }
    if (!rc && *n == 0) {
        cli_errorf("warm-cache: no objects match %s", c->args[0]);
        rc = 1;
    }
    if (!rc)
        drop_repeats(*objs, n);
    return rc;
}

/* Names every shard that failed, with the reason, on stderr. */
static void print_failures(const cJSON *failed)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, failed)
    {
        cli_errorf("failed: %s: %s (%s)", cJSON_GetObjectItem(e, "url")->valuestring,
                   cJSON_GetObjectItem(e, "error")->valuestring,
                   cJSON_GetObjectItem(e, "status")->valuestring);
    }
}

/* Warms cache with the n objects and reports it; returns the exit status. */
static int warm(const struct cli *c, const struct cache_flags *f, struct sf_cache *cache,
                struct sf_s3 *s3, const struct sf_object_info *objs, size_t n)
{
    int rc;
    struct warm_ui ui = {0};
    ui.json = c->json;
    ui.failed = cJSON_CreateArray();
    ui.planned = cJSON_CreateArray();
    ui.bar = f->dry_run ? NULL : cli_progress_new(stderr, f->progress, "warm-cache", "shards", 5.0);
    struct sf_warm_options wo;
    sf_warm_options_init_default(&wo);
    if (f->max_objects)
        wo.max_objects = f->max_objects;
    wo.verify = f->verify;
    wo.dry_run = f->dry_run;
    wo.progress = warm_progress;
    wo.on_object = warm_object;
    wo.user = &ui;
    struct sf_warm_stats s;
    sf_status st = sf_cache_warm(cache, s3, objs, n, &wo, &s);
    cli_progress_finish(ui.bar);
    /* Refused before fetching: pass 2 would have finished every object. A
     * shard that failed before it (not found) is already among the done. */
    if (st == SF_ERR_LIMIT && s.objects_done < s.objects_total) {
        char msg[1024];
        sf_cache_errmsg(cache, msg, sizeof(msg));
        cli_errorf("warm-cache: %s", msg);
        if (!c->json)
            print_failures(ui.failed);
        rc = 1;
    } else {
        double rate = s.elapsed_s > 0 ? (double)s.bytes_fetched / s.elapsed_s : 0;
        if (c->json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "cache_dir", sf_cache_dir(cache));
            cJSON_AddNumberToObject(j, "objects", (double)s.objects_total);
            cJSON_AddNumberToObject(j, "fetched", (double)s.fetched);
            cJSON_AddNumberToObject(j, "skipped", (double)(s.cached + s.peer));
            cJSON_AddNumberToObject(j, "cached", (double)s.cached);
            cJSON_AddNumberToObject(j, "by_other_process", (double)s.peer);
            cJSON_AddNumberToObject(j, "failed", (double)s.failed);
            cJSON_AddNumberToObject(j, "bytes_total", (double)s.bytes_total);
            cJSON_AddNumberToObject(j, "bytes_fetched", (double)s.bytes_fetched);
            cJSON_AddNumberToObject(j, "seconds", s.elapsed_s);
            cJSON_AddNumberToObject(j, "bytes_per_second", rate);
            cJSON_AddBoolToObject(j, "dry_run", f->dry_run);
            if (f->dry_run) {
                cJSON_AddItemToObject(j, "would_fetch", ui.planned);
                ui.planned = NULL;
            }
            cJSON_AddItemToObject(j, "failures", ui.failed);
            ui.failed = NULL;
            cli_print_json(j);
        } else {
            char b1[32], b2[32], r[32];
            if (f->dry_run) {
                cli_format_bytes((double)s.bytes_to_fetch, b1, sizeof(b1));
                printf("dry run: %llu of %llu shards would be fetched (%s), %llu are cached\n",
                       s.objects_total - s.cached - s.failed, s.objects_total, b1, s.cached);
                const cJSON *e;
                cJSON_ArrayForEach(e, ui.planned)
                {
                    printf("  would fetch %s (%.0f bytes)\n",
                           cJSON_GetObjectItem(e, "url")->valuestring,
                           cJSON_GetObjectItem(e, "size")->valuedouble);
                }
            } else {
                cli_format_bytes((double)s.bytes_fetched, b1, sizeof(b1));
                cli_format_bytes((double)s.bytes_total, b2, sizeof(b2));
                cli_format_bytes(rate, r, sizeof(r));
                printf("warm-cache: %llu shards: %llu fetched, %llu skipped (%llu cached, %llu "
                       "by another process), %llu failed; %s fetched of %s in %.1fs (%s/s)\n",
                       s.objects_total, s.fetched, s.cached + s.peer, s.cached, s.peer, s.failed,
                       b1, b2, s.elapsed_s, r);
            }
            print_failures(ui.failed);
        }
        if (st != SF_OK && !s.failed) {
            /* a failure no shard carries (the shards that are all cached
             * and do not fit under the limit): say it rather than exit 1 */
            char msg[1024];
            sf_cache_errmsg(cache, msg, sizeof(msg));
            cli_fail_status("warm-cache", msg, st);
        }
        rc = s.failed || st != SF_OK ? 1 : 0;
    }
    cJSON_Delete(ui.failed);
    cJSON_Delete(ui.planned);
    return rc;
}

int cli_cmd_warm_cache(int argc, char **argv)
{
    struct cli c;
    struct cache_flags f;
    int rc = parse(argc, argv, "warm-cache", &c, &f);
    if (rc)
        return rc;
    if (c.n_args < 1) {
        cli_errorf("warm-cache: expected one or more URLs (s3://bucket/prefix/, brace patterns)");
        return EXIT_USAGE;
    }
    struct sf_s3 *s3;
    if (cli_open_client(&c, &s3))
        return 1;
    struct sf_cache *cache;
    if (open_cache(&f, &cache)) {
        sf_s3_destroy(s3);
        return 1;
    }
    struct sf_object_info *objs = NULL;
    size_t n = 0;
    rc = expand_all(s3, &c, &objs, &n);
    if (!rc)
        rc = warm(&c, &f, cache, s3, objs, n);
    free_objects(objs, n);
    sf_cache_destroy(cache);
    sf_s3_destroy(s3);
    return rc;
}

/* ------------------------------------------------------------ cache ls|stats|verify|clear */

struct ls_ctx {
    int json;
    cJSON *arr;
};

static int ls_one(void *user, const struct sf_cache_entry_info *e)
{
    struct ls_ctx *x = user;
    if (x->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", e->name);
        cJSON_AddStringToObject(o, "url", e->url);
        cJSON_AddStringToObject(o, "etag", e->etag);
        cJSON_AddNumberToObject(o, "size", (double)e->size);
        cJSON_AddNumberToObject(o, "created", (double)e->created);
        cJSON_AddNumberToObject(o, "last_used", (double)e->last_used);
        cJSON_AddStringToObject(o, "status", sf_status_name(e->status));
        if (e->problem[0])
            cJSON_AddStringToObject(o, "problem", e->problem);
        cJSON_AddItemToArray(x->arr, o);
        return 0;
    }
    char when[32] = "-";
    time_t t = (time_t)e->last_used;
    struct tm tm;
    if (t > 0 && gmtime_r(&t, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    if (e->status == SF_OK)
        printf("%19s %14llu  %s\n", when, e->size, e->url);
    else
        printf("%19s %14s  %s: %s (%s)\n", when, "BAD", e->url[0] ? e->url : e->name, e->problem,
               sf_status_name(e->status));
    return 0;
}

static int is_subcommand(const char *w)
{
    return !strcmp(w, "ls") || !strcmp(w, "stats") || !strcmp(w, "verify") || !strcmp(w, "clear");
}

int cli_cmd_cache(int argc, char **argv)
{
    if (argc < 2) {
        cli_errorf("cache: expected ls, stats, verify or clear");
        return EXIT_USAGE;
    }
    /* The subcommand is the operand, wherever the options put it
     * (`shardfeed --json cache stats`, `cache --cache-dir D ls`); messages
     * name it when it comes first. */
    char cmd[32] = "cache";
    if (is_subcommand(argv[1]))
        snprintf(cmd, sizeof(cmd), "cache %s", argv[1]);
    struct cli c;
    struct cache_flags f;
    int rc = parse(argc, argv, cmd, &c, &f);
    if (rc)
        return rc;
    if (c.n_args < 1) {
        cli_errorf("cache: expected ls, stats, verify or clear");
        return EXIT_USAGE;
    }
    const char *sub = c.args[0];
    if (!is_subcommand(sub)) {
        cli_errorf("cache: unknown subcommand '%s' (expected ls, stats, verify or clear)", sub);
        return EXIT_USAGE;
    }
    snprintf(cmd, sizeof(cmd), "cache %s", sub);
    if (c.n_args > 1) {
        cli_errorf("%s: unexpected argument '%s'", cmd, c.args[1]);
        return EXIT_USAGE;
    }
    /* Looking at or clearing a cache never makes one: a mistyped
     * --cache-dir made an empty cache there and reported it empty. */
    struct stat sb;
    if (f.co.dir && stat(f.co.dir, &sb) != 0 && errno == ENOENT) {
        cli_errorf("%s: %s: no such folder, so no cache there (load and warm-cache make it)", cmd,
                   f.co.dir);
        return 1;
    }
    struct sf_cache *cache;
    if (open_cache(&f, &cache))
        return 1;
    sf_status st = SF_OK;
    char msg[1024];
    if (!strcmp(sub, "ls") || !strcmp(sub, "verify")) {
        int verify = !strcmp(sub, "verify");
        struct ls_ctx x = {c.json, c.json ? cJSON_CreateArray() : NULL};
        unsigned long long bad = 0;
        st = sf_cache_list(cache, verify, ls_one, &x, &bad);
        if (c.json)
            cli_print_json(x.arr);
        if (st == SF_OK && bad) {
            cli_errorf("%s: %llu bad entr%s%s", cmd, bad, bad == 1 ? "y" : "ies",
                       verify ? " (deleted; they will be fetched again)" : "");
            rc = 1;
        }
    } else if (!strcmp(sub, "stats")) {
        struct sf_cache_stats s;
        st = sf_cache_stats(cache, &s);
        if (st == SF_OK && c.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "cache_dir", sf_cache_dir(cache));
            cJSON_AddNumberToObject(j, "entries", (double)s.entries);
            cJSON_AddNumberToObject(j, "entry_bytes", (double)s.entry_bytes);
            cJSON_AddNumberToObject(j, "downloads", (double)s.downloads);
            cJSON_AddNumberToObject(j, "download_bytes", (double)s.download_bytes);
            cJSON_AddNumberToObject(j, "abandoned_downloads", (double)s.abandoned_downloads);
            cJSON_AddNumberToObject(j, "limit_bytes", (double)s.limit_bytes);
            cli_print_json(j);
        } else if (st == SF_OK) {
            char b1[32], b2[32];
            cli_format_bytes((double)s.entry_bytes, b1, sizeof(b1));
            cli_format_bytes((double)s.download_bytes, b2, sizeof(b2));
            printf("cache_dir: %s\nentries: %llu (%s)\ndownloads in progress or interrupted: %llu "
                   "(%s, %llu abandoned)\n",
                   sf_cache_dir(cache), s.entries, b1, s.downloads, b2, s.abandoned_downloads);
        }
    } else {
        unsigned long long removed = 0;
        st = sf_cache_clear(cache, &removed);
        if (st == SF_OK && c.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "removed", (double)removed);
            cli_print_json(j);
        } else if (st == SF_OK) {
            printf("removed %llu file%s from %s\n", removed, removed == 1 ? "" : "s",
                   sf_cache_dir(cache));
        }
    }
    if (st != SF_OK)
        rc = cli_fail_status(cmd, sf_cache_errmsg(cache, msg, sizeof(msg)), st);
    sf_cache_destroy(cache);
    return rc;
}
