/* CUDA device discovery. Compiled only when the build has CUDA; the C
 * fallback in gpu_info_nocuda.c answers "no devices" otherwise. */
#include "shardfeed.h"

#include <cuda_runtime.h>

extern "C" int sf_cuda_compiled(void)
{
    return 1;
}

extern "C" int sf_cuda_device_count(void)
{
    int n = 0;
    /* No driver or no GPU is a normal situation, not an error: report 0 and
     * clear the sticky error so later CUDA calls start clean. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}
