/*
 * The normalise kernel's OpenCL C form (src/gpu_kernel.cl) under Oclgrind:
 * the kernel code of gpu_kernel.h run as a device runs it (work-groups,
 * local memory, a barrier), with Oclgrind checking every access. Compared
 * bit for bit with the same header compiled as C and with sf__normalize_u8
 * (the host path).
 *
 * A plain program, not Criterion: it runs inside the `oclgrind` wrapper
 * (ctest `gpu_ocl`, through tests/integration/run_oclgrind.sh, which also
 * fails the test on any Oclgrind diagnostic) and Criterion's forked workers
 * would only multiply the simulator start-up. It exits non-zero on the first
 * mismatch, naming the launch and the element.
 *
 * Checked per launch: every element written (the output starts as a NaN
 * pattern, none may remain), nothing written around the batch (guard floats
 * before and after it, in the same buffer), every element equal to the C
 * path. And the 3 x 256 table itself, entry by entry, for several
 * work-group sizes.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include "src/decode.h"
#include "src/gpu_kernel.h"
#include "support/float_bits.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SF_KERNEL_CL
#error "SF_KERNEL_CL: path of src/gpu_kernel.cl"
#endif
#ifndef SF_KERNEL_DIR
#error "SF_KERNEL_DIR: the folder holding gpu_kernel.h"
#endif

/* Output not yet written, and the floats around the batch: both NaNs, so a
 * stray write of a real value shows, and distinct, so a guard copied into
 * the batch does too. */
#define UNWRITTEN 0x7fc0dead
#define GUARD     0x7fbadbadu
#define N_GUARD   64u

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("test_gpu_ocl: FAIL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

#define CL_OK(call)                                                                                \
    do {                                                                                           \
        const cl_int err_ = (call);                                                                \
        if (err_ != CL_SUCCESS)                                                                    \
            fail("%s: OpenCL error %d", #call, (int)err_);                                         \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fail("out of memory (%zu bytes)", n);
    return p;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

struct ocl {
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    cl_program program;
    cl_kernel normalize, lut;
    size_t align; /* sub-buffer origin alignment, bytes */
};

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail("cannot open %s", path);
    size_t cap = 4096, n = 0;
    char *s = xmalloc(cap);
    size_t got;
    while ((got = fread(s + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *t = realloc(s, cap * 2);
            if (!t)
                fail("out of memory reading %s", path);
            s = t;
            cap *= 2;
        }
    }
    fclose(f);
    s[n] = '\0';
    return s;
}

static void ocl_open(struct ocl *o)
{
    cl_platform_id platforms[16];
    cl_uint n_platforms = 0;
    const cl_int perr = clGetPlatformIDs(16, platforms, &n_platforms);
    cl_platform_id platform = NULL;
    for (cl_uint i = 0; perr == CL_SUCCESS && i < n_platforms && i < 16; i++) {
        char name[256] = "";
        CL_OK(clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name - 1, name, NULL));
        if (strstr(name, "Oclgrind"))
            platform = platforms[i];
    }
    if (!platform)
        fail("no Oclgrind OpenCL platform: run this program under `oclgrind` (ctest gpu_ocl does)");
    CL_OK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &o->device, NULL));
    cl_uint align_bits = 0;
    CL_OK(clGetDeviceInfo(o->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits,
                          NULL));
    o->align = align_bits / 8 ? align_bits / 8 : 1;

    cl_int err;
    o->context = clCreateContext(NULL, 1, &o->device, NULL, NULL, &err);
    CL_OK(err);
    o->queue = clCreateCommandQueue(o->context, o->device, 0, &err);
    CL_OK(err);

    char *src = read_text(SF_KERNEL_CL);
    const char *srcs[1] = {src};
    o->program = clCreateProgramWithSource(o->context, 1, srcs, NULL, &err);
    CL_OK(err);
    /* IEEE division as on CUDA (-prec-div=true) and in C. Oclgrind does not
     * advertise CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT but divides in the host's
     * IEEE float either way: the bit comparisons below are what holds it. */
    const char *options = "-I " SF_KERNEL_DIR " -cl-fp32-correctly-rounded-divide-sqrt -Werror";
    err = clBuildProgram(o->program, 1, &o->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        size_t len = 0;
        clGetProgramBuildInfo(o->program, o->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
        char *log = xmalloc(len + 1);
        log[0] = '\0';
        clGetProgramBuildInfo(o->program, o->device, CL_PROGRAM_BUILD_LOG, len, log, NULL);
        log[len] = '\0';
        fail("building %s with \"%s\": OpenCL error %d\n%s", SF_KERNEL_CL, options, (int)err, log);
    }
    free(src);
    o->normalize = clCreateKernel(o->program, "sf_normalize", &err);
    CL_OK(err);
    o->lut = clCreateKernel(o->program, "sf_lut", &err);
    CL_OK(err);
}

static void ocl_close(struct ocl *o)
{
    clReleaseKernel(o->lut);
    clReleaseKernel(o->normalize);
    clReleaseProgram(o->program);
    clReleaseCommandQueue(o->queue);
    clReleaseContext(o->context);
}

/*
 * An output buffer of n floats with N_GUARD guard floats before it (rounded
 * up to the sub-buffer alignment) and after it, all in one allocation; the
 * kernel sees the sub-buffer of the n floats.
 */
struct out_buf {
    cl_mem whole, view;
    size_t pre;  /* floats before the batch */
    size_t size; /* floats in all */
    float *host;
};

static void out_open(struct ocl *o, struct out_buf *b, size_t n)
{
    size_t pre_bytes = (N_GUARD * sizeof(float) + o->align - 1) / o->align * o->align;
    b->pre = pre_bytes / sizeof(float);
    b->size = b->pre + n + N_GUARD;
    b->host = xmalloc(b->size * sizeof(float));
    for (size_t i = 0; i < b->size; i++)
        b->host[i] = bits_float(i < b->pre || i >= b->pre + n ? GUARD : UNWRITTEN);
    cl_int err;
    b->whole = clCreateBuffer(o->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                              b->size * sizeof(float), b->host, &err);
    CL_OK(err);
    const cl_buffer_region region = {pre_bytes, n * sizeof(float)};
    b->view =
        clCreateSubBuffer(b->whole, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    CL_OK(err);
}

/* Reads the buffer back; checks the guards and that all n floats were
 * written. Returns the batch. */
static const float *out_read(struct ocl *o, struct out_buf *b, size_t n, const char *what)
{
    CL_OK(clEnqueueReadBuffer(o->queue, b->whole, CL_TRUE, 0, b->size * sizeof(float), b->host, 0,
                              NULL, NULL));
    for (size_t i = 0; i < b->size; i++) {
        const int guard = i < b->pre || i >= b->pre + n;
        const uint32_t u = float_bits(b->host[i]);
        if (guard && u != GUARD)
            fail("%s: wrote outside the batch: float %s%zu is %a (0x%08x)", what,
                 i < b->pre ? "-" : "+", i < b->pre ? b->pre - i : i - (b->pre + n),
                 (double)b->host[i], (unsigned)u);
        if (!guard && isnan(b->host[i]))
            fail("%s: element %zu of %zu not written (0x%08x)", what, i - b->pre, n, (unsigned)u);
    }
    return b->host + b->pre;
}

static void out_close(struct out_buf *b)
{
    clReleaseMemObject(b->view);
    clReleaseMemObject(b->whole);
    free(b->host);
}

/* Mean and std sets: ImageNet's, and one with a negative mean, a tiny and a
 * large std. */
static const float MEAN[2][3] = {{0.485f, 0.456f, 0.406f}, {0.5f, -0.25f, 1.0f / 3.0f}};
static const float STD[2][3] = {{0.229f, 0.224f, 0.225f}, {1e-3f, 3.0f, 0.7f}};

static struct sf_k_params params_of(int set)
{
    const struct sf_k_params p = {MEAN[set][0], MEAN[set][1], MEAN[set][2],
                                  STD[set][0],  STD[set][1],  STD[set][2]};
    return p;
}

static void compare(const float *got, const float *want, size_t n, const char *what,
                    const char *against)
{
    if (memcmp(got, want, n * sizeof(float)) == 0)
        return;
    size_t i = 0;
    while (float_bits(got[i]) == float_bits(want[i]))
        i++;
    fail("%s: element %zu differs from %s: got %a (0x%08x), want %a (0x%08x)", what, i, against,
         (double)got[i], (unsigned)float_bits(got[i]), (double)want[i],
         (unsigned)float_bits(want[i]));
}

/* The table one work-group builds, for work-groups of `threads`. */
static void check_lut(struct ocl *o, int set, size_t threads)
{
    char what[96];
    snprintf(what, sizeof what, "table, params %d, %zu threads", set, threads);
    const struct sf_k_params p = params_of(set);
    struct out_buf b;
    out_open(o, &b, SF_K_LUT);
    CL_OK(clSetKernelArg(o->lut, 0, sizeof(cl_mem), &b.view));
    CL_OK(clSetKernelArg(o->lut, 1, sizeof p, &p));
    CL_OK(clEnqueueNDRangeKernel(o->queue, o->lut, 1, NULL, &threads, &threads, 0, NULL, NULL));
    const float *got = out_read(o, &b, SF_K_LUT, what);

    float header[SF_K_LUT], direct[SF_K_LUT];
    for (uint32_t i = 0; i < SF_K_LUT; i++) {
        header[i] = sf_k_lut_value(i, p);
        direct[i] = sf_k_norm(i % 256u, MEAN[set][i / 256u], STD[set][i / 256u]);
    }
    compare(got, header, SF_K_LUT, what, "sf_k_lut_value in C");
    compare(got, direct, SF_K_LUT, what, "(v / 255 - mean[c]) / std[c] in C");
    out_close(&b);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

struct shape {
    size_t n_images;
    unsigned width, height;
};

/*
 * Pseudo-random bytes, except that the first 256 elements of each channel
 * in the batch take every byte value once (in a scrambled order): with small
 * images, or HWC, that is within the first 768 bytes.
 */
static void make_input(uint8_t *in, size_t total, uint32_t elems, uint32_t plane, int hwc,
                       uint64_t seed)
{
    uint32_t seen[3] = {0, 0, 0};
    uint64_t s = seed | 1u;
    for (size_t i = 0; i < total; i++) {
        const uint32_t c = sf_k_channel((uint32_t)(i % elems), plane, hwc);
        if (seen[c] < 256u)
            in[i] = (uint8_t)((seen[c]++ * 167u + 89u) & 255u);
        else
            in[i] = (uint8_t)(rng_next(&s) >> 56);
    }
}

static void check_normalize(struct ocl *o, const struct shape *sh, int hwc, int set)
{
    const uint32_t plane = sh->width * sh->height;
    const uint32_t elems = 3u * plane;
    const size_t total = sh->n_images * elems;
    const struct sf_k_params p = params_of(set);

    uint8_t *in = xmalloc(total);
    make_input(in, total, elems, plane, hwc, 0x5eedu + total);

    /* The C path twice: the header's functions element by element, and the
     * host normalisation of decode.c. */
    float *want = xmalloc(total * sizeof(float));
    float *host = xmalloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) {
        const uint32_t c = sf_k_channel((uint32_t)(i % elems), plane, hwc);
        want[i] = sf_k_norm(in[i], MEAN[set][c], STD[set][c]);
    }
    sf__normalize_u8(in, host, sh->n_images, sh->width, sh->height,
                     hwc ? SF_LAYOUT_HWC : SF_LAYOUT_CHW, MEAN[set], STD[set]);

    cl_int err;
    cl_mem in_buf =
        clCreateBuffer(o->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, total, in, &err);
    CL_OK(err);
    for (int units = 1; units <= 2; units++) {
        char what[160];
        uint32_t gx, gy;
        sf_k_grid(sh->n_images, elems, units, &gx, &gy);
        snprintf(what, sizeof what, "%s %zu x %ux%u, params %d, units %d (grid %u x %u)",
                 hwc ? "HWC" : "CHW", sh->n_images, sh->width, sh->height, set, units, gx, gy);
        struct out_buf b;
        out_open(o, &b, total);
        const cl_ulong n_images = sh->n_images;
        const cl_int hwc_arg = hwc;
        CL_OK(clSetKernelArg(o->normalize, 0, sizeof(cl_mem), &in_buf));
        CL_OK(clSetKernelArg(o->normalize, 1, sizeof(cl_mem), &b.view));
        CL_OK(clSetKernelArg(o->normalize, 2, sizeof n_images, &n_images));
        CL_OK(clSetKernelArg(o->normalize, 3, sizeof(cl_uint), &elems));
        CL_OK(clSetKernelArg(o->normalize, 4, sizeof(cl_uint), &plane));
        CL_OK(clSetKernelArg(o->normalize, 5, sizeof hwc_arg, &hwc_arg));
        CL_OK(clSetKernelArg(o->normalize, 6, sizeof p, &p));
        const size_t global[2] = {(size_t)gx * SF_K_THREADS, gy};
        const size_t local[2] = {SF_K_THREADS, 1};
        CL_OK(
            clEnqueueNDRangeKernel(o->queue, o->normalize, 2, NULL, global, local, 0, NULL, NULL));
        const float *got = out_read(o, &b, total, what);
        compare(got, want, total, what, "the header's C path");
        compare(got, host, total, what, "sf__normalize_u8");
        printf("ok  %s\n", what);
        out_close(&b);
    }
    clReleaseMemObject(in_buf);
    free(host);
    free(want);
    free(in);
}

/* argv[1], WIDTHxHEIGHT, replaces the size of the last (one large image)
 * shape, e.g. 1283x1021 for a manual run; ctest keeps the default. */
int main(int argc, char **argv)
{
    struct ocl o;
    ocl_open(&o);

    static const size_t lut_threads[] = {SF_K_THREADS, 100, 64, 1};
    for (int set = 0; set < 2; set++)
        for (size_t k = 0; k < sizeof lut_threads / sizeof lut_threads[0]; k++)
            check_lut(&o, set, lut_threads[k]);
    printf("ok  table: 2 x 768 entries, work-groups of 256, 100, 64 and 1\n");

    /* Odd sizes everywhere: images start off the 4-element boundary, and
     * both grid-stride loops (images over block rows, groups of 4 over
     * threads) go round more than once. */
    struct shape shapes[] = {
        {3, 37, 29}, {5, 5, 3}, {1, 1, 1}, {3000, 5, 3}, {1, 283, 221},
    };
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    if (argc > 1 &&
        (sscanf(argv[1], "%ux%u", &shapes[n_shapes - 1].width, &shapes[n_shapes - 1].height) != 2 ||
         shapes[n_shapes - 1].width == 0 || shapes[n_shapes - 1].height == 0 ||
         shapes[n_shapes - 1].width > 16384 || shapes[n_shapes - 1].height > 16384))
        fail("usage: %s [WIDTHxHEIGHT of the large image, at most 16384x16384]", argv[0]);
    int set = 0;
    for (int hwc = 0; hwc <= 1; hwc++)
        for (size_t k = 0; k < n_shapes; k++, set ^= 1)
            check_normalize(&o, &shapes[k], hwc, set);

    ocl_close(&o);
    printf("test_gpu_ocl: all launches match the C path bit for bit\n");
    return 0;
}
