/* Host batch memory and the GPU prefetcher: pinned host allocation when CUDA
 * and a device are present (plain page-aligned memory otherwise), a ring of
 * device buffers, a dedicated copy stream with one event per slot, the
 * uint8 -> normalised float32 kernel, and NVTX ranges. Built from gpu.cu with
 * CUDA and from gpu_nocuda.c without; the same calls exist in both, and the
 * CPU build answers SF_ERR_UNSUPPORTED for everything that needs a device.
 * Internal (sf__ prefix). */
#ifndef SF_GPU_H
#define SF_GPU_H

#include "shardfeed.h"
#include "shardfeed_loader.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the build has CUDA and device `device` exists (device -1: any). */
int sf__gpu_usable(int device);

/*
 * Host memory of `bytes` for batches: cudaHostAlloc (portable, pinned) when
 * `pinned_wanted` and CUDA works, else 4096-byte aligned memory. *pinned
 * (not NULL) tells which, for sf__host_free. NULL when out of memory.
 */
void *sf__host_alloc(size_t bytes, int pinned_wanted, int *pinned);
void sf__host_free(void *p, int pinned);

struct sf_gpu;

/* Device ring: `slots` buffers of u8_bytes (the host batch's image bytes) and,
 * when f32_bytes > 0, as many float buffers; one non-blocking copy stream
 * and one event per slot (created without timing disabled, so copy times can
 * be measured). */
sf_status sf__gpu_open(int device, unsigned slots, size_t u8_bytes, size_t f32_bytes,
                       struct sf_gpu **out, char *err, size_t err_len);
void sf__gpu_close(struct sf_gpu *g);

/* What to copy into a slot and how to convert it. */
struct sf__gpu_job {
    const void *host; /* the host batch images (pinned for a real async copy) */
    size_t bytes;     /* bytes to copy (<= u8_bytes) */
    int normalize;    /* 1: also write float32 (x/255-mean)/std into the slot's f32 buffer */
    size_t n_images;
    unsigned width, height;
    enum sf_layout layout;
    float mean[3], std[3];
};

/* Queues the copy (cudaMemcpyAsync on the copy stream), the kernel when asked,
 * and records the slot's event. Returns at once. The slot must not be in use
 * by an earlier job the consumer still holds (the caller's ring logic). */
sf_status sf__gpu_submit(struct sf_gpu *g, unsigned slot, const struct sf__gpu_job *job, char *err,
                         size_t err_len);
/* Blocks until the slot's last job is complete (cudaEventSynchronize);
 * *copy_s (may be NULL) gets the GPU time of the job in seconds. */
sf_status sf__gpu_wait(struct sf_gpu *g, unsigned slot, double *copy_s, char *err, size_t err_len);
/* Non-blocking: 1 when the slot's last job is complete, 0 when not yet, -1 on error. */
int sf__gpu_query(struct sf_gpu *g, unsigned slot);
void *sf__gpu_u8(struct sf_gpu *g, unsigned slot);
void *sf__gpu_f32(struct sf_gpu *g, unsigned slot);
void *sf__gpu_event(struct sf_gpu *g, unsigned slot); /* cudaEvent_t */
/* Test readback: copies the first `bytes` of slot's u8 (f32 = 0) or f32
 * (f32 = 1) buffer to host dst, ordered after the slot's queued work on the
 * copy stream (the default stream would not wait for it); waits. */
sf_status sf__gpu_read(struct sf_gpu *g, unsigned slot, int f32, void *dst, size_t bytes);
int sf__gpu_device(const struct sf_gpu *g);
/* The consumer released the slot after queueing work on `stream` (a
 * cudaStream_t) that reads it: records the slot's release event there; the
 * slot's next sf__gpu_submit makes the copy stream wait on it. */
sf_status sf__gpu_release_after(struct sf_gpu *g, unsigned slot, void *stream);
/* cudaStreamWaitEvent(stream, event): no host synchronisation. */
sf_status sf__gpu_stream_wait(void *event, void *stream);

/* NVTX ranges (nsys shows the stages); no-ops without CUDA. Thread-local
 * push/pop as nvtxRangePushA/nvtxRangePop. */
void sf__nvtx_push(const char *name);
void sf__nvtx_pop(void);
/* Names the calling thread for nsys (nvtxNameOsThreadA); no-op without CUDA. */
void sf__nvtx_name_thread(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_H */
