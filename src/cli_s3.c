/* The S3 commands of the command-line tool: ls, stat and get. */
#include "cli.h"

#include "common/file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_OPEN_FETCHES 64

static void format_time(long long t, char *out, size_t n)
{
    if (t <= 0) {
        snprintf(out, n, "-");
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static cJSON *info_json(const struct sf_object_info *in)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "url", in->url);
    cJSON_AddStringToObject(o, "key", in->key);
    if (in->is_prefix) {
        cJSON_AddBoolToObject(o, "prefix", 1);
        return o;
    }
    if (in->size != SF_SIZE_UNKNOWN)
        cJSON_AddNumberToObject(o, "size", (double)in->size);
    if (in->etag[0])
        cJSON_AddStringToObject(o, "etag", in->etag);
    if (in->last_modified > 0) {
        char t[32];
        format_time(in->last_modified, t, sizeof(t));
        cJSON_AddStringToObject(o, "last_modified", t);
    }
    return o;
}

/* A closed stdout (`>&-`) is refused before the client is made: the
 * engine's first socket would take descriptor 1, and what the command
 * prints (an object's bytes, a listing) would go into it, exit status 0. */
static int stdout_is_closed(const char *cmd)
{
    if (!cli_stdout_closed())
        return 0;
    cli_errorf("%s: stdout is closed", cmd);
    return 1;
}

/* ------------------------------------------------------------ ls, stat */

static void print_ls_line(const struct sf_object_info *in)
{
    if (in->is_prefix) {
        printf("%20s %12s  %s\n", "", "PRE", in->key);
    } else {
        char t[32];
        format_time(in->last_modified, t, sizeof(t));
        printf("%20s %12llu  %s\n", t, in->size, in->key);
    }
}

int cli_cmd_ls(struct cli *c)
{
    if (c->n_args != 1) {
        cli_errorf("ls: expected one URL, got %d", c->n_args);
        return EXIT_USAGE;
    }
    if (stdout_is_closed("ls"))
        return 1;
    struct sf_s3 *s3;
    if (cli_open_client(c, &s3))
        return 1;
    struct sf_object_list *l = NULL;
    /* a pattern lists the objects it names, each checked to exist */
    sf_status st = sf_s3_is_pattern(c->args[0])
                       ? sf_s3_expand_stat(s3, c->args[0], 0, &l)
                       : sf_s3_list(s3, c->args[0], c->recursive ? SF_LIST_RECURSIVE : 0, 0, &l);
    if (st != SF_OK) {
        cli_report(s3, st);
        sf_s3_destroy(s3);
        return 1;
    }
    size_t n = sf_object_list_count(l);
    if (c->json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++)
            cJSON_AddItemToArray(arr, info_json(sf_object_list_get(l, i)));
        cli_print_json(arr);
    } else {
        for (size_t i = 0; i < n; i++)
            print_ls_line(sf_object_list_get(l, i));
    }
    sf_object_list_destroy(l);
    sf_s3_destroy(s3);
    return 0;
}

static void print_stat(const struct sf_object_info *in)
{
    char t[32];
    format_time(in->last_modified, t, sizeof(t));
    printf("url:           %s\n", in->url);
    if (in->size == SF_SIZE_UNKNOWN)
        printf("size:          unknown\n");
    else
        printf("size:          %llu\n", in->size);
    printf("etag:          %s\n", in->etag[0] ? in->etag : "-");
    printf("last-modified: %s\n", t);
}

/* The start of a command that takes one or more URLs: the client. Returns
 * 0, or the exit status after printing why not. */
static int open_for_urls(struct cli *c, const char *cmd, int prints, struct sf_s3 **s3)
{
    if (c->n_args < 1) {
        cli_errorf("%s: expected at least one URL", cmd);
        return EXIT_USAGE;
    }
    if (prints && stdout_is_closed(cmd))
        return 1;
    return cli_open_client(c, s3);
}

/* Every URL in turn (a pattern: each object it names); what could not be
 * read is reported and makes the exit status 1, the rest is printed. */
int cli_cmd_stat(struct cli *c)
{
    struct sf_s3 *s3;
    int rc = open_for_urls(c, "stat", 1, &s3);
    if (rc)
        return rc;
    /* --json: one object for one plain URL (as it always was), else an array */
    int single = c->n_args == 1 && !sf_s3_is_pattern(c->args[0]);
    cJSON *arr = c->json && !single ? cJSON_CreateArray() : NULL;
    int printed = 0;
    for (int a = 0; a < c->n_args; a++) {
        const char *url = c->args[a];
        struct sf_object_list *l = NULL;
        struct sf_object_info one;
        memset(&one, 0, sizeof(one));
        sf_status st =
            sf_s3_is_pattern(url) ? sf_s3_expand_stat(s3, url, 0, &l) : sf_s3_stat(s3, url, &one);
        if (st != SF_OK) {
            cli_report(s3, st);
            rc = 1;
            continue;
        }
        size_t n = l ? sf_object_list_count(l) : 1;
        for (size_t i = 0; i < n; i++) {
            const struct sf_object_info *in = l ? sf_object_list_get(l, i) : &one;
            if (arr) {
                cJSON_AddItemToArray(arr, info_json(in));
            } else if (c->json) {
                cli_print_json(info_json(in));
            } else {
                if (printed++)
                    putchar('\n');
                print_stat(in);
            }
        }
        sf_object_list_destroy(l);
        sf_object_info_clear(&one);
    }
    if (arr)
        cli_print_json(arr);
    sf_s3_destroy(s3);
    return rc;
}

/* ------------------------------------------------------------ get */

struct job {
    const struct sf_object_info *in;
    char *dest; /* final path, NULL for stdout */
    char *tmp;  /* temporary path, renamed into place on success */
    int fd;
    struct sf_fetch *f;
    double t0, t1;
    unsigned long long bytes;
    sf_status st;
    char etag[128];
    volatile sig_atomic_t tmp_live; /* tmp may exist: the signal handler removes it */
};

/* ------------------------------------------------------------ interrupted get */

/* What an interrupted `get` (SIGINT, SIGTERM, SIGHUP) must undo before it
 * dies: the temporary files of the downloads in flight, and the ranges
 * written in place into a regular file on stdout (cut back to where the
 * download began). Set before the handlers are installed, read only by them. */
static struct job *sig_jobs;
static size_t sig_n_jobs;
static off_t sig_stdout_keep;
static int sig_stdout_fd = -1; /* the file on stdout, for the handler's ftruncate */
static int sig_null_fd = -1;   /* /dev/null read-only, put on descriptor 1 first */
static volatile sig_atomic_t sig_cut_stdout;

/* Async-signal-safe: unlink and ftruncate only, then the signal's default
 * action (SA_RESETHAND restored it), so the exit status still says how the
 * program ended. */
static void on_cleanup_signal(int sig)
{
    for (size_t i = 0; i < sig_n_jobs; i++)
        if (sig_jobs[i].tmp_live)
            unlink(sig_jobs[i].tmp);
    if (sig_cut_stdout) {
        /* The I/O threads go on writing until the process dies: descriptor
         * 1 becomes read-only /dev/null first, so no write lands after the
         * cut, then the file is cut through its own descriptor. */
        if (sig_null_fd >= 0 && sig_stdout_fd >= 0)
            dup2(sig_null_fd, STDOUT_FILENO);
        if (ftruncate(sig_stdout_fd >= 0 ? sig_stdout_fd : STDOUT_FILENO, sig_stdout_keep) != 0) {
            /* nothing more can be done from here */
        }
    }
    raise(sig);
}

/* A signal now cuts the regular file on stdout back to keep bytes. */
static void arm_stdout_cut(off_t keep)
{
    sig_stdout_keep = keep;
    sig_stdout_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    sig_null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    sig_cut_stdout = 1;
}

static void disarm_stdout_cut(void)
{
    sig_cut_stdout = 0;
    if (sig_stdout_fd >= 0)
        close(sig_stdout_fd);
    if (sig_null_fd >= 0)
        close(sig_null_fd);
    sig_stdout_fd = sig_null_fd = -1;
}

static void set_cleanup_handlers(struct job *jobs, size_t n_jobs, struct sigaction *old)
{
    sig_jobs = jobs;
    sig_n_jobs = n_jobs;
    cli_catch_stop_signals(on_cleanup_signal, old);
}

static void restore_signal_handlers(const struct sigaction *old)
{
    cli_restore_stop_signals(old);
    disarm_stdout_cut();
    sig_n_jobs = 0;
    sig_jobs = NULL;
}

static const char *base_name(const char *key)
{
    const char *s = strrchr(key, '/');
    return s ? s + 1 : key;
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int job_open(struct job *j)
{
    /* FILE.sfpart-PID, beside FILE so that the rename stays on one file
     * system. A name near NAME_MAX leaves no room for the suffix (a valid
     * 250-byte name failed with ENAMETOOLONG): it is cut to fit, and a
     * number keeps two cut names of this process apart. */
    static unsigned cut_names;
    const char *base = base_name(j->dest);
    char suffix[64];
    snprintf(suffix, sizeof(suffix), ".sfpart-%ld", (long)getpid());
    size_t keep = strlen(base);
    if (keep + strlen(suffix) > NAME_MAX) {
        snprintf(suffix, sizeof(suffix), ".sfpart-%ld-%u", (long)getpid(), cut_names++);
        keep = NAME_MAX - strlen(suffix);
    }
    size_t dir_len = (size_t)(base - j->dest);
    size_t n = dir_len + keep + strlen(suffix) + 1;
    j->tmp = malloc(n);
    if (!j->tmp)
        return -1;
    snprintf(j->tmp, n, "%.*s%.*s%s", (int)dir_len, j->dest, (int)keep, base, suffix);
    /* live before open: a signal that arrives as open returns is handled
     * before the next statement would run */
    j->tmp_live = 1;
    j->fd = open(j->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (j->fd < 0) {
        j->tmp_live = 0;
        /* the user's name, with the temporary one only as where it failed */
        cli_errorf("%s: cannot create (writing %s): %s", j->dest, j->tmp, strerror(errno));
        return -1;
    }
    if (j->in->size != SF_SIZE_UNKNOWN && sf__preallocate(j->fd, j->in->size) != 0) {
        cli_errorf("%s: no space for %llu bytes (writing %s)", j->dest,
                   (unsigned long long)j->in->size, j->tmp);
        return -1;
    }
    return 0;
}

static int job_start(struct sf_s3 *s3, struct job *j)
{
    if (job_open(j))
        return -1;
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.fd = j->fd;
    fo.size = j->in->size;
    if (j->in->etag[0])
        fo.etag = j->in->etag;
    j->t0 = sf__now_s();
    sf_status st = sf_fetch_start(s3, j->in->url, &fo, &j->f);
    if (st != SF_OK) {
        j->st = st;
        cli_report(s3, st);
        return -1;
    }
    return 0;
}

static int job_finish(struct job *j)
{
    struct sf_fetch_progress p;
    j->st = sf_fetch_wait(j->f, ~0ull, -1, &p);
    j->t1 = sf__now_s();
    j->bytes = p.total == SF_SIZE_UNKNOWN ? 0 : p.total;
    snprintf(j->etag, sizeof(j->etag), "%s", sf_fetch_etag(j->f));
    int rc = 0;
    if (j->st != SF_OK) {
        cli_errorf("%s (%s)", sf_fetch_errmsg(j->f), sf_status_name(j->st));
        rc = -1;
    } else if (ftruncate(j->fd, (off_t)j->bytes) != 0 || close(j->fd) != 0) {
        cli_errorf("%s: %s", j->tmp, strerror(errno));
        j->fd = -1;
        j->st = SF_ERR_IO;
        rc = -1;
    } else {
        j->fd = -1;
        int renamed = rename(j->tmp, j->dest) == 0;
        if (renamed)
            j->tmp_live = 0;
        if (!renamed) {
            cli_errorf("%s: cannot rename into place: %s", j->dest, strerror(errno));
            j->st = SF_ERR_IO;
            rc = -1;
        }
    }
    if (j->fd >= 0)
        close(j->fd);
    j->fd = -1;
    if (rc != 0 && j->tmp) {
        unlink(j->tmp);
        j->tmp_live = 0;
    }
    sf_fetch_destroy(j->f);
    j->f = NULL;
    return rc;
}

/* stdout that is not a regular file: windows of concurrency x chunk bytes,
 * the next window downloading while the previous one is written. Every
 * window after the first carries the first one's ETag as If-Match. */
static int start_window(struct sf_s3 *s3, const char *url, unsigned char *buf,
                        unsigned long long window, unsigned long long off, unsigned long long size,
                        const char *etag, struct sf_fetch **f)
{
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.buffer = buf;
    fo.buffer_bytes = window;
    fo.offset = off;
    fo.length = window;
    fo.size = size;
    fo.etag = etag && etag[0] ? etag : NULL;
    sf_status st = sf_fetch_start(s3, url, &fo, f);
    if (st != SF_OK)
        cli_report(s3, st);
    return st == SF_OK ? 0 : -1;
}

/* A write to descriptor 1 failed: a device given with -o is named. */
static void write_failed(const char *device, int err)
{
    if (device && err != EPIPE)
        cli_errorf("%s: %s", device, strerror(err));
    else
        cli_stdout_failed(err);
}

/* device: the path given with -o that descriptor 1 holds, else NULL. */
static int get_to_pipe(struct sf_s3 *s3, struct cli *c, const struct sf_object_info *in,
                       const char *device, unsigned long long *bytes_out)
{
    unsigned long long window = (unsigned long long)c->s3o.concurrency * c->s3o.chunk_bytes;
    if (window > (1ull << 30))
        window = 1ull << 30;
    unsigned char *buf[2] = {malloc(window), malloc(window)};
    struct sf_fetch *f[2] = {NULL, NULL};
    unsigned long long size = in->size, off = 0;
    char etag[128];
    snprintf(etag, sizeof(etag), "%s", in->etag);
    int rc = 0, cur = 0;
    if (!buf[0] || !buf[1]) {
        cli_errorf("cannot allocate the %llu-byte stream window", window);
        rc = -1;
    } else {
        rc = start_window(s3, in->url, buf[0], window, 0, size, etag, &f[0]);
    }
    while (rc == 0) {
        struct sf_fetch_progress p;
        sf_status st = sf_fetch_wait(f[cur], ~0ull, -1, &p);
        if (st != SF_OK) {
            cli_errorf("%s (%s)", sf_fetch_errmsg(f[cur]), sf_status_name(st));
            rc = -1;
            break;
        }
        if (off == 0) {
            size = p.object_size;
            snprintf(etag, sizeof(etag), "%s", sf_fetch_etag(f[cur]));
        }
        unsigned long long next_off = off + p.total;
        int more = p.total > 0 && next_off < size;
        if (more &&
            start_window(s3, in->url, buf[cur ^ 1], window, next_off, size, etag, &f[cur ^ 1]) != 0)
            rc = -1;
        if (p.total && fwrite(buf[cur], 1, p.total, stdout) != p.total) {
            write_failed(device, errno);
            rc = -1;
        }
        sf_fetch_destroy(f[cur]);
        f[cur] = NULL;
        off = next_off;
        if (!more)
            break;
        cur ^= 1;
    }
    sf_fetch_destroy(f[0]);
    sf_fetch_destroy(f[1]);
    free(buf[0]);
    free(buf[1]);
    if (fflush(stdout) != 0 && rc == 0) {
        write_failed(device, errno);
        rc = -1;
    }
    *bytes_out = off;
    return rc;
}

int cli_cmd_get(struct cli *c)
{
    struct sf_s3 *s3;
    /* stdout carries the object (no -o, -o -, or a device or FIFO put on
     * descriptor 1 below) or the --json report */
    struct stat dsb;
    int prints = c->json || !c->output || !strcmp(c->output, "-") ||
                 (stat(c->output, &dsb) == 0 && !S_ISREG(dsb.st_mode) && !S_ISDIR(dsb.st_mode));
    int rc = open_for_urls(c, "get", prints, &s3);
    if (rc)
        return rc;
    double t0 = sf__now_s();
    size_t n_lists = (size_t)c->n_args;
    struct sf_object_list **lists = calloc(n_lists, sizeof(*lists));
    size_t total_objects = 0;
    for (size_t i = 0; lists && i < n_lists; i++) {
        sf_status st = sf_s3_expand(s3, c->args[i], 0, &lists[i]);
        if (st != SF_OK) {
            cli_report(s3, st);
            rc = 1;
            break;
        }
        total_objects += sf_object_list_count(lists[i]);
    }
    struct job *jobs = NULL;
    const char *out = c->output;
    int to_stdout = !out || !strcmp(out, "-");
    int object_on_stdout = to_stdout; /* stdout itself, not a device put on descriptor 1 */
    int saved_stdout = -1;            /* stdout while a device is on descriptor 1 */
    int to_dir = 0;
    if (rc == 0) {
        size_t ol = out ? strlen(out) : 0;
        to_dir = !to_stdout && (total_objects > 1 || out[ol - 1] == '/' || is_dir(out));
        struct stat osb;
        if (!to_stdout && !to_dir && stat(out, &osb) == 0 && !S_ISREG(osb.st_mode) &&
            total_objects == 1) {
            /* A device or FIFO (/dev/null, a named pipe) is written in place,
             * as stdout is: never replaced by a renamed temporary file. */
            int fd = open(out, O_WRONLY | O_CLOEXEC);
            /* stdout is put back for the --json report (cli_finish_stdout
             * then checks stdout, not the device) */
            saved_stdout = fd < 0 ? -1 : fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
            if (fd < 0 || saved_stdout < 0 || dup2(fd, STDOUT_FILENO) < 0) {
                cli_errorf("%s: cannot open for writing: %s", out, strerror(errno));
                rc = 1;
            }
            if (fd > STDOUT_FILENO)
                close(fd);
            to_stdout = 1;
        }
        if (total_objects > 1 && to_stdout) {
            cli_errorf("get: %zu objects: name a directory with -o DIR", total_objects);
            rc = EXIT_USAGE;
        } else if (to_dir && mkdir(out, 0755) != 0 && errno != EEXIST) {
            cli_errorf("%s: cannot create directory: %s", out, strerror(errno));
            rc = 1;
        }
    }
    if (rc == 0)
        jobs = calloc(total_objects ? total_objects : 1, sizeof(*jobs));
    size_t n_jobs = 0;
    for (size_t i = 0; rc == 0 && jobs && i < n_lists; i++) {
        for (size_t k = 0; k < sf_object_list_count(lists[i]); k++) {
            struct job *j = &jobs[n_jobs++];
            j->in = sf_object_list_get(lists[i], k);
            j->fd = -1;
            if (to_stdout)
                continue;
            if (to_dir) {
                const char *b = base_name(j->in->key);
                size_t len = strlen(out) + strlen(b) + 2;
                j->dest = malloc(len);
                if (j->dest)
                    snprintf(j->dest, len, "%s%s%s", out, out[strlen(out) - 1] == '/' ? "" : "/",
                             b);
                if (!*b) {
                    cli_errorf("%s: no file name in the key", j->in->url);
                    rc = 1;
                }
            } else {
                j->dest = strdup(out);
            }
        }
    }
    /* two objects must not land on the same file */
    for (size_t i = 0; rc == 0 && to_dir && i < n_jobs; i++)
        for (size_t k = i + 1; k < n_jobs; k++)
            if (jobs[i].dest && jobs[k].dest && !strcmp(jobs[i].dest, jobs[k].dest)) {
                cli_errorf("get: %s and %s would both be written to %s", jobs[i].in->url,
                           jobs[k].in->url, jobs[i].dest);
                rc = 1;
                break;
            }
    unsigned long long bytes = 0;
    size_t failed = 0;
    struct sigaction old_sa[CLI_STOP_SIGNALS];
    int handlers_set = rc == 0;
    if (handlers_set)
        set_cleanup_handlers(jobs, n_jobs, old_sa);
    if (rc == 0 && to_stdout && n_jobs == 1) {
        struct stat sb;
        int is_reg = fstat(STDOUT_FILENO, &sb) == 0 && S_ISREG(sb.st_mode);
        /* `>> FILE`: every write lands at the end whatever its offset, so
         * ranges written in place would be appended in arrival order */
        int appends = is_reg && (fcntl(STDOUT_FILENO, F_GETFL) & O_APPEND);
        if (is_reg && !appends) {
            struct sf_fetch_options fo;
            sf_fetch_options_init_default(&fo);
            fo.fd = STDOUT_FILENO;
            off_t pos = lseek(STDOUT_FILENO, 0, SEEK_CUR);
            fo.file_offset = pos > 0 ? (unsigned long long)pos : 0;
            /* what a failure below, or a signal, cuts the file back to */
            off_t keep = sb.st_size > (off_t)fo.file_offset ? sb.st_size : (off_t)fo.file_offset;
            arm_stdout_cut(keep);
            struct sf_fetch *f;
            sf_status st = sf_fetch_start(s3, jobs[0].in->url, &fo, &f);
            if (st != SF_OK) {
                cli_report(s3, st);
                rc = 1;
            } else {
                struct sf_fetch_progress p;
                st = sf_fetch_wait(f, ~0ull, -1, &p);
                if (st == SF_OK)
                    disarm_stdout_cut(); /* complete: a signal now keeps it */
                if (st != SF_OK) {
                    cli_errorf("%s (%s)", sf_fetch_errmsg(f), sf_status_name(st));
                    rc = 1;
                } else {
                    bytes = p.total;
                    lseek(STDOUT_FILENO, (off_t)(fo.file_offset + bytes), SEEK_SET);
                }
                sf_fetch_destroy(f);
            }
            if (rc != 0) {
                /* Ranges land in place, in any order: a failed download leaves
                 * holes up to the declared size, a file that looks complete.
                 * Cut it back to where it started (empty for `> file`); bytes
                 * it had past that point were there before us and stay. */
                if (ftruncate(STDOUT_FILENO, keep) != 0)
                    cli_errorf("stdout: the partial download could not be cut off: %s",
                               strerror(errno));
                lseek(STDOUT_FILENO, (off_t)fo.file_offset, SEEK_SET);
            }
        } else {
            /* in order, as to a pipe; a file appended to is cut back to the
             * length it had on a failure or a signal, as above */
            if (appends)
                arm_stdout_cut(sb.st_size);
            if (get_to_pipe(s3, c, jobs[0].in, saved_stdout >= 0 ? out : NULL, &bytes) != 0) {
                rc = 1;
                if (appends && ftruncate(STDOUT_FILENO, sb.st_size) != 0)
                    cli_errorf("stdout: the partial download could not be cut off: %s",
                               strerror(errno));
            }
            disarm_stdout_cut();
        }
        failed = rc != 0;
    } else if (rc == 0) {
        /* a window of open fetches; the engine runs them oldest first */
        size_t next = 0, done = 0;
        while (done < n_jobs) {
            while (next < n_jobs && next - done < MAX_OPEN_FETCHES) {
                if (job_start(s3, &jobs[next]) != 0) {
                    if (jobs[next].fd >= 0) {
                        close(jobs[next].fd);
                        jobs[next].fd = -1;
                    }
                    if (jobs[next].tmp_live) {
                        unlink(jobs[next].tmp);
                        jobs[next].tmp_live = 0;
                    }
                    if (jobs[next].st == SF_OK)
                        jobs[next].st = SF_ERR_IO;
                }
                next++;
            }
            struct job *j = &jobs[done++];
            if (!j->f || job_finish(j) != 0)
                failed++;
            else
                bytes += j->bytes;
        }
        rc = failed ? 1 : 0;
    }
    if (handlers_set)
        restore_signal_handlers(old_sa);
    if (saved_stdout >= 0) {
        /* what failed on the device was reported; the report goes to stdout */
        fflush(stdout);
        clearerr(stdout);
        dup2(saved_stdout, STDOUT_FILENO);
        close(saved_stdout);
    }
    double secs = sf__now_s() - t0;
    if (c->json && rc != EXIT_USAGE) {
        struct sf_s3_stats ss;
        sf_s3_get_stats(s3, &ss);
        cJSON *o = cJSON_CreateObject();
        cJSON *arr = cJSON_AddArrayToObject(o, "objects");
        for (size_t i = 0; i < n_jobs && !to_stdout; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "url", jobs[i].in->url);
            cJSON_AddStringToObject(x, "path", jobs[i].dest ? jobs[i].dest : "-");
            cJSON_AddNumberToObject(x, "bytes", (double)jobs[i].bytes);
            cJSON_AddStringToObject(x, "etag", jobs[i].etag);
            cJSON_AddStringToObject(x, "status", sf_status_name(jobs[i].st));
            cJSON_AddItemToArray(arr, x);
        }
        cJSON_AddNumberToObject(o, "objects_failed", (double)failed);
        cJSON_AddNumberToObject(o, "bytes", (double)bytes);
        cJSON_AddNumberToObject(o, "seconds", secs);
        cJSON_AddNumberToObject(o, "mib_per_s", secs > 0 ? (double)bytes / 1048576.0 / secs : 0);
        cJSON_AddNumberToObject(o, "requests", (double)ss.requests);
        cJSON_AddNumberToObject(o, "retries", (double)ss.retries);
        cJSON_AddNumberToObject(o, "throttled", (double)ss.throttled);
        cJSON_AddNumberToObject(o, "connections", (double)ss.connections);
        if (rc == 0 && object_on_stdout) {
            /* stdout holds the object and nothing else (`get --json URL > k`);
             * a failure is still the one JSON object on stdout */
            char *text = cJSON_PrintUnformatted(o);
            if (text)
                fprintf(stderr, "%s\n", text);
            free(text);
            cJSON_Delete(o);
        } else {
            cli_print_json(o);
        }
    }
    for (size_t i = 0; jobs && i < n_jobs; i++) {
        free(jobs[i].dest);
        free(jobs[i].tmp);
    }
    free(jobs);
    for (size_t i = 0; lists && i < n_lists; i++)
        sf_object_list_destroy(lists[i]);
    free(lists);
    sf_s3_destroy(s3);
    return rc;
}
