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
 */

#include "src/gpu_dev.h"

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

/* Emulated stores: counted, bounds-checked (see run_kernel). */
static void emu_store(float *dst, uint32_t i, float v);
#define SF_K_STORE(dst, i, v) emu_store((dst), (i), (v))
#include "src/gpu_kernel.h"
#include "common/clock.h"

enum {
    EMU_OK = 0,
    EMU_NOT_READY = 1,
    EMU_NO_MEMORY = 2,
    EMU_INVALID_VALUE = 3,
    EMU_INVALID_HANDLE = 4,
    EMU_ILLEGAL_ADDRESS = 5, /* sticky */
    EMU_INJECTED = 6,
    EMU_KERNEL_CHECK = 7, /* sticky */
    EMU_INVALID_DEVICE = 8,
};

static const char *const emu_names[] = {
    "emu_success",        "emu_not_ready",    "emu_out_of_memory",
    "emu_invalid_value",  "emu_invalid_handle", "emu_illegal_address",
    "emu_injected_failure", "emu_kernel_check_failed", "emu_invalid_device",
};

enum op_kind { OP_COPY, OP_KERNEL, OP_RECORD, OP_WAIT, OP_FN };

struct emu_stream;

struct emu_event {
    /* Stream of the last record (NULL: never recorded) and its sequence
     * number there: written under e->mu, read by the stream's worker. */
    _Atomic(struct emu_stream *) s;
    _Atomic uint64_t seq;
    int timing;
    int dead; /* destroyed by the user; freed with the device */
    /* Written by the worker that runs the record: when, and which record. */
    _Atomic uint64_t t_ns, t_seq;
    struct emu_event *next;
};

struct emu_op {
    enum op_kind kind;
    uint64_t seq;
    int fail; /* injected: fails when it runs (sticky) */
    unsigned long op_number;
    /* OP_COPY */
    void *dst;
    const void *src;
    size_t bytes;
    int to_device;
    /* OP_KERNEL */
    struct sf__norm_launch launch;
    /* OP_RECORD */
    struct emu_event *ev;
    /* OP_WAIT */
    struct emu_stream *ws;
    uint64_t wseq;
    /* OP_FN */
    void (*fn)(void *);
    void *arg;
    struct emu_op *next;
};

/* Synchronisation as a GPU gives it, and no more, so that ThreadSanitizer
 * reports a host buffer touched before the wait for the copy that reads it:
 * the worker takes only its queue's lock (qmu: what the host queued before,
 * happens before) and device memory's (amu: the host touches it only at
 * alloc and free). It publishes completion with a release store and a futex
 * wake; waiters acquire it. It never takes a lock the host releases while
 * it waits (the device's mu), which would order the host's later accesses
 * before the copy. */
struct emu_stream {
    struct sf__emu *e;
    pthread_t th;
    int started;
    int dead; /* under e->mu */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    int stop;                   /* under qmu */
    struct emu_op *head, *tail; /* under qmu */
    uint64_t enqueued;          /* under qmu and e->mu (written with both held) */
    _Atomic uint64_t completed; /* release by the worker, acquire by waiters */
    uint64_t rng;               /* worker thread only */
    struct emu_stream *next;
};

struct emu_alloc {
    unsigned char *dev;    /* PROT_NONE: what the host is given */
    unsigned char *shadow; /* the same pages, readable and writable */
    size_t bytes, map_bytes;
    struct emu_alloc *next;
};

struct sf__emu {
    struct sf__emu_options o;
    pthread_mutex_t amu; /* device memory */
    struct emu_alloc *allocs;
    uint64_t mem_used;
    pthread_mutex_t mu;
    /* under mu */
    struct emu_stream *streams;
    struct emu_event *events;
    unsigned long ops;
    unsigned n_streams;
    _Atomic int sticky;   /* written under mu; workers read it without */
    _Atomic uint32_t gen; /* futex word: bumped on every completion */
    char msg[256]; /* detail of the last error (the sticky one once set) */
};

/* ------------------------------------------------------------------ options */

void sf__emu_options_default(struct sf__emu_options *o)
{
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->delay_us = 200;
    o->units = 2;
    o->mem_bytes = (uint64_t)4 << 30;
}

int sf__emu_options_from_env(struct sf__emu_options *o, char *err, size_t err_len)
{
    const char *v = getenv("SF_GPU_EMULATOR");
    if (v == NULL || !*v)
        return 0;
    char buf[256];
    if (strlen(v) >= sizeof buf) {
        snprintf(err, err_len, "SF_GPU_EMULATOR: longer than %zu bytes", sizeof buf - 1);
        return -1;
    }
    strcpy(buf, v);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        char *end = NULL;
        unsigned long long n = 0;
        if (eq) {
            errno = 0;
            n = strtoull(eq + 1, &end, 10);
        }
        if (!eq || !eq[1] || *end || errno) {
            snprintf(err, err_len, "SF_GPU_EMULATOR: \"%s\" is not key=number", kv);
            return -1;
        }
        *eq = '\0';
        if (!strcmp(kv, "seed"))
            o->seed = n;
        else if (!strcmp(kv, "delay_us") && n <= 1000000)
            o->delay_us = (unsigned)n;
        else if (!strcmp(kv, "fail_at"))
            o->fail_at = (unsigned long)n;
        else if (!strcmp(kv, "fail_async") && n <= 1)
            o->fail_async = (int)n;
        else if (!strcmp(kv, "units") && n >= 1 && n <= 1024)
            o->units = (int)n;
        else if (!strcmp(kv, "mem_mib") && n >= 1 && n <= ((uint64_t)1 << 24))
            o->mem_bytes = (uint64_t)n << 20;
        else {
            snprintf(err, err_len,
                     "SF_GPU_EMULATOR: %s=%llu (keys: seed, delay_us 0..1000000, fail_at, "
                     "fail_async 0..1, units 1..1024, mem_mib 1..16777216)",
                     kv, n);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ helpers */

/* Wakes every waiter: some stream completed an operation (or failed). */
static void publish(struct sf__emu *e)
{
    atomic_fetch_add_explicit(&e->gen, 1, memory_order_release);
    syscall(SYS_futex, &e->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Waits until s has completed operation seq, or the device faulted. */
static int wait_done(struct sf__emu *e, struct emu_stream *s, uint64_t seq)
{
    for (;;) {
        uint32_t g = atomic_load_explicit(&e->gen, memory_order_acquire);
        if (atomic_load_explicit(&s->completed, memory_order_acquire) >= seq)
            return 0;
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
        struct timespec ts = {0, (long)us * 1000L};
        nanosleep(&ts, NULL);
    }
}

/* Under e->mu: the error detail, and the code. */
static int fail_locked(struct sf__emu *e, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail_locked(struct sf__emu *e, int rc, const char *fmt, ...)
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
static int count_op(struct sf__emu *e, int queued, int *async, unsigned long *number)
{
    pthread_mutex_lock(&e->mu);
    unsigned long n = ++e->ops;
    int rc = e->sticky;
    if (!rc && e->o.fail_at == n) {
        if (queued && e->o.fail_async)
            *async = 1;
        else
            rc = fail_locked(e, EMU_INJECTED, "injected failure of operation %lu", n);
    }
    pthread_mutex_unlock(&e->mu);
    if (number)
        *number = n;
    return rc;
}

/* Under e->amu: the shadow address of [p, p + bytes) in one allocation. */
static unsigned char *shadow_of(struct sf__emu *e, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    for (struct emu_alloc *m = e->allocs; m; m = m->next) {
        uintptr_t d = (uintptr_t)m->dev;
        if (a >= d && a < d + m->bytes)
            return bytes <= m->bytes - (a - d) ? m->shadow + (a - d) : NULL;
    }
    return NULL;
}

/* ------------------------------------------------------------------ kernel */

struct store_ctx {
    float *out;
    uint64_t total;
    uint8_t *count;
    uint64_t outside;
    uint64_t first_outside;
};

static _Thread_local struct store_ctx *store_tls;

static void emu_store(float *dst, uint32_t i, float v)
{
    struct store_ctx *c = store_tls;
    float *p = dst + i;
    if (p < c->out || (uint64_t)(p - c->out) >= c->total) {
        if (c->outside++ == 0)
            c->first_outside = (uint64_t)(p - c->out);
        return;
    }
    uint64_t k = (uint64_t)(p - c->out);
    if (c->count[k] < 255)
        c->count[k]++;
    *p = v;
}

/* Runs one launch; 0 or a sticky error (under no lock: the worker owns the
 * buffers while the op runs). */
static int run_kernel(struct sf__emu *e, const struct sf__norm_launch *l)
{
    uint64_t total = l->n_images * (uint64_t)l->elems;
    pthread_mutex_lock(&e->amu);
    const unsigned char *in = shadow_of(e, l->in, total);
    float *out = (float *)shadow_of(e, l->out, total * sizeof(float));
    pthread_mutex_unlock(&e->amu);
    int rc = 0;
    if (!in || !out) {
        pthread_mutex_lock(&e->mu);
        rc = fail_locked(e, EMU_ILLEGAL_ADDRESS,
                         "normalize kernel: %s of %" PRIu64 " elements outside device memory",
                         !in ? "input" : "output", total);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    if (l->gx == 0 || l->gy == 0 || l->elems != 3u * l->plane) {
        pthread_mutex_lock(&e->mu);
        rc = fail_locked(e, EMU_KERNEL_CHECK, "normalize kernel: grid %ux%u, elems %u, plane %u",
                         l->gx, l->gy, l->elems, l->plane);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    /* Poison: a NaN no computation produces. */
    const uint32_t poison = 0x7FA5A5A5u;
    for (uint64_t i = 0; i < total; i++)
        memcpy(out + i, &poison, sizeof poison);
    struct store_ctx c = {out, total, calloc(total ? total : 1, 1), 0, 0};
    if (!c.count) {
        pthread_mutex_lock(&e->mu);
        rc = fail_locked(e, EMU_KERNEL_CHECK, "normalize kernel: no host memory for the checks");
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    store_tls = &c;
    struct sf_k_params p = {l->mean[0], l->mean[1], l->mean[2], l->std[0], l->std[1], l->std[2]};
    float lut[SF_K_LUT];
    for (uint32_t by = 0; by < l->gy; by++) {
        for (uint32_t bx = 0; bx < l->gx; bx++) {
            /* Shared memory starts undefined: poisoned, then every thread
             * fills its share before the barrier. */
            for (uint32_t i = 0; i < SF_K_LUT; i++)
                memcpy(lut + i, &poison, sizeof poison);
            for (uint32_t t = 0; t < SF_K_THREADS; t++)
                sf_k_fill_lut(lut, t, SF_K_THREADS, p);
            int first = bx == 0 && by == 0;
            int runs = first && e->o.kernel_fault == 2 ? 2 : 1;
            for (int r = 0; r < runs; r++) {
                for (uint32_t t = 0; t < SF_K_THREADS; t++) {
                    if (first && t == 0 && e->o.kernel_fault == 1)
                        continue;
                    sf_k_thread(in, out, lut, l->n_images, l->elems, l->plane, l->hwc,
                                bx * SF_K_THREADS + t, l->gx * SF_K_THREADS, by, l->gy);
                }
            }
        }
    }
    store_tls = NULL;
    uint64_t bad = total;
    for (uint64_t i = 0; i < total; i++) {
        if (c.count[i] != 1) {
            bad = i;
            break;
        }
    }
    pthread_mutex_lock(&e->mu);
    if (c.outside)
        rc = fail_locked(e, EMU_KERNEL_CHECK,
                         "normalize kernel: %" PRIu64 " stores outside the output, first at "
                         "element %" PRId64,
                         c.outside, (int64_t)c.first_outside);
    else if (bad < total)
        rc = fail_locked(e, EMU_KERNEL_CHECK,
                         "normalize kernel: element %" PRIu64 " of %" PRIu64
                         " written %u times (image %" PRIu64 ", grid %ux%u)",
                         bad, total, (unsigned)c.count[bad], bad / l->elems, l->gx, l->gy);
    pthread_mutex_unlock(&e->mu);
    free(c.count);
    return rc;
}

/* ------------------------------------------------------------------ streams */

static int run_op(struct emu_stream *s, struct emu_op *op)
{
    struct sf__emu *e = s->e;
    if (op->fail) {
        pthread_mutex_lock(&e->mu);
        int rc = fail_locked(e, EMU_ILLEGAL_ADDRESS,
                             "injected failure of operation %lu, when it ran", op->op_number);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    switch (op->kind) {
    case OP_COPY: {
        pthread_mutex_lock(&e->amu);
        unsigned char *dev = shadow_of(e, op->to_device ? op->dst : op->src, op->bytes);
        pthread_mutex_unlock(&e->amu);
        if (!dev) {
            pthread_mutex_lock(&e->mu);
            int rc = fail_locked(e, EMU_ILLEGAL_ADDRESS,
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
    case OP_KERNEL: return run_kernel(e, &op->launch);
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
        rc = fail_locked(e, EMU_INVALID_HANDLE, "no stream %p on the emulated device", h);
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

/* ------------------------------------------------------------------ the table */

static int e_device_count(void *ctx, int *n)
{
    *n = 0;
    int rc = count_op(ctx, 0, NULL, NULL);
    if (!rc)
        *n = 1;
    return rc;
}

static int e_set_device(void *ctx, int device)
{
    struct sf__emu *e = ctx;
    int rc = count_op(e, 0, NULL, NULL);
    if (!rc && device != 0) {
        pthread_mutex_lock(&e->mu);
        rc = fail_locked(e, EMU_INVALID_DEVICE, "emulated device %d does not exist", device);
        pthread_mutex_unlock(&e->mu);
    }
    return rc;
}

static int e_unit_count(void *ctx, int device, int *units)
{
    struct sf__emu *e = ctx;
    (void)device;
    int rc = count_op(e, 0, NULL, NULL);
    if (!rc)
        *units = e->o.units;
    return rc;
}

static int e_host_alloc(void *ctx, void **p, size_t bytes)
{
    *p = NULL;
    int rc = count_op(ctx, 0, NULL, NULL);
    if (rc)
        return rc;
    if (posix_memalign(p, 4096, bytes ? bytes : 1) != 0) {
        *p = NULL;
        return EMU_NO_MEMORY;
    }
    return 0;
}

static int e_host_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
    return 0;
}

static int e_dev_alloc(void *ctx, void **p, size_t bytes)
{
    struct sf__emu *e = ctx;
    *p = NULL;
    int rc = count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    long page = sysconf(_SC_PAGESIZE);
    size_t map = bytes == 0 ? 0 : (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    pthread_mutex_lock(&e->amu);
    uint64_t used = e->mem_used;
    int fits = map >= bytes && bytes > 0 && map <= e->o.mem_bytes - used;
    if (fits)
        e->mem_used += map;
    pthread_mutex_unlock(&e->amu);
    if (!fits) {
        pthread_mutex_lock(&e->mu);
        if (bytes == 0 || map < bytes)
            rc = fail_locked(e, EMU_INVALID_VALUE, "device alloc of %zu bytes", bytes);
        else
            rc = fail_locked(e, EMU_NO_MEMORY,
                             "device alloc of %zu bytes: %" PRIu64 " of %" PRIu64
                             " bytes in use",
                             bytes, used, e->o.mem_bytes);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    struct emu_alloc *m = calloc(1, sizeof *m);
    int fd = memfd_create("sf-emulated-device", MFD_CLOEXEC);
    void *dev = MAP_FAILED, *shadow = MAP_FAILED;
    if (m && fd >= 0 && ftruncate(fd, (off_t)map) == 0) {
        dev = mmap(NULL, map, PROT_NONE, MAP_SHARED, fd, 0);
        shadow = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (fd >= 0)
        close(fd);
    int err = errno ? errno : ENOMEM;
    pthread_mutex_lock(&e->amu);
    int ok = m && dev != MAP_FAILED && shadow != MAP_FAILED;
    if (!ok) {
        e->mem_used -= map;
    } else {
        m->dev = dev;
        m->shadow = shadow;
        m->bytes = bytes;
        m->map_bytes = map;
        m->next = e->allocs;
        e->allocs = m;
        *p = dev;
    }
    pthread_mutex_unlock(&e->amu);
    if (!ok) {
        pthread_mutex_lock(&e->mu);
        rc = fail_locked(e, EMU_NO_MEMORY, "device alloc of %zu bytes: %s", bytes, strerror(err));
        pthread_mutex_unlock(&e->mu);
    }
    if (rc) {
        if (dev != MAP_FAILED)
            munmap(dev, map);
        if (shadow != MAP_FAILED)
            munmap(shadow, map);
        free(m);
    }
    return rc;
}

static int e_dev_free(void *ctx, void *p)
{
    struct sf__emu *e = ctx;
    if (p == NULL)
        return 0;
    pthread_mutex_lock(&e->amu);
    struct emu_alloc **pp = &e->allocs, *m = NULL;
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->dev == p) {
            m = *pp;
            *pp = m->next;
            e->mem_used -= m->map_bytes;
            break;
        }
    }
    pthread_mutex_unlock(&e->amu);
    int rc = 0;
    if (!m) {
        pthread_mutex_lock(&e->mu);
        rc = fail_locked(e, EMU_INVALID_VALUE, "device free of %p: not allocated", p);
        pthread_mutex_unlock(&e->mu);
    }
    if (m) {
        munmap(m->dev, m->map_bytes);
        munmap(m->shadow, m->map_bytes);
        free(m);
    }
    return rc;
}

static int e_stream_create(void *ctx, void **out)
{
    struct sf__emu *e = ctx;
    *out = NULL;
    int rc = count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    struct emu_stream *s = calloc(1, sizeof *s);
    if (!s)
        return EMU_NO_MEMORY;
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
        free(s);
        return EMU_NO_MEMORY;
    }
    s->started = 1;
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
    pthread_mutex_lock(&e->mu);
    struct emu_stream *s = find_stream(e, h);
    int rc = s ? 0 : fail_locked(e, EMU_INVALID_HANDLE, "stream destroy: no stream %p", h);
    pthread_mutex_unlock(&e->mu);
    if (s)
        stop_stream(e, s);
    return rc;
}

static int e_stream_sync(void *ctx, void *h)
{
    struct sf__emu *e = ctx;
    int rc = count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->mu);
    struct emu_stream *s = find_stream(e, h);
    uint64_t target = s ? s->enqueued : 0;
    if (!s)
        rc = fail_locked(e, EMU_INVALID_HANDLE, "stream sync: no stream %p", h);
    pthread_mutex_unlock(&e->mu);
    return rc ? rc : wait_done(e, s, target);
}

static int e_event_create(void *ctx, void **out, int timing)
{
    struct sf__emu *e = ctx;
    *out = NULL;
    int rc = count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    struct emu_event *v = calloc(1, sizeof *v);
    if (!v)
        return EMU_NO_MEMORY;
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
    pthread_mutex_lock(&e->mu);
    struct emu_event *v = find_event(e, h);
    int rc = v ? 0 : fail_locked(e, EMU_INVALID_HANDLE, "event destroy: no event %p", h);
    if (v)
        v->dead = 1; /* a queued record may still name it */
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int e_event_record(void *ctx, void *h, void *stream)
{
    struct sf__emu *e = ctx;
    int async = 0;
    unsigned long n;
    int rc = count_op(e, 1, &async, &n);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->mu);
    struct emu_event *v = find_event(e, h);
    if (!v)
        rc = fail_locked(e, EMU_INVALID_HANDLE, "event record: no event %p", h);
    pthread_mutex_unlock(&e->mu);
    if (rc)
        return rc;
    struct emu_op *op = new_op(OP_RECORD, async, n);
    if (!op)
        return EMU_NO_MEMORY;
    op->ev = v;
    return enqueue(e, stream, op, v);
}

/* Under e->mu. */
static int event_done(const struct emu_event *v)
{
    struct emu_stream *s = atomic_load_explicit(&v->s, memory_order_relaxed);
    return s == NULL ||
           atomic_load_explicit(&s->completed, memory_order_acquire) >= v->seq;
}

static int e_event_query(void *ctx, void *h)
{
    struct sf__emu *e = ctx;
    int rc = count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->mu);
    struct emu_event *v = find_event(e, h);
    if (!v)
        rc = fail_locked(e, EMU_INVALID_HANDLE, "event query: no event %p", h);
    else
        rc = e->sticky ? e->sticky : event_done(v) ? 0 : EMU_NOT_READY;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int e_event_sync(void *ctx, void *h)
{
    struct sf__emu *e = ctx;
    int rc = count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->mu);
    struct emu_event *v = find_event(e, h);
    struct emu_stream *s = v ? atomic_load_explicit(&v->s, memory_order_relaxed) : NULL;
    uint64_t seq = v ? v->seq : 0;
    if (!v)
        rc = fail_locked(e, EMU_INVALID_HANDLE, "event sync: no event %p", h);
    pthread_mutex_unlock(&e->mu);
    if (rc)
        return rc;
    return s ? wait_done(e, s, seq) : e->sticky;
}

static int e_event_elapsed_ms(void *ctx, float *ms, void *a, void *b)
{
    struct sf__emu *e = ctx;
    *ms = 0.0f;
    int rc = count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->mu);
    struct emu_event *x = find_event(e, a), *y = find_event(e, b);
    if (!x || !y || !x->timing || !y->timing || !x->s || !y->s)
        rc = fail_locked(e, EMU_INVALID_HANDLE,
                         "elapsed time: events not created with timing or never recorded");
    else if (!event_done(x) || !event_done(y))
        rc = EMU_NOT_READY;
    else if (x->t_seq != x->seq || y->t_seq != y->seq)
        rc = fail_locked(e, EMU_INVALID_HANDLE, "elapsed time: a record did not run");
    else
        *ms = (float)(((double)y->t_ns - (double)x->t_ns) / 1e6);
    rc = rc ? rc : e->sticky;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int e_stream_wait_event(void *ctx, void *stream, void *h)
{
    struct sf__emu *e = ctx;
    int async = 0;
    unsigned long n;
    int rc = count_op(e, 1, &async, &n);
    if (rc)
        return rc;
    struct emu_op *op = new_op(OP_WAIT, async, n);
    if (!op)
        return EMU_NO_MEMORY;
    pthread_mutex_lock(&e->mu);
    struct emu_event *v = find_event(e, h);
    if (!v) {
        rc = fail_locked(e, EMU_INVALID_HANDLE, "stream wait: no event %p", h);
    } else if (v->s == NULL) {
        /* Never recorded: nothing to wait for (as CUDA). */
        op->kind = OP_FN;
        op->fn = NULL;
    } else {
        op->ws = atomic_load_explicit(&v->s, memory_order_relaxed);
        op->wseq = v->seq;
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        free(op);
        return rc;
    }
    if (op->kind == OP_FN) {
        free(op);
        return 0;
    }
    return enqueue(e, stream, op, NULL);
}

static int queue_copy(struct sf__emu *e, void *dst, const void *src, size_t bytes, void *stream,
                      int to_device)
{
    int async = 0;
    unsigned long n;
    int rc = count_op(e, 1, &async, &n);
    if (rc)
        return rc;
    if (bytes == 0)
        return 0;
    /* The device side must be allocated now; it is looked up again when the
     * copy runs (freed in between: an illegal address, as on a GPU). */
    pthread_mutex_lock(&e->amu);
    int no_dev = !shadow_of(e, to_device ? dst : src, bytes);
    int no_host = !(to_device ? src : dst) || shadow_of(e, to_device ? src : dst, 1);
    pthread_mutex_unlock(&e->amu);
    pthread_mutex_lock(&e->mu);
    if (no_dev)
        rc = fail_locked(e, EMU_INVALID_VALUE, "copy of %zu bytes: %s %p is not device memory",
                         bytes, to_device ? "destination" : "source", to_device ? dst : src);
    else if (no_host)
        rc = fail_locked(e, EMU_INVALID_VALUE, "copy of %zu bytes: %s %p is not host memory",
                         bytes, to_device ? "source" : "destination", to_device ? src : dst);
    pthread_mutex_unlock(&e->mu);
    if (rc)
        return rc;
    struct emu_op *op = new_op(OP_COPY, async, n);
    if (!op)
        return EMU_NO_MEMORY;
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
    op->to_device = to_device;
    return enqueue(e, stream, op, NULL);
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
    int async = 0;
    unsigned long n;
    int rc = count_op(e, 1, &async, &n);
    if (rc)
        return rc;
    if (l->gx == 0 || l->gy == 0 || l->gy > 65535u) {
        pthread_mutex_lock(&e->mu);
        rc = fail_locked(e, EMU_INVALID_VALUE, "normalize launch: grid %ux%u", l->gx, l->gy);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    struct emu_op *op = new_op(OP_KERNEL, async, n);
    if (!op)
        return EMU_NO_MEMORY;
    op->launch = *l;
    return enqueue(e, stream, op, NULL);
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
    .host_alloc = e_host_alloc,
    .host_free = e_host_free,
    .dev_alloc = e_dev_alloc,
    .dev_free = e_dev_free,
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

int sf__emu_peek(struct sf__emu *e, void *dst, const void *dev, size_t bytes)
{
    pthread_mutex_lock(&e->amu);
    const unsigned char *p = shadow_of(e, dev, bytes);
    if (p)
        memcpy(dst, p, bytes);
    pthread_mutex_unlock(&e->amu);
    return p ? 0 : EMU_INVALID_VALUE;
}

unsigned long sf__emu_op_count(const struct sf__emu *e)
{
    pthread_mutex_lock((pthread_mutex_t *)&e->mu);
    unsigned long n = e->ops;
    pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
    return n;
}

int sf__emu_is_device_ptr(const struct sf__emu *e, const void *p)
{
    pthread_mutex_lock((pthread_mutex_t *)&e->amu);
    int yes = shadow_of((struct sf__emu *)e, p, 1) != NULL;
    pthread_mutex_unlock((pthread_mutex_t *)&e->amu);
    return yes;
}
