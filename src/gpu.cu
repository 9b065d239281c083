/* Host batch memory and the GPU prefetcher, CUDA build (contract: gpu.h).
 *
 * One sf_gpu owns a non-blocking copy stream and a ring of slots; each slot
 * has a u8 device buffer, an optional f32 buffer and two timing events
 * (start, done) recorded around its job, so sf__gpu_wait can report the job's
 * GPU time. Threads: submit, wait and query on a slot are ordered by the
 * caller's ring logic. open, submit, close (and the test readback) make
 * `device` current on the calling thread (cudaSetDevice); wait and query do
 * not, so a consumer thread keeps its own current device. sf__host_alloc
 * pins in the calling thread's current context: open the ring first on that
 * thread, or a process on GPU 3 also creates a context on GPU 0. */
#include "src/gpu.h"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SF_HOST_ALIGN    4096
#define SF_GPU_MAX_SLOTS 1024
#define SF_NORM_THREADS  256

struct sf_gpu_slot {
    unsigned char *u8;
    float *f32;
    cudaEvent_t start, done;
    /* Recorded on the consumer's stream when it released the slot
     * (sf__gpu_release_after); the next copy into the slot waits on it. */
    cudaEvent_t released;
    int wait_released;
    int has_job; /* 1 once a job was submitted whole (both events recorded) */
};

struct sf_gpu {
    int device;
    int sm_count;
    unsigned slots;
    size_t u8_bytes, f32_bytes;
    cudaStream_t stream;
    struct sf_gpu_slot *slot;
};

/* mean/std travel to the kernel by value (kernel parameter space). */
struct sf_norm_params {
    float mean[3];
    float std[3];
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

static sf_status status_of(cudaError_t rc)
{
    switch (rc) {
    case cudaErrorMemoryAllocation: return SF_ERR_NO_MEMORY;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice: return SF_ERR_INVALID_ARGUMENT;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver: return SF_ERR_UNSUPPORTED;
    default: return SF_ERR_IO; /* the device or driver failed */
    }
}

/* Formats "<call>[ (what)]: <cuda message>", clears the runtime's last error
 * (a non-sticky failure must not fail the next unrelated call) and maps the
 * code to a status. */
static sf_status cuda_fail(char *err, size_t err_len, const char *call, const char *what,
                           cudaError_t rc)
{
    set_err(err, err_len, "%s%s%s%s: %s (%s)", call, what ? " (" : "", what ? what : "",
            what ? ")" : "", cudaGetErrorString(rc), cudaGetErrorName(rc));
    (void)cudaGetLastError();
    return status_of(rc);
}

static int device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        /* No driver or no GPU: a normal situation; clear the error. */
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int sf__gpu_usable(int device)
{
    if (device < -1)
        return 0;
    int n = device_count();
    return device == -1 ? n > 0 : device < n;
}

/* ------------------------------------------------------------------ host memory */

extern "C" void *sf__host_alloc(size_t bytes, int pinned_wanted, int *pinned)
{
    *pinned = 0;
    if (bytes == 0)
        bytes = 1;
    if (pinned_wanted && sf__gpu_usable(-1)) {
        void *p = NULL;
        if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess) {
            *pinned = 1;
            return p;
        }
        /* Pinned memory is a limited resource: plain memory still works
         * (the copy is then staged by the driver). */
        (void)cudaGetLastError();
    }
    void *p = NULL;
    if (posix_memalign(&p, SF_HOST_ALIGN, bytes) != 0)
        return NULL;
    return p;
}

extern "C" void sf__host_free(void *p, int pinned)
{
    if (p == NULL)
        return;
    if (pinned) {
        if (cudaFreeHost(p) != cudaSuccess)
            (void)cudaGetLastError();
    } else {
        free(p);
    }
}

/* ------------------------------------------------------------------ device ring */

extern "C" void sf__gpu_close(struct sf_gpu *g)
{
    if (g == NULL)
        return;
    (void)cudaSetDevice(g->device);
    /* Jobs may still be queued: they must finish before their buffers go. */
    if (g->stream != NULL)
        (void)cudaStreamSynchronize(g->stream);
    if (g->slot != NULL) {
        for (unsigned i = 0; i < g->slots; i++) {
            struct sf_gpu_slot *s = &g->slot[i];
            if (s->start != NULL)
                (void)cudaEventDestroy(s->start);
            if (s->done != NULL)
                (void)cudaEventDestroy(s->done);
            if (s->released != NULL)
                (void)cudaEventDestroy(s->released);
            if (s->u8 != NULL)
                (void)cudaFree(s->u8);
            if (s->f32 != NULL)
                (void)cudaFree(s->f32);
        }
        free(g->slot);
    }
    if (g->stream != NULL)
        (void)cudaStreamDestroy(g->stream);
    (void)cudaGetLastError();
    free(g);
}

extern "C" sf_status sf__gpu_open(int device, unsigned slots, size_t u8_bytes, size_t f32_bytes,
                                  struct sf_gpu **out, char *err, size_t err_len)
{
    if (out == NULL) {
        set_err(err, err_len, "sf__gpu_open: out is NULL");
        return SF_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (slots == 0 || slots > SF_GPU_MAX_SLOTS || u8_bytes == 0) {
        set_err(err, err_len, "sf__gpu_open: %u slots of %zu bytes (1..%u slots, bytes > 0)", slots,
                u8_bytes, SF_GPU_MAX_SLOTS);
        return SF_ERR_INVALID_ARGUMENT;
    }
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess || n == 0) {
        if (rc != cudaSuccess) {
            set_err(err, err_len, "no usable CUDA device (cudaGetDeviceCount: %s)",
                    cudaGetErrorString(rc));
            (void)cudaGetLastError();
        } else {
            set_err(err, err_len, "no CUDA device found");
        }
        return SF_ERR_UNSUPPORTED;
    }
    if (device < 0 || device >= n) {
        set_err(err, err_len, "CUDA device %d does not exist (%d device%s)", device, n,
                n == 1 ? "" : "s");
        return SF_ERR_INVALID_ARGUMENT;
    }

    struct sf_gpu *g = (struct sf_gpu *)calloc(1, sizeof *g);
    if (g == NULL) {
        set_err(err, err_len, "sf__gpu_open: out of memory");
        return SF_ERR_NO_MEMORY;
    }
    g->device = device;
    g->u8_bytes = u8_bytes;
    g->f32_bytes = f32_bytes;
    g->slot = (struct sf_gpu_slot *)calloc(slots, sizeof *g->slot);
    if (g->slot == NULL) {
        free(g);
        set_err(err, err_len, "sf__gpu_open: out of memory");
        return SF_ERR_NO_MEMORY;
    }
    /* From here sf__gpu_close frees whatever exists: slots counts the
     * zero-initialised entries it may look at. */
    g->slots = slots;

    sf_status st;
    char what[64];
    if ((rc = cudaSetDevice(device)) != cudaSuccess) {
        snprintf(what, sizeof what, "device %d", device);
        st = cuda_fail(err, err_len, "cudaSetDevice", what, rc);
        goto fail;
    }
    if ((rc = cudaDeviceGetAttribute(&g->sm_count, cudaDevAttrMultiProcessorCount, device)) !=
        cudaSuccess) {
        st = cuda_fail(err, err_len, "cudaDeviceGetAttribute", "multiprocessor count", rc);
        goto fail;
    }
    if ((rc = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        g->stream = NULL;
        st = cuda_fail(err, err_len, "cudaStreamCreateWithFlags", NULL, rc);
        goto fail;
    }
    for (unsigned i = 0; i < slots; i++) {
        struct sf_gpu_slot *s = &g->slot[i];
        void *p = NULL;
        if ((rc = cudaMalloc(&p, u8_bytes)) != cudaSuccess) {
            snprintf(what, sizeof what, "slot %u u8, %zu bytes", i, u8_bytes);
            st = cuda_fail(err, err_len, "cudaMalloc", what, rc);
            goto fail;
        }
        s->u8 = (unsigned char *)p;
        if (f32_bytes > 0) {
            p = NULL;
            if ((rc = cudaMalloc(&p, f32_bytes)) != cudaSuccess) {
                snprintf(what, sizeof what, "slot %u f32, %zu bytes", i, f32_bytes);
                st = cuda_fail(err, err_len, "cudaMalloc", what, rc);
                goto fail;
            }
            s->f32 = (float *)p;
        }
        /* Default flags: timing stays enabled for cudaEventElapsedTime. */
        if ((rc = cudaEventCreate(&s->start)) != cudaSuccess) {
            s->start = NULL;
            snprintf(what, sizeof what, "slot %u start", i);
            st = cuda_fail(err, err_len, "cudaEventCreate", what, rc);
            goto fail;
        }
        if ((rc = cudaEventCreate(&s->done)) != cudaSuccess) {
            s->done = NULL;
            snprintf(what, sizeof what, "slot %u done", i);
            st = cuda_fail(err, err_len, "cudaEventCreate", what, rc);
            goto fail;
        }
        if ((rc = cudaEventCreateWithFlags(&s->released, cudaEventDisableTiming)) != cudaSuccess) {
            s->released = NULL;
            snprintf(what, sizeof what, "slot %u released", i);
            st = cuda_fail(err, err_len, "cudaEventCreate", what, rc);
            goto fail;
        }
    }
    *out = g;
    return SF_OK;

fail:
    sf__gpu_close(g);
    return st;
}

/* ------------------------------------------------------------------ normalise kernel */

/* Channel of element e (0 <= e < 3 * plane) of one image. */
template <bool HWC> __device__ __forceinline__ unsigned channel_of(uint32_t e, uint32_t plane)
{
    if (HWC)
        return e % 3u;
    return (unsigned)(e >= plane) + (unsigned)(e >= 2u * plane);
}

/*
 * out[i] = (in[i] / 255 - mean[c]) / std[c] for n_images images of
 * elems = 3 * plane bytes each. A byte has only 256 values, so each block
 * first tabulates the 3 x 256 results in shared memory with exactly that
 * float expression (IEEE division: results equal a CPU computing the same
 * formula in float), then every element is one table lookup: the kernel
 * moves 5 bytes per element and stays bandwidth-bound.
 *
 * blockIdx.y strides over images, x over 4-byte groups of one image. An
 * image starts at byte img * elems, which is not 4-aligned when elems is odd:
 * the first `head` (< 4) bytes up to the aligned boundary and the last
 * `tail` (< 4) bytes are done one by one, the rest as uchar4 -> float4.
 */
template <bool HWC>
__global__ void __launch_bounds__(SF_NORM_THREADS)
    normalize_kernel(const unsigned char *__restrict__ in, float *__restrict__ out, size_t n_images,
                     uint32_t elems, uint32_t plane, sf_norm_params p)
{
    __shared__ float lut[3 * 256];
    for (unsigned i = threadIdx.x; i < 3 * 256; i += blockDim.x) {
        unsigned c = i >> 8;
        lut[i] = ((float)(i & 255u) / 255.0f - p.mean[c]) / p.std[c];
    }
    __syncthreads();

    const uint32_t tx = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t stride = gridDim.x * blockDim.x;
    for (size_t img = blockIdx.y; img < n_images; img += gridDim.y) {
        const size_t base = img * (size_t)elems;
        uint32_t head = (uint32_t)((4u - (base & 3u)) & 3u);
        if (head > elems)
            head = elems;
        const uint32_t nvec = (elems - head) / 4u;
        const uint32_t tail0 = head + 4u * nvec;
        const unsigned char *src = in + base;
        float *dst = out + base;

        for (uint32_t v = tx; v < nvec; v += stride) {
            const uint32_t e = head + 4u * v;
            const uchar4 q = *reinterpret_cast<const uchar4 *>(src + e);
            float4 r;
            if (HWC) {
                const unsigned c0 = e % 3u;
                const unsigned c1 = c0 == 2u ? 0u : c0 + 1u;
                const unsigned c2 = c1 == 2u ? 0u : c1 + 1u;
                r.x = lut[c0 * 256u + q.x];
                r.y = lut[c1 * 256u + q.y];
                r.z = lut[c2 * 256u + q.z];
                r.w = lut[c0 * 256u + q.w];
            } else {
                r.x = lut[channel_of<false>(e, plane) * 256u + q.x];
                r.y = lut[channel_of<false>(e + 1u, plane) * 256u + q.y];
                r.z = lut[channel_of<false>(e + 2u, plane) * 256u + q.z];
                r.w = lut[channel_of<false>(e + 3u, plane) * 256u + q.w];
            }
            *reinterpret_cast<float4 *>(dst + e) = r;
        }
        if (tx < head)
            dst[tx] = lut[channel_of<HWC>(tx, plane) * 256u + src[tx]];
        if (tx < elems - tail0) {
            const uint32_t e = tail0 + tx;
            dst[e] = lut[channel_of<HWC>(e, plane) * 256u + src[e]];
        }
    }
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

static sf_status launch_normalize(const struct sf_gpu *g, struct sf_gpu_slot *s,
                                  const struct sf__gpu_job *job, size_t elems, char *err,
                                  size_t err_len)
{
    sf_norm_params p;
    for (int c = 0; c < 3; c++) {
        p.mean[c] = job->mean[c];
        p.std[c] = job->std[c];
    }
    const uint32_t e = (uint32_t)elems;
    const uint32_t plane = e / 3u;
    /* Enough resident blocks to fill the device (8 x 256 threads per SM);
     * the grid-stride loops do the rest, so each block's table is reused. */
    const size_t max_blocks = (size_t)(g->sm_count > 0 ? g->sm_count : 1) * 8u;
    const size_t vec_per_image = e / 4u + 1u;
    size_t gy = job->n_images < max_blocks ? job->n_images : max_blocks;
    if (gy > 65535)
        gy = 65535;
    size_t gx = (vec_per_image + SF_NORM_THREADS - 1) / SF_NORM_THREADS;
    size_t gx_cap = max_blocks / gy;
    if (gx > gx_cap)
        gx = gx_cap;
    if (gx == 0)
        gx = 1;
    dim3 grid((unsigned)gx, (unsigned)gy);
    if (job->layout == SF_LAYOUT_HWC)
        normalize_kernel<true>
            <<<grid, SF_NORM_THREADS, 0, g->stream>>>(s->u8, s->f32, job->n_images, e, plane, p);
    else
        normalize_kernel<false>
            <<<grid, SF_NORM_THREADS, 0, g->stream>>>(s->u8, s->f32, job->n_images, e, plane, p);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return cuda_fail(err, err_len, "normalize kernel launch", NULL, rc);
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

extern "C" sf_status sf__gpu_submit(struct sf_gpu *g, unsigned slot, const struct sf__gpu_job *job,
                                    char *err, size_t err_len)
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

    struct sf_gpu_slot *s = &g->slot[slot];
    s->has_job = 0;
    cudaError_t rc;
    if ((rc = cudaSetDevice(g->device)) != cudaSuccess)
        return cuda_fail(err, err_len, "cudaSetDevice", NULL, rc);
    /* Work the consumer queued on its stream before it released the slot
     * still reads the old contents. */
    if (s->wait_released && (rc = cudaStreamWaitEvent(g->stream, s->released, 0)) != cudaSuccess)
        return cuda_fail(err, err_len, "cudaStreamWaitEvent", "consumer release", rc);
    s->wait_released = 0;
    if ((rc = cudaEventRecord(s->start, g->stream)) != cudaSuccess)
        return cuda_fail(err, err_len, "cudaEventRecord", "start", rc);
    if (job->bytes > 0 && (rc = cudaMemcpyAsync(s->u8, job->host, job->bytes,
                                                cudaMemcpyHostToDevice, g->stream)) != cudaSuccess)
        return cuda_fail(err, err_len, "cudaMemcpyAsync", "host to device", rc);
    if (job->normalize && total > 0 &&
        (st = launch_normalize(g, s, job, elems, err, err_len)) != SF_OK)
        return st;
    if ((rc = cudaEventRecord(s->done, g->stream)) != cudaSuccess)
        return cuda_fail(err, err_len, "cudaEventRecord", "done", rc);
    s->has_job = 1;
    return SF_OK;
}

extern "C" sf_status sf__gpu_wait(struct sf_gpu *g, unsigned slot, double *copy_s, char *err,
                                  size_t err_len)
{
    if (copy_s != NULL)
        *copy_s = 0.0;
    sf_status st = check_slot(g, slot, "sf__gpu_wait", err, err_len);
    if (st != SF_OK)
        return st;
    struct sf_gpu_slot *s = &g->slot[slot];
    cudaError_t rc;
    /* No cudaSetDevice: events carry their device, and the consumer's
     * thread keeps whatever device it has made current. */
    if ((rc = cudaEventSynchronize(s->done)) != cudaSuccess)
        return cuda_fail(err, err_len, "cudaEventSynchronize", NULL, rc);
    /* A slot with no job has nothing to time (its events were never
     * recorded together). */
    if (copy_s != NULL && s->has_job) {
        float ms = 0.0f;
        if ((rc = cudaEventElapsedTime(&ms, s->start, s->done)) != cudaSuccess)
            return cuda_fail(err, err_len, "cudaEventElapsedTime", NULL, rc);
        *copy_s = (double)ms / 1000.0;
    }
    return SF_OK;
}

extern "C" int sf__gpu_query(struct sf_gpu *g, unsigned slot)
{
    if (g == NULL || slot >= g->slots)
        return -1;
    cudaError_t rc = cudaEventQuery(g->slot[slot].done); /* any current device */
    if (rc == cudaSuccess)
        return 1;
    if (rc == cudaErrorNotReady)
        return 0;
    (void)cudaGetLastError();
    return -1;
}

extern "C" void *sf__gpu_u8(struct sf_gpu *g, unsigned slot)
{
    return g != NULL && slot < g->slots ? (void *)g->slot[slot].u8 : NULL;
}

extern "C" void *sf__gpu_f32(struct sf_gpu *g, unsigned slot)
{
    return g != NULL && slot < g->slots ? (void *)g->slot[slot].f32 : NULL;
}

extern "C" void *sf__gpu_event(struct sf_gpu *g, unsigned slot)
{
    return g != NULL && slot < g->slots ? (void *)g->slot[slot].done : NULL;
}

extern "C" sf_status sf__gpu_release_after(struct sf_gpu *g, unsigned slot, void *stream)
{
    if (g == NULL || slot >= g->slots)
        return SF_ERR_INVALID_ARGUMENT;
    struct sf_gpu_slot *s = &g->slot[slot];
    if (cudaSetDevice(g->device) != cudaSuccess ||
        cudaEventRecord(s->released, (cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return SF_ERR_INTERNAL;
    }
    s->wait_released = 1;
    return SF_OK;
}

extern "C" sf_status sf__gpu_stream_wait(void *event, void *stream)
{
    cudaError_t rc = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return status_of(rc);
    }
    return SF_OK;
}

extern "C" int sf__gpu_device(const struct sf_gpu *g)
{
    return g != NULL ? g->device : -1;
}

extern "C" sf_status sf__gpu_read(struct sf_gpu *g, unsigned slot, int f32, void *dst, size_t bytes)
{
    if (g == NULL || slot >= g->slots || (bytes > 0 && dst == NULL))
        return SF_ERR_INVALID_ARGUMENT;
    const void *src = f32 ? (const void *)g->slot[slot].f32 : (const void *)g->slot[slot].u8;
    if (bytes > (f32 ? g->f32_bytes : g->u8_bytes))
        return SF_ERR_INVALID_ARGUMENT;
    if (bytes == 0)
        return SF_OK;
    /* cudaMemcpy would run on the legacy default stream, which does not wait
     * for a non-blocking stream: queue on the copy stream instead. */
    if (cudaSetDevice(g->device) != cudaSuccess ||
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream) != cudaSuccess ||
        cudaStreamSynchronize(g->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return SF_ERR_IO;
    }
    return SF_OK;
}

/* ------------------------------------------------------------------ NVTX */

extern "C" void sf__nvtx_push(const char *name)
{
    /* Pushed even for NULL so that pushes and pops stay paired. */
    nvtxRangePushA(name != NULL ? name : "");
}

extern "C" void sf__nvtx_pop(void)
{
    nvtxRangePop();
}

extern "C" void sf__nvtx_name_thread(const char *name)
{
    if (name == NULL)
        return;
    nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), name);
}
