/*
 * One request of the fetch engine: starting an attempt (curl easy setup),
 * its completion, retries and failures, and the mapping of HTTP errors.
 * The locks are described in s3/fetch_internal.h.
 */
#include "s3/fetch_internal.h"
#include "s3/socket.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/text.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

__attribute__((format(printf, 3, 4))) static void
elog(struct sf__engine *e, enum sf_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sf__vlog(e->cfg.opt.log, e->cfg.opt.log_user, e->cfg.opt.log_level, level, fmt, ap);
    va_end(ap);
}

const char *sf__xfer_name(const struct xfer *x, char *buf)
{
    return sf__msg_name(x->f ? x->f->loc.display : x->call->loc->display, buf);
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

/* ------------------------------------------------------------ attempts */

size_t sf__idle_cap(const struct sf__engine *e)
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
    if (w->n_idle < sf__idle_cap(w->e)) {
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
    sf__stage_put(x->w, x->stage);
    x->stage = NULL;
    x->staged = 0;
}

/* The connect limit of an attempt: connect_timeout_ms, or less when the
 * request's no-answer budget (request_timeout_ms) ends sooner. */
static unsigned attempt_connect_ms(const struct sf__engine *e, const struct xfer *x, uint64_t now)
{
    unsigned ms = e->cfg.opt.connect_timeout_ms;
    uint64_t rt_ns = (uint64_t)e->cfg.opt.request_timeout_ms * 1000000ull;
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
sf_status sf__attempt_start(struct sf__engine *e, struct xfer *x)
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
    x->bucket_region[0] = '\0';
    x->content_length = SF_SIZE_UNKNOWN;
    x->last_modified = 0;
    x->server_date = 0;
    x->abort = AB_NONE;
    x->abort_msg[0] = '\0';
    x->errbuf[0] = '\0';
    x->socket_errno = 0;
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
                     e->cfg.opt.http2 ? (long)CURL_HTTP_VERSION_2TLS : (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)attempt_connect_ms(e, x, now0));
    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, sf__socket_open);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, &x->socket_errno);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, sf__on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sf__on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, sf__on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    if (e->cfg.opt.stall_timeout_ms || e->cfg.opt.first_byte_timeout_ms ||
        e->cfg.opt.request_timeout_ms) {
        /* Backstop for sf__on_progress, and it makes curl revisit idle transfers
         * every second, which is what lets sf__on_progress see a stall or a
         * silent server. */
        unsigned longest = e->cfg.opt.stall_timeout_ms;
        if (e->cfg.opt.first_byte_timeout_ms > longest)
            longest = e->cfg.opt.first_byte_timeout_ms;
        if (!longest)
            longest = e->cfg.opt.request_timeout_ms;
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
    if (e->cfg.opt.insecure) {
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
        curl_easy_setopt(h, CURLOPT_READFUNCTION, sf__on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, sf__on_seek);
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
void sf__fetch_finish(struct sf__engine *e, struct sf_fetch *f, sf_status st, const char *msg)
{
    if (f->finished)
        return;
    f->finished = 1;
    for (size_t i = 0; i < (f->n_ranges ? f->n_ranges : 1); i++) {
        struct xfer *x = sf__range_at(f, i);
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
        sf__publish_progress(f);
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
void sf__release_doomed(struct sf__engine *e, struct worker *w)
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

void sf__call_finish(struct call *c, sf_status st, const char *msg)
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

void sf__fail_xfer(struct sf__engine *e, struct xfer *x, sf_status st, const char *msg)
{
    x->state = X_DONE;
    if (x->f) {
        /* A missing object is often expected (index.json beside plain
         * WebDataset shards); the caller reports it if it is an error. */
        elog(e, st == SF_ERR_NOT_FOUND ? SF_LOG_INFO : SF_LOG_ERROR, "%s", msg);
        sf__fetch_finish(e, x->f, st, msg);
    } else {
        sf__call_finish(x->call, st, msg);
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
    char name[SF__MSG_NAME_BYTES];
    sf__xfer_name(x, name);
    if (!retry) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s%s: %s", name, rng_txt, why);
        sf__fail_xfer(e, x, st, msg);
        return;
    }
    uint64_t delay_ms = 0;
    enum sf__retry_refusal r =
        sf__policy_retry(&e->policy, x->attempts, oc, v, &x->tokens_held, &delay_ms);
    if (r != SF__RETRY_OK) {
        char msg[1024];
        if (r == SF__RETRY_MAX_ATTEMPTS)
            snprintf(msg, sizeof(msg), "%s%s: %s (gave up after %u attempts)", name, rng_txt, why,
                     x->attempts);
        else
            snprintf(msg, sizeof(msg),
                     "%s%s: %s (retry quota exhausted: the server keeps failing, not retrying)",
                     name, rng_txt, why);
        publish_limits(e);
        sf__fail_xfer(e, x, st, msg);
        return;
    }
    uint64_t rt_ns = (uint64_t)e->cfg.opt.request_timeout_ms * 1000000ull;
    uint64_t now = sf__now_ns();
    if (rt_ns && x->quiet_since_ns && now + delay_ms * 1000000ull - x->quiet_since_ns >= rt_ns) {
        char msg[1024];
        snprintf(msg, sizeof(msg),
                 "%s%s: %s; no answer from %s for %u ms (request_timeout_ms, %u attempts)", name,
                 rng_txt, why, x->origin, e->cfg.opt.request_timeout_ms, x->attempts);
        publish_limits(e);
        sf__fail_xfer(e, x, SF_ERR_TIMEOUT, msg);
        return;
    }
    elog(e, SF_LOG_WARN, "%s%s: %s; retry %u in %" PRIu64 " ms", name, rng_txt, why, x->attempts,
         delay_ms);
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

/* Appends where the answer says the bucket is, when that is not where the
 * request was signed for. A request signed for the wrong region (or sent to
 * another region's endpoint) gets 301 PermanentRedirect or 400
 * AuthorizationHeaderMalformed from S3, the bucket's region in
 * x-amz-bucket-region (all a HEAD answer carries) or <Region>. The request
 * is never re-sent elsewhere: it was signed for this region and host. */
static void append_where(const struct sf__engine *e, const struct xfer *x,
                         const struct sf__s3_error *s3e, char *out, size_t n)
{
    const char *region = x->bucket_region[0] ? x->bucket_region : s3e->region;
    size_t l = strlen(out);
    const struct sf__locator *loc = x->f ? &x->f->loc : x->call->loc;
    if (loc->kind == SF__LOC_S3 && region[0] && strcmp(region, e->cfg.region) != 0)
        snprintf(out + l, n - l,
                 "; the bucket is in region '%s', the request was signed for '%s': set the "
                 "region to '%s' (region option, --region, AWS_REGION or the profile's region)",
                 region, e->cfg.region, region);
    else if (s3e->endpoint[0])
        snprintf(out + l, n - l, "; the server names the endpoint %s", s3e->endpoint);
}

static void fill_response(struct xfer *x, struct sf__response *r)
{
    r->status = x->status;
    snprintf(r->etag, sizeof(r->etag), "%s", x->etag);
    r->content_length = x->content_length;
    r->last_modified = x->last_modified;
    snprintf(r->request_id, sizeof(r->request_id), "%s", x->request_id);
}

void sf__attempt_done(struct sf__engine *e, struct xfer *x, CURLcode code)
{
    /* What arrived before the end (or the failure) of this attempt is good:
     * write it, so a retry resumes after it. */
    if (x->f && x->staged)
        sf__stage_flush(x);
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
        append_where(e, x, &s3e, why, sizeof(why));
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
            if (sf__fetch_layout(e, x->f, 0, msg, sizeof(msg)) == SF_OK)
                sf__fetch_finish(e, x->f, SF_OK, NULL);
            else
                sf__fetch_finish(e, x->f, SF_ERR_INTERNAL, msg);
            return;
        }
    } else if (code != CURLE_OK) {
        snprintf(why, sizeof(why), "%s%s%s", curl_easy_strerror(code), x->errbuf[0] ? ": " : "",
                 x->errbuf);
        size_t l = strlen(why);
        while (l > 0 && why[l - 1] == '\n')
            why[--l] = '\0';
        sf__socket_why(x->socket_errno, why, sizeof(why));
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
        if (x->got < sf__xfer_len(x)) {
            snprintf(why, sizeof(why), "short body: %" PRIu64 " of %" PRIu64 " bytes", x->got,
                     sf__xfer_len(x));
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
        sf__call_finish(x->call, SF_OK, NULL);
        return;
    }
    struct sf_fetch *f = x->f;
    f->n_done++;
    sf__publish_progress(f);
    if (f->n_done == f->n_ranges)
        sf__fetch_finish(e, f, SF_OK, NULL);
}
