/* Host batch memory and the GPU prefetcher, CPU build (contract: gpu.h):
 * page-aligned host memory, and SF_ERR_UNSUPPORTED (or NULL / -1) for every
 * call that needs a device. NVTX ranges are no-ops. */
#include "src/gpu.h"

#include <stdio.h>
#include <stdlib.h>

#define SF_HOST_ALIGN 4096

static void set_err(char *err, size_t err_len, const char *msg)
{
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "%s", msg);
}

int sf__gpu_usable(int device)
{
    (void)device;
    return 0;
}

void *sf__host_alloc(size_t bytes, int pinned_wanted, int *pinned)
{
    (void)pinned_wanted;
    *pinned = 0;
    void *p = NULL;
    if (posix_memalign(&p, SF_HOST_ALIGN, bytes > 0 ? bytes : 1) != 0)
        return NULL;
    return p;
}

void sf__host_free(void *p, int pinned)
{
    (void)pinned; /* never pinned in this build */
    free(p);
}

sf_status sf__gpu_open(int device, unsigned slots, size_t u8_bytes, size_t f32_bytes,
                       struct sf_gpu **out, char *err, size_t err_len)
{
    (void)device;
    (void)slots;
    (void)u8_bytes;
    (void)f32_bytes;
    if (out != NULL)
        *out = NULL;
    set_err(err, err_len, "no GPU: shardfeed was built without CUDA");
    return SF_ERR_UNSUPPORTED;
}

void sf__gpu_close(struct sf_gpu *g)
{
    (void)g; /* sf__gpu_open never returns one */
}

sf_status sf__gpu_submit(struct sf_gpu *g, unsigned slot, const struct sf__gpu_job *job, char *err,
                         size_t err_len)
{
    (void)g;
    (void)slot;
    (void)job;
    set_err(err, err_len, "no GPU: shardfeed was built without CUDA");
    return SF_ERR_UNSUPPORTED;
}

sf_status sf__gpu_wait(struct sf_gpu *g, unsigned slot, double *copy_s, char *err, size_t err_len)
{
    (void)g;
    (void)slot;
    if (copy_s != NULL)
        *copy_s = 0.0;
    set_err(err, err_len, "no GPU: shardfeed was built without CUDA");
    return SF_ERR_UNSUPPORTED;
}

int sf__gpu_query(struct sf_gpu *g, unsigned slot)
{
    (void)g;
    (void)slot;
    return -1;
}

void *sf__gpu_u8(struct sf_gpu *g, unsigned slot)
{
    (void)g;
    (void)slot;
    return NULL;
}

void *sf__gpu_f32(struct sf_gpu *g, unsigned slot)
{
    (void)g;
    (void)slot;
    return NULL;
}

void *sf__gpu_event(struct sf_gpu *g, unsigned slot)
{
    (void)g;
    (void)slot;
    return NULL;
}

sf_status sf__gpu_release_after(struct sf_gpu *g, unsigned slot, void *stream)
{
    (void)g;
    (void)slot;
    (void)stream;
    return SF_ERR_UNSUPPORTED;
}

sf_status sf__gpu_stream_wait(void *event, void *stream)
{
    (void)event;
    (void)stream;
    return SF_ERR_UNSUPPORTED;
}

int sf__gpu_device(const struct sf_gpu *g)
{
    (void)g;
    return -1;
}

sf_status sf__gpu_read(struct sf_gpu *g, unsigned slot, int f32, void *dst, size_t bytes)
{
    (void)g;
    (void)slot;
    (void)f32;
    (void)dst;
    (void)bytes;
    return SF_ERR_UNSUPPORTED;
}

void sf__nvtx_push(const char *name)
{
    (void)name;
}

void sf__nvtx_pop(void)
{
}

void sf__nvtx_name_thread(const char *name)
{
    (void)name;
}
