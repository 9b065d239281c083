/* The emulated device (contract: gpu_dev.h): what the GPU ring runs on in
 * every test, on machines without a GPU. Not a stub: it keeps the
 * guarantees a CUDA device gives and breaks everything it does not.
 *
 *  - A stream is a worker thread executing its operations in FIFO order,
 *    each after a random delay (0..delay_us), so orderings the ring does not
 *    enforce come out differently from run to run.
 *  - An event is the (stream, sequence number) of its last record: complete
 *    when the stream has executed that far. Waits across streams are queued
 *    operations, as cudaStreamWaitEvent.
 *  - Copies read their source when they execute (as DMA does), in two halves
 *    with a pause between, so a host buffer changed too early shows torn.
 *  - Device memory is a memfd mapped twice: the address handed out is
 *    PROT_NONE, so a host dereference of a device pointer crashes; the
 *    emulator reaches the bytes through a second, private mapping.
 *  - A normalise launch runs the grid it is given, block by block and
 *    thread by thread, through gpu_kernel.h: the output is poisoned first,
 *    every store is counted, and an element not written exactly once, a
 *    store outside the output or an access outside an allocation is a
 *    sticky error (as a kernel fault is on CUDA).
 *  - fail_at makes the Nth operation call fail (at the call, or, with
 *    fail_async, when the queued work runs), so every error branch and
 *    cleanup path of the ring can be driven.
 *
 * This file holds the device, its streams (worker threads), events and the
 * operation table; device memory is in gpu_emu_mem.c, the kernel and its
 * write checks in gpu_emu_kernel.c, the options and SF_GPU_EMULATOR in
 * gpu_emu_config.c (shared declarations: gpu_emu_internal.h).
 */

#include "src/gpu_emu_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

static const char *const emu_names[] = {
    "emu_success",        "emu_not_ready",    "emu_out_of_memory",
    "emu_invalid_value",  "emu_invalid_handle", "emu_illegal_address",
    "emu_injected_failure", "emu_kernel_check_failed", "emu_invalid_device",
};

/* ------------------------------------------------------------------ helpers */

/* Wakes every waiter: some stream completed an operation (or failed). */
static void publish(struct sf__emu *e)
{
    atomic_fetch_add_explicit(&e->gen, 1, memory_order_release);
    syscall(SYS_futex, &e->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Waits until s has completed operation seq, or the device faulted; a
 * faulted device's error is returned even when s got that far (the fault
 * ran before, or the sync's caller could not tell): as on CUDA, every sync
 * after a sticky error returns it. Checking only for the point let a wait
 * for a faulting kernel's done event succeed when the stream skipped past
 * the event before the waiter looked. */
static int wait_done(struct sf__emu *e, struct emu_stream *s, uint64_t seq)
{
    for (;;) {
        uint32_t g = atomic_load_explicit(&e->gen, memory_order_acquire);
        if (atomic_load_explicit(&s->completed, memory_order_acquire) >= seq)
            return e->sticky;
        int sticky = e->sticky;
        if (sticky)
            return sticky;
        /* Bounded: a wake between the load of g and this call makes the
         * futex return at once; the timeout is only a safety net. */
        struct timespec ts = {0, 50 * 1000 * 1000};
        syscall(SYS_futex, &e->gen, FUTEX_WAIT_PRIVATE, g, &ts, NULL, 0);
    }
}

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void pause_random(struct emu_stream *s)
{
    unsigned d = s->e->o.delay_us;
    if (d == 0)
        return;
    unsigned us = (unsigned)(next_rand(&s->rng) % (d + 1u));
    if (us > 0) {
        struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
        nanosleep(&ts, NULL);
    }
}


int sf__emu_fail_locked(struct sf__emu *e, int rc, const char *fmt, ...)
{
    if (e->sticky)
        return e->sticky;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (rc == EMU_ILLEGAL_ADDRESS || rc == EMU_KERNEL_CHECK) {
        e->sticky = rc;
        publish(e);
    }
    return rc;
}

/* Counts an operation call; returns non-zero when it is the one to fail
 * now, and sets *async when it should fail when it runs instead. */
int sf__emu_count_op(struct sf__emu *e, int queued, int *async, unsigned long *number)
{
    pthread_mutex_lock(&e->mu);
    unsigned long n = ++e->ops;
    int rc = e->sticky;
    if (!rc && e->o.fail_at == n) {
        if (queued && e->o.fail_async)
            *async = 1;
        else
            rc = sf__emu_fail_locked(e, EMU_INJECTED, "injected failure of operation %lu", n);
    }
    pthread_mutex_unlock(&e->mu);
    if (number)
        *number = n;
    return rc;
}

/* ------------------------------------------------------------------ streams */

static int run_op(struct emu_stream *s, struct emu_op *op)
{
    struct sf__emu *e = s->e;
    if (op->fail) {
        pthread_mutex_lock(&e->mu);
        int rc = sf__emu_fail_locked(e, EMU_ILLEGAL_ADDRESS,
                             "injected failure of operation %lu, when it ran", op->op_number);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    switch (op->kind) {
    case OP_COPY: {
        pthread_mutex_lock(&e->amu);
        unsigned char *dev = sf__emu_shadow_of(e, op->to_device ? op->dst : op->src, op->bytes);
        pthread_mutex_unlock(&e->amu);
        if (!dev) {
            pthread_mutex_lock(&e->mu);
            int rc = sf__emu_fail_locked(e, EMU_ILLEGAL_ADDRESS,
                                 "copy of %zu bytes: %s outside device memory", op->bytes,
                                 op->to_device ? "destination" : "source");
            pthread_mutex_unlock(&e->mu);
            return rc;
        }
        unsigned char *dst = op->to_device ? dev : op->dst;
        const unsigned char *src = op->to_device ? op->src : dev;
        size_t half = op->bytes / 2;
        memcpy(dst, src, half);
        pause_random(s);
        memcpy(dst + half, src + half, op->bytes - half);
        return 0;
    }
    case OP_KERNEL: return sf__emu_run_kernel(e, &op->launch);
    case OP_RECORD:
        if (atomic_load_explicit(&op->ev->seq, memory_order_relaxed) == op->seq &&
            atomic_load_explicit(&op->ev->s, memory_order_relaxed) == s) {
            atomic_store_explicit(&op->ev->t_ns, sf__now_ns(), memory_order_relaxed);
            atomic_store_explicit(&op->ev->t_seq, op->seq, memory_order_relaxed);
        }
        return 0;
    case OP_WAIT: return wait_done(e, op->ws, op->wseq);
    case OP_FN: op->fn(op->arg); return 0;
    }
    return 0;
}

static void *stream_main(void *arg)
{
    struct emu_stream *s = arg;
    struct sf__emu *e = s->e;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->qcv, &s->qmu);
        struct emu_op *op = s->head;
        if (op) {
            s->head = op->next;
            if (!s->head)
                s->tail = NULL;
        }
        pthread_mutex_unlock(&s->qmu);
        if (!op)
            break;
        if (!e->sticky) { /* a faulted device runs nothing more */
            pause_random(s);
            (void)run_op(s, op);
        }
        atomic_store_explicit(&s->completed, op->seq, memory_order_release);
        publish(e);
        free(op);
    }
    return NULL;
}

static struct emu_stream *find_stream(struct sf__emu *e, void *h)
{
    for (struct emu_stream *s = e->streams; s; s = s->next)
        if ((void *)s == h && !s->dead)
            return s;
    return NULL;
}

static struct emu_event *find_event(struct sf__emu *e, void *h)
{
    for (struct emu_event *v = e->events; v; v = v->next)
        if ((void *)v == h && !v->dead)
            return v;
    return NULL;
}

/* Queues op on stream h (already counted); frees op on failure. */
static int enqueue(struct sf__emu *e, void *h, struct emu_op *op, struct emu_event *record)
{
    pthread_mutex_lock(&e->mu);
    struct emu_stream *s = find_stream(e, h);
    int rc = e->sticky;
    if (!rc && !s)
        rc = sf__emu_fail_locked(e, EMU_INVALID_HANDLE, "no stream %p on the emulated device", h);
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        free(op);
        return rc;
    }
    pthread_mutex_lock(&s->qmu);
    op->seq = ++s->enqueued;
    /* Before the worker can see the record: it checks it is the latest. */
    if (record) {
        atomic_store_explicit(&record->seq, op->seq, memory_order_relaxed);
        atomic_store_explicit(&record->s, s, memory_order_relaxed);
    }
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* Queues op on stream h, unless the call's own checks failed (rc): then
 * frees op and returns rc. */
static int enqueue_unless(struct sf__emu *e, int rc, void *h, struct emu_op *op,
                          struct emu_event *record)
{
    if (rc) {
        free(op);
        return rc;
    }
    return enqueue(e, h, op, record);
}

static struct emu_op *new_op(enum op_kind k, int fail, unsigned long number)
{
    struct emu_op *op = calloc(1, sizeof *op);
    if (op) {
        op->kind = k;
        op->fail = fail;
        op->op_number = number;
    }
    return op;
}

/* Counts a call that queues work and makes its op; NULL with *rc set when
 * the call fails now (injected, sticky) or memory runs out. */
static struct emu_op *count_queued_op(struct sf__emu *e, enum op_kind k, int *rc)
{
    int async = 0;
    unsigned long n;
    *rc = sf__emu_count_op(e, 1, &async, &n);
    if (*rc)
        return NULL;
    struct emu_op *op = new_op(k, async, n);
    if (!op)
        *rc = EMU_NO_MEMORY;
    return op;
}

/* Counts a call that creates a stream or event and allocates it, zeroed;
 * NULL with *rc set when the call fails now or memory runs out. */
static void *count_new_handle(struct sf__emu *e, size_t bytes, int *rc)
{
    *rc = sf__emu_count_op(e, 0, NULL, NULL);
    if (*rc)
        return NULL;
    void *p = calloc(1, bytes);
    if (!p)
        *rc = EMU_NO_MEMORY;
    return p;
}

/* The live stream or event h (under e->mu); NULL after failing the call
 * `what` with "no stream/event h". */
static struct emu_stream *stream_or_fail(struct sf__emu *e, void *h, const char *what, int *rc)
{
    struct emu_stream *s = find_stream(e, h);
    if (!s)
        *rc = sf__emu_fail_locked(e, EMU_INVALID_HANDLE, "%s: no stream %p", what, h);
    return s;
}

static struct emu_event *event_or_fail(struct sf__emu *e, void *h, const char *what, int *rc)
{
    struct emu_event *v = find_event(e, h);
    if (!v)
        *rc = sf__emu_fail_locked(e, EMU_INVALID_HANDLE, "%s: no event %p", what, h);
    return v;
}

/* A point in a stream's order: s has completed operation seq. s NULL (the
 * point of an event never recorded) is always reached. */
struct emu_point {
    struct emu_stream *s;
    uint64_t seq;
};

static int point_reached(struct emu_point p)
{
    return p.s == NULL || atomic_load_explicit(&p.s->completed, memory_order_acquire) >= p.seq;
}

/* Under e->mu: event v's last record. */
static struct emu_point last_record(const struct emu_event *v)
{
    return (struct emu_point){atomic_load_explicit(&v->s, memory_order_relaxed), v->seq};
}

enum point_kind { STREAM_POINT, EVENT_POINT };

/* The point a sync waits for, read under e->mu: stream h's last queued
 * operation, or event h's last record; *p is left alone, after failing the
 * call `what`, when h is no live stream or event. */
static int point_of(struct sf__emu *e, void *h, enum point_kind kind, const char *what,
                    struct emu_point *p)
{
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    if (kind == EVENT_POINT) {
        struct emu_event *v = event_or_fail(e, h, what, &rc);
        if (v)
            *p = last_record(v);
    } else {
        struct emu_stream *s = stream_or_fail(e, h, what, &rc);
        if (s)
            *p = (struct emu_point){s, s->enqueued};
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* A stream or event sync (block) or an event query: counts the call, then
 * waits for the point h names, or says whether it is reached. */
static int sync_point(struct sf__emu *e, void *h, enum point_kind kind, const char *what, int block)
{
    struct emu_point p = {NULL, 0};
    int rc = sf__emu_count_op(e, 0, NULL, NULL);
    if (!rc)
        rc = point_of(e, h, kind, what, &p);
    if (rc)
        return rc;
    if (block && p.s)
        return wait_done(e, p.s, p.seq);
    return e->sticky ? e->sticky : point_reached(p) ? 0 : EMU_NOT_READY;
}

/* ------------------------------------------------------------------ the table */

static int e_device_count(void *ctx, int *n)
{
    *n = 0;
    int rc = sf__emu_count_op(ctx, 0, NULL, NULL);
    if (!rc)
        *n = 1;
    return rc;
}

static int e_set_device(void *ctx, int device)
{
    struct sf__emu *e = ctx;
    int rc = sf__emu_count_op(e, 0, NULL, NULL);
    if (!rc && device != 0) {
        pthread_mutex_lock(&e->mu);
        rc =
            sf__emu_fail_locked(e, EMU_INVALID_DEVICE, "emulated device %d does not exist", device);
        pthread_mutex_unlock(&e->mu);
    }
    return rc;
}

static int e_unit_count(void *ctx, int device, int *units)
{
    struct sf__emu *e = ctx;
    (void)device;
    int rc = sf__emu_count_op(e, 0, NULL, NULL);
    if (!rc)
        *units = e->o.units;
    return rc;
}

/* Seeds stream s of e and starts its worker; 0, or EMU_NO_MEMORY with
 * nothing left to undo but s's allocation. */
static int start_stream(struct sf__emu *e, struct emu_stream *s)
{
    s->e = e;
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    pthread_mutex_lock(&e->mu);
    s->rng = e->o.seed * 0x9E3779B97F4A7C15ull + ++e->n_streams;
    if (!s->rng)
        s->rng = 1;
    pthread_mutex_unlock(&e->mu);
    if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
        pthread_cond_destroy(&s->qcv);
        pthread_mutex_destroy(&s->qmu);
        return EMU_NO_MEMORY;
    }
    s->started = 1;
    return 0;
}

static int e_stream_create(void *ctx, void **out)
{
    struct sf__emu *e = ctx;
    *out = NULL;
    int rc;
    struct emu_stream *s = count_new_handle(e, sizeof *s, &rc);
    if (!s)
        return rc;
    rc = start_stream(e, s);
    if (rc) {
        free(s);
        return rc;
    }
    pthread_mutex_lock(&e->mu);
    s->next = e->streams;
    e->streams = s;
    pthread_mutex_unlock(&e->mu);
    *out = s;
    return 0;
}

/* Drains and stops s's worker; s stays allocated (queued waits and events
 * may still name it) until the device goes. */
static void stop_stream(struct sf__emu *e, struct emu_stream *s)
{
    pthread_mutex_lock(&e->mu);
    s->dead = 1;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&s->qmu);
    s->stop = 1;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    if (s->started)
        pthread_join(s->th, NULL);
    s->started = 0;
}

static int e_stream_destroy(void *ctx, void *h)
{
    struct sf__emu *e = ctx;
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    struct emu_stream *s = stream_or_fail(e, h, "stream destroy", &rc);
    pthread_mutex_unlock(&e->mu);
    if (s)
        stop_stream(e, s);
    return rc;
}

static int e_stream_sync(void *ctx, void *h)
{
    return sync_point(ctx, h, STREAM_POINT, "stream sync", 1);
}

static int e_event_create(void *ctx, void **out, int timing)
{
    struct sf__emu *e = ctx;
    *out = NULL;
    int rc;
    struct emu_event *v = count_new_handle(e, sizeof *v, &rc);
    if (!v)
        return rc;
    v->timing = timing;
    pthread_mutex_lock(&e->mu);
    v->next = e->events;
    e->events = v;
    pthread_mutex_unlock(&e->mu);
    *out = v;
    return 0;
}

static int e_event_destroy(void *ctx, void *h)
{
    struct sf__emu *e = ctx;
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    struct emu_event *v = event_or_fail(e, h, "event destroy", &rc);
    if (v)
        v->dead = 1; /* a queued record may still name it */
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* Queues on stream an op naming event h: a record of h (OP_RECORD), or a
 * wait for h's last record (OP_WAIT). */
static int queue_event_op(struct sf__emu *e, enum op_kind k, void *stream, void *h,
                          const char *what)
{
    int rc;
    struct emu_op *op = count_queued_op(e, k, &rc);
    if (!op)
        return rc;
    pthread_mutex_lock(&e->mu);
    struct emu_event *v = event_or_fail(e, h, what, &rc);
    struct emu_point p = v ? last_record(v) : (struct emu_point){NULL, 0};
    if (v && k == OP_WAIT && p.s == NULL) /* the stream is checked even with nothing to wait for */
        (void)stream_or_fail(e, stream, what, &rc);
    pthread_mutex_unlock(&e->mu);
    if (k == OP_RECORD) {
        op->ev = v;
        return enqueue_unless(e, rc, stream, op, v);
    }
    if (rc || p.s == NULL) { /* a refused handle, or never recorded: nothing to wait for (as CUDA) */
        free(op);
        return rc;
    }
    op->ws = p.s;
    op->wseq = p.seq;
    return enqueue_unless(e, rc, stream, op, NULL);
}

static int e_event_record(void *ctx, void *h, void *stream)
{
    return queue_event_op(ctx, OP_RECORD, stream, h, "event record");
}

static int e_event_query(void *ctx, void *h)
{
    return sync_point(ctx, h, EVENT_POINT, "event query", 0);
}

static int e_event_sync(void *ctx, void *h)
{
    return sync_point(ctx, h, EVENT_POINT, "event sync", 1);
}

static int e_event_elapsed_ms(void *ctx, float *ms, void *a, void *b)
{
    struct sf__emu *e = ctx;
    *ms = 0.0f;
    int rc = sf__emu_count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->mu);
    struct emu_event *x = find_event(e, a), *y = find_event(e, b);
    if (!x || !y || !x->timing || !y->timing || !x->s || !y->s)
        rc = sf__emu_fail_locked(e, EMU_INVALID_HANDLE,
                         "elapsed time: events not created with timing or never recorded");
    else if (!point_reached(last_record(x)) || !point_reached(last_record(y)))
        rc = EMU_NOT_READY;
    else if (x->t_seq != x->seq || y->t_seq != y->seq)
        rc = sf__emu_fail_locked(e, EMU_INVALID_HANDLE, "elapsed time: a record did not run");
    else
        *ms = (float)(((double)y->t_ns - (double)x->t_ns) / 1e6);
    rc = rc ? rc : e->sticky;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int e_stream_wait_event(void *ctx, void *stream, void *h)
{
    return queue_event_op(ctx, OP_WAIT, stream, h, "stream wait");
}

static int queue_copy(struct sf__emu *e, void *dst, const void *src, size_t bytes, void *stream,
                      int to_device)
{
    int rc;
    struct emu_op *op = count_queued_op(e, OP_COPY, &rc);
    if (!op || bytes == 0) {
        free(op);
        return rc;
    }
    /* The device side must be allocated now; it is looked up again when the
     * copy runs (freed in between: an illegal address, as on a GPU). */
    pthread_mutex_lock(&e->amu);
    int no_dev = !sf__emu_shadow_of(e, to_device ? dst : src, bytes);
    int no_host = !(to_device ? src : dst) || sf__emu_shadow_of(e, to_device ? src : dst, 1);
    pthread_mutex_unlock(&e->amu);
    pthread_mutex_lock(&e->mu);
    if (no_dev)
        rc = sf__emu_fail_locked(e, EMU_INVALID_VALUE,
                                 "copy of %zu bytes: %s %p is not device memory", bytes,
                                 to_device ? "destination" : "source", to_device ? dst : src);
    else if (no_host)
        rc =
            sf__emu_fail_locked(e, EMU_INVALID_VALUE, "copy of %zu bytes: %s %p is not host memory",
                                bytes, to_device ? "source" : "destination", to_device ? src : dst);
    pthread_mutex_unlock(&e->mu);
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
    op->to_device = to_device;
    return enqueue_unless(e, rc, stream, op, NULL);
}

static int e_copy_h2d(void *ctx, void *dst, const void *src, size_t bytes, void *stream)
{
    return queue_copy(ctx, dst, src, bytes, stream, 1);
}

static int e_copy_d2h(void *ctx, void *dst, const void *src, size_t bytes, void *stream)
{
    return queue_copy(ctx, dst, (void *)(uintptr_t)src, bytes, stream, 0);
}

static int e_launch_normalize(void *ctx, const struct sf__norm_launch *l, void *stream)
{
    struct sf__emu *e = ctx;
    int rc;
    struct emu_op *op = count_queued_op(e, OP_KERNEL, &rc);
    if (!op)
        return rc;
    if (l->gx == 0 || l->gy == 0 || l->gy > 65535u) {
        pthread_mutex_lock(&e->mu);
        rc =
            sf__emu_fail_locked(e, EMU_INVALID_VALUE, "normalize launch: grid %ux%u", l->gx, l->gy);
        pthread_mutex_unlock(&e->mu);
    }
    op->launch = *l;
    return enqueue_unless(e, rc, stream, op, NULL);
}

static void e_error_text(void *ctx, int rc, char *buf, size_t len)
{
    struct sf__emu *e = ctx;
    const char *name =
        rc >= 0 && rc < (int)(sizeof emu_names / sizeof emu_names[0]) ? emu_names[rc] : "emu_?";
    if (len == 0)
        return;
    if (rc == 0) {
        snprintf(buf, len, "no error (%s)", name);
        return;
    }
    if (rc == EMU_NOT_READY) {
        snprintf(buf, len, "work not finished yet (%s)", name);
        return;
    }
    if (!e) {
        snprintf(buf, len, "error (%s)", name);
        return;
    }
    pthread_mutex_lock(&e->mu);
    snprintf(buf, len, "%s (%s)", e->msg[0] ? e->msg : "error", name);
    pthread_mutex_unlock(&e->mu);
}

static sf_status e_status_of(int rc)
{
    switch (rc) {
    case EMU_OK: return SF_OK;
    case EMU_NO_MEMORY: return SF_ERR_NO_MEMORY;
    case EMU_INVALID_VALUE:
    case EMU_INVALID_HANDLE:
    case EMU_INVALID_DEVICE: return SF_ERR_INVALID_ARGUMENT;
    default: return SF_ERR_IO;
    }
}

static const struct sf__gpu_ops emu_ops = {
    .name = "emulated",
    .not_ready = EMU_NOT_READY,
    .device_count = e_device_count,
    .set_device = e_set_device,
    .unit_count = e_unit_count,
    .host_alloc = sf__emu_host_alloc,
    .host_free = sf__emu_host_free,
    .dev_alloc = sf__emu_dev_alloc,
    .dev_free = sf__emu_dev_free,
    .stream_create = e_stream_create,
    .stream_destroy = e_stream_destroy,
    .stream_sync = e_stream_sync,
    .event_create = e_event_create,
    .event_destroy = e_event_destroy,
    .event_record = e_event_record,
    .event_query = e_event_query,
    .event_sync = e_event_sync,
    .event_elapsed_ms = e_event_elapsed_ms,
    .stream_wait_event = e_stream_wait_event,
    .copy_h2d = e_copy_h2d,
    .copy_d2h = e_copy_d2h,
    .launch_normalize = e_launch_normalize,
    .error_text = e_error_text,
    .status_of = e_status_of,
};

const struct sf__gpu_ops *sf__gpu_emu_ops(void)
{
    return &emu_ops;
}

/* ------------------------------------------------------------------ device */

int sf__emu_new(const struct sf__emu_options *o, struct sf__emu **out)
{
    *out = NULL;
    struct sf__emu *e = calloc(1, sizeof *e);
    if (!e)
        return EMU_NO_MEMORY;
    e->o = *o;
    if (e->o.units < 1)
        e->o.units = 1;
    pthread_mutex_init(&e->amu, NULL);
    pthread_mutex_init(&e->mu, NULL);
    *out = e;
    return 0;
}

void sf__emu_destroy(struct sf__emu *e)
{
    if (!e)
        return;
    for (struct emu_stream *s = e->streams; s; s = s->next)
        if (s->started)
            stop_stream(e, s);
    while (e->streams) {
        struct emu_stream *s = e->streams;
        e->streams = s->next;
        pthread_cond_destroy(&s->qcv);
        pthread_mutex_destroy(&s->qmu);
        free(s);
    }
    while (e->events) {
        struct emu_event *v = e->events;
        e->events = v->next;
        free(v);
    }
    while (e->allocs) {
        struct emu_alloc *m = e->allocs;
        e->allocs = m->next;
        munmap(m->dev, m->map_bytes);
        munmap(m->shadow, m->map_bytes);
        free(m);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->amu);
    free(e);
}

int sf__emu_enqueue_fn(struct sf__emu *e, void *stream, void (*fn)(void *arg), void *arg)
{
    struct emu_op *op = new_op(OP_FN, 0, 0);
    if (!op)
        return EMU_NO_MEMORY;
    op->fn = fn;
    op->arg = arg;
    return enqueue(e, stream, op, NULL);
}

unsigned long sf__emu_op_count(const struct sf__emu *e)
{
    pthread_mutex_lock((pthread_mutex_t *)&e->mu);
    unsigned long n = e->ops;
    pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
    return n;
}
