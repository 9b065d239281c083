/* The uint8 -> float32 normalisation, written once for every place it runs:
 * the CUDA kernel (gpu_cuda.cu), its OpenCL C form (gpu_kernel.cl, run under
 * Oclgrind by the tests), the emulated device (gpu_emu.c) and host
 * normalisation (decode.c). Compiles as C11, CUDA C++ and OpenCL C 1.2.
 *
 * out = (x / 255 - mean[c]) / std[c], in float, no contraction possible (no
 * multiply): with IEEE division (CUDA's default -prec-div=true, OpenCL's
 * -cl-fp32-correctly-rounded-divide-sqrt, any C compiler without fast-math)
 * every backend gives the same bits by construction.
 *
 * A kernel launch is a grid of gx x gy blocks of `threads` threads. Each
 * block first fills a 3 x 256 table (sf_k_fill_lut, then a barrier), then
 * each thread runs sf_k_thread: y strides over images, x over 4-byte groups
 * of one image. An image starts at element img * elems, which is not
 * 4-aligned when elems is odd: its first `head` (< 4) elements up to the
 * aligned boundary and its last (< 4) elements after the last whole group
 * are done one by one, the rest four at a time (uchar4 -> float4 on CUDA). */
#ifndef SF_GPU_KERNEL_H
#define SF_GPU_KERNEL_H

#if defined(__OPENCL_VERSION__)
#define SF_HD     static inline
#define SF_GLOBAL __global
#define SF_LOCAL  __local
typedef uchar sf_k_u8;
typedef uint sf_k_u32;
typedef ulong sf_k_u64;
#elif defined(__CUDACC__)
#include <stdint.h>
#define SF_HD static __host__ __device__ __forceinline__
#define SF_GLOBAL
#define SF_LOCAL
typedef uint8_t sf_k_u8;
typedef uint32_t sf_k_u32;
typedef uint64_t sf_k_u64;
#else
#include <stdint.h>
#define SF_HD static inline
#define SF_GLOBAL
#define SF_LOCAL
typedef uint8_t sf_k_u8;
typedef uint32_t sf_k_u32;
typedef uint64_t sf_k_u64;
#endif

/* Table entries: 3 channels x 256 byte values. */
#define SF_K_LUT 768u

/* Every store of an output element goes through this; the emulated device
 * defines it to count writes before including this header. */
#ifndef SF_K_STORE
#define SF_K_STORE(dst, i, v) ((dst)[(i)] = (v))
#endif

/* Mean and std by value, channel by channel (no array: a dynamic index into
 * a kernel parameter would cost a copy to local memory on CUDA). */
struct sf_k_params {
    float m0, m1, m2;
    float s0, s1, s2;
};

SF_HD float sf_k_norm(sf_k_u32 v, float mean, float std)
{
    return ((float)v / 255.0f - mean) / std;
}

SF_HD float sf_k_pick(sf_k_u32 c, float a, float b, float d)
{
    return c == 0u ? a : c == 1u ? b : d;
}

/* Table entry i (0 <= i < SF_K_LUT): channel i / 256, byte value i % 256. */
SF_HD float sf_k_lut_value(sf_k_u32 i, struct sf_k_params p)
{
    const sf_k_u32 c = i >> 8;
    return sf_k_norm(i & 255u, sf_k_pick(c, p.m0, p.m1, p.m2), sf_k_pick(c, p.s0, p.s1, p.s2));
}

/* Channel of element e (0 <= e < 3 * plane) of one image. */
SF_HD sf_k_u32 sf_k_channel(sf_k_u32 e, sf_k_u32 plane, int hwc)
{
    if (hwc)
        return e % 3u;
    return (sf_k_u32)(e >= plane) + (sf_k_u32)(e >= 2u * plane);
}

/* How one image of elems bytes starting at batch element `base` splits:
 * head elements one by one, nvec groups of 4, then elements tail0..elems-1
 * one by one. */
struct sf_k_split {
    sf_k_u32 head, nvec, tail0;
};

SF_HD struct sf_k_split sf_k_split_image(sf_k_u64 base, sf_k_u32 elems)
{
    struct sf_k_split s;
    s.head = (sf_k_u32)((4u - (sf_k_u32)(base & 3u)) & 3u);
    if (s.head > elems)
        s.head = elems;
    s.nvec = (elems - s.head) / 4u;
    s.tail0 = s.head + 4u * s.nvec;
    return s;
}

/* Thread `tid` of `threads` fills its share of the block's table. */
SF_HD void sf_k_fill_lut(SF_LOCAL float *lut, sf_k_u32 tid, sf_k_u32 threads, struct sf_k_params p)
{
    for (sf_k_u32 i = tid; i < SF_K_LUT; i += threads)
        lut[i] = sf_k_lut_value(i, p);
}

/* Elements e..e+3 of one image (e is 4-aligned in the batch). */
SF_HD void sf_k_quad(SF_GLOBAL const sf_k_u8 *src, SF_GLOBAL float *dst, SF_LOCAL const float *lut,
                     sf_k_u32 e, sf_k_u32 plane, int hwc)
{
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
    const uchar4 q = *reinterpret_cast<const uchar4 *>(src + e);
    float4 r;
    r.x = lut[sf_k_channel(e, plane, hwc) * 256u + q.x];
    r.y = lut[sf_k_channel(e + 1u, plane, hwc) * 256u + q.y];
    r.z = lut[sf_k_channel(e + 2u, plane, hwc) * 256u + q.z];
    r.w = lut[sf_k_channel(e + 3u, plane, hwc) * 256u + q.w];
    *reinterpret_cast<float4 *>(dst + e) = r;
#else
    for (sf_k_u32 k = 0; k < 4u; k++)
        SF_K_STORE(dst, e + k, lut[sf_k_channel(e + k, plane, hwc) * 256u + src[e + k]]);
#endif
}

/*
 * What one thread does after the table is filled: thread x index tx of
 * x_threads (= gx * threads) in the block row y_block of y_blocks (= gy).
 * in/out are the whole batch: n_images images of elems = 3 * plane elements.
 */
SF_HD void sf_k_thread(SF_GLOBAL const sf_k_u8 *in, SF_GLOBAL float *out, SF_LOCAL const float *lut,
                       sf_k_u64 n_images, sf_k_u32 elems, sf_k_u32 plane, int hwc, sf_k_u32 tx,
                       sf_k_u32 x_threads, sf_k_u32 y_block, sf_k_u32 y_blocks)
{
    for (sf_k_u64 img = y_block; img < n_images; img += y_blocks) {
        const sf_k_u64 base = img * (sf_k_u64)elems;
        const struct sf_k_split s = sf_k_split_image(base, elems);
        SF_GLOBAL const sf_k_u8 *src = in + base;
        SF_GLOBAL float *dst = out + base;
        for (sf_k_u32 v = tx; v < s.nvec; v += x_threads)
            sf_k_quad(src, dst, lut, s.head + 4u * v, plane, hwc);
        if (tx < s.head)
            SF_K_STORE(dst, tx, lut[sf_k_channel(tx, plane, hwc) * 256u + src[tx]]);
        if (tx < elems - s.tail0) {
            const sf_k_u32 e = s.tail0 + tx;
            SF_K_STORE(dst, e, lut[sf_k_channel(e, plane, hwc) * 256u + src[e]]);
        }
    }
}

/* Threads per block of every launch. */
#define SF_K_THREADS 256u

/*
 * The launch geometry for n_images of elems elements on a device with
 * `units` multiprocessors: enough blocks to fill it (8 per unit), the
 * grid-stride loops do the rest so each block reuses its table. Host only
 * (C and CUDA host code); the emulated device runs the same grid.
 */
#ifndef __OPENCL_VERSION__
SF_HD void sf_k_grid(sf_k_u64 n_images, sf_k_u32 elems, int units, sf_k_u32 *gx, sf_k_u32 *gy)
{
    const sf_k_u64 max_blocks = (sf_k_u64)(units > 0 ? units : 1) * 8u;
    const sf_k_u64 vec_per_image = elems / 4u + 1u;
    sf_k_u64 y = n_images < max_blocks ? n_images : max_blocks;
    if (y > 65535u)
        y = 65535u;
    if (y == 0)
        y = 1;
    sf_k_u64 x = (vec_per_image + SF_K_THREADS - 1u) / SF_K_THREADS;
    const sf_k_u64 x_cap = max_blocks / y;
    if (x > x_cap)
        x = x_cap;
    if (x == 0)
        x = 1;
    *gx = (sf_k_u32)x;
    *gy = (sf_k_u32)y;
}
#endif

#endif /* SF_GPU_KERNEL_H */
