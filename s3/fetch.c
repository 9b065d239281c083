/*
 * The fetch engine. One I/O thread owns the curl multi handle and everything
 * marked "I/O thread" below; other threads hand work over through the
 * engine's `incoming` lists (under e->lock) and wake the thread with
 * curl_multi_wakeup(). Each fetch publishes its progress under its own lock.
 */
#include "s3/fetch.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define MAX_ERROR_BODY     (64u * 1024)
#define EASY_BUFFER_SIZE   (512L * 1024)
#define SUCCESS_RING       4096 /* successes remembered for the 1 s rate estimate */
#define RATE_BETA          0.7  /* new send rate = beta * measured rate, on throttling */
#define RATE_UNLIMITED_RPS 5000.0
#define RATE_ENGAGE_NS     (5ull * 1000 * 1000 * 1000)
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
    AB_CHANGED
};

struct call;

/* One logical request: a range of a fetch, or a call. I/O thread only. */
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
    uint64_t start_ns; /* when the current attempt started */
    enum xfer_state state;
    struct xfer *next_wait;
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

    /* I/O thread */
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
};

struct sf__engine {
    struct sf__engine_config cfg;
    char *ca_bundle;
    CURLM *multi;
    pthread_t thread;
    int thread_started;

    /* under lock */
    pthread_mutex_t lock;
    struct sf_fetch *incoming_fetches;
    struct call *incoming_calls;
    int shutdown;
    int cancel_pending;
    int prio_pending; /* some fetch's prio_req changed */
    struct sf_s3_stats stats;

    /* I/O thread */
    struct sf_fetch *active;
    struct xfer *waiting;
    unsigned in_flight;
    double cwnd;
    uint64_t last_decrease_ns;
    /* client-side rate limit, on only after throttling (send_rps 0 = off) */
    double send_rps;
    double bucket;
    uint64_t bucket_ns;
    uint64_t *successes; /* ring of success times, for the trailing-second rate */
    size_t succ_head, succ_count;
    unsigned tokens;
    CURL **idle;
    size_t n_idle;
    unsigned char **stages; /* free STAGE_BYTES buffers, at most cfg.concurrency */
    size_t n_stages;
    uint64_t rng;
    int64_t clock_skew_s;
};

/* ------------------------------------------------------------ helpers */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

static uint64_t rng_next(struct sf__engine *e)
{
    /* xorshift64*: jitter only, not security */
    uint64_t x = e->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    e->rng = x;
    return x * 0x2545F4914F6CDD1Dull;
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

static void publish_progress(struct sf_fetch *f)
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
    pthread_mutex_lock(&f->lock);
    int changed = contiguous != f->s_contiguous;
    f->s_contiguous = contiguous;
    /* A reader waiting for the next sample is woken once, not for every
     * 16 KiB callback of curl. */
    if (changed && f->s_waiters && contiguous >= f->s_wait_min)
        pthread_cond_broadcast(&f->cond);
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

static unsigned char *stage_get(struct sf__engine *e)
{
    if (e->n_stages > 0)
        return e->stages[--e->n_stages];
    return malloc(STAGE_BYTES);
}

static void stage_put(struct sf__engine *e, unsigned char *b)
{
    if (!b)
        return;
    if (e->n_stages < e->cfg.concurrency)
        e->stages[e->n_stages++] = b;
    else
        free(b);
}

/* Readers wait on this range: it holds the end of the contiguous prefix. */
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
    x->got += n;
    pthread_mutex_lock(&f->lock);
    f->s_received += n;
    pthread_mutex_unlock(&f->lock);
    if (f->on_data)
        f->on_data(f->on_data_user, at, placed, n);
    if (is_frontier(x))
        publish_progress(f);
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
        x->stage = stage_get(x->e);
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
    uint64_t now = mono_ns();
    /* bytes moved either way: an upload progresses while nothing comes back */
    curl_off_t moved = dlnow + ulnow;
    if (moved != x->last_dlnow) {
        x->last_dlnow = moved;
        x->last_progress_ns = now;
        return 0;
    }
    unsigned stall_ms = x->e->cfg.stall_timeout_ms;
    if (stall_ms && now - x->last_progress_ns > (uint64_t)stall_ms * 1000000ull) {
        set_abort(x, AB_STALL, "no data for %u ms", stall_ms);
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

static CURL *get_easy(struct sf__engine *e)
{
    if (e->n_idle > 0)
        return e->idle[--e->n_idle];
    return curl_easy_init();
}

static void put_easy(struct sf__engine *e, CURL *h)
{
    if (!h)
        return;
    if (e->n_idle < (size_t)e->cfg.concurrency * 2 + 4) {
        curl_easy_reset(h);
        e->idle[e->n_idle++] = h;
    } else {
        curl_easy_cleanup(h);
    }
}

static void attempt_release(struct sf__engine *e, struct xfer *x)
{
    if (x->easy) {
        curl_multi_remove_handle(e->multi, x->easy);
        put_easy(e, x->easy);
        x->easy = NULL;
        e->in_flight--;
    }
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
    sf__strbuf_free(&x->errbody);
    /* Bytes still gathered here were never written: they do not count in
     * got, so a later attempt asks for them again. */
    stage_put(e, x->stage);
    x->stage = NULL;
    x->staged = 0;
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
    CURL *h = get_easy(e);
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
    x->last_progress_ns = mono_ns();
    x->attempt_bytes = 0;
    sf__strbuf_init(&x->errbody, MAX_ERROR_BODY + 1);
    x->ranged = spec.range_first != SF__NO_RANGE;

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
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)e->cfg.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    if (e->cfg.stall_timeout_ms) {
        /* Backstop for on_progress, and it makes curl revisit idle transfers
         * every second, which is what lets on_progress see a stall. */
        long secs = (long)((e->cfg.stall_timeout_ms + 999) / 1000);
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
    if (curl_multi_add_handle(e->multi, h) != CURLM_OK) {
        put_easy(e, h);
        x->easy = NULL;
        snprintf(x->last_msg, sizeof(x->last_msg), "curl_multi_add_handle failed");
        return SF_ERR_INTERNAL;
    }
    x->attempts++;
    x->start_ns = mono_ns();
    x->state = X_RUNNING;
    e->in_flight++;
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

/* The fetch ends (success, failure or cancel): stop its transfers, publish. */
static void fetch_finish(struct sf__engine *e, struct sf_fetch *f, sf_status st, const char *msg)
{
    if (f->finished)
        return;
    f->finished = 1;
    for (size_t i = 0; i < (f->n_ranges ? f->n_ranges : 1); i++) {
        struct xfer *x = range_at(f, i);
        if (x->state == X_RUNNING) {
            attempt_release(e, x);
            x->state = X_IDLE;
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
    pthread_mutex_lock(&f->lock);
    f->s_done = 1;
    f->s_status = st;
    if (msg)
        snprintf(f->errmsg, sizeof(f->errmsg), "%s", msg);
    f->released = 1;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
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

/* Successful answers in the last second (at most SUCCESS_RING). */
static size_t successes_last_second(struct sf__engine *e, uint64_t now)
{
    while (e->succ_count > 0) {
        size_t oldest = (e->succ_head + SUCCESS_RING - e->succ_count) % SUCCESS_RING;
        if (now - e->successes[oldest] <= 1000000000ull)
            break;
        e->succ_count--;
    }
    return e->succ_count;
}

static void publish_limits(struct sf__engine *e)
{
    pthread_mutex_lock(&e->lock);
    e->stats.concurrency_limit = (unsigned)e->cwnd;
    e->stats.retry_tokens = e->tokens;
    pthread_mutex_unlock(&e->lock);
}

/*
 * A throttling answer: halve the in-flight window. Once per generation: only
 * an answer to a request started after the last decrease counts, so one
 * burst of 503s decreases once. When throttling goes on (a second decrease
 * within RATE_ENGAGE_NS), also cap the request rate at RATE_BETA times what
 * the server accepted over the last second; a lone 503 does not.
 */
static void throttle_decrease(struct sf__engine *e, const struct xfer *x)
{
    uint64_t now = mono_ns();
    if (x->start_ns < e->last_decrease_ns)
        return;
    int persistent = e->last_decrease_ns && now - e->last_decrease_ns < RATE_ENGAGE_NS;
    e->last_decrease_ns = now;
    double before = e->cwnd;
    e->cwnd = e->cwnd / 2 < 1 ? 1 : e->cwnd / 2;
    if (!persistent && e->send_rps <= 0) {
        elog(e, SF_LOG_INFO, "throttled: in-flight limit %.0f -> %.0f", before, e->cwnd);
        publish_limits(e);
        return;
    }
    double measured = (double)successes_last_second(e, now);
    if (e->send_rps > 0 && e->send_rps < measured)
        measured = e->send_rps;
    double rps = RATE_BETA * measured;
    e->send_rps = rps < 1 ? 1 : rps;
    e->bucket = 0;
    e->bucket_ns = now;
    elog(e, SF_LOG_INFO, "throttled: in-flight limit %.0f -> %.0f, request rate %.1f/s", before,
         e->cwnd, e->send_rps);
    publish_limits(e);
}

static void success_credit(struct sf__engine *e, struct xfer *x)
{
    unsigned refund = x->tokens_held ? x->tokens_held : 1;
    e->tokens = e->tokens + refund > e->cfg.retry_quota ? e->cfg.retry_quota : e->tokens + refund;
    x->tokens_held = 0;
    uint64_t now = mono_ns();
    e->successes[e->succ_head] = now;
    e->succ_head = (e->succ_head + 1) % SUCCESS_RING;
    if (e->succ_count < SUCCESS_RING)
        e->succ_count++;
    /* grow back slowly: the window by one per window of successes, the
     * rate by about one request/s per second */
    if (e->cwnd < e->cfg.concurrency) {
        e->cwnd += 1.0 / e->cwnd;
        if (e->cwnd > e->cfg.concurrency)
            e->cwnd = e->cfg.concurrency;
    }
    if (e->send_rps > 0) {
        double step = 1.0 / e->send_rps;          /* about +1/s ... */
        e->send_rps += step > 0.05 ? step : 0.05; /* ... or +5 %/s when fast */
        if (e->send_rps > RATE_UNLIMITED_RPS)
            e->send_rps = 0;
    }
    publish_limits(e);
}

/* The rate limiter lets one more request start now. */
static int rate_allows(struct sf__engine *e, uint64_t now)
{
    if (e->send_rps <= 0)
        return 1;
    double cap = e->send_rps / 10 < 1 ? 1 : e->send_rps / 10;
    e->bucket += (double)(now - e->bucket_ns) / 1e9 * e->send_rps;
    e->bucket_ns = now;
    if (e->bucket > cap)
        e->bucket = cap;
    if (e->bucket < 1)
        return 0;
    e->bucket -= 1;
    return 1;
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
    if (!retry) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s%s: %s", xfer_name(x), rng_txt, why);
        fail_xfer(e, x, st, msg);
        return;
    }
    if (x->attempts >= e->cfg.max_attempts) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s%s: %s (gave up after %u attempts)", xfer_name(x), rng_txt,
                 why, x->attempts);
        fail_xfer(e, x, st, msg);
        return;
    }
    unsigned cost = st == SF_ERR_TIMEOUT ? 10 : 5;
    if (e->tokens < cost) {
        char msg[1024];
        snprintf(msg, sizeof(msg),
                 "%s%s: %s (retry quota exhausted: the server keeps failing, not retrying)",
                 xfer_name(x), rng_txt, why);
        fail_xfer(e, x, st, msg);
        return;
    }
    e->tokens -= cost;
    x->tokens_held += cost;
    unsigned base = retry == 2 ? e->cfg.throttle_base_ms : e->cfg.retry_base_ms;
    if (retry == 2)
        throttle_decrease(e, x);
    unsigned shift = x->attempts - 1 < 30 ? x->attempts - 1 : 30;
    uint64_t ceiling = (uint64_t)base << shift;
    if (ceiling > e->cfg.retry_cap_ms)
        ceiling = e->cfg.retry_cap_ms;
    uint64_t delay_ms = ceiling ? rng_next(e) % (ceiling + 1) : 0;
    elog(e, SF_LOG_WARN, "%s%s: %s; retry %u in %" PRIu64 " ms", xfer_name(x), rng_txt, why,
         x->attempts, delay_ms);
    x->due_ns = mono_ns() + delay_ms * 1000000ull;
    x->state = X_WAITING;
    x->next_wait = e->waiting;
    e->waiting = x;
    pthread_mutex_lock(&e->lock);
    e->stats.retry_tokens = e->tokens;
    pthread_mutex_unlock(&e->lock);
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
    success_credit(e, x);
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

static void start_or_fail(struct sf__engine *e, struct xfer *x)
{
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

/*
 * Starts what may start now, in this order: due retries and calls of
 * priority fetches, their new ranges, then the same for the other fetches;
 * within a group oldest fetch first, lowest offset first. Returns 0 when the
 * rate limiter says stop.
 */
static int schedule_group(struct sf__engine *e, uint64_t now, unsigned limit, int prio)
{
    for (struct xfer **pp = &e->waiting; *pp && e->in_flight < limit;) {
        struct xfer *x = *pp;
        if (x->due_ns <= now && in_group(x, prio)) {
            if (!rate_allows(e, now))
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
    for (struct sf_fetch *f = e->active; f && e->in_flight < limit;) {
        struct sf_fetch *next = f->next_active;
        if (f->prio != prio) {
            f = next;
            continue;
        }
        if (f->n_ranges == 0) {
            if (f->next_start == 0) {
                if (!rate_allows(e, now))
                    return 0;
                f->next_start = 1;
                start_or_fail(e, &f->head);
            }
        } else {
            while (f->next_start < f->n_ranges && e->in_flight < limit && !f->finished) {
                if (!rate_allows(e, now))
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

static void schedule(struct sf__engine *e)
{
    uint64_t now = mono_ns();
    unsigned limit = (unsigned)e->cwnd;
    if (limit < 1)
        limit = 1;
    if (schedule_group(e, now, limit, 1))
        schedule_group(e, now, limit, 0);
}

static int next_timeout_ms(struct sf__engine *e)
{
    uint64_t now = mono_ns();
    int t = 1000;
    if (e->send_rps > 0 && e->bucket < 1) {
        int ms = (int)((1 - e->bucket) / e->send_rps * 1000) + 1;
        if (ms < t)
            t = ms;
    }
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

static void *io_main(void *arg)
{
    struct sf__engine *e = arg;
    int shutdown = 0;
    while (!shutdown) {
        take_incoming(e, &shutdown);
        if (shutdown)
            break;
        schedule(e);
        int running = 0;
        curl_multi_perform(e->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(e->multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            struct xfer *x = NULL;
            CURL *h = m->easy_handle;
            CURLcode code = m->data.result;
            curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&x);
            if (x && x->easy == h)
                attempt_done(e, x, code);
        }
        schedule(e);
        curl_multi_poll(e->multi, NULL, 0, next_timeout_ms(e), NULL);
    }
    /* shutdown: cancel whatever is left */
    while (e->active)
        fetch_finish(e, e->active, SF_ERR_CANCELLED, "client destroyed");
    while (e->waiting) {
        struct xfer *x = e->waiting;
        e->waiting = x->next_wait;
        if (x->call)
            call_finish(x->call, SF_ERR_CANCELLED, "client destroyed");
    }
    return NULL;
}

/* ------------------------------------------------------------ public-ish API */

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
    e->cwnd = e->cfg.concurrency;
    e->tokens = e->cfg.retry_quota;
    e->stats.concurrency_limit = e->cfg.concurrency;
    e->stats.retry_tokens = e->tokens;
    e->rng = (uint64_t)mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)e;
    if (!e->rng)
        e->rng = 0x9E3779B97F4A7C15ull;
    e->idle = calloc((size_t)e->cfg.concurrency * 2 + 4, sizeof(CURL *));
    e->successes = calloc(SUCCESS_RING, sizeof(*e->successes));
    e->stages = calloc(e->cfg.concurrency, sizeof(*e->stages));
    pthread_mutex_init(&e->lock, NULL);
    e->multi = curl_multi_init();
    if (!e->idle || !e->multi || !e->successes || !e->stages) {
        sf__engine_destroy(e);
        return SF_ERR_NO_MEMORY;
    }
    curl_multi_setopt(e->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)e->cfg.concurrency);
    curl_multi_setopt(e->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)e->cfg.concurrency);
    curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, (long)e->cfg.concurrency * 2);
    curl_multi_setopt(e->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    if (pthread_create(&e->thread, NULL, io_main, e) != 0) {
        if (err && err_len)
            snprintf(err, err_len, "cannot start the I/O thread");
        sf__engine_destroy(e);
        return SF_ERR_INTERNAL;
    }
    e->thread_started = 1;
    *out = e;
    return SF_OK;
}

void sf__engine_destroy(struct sf__engine *e)
{
    if (!e)
        return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->lock);
        e->shutdown = 1;
        pthread_mutex_unlock(&e->lock);
        curl_multi_wakeup(e->multi);
        pthread_join(e->thread, NULL);
    }
    for (size_t i = 0; i < e->n_idle; i++)
        curl_easy_cleanup(e->idle[i]);
    free(e->idle);
    free(e->successes);
    for (size_t i = 0; i < e->n_stages; i++)
        free(e->stages[i]);
    free(e->stages);
    if (e->multi)
        curl_multi_cleanup(e->multi);
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
        curl_multi_wakeup(e->multi);
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
    curl_multi_wakeup(e->multi);
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
    curl_multi_wakeup(e->multi);
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
            curl_multi_wakeup(e->multi);
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
    pthread_mutex_destroy(&f->lock);
    free(f);
}
