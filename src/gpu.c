/* The GPU ring (contract: gpu.h), portable C over the device operations of
 * gpu_dev.h: the same code drives CUDA and the emulated device.
 *
 * One sf_gpu owns a non-blocking copy stream and a ring of slots; each slot
 * has a u8 device buffer, an optional f32 buffer, two timing events (start,
 * done) recorded around its job, so sf__gpu_wait can report the job's device
 * time, and a release event the consumer's stream records. Threads: submit,
 * wait and query on a slot are ordered by the caller's ring logic. open,
 * submit, close (and the test readback) make `device` current on the calling
 * thread; wait and query do not, so a consumer thread keeps its own current
 * device. sf__host_alloc pins in the calling thread's current context: open
 * the ring first on that thread, or a process on GPU 3 also creates a
 * context on GPU 0. */
#include "src/gpu.h"
#include "src/gpu_dev.h"
#include "src/gpu_kernel.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SF_HOST_ALIGN    4096
#define SF_GPU_MAX_SLOTS 1024
/* Release events per slot: one per distinct consumer stream of a release. */
#define SF_GPU_RELEASE_EVENTS SF_LOADER_RELEASE_STREAMS_MAX

struct sf_gpu_slot {
    void *u8;
    void *f32;
    void *start, *done;
    /* Recorded on the consumers' streams when they released the slot
     * (sf__gpu_release_after_streams), one per distinct stream; the next
     * copy into the slot waits on the first n_released. */
    void *released[SF_GPU_RELEASE_EVENTS];
    unsigned n_released;
    int has_job; /* 1 once a job was submitted whole (both events recorded) */
};

struct sf_gpu {
    enum sf__gpu_backend backend;
    const struct sf__gpu_ops *ops;
    void *ctx;           /* the backend instance: NULL (CUDA) or the sf__emu */
    struct sf__emu *emu; /* owned, emulated backend only */
    int device;
    int units;
    unsigned slots;
    size_t u8_bytes, f32_bytes;
    void *stream;
    struct sf_gpu_slot *slot;
    int ignore_release; /* tests only */
};

static void set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (err == NULL || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* "<op>[ (what)]: <backend message>" into err; the backend's status. */
static sf_status dev_fail(const struct sf_gpu *g, char *err, size_t err_len, const char *op,
                          const char *what, int rc)
{
    char msg[256];
    g->ops->error_text(g->ctx, rc, msg, sizeof msg);
    set_err(err, err_len, "%s %s%s%s%s: %s", g->ops->name, op, what ? " (" : "", what ? what : "",
            what ? ")" : "", msg);
    return g->ops->status_of(rc);
}

int sf__gpu_usable(int device)
{
    const struct sf__gpu_ops *ops = sf__gpu_cuda_ops();
    if (ops == NULL || device < -1)
        return 0;
    int n = 0;
    if (ops->device_count(NULL, &n) != 0) {
        char msg[64];
        ops->error_text(NULL, 1, msg, sizeof msg); /* no driver or GPU: clear the error */
        return 0;
    }
    return device == -1 ? n > 0 : device < n;
}

/* ------------------------------------------------------------------ host memory */

void *sf__host_alloc(size_t bytes, int pinned_wanted, int *pinned)
{
    *pinned = 0;
    if (bytes == 0)
        bytes = 1;
    if (pinned_wanted && sf__gpu_usable(-1)) {
        const struct sf__gpu_ops *ops = sf__gpu_cuda_ops();
        void *p = NULL;
        int rc = ops->host_alloc(NULL, &p, bytes);
        if (rc == 0) {
            *pinned = 1;
            return p;
        }
        /* Pinned memory is a limited resource: plain memory still works
         * (the copy is then staged by the driver). */
        char msg[64];
        ops->error_text(NULL, rc, msg, sizeof msg);
    }
    void *p = NULL;
    if (posix_memalign(&p, SF_HOST_ALIGN, bytes) != 0)
        return NULL;
    return p;
}

void sf__host_free(void *p, int pinned)
{
    if (p == NULL)
        return;
    const struct sf__gpu_ops *ops = sf__gpu_cuda_ops();
    if (pinned && ops != NULL) {
        int rc = ops->host_free(NULL, p);
        if (rc != 0) {
            char msg[64];
            ops->error_text(NULL, rc, msg, sizeof msg);
        }
    } else {
        free(p);
    }
}

/* ------------------------------------------------------------------ device ring */

void sf__gpu_close(struct sf_gpu *g)
{
    if (g == NULL)
        return;
    const struct sf__gpu_ops *o = g->ops;
    if (o != NULL) {
        (void)o->set_device(g->ctx, g->device);
        /* Jobs may still be queued: they must finish before their buffers go. */
        if (g->stream != NULL)
            (void)o->stream_sync(g->ctx, g->stream);
        /* So may work a consumer queued on its own stream before it released
         * a slot that no copy has waited for since (the last batches): the
         * copy stream knows nothing of it, and freeing a buffer is not
         * documented to wait for other streams. */
        for (unsigned i = 0; g->slot != NULL && i < g->slots; i++)
            for (unsigned r = 0; r < g->slot[i].n_released; r++)
                (void)o->event_sync(g->ctx, g->slot[i].released[r]);
        for (unsigned i = 0; g->slot != NULL && i < g->slots; i++) {
            const struct sf_gpu_slot *s = &g->slot[i];
            void *const events[] = {s->start,       s->done,        s->released[0],
                                    s->released[1], s->released[2], s->released[3]};
            _Static_assert(SF_GPU_RELEASE_EVENTS == 4, "events[] lists every release event");
            void *const buffers[] = {s->u8, s->f32};
            for (size_t e = 0; e < sizeof events / sizeof events[0]; e++)
                if (events[e] != NULL)
                    (void)o->event_destroy(g->ctx, events[e]);
            for (size_t b = 0; b < sizeof buffers / sizeof buffers[0]; b++)
                if (buffers[b] != NULL)
                    (void)o->dev_free(g->ctx, buffers[b]);
        }
        if (g->stream != NULL)
            (void)o->stream_destroy(g->ctx, g->stream);
        char msg[64];
        o->error_text(g->ctx, 0, msg, sizeof msg);
    }
    free(g->slot);
    sf__emu_destroy(g->emu);
    free(g);
}

static sf_status open_backend(struct sf_gpu *g, const struct sf__gpu_config *c, char *err,
                              size_t err_len)
{
    if (c->backend == SF__GPU_EMULATED) {
        struct sf__emu_options eo;
        if (c->emu != NULL) {
            eo = *c->emu;
        } else {
            sf__emu_options_default(&eo);
            if (sf__emu_options_from_env(&eo, err, err_len) != 0)
                return SF_ERR_INVALID_ARGUMENT;
        }
        if (sf__emu_new(&eo, &g->emu) != 0) {
            set_err(err, err_len, "emulated device: out of memory");
            return SF_ERR_NO_MEMORY;
        }
        g->ops = sf__gpu_emu_ops();
        g->ctx = g->emu;
        return SF_OK;
    }
    g->ops = sf__gpu_cuda_ops();
    if (g->ops == NULL) {
        set_err(err, err_len, "no GPU: shardfeed was built without CUDA");
        return SF_ERR_UNSUPPORTED;
    }
    return SF_OK;
}

sf_status sf__gpu_open(const struct sf__gpu_config *c, struct sf_gpu **out, char *err,
                       size_t err_len)
{
    if (out == NULL || c == NULL) {
        set_err(err, err_len, "sf__gpu_open: %s is NULL", out == NULL ? "out" : "config");
        return SF_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (c->slots == 0 || c->slots > SF_GPU_MAX_SLOTS || c->u8_bytes == 0) {
        set_err(err, err_len, "sf__gpu_open: %u slots of %zu bytes (1..%u slots, bytes > 0)",
                c->slots, c->u8_bytes, SF_GPU_MAX_SLOTS);
        return SF_ERR_INVALID_ARGUMENT;
    }
    struct sf_gpu *g = calloc(1, sizeof *g);
    if (g == NULL) {
        set_err(err, err_len, "sf__gpu_open: out of memory");
        return SF_ERR_NO_MEMORY;
    }
    g->backend = c->backend;
    g->device = c->device;
    g->u8_bytes = c->u8_bytes;
    g->f32_bytes = c->f32_bytes;
    sf_status st = open_backend(g, c, err, err_len);
    if (st != SF_OK) {
        sf__gpu_close(g);
        return st;
    }
    const struct sf__gpu_ops *o = g->ops;
    int n = 0, rc = o->device_count(g->ctx, &n);
    if (rc != 0 || n == 0) {
        if (rc != 0)
            dev_fail(g, err, err_len, "device count", NULL, rc);
        else
            set_err(err, err_len, "no %s device found", o->name);
        sf__gpu_close(g);
        return SF_ERR_UNSUPPORTED;
    }
    if (c->device < 0 || c->device >= n) {
        set_err(err, err_len, "%s device %d does not exist (%d device%s)", o->name, c->device, n,
                n == 1 ? "" : "s");
        sf__gpu_close(g);
        return SF_ERR_INVALID_ARGUMENT;
    }
    g->slot = calloc(c->slots, sizeof *g->slot);
    if (g->slot == NULL) {
        sf__gpu_close(g);
        set_err(err, err_len, "sf__gpu_open: out of memory");
        return SF_ERR_NO_MEMORY;
    }
    /* From here sf__gpu_close frees whatever exists: slots counts the
     * zero-initialised entries it may look at. */
    g->slots = c->slots;

    char what[64];
    if ((rc = o->set_device(g->ctx, g->device)) != 0) {
        snprintf(what, sizeof what, "device %d", g->device);
        st = dev_fail(g, err, err_len, "set device", what, rc);
        goto fail;
    }
    if ((rc = o->unit_count(g->ctx, g->device, &g->units)) != 0) {
        st = dev_fail(g, err, err_len, "device attribute", "multiprocessor count", rc);
        goto fail;
    }
    if ((rc = o->stream_create(g->ctx, &g->stream)) != 0) {
        g->stream = NULL;
        st = dev_fail(g, err, err_len, "stream create", NULL, rc);
        goto fail;
    }
    for (unsigned i = 0; i < g->slots; i++) {
        struct sf_gpu_slot *s = &g->slot[i];
        if ((rc = o->dev_alloc(g->ctx, &s->u8, c->u8_bytes)) != 0) {
            s->u8 = NULL;
            snprintf(what, sizeof what, "slot %u u8, %zu bytes", i, c->u8_bytes);
            st = dev_fail(g, err, err_len, "device alloc", what, rc);
            goto fail;
        }
        if (c->f32_bytes > 0 && (rc = o->dev_alloc(g->ctx, &s->f32, c->f32_bytes)) != 0) {
            s->f32 = NULL;
            snprintf(what, sizeof what, "slot %u f32, %zu bytes", i, c->f32_bytes);
            st = dev_fail(g, err, err_len, "device alloc", what, rc);
            goto fail;
        }
        /* Timing stays on for start and done: the job's device time. */
        const struct {
            void **ev;
            int timing;
            const char *name;
        } events[] = {{&s->start, 1, "start"},
                      {&s->done, 1, "done"},
                      {&s->released[0], 0, "released 0"},
                      {&s->released[1], 0, "released 1"},
                      {&s->released[2], 0, "released 2"},
                      {&s->released[3], 0, "released 3"}};
        _Static_assert(SF_GPU_RELEASE_EVENTS == 4, "events[] creates every release event");
        for (size_t e = 0; e < sizeof events / sizeof events[0]; e++) {
            if ((rc = o->event_create(g->ctx, events[e].ev, events[e].timing)) != 0) {
                *events[e].ev = NULL;
                snprintf(what, sizeof what, "slot %u %s", i, events[e].name);
                st = dev_fail(g, err, err_len, "event create", what, rc);
                goto fail;
            }
        }
    }
    *out = g;
    return SF_OK;

fail:
    sf__gpu_close(g);
    return st;
}

static int mul_overflows(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 1;
    *out = a * b;
    return 0;
}

/* Checks a job against the slot's buffers; fills *elems (bytes of one image)
 * and *total (bytes of all images) for a normalising job. */
static sf_status check_job(const struct sf_gpu *g, const struct sf__gpu_job *job, size_t *elems,
                           size_t *total, char *err, size_t err_len)
{
    if (job->bytes > g->u8_bytes) {
        set_err(err, err_len, "gpu job: %zu bytes do not fit the %zu-byte device buffer",
                job->bytes, g->u8_bytes);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (job->bytes > 0 && job->host == NULL) {
        set_err(err, err_len, "gpu job: host is NULL");
        return SF_ERR_INVALID_ARGUMENT;
    }
    *elems = 0;
    *total = 0;
    if (!job->normalize)
        return SF_OK;
    if (job->layout != SF_LAYOUT_CHW && job->layout != SF_LAYOUT_HWC) {
        set_err(err, err_len, "gpu job: unknown layout %d", (int)job->layout);
        return SF_ERR_INVALID_ARGUMENT;
    }
    for (int c = 0; c < 3; c++) {
        if (!isfinite(job->mean[c]) || !isfinite(job->std[c]) || job->std[c] == 0.0f) {
            set_err(err, err_len, "gpu job: mean[%d] = %g, std[%d] = %g (finite, std != 0)", c,
                    (double)job->mean[c], c, (double)job->std[c]);
            return SF_ERR_INVALID_ARGUMENT;
        }
    }
    size_t plane, e, t, f;
    /* The kernel indexes within one image in 32 bits (e + 3 must not wrap). */
    if (mul_overflows(job->width, job->height, &plane) || mul_overflows(plane, 3, &e) ||
        e > UINT32_MAX - 4u || mul_overflows(e, job->n_images, &t) ||
        mul_overflows(t, sizeof(float), &f)) {
        set_err(err, err_len, "gpu job: %zu images of %ux%u overflow", job->n_images, job->width,
                job->height);
        return SF_ERR_LIMIT;
    }
    if (t > job->bytes) {
        set_err(err, err_len, "gpu job: %zu images of %ux%ux3 need %zu bytes, the job copies %zu",
                job->n_images, job->width, job->height, t, job->bytes);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (f > g->f32_bytes) {
        set_err(err, err_len, "gpu job: %zu float bytes do not fit the %zu-byte f32 buffer", f,
                g->f32_bytes);
        return SF_ERR_INVALID_ARGUMENT;
    }
    *elems = e;
    *total = t;
    return SF_OK;
}

static sf_status check_slot(const struct sf_gpu *g, unsigned slot, const char *fn, char *err,
                            size_t err_len)
{
    if (g == NULL) {
        set_err(err, err_len, "%s: no gpu handle", fn);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (slot >= g->slots) {
        set_err(err, err_len, "%s: slot %u of %u", fn, slot, g->slots);
        return SF_ERR_INVALID_ARGUMENT;
    }
    return SF_OK;
}

sf_status sf__gpu_submit(struct sf_gpu *g, unsigned slot, const struct sf__gpu_job *job, char *err,
                         size_t err_len)
{
    sf_status st = check_slot(g, slot, "sf__gpu_submit", err, err_len);
    if (st != SF_OK)
        return st;
    if (job == NULL) {
        set_err(err, err_len, "sf__gpu_submit: job is NULL");
        return SF_ERR_INVALID_ARGUMENT;
    }
    size_t elems, total;
    if ((st = check_job(g, job, &elems, &total, err, err_len)) != SF_OK)
        return st;

    const struct sf__gpu_ops *o = g->ops;
    struct sf_gpu_slot *s = &g->slot[slot];
    char what[48];
    snprintf(what, sizeof what, "slot %u", slot);
    s->has_job = 0;
    int rc;
    if ((rc = o->set_device(g->ctx, g->device)) != 0)
        return dev_fail(g, err, err_len, "set device", what, rc);
    /* Work the consumers queued on their streams before they released the
     * slot still reads the old contents. */
    for (unsigned r = 0; r < s->n_released && !g->ignore_release; r++)
        if ((rc = o->stream_wait_event(g->ctx, g->stream, s->released[r])) != 0)
            return dev_fail(g, err, err_len, "stream wait event", "consumer release", rc);
    s->n_released = 0;
    if ((rc = o->event_record(g->ctx, s->start, g->stream)) != 0)
        return dev_fail(g, err, err_len, "event record", "start", rc);
    if (job->bytes > 0 &&
        (rc = o->copy_h2d(g->ctx, s->u8, job->host, job->bytes, g->stream)) != 0)
        return dev_fail(g, err, err_len, "copy host to device", what, rc);
    if (job->normalize && total > 0) {
        struct sf__norm_launch l = {
            .in = s->u8,
            .out = s->f32,
            .n_images = job->n_images,
            .elems = (uint32_t)elems,
            .plane = (uint32_t)(elems / 3u),
            .hwc = job->layout == SF_LAYOUT_HWC,
        };
        memcpy(l.mean, job->mean, sizeof l.mean);
        memcpy(l.std, job->std, sizeof l.std);
        sf_k_grid(l.n_images, l.elems, g->units, &l.gx, &l.gy);
        if ((rc = o->launch_normalize(g->ctx, &l, g->stream)) != 0)
            return dev_fail(g, err, err_len, "normalize launch", what, rc);
    }
    if ((rc = o->event_record(g->ctx, s->done, g->stream)) != 0)
        return dev_fail(g, err, err_len, "event record", "done", rc);
    s->has_job = 1;
    return SF_OK;
}

sf_status sf__gpu_wait(struct sf_gpu *g, unsigned slot, double *copy_s, char *err, size_t err_len)
{
    if (copy_s != NULL)
        *copy_s = 0.0;
    sf_status st = check_slot(g, slot, "sf__gpu_wait", err, err_len);
    if (st != SF_OK)
        return st;
    struct sf_gpu_slot *s = &g->slot[slot];
    char what[48];
    snprintf(what, sizeof what, "slot %u", slot);
    int rc;
    /* No set_device: events carry their device, and the consumer's
     * thread keeps whatever device it has made current. */
    if ((rc = g->ops->event_sync(g->ctx, s->done)) != 0)
        return dev_fail(g, err, err_len, "event sync", what, rc);
    /* A slot with no job has nothing to time (its events were never
     * recorded together). */
    if (copy_s != NULL && s->has_job) {
        float ms = 0.0f;
        if ((rc = g->ops->event_elapsed_ms(g->ctx, &ms, s->start, s->done)) != 0)
            return dev_fail(g, err, err_len, "event elapsed time", what, rc);
        *copy_s = (double)ms / 1000.0;
    }
    return SF_OK;
}

int sf__gpu_query(struct sf_gpu *g, unsigned slot)
{
    if (g == NULL || slot >= g->slots)
        return -1;
    int rc = g->ops->event_query(g->ctx, g->slot[slot].done);
    if (rc == 0)
        return 1;
    if (rc == g->ops->not_ready)
        return 0;
    char msg[64];
    g->ops->error_text(g->ctx, rc, msg, sizeof msg);
    return -1;
}

void *sf__gpu_u8(struct sf_gpu *g, unsigned slot)
{
    return g != NULL && slot < g->slots ? g->slot[slot].u8 : NULL;
}

void *sf__gpu_f32(struct sf_gpu *g, unsigned slot)
{
    return g != NULL && slot < g->slots ? g->slot[slot].f32 : NULL;
}

void *sf__gpu_event(struct sf_gpu *g, unsigned slot)
{
    return g != NULL && slot < g->slots ? g->slot[slot].done : NULL;
}

void *sf__gpu_stream_for_release(void *stream)
{
    /* cudaStreamPerThread -> cudaStreamLegacy (their documented handles) */
    return stream == (void *)2 ? (void *)1 : stream;
}

sf_status sf__gpu_release_after(struct sf_gpu *g, unsigned slot, void *stream)
{
    return sf__gpu_release_after_streams(g, slot, &stream, 1);
}

sf_status sf__gpu_release_after_streams(struct sf_gpu *g, unsigned slot, void *const *streams,
                                        size_t n)
{
    if (g == NULL || slot >= g->slots || (streams == NULL && n > 0))
        return SF_ERR_INVALID_ARGUMENT;
    /* The distinct streams first: over the bound, nothing is recorded. */
    void *distinct[SF_GPU_RELEASE_EVENTS];
    unsigned k = 0;
    for (size_t i = 0; i < n; i++) {
        void *st = sf__gpu_stream_for_release(streams[i]);
        unsigned j = 0;
        while (j < k && distinct[j] != st)
            j++;
        if (j < k)
            continue;
        if (k == SF_GPU_RELEASE_EVENTS)
            return SF_ERR_LIMIT;
        distinct[k++] = st;
    }
    struct sf_gpu_slot *s = &g->slot[slot];
    sf_status first = SF_OK;
    s->n_released = 0;
    int rc = g->ops->set_device(g->ctx, g->device);
    /* Every stream the device takes is recorded, also after one it refuses:
     * the copy then waits for those at least. */
    for (unsigned j = 0; j < k && rc == 0; j++) {
        void *ev = s->released[s->n_released];
        int r = g->ops->event_record(g->ctx, ev, distinct[j]);
        if (r == 0) {
            s->n_released++;
            continue;
        }
        char msg[64];
        g->ops->error_text(g->ctx, r, msg, sizeof msg);
        if (first == SF_OK)
            first = g->ops->status_of(r); /* an unknown stream is the caller's, not a bug */
    }
    if (rc != 0) {
        char msg[64];
        g->ops->error_text(g->ctx, rc, msg, sizeof msg);
        return g->ops->status_of(rc);
    }
    return first;
}

sf_status sf__gpu_stream_wait(struct sf_gpu *g, void *event, void *stream)
{
    if (g == NULL || event == NULL)
        return SF_ERR_INVALID_ARGUMENT;
    int rc = g->ops->stream_wait_event(g->ctx, stream, event);
    if (rc != 0) {
        char msg[64];
        g->ops->error_text(g->ctx, rc, msg, sizeof msg);
        return g->ops->status_of(rc);
    }
    return SF_OK;
}

int sf__gpu_device(const struct sf_gpu *g)
{
    return g != NULL ? g->device : -1;
}

enum sf__gpu_backend sf__gpu_backend_of(const struct sf_gpu *g)
{
    return g->backend;
}

struct sf__emu *sf__gpu_emu(const struct sf_gpu *g)
{
    return g != NULL ? g->emu : NULL;
}

void sf__gpu_test_ignore_release(struct sf_gpu *g, int on)
{
    g->ignore_release = on;
}

sf_status sf__gpu_read(struct sf_gpu *g, unsigned slot, int f32, void *dst, size_t bytes,
                       char *err, size_t err_len)
{
    sf_status st = check_slot(g, slot, "sf__gpu_read", err, err_len);
    if (st != SF_OK)
        return st;
    const void *src = f32 ? g->slot[slot].f32 : g->slot[slot].u8;
    if ((bytes > 0 && dst == NULL) || src == NULL || bytes > (f32 ? g->f32_bytes : g->u8_bytes)) {
        set_err(err, err_len, "sf__gpu_read: %zu bytes of slot %u's %s buffer", bytes, slot,
                f32 ? "f32" : "u8");
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (bytes == 0)
        return SF_OK;
    /* A synchronous copy would run on the legacy default stream, which does
     * not wait for a non-blocking stream: queue on the copy stream instead. */
    char what[48];
    snprintf(what, sizeof what, "slot %u", slot);
    int rc;
    if ((rc = g->ops->set_device(g->ctx, g->device)) != 0)
        return dev_fail(g, err, err_len, "set device", what, rc);
    if ((rc = g->ops->copy_d2h(g->ctx, dst, src, bytes, g->stream)) != 0)
        return dev_fail(g, err, err_len, "copy device to host", what, rc);
    if ((rc = g->ops->stream_sync(g->ctx, g->stream)) != 0)
        return dev_fail(g, err, err_len, "stream sync", what, rc);
    return SF_OK;
}
