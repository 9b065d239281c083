/* The GPU half of examples/train_loop.c: the "training step" is a kernel
 * that reads the loader's device batch (normalised float32) and reduces each
 * image to its mean per channel; the loop learns from those. It waits for the
 * loader's copy with cudaStreamWaitEvent on its own stream, so the copy of
 * the next batches overlaps this work. */
#include <cuda_runtime.h>
#include <stdio.h>

/* One block per image and channel: the mean of width x height values. */
__global__ void channel_means(const float *img, unsigned hw, int chw, float *out)
{
    unsigned image = blockIdx.x, c = blockIdx.y;
    const float *base = img + (size_t)image * hw * 3;
    float sum = 0.f;
    for (unsigned i = threadIdx.x; i < hw; i += blockDim.x)
        sum += chw ? base[(size_t)c * hw + i] : base[(size_t)i * 3 + c];
    __shared__ float part[256];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[image * 3 + c] = part[0] / (float)hw;
}

static cudaStream_t stream;
static float *d_means;
static size_t d_cap;

/* Returns 0, or -1 after printing the CUDA error. means gets n x 3 floats. */
extern "C" int train_step_gpu(const void *device_normalized, void *copy_event, int device,
                              size_t n, unsigned width, unsigned height, int chw, float *means)
{
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess && !stream)
        e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess && d_cap < n * 3) {
        cudaFree(d_means);
        d_means = NULL;
        e = cudaMalloc(&d_means, n * 3 * sizeof(float));
        d_cap = e == cudaSuccess ? n * 3 : 0;
    }
    /* The batch is ready on the device once the loader's copy event fires. */
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(stream, (cudaEvent_t)copy_event, 0);
    if (e == cudaSuccess) {
        channel_means<<<dim3((unsigned)n, 3), 256, 0, stream>>>(
            (const float *)device_normalized, width * height, chw, d_means);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(means, d_means, n * 3 * sizeof(float), cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "train_step_gpu: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
