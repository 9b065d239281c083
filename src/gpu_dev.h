/* The device operations under the GPU ring (gpu.c): one table per backend.
 * The ring's logic (slots, ordering, timing, error text, cleanup) is
 * portable C and calls only these. Backends:
 *   - CUDA (gpu_cuda.cu): each operation one CUDA runtime call;
 *   - the emulated device (gpu_emu.c): streams as FIFO worker threads, host
 *     inaccessible device memory, checked kernels, injected failures.
 * A later backend (OpenCL, nvJPEG decode on the device) adds operations
 * here. Internal (sf__ prefix). */
#ifndef SF_GPU_DEV_H
#define SF_GPU_DEV_H

#include "shardfeed.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One normalise launch: the grid (sf_k_grid) and the kernel's arguments;
 * in and out are device pointers to the whole batch. */
struct sf__norm_launch {
    const void *in;
    void *out;
    uint64_t n_images;
    uint32_t elems, plane;
    int hwc;
    float mean[3], std[3];
    uint32_t gx, gy;
};

/*
 * Every operation returns the backend's own code: 0 success, `not_ready`
 * (event_query only) for work not finished yet, anything else an error that
 * error_text describes and status_of maps. ctx is the backend instance
 * (NULL for CUDA, the emulated device otherwise). Streams and events are
 * opaque handles (cudaStream_t, cudaEvent_t for CUDA).
 */
struct sf__gpu_ops {
    const char *name; /* "cuda", "emulated" */
    int not_ready;
    int (*device_count)(void *ctx, int *n);
    int (*set_device)(void *ctx, int device);
    int (*unit_count)(void *ctx, int device, int *units); /* multiprocessors */
    int (*host_alloc)(void *ctx, void **p, size_t bytes); /* pinned */
    int (*host_free)(void *ctx, void *p);
    int (*dev_alloc)(void *ctx, void **p, size_t bytes);
    int (*dev_free)(void *ctx, void *p);
    int (*stream_create)(void *ctx, void **stream); /* non-blocking */
    int (*stream_destroy)(void *ctx, void *stream);
    int (*stream_sync)(void *ctx, void *stream);
    int (*event_create)(void *ctx, void **event, int timing);
    int (*event_destroy)(void *ctx, void *event);
    int (*event_record)(void *ctx, void *event, void *stream);
    int (*event_query)(void *ctx, void *event);
    int (*event_sync)(void *ctx, void *event);
    int (*event_elapsed_ms)(void *ctx, float *ms, void *start, void *end);
    int (*stream_wait_event)(void *ctx, void *stream, void *event);
    int (*copy_h2d)(void *ctx, void *dst, const void *src, size_t bytes, void *stream);
    int (*copy_d2h)(void *ctx, void *dst, const void *src, size_t bytes, void *stream);
    int (*launch_normalize)(void *ctx, const struct sf__norm_launch *l, void *stream);
    /* "message (name)" of rc; also clears a non-sticky error state. */
    void (*error_text)(void *ctx, int rc, char *buf, size_t len);
    sf_status (*status_of)(int rc);
};

/* The CUDA table, or NULL in a build without CUDA (gpu_cuda_none.c). */
const struct sf__gpu_ops *sf__gpu_cuda_ops(void);

/* ------------------------------------------------------------------ emulated device */

/* What the emulated device does; sf__emu_options_default() gives the
 * documented defaults (docs/gpu.md), sf__emu_options_from_env() applies
 * SF_GPU_EMULATOR="seed=N,delay_us=N,fail_at=N,fail_async=0|1,units=N,mem_mib=N,
 * kernel_fault=0|1|2". */
struct sf__emu_options {
    uint64_t seed;           /* random delays; default 1 */
    unsigned delay_us;       /* each queued operation first sleeps 0..delay_us; default 200 */
    unsigned long fail_at;   /* the Nth operation call (from 1) fails; 0: none */
    int fail_async;          /* 1: that failure surfaces when the work runs (sticky, like a
                                kernel fault), not from the call */
    int units;               /* multiprocessors reported; default 2 */
    uint64_t mem_bytes;      /* device memory; default 4 GiB */
    /* Tests of the checks themselves: 1 drops the stores of thread 0 of
     * block (0, 0), 2 runs block (0, 0) twice. 0 (default): none. */
    int kernel_fault;
};

void sf__emu_options_default(struct sf__emu_options *o);
/* 0, or -1 with err filled on a malformed variable. */
int sf__emu_options_from_env(struct sf__emu_options *o, char *err, size_t err_len);

struct sf__emu;
int sf__emu_new(const struct sf__emu_options *o, struct sf__emu **out);
/* Waits for every stream's queued work, then frees everything. NULL ok. */
void sf__emu_destroy(struct sf__emu *e);
const struct sf__gpu_ops *sf__gpu_emu_ops(void);

/* Test hooks. Queues fn(arg) on `stream` after the work queued before it
 * (cudaLaunchHostFunc): a consumer's "kernel" that reads device memory with
 * sf__emu_peek. */
int sf__emu_enqueue_fn(struct sf__emu *e, void *stream, void (*fn)(void *arg), void *arg);
/* Copies device memory to the host at once, outside any stream: only from a
 * function queued with sf__emu_enqueue_fn (or with every stream idle). */
int sf__emu_peek(struct sf__emu *e, void *dst, const void *dev, size_t bytes);
/* Operation calls so far (for choosing fail_at in tests). */
unsigned long sf__emu_op_count(const struct sf__emu *e);
/* 1 when p points into emulated device memory. */
int sf__emu_is_device_ptr(const struct sf__emu *e, const void *p);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_DEV_H */
