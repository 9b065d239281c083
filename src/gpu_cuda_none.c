/* A build without CUDA: no CUDA backend, and NVTX ranges are no-ops. The
 * ring (gpu.c) and the emulated device (gpu_emu.c) are built regardless. */
#include "src/gpu.h"
#include "src/gpu_dev.h"

const struct sf__gpu_ops *sf__gpu_cuda_ops(void)
{
    return NULL;
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
