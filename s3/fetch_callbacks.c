/*
 * curl's callbacks for the fetch engine: response headers, body bytes
 * into the destination, progress and stalls, request bodies. They run on
 * the worker that owns the attempt (s3/fetch_internal.h).
 */
#include "s3/fetch_internal.h"
#include "common/clock.h"
#include "s3/etag.h"
#include "common/io.h"
#include "common/text.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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
        sf_status st = sf__fetch_layout(f->e, f, x->cr_total, msg, sizeof(msg));
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

size_t sf__on_header(char *buf, size_t size, size_t nitems, void *ud)
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
        x->bucket_region[0] = '\0';
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
    size_t name_len, vn;
    const char *v;
    if (!sf__split_at(buf, n, ':', &name_len, &v, &vn))
        return n;
    char val[512];
    copy_trimmed(val, sizeof(val), v, vn);
#define IS(h) (name_len == sizeof(h) - 1 && strncasecmp(buf, h, name_len) == 0)
    if (IS("etag")) {
        sf__etag_canon(x->etag, sizeof(x->etag), v, vn);
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
    } else if (IS("x-amz-bucket-region")) {
        copy_trimmed(x->bucket_region, sizeof(x->bucket_region), v, vn);
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

void sf__stage_put(struct worker *w, unsigned char *b)
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
    return f->contig_idx < f->n_ranges && sf__range_at((struct sf_fetch *)f, f->contig_idx) == x;
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
        size_t done;
        int rc = sf__pwrite_full(f->fd, data, n, f->file_offset + dest, &done);
        if (rc) {
            set_abort(x, AB_IO, "write at file offset %" PRIu64 ": %s",
                      f->file_offset + dest + done, rc < 0 ? strerror(errno) : "no progress");
            return -1;
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
        sf__publish_locked(f);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

/* Writes what the range has gathered. */
int sf__stage_flush(struct xfer *x)
{
    if (!x->staged)
        return 0;
    size_t n = x->staged;
    x->staged = 0;
    return dest_put(x, x->stage, n);
}

size_t sf__on_write(char *data, size_t size, size_t nmemb, void *ud)
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
    uint64_t len = sf__xfer_len(x);
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
        if ((x->staged == STAGE_BYTES || x->got + x->staged == len) && sf__stage_flush(x) != 0)
            return CURL_WRITEFUNC_ERROR;
    }
    return n;
}

int sf__on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
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
    const struct sf_s3_options *c = &x->e->cfg.opt;
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
size_t sf__on_read(char *buf, size_t size, size_t nitems, void *ud)
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
int sf__on_seek(void *ud, curl_off_t offset, int origin)
{
    struct xfer *x = ud;
    if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > x->call->body->len)
        return CURL_SEEKFUNC_FAIL;
    x->body_pos = (uint64_t)offset;
    return CURL_SEEKFUNC_OK;
}
