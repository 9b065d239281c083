/*
 * The fetch engine: io_threads workers, each a thread with its own curl multi
 * handle, connection pool, idle easy handles and stage buffers; one scheduler
 * shared by all of them (docs/transport.md, "Several I/O threads").
 *
 * Locks, always taken in this order:
 *  - e->sched: the scheduler. Everything marked "under sched" below: the
 *    active fetches and their ranges' states, the waiting retries, in-flight
 *    counts, the window, rate limiter and retry quota, the layout of a fetch
 *    (n_ranges, rest, size, etag_expected). A worker holds it while it takes
 *    new work, handles finished transfers (attempt_done and the policy it
 *    calls) and starts attempts on its own multi handle; never while curl
 *    moves bytes (curl_multi_perform, curl_multi_poll).
 *  - e->lock: the hand-over lists (incoming, cancel, priority), shutdown and
 *    the stats.
 *  - f->data_lock: one on_data call at a time per fetch (ranges of a fetch
 *    run on several threads; the cache hashes blocks that straddle ranges).
 *  - f->lock: what sf_fetch_wait() sees, the ranges' `got` counts and the
 *    contiguous frontier computed from them (contig_idx).
 * A running range belongs to the worker whose multi handle holds it (x->w):
 * only that thread touches its curl handle, stage buffer and attempt fields,
 * and writes its bytes straight into the destination without sched. When a
 * fetch ends on one worker while some of its ranges run on others, those are
 * handed to their owners (w->doomed) and the fetch is reported done only when
 * the last one is out of its multi handle: nothing writes into a destination
 * once sf_fetch_wait() said done.
 */
#include "s3/fetch.h"
#include "s3/fetch_policy.h"
#include "common/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define MAX_ERROR_BODY     (64u * 1024)
#define EASY_BUFFER_SIZE   (512L * 1024)
/* File destinations: a range gathers what curl hands over (at most 16 KiB a
 * callback) and writes it with one pwrite() per STAGE_BYTES. 256 KiB rather
 * than 1 MiB: the buffer stays in L2 for the write and the checksum that
 * follows, and the page cache takes smaller folios, which a busy or
 * virtualized host supplies more cheaply (docs/transport.md). */
#define STAGE_BYTES (256u * 1024)

enum xfer_state { X_IDLE = 0, X_WAITING, X_RUNNING, X_DONE };
enum abort_reason {
    AB_NONE = 0,
    AB_STALL,
    AB_BAD_RESPONSE,
    AB_OVERFLOW,
    AB_IO,
    AB_LIMIT,
    AB_CHANGED,
    AB_SILENT /* request_timeout_ms without a byte: not retried */
};

struct call;

/* One logical request: a range of a fetch, or a call. Its state, due time
 * and attempt count are under sched; while an attempt runs, the attempt
 * fields belong to the worker x->w; `got` is written by that worker under
 * f->lock (the frontier reads it there). */
struct xfer {
    struct sf__engine *e;
    struct sf_fetch *f;
    struct call *call;
    uint64_t first, last; /* object offsets, inclusive; SF__NO_RANGE for calls */
    uint64_t got;         /* bytes written from `first`, kept across attempts */
    unsigned char *stage; /* file destinations: bytes received, not yet written */
    size_t staged;
    unsigned attempts;
    unsigned tokens_held; /* retry quota taken by this request's retries */
    uint64_t due_ns;
    uint64_t start_ns;     /* when the current attempt started */
    uint64_t quiet_since_ns; /* last byte from the server, or the first attempt's start */
    int answered;            /* the current attempt got a response byte */
    char origin[128];        /* "scheme://host:port" of the current attempt, for messages */
    enum xfer_state state;
    struct xfer *next_wait; /* the waiting list, or the owner's doomed list */
    struct worker *w;       /* the worker whose multi handle runs the attempt */
    int doomed;             /* the fetch ended: the owner takes it out (under sched) */
    /* the attempt in progress */
    CURL *easy;
    struct curl_slist *hdrs;
    char errbuf[CURL_ERROR_SIZE];
    long status;
    int headers_done;
    int ranged;
    char etag[128];
    char request_id[128];
    int have_cr;
    uint64_t cr_first, cr_last, cr_total; /* cr_total SF_SIZE_UNKNOWN for '*' */
    uint64_t content_length;
    int64_t last_modified;
    int64_t server_date;
    struct sf__strbuf errbody;
    enum abort_reason abort;
    char abort_msg[256];
    uint64_t last_progress_ns;
    curl_off_t last_dlnow;
    uint64_t attempt_bytes;
    uint64_t body_pos; /* next request-body byte to send (calls with a body) */
    /* last failure, for the final message */
    char last_msg[512];
};

/* A blocking call (HEAD, listing); lives on the caller's stack. */
struct call {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int finished;
    sf_status status;
    const char *method;
    const char *query;
    const struct sf__locator *loc;
    const struct sf__body *body; /* NULL = none */
    struct sf__response *resp;
    size_t max_body;
    struct xfer x;
    struct call *next_incoming;
};

struct sf_fetch {
    struct sf__engine *e; /* NULL for a fetch that was done at creation */
    struct sf__locator loc;
    /* destination, fixed at start (buf may be set once by the I/O thread) */
    unsigned char *buf;
    uint64_t buf_bytes;
    int owns_buf;
    int fd;
    uint64_t file_offset;
    uint64_t offset;
    uint64_t length;      /* requested, SF_SIZE_UNKNOWN = to the end */
    uint64_t size;        /* object size, SF_SIZE_UNKNOWN until known */
    uint64_t first_bytes; /* size of the first range */
    char etag_expected[128];
    void (*on_data)(void *user, unsigned long long offset, const void *data, size_t len);
    void *on_data_user;

    /* under sched */
    struct xfer head; /* the first range (the probe when the size is unknown) */
    struct xfer *rest;
    size_t n_rest;
    size_t next_start; /* next range index to start: 0 = head, i = rest[i-1] */
    size_t n_ranges;   /* 0 until the total is known */
    size_t n_done;
    size_t contig_idx;
    unsigned running;
    uint64_t total;
    int finished;
    int prio; /* copied from prio_req when the engine's prio_pending is seen */
    struct sf_fetch *next_active;
    struct sf_fetch *next_incoming;
    unsigned n_doomed;         /* ranges still in another worker's multi after the end */
    sf_status fin_status;      /* published when n_doomed reaches 0 */
    pthread_mutex_t data_lock; /* serializes on_data */

    /* under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t s_total, s_size, s_contiguous, s_received;
    /* Waiters in sf_fetch_wait() and the least contiguous count one of them
     * needs: progress below it wakes nobody (0: wake on any progress). */
    unsigned s_waiters;
    uint64_t s_wait_min;
    unsigned s_requests, s_retries;
    int s_done;
    int released; /* the I/O thread will never touch this fetch again */
    sf_status s_status;
    char s_etag[128];
    char errmsg[1024];
    int cancel;   /* under e->lock */
    int prio_req; /* under e->lock */
    uint64_t workers_used; /* under lock: bit i, worker i ran a range (a test hook) */
};

/* One I/O thread. */
struct worker {
    struct sf__engine *e;
    unsigned idx;
    CURLM *multi;
    pthread_t thread;
    int started;
    /* the worker's thread only (or the destroying thread after the join) */
    CURL **idle;
    size_t n_idle;
    unsigned char **stages; /* free STAGE_BYTES buffers */
    size_t n_stages;
    /* under sched */
    unsigned in_flight;
    unsigned long long loops; /* turns of io_main (test hook: an idle engine sleeps) */
    struct xfer *doomed; /* ranges of ended fetches to take out of this multi */
};

struct sf__engine {
    struct sf__engine_config cfg;
    char *ca_bundle;
    struct worker *workers;
    unsigned n_workers;
    unsigned share; /* in-flight cap per worker: ceil(concurrency / n_workers) */
    pthread_mutex_t sched;
    struct worker *cur; /* the worker holding sched; NULL after the join */

    /* under lock */
    pthread_mutex_t lock;
    struct sf_fetch *incoming_fetches;
    struct call *incoming_calls;
    int shutdown;
    int cancel_pending;
    int prio_pending; /* some fetch's prio_req changed */
    struct sf_s3_stats stats;

    /* under sched */
    struct sf_fetch *active;
    struct xfer *waiting;
    unsigned in_flight;
    struct sf__policy policy; /* window, rate cap, retry quota (s3/fetch_policy.c) */
    uint64_t rng;
    int64_t clock_skew_s;
};

/* ------------------------------------------------------------ helpers */

__attribute__((format(printf, 3, 4))) static void
elog(struct sf__engine *e, enum sf_log_level level, const char *fmt, ...)
{
    if (!e->cfg.log || level > e->cfg.log_level)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    e->cfg.log(e->cfg.log_user, level, line);
}

static const char *xfer_name(const struct xfer *x)
{
    return x->f ? x->f->loc.display : x->call->loc->display;
}

static void range_text(const struct xfer *x, char *out, size_t n)
{
    if (x->first == SF__NO_RANGE)
        out[0] = '\0';
    else if (x->last == SF__NO_RANGE)
        snprintf(out, n, " bytes %" PRIu64 "-", x->first);
    else if (x->got)
        snprintf(out, n, " bytes %" PRIu64 "-%" PRIu64 " (at offset %" PRIu64 ")", x->first,
                 x->last, x->first + x->got);
    else
        snprintf(out, n, " bytes %" PRIu64 "-%" PRIu64, x->first, x->last);
}

sf_status sf__classify_http(long status, const char *code, int *retry)
{
    *retry = 0;
    if (code && *code) {
        if (!strcmp(code, "SlowDown") || !strcmp(code, "Throttling") ||
            !strcmp(code, "ThrottlingException") || !strcmp(code, "RequestLimitExceeded")) {
            *retry = 2;
            return SF_ERR_THROTTLED;
        }
        if (!strcmp(code, "InternalError") || !strcmp(code, "ServiceUnavailable")) {
            *retry = 1;
            return SF_ERR_HTTP;
        }
        if (!strcmp(code, "RequestTimeout")) {
            *retry = 1;
            return SF_ERR_TIMEOUT;
        }
        if (!strcmp(code, "RequestTimeTooSkewed") || !strcmp(code, "ExpiredToken")) {
            *retry = 1;
            return SF_ERR_ACCESS_DENIED;
        }
        if (!strcmp(code, "SignatureDoesNotMatch"))
            return SF_ERR_SIGNATURE;
        if (!strcmp(code, "NoSuchKey") || !strcmp(code, "NoSuchBucket"))
            return SF_ERR_NOT_FOUND;
        if (!strcmp(code, "PreconditionFailed"))
            return SF_ERR_CHANGED;
        if (!strcmp(code, "InvalidRange"))
            return SF_ERR_RANGE;
    }
    switch (status) {
    case 429: *retry = 2; return SF_ERR_THROTTLED;
    case 503: *retry = 2; return SF_ERR_THROTTLED;
    case 500:
    case 502:
    case 504: *retry = 1; return SF_ERR_HTTP;
    case 401:
    case 403: return SF_ERR_ACCESS_DENIED;
    case 404: return SF_ERR_NOT_FOUND;
    case 412: return SF_ERR_CHANGED;
    case 416: return SF_ERR_RANGE;
    case 400: return SF_ERR_INVALID_ARGUMENT;
    default: return SF_ERR_HTTP;
    }
}

/* ------------------------------------------------------------ fetch state */

static uint64_t xfer_len(const struct xfer *x)
{
    return x->last - x->first + 1;
}

static struct xfer *range_at(struct sf_fetch *f, size_t i)
{
    return i == 0 ? &f->head : &f->rest[i - 1];
}

/* Moves the frontier over the completed ranges; f->lock held. */
static void publish_locked(struct sf_fetch *f)
{
    while (f->contig_idx < f->n_ranges) {
        struct xfer *x = range_at(f, f->contig_idx);
        if (x->got < xfer_len(x))
            break;
        f->contig_idx++;
    }
    uint64_t contiguous = f->total;
    if (f->contig_idx < f->n_ranges) {
        struct xfer *x = range_at(f, f->contig_idx);
        contiguous = x->first - f->offset + x->got;
    } else if (f->n_ranges == 0) {
        contiguous = f->head.got;
    }
    int changed = contiguous != f->s_contiguous;
    f->s_contiguous = contiguous;
    /* A reader waiting for the next sample is woken once, not for every
     * 16 KiB callback of curl. */
    if (changed && f->s_waiters && contiguous >= f->s_wait_min)
        pthread_cond_broadcast(&f->cond);
}

static void publish_progress(struct sf_fetch *f)
{
    pthread_mutex_lock(&f->lock);
    publish_locked(f);
    pthread_mutex_unlock(&f->lock);
}

/* The total is known: size the destination and lay out the ranges. */
static sf_status fetch_layout(struct sf__engine *e, struct sf_fetch *f, uint64_t size, char *msg,
                              size_t msg_len)
{
    f->size = size;
    if (f->offset > size || (f->offset == size && size > 0 && f->length != 0)) {
        snprintf(msg, msg_len, "%s: offset %" PRIu64 " is past the end (%" PRIu64 " bytes)",
                 f->loc.display, f->offset, size);
        return SF_ERR_RANGE;
    }
    uint64_t total = size - f->offset;
    if (f->length != SF_SIZE_UNKNOWN && f->length < total)
        total = f->length;
    f->total = total;
    if (f->fd < 0) {
        if (f->buf && total > f->buf_bytes) {
            snprintf(msg, msg_len,
                     "%s: %" PRIu64 " bytes do not fit the %" PRIu64 "-byte destination buffer",
                     f->loc.display, total, f->buf_bytes);
            return SF_ERR_LIMIT;
        }
        if (!f->buf) {
            if (total > e->cfg.max_object_bytes) {
                snprintf(msg, msg_len,
                         "%s: %" PRIu64 " bytes exceed max_object_bytes (%" PRIu64 ")",
                         f->loc.display, total, e->cfg.max_object_bytes);
                return SF_ERR_LIMIT;
            }
            f->buf = malloc(total ? total : 1);
            if (!f->buf) {
                snprintf(msg, msg_len, "%s: cannot allocate %" PRIu64 " bytes", f->loc.display,
                         total);
                return SF_ERR_NO_MEMORY;
            }
            f->owns_buf = 1;
            f->buf_bytes = total;
        }
    }
    /*
     * The head is small (first bytes first); the next range ends at the first
     * multiple of chunk_bytes in object offsets and the others follow on
     * those multiples, so a cache's 4 MiB checksum blocks each fall in one
     * range when chunk_bytes is a multiple of 4 MiB (hashed as they arrive).
     */
    uint64_t chunk = e->cfg.chunk_bytes;
    uint64_t end = f->offset + total;
    uint64_t head_end = f->offset + (total < f->first_bytes ? total : f->first_bytes);
    size_t n = 0;
    if (total > 0) {
        n = 1;
        if (head_end < end) {
            uint64_t next = (head_end / chunk + 1) * chunk; /* first boundary after head_end */
            n += 1;
            if (next < end)
                n += (size_t)((end - next + chunk - 1) / chunk);
        }
    }
    if (n > 1) {
        f->rest = calloc(n - 1, sizeof(*f->rest));
        if (!f->rest) {
            snprintf(msg, msg_len, "%s: cannot allocate %zu ranges", f->loc.display, n);
            return SF_ERR_NO_MEMORY;
        }
        f->n_rest = n - 1;
    }
    /* the head keeps whatever bytes it already has */
    if (total > 0) {
        f->head.first = f->offset;
        f->head.last = head_end - 1;
    }
    uint64_t at = head_end;
    for (size_t i = 1; i < n; i++) {
        struct xfer *x = &f->rest[i - 1];
        uint64_t stop = (at / chunk + 1) * chunk;
        x->f = f;
        x->first = at;
        x->last = (stop < end ? stop : end) - 1;
        at = x->last + 1;
    }
    f->n_ranges = n;
    pthread_mutex_lock(&f->lock);
    f->s_total = total;
    f->s_size = size;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    return SF_OK;
}

/* ------------------------------------------------------------ curl callbacks */

static int parse_u64(const char *s, const char **end, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *end = p;
    *out = v;
    return 0;
}

/* "bytes 0-99/1234" or "bytes 0-99/ *" */
static int parse_content_range(const char *v, struct xfer *x)
{
    const char *p = v;
    if (strncasecmp(p, "bytes ", 6) != 0)
        return -1;
    p += 6;
    if (parse_u64(p, &p, &x->cr_first) || *p++ != '-' || parse_u64(p, &p, &x->cr_last) ||
        *p++ != '/')
        return -1;
    if (*p == '*') {
        x->cr_total = SF_SIZE_UNKNOWN;
        p++;
    } else if (parse_u64(p, &p, &x->cr_total)) {
        return -1;
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p || x->cr_last < x->cr_first ||
        (x->cr_total != SF_SIZE_UNKNOWN && x->cr_last >= x->cr_total))
        return -1;
    return 0;
}

static void copy_trimmed(char *dst, size_t dst_len, const char *v, size_t n)
{
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    while (n > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    if (n >= dst_len)
        n = dst_len - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

static void set_abort(struct xfer *x, enum abort_reason r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_abort(struct xfer *x, enum abort_reason r, const char *fmt, ...)
{
    x->abort = r;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->abort_msg, sizeof(x->abort_msg), fmt, ap);
    va_end(ap);
}

static void headers_check_fetch(struct xfer *x, struct sf_fetch *f);

/* All headers of the response are in: validate before any body byte lands. */
static void headers_complete(struct xfer *x)
{
    x->headers_done = 1;
    struct sf_fetch *f = x->f;
    if (!f || x->status < 200 || x->status >= 300)
        return;
    if (x->status != 206) {
        set_abort(x, AB_BAD_RESPONSE, "HTTP %ld instead of 206 for a ranged GET", x->status);
        return;
    }
    if (!x->have_cr) {
        set_abort(x, AB_BAD_RESPONSE, "206 without a valid Content-Range");
        return;
    }
    uint64_t want_first = x->first + x->got;
    if (x->cr_first != want_first) {
        set_abort(x, AB_BAD_RESPONSE, "Content-Range starts at %" PRIu64 ", requested %" PRIu64,
                  x->cr_first, want_first);
        return;
    }
    /* The ETag, size and layout of the fetch are shared with the ranges on
     * other workers: checked and set under sched, once per response. */
    pthread_mutex_lock(&x->e->sched);
    headers_check_fetch(x, f);
    pthread_mutex_unlock(&x->e->sched);
}

static void headers_check_fetch(struct xfer *x, struct sf_fetch *f)
{
    if (f->finished) {
        /* ended on another worker: stop here, the owner takes it out */
        set_abort(x, AB_IO, "the fetch has ended");
        return;
    }
    if (f->etag_expected[0] && x->etag[0] && strcmp(x->etag, f->etag_expected) != 0) {
        set_abort(x, AB_CHANGED, "ETag %s differs from %s seen before", x->etag, f->etag_expected);
        return;
    }
    if (!f->etag_expected[0] && x->etag[0]) {
        snprintf(f->etag_expected, sizeof(f->etag_expected), "%s", x->etag);
        pthread_mutex_lock(&f->lock);
        snprintf(f->s_etag, sizeof(f->s_etag), "%s", x->etag);
        pthread_mutex_unlock(&f->lock);
    }
    if (f->n_ranges == 0 && x == &f->head) {
        if (x->cr_total == SF_SIZE_UNKNOWN) {
            set_abort(x, AB_BAD_RESPONSE, "Content-Range without the object size");
            return;
        }
        char msg[512];
        sf_status st = fetch_layout(f->e, f, x->cr_total, msg, sizeof(msg));
        if (st != SF_OK) {
            set_abort(x, st == SF_ERR_RANGE ? AB_CHANGED : AB_LIMIT, "%s", msg);
            return;
        }
    } else if (x->cr_total != SF_SIZE_UNKNOWN && f->size != SF_SIZE_UNKNOWN &&
               x->cr_total != f->size) {
        set_abort(x, AB_CHANGED, "object size is now %" PRIu64 ", was %" PRIu64, x->cr_total,
                  f->size);
        return;
    }
    if (x->cr_last != x->last) {
        set_abort(x, AB_BAD_RESPONSE, "Content-Range ends at %" PRIu64 ", requested %" PRIu64,
                  x->cr_last, x->last);
    }
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nitems;
    x->answered = 1;
    x->last_progress_ns = x->quiet_since_ns = sf__now_ns();
    if (n >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
        /* a new response (after a 100 Continue or a redirect): start over */
        const char *sp = memchr(buf, ' ', n);
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->have_cr = 0;
        x->etag[0] = '\0';
        x->headers_done = 0;
        x->content_length = SF_SIZE_UNKNOWN;
        return n;
    }
    if (n <= 2 && (buf[0] == '\r' || buf[0] == '\n')) {
        if (x->status >= 300 && x->status < 400)
            return n; /* redirect: the next response follows */
        headers_complete(x);
        return x->abort != AB_NONE ? 0 : n;
    }
    const char *colon = memchr(buf, ':', n);
    if (!colon)
        return n;
    size_t name_len = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vn = n - name_len - 1;
    char val[512];
    copy_trimmed(val, sizeof(val), v, vn);
#define IS(h) (name_len == sizeof(h) - 1 && strncasecmp(buf, h, name_len) == 0)
    if (IS("etag")) {
        copy_trimmed(x->etag, sizeof(x->etag), v, vn);
    } else if (IS("content-range")) {
        x->have_cr = parse_content_range(val, x) == 0;
    } else if (IS("content-length")) {
        const char *end;
        uint64_t cl;
        if (parse_u64(val, &end, &cl) == 0 && *end == '\0')
            x->content_length = cl;
    } else if (IS("last-modified")) {
        time_t t = curl_getdate(val, NULL);
        x->last_modified = t > 0 ? (int64_t)t : 0;
    } else if (IS("date")) {
        time_t t = curl_getdate(val, NULL);
        x->server_date = t > 0 ? (int64_t)t : 0;
    } else if (IS("x-amz-request-id")) {
        copy_trimmed(x->request_id, sizeof(x->request_id), v, vn);
    }
#undef IS
    return n;
}

/* ------------------------------------------------------------ destination */

static unsigned char *stage_get(struct worker *w)
{
    if (w->n_stages > 0)
        return w->stages[--w->n_stages];
    return malloc(STAGE_BYTES);
}

static void stage_put(struct worker *w, unsigned char *b)
{
    if (!b)
        return;
    if (w->n_stages < w->e->share)
        w->stages[w->n_stages++] = b;
    else
        free(b);
}

/* Readers wait on this range: it holds the end of the contiguous prefix.
 * f->lock held. */
static int is_frontier(const struct xfer *x)
{
    const struct sf_fetch *f = x->f;
    if (f->n_ranges == 0)
        return x == &f->head;
    return f->contig_idx < f->n_ranges && range_at((struct sf_fetch *)f, f->contig_idx) == x;
}

/*
 * Puts n bytes at the range's write position in the destination, then tells
 * the observer and publishes progress. Returns -1 (abort set) when a file
 * write fails.
 */
static int dest_put(struct xfer *x, const unsigned char *data, size_t n)
{
    struct sf_fetch *f = x->f;
    uint64_t at = x->first + x->got; /* object offset */
    uint64_t dest = at - f->offset;
    const unsigned char *placed = data;
    if (f->fd >= 0) {
        size_t done = 0;
        while (done < n) {
            ssize_t w = pwrite(f->fd, data + done, n - done, (off_t)(f->file_offset + dest + done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                set_abort(x, AB_IO, "write at file offset %" PRIu64 ": %s",
                          f->file_offset + dest + done, w < 0 ? strerror(errno) : "no progress");
                return -1;
            }
            done += (size_t)w;
        }
    } else {
        memcpy(f->buf + dest, data, n);
        placed = f->buf + dest;
    }
    /* The observer sees the bytes before the frontier passes them. */
    if (f->on_data) {
        pthread_mutex_lock(&f->data_lock);
        f->on_data(f->on_data_user, at, placed, n);
        pthread_mutex_unlock(&f->data_lock);
    }
    pthread_mutex_lock(&f->lock);
    x->got += n;
    f->s_received += n;
    if (is_frontier(x))
        publish_locked(f);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

/* Writes what the range has gathered. */
static int stage_flush(struct xfer *x)
{
    if (!x->staged)
        return 0;
    size_t n = x->staged;
    x->staged = 0;
    return dest_put(x, x->stage, n);
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nmemb;
    if (!x->headers_done)
        headers_complete(x);
    if (x->abort != AB_NONE)
        return CURL_WRITEFUNC_ERROR;
    if (x->status < 200 || x->status >= 300) {
        /* error body: keep the start of it for the message */
        if (x->errbody.len < MAX_ERROR_BODY) {
            size_t room = MAX_ERROR_BODY - x->errbody.len;
            sf__strbuf_append(&x->errbody, data, n < room ? n : room);
        }
        return n;
    }
    if (x->call) {
        if (sf__strbuf_append(&x->call->resp->body, data, n) != SF_OK) {
            set_abort(x, AB_LIMIT, "response body over %zu bytes", x->call->max_body);
            return CURL_WRITEFUNC_ERROR;
        }
        x->attempt_bytes += n;
        return n;
    }
    struct sf_fetch *f = x->f;
    uint64_t len = xfer_len(x);
    if (n > len - x->got - x->staged) {
        set_abort(x, AB_OVERFLOW, "server sent more than the %" PRIu64 " bytes asked", len);
        return CURL_WRITEFUNC_ERROR;
    }
    x->attempt_bytes += n;
    const unsigned char *d = (const unsigned char *)data;
    if (f->fd < 0) {
        dest_put(x, d, n);
        return n;
    }
    if (!x->stage && n < STAGE_BYTES)
        x->stage = stage_get(x->w);
    if (!x->stage)
        return dest_put(x, d, n) == 0 ? n : CURL_WRITEFUNC_ERROR;
    size_t done = 0;
    while (done < n) {
        size_t k = n - done;
        if (k > STAGE_BYTES - x->staged)
            k = STAGE_BYTES - x->staged;
        memcpy(x->stage + x->staged, d + done, k);
        x->staged += k;
        done += k;
        if ((x->staged == STAGE_BYTES || x->got + x->staged == len) && stage_flush(x) != 0)
            return CURL_WRITEFUNC_ERROR;
    }
    return n;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal;
    (void)ultotal;
    struct xfer *x = ud;
    uint64_t now = sf__now_ns();
    /* bytes moved either way: an upload progresses while nothing comes back */
    curl_off_t moved = dlnow + ulnow;
    if (moved != x->last_dlnow) {
        x->last_dlnow = moved;
        x->last_progress_ns = now;
        if (dlnow > 0)
            x->quiet_since_ns = now;
        return 0;
    }
    const struct sf__engine_config *c = &x->e->cfg;
    uint64_t rt_ns = (uint64_t)c->request_timeout_ms * 1000000ull;
    if (rt_ns && now - x->quiet_since_ns >= rt_ns) {
        set_abort(x, AB_SILENT, "no answer from %s for %u ms (request_timeout_ms, %u attempts)",
                  x->origin, c->request_timeout_ms, x->attempts);
        return 1;
    }
    if (!x->answered) {
        unsigned fb_ms = c->first_byte_timeout_ms;
        if (fb_ms && now - x->last_progress_ns > (uint64_t)fb_ms * 1000000ull) {
            set_abort(x, AB_STALL, "no answer from %s within %u ms (first_byte_timeout_ms)",
                      x->origin, fb_ms);
            return 1;
        }
        return 0;
    }
    unsigned stall_ms = c->stall_timeout_ms;
    if (stall_ms && now - x->last_progress_ns > (uint64_t)stall_ms * 1000000ull) {
        set_abort(x, AB_STALL, "no data from %s for %u ms", x->origin, stall_ms);
        return 1;
    }
    return 0;
}

/* Request body of a call: from memory or pread() from its file. */
static size_t on_read(char *buf, size_t size, size_t nitems, void *ud)
{
    struct xfer *x = ud;
    const struct sf__body *b = x->call->body;
    size_t n = size * nitems;
    if (n > b->len - x->body_pos)
        n = (size_t)(b->len - x->body_pos);
    if (n == 0)
        return 0;
    if (b->data) {
        memcpy(buf, (const unsigned char *)b->data + x->body_pos, n);
    } else {
        ssize_t r;
        do
            r = pread(b->fd, buf, n, (off_t)(b->offset + x->body_pos));
        while (r < 0 && errno == EINTR);
        if (r <= 0) {
            set_abort(x, AB_IO, "reading the request body at offset %" PRIu64 ": %s", x->body_pos,
                      r < 0 ? strerror(errno) : "the file shrank");
            return CURL_READFUNC_ABORT;
        }
        n = (size_t)r;
    }
    x->body_pos += n;
    return n;
}

/* curl rewinds the body when it must send it again (redirect, auth). */
static int on_seek(void *ud, curl_off_t offset, int origin)
{
    struct xfer *x = ud;
    if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > x->call->body->len)
        return CURL_SEEKFUNC_FAIL;
    x->body_pos = (uint64_t)offset;
    return CURL_SEEKFUNC_OK;
}

/* ------------------------------------------------------------ attempts */

static size_t idle_cap(const struct sf__engine *e)
{
    return (size_t)e->share * 2 + 4;
}

static CURL *get_easy(struct worker *w)
{
    if (w->n_idle > 0)
        return w->idle[--w->n_idle];
    return curl_easy_init();
}

static void put_easy(struct worker *w, CURL *h)
{
    if (!h)
        return;
    if (w->n_idle < idle_cap(w->e)) {
        curl_easy_reset(h);
        w->idle[w->n_idle++] = h;
    } else {
        curl_easy_cleanup(h);
    }
}

/* On x->w's thread (or after the join), under sched. */
static void attempt_release(struct sf__engine *e, struct xfer *x)
{
    if (x->easy) {
        curl_multi_remove_handle(x->w->multi, x->easy);
        put_easy(x->w, x->easy);
        x->easy = NULL;
        e->in_flight--;
        x->w->in_flight--;
    }
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
    sf__strbuf_free(&x->errbody);
    /* Bytes still gathered here were never written: they do not count in
     * got, so a later attempt asks for them again. */
    stage_put(x->w, x->stage);
    x->stage = NULL;
    x->staged = 0;
}

/* The connect limit of an attempt: connect_timeout_ms, or less when the
 * request's no-answer budget (request_timeout_ms) ends sooner. */
static unsigned attempt_connect_ms(const struct sf__engine *e, const struct xfer *x, uint64_t now)
{
    unsigned ms = e->cfg.connect_timeout_ms;
    uint64_t rt_ns = (uint64_t)e->cfg.request_timeout_ms * 1000000ull;
    if (rt_ns) {
        uint64_t used = now - x->quiet_since_ns;
        uint64_t left_ms = used < rt_ns ? (rt_ns - used) / 1000000ull : 0;
        if (left_ms < 1)
            left_ms = 1;
        if (!ms || left_ms < ms)
            ms = (unsigned)left_ms;
    }
    return ms;
}

/* Starts one attempt of x. On a local failure (signing, no memory) the
 * request fails at once: returns the status with x->last_msg set. */
static sf_status attempt_start(struct sf__engine *e, struct xfer *x)
{
    const struct sf__locator *loc = x->f ? &x->f->loc : x->call->loc;
    struct sf__req_spec spec = {
        .method = x->call ? x->call->method : "GET",
        .loc = loc,
        .query = x->call ? x->call->query : NULL,
        .range_first = x->first == SF__NO_RANGE ? SF__NO_RANGE : x->first + x->got,
        .range_last = x->last,
        .if_match = x->f && x->f->etag_expected[0] ? x->f->etag_expected : NULL,
        .sign_time = time(NULL) + (time_t)e->clock_skew_s,
        .payload_hash = x->call && x->call->body ? x->call->body->sha256_hex : NULL,
    };
    char *url = NULL;
    char err[512] = "";
    sf_status st = e->cfg.prepare(e->cfg.user, &spec, &url, &x->hdrs, err, sizeof(err));
    if (st != SF_OK) {
        snprintf(x->last_msg, sizeof(x->last_msg), "%s", err);
        curl_slist_free_all(x->hdrs);
        x->hdrs = NULL;
        free(url);
        return st;
    }
    const struct sf__body *body = x->call ? x->call->body : NULL;
    if (body) {
        /* no "Expect: 100-continue" round trip before the body */
        struct curl_slist *l = curl_slist_append(x->hdrs, "Expect:");
        if (!l) {
            snprintf(x->last_msg, sizeof(x->last_msg), "out of memory");
            curl_slist_free_all(x->hdrs);
            x->hdrs = NULL;
            free(url);
            return SF_ERR_NO_MEMORY;
        }
        x->hdrs = l;
    }
    x->e = e;
    CURL *h = get_easy(x->w);
    if (!h) {
        free(url);
        snprintf(x->last_msg, sizeof(x->last_msg), "cannot create a curl handle");
        return SF_ERR_NO_MEMORY;
    }
    x->easy = h;
    x->status = 0;
    x->headers_done = 0;
    x->have_cr = 0;
    x->etag[0] = '\0';
    x->request_id[0] = '\0';
    x->content_length = SF_SIZE_UNKNOWN;
    x->last_modified = 0;
    x->server_date = 0;
    x->abort = AB_NONE;
    x->abort_msg[0] = '\0';
    x->errbuf[0] = '\0';
    x->last_dlnow = 0;
    x->last_progress_ns = sf__now_ns();
    x->attempt_bytes = 0;
    sf__strbuf_init(&x->errbody, MAX_ERROR_BODY + 1);
    x->ranged = spec.range_first != SF__NO_RANGE;

    /* the endpoint, for messages: scheme://authority, no path or query */
    const char *auth = strstr(url, "://");
    size_t olen = auth ? (size_t)(strcspn(auth + 3, "/?#") + (size_t)(auth + 3 - url)) : 0;
    snprintf(x->origin, sizeof(x->origin), "%.*s", (int)olen, url);
    uint64_t now0 = sf__now_ns();
    if (!x->quiet_since_ns)
        x->quiet_since_ns = now0;
    x->answered = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    free(url);
    /* S3 keys are opaque: "a/../b" is its own key and was signed as such;
     * curl would otherwise squash the dot segments and fetch another object. */
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->hdrs);
    curl_easy_setopt(h, CURLOPT_PRIVATE, x);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, EASY_BUFFER_SIZE);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                     e->cfg.http2 ? (long)CURL_HTTP_VERSION_2TLS : (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)attempt_connect_ms(e, x, now0));
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    if (e->cfg.stall_timeout_ms || e->cfg.first_byte_timeout_ms || e->cfg.request_timeout_ms) {
        /* Backstop for on_progress, and it makes curl revisit idle transfers
         * every second, which is what lets on_progress see a stall or a
         * silent server. */
        unsigned longest = e->cfg.stall_timeout_ms;
        if (e->cfg.first_byte_timeout_ms > longest)
            longest = e->cfg.first_byte_timeout_ms;
        if (!longest)
            longest = e->cfg.request_timeout_ms;
        long secs = (long)((longest + 999) / 1000);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, secs + 1);
    }
    if (loc->kind == SF__LOC_HTTP) {
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    }
    if (e->ca_bundle)
        curl_easy_setopt(h, CURLOPT_CAINFO, e->ca_bundle);
    if (e->cfg.insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (strcmp(spec.method, "HEAD") == 0)
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    else if (strcmp(spec.method, "GET") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, spec.method);
    if (body) {
        x->body_pos = 0;
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)body->len);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, x);
    }
    if (curl_multi_add_handle(x->w->multi, h) != CURLM_OK) {
        put_easy(x->w, h);
        x->easy = NULL;
        snprintf(x->last_msg, sizeof(x->last_msg), "curl_multi_add_handle failed");
        return SF_ERR_INTERNAL;
    }
    x->attempts++;
    x->start_ns = sf__now_ns();
    x->state = X_RUNNING;
    e->in_flight++;
    x->w->in_flight++;
    pthread_mutex_lock(&e->lock);
    e->stats.requests++;
    if (x->attempts > 1)
        e->stats.retries++;
    pthread_mutex_unlock(&e->lock);
    if (x->f) {
        pthread_mutex_lock(&x->f->lock);
        x->f->s_requests++;
        if (x->attempts > 1)
            x->f->s_retries++;
        pthread_mutex_unlock(&x->f->lock);
        x->f->running++;
    }
    return SF_OK;
}

/* ------------------------------------------------------------ completion */

static void waiting_remove_fetch(struct sf__engine *e, struct sf_fetch *f)
{
    struct xfer **pp = &e->waiting;
    while (*pp) {
        if ((*pp)->f == f) {
            (*pp)->state = X_IDLE;
            *pp = (*pp)->next_wait;
        } else {
            pp = &(*pp)->next_wait;
        }
    }
}

static void active_remove(struct sf__engine *e, struct sf_fetch *f)
{
    for (struct sf_fetch **pp = &e->active; *pp; pp = &(*pp)->next_active) {
        if (*pp == f) {
            *pp = f->next_active;
            return;
        }
    }
}

/* The last transfer of an ended fetch is out: tell the waiters. */
static void fetch_release(struct sf_fetch *f)
{
    pthread_mutex_lock(&f->lock);
    f->s_done = 1;
    f->s_status = f->fin_status;
    f->released = 1;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

/* The fetch ends (success, failure or cancel): stop its transfers, publish.
 * Ranges running on another worker are handed to it; the fetch is released
 * when the last of them is out. */
static void fetch_finish(struct sf__engine *e, struct sf_fetch *f, sf_status st, const char *msg)
{
    if (f->finished)
        return;
    f->finished = 1;
    for (size_t i = 0; i < (f->n_ranges ? f->n_ranges : 1); i++) {
        struct xfer *x = range_at(f, i);
        if (x->state != X_RUNNING || x->doomed)
            continue;
        if (!e->cur || x->w == e->cur) {
            attempt_release(e, x);
            x->state = X_IDLE;
        } else {
            x->doomed = 1;
            x->next_wait = x->w->doomed;
            x->w->doomed = x;
            f->n_doomed++;
            curl_multi_wakeup(x->w->multi);
        }
    }
    f->running = 0;
    waiting_remove_fetch(e, f);
    active_remove(e, f);
    if (st == SF_OK)
        publish_progress(f);
    pthread_mutex_lock(&e->lock);
    if (st == SF_OK)
        e->stats.objects_done++;
    else if (st != SF_ERR_CANCELLED)
        e->stats.objects_failed++;
    pthread_mutex_unlock(&e->lock);
    f->fin_status = st;
    if (msg) {
        pthread_mutex_lock(&f->lock);
        snprintf(f->errmsg, sizeof(f->errmsg), "%s", msg);
        pthread_mutex_unlock(&f->lock);
    }
    if (f->n_doomed == 0)
        fetch_release(f);
}

/* Takes the ranges of ended fetches out of w's multi handle; under sched, on
 * w's thread (or after the join). */
static void release_doomed(struct sf__engine *e, struct worker *w)
{
    while (w->doomed) {
        struct xfer *x = w->doomed;
        w->doomed = x->next_wait;
        x->next_wait = NULL;
        attempt_release(e, x);
        x->state = X_IDLE;
        x->doomed = 0;
        if (--x->f->n_doomed == 0)
            fetch_release(x->f);
    }
}

static void call_finish(struct call *c, sf_status st, const char *msg)
{
    pthread_mutex_lock(&c->lock);
    c->status = st;
    if (msg) {
        /* Truncated on purpose: the call's message has a fixed size. */
        size_t n = strlen(msg);
        if (n >= sizeof(c->resp->errmsg))
            n = sizeof(c->resp->errmsg) - 1;
        memcpy(c->resp->errmsg, msg, n);
        c->resp->errmsg[n] = 0;
    }
    c->finished = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

static void fail_xfer(struct sf__engine *e, struct xfer *x, sf_status st, const char *msg)
{
    x->state = X_DONE;
    if (x->f) {
        /* A missing object is often expected (index.json beside plain
         * WebDataset shards); the caller reports it if it is an error. */
        elog(e, st == SF_ERR_NOT_FOUND ? SF_LOG_INFO : SF_LOG_ERROR, "%s", msg);
        fetch_finish(e, x->f, st, msg);
    } else {
        call_finish(x->call, st, msg);
    }
}

static void publish_limits(struct sf__engine *e)
{
    unsigned w = sf__policy_window(&e->policy), t = sf__policy_tokens(&e->policy);
    unsigned long long cuts = sf__policy_cuts(&e->policy);
    pthread_mutex_lock(&e->lock);
    e->stats.rate_cuts = cuts;
    e->stats.concurrency_limit = w;
    e->stats.retry_tokens = t;
    pthread_mutex_unlock(&e->lock);
}

static enum sf__outcome outcome_of(sf_status st, int retry)
{
    if (retry == 2)
        return SF__OUTCOME_THROTTLED;
    return st == SF_ERR_TIMEOUT ? SF__OUTCOME_TIMEOUT : SF__OUTCOME_ERROR;
}

static void log_verdict(struct sf__engine *e, enum sf__verdict v)
{
    if (v == SF__VERDICT_NONE || v == SF__VERDICT_NOISE)
        return;
    static const char *const what[] = {
        [SF__VERDICT_CUT] = "throttled: rate limit",
        [SF__VERDICT_PROBE] = "throttled: testing whether the share falls with the rate",
        [SF__VERDICT_CONFIRM] = "throttled: the share fell with the rate, a rate limit",
        [SF__VERDICT_RESTORE] = "throttled: the share did not fall with the rate, noise: rate restored",
    };
    elog(e, SF_LOG_INFO, "%s; in-flight limit %u, request rate %.1f/s (0 = no cap)", what[v],
         sf__policy_window(&e->policy), sf__policy_rate(&e->policy));
}

/* Decides whether a failed attempt is tried again; schedules it or fails. */
static void retry_or_fail(struct sf__engine *e, struct xfer *x, sf_status st, int retry,
                          const char *why)
{
    char rng_txt[64];
    range_text(x, rng_txt, sizeof(rng_txt));
    snprintf(x->last_msg, sizeof(x->last_msg), "%s", why);
    if (retry == 2) {
        pthread_mutex_lock(&e->lock);
        e->stats.throttled++;
        pthread_mutex_unlock(&e->lock);
    }
    enum sf__outcome oc = outcome_of(st, retry);
    enum sf__verdict v = sf__policy_record(&e->policy, sf__now_ns(), x->start_ns, oc, NULL);
    log_verdict(e, v);
    if (!retry) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s%s: %s", xfer_name(x), rng_txt, why);
        fail_xfer(e, x, st, msg);
        return;
    }
    uint64_t delay_ms = 0;
    enum sf__retry_refusal r =
        sf__policy_retry(&e->policy, x->attempts, oc, v, &x->tokens_held, &delay_ms);
    if (r != SF__RETRY_OK) {
        char msg[1024];
        if (r == SF__RETRY_MAX_ATTEMPTS)
            snprintf(msg, sizeof(msg), "%s%s: %s (gave up after %u attempts)", xfer_name(x),
                     rng_txt, why, x->attempts);
        else
            snprintf(msg, sizeof(msg),
                     "%s%s: %s (retry quota exhausted: the server keeps failing, not retrying)",
                     xfer_name(x), rng_txt, why);
        publish_limits(e);
        fail_xfer(e, x, st, msg);
        return;
    }
    uint64_t rt_ns = (uint64_t)e->cfg.request_timeout_ms * 1000000ull;
    uint64_t now = sf__now_ns();
    if (rt_ns && x->quiet_since_ns && now + delay_ms * 1000000ull - x->quiet_since_ns >= rt_ns) {
        char msg[1024];
        snprintf(msg, sizeof(msg),
                 "%s%s: %s; no answer from %s for %u ms (request_timeout_ms, %u attempts)",
                 xfer_name(x), rng_txt, why, x->origin, e->cfg.request_timeout_ms, x->attempts);
        publish_limits(e);
        fail_xfer(e, x, SF_ERR_TIMEOUT, msg);
        return;
    }
    elog(e, SF_LOG_WARN, "%s%s: %s; retry %u in %" PRIu64 " ms", xfer_name(x), rng_txt, why,
         x->attempts, delay_ms);
    x->due_ns = now + delay_ms * 1000000ull;
    x->state = X_WAITING;
    x->next_wait = e->waiting;
    e->waiting = x;
    publish_limits(e);
}

static void describe_http_error(struct xfer *x, char *out, size_t n, struct sf__s3_error *s3e)
{
    memset(s3e, 0, sizeof(*s3e));
    if (x->errbody.len)
        sf__xml_parse_error(x->errbody.data, x->errbody.len, s3e);
    const char *rid = s3e->request_id[0] ? s3e->request_id : x->request_id;
    if (s3e->code[0])
        snprintf(out, n, "HTTP %ld %s: %s%s%s", x->status, s3e->code, s3e->message,
                 rid[0] ? ", request id " : "", rid);
    else
        snprintf(out, n, "HTTP %ld%s%s", x->status, rid[0] ? ", request id " : "", rid);
}

static void fill_response(struct xfer *x, struct sf__response *r)
{
    r->status = x->status;
    snprintf(r->etag, sizeof(r->etag), "%s", x->etag);
    r->content_length = x->content_length;
    r->last_modified = x->last_modified;
    snprintf(r->request_id, sizeof(r->request_id), "%s", x->request_id);
}

static void attempt_done(struct sf__engine *e, struct xfer *x, CURLcode code)
{
    /* What arrived before the end (or the failure) of this attempt is good:
     * write it, so a retry resumes after it. */
    if (x->f && x->staged)
        stage_flush(x);
    long conns = 0;
    curl_easy_getinfo(x->easy, CURLINFO_NUM_CONNECTS, &conns);
    pthread_mutex_lock(&e->lock);
    e->stats.connections += (unsigned)conns;
    e->stats.bytes_received += x->call ? 0 : x->attempt_bytes;
    pthread_mutex_unlock(&e->lock);
    if (x->f)
        x->f->running--;

    char why[768];
    sf_status st = SF_OK;
    int retry = 0;
    struct sf__s3_error s3e;
    memset(&s3e, 0, sizeof(s3e));

    if (x->abort != AB_NONE) {
        snprintf(why, sizeof(why), "%s", x->abort_msg);
        switch (x->abort) {
        case AB_STALL:
            st = SF_ERR_TIMEOUT;
            retry = 1;
            break;
        case AB_SILENT: st = SF_ERR_TIMEOUT; break;
        case AB_BAD_RESPONSE:
        case AB_OVERFLOW:
            st = SF_ERR_HTTP;
            retry = 1;
            break;
        case AB_CHANGED: st = SF_ERR_CHANGED; break;
        case AB_LIMIT: st = SF_ERR_LIMIT; break;
        case AB_IO: st = SF_ERR_IO; break;
        case AB_NONE: break;
        }
    } else if (x->status >= 300 || (code == CURLE_OK && x->status < 200)) {
        describe_http_error(x, why, sizeof(why), &s3e);
        st = sf__classify_http(x->status, s3e.code, &retry);
        if (x->call && !strcmp(x->call->method, "HEAD") && (x->status == 404 || x->status == 403))
            snprintf(why, sizeof(why), "HTTP %ld: %s%s%s", x->status,
                     x->status == 404 ? "not found"
                                      : "access denied (wrong credentials, or no permission)",
                     x->request_id[0] ? ", request id " : "", x->request_id);
        if (!strcmp(s3e.code, "RequestTimeTooSkewed") && x->server_date) {
            e->clock_skew_s = x->server_date - (int64_t)time(NULL);
            elog(e, SF_LOG_WARN, "clock skew of %" PRId64 " s: signing with the server's time",
                 e->clock_skew_s);
        }
        if (!strcmp(s3e.code, "ExpiredToken") && e->cfg.invalidate)
            e->cfg.invalidate(e->cfg.user);
        if (st == SF_ERR_CHANGED)
            snprintf(why + strlen(why), sizeof(why) - strlen(why),
                     " (the object changed while it was read: ETag %s no longer matches)",
                     x->f ? x->f->etag_expected : "");
        if (x->f && x->f->n_ranges == 0 && x->status == 416 && x->f->offset == 0 && x->got == 0 &&
            x->f->length != 0) {
            /* a Range on an empty object is unsatisfiable: it is empty */
            char msg[512];
            attempt_release(e, x);
            x->state = X_DONE;
            if (fetch_layout(e, x->f, 0, msg, sizeof(msg)) == SF_OK)
                fetch_finish(e, x->f, SF_OK, NULL);
            else
                fetch_finish(e, x->f, SF_ERR_INTERNAL, msg);
            return;
        }
    } else if (code != CURLE_OK) {
        snprintf(why, sizeof(why), "%s%s%s", curl_easy_strerror(code), x->errbuf[0] ? ": " : "",
                 x->errbuf);
        size_t l = strlen(why);
        while (l > 0 && why[l - 1] == '\n')
            why[--l] = '\0';
        switch (code) {
        case CURLE_SSL_CACERT_BADFILE:
        case CURLE_PEER_FAILED_VERIFICATION:
        case CURLE_SSL_CERTPROBLEM:
        case CURLE_UNSUPPORTED_PROTOCOL:
        case CURLE_URL_MALFORMAT:
        case CURLE_TOO_MANY_REDIRECTS:
            st = SF_ERR_NETWORK;
            retry = 0;
            break;
        case CURLE_OPERATION_TIMEDOUT:
            st = SF_ERR_TIMEOUT;
            retry = 1;
            break;
        default:
            st = SF_ERR_NETWORK;
            retry = 1;
            break;
        }
    } else if (x->f) {
        if (x->got < xfer_len(x)) {
            snprintf(why, sizeof(why), "short body: %" PRIu64 " of %" PRIu64 " bytes", x->got,
                     xfer_len(x));
            st = SF_ERR_NETWORK;
            retry = 1;
        }
    }

    if (x->call)
        fill_response(x, x->call->resp);
    if (x->call && st != SF_OK)
        x->call->resp->s3err = s3e;
    attempt_release(e, x);

    if (st != SF_OK) {
        if (x->f && x->f->finished)
            return;
        retry_or_fail(e, x, st, retry, why);
        return;
    }
    log_verdict(e, sf__policy_record(&e->policy, sf__now_ns(), x->start_ns, SF__OUTCOME_OK,
                                      &x->tokens_held));
    publish_limits(e);
    x->state = X_DONE;
    if (x->call) {
        call_finish(x->call, SF_OK, NULL);
        return;
    }
    struct sf_fetch *f = x->f;
    f->n_done++;
    publish_progress(f);
    if (f->n_done == f->n_ranges)
        fetch_finish(e, f, SF_OK, NULL);
}

/* ------------------------------------------------------------ the loop */

/* Starts x on the worker holding sched. */
static void start_or_fail(struct sf__engine *e, struct xfer *x)
{
    x->w = e->cur;
    if (x->f) {
        pthread_mutex_lock(&x->f->lock);
        x->f->workers_used |= 1ull << (e->cur->idx % 64);
        pthread_mutex_unlock(&x->f->lock);
    }
    sf_status st = attempt_start(e, x);
    if (st != SF_OK) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s: %s", xfer_name(x), x->last_msg);
        fail_xfer(e, x, st, msg);
    }
}

/* Does x belong to the group being scheduled (calls go with the priority one)? */
static int in_group(const struct xfer *x, int prio)
{
    return x->call ? prio : x->f->prio == prio;
}

/* May the worker holding sched start one more request? */
static int has_room(const struct sf__engine *e, unsigned limit)
{
    unsigned share = (limit + e->n_workers - 1) / e->n_workers;
    return e->in_flight < limit && e->cur->in_flight < share;
}

/*
 * Starts what may start now on the worker holding sched (at most its share
 * of the window), in this order: due retries and calls of
 * priority fetches, their new ranges, then the same for the other fetches;
 * within a group oldest fetch first, lowest offset first. Returns 0 when the
 * rate limiter says stop.
 */
static int schedule_group(struct sf__engine *e, uint64_t now, unsigned limit, int prio)
{
    for (struct xfer **pp = &e->waiting; *pp && has_room(e, limit);) {
        struct xfer *x = *pp;
        if (x->due_ns <= now && in_group(x, prio)) {
            if (!sf__policy_may_start(&e->policy, now))
                return 0;
            *pp = x->next_wait;
            x->next_wait = NULL;
            start_or_fail(e, x);
            /* a failure may have unlinked other entries (same fetch): rescan */
            pp = &e->waiting;
        } else {
            pp = &x->next_wait;
        }
    }
    for (struct sf_fetch *f = e->active; f && has_room(e, limit);) {
        struct sf_fetch *next = f->next_active;
        if (f->prio != prio) {
            f = next;
            continue;
        }
        if (f->n_ranges == 0) {
            if (f->next_start == 0) {
                if (!sf__policy_may_start(&e->policy, now))
                    return 0;
                f->next_start = 1;
                start_or_fail(e, &f->head);
            }
        } else {
            while (f->next_start < f->n_ranges && has_room(e, limit) && !f->finished) {
                if (!sf__policy_may_start(&e->policy, now))
                    return 0;
                struct xfer *x = range_at(f, f->next_start++);
                if (x->state == X_IDLE && x->got < xfer_len(x))
                    start_or_fail(e, x);
            }
        }
        f = next;
    }
    return 1;
}

/* Is there a request that could start now (rate limiter aside)? */
static int work_left(const struct sf__engine *e, uint64_t now)
{
    for (const struct xfer *x = e->waiting; x; x = x->next_wait)
        if (x->due_ns <= now)
            return 1;
    for (const struct sf_fetch *f = e->active; f; f = f->next_active)
        if (!f->finished && (f->n_ranges == 0 ? f->next_start == 0 : f->next_start < f->n_ranges))
            return 1;
    return 0;
}

static void schedule(struct sf__engine *e)
{
    uint64_t now = sf__now_ns();
    unsigned limit = sf__policy_window(&e->policy);
    if (schedule_group(e, now, limit, 1))
        schedule_group(e, now, limit, 0);
    /*
     * This worker's share is full but the window is not and work is left
     * (ranges a probe's answer laid out, a retry come due): wake the workers
     * with room, which would otherwise sleep until their own next event. Only
     * a full worker wakes others, so idle ones never wake each other in turn.
     */
    unsigned share = (limit + e->n_workers - 1) / e->n_workers;
    if (e->n_workers > 1 && e->cur->in_flight >= share && e->in_flight < limit &&
        work_left(e, now)) {
        for (unsigned i = 0; i < e->n_workers; i++) {
            struct worker *w = &e->workers[i];
            if (w != e->cur && w->in_flight < share)
                curl_multi_wakeup(w->multi);
        }
    }
}

static int next_timeout_ms(struct sf__engine *e)
{
    uint64_t now = sf__now_ns();
    /* The rate limiter's wait counts only when something could start: with
     * nothing to send, a token in the bucket must not wake the thread at
     * once (an idle engine spun on every I/O thread); new work wakes it. */
    int t = work_left(e, now) ? sf__policy_wait_ms(&e->policy, now, 1000) : 1000;
    for (struct xfer *x = e->waiting; x; x = x->next_wait) {
        if (x->due_ns <= now)
            return 0;
        uint64_t ms = (x->due_ns - now + 999999) / 1000000;
        if (ms < (uint64_t)t)
            t = (int)ms;
    }
    return t;
}

static void take_incoming(struct sf__engine *e, int *shutdown)
{
    pthread_mutex_lock(&e->lock);
    *shutdown = e->shutdown;
    struct sf_fetch *fl = e->incoming_fetches;
    struct call *cl = e->incoming_calls;
    e->incoming_fetches = NULL;
    e->incoming_calls = NULL;
    int cancels = e->cancel_pending;
    e->cancel_pending = 0;
    int prios = e->prio_pending;
    e->prio_pending = 0;
    pthread_mutex_unlock(&e->lock);

    /* keep submission order: the lists were built by pushing at the head */
    struct sf_fetch *rev = NULL;
    while (fl) {
        struct sf_fetch *n = fl->next_incoming;
        fl->next_incoming = rev;
        rev = fl;
        fl = n;
    }
    struct sf_fetch **tail = &e->active;
    while (*tail)
        tail = &(*tail)->next_active;
    for (; rev; rev = rev->next_incoming) {
        rev->next_active = NULL;
        *tail = rev;
        tail = &rev->next_active;
    }
    for (; cl; cl = cl->next_incoming) {
        cl->x.due_ns = 0;
        cl->x.state = X_WAITING;
        cl->x.next_wait = e->waiting;
        e->waiting = &cl->x;
    }
    if (prios) {
        pthread_mutex_lock(&e->lock);
        for (struct sf_fetch *f = e->active; f; f = f->next_active)
            f->prio = f->prio_req;
        pthread_mutex_unlock(&e->lock);
    }
    if (cancels) {
        for (struct sf_fetch *f = e->active; f;) {
            struct sf_fetch *next = f->next_active;
            pthread_mutex_lock(&e->lock);
            int c = f->cancel;
            pthread_mutex_unlock(&e->lock);
            if (c)
                fetch_finish(e, f, SF_ERR_CANCELLED, "cancelled");
            f = next;
        }
    }
}

static void wake_all(struct sf__engine *e)
{
    for (unsigned i = 0; i < e->n_workers; i++)
        if (e->workers[i].multi)
            curl_multi_wakeup(e->workers[i].multi);
}

static void sched_lock(struct worker *w)
{
    pthread_mutex_lock(&w->e->sched);
    w->e->cur = w;
}

static void sched_unlock(struct worker *w)
{
    w->e->cur = NULL;
    pthread_mutex_unlock(&w->e->sched);
}

/* One I/O thread: takes work and starts its share under sched, then lets
 * curl move bytes on its own multi handle without any engine lock. */
static void *io_main(void *arg)
{
    struct worker *w = arg;
    struct sf__engine *e = w->e;
    for (;;) {
        int shutdown = 0;
        sched_lock(w);
        take_incoming(e, &shutdown);
        if (shutdown) {
            sched_unlock(w);
            break;
        }
        release_doomed(e, w);
        schedule(e);
        sched_unlock(w);
        int running = 0;
        curl_multi_perform(w->multi, &running);
        sched_lock(w);
        release_doomed(e, w);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(w->multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            struct xfer *x = NULL;
            CURL *h = m->easy_handle;
            CURLcode code = m->data.result;
            curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&x);
            if (x && x->easy == h && !x->doomed)
                attempt_done(e, x, code);
        }
        schedule(e);
        /* A worker without room waits for its own transfers (or a wake-up),
         * not for a due retry it may not start. */
        unsigned limit = sf__policy_window(&e->policy);
        int timeout_ms = has_room(e, limit) ? next_timeout_ms(e) : 1000;
        w->loops++;
        sched_unlock(w);
        curl_multi_poll(w->multi, NULL, 0, timeout_ms, NULL);
    }
    return NULL;
}

/* ------------------------------------------------------------ public-ish API */

unsigned sf__io_threads_default(void)
{
    long n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = CPU_COUNT(&set);
    if (n < 1)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > SF__IO_THREADS_DEFAULT_MAX ? SF__IO_THREADS_DEFAULT_MAX : (unsigned)n;
}

sf_status sf__engine_new(const struct sf__engine_config *c, struct sf__engine **out, char *err,
                         size_t err_len)
{
    *out = NULL;
    struct sf__engine *e = calloc(1, sizeof(*e));
    if (!e)
        return SF_ERR_NO_MEMORY;
    e->cfg = *c;
    if (e->cfg.concurrency < 1)
        e->cfg.concurrency = 1;
    if (e->cfg.chunk_bytes < 1)
        e->cfg.chunk_bytes = 8u << 20;
    if (e->cfg.max_attempts < 1)
        e->cfg.max_attempts = 1;
    e->ca_bundle = c->ca_bundle ? strdup(c->ca_bundle) : NULL;
    e->cfg.ca_bundle = e->ca_bundle;
    e->stats.concurrency_limit = e->cfg.concurrency;
    e->stats.retry_tokens = e->cfg.retry_quota;
    e->rng = (uint64_t)sf__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)e;
    if (!e->rng)
        e->rng = 0x9E3779B97F4A7C15ull;
    struct sf__policy_config pc = {
        .concurrency = e->cfg.concurrency,
        .max_attempts = e->cfg.max_attempts,
        .retry_base_ms = e->cfg.retry_base_ms,
        .throttle_base_ms = e->cfg.throttle_base_ms,
        .retry_cap_ms = e->cfg.retry_cap_ms,
        .retry_quota = e->cfg.retry_quota,
        /* S3 asks clients to ramp up gradually; from 100/s a rank doubles
         * in about 0.14 s of successes (docs/transport.md, "Slow start") */
        .start_rps = SF__START_RPS,
    };
    int policy_ok = sf__policy_init(&e->policy, &pc, e->rng) == 0;
    /* no more threads than requests in flight: each has a share of them */
    unsigned n = e->cfg.io_threads ? e->cfg.io_threads : 1;
    if (n > e->cfg.concurrency)
        n = e->cfg.concurrency;
    e->share = (e->cfg.concurrency + n - 1) / n;
    e->workers = calloc(n, sizeof(*e->workers));
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->sched, NULL);
    if (!policy_ok || !e->workers) {
        sf__engine_destroy(e);
        return SF_ERR_NO_MEMORY;
    }
    e->n_workers = n;
    for (unsigned i = 0; i < n; i++) {
        struct worker *w = &e->workers[i];
        w->e = e;
        w->idx = i;
        w->idle = calloc(idle_cap(e), sizeof(CURL *));
        w->stages = calloc(e->share, sizeof(*w->stages));
        w->multi = curl_multi_init();
        if (!w->idle || !w->stages || !w->multi) {
            sf__engine_destroy(e);
            return SF_ERR_NO_MEMORY;
        }
        /* each thread its own connection pool, sized for its share */
        curl_multi_setopt(w->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)e->share);
        curl_multi_setopt(w->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)e->share);
        curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, (long)e->share * 2);
        curl_multi_setopt(w->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    }
    for (unsigned i = 0; i < n; i++) {
        struct worker *w = &e->workers[i];
        if (pthread_create(&w->thread, NULL, io_main, w) != 0) {
            if (err && err_len)
                snprintf(err, err_len, "cannot start I/O thread %u", i + 1);
            sf__engine_destroy(e);
            return SF_ERR_INTERNAL;
        }
        w->started = 1;
    }
    *out = e;
    return SF_OK;
}

void sf__engine_destroy(struct sf__engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->lock);
    e->shutdown = 1;
    pthread_mutex_unlock(&e->lock);
    wake_all(e);
    for (unsigned i = 0; i < e->n_workers; i++)
        if (e->workers[i].started)
            pthread_join(e->workers[i].thread, NULL);
    /* No worker runs any more: this thread owns every multi handle (e->cur
     * NULL), so cancelling releases every range where it runs. */
    pthread_mutex_lock(&e->sched);
    e->cur = NULL;
    for (unsigned i = 0; i < e->n_workers; i++)
        release_doomed(e, &e->workers[i]);
    while (e->active)
        fetch_finish(e, e->active, SF_ERR_CANCELLED, "client destroyed");
    while (e->waiting) {
        struct xfer *x = e->waiting;
        e->waiting = x->next_wait;
        if (x->call)
            call_finish(x->call, SF_ERR_CANCELLED, "client destroyed");
    }
    pthread_mutex_unlock(&e->sched);
    for (unsigned i = 0; i < e->n_workers; i++) {
        struct worker *w = &e->workers[i];
        for (size_t k = 0; k < w->n_idle; k++)
            curl_easy_cleanup(w->idle[k]);
        free(w->idle);
        for (size_t k = 0; k < w->n_stages; k++)
            free(w->stages[k]);
        free(w->stages);
        if (w->multi)
            curl_multi_cleanup(w->multi);
    }
    free(e->workers);
    sf__policy_free(&e->policy);
    pthread_mutex_destroy(&e->sched);
    pthread_mutex_destroy(&e->lock);
    free(e->ca_bundle);
    free(e);
}

void sf__response_free(struct sf__response *r)
{
    if (r)
        sf__strbuf_free(&r->body);
}

sf_status sf__engine_call(struct sf__engine *e, const char *method, const struct sf__locator *loc,
                          const char *query, size_t max_body, struct sf__response *resp)
{
    return sf__engine_call_body(e, method, loc, query, NULL, max_body, resp);
}

sf_status sf__engine_call_body(struct sf__engine *e, const char *method,
                               const struct sf__locator *loc, const char *query,
                               const struct sf__body *body, size_t max_body,
                               struct sf__response *resp)
{
    memset(resp, 0, sizeof(*resp));
    sf__strbuf_init(&resp->body, max_body);
    resp->content_length = SF_SIZE_UNKNOWN;
    struct call c;
    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.cond, NULL);
    c.method = method;
    c.query = query;
    c.loc = loc;
    c.body = body;
    c.resp = resp;
    c.max_body = max_body;
    c.x.call = &c;
    c.x.first = SF__NO_RANGE;
    c.x.last = SF__NO_RANGE;
    pthread_mutex_lock(&e->lock);
    int down = e->shutdown;
    if (!down) {
        c.next_incoming = e->incoming_calls;
        e->incoming_calls = &c;
    }
    pthread_mutex_unlock(&e->lock);
    if (down) {
        snprintf(resp->errmsg, sizeof(resp->errmsg), "client is shutting down");
        c.status = SF_ERR_CANCELLED;
    } else {
        wake_all(e);
        pthread_mutex_lock(&c.lock);
        while (!c.finished)
            pthread_cond_wait(&c.cond, &c.lock);
        pthread_mutex_unlock(&c.lock);
    }
    pthread_cond_destroy(&c.cond);
    pthread_mutex_destroy(&c.lock);
    return c.status;
}

static struct sf_fetch *fetch_alloc(const struct sf_fetch_options *o)
{
    struct sf_fetch *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->data_lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    f->fd = o->fd;
    f->file_offset = o->file_offset;
    f->buf = o->buffer;
    f->buf_bytes = o->buffer ? o->buffer_bytes : 0;
    f->offset = o->offset;
    f->length = o->length;
    f->size = o->size;
    f->s_total = SF_SIZE_UNKNOWN;
    f->s_size = o->size;
    f->total = SF_SIZE_UNKNOWN;
    f->head.f = f;
    f->first_bytes = o->first_range_bytes ? o->first_range_bytes : SF_FETCH_FIRST_RANGE_DEFAULT;
    f->on_data = o->on_data;
    f->on_data_user = o->on_data_user;
    f->prio = f->prio_req = o->priority != 0;
    if (o->etag)
        snprintf(f->etag_expected, sizeof(f->etag_expected), "%s", o->etag);
    snprintf(f->s_etag, sizeof(f->s_etag), "%s", f->etag_expected);
    return f;
}

sf_status sf__engine_fetch(struct sf__engine *e, const struct sf__locator *loc,
                           const struct sf_fetch_options *o, struct sf_fetch **out, char *err,
                           size_t err_len)
{
    *out = NULL;
    if (o->buffer && o->fd >= 0) {
        snprintf(err, err_len, "a fetch has one destination: buffer or fd, not both");
        return SF_ERR_INVALID_ARGUMENT;
    }
    struct sf_fetch *f = fetch_alloc(o);
    if (!f)
        return SF_ERR_NO_MEMORY;
    f->e = e;
    if (f->first_bytes > e->cfg.chunk_bytes)
        f->first_bytes = e->cfg.chunk_bytes;
    if (sf__locator_copy(loc, &f->loc) != SF_OK) {
        sf_fetch_destroy(f);
        return SF_ERR_NO_MEMORY;
    }
    if (o->length == 0 || o->size != SF_SIZE_UNKNOWN) {
        /* no probe needed: lay the ranges out now (the engine is not running
         * this fetch yet, so this thread may touch its I/O-thread fields) */
        char msg[512];
        sf_status st = SF_OK;
        if (o->size != SF_SIZE_UNKNOWN)
            st = fetch_layout(e, f, o->size, msg, sizeof(msg));
        else {
            f->size = SF_SIZE_UNKNOWN;
            f->total = 0;
            f->n_ranges = 0;
        }
        if (st != SF_OK) {
            snprintf(err, err_len, "%s", msg);
            sf_fetch_destroy(f);
            return st;
        }
        if (f->total == 0) {
            f->s_total = 0;
            f->s_done = 1;
            f->released = 1;
            f->e = NULL;
            *out = f;
            return SF_OK;
        }
    } else {
        /* the probe is the head range of the layout to come */
        uint64_t first = f->first_bytes;
        uint64_t len = o->length != SF_SIZE_UNKNOWN && o->length < first ? o->length : first;
        f->head.first = o->offset;
        f->head.last = o->offset + len - 1;
    }
    pthread_mutex_lock(&e->lock);
    int down = e->shutdown;
    if (!down) {
        f->next_incoming = e->incoming_fetches;
        e->incoming_fetches = f;
    }
    pthread_mutex_unlock(&e->lock);
    if (down) {
        f->released = 1;
        f->e = NULL;
        sf_fetch_destroy(f);
        snprintf(err, err_len, "client is shutting down");
        return SF_ERR_CANCELLED;
    }
    wake_all(e);
    *out = f;
    return SF_OK;
}

sf_status sf__fetch_new_done(const struct sf_fetch_options *o, uint64_t object_size, uint64_t total,
                             sf_status st, const char *msg, void *owned_buffer,
                             struct sf_fetch **out)
{
    struct sf_fetch *f = fetch_alloc(o);
    if (!f) {
        free(owned_buffer);
        return SF_ERR_NO_MEMORY;
    }
    if (owned_buffer) {
        f->buf = owned_buffer;
        f->owns_buf = 1;
        f->buf_bytes = total;
    }
    f->total = total;
    f->s_total = total;
    f->s_size = object_size;
    f->s_contiguous = st == SF_OK ? total : 0;
    f->s_received = f->s_contiguous;
    f->s_done = 1;
    f->s_status = st;
    f->released = 1;
    if (msg)
        snprintf(f->errmsg, sizeof(f->errmsg), "%s", msg);
    *out = f;
    return SF_OK;
}

void sf__engine_stats(struct sf__engine *e, struct sf_s3_stats *out)
{
    pthread_mutex_lock(&e->lock);
    *out = e->stats;
    pthread_mutex_unlock(&e->lock);
}

/* ------------------------------------------------------------ sf_fetch */

SF_API void sf_fetch_options_init_default(struct sf_fetch_options *o)
{
    memset(o, 0, sizeof(*o));
    o->fd = -1;
    o->length = SF_SIZE_UNKNOWN;
    o->size = SF_SIZE_UNKNOWN;
}

static void fill_progress(struct sf_fetch *f, struct sf_fetch_progress *p)
{
    p->total = f->s_total;
    p->object_size = f->s_size;
    p->contiguous = f->s_contiguous;
    p->received = f->s_received;
    p->requests = f->s_requests;
    p->retries = f->s_retries;
    p->done = f->s_done;
    p->status = f->s_status;
}

SF_API void sf_fetch_progress(struct sf_fetch *f, struct sf_fetch_progress *p)
{
    pthread_mutex_lock(&f->lock);
    fill_progress(f, p);
    pthread_mutex_unlock(&f->lock);
}

SF_API sf_status sf_fetch_wait(struct sf_fetch *f, unsigned long long min_contiguous,
                               int timeout_ms, struct sf_fetch_progress *p)
{
    struct timespec deadline;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    sf_status st = SF_OK;
    pthread_mutex_lock(&f->lock);
    if (!f->s_done && f->s_contiguous < min_contiguous) {
        f->s_waiters++;
        if (f->s_waiters == 1 || min_contiguous < f->s_wait_min)
            f->s_wait_min = min_contiguous;
        while (!f->s_done && f->s_contiguous < min_contiguous) {
            if (timeout_ms < 0) {
                pthread_cond_wait(&f->cond, &f->lock);
            } else if (pthread_cond_timedwait(&f->cond, &f->lock, &deadline) == ETIMEDOUT) {
                break;
            }
        }
        f->s_waiters--;
        /* The others' thresholds are not known: wake them on any progress. */
        f->s_wait_min = 0;
    }
    if (f->s_done)
        st = f->s_status;
    else if (f->s_contiguous < min_contiguous)
        st = SF_ERR_TIMEOUT;
    if (p)
        fill_progress(f, p);
    pthread_mutex_unlock(&f->lock);
    return st;
}

SF_API void sf_fetch_set_priority(struct sf_fetch *f, int priority)
{
    struct sf__engine *e = f->e;
    if (!e)
        return; /* finished when it was created (local file, empty range) */
    pthread_mutex_lock(&e->lock);
    f->prio_req = priority != 0;
    e->prio_pending = 1;
    pthread_mutex_unlock(&e->lock);
    wake_all(e);
}

SF_API void *sf_fetch_data(struct sf_fetch *f)
{
    pthread_mutex_lock(&f->lock);
    void *d = f->owns_buf && f->s_total != SF_SIZE_UNKNOWN ? f->buf : NULL;
    pthread_mutex_unlock(&f->lock);
    return d;
}

SF_API const char *sf_fetch_etag(struct sf_fetch *f)
{
    return f->s_etag;
}

SF_API const char *sf_fetch_errmsg(struct sf_fetch *f)
{
    return f->errmsg;
}

SF_API void sf_fetch_destroy(struct sf_fetch *f)
{
    if (!f)
        return;
    struct sf__engine *e = f->e;
    if (e) {
        pthread_mutex_lock(&f->lock);
        int released = f->released;
        pthread_mutex_unlock(&f->lock);
        if (!released) {
            pthread_mutex_lock(&e->lock);
            f->cancel = 1;
            e->cancel_pending = 1;
            pthread_mutex_unlock(&e->lock);
            wake_all(e);
            pthread_mutex_lock(&f->lock);
            while (!f->released)
                pthread_cond_wait(&f->cond, &f->lock);
            pthread_mutex_unlock(&f->lock);
        }
    }
    if (f->owns_buf)
        free(f->buf);
    free(f->rest);
    sf__locator_free(&f->loc);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->data_lock);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

unsigned long long sf__engine_io_loops(struct sf__engine *e)
{
    pthread_mutex_lock(&e->sched);
    unsigned long long n = 0;
    for (unsigned i = 0; i < e->n_workers; i++)
        n += e->workers[i].loops;
    pthread_mutex_unlock(&e->sched);
    return n;
}

unsigned sf__fetch_io_threads_used(struct sf_fetch *f)
{
    pthread_mutex_lock(&f->lock);
    uint64_t m = f->workers_used;
    pthread_mutex_unlock(&f->lock);
    unsigned n = 0;
    for (; m; m &= m - 1)
        n++;
    return n;
}
