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
 *    new work, handles finished transfers (sf__attempt_done and the policy it
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
 *
 * The engine's files: s3/fetch.c (the fetch object and its API:
 * sf__engine_fetch, layout, wait, progress, data, destroy),
 * s3/fetch_engine.c (engine new/destroy, the I/O threads and the
 * scheduler), s3/fetch_xfer.c (one attempt of a request: the curl easy
 * setup, completion, retries, aborts, error mapping), s3/fetch_callbacks.c
 * (curl's callbacks: headers, body bytes into the destination, progress
 * and stalls, request bodies), s3/fetch_policy.c (retry, backoff and
 * throttle policy). Functions one file lends another are declared at the
 * end of this header, with the sf__ prefix.
 */
#ifndef SF_S3_FETCH_INTERNAL_H
#define SF_S3_FETCH_INTERNAL_H

#include "s3/fetch.h"
#include "s3/fetch_policy.h"
#include "common/text.h"

#include <pthread.h>
#include <stdint.h>

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
    char bucket_region[64]; /* x-amz-bucket-region of the answer, "" when none */
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
    int socket_errno;  /* why the attempt's last socket() failed (s3/socket.h), 0: none */
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

/* defined in s3/fetch.c */
uint64_t sf__xfer_len(const struct xfer *x);
struct xfer *sf__range_at(struct sf_fetch *f, size_t i);
void sf__publish_locked(struct sf_fetch *f);
void sf__publish_progress(struct sf_fetch *f);
sf_status sf__fetch_layout(struct sf__engine *e, struct sf_fetch *f, uint64_t size, char *msg,
                           size_t msg_len);

/* defined in s3/fetch_callbacks.c */
size_t sf__on_header(char *buf, size_t size, size_t nitems, void *ud);
void sf__stage_put(struct worker *w, unsigned char *b);
int sf__stage_flush(struct xfer *x);
size_t sf__on_write(char *data, size_t size, size_t nmemb, void *ud);
int sf__on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                    curl_off_t ulnow);
size_t sf__on_read(char *buf, size_t size, size_t nitems, void *ud);
int sf__on_seek(void *ud, curl_off_t offset, int origin);

/* defined in s3/fetch_engine.c */
void sf__wake_all(struct sf__engine *e);

/* defined in s3/fetch_xfer.c */
/* x's object for a message, into buf (SF__MSG_NAME_BYTES), shortened by
 * sf__msg_name() (common/text.h). Returns buf. */
const char *sf__xfer_name(const struct xfer *x, char *buf);
size_t sf__idle_cap(const struct sf__engine *e);
sf_status sf__attempt_start(struct sf__engine *e, struct xfer *x);
void sf__fetch_finish(struct sf__engine *e, struct sf_fetch *f, sf_status st, const char *msg);
void sf__release_doomed(struct sf__engine *e, struct worker *w);
void sf__call_finish(struct call *c, sf_status st, const char *msg);
void sf__fail_xfer(struct sf__engine *e, struct xfer *x, sf_status st, const char *msg);
void sf__attempt_done(struct sf__engine *e, struct xfer *x, CURLcode code);

#endif
