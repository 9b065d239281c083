/*
 * The fetch engine: new/destroy, the I/O threads (io_main), the
 * scheduler that starts requests within the window, and blocking calls.
 * The locks are described in s3/fetch_internal.h.
 */
#include "s3/fetch_internal.h"
#include "common/clock.h"
#include "common/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    sf_status st = sf__attempt_start(e, x);
    if (st != SF_OK) {
        char msg[1024], name[SF__MSG_NAME_BYTES];
        snprintf(msg, sizeof(msg), "%s: %s", sf__xfer_name(x, name), x->last_msg);
        sf__fail_xfer(e, x, st, msg);
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
                struct xfer *x = sf__range_at(f, f->next_start++);
                if (x->state == X_IDLE && x->got < sf__xfer_len(x))
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
                sf__fetch_finish(e, f, SF_ERR_CANCELLED, "cancelled");
            f = next;
        }
    }
}

void sf__wake_all(struct sf__engine *e)
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
        sf__release_doomed(e, w);
        schedule(e);
        sched_unlock(w);
        int running = 0;
        curl_multi_perform(w->multi, &running);
        sched_lock(w);
        sf__release_doomed(e, w);
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
                sf__attempt_done(e, x, code);
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
    unsigned n = sf__cores_available();
    return n > SF__IO_THREADS_DEFAULT_MAX ? SF__IO_THREADS_DEFAULT_MAX : n;
}

sf_status sf__engine_new(const struct sf__engine_config *c, struct sf__engine **out, char *err,
                         size_t err_len)
{
    *out = NULL;
    struct sf__engine *e = calloc(1, sizeof(*e));
    if (!e)
        return SF_ERR_NO_MEMORY;
    e->cfg = *c;
    if (e->cfg.opt.concurrency < 1)
        e->cfg.opt.concurrency = 1;
    if (e->cfg.opt.chunk_bytes < 1)
        e->cfg.opt.chunk_bytes = 8u << 20;
    if (e->cfg.opt.max_attempts < 1)
        e->cfg.opt.max_attempts = 1;
    e->ca_bundle = c->opt.ca_bundle ? strdup(c->opt.ca_bundle) : NULL;
    e->cfg.opt.ca_bundle = e->ca_bundle;
    e->stats.concurrency_limit = e->cfg.opt.concurrency;
    e->stats.retry_tokens = e->cfg.opt.retry_quota;
    e->rng = (uint64_t)sf__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)e;
    if (!e->rng)
        e->rng = 0x9E3779B97F4A7C15ull;
    struct sf__policy_config pc = {
        .concurrency = e->cfg.opt.concurrency,
        .max_attempts = e->cfg.opt.max_attempts,
        .retry_base_ms = e->cfg.opt.retry_base_ms,
        .throttle_base_ms = e->cfg.opt.throttle_base_ms,
        .retry_cap_ms = e->cfg.opt.retry_cap_ms,
        .retry_quota = e->cfg.opt.retry_quota,
        /* S3 asks clients to ramp up gradually; from 100/s a rank doubles
         * in about 0.14 s of successes (docs/transport.md, "Slow start") */
        .start_rps = SF__START_RPS,
    };
    int policy_ok = sf__policy_init(&e->policy, &pc, e->rng) == 0;
    /* no more threads than requests in flight: each has a share of them */
    unsigned n = e->cfg.opt.io_threads ? e->cfg.opt.io_threads : 1;
    if (n > e->cfg.opt.concurrency)
        n = e->cfg.opt.concurrency;
    e->share = (e->cfg.opt.concurrency + n - 1) / n;
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
        w->idle = calloc(sf__idle_cap(e), sizeof(CURL *));
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
    sf__wake_all(e);
    for (unsigned i = 0; i < e->n_workers; i++)
        if (e->workers[i].started)
            pthread_join(e->workers[i].thread, NULL);
    /* No worker runs any more: this thread owns every multi handle (e->cur
     * NULL), so cancelling releases every range where it runs. */
    pthread_mutex_lock(&e->sched);
    e->cur = NULL;
    for (unsigned i = 0; i < e->n_workers; i++)
        sf__release_doomed(e, &e->workers[i]);
    while (e->active)
        sf__fetch_finish(e, e->active, SF_ERR_CANCELLED, "client destroyed");
    while (e->waiting) {
        struct xfer *x = e->waiting;
        e->waiting = x->next_wait;
        if (x->call)
            sf__call_finish(x->call, SF_ERR_CANCELLED, "client destroyed");
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
        sf__wake_all(e);
        pthread_mutex_lock(&c.lock);
        while (!c.finished)
            pthread_cond_wait(&c.cond, &c.lock);
        pthread_mutex_unlock(&c.lock);
    }
    pthread_cond_destroy(&c.cond);
    pthread_mutex_destroy(&c.lock);
    return c.status;
}

void sf__engine_stats(struct sf__engine *e, struct sf_s3_stats *out)
{
    pthread_mutex_lock(&e->lock);
    *out = e->stats;
    pthread_mutex_unlock(&e->lock);
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
