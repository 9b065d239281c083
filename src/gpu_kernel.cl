/* The normalise kernel in OpenCL C 1.2: the CUDA kernel of gpu_cuda.cu,
 * line for line, on the arithmetic of gpu_kernel.h. Not used by the library:
 * tests/test_gpu_ocl.c runs it under Oclgrind, which checks every access of
 * the shared code (out-of-bounds, races on the table, uninitialised reads),
 * and compares its bits with the C path. Build with
 * "-I <src> -cl-fp32-correctly-rounded-divide-sqrt" (IEEE division, as CUDA's
 * -prec-div=true). Launch: local size (SF_K_THREADS, 1), global
 * (gx * SF_K_THREADS, gy) with gx, gy from sf_k_grid. */
#include "gpu_kernel.h"

__kernel void sf_normalize(__global const uchar *in, __global float *out, ulong n_images,
                           uint elems, uint plane, int hwc, struct sf_k_params p)
{
    __local float lut[SF_K_LUT];
    sf_k_fill_lut(lut, (uint)get_local_id(0), (uint)get_local_size(0), p);
    barrier(CLK_LOCAL_MEM_FENCE);
    sf_k_thread(in, out, lut, n_images, elems, plane, hwc, (uint)get_global_id(0),
                (uint)get_global_size(0), (uint)get_group_id(1), (uint)get_num_groups(1));
}

/* The table one work-group builds, written out as is (3 x 256 floats), so
 * that every entry can be compared, not only those the images happen to use. */
__kernel void sf_lut(__global float *out, struct sf_k_params p)
{
    __local float lut[SF_K_LUT];
    const uint tid = (uint)get_local_id(0);
    const uint threads = (uint)get_local_size(0);
    sf_k_fill_lut(lut, tid, threads, p);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint i = tid; i < SF_K_LUT; i += threads)
        out[i] = lut[i];
}
