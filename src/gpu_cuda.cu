/* The CUDA backend of the GPU ring (contract: gpu_dev.h): each operation is
 * one CUDA runtime call and a status mapping, and the normalise kernel is a
 * thin wrapper over gpu_kernel.h. This is the only GPU code no machine of
 * the project runs; everything above it runs on the emulated device in the
 * tests (docs/gpu.md). NVTX ranges live here too. */
#include "src/gpu.h"
#include "src/gpu_dev.h"
#include "src/gpu_kernel.h"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

__global__ void __launch_bounds__(SF_K_THREADS)
    sf_normalize_kernel(const sf_k_u8 *__restrict__ in, float *__restrict__ out, sf_k_u64 n_images,
                        sf_k_u32 elems, sf_k_u32 plane, int hwc, sf_k_params p)
{
    __shared__ float lut[SF_K_LUT];
    sf_k_fill_lut(lut, threadIdx.x, blockDim.x, p);
    __syncthreads();
    sf_k_thread(in, out, lut, n_images, elems, plane, hwc, blockIdx.x * blockDim.x + threadIdx.x,
                gridDim.x * blockDim.x, blockIdx.y, gridDim.y);
}

static int cu_device_count(void *, int *n)
{
    *n = 0;
    return (int)cudaGetDeviceCount(n);
}

static int cu_set_device(void *, int device)
{
    return (int)cudaSetDevice(device);
}

static int cu_unit_count(void *, int device, int *units)
{
    return (int)cudaDeviceGetAttribute(units, cudaDevAttrMultiProcessorCount, device);
}

static int cu_host_alloc(void *, void **p, size_t bytes)
{
    return (int)cudaHostAlloc(p, bytes, cudaHostAllocPortable);
}

static int cu_host_free(void *, void *p)
{
    return (int)cudaFreeHost(p);
}

static int cu_dev_alloc(void *, void **p, size_t bytes)
{
    return (int)cudaMalloc(p, bytes);
}

static int cu_dev_free(void *, void *p)
{
    return (int)cudaFree(p);
}

static int cu_stream_create(void *, void **s)
{
    return (int)cudaStreamCreateWithFlags((cudaStream_t *)s, cudaStreamNonBlocking);
}

static int cu_stream_destroy(void *, void *s)
{
    return (int)cudaStreamDestroy((cudaStream_t)s);
}

static int cu_stream_sync(void *, void *s)
{
    return (int)cudaStreamSynchronize((cudaStream_t)s);
}

/* Blocking sync: the loader's GPU thread sleeps in cudaEventSynchronize
 * instead of spinning a core the decode threads need (the runtime spins by
 * default; measured on an H100 with 16 decode threads on 16 cores). Per
 * event, so the application's own CUDA context keeps its flags. */
static int cu_event_create(void *, void **e, int timing)
{
    unsigned flags = cudaEventBlockingSync | (timing ? cudaEventDefault : cudaEventDisableTiming);
    return (int)cudaEventCreateWithFlags((cudaEvent_t *)e, flags);
}

static int cu_event_destroy(void *, void *e)
{
    return (int)cudaEventDestroy((cudaEvent_t)e);
}

static int cu_event_record(void *, void *e, void *s)
{
    return (int)cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s);
}

static int cu_event_query(void *, void *e)
{
    return (int)cudaEventQuery((cudaEvent_t)e);
}

static int cu_event_sync(void *, void *e)
{
    return (int)cudaEventSynchronize((cudaEvent_t)e);
}

static int cu_event_elapsed_ms(void *, float *ms, void *a, void *b)
{
    return (int)cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b);
}

static int cu_stream_wait_event(void *, void *s, void *e)
{
    return (int)cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0);
}

static int cu_copy_h2d(void *, void *dst, const void *src, size_t n, void *s)
{
    return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, (cudaStream_t)s);
}

static int cu_copy_d2h(void *, void *dst, const void *src, size_t n, void *s)
{
    return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, (cudaStream_t)s);
}

static int cu_launch_normalize(void *, const struct sf__norm_launch *l, void *s)
{
    sf_k_params p = {l->mean[0], l->mean[1], l->mean[2], l->std[0], l->std[1], l->std[2]};
    sf_normalize_kernel<<<dim3(l->gx, l->gy), SF_K_THREADS, 0, (cudaStream_t)s>>>(
        (const sf_k_u8 *)l->in, (float *)l->out, l->n_images, l->elems, l->plane, l->hwc, p);
    return (int)cudaGetLastError();
}

static void cu_error_text(void *, int rc, char *buf, size_t len)
{
    snprintf(buf, len, "%s (%s)", cudaGetErrorString((cudaError_t)rc),
             cudaGetErrorName((cudaError_t)rc));
    (void)cudaGetLastError(); /* a non-sticky failure must not fail the next call */
}

static sf_status cu_status_of(int rc)
{
    switch ((cudaError_t)rc) {
    case cudaSuccess: return SF_OK;
    case cudaErrorMemoryAllocation: return SF_ERR_NO_MEMORY;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice: return SF_ERR_INVALID_ARGUMENT;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver: return SF_ERR_UNSUPPORTED;
    default: return SF_ERR_IO; /* the device or driver failed */
    }
}

static const struct sf__gpu_ops cuda_ops = {
    "cuda",           (int)cudaErrorNotReady, cu_device_count,    cu_set_device,
    cu_unit_count,    cu_host_alloc,          cu_host_free,       cu_dev_alloc,
    cu_dev_free,      cu_stream_create,       cu_stream_destroy,  cu_stream_sync,
    cu_event_create,  cu_event_destroy,       cu_event_record,    cu_event_query,
    cu_event_sync,    cu_event_elapsed_ms,    cu_stream_wait_event, cu_copy_h2d,
    cu_copy_d2h,      cu_launch_normalize,    cu_error_text,      cu_status_of,
};

extern "C" const struct sf__gpu_ops *sf__gpu_cuda_ops(void)
{
    return &cuda_ops;
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
    if (name != NULL)
        nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), name);
}
