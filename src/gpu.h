/* Host batch memory and the GPU ring: pinned host allocation when CUDA and a
 * device are present (plain page-aligned memory otherwise), a ring of device
 * buffers, a dedicated copy stream with events per slot, the uint8 ->
 * normalised float32 kernel, and NVTX ranges. The ring (gpu.c) is portable C
 * over a table of device operations (gpu_dev.h): CUDA (gpu_cuda.cu) or the
 * emulated device (gpu_emu.c), which every build has. Internal (sf__). */
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
struct sf__emu;
struct sf__emu_options;

enum sf__gpu_backend {
    SF__GPU_CUDA = 0,
    SF__GPU_EMULATED = 1, /* gpu_emu.c: every build, no GPU needed */
};

struct sf__gpu_config {
    enum sf__gpu_backend backend;
    int device;
    unsigned slots;
    size_t u8_bytes;  /* per slot: the host batch's image bytes */
    size_t f32_bytes; /* per slot, 0: no float buffers */
    /* Emulated device: its options; NULL: defaults, then SF_GPU_EMULATOR. */
    const struct sf__emu_options *emu;
};

/* Device ring: `slots` buffers of u8_bytes and, when f32_bytes > 0, as many
 * float buffers; one non-blocking copy stream; per slot a start and a done
 * event (timing on) and a release event. On failure half-way, everything
 * created so far is freed and err names the operation, the slot and the
 * backend's message. */
sf_status sf__gpu_open(const struct sf__gpu_config *c, struct sf_gpu **out, char *err,
                       size_t err_len);
/* Waits for queued work, then frees everything. NULL ok. */
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

/* Queues, on the copy stream: a wait for the slot's release event when the
 * consumer released it with sf__gpu_release_after, the start event, the
 * copy, the kernel when asked, the done event. Returns at once. The host
 * buffer must stay untouched until sf__gpu_wait (the copy reads it when it
 * runs, as DMA does). */
sf_status sf__gpu_submit(struct sf_gpu *g, unsigned slot, const struct sf__gpu_job *job, char *err,
                         size_t err_len);
/* Blocks until the slot's last job is complete; *copy_s (may be NULL) gets
 * the job's device time in seconds. */
sf_status sf__gpu_wait(struct sf_gpu *g, unsigned slot, double *copy_s, char *err, size_t err_len);
/* Non-blocking: 1 when the slot's last job is complete, 0 when not yet, -1 on error. */
int sf__gpu_query(struct sf_gpu *g, unsigned slot);
void *sf__gpu_u8(struct sf_gpu *g, unsigned slot);
void *sf__gpu_f32(struct sf_gpu *g, unsigned slot);
void *sf__gpu_event(struct sf_gpu *g, unsigned slot); /* the done event */
/* Test readback: copies the first `bytes` of slot's u8 (f32 = 0) or f32
 * (f32 = 1) buffer to host dst, ordered after the slot's queued work on the
 * copy stream; waits. */
sf_status sf__gpu_read(struct sf_gpu *g, unsigned slot, int f32, void *dst, size_t bytes,
                       char *err, size_t err_len);
int sf__gpu_device(const struct sf_gpu *g);
enum sf__gpu_backend sf__gpu_backend_of(const struct sf_gpu *g);
/* The emulated device of g, NULL for CUDA (tests make consumer streams on it). */
struct sf__emu *sf__gpu_emu(const struct sf_gpu *g);
/* The consumer released the slot after queueing work on `stream` that reads
 * it: records the slot's release event there; the slot's next
 * sf__gpu_submit makes the copy stream wait on it. */
sf_status sf__gpu_release_after(struct sf_gpu *g, unsigned slot, void *stream);
/* The same after every one of `n` streams (n <= SF_LOADER_RELEASE_STREAMS_MAX
 * distinct ones once stream_for_release mapped them, duplicates counted once):
 * one release event per distinct stream, the next submit waits for all of
 * them. A call replaces the events of an earlier release of the slot. More
 * distinct streams than the bound: SF_ERR_LIMIT and nothing recorded. A
 * stream the device refuses: the others are still recorded (the copy waits
 * for those), and the first refusal's status is returned. */
sf_status sf__gpu_release_after_streams(struct sf_gpu *g, unsigned slot, void *const *streams,
                                        size_t n);
/* The stream a release event is recorded on for a consumer's `stream`: the
 * per-thread default stream ((void *)2) is the calling thread's, which at a
 * release is whichever thread dropped the last reference (Python's garbage
 * collector, say), not the one that queued the reads; the legacy default
 * stream ((void *)1) synchronises with every blocking stream, per-thread
 * ones included, so its event completes after those reads. Any other
 * stream is itself. */
void *sf__gpu_stream_for_release(void *stream);
/* stream waits for `event` (a slot's done event): no host synchronisation. */
sf_status sf__gpu_stream_wait(struct sf_gpu *g, void *event, void *stream);
/* Tests only: 1 makes submit ignore release events (the behaviour before
 * release_after existed), to show the emulated device catches it. */
void sf__gpu_test_ignore_release(struct sf_gpu *g, int on);

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
