/* Fallback used when the library is built without CUDA. */
#include "shardfeed.h"

int sf_cuda_compiled(void)
{
    return 0;
}

int sf_cuda_device_count(void)
{
    return 0;
}
