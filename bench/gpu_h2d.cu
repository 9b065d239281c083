/*
 * bench_gpu_h2d: host-to-device batch copies, the loader's GPU ring against a
 * plain pinned cudaMemcpy, and the loader end to end with a synthetic GPU step.
 *
 *   bench_gpu_h2d [--batch-size 256] [--size 224] [--rounds 20] [--step-ms 30]
 *                 [SHARDS...]
 *
 *  1. reference: cudaHostAlloc + cudaMemcpy of batch_size x size x size x 3
 *     bytes (one uint8 batch), best and median of --rounds, GB/s (wall time);
 *  2. the ring (src/gpu.h) on the same bytes: sf__host_alloc (pinned) +
 *     sf__gpu_submit + sf__gpu_wait, with the normalise kernel and copy only;
 *     GB/s of uint8 bytes moved and the ratio to (1);
 *  3. with SHARDS (what `shardfeed load` takes): one epoch of the public loader
 *     (device auto), each batch followed by a "training step" on our own
 *     stream: wait on batch.cuda_event, spin --step-ms on one block, stream
 *     synchronise, release. Prints images/s, the share of time spent in
 *     sf_loader_next and stats.gpu_copy_s.
 *
 * Exits 1 with a message when there is no CUDA device.
 */
#include "shardfeed_loader.h"
#include "src/gpu.h"

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GB 1e9

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cuda_check(cudaError_t rc, const char *call)
{
    if (rc != cudaSuccess) {
        fprintf(stderr, "bench_gpu_h2d: %s: %s (%s)\n", call, cudaGetErrorString(rc),
                cudaGetErrorName(rc));
        exit(1);
    }
}
#define CK(call) cuda_check((call), #call)

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts t (seconds per round); fills best and median. */
static void summarise(double *t, unsigned n, double *best, double *median)
{
    qsort(t, n, sizeof *t, cmp_double);
    *best = t[0];
    *median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* The synthetic training step: one block busy for `cycles` SM clocks. */
__global__ void spin_kernel(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

/* SM clocks per millisecond, measured (the attribute is the peak clock, the
 * running clock may differ): a short warm-up launch, then ~20 ms timed. */
static double spin_cycles_per_ms(int device)
{
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    long long guess = (long long)(khz > 0 ? khz : 1000000) * 20;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    spin_kernel<<<1, 1>>>(1000);
    CK(cudaGetLastError());
    CK(cudaEventRecord(a, 0));
    spin_kernel<<<1, 1>>>(guess);
    CK(cudaGetLastError());
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return (double)guess / (ms > 0 ? (double)ms : 20.0);
}

/* (2) One ring job per round on slot round % 2; wall time of submit + wait. */
static void bench_ring(struct sf_gpu *g, const void *host, size_t bytes, unsigned batch,
                       unsigned size, int normalize, unsigned rounds, double ref_best,
                       double ref_median)
{
    struct sf__gpu_job job;
    memset(&job, 0, sizeof job);
    job.host = host;
    job.bytes = bytes;
    job.normalize = normalize;
    job.n_images = batch;
    job.width = job.height = size;
    job.layout = SF_LAYOUT_CHW;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    memcpy(job.mean, mean, sizeof mean);
    memcpy(job.std, sd, sizeof sd);

    double *wall = (double *)calloc(rounds, sizeof *wall);
    double *gpu = (double *)calloc(rounds, sizeof *gpu);
    if (!wall || !gpu) {
        fprintf(stderr, "bench_gpu_h2d: out of memory\n");
        exit(1);
    }
    char err[512];
    for (unsigned r = 0; r <= rounds; r++) { /* round 0 warms up */
        unsigned slot = r % 2;
        double copy_s = 0, t0 = now_s();
        if (sf__gpu_submit(g, slot, &job, err, sizeof err) != SF_OK ||
            sf__gpu_wait(g, slot, &copy_s, err, sizeof err) != SF_OK) {
            fprintf(stderr, "bench_gpu_h2d: ring: %s\n", err);
            exit(1);
        }
        if (r > 0) {
            wall[r - 1] = now_s() - t0;
            gpu[r - 1] = copy_s;
        }
    }
    double best, median, gbest, gmedian;
    summarise(wall, rounds, &best, &median);
    summarise(gpu, rounds, &gbest, &gmedian);
    printf("ring %-15s best %6.2f GB/s  median %6.2f GB/s  (events: median %6.2f GB/s)"
           "  ratio best %.2f  median %.2f\n",
           normalize ? "copy+normalise" : "copy only", (double)bytes / best / GB,
           (double)bytes / median / GB, (double)bytes / gmedian / GB, ref_best / best,
           ref_median / median);
    free(wall);
    free(gpu);
}

/* (3) One epoch of the public loader with a GPU step per batch. */
static int bench_loader(char **shards, int n_shards, unsigned batch, unsigned size, double step_ms,
                        double cycles_per_ms)
{
    struct sf_loader_options o;
    sf_loader_options_init_default(&o);
    o.sources = (const char *const *)shards;
    o.source_count = (size_t)n_shards;
    o.batch_size = batch;
    o.image.width = o.image.height = size;
    o.device = SF_DEVICE_AUTO;
    char err[2048] = "";
    struct sf_loader *l = NULL;
    sf_status st = sf_loader_open(&o, &l, err, sizeof err);
    if (st != SF_OK) {
        fprintf(stderr, "bench_gpu_h2d: loader: %s (%s)\n", err[0] ? err : sf_status_str(st),
                sf_status_name(st));
        return 1;
    }
    cudaStream_t stream = NULL;
    long long cycles = (long long)(step_ms * cycles_per_ms);
    unsigned long long images = 0, batches = 0;
    double wait_s = 0, t_start = now_s();
    struct sf_batch b;
    for (;;) {
        double t0 = now_s();
        st = sf_loader_next(l, &b);
        wait_s += now_s() - t0;
        if (st != SF_OK)
            break;
        if (stream == NULL) {
            CK(cudaSetDevice(b.device_images ? b.cuda_device : 0));
            CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        }
        if (b.cuda_event != NULL)
            CK(cudaStreamWaitEvent(stream, (cudaEvent_t)b.cuda_event, 0));
        spin_kernel<<<1, 1, 0, stream>>>(cycles);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(stream));
        sf_loader_release(l, &b);
        images += b.size;
        batches++;
    }
    double total_s = now_s() - t_start;
    struct sf_loader_stats s;
    sf_loader_get_stats(l, &s);
    int rc = 0;
    if (st != SF_END_OF_EPOCH || sf_loader_errmsg(l)[0]) {
        fprintf(stderr, "bench_gpu_h2d: loader: %s (%s)\n", sf_loader_errmsg(l),
                sf_status_name(st));
        rc = 1;
    }
    printf("loader (%s, step %.1f ms): %llu images in %llu batches, %.2f s\n",
           s.on_device ? "batches on the GPU" : "HOST batches: no GPU delivery", step_ms, images,
           batches, total_s);
    printf("  images/s %.1f (step bound %.1f)  consumer wait share %.1f%% (%.2f s in "
           "sf_loader_next)  gpu_copy_s %.3f (%.2f ms/batch)\n",
           total_s > 0 ? (double)images / total_s : 0, step_ms > 0 ? batch * 1000.0 / step_ms : 0,
           total_s > 0 ? 100.0 * wait_s / total_s : 0, wait_s, s.gpu_copy_s,
           batches ? 1000.0 * s.gpu_copy_s / (double)batches : 0);
    if (stream != NULL)
        CK(cudaStreamDestroy(stream));
    sf_loader_close(l);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_gpu_h2d [--batch-size 256] [--size 224] [--rounds 20] "
                    "[--step-ms 30] [SHARDS...]\n");
    exit(2);
}

static unsigned parse_uint(const char *s, unsigned min, unsigned max)
{
    char *end;
    unsigned long v = s ? strtoul(s, &end, 10) : 0;
    if (!s || end == s || *end || v < min || v > max)
        usage();
    return (unsigned)v;
}

int main(int argc, char **argv)
{
    unsigned batch = 256, size = 224, rounds = 20, step_ms = 30;
    int a = 1;
    for (; a < argc && strncmp(argv[a], "--", 2) == 0; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(argv[a], "--batch-size"))
            batch = parse_uint(v, 1, 65536);
        else if (!strcmp(argv[a], "--size"))
            size = parse_uint(v, 1, 4096);
        else if (!strcmp(argv[a], "--rounds"))
            rounds = parse_uint(v, 1, 100000);
        else if (!strcmp(argv[a], "--step-ms"))
            step_ms = parse_uint(v, 0, 60000);
        else
            usage();
        a++;
    }

    int n_dev = 0;
    cudaError_t rc = cudaGetDeviceCount(&n_dev);
    if (rc != cudaSuccess || n_dev == 0 || !sf__gpu_usable(0)) {
        fprintf(stderr, "bench_gpu_h2d: no CUDA device (%s); this benchmark needs a GPU\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return 1;
    }
    const int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    size_t bytes = (size_t)batch * size * size * 3;
    printf("device %d: %s; batch %u x %ux%ux3 uint8 = %.1f MB, %u rounds\n", dev, prop.name, batch,
           size, size, (double)bytes / 1e6, rounds);

    /* (1) the reference. */
    unsigned char *pinned = NULL, *dst = NULL;
    CK(cudaHostAlloc((void **)&pinned, bytes, cudaHostAllocPortable));
    CK(cudaMalloc((void **)&dst, bytes));
    for (size_t i = 0; i < bytes; i++)
        pinned[i] = (unsigned char)(i * 131 + 7);
    double *t = (double *)calloc(rounds, sizeof *t);
    if (!t) {
        fprintf(stderr, "bench_gpu_h2d: out of memory\n");
        return 1;
    }
    for (unsigned r = 0; r <= rounds; r++) { /* round 0 warms up */
        double t0 = now_s();
        CK(cudaMemcpy(dst, pinned, bytes, cudaMemcpyHostToDevice));
        if (r > 0)
            t[r - 1] = now_s() - t0;
    }
    double ref_best, ref_median;
    summarise(t, rounds, &ref_best, &ref_median);
    free(t);
    printf("reference cudaMemcpy pinned  best %6.2f GB/s  median %6.2f GB/s\n",
           (double)bytes / ref_best / GB, (double)bytes / ref_median / GB);
    CK(cudaFree(dst));
    CK(cudaFreeHost(pinned));

    /* (2) the ring; opened before sf__host_alloc so pinning uses its context. */
    struct sf_gpu *g = NULL;
    char err[512];
    struct sf__gpu_config gc = {SF__GPU_CUDA, dev, 2, bytes, bytes * sizeof(float), NULL};
    if (sf__gpu_open(&gc, &g, err, sizeof err) != SF_OK) {
        fprintf(stderr, "bench_gpu_h2d: sf__gpu_open: %s\n", err);
        return 1;
    }
    int is_pinned = 0;
    unsigned char *host = (unsigned char *)sf__host_alloc(bytes, 1, &is_pinned);
    if (!host) {
        fprintf(stderr, "bench_gpu_h2d: sf__host_alloc: out of memory\n");
        return 1;
    }
    if (!is_pinned)
        printf("warning: sf__host_alloc gave pageable memory (pinning failed)\n");
    for (size_t i = 0; i < bytes; i++)
        host[i] = (unsigned char)(i * 131 + 7);
    bench_ring(g, host, bytes, batch, size, 1, rounds, ref_best, ref_median);
    bench_ring(g, host, bytes, batch, size, 0, rounds, ref_best, ref_median);
    /* The copy really happened: the last job was slot rounds % 2. */
    unsigned char check[4096];
    size_t n_check = bytes < sizeof check ? bytes : sizeof check;
    if (sf__gpu_read(g, rounds % 2, 0, check, n_check, err, sizeof err) != SF_OK ||
        memcmp(check, host, n_check) != 0) {
        fprintf(stderr, "bench_gpu_h2d: ring readback does not match the host batch\n");
        return 1;
    }
    sf__host_free(host, is_pinned);
    sf__gpu_close(g);

    /* (3) the loader end to end. */
    if (a < argc) {
        double cpm = spin_cycles_per_ms(dev);
        return bench_loader(argv + a, argc - a, batch, size, (double)step_ms, cpm);
    }
    return 0;
}
