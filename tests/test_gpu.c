/* The GPU ring's suite. Every test of the ring runs on the backend that
 * SF_TEST_GPU_BACKEND names: "emulated" (the default: every build, no GPU)
 * or "cuda" (scripts/gpu-acceptance.sh, on a machine with a GPU). The tests
 * that need the emulator's hooks (consumer streams, injected failures,
 * inaccessible device memory, the kernel checks) run on it only. */
#include <criterion/criterion.h>

#include "shardfeed.h"
#include "src/decode.h"
#include "src/gpu.h"
#include "src/gpu_dev.h"
#include "support/emu_gate.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
static const float imagenet_std[3] = {0.229f, 0.224f, 0.225f};

static enum sf__gpu_backend backend(void)
{
    const char *b = getenv("SF_TEST_GPU_BACKEND");
    return b && !strcmp(b, "cuda") ? SF__GPU_CUDA : SF__GPU_EMULATED;
}

/* The suite's backend must be there: the emulated one always is; asking for
 * CUDA without a device is a failure, not a skip (gpu-acceptance.sh). */
static void need_device(void)
{
    if (backend() == SF__GPU_CUDA)
        cr_assert(sf__gpu_usable(-1), "SF_TEST_GPU_BACKEND=cuda but no CUDA device");
}

static void need_emulator(void)
{
    if (backend() != SF__GPU_EMULATED)
        cr_skip_test("emulated device only (its test hooks)");
}

static sf_status open_ring(unsigned slots, size_t u8, size_t f32, struct sf_gpu **g, char *err,
                           size_t err_len)
{
    struct sf__gpu_config c = {backend(), 0, slots, u8, f32, NULL};
    return sf__gpu_open(&c, g, err, err_len);
}

static sf_status open_emulated(const struct sf__emu_options *eo, unsigned slots, size_t u8,
                               size_t f32, struct sf_gpu **g, char *err, size_t err_len)
{
    struct sf__gpu_config c = {SF__GPU_EMULATED, 0, slots, u8, f32, eo};
    return sf__gpu_open(&c, g, err, err_len);
}

static void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)(x >> 32);
    }
}

/* Copies n images of w x h x 3 bytes from host and normalises them with
 * mean and std. */
static struct sf__gpu_job normalize_job(const unsigned char *host, size_t n, unsigned w, unsigned h,
                                        enum sf_layout layout, const float mean[3],
                                        const float std[3])
{
    struct sf__gpu_job job = {.host = host,
                              .bytes = n * w * h * 3,
                              .normalize = 1,
                              .n_images = n,
                              .width = w,
                              .height = h,
                              .layout = layout};
    memcpy(job.mean, mean, sizeof job.mean);
    memcpy(job.std, std, sizeof job.std);
    return job;
}

static const float half_mean[3] = {0.5f, 0.5f, 0.5f}, quarter_std[3] = {0.25f, 0.25f, 0.25f};

/* ------------------------------------------------------------------ everywhere */

Test(gpu, host_alloc_without_pinning_is_page_aligned_and_writable)
{
    const size_t sizes[] = {0, 1, 4095, 4097, 1u << 20, (3u << 20) + 7};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int pinned = 7;
        unsigned char *p = sf__host_alloc(sizes[k], 0, &pinned);
        cr_assert_not_null(p, "%zu bytes", sizes[k]);
        cr_expect_eq(pinned, 0, "not asked for pinned memory, got pinned for %zu bytes", sizes[k]);
        cr_expect_eq((uintptr_t)p % 4096, 0, "%zu bytes at %p", sizes[k], (void *)p);
        if (sizes[k] > 0) {
            memset(p, 0xA5, sizes[k]);
            cr_expect_eq(p[0], 0xA5);
            cr_expect_eq(p[sizes[k] - 1], 0xA5);
        }
        sf__host_free(p, pinned);
    }
}

/* Pinned (cudaHostAlloc) exactly when a CUDA device is usable, page-aligned
 * plain memory otherwise: one test that holds on every machine, no skip. */
Test(gpu, host_alloc_pins_exactly_when_a_device_is_usable)
{
    const int device = sf__gpu_usable(-1);
    int pinned = 7;
    unsigned char *p = sf__host_alloc(1u << 20, 1, &pinned);
    cr_assert_not_null(p);
    cr_expect_eq(pinned, device, "pinned %d, device usable %d", pinned, device);
    cr_expect_eq((uintptr_t)p % 4096, 0);
    memset(p, 0x5A, 1u << 20);
    cr_expect_eq(p[12345], 0x5A);
    cr_expect_eq(p[(1u << 20) - 1], 0x5A);
    sf__host_free(p, pinned);
    /* Not asked to pin: never pinned. */
    p = sf__host_alloc(4096, 0, &pinned);
    cr_assert_not_null(p);
    cr_expect_eq(pinned, 0);
    sf__host_free(p, pinned);
}

Test(gpu, host_free_accepts_null)
{
    sf__host_free(NULL, 0);
    sf__host_free(NULL, 1);
}

Test(gpu, usable_matches_device_count)
{
    int n = sf_cuda_device_count();
    cr_expect_eq(sf__gpu_usable(-1), n > 0);
    for (int d = 0; d < n; d++)
        cr_expect_eq(sf__gpu_usable(d), 1, "device %d of %d", d, n);
    cr_expect_eq(sf__gpu_usable(n), 0, "device %d of %d", n, n);
    cr_expect_eq(sf__gpu_usable(-2), 0);
    if (!sf_cuda_compiled())
        cr_expect_eq(sf__gpu_usable(0), 0);
}

Test(gpu, cuda_open_without_a_device_is_unsupported)
{
    if (sf__gpu_usable(-1))
        cr_skip_test("a CUDA device is present");
    struct sf_gpu *g = (struct sf_gpu *)&g; /* must be overwritten */
    char err[256] = "";
    struct sf__gpu_config c = {SF__GPU_CUDA, 0, 2, 1024, 4096, NULL};
    sf_status st = sf__gpu_open(&c, &g, err, sizeof err);
    cr_expect_eq(st, SF_ERR_UNSUPPORTED, "status %d (%s)", (int)st, err);
    cr_expect_null(g);
    cr_expect_neq(err[0], '\0', "no message");
    if (!sf_cuda_compiled())
        cr_expect_not_null(strstr(err, "built without CUDA"), "message: %s", err);
    /* err may be NULL */
    cr_expect_eq(sf__gpu_open(&c, &g, NULL, 0), SF_ERR_UNSUPPORTED);
}

Test(gpu, calls_without_a_handle_fail_cleanly)
{
    char err[256] = "";
    struct sf__gpu_job job;
    memset(&job, 0, sizeof job);
    sf__gpu_close(NULL);
    cr_expect_eq(sf__gpu_query(NULL, 0), -1);
    cr_expect_null(sf__gpu_u8(NULL, 0));
    cr_expect_null(sf__gpu_f32(NULL, 0));
    cr_expect_null(sf__gpu_event(NULL, 0));
    cr_expect_eq(sf__gpu_device(NULL), -1);
    cr_expect_neq(sf__gpu_submit(NULL, 0, &job, err, sizeof err), SF_OK);
    cr_expect_neq(err[0], '\0');
    double t = 99.0;
    err[0] = '\0';
    cr_expect_neq(sf__gpu_wait(NULL, 0, &t, err, sizeof err), SF_OK);
    cr_expect_neq(err[0], '\0');
    cr_expect_eq(t, 0.0);
    unsigned char b[4];
    cr_expect_neq(sf__gpu_read(NULL, 0, 0, b, sizeof b, NULL, 0), SF_OK);
    cr_expect_eq(sf__gpu_stream_wait(NULL, b, b), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__gpu_release_after(NULL, 0, b), SF_ERR_INVALID_ARGUMENT);
    void *const one[] = {b};
    cr_expect_eq(sf__gpu_release_after_streams(NULL, 0, one, 1), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__gpu_open(NULL, NULL, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
}

Test(gpu, nvtx_calls_are_harmless)
{
    sf__nvtx_name_thread("test-gpu");
    sf__nvtx_name_thread(NULL);
    sf__nvtx_push("outer");
    sf__nvtx_push("inner");
    sf__nvtx_pop();
    sf__nvtx_push(NULL);
    sf__nvtx_pop();
    sf__nvtx_pop();
    cr_expect(1); /* reaching here is the test: no crash, no output */
}

/* ------------------------------------------------------------------ with a device */

Test(gpu, open_gives_buffers_and_events)
{
    need_device();
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(3, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    cr_assert_not_null(g);
    cr_expect_eq(sf__gpu_device(g), 0);
    for (unsigned s = 0; s < 3; s++) {
        cr_expect_not_null(sf__gpu_u8(g, s));
        cr_expect_null(sf__gpu_f32(g, s), "f32_bytes 0 gives no float buffer");
        cr_expect_not_null(sf__gpu_event(g, s));
    }
    cr_expect_neq(sf__gpu_u8(g, 0), sf__gpu_u8(g, 1));
    cr_expect_neq(sf__gpu_event(g, 0), sf__gpu_event(g, 1));
    cr_expect_null(sf__gpu_u8(g, 3));
    cr_expect_null(sf__gpu_event(g, 3));
    cr_expect_eq(sf__gpu_query(g, 3), -1);
    /* A slot without a job is complete and has no time. */
    double t = 99.0;
    cr_expect_eq(sf__gpu_query(g, 1), 1);
    cr_expect_eq(sf__gpu_wait(g, 1, &t, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(t, 0.0);
    sf__gpu_close(g);
}

Test(gpu, open_rejects_a_missing_device_and_bad_sizes)
{
    need_device();
    struct sf_gpu *g = (struct sf_gpu *)&g;
    char err[256] = "";
    struct sf__gpu_config c = {backend(), backend() == SF__GPU_CUDA ? sf_cuda_device_count() : 1,
                               2, 4096, 0, NULL};
    cr_expect_eq(sf__gpu_open(&c, &g, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(g);
    cr_expect_not_null(strstr(err, "does not exist"), "%s", err);
    cr_expect_eq(open_ring(0, 4096, 0, &g, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(open_ring(2, 0, 0, &g, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    /* More device memory than exists: a clean failure naming the allocation. */
    err[0] = '\0';
    sf_status st = open_ring(2, (size_t)1 << 50, 0, &g, err, sizeof err);
    cr_expect_eq(st, SF_ERR_NO_MEMORY, "status %d (%s)", (int)st, err);
    cr_expect_null(g);
    cr_expect_not_null(strstr(err, "device alloc (slot 0 u8"), "message: %s", err);
}

Test(gpu, submit_rejects_jobs_that_do_not_fit)
{
    need_device();
    struct sf_gpu *g = NULL;
    char err[256] = "";
    const unsigned w = 8, h = 4;
    const size_t bytes = 2 * w * h * 3;
    cr_assert_eq(open_ring(2, bytes, bytes * sizeof(float), &g, err, sizeof err), SF_OK, "%s",
                 err);
    unsigned char host[2 * 8 * 4 * 3];
    fill_random(host, sizeof host, 1);
    struct sf__gpu_job ok = normalize_job(host, 2, w, h, SF_LAYOUT_CHW, half_mean, quarter_std);
    cr_expect_eq(sf__gpu_submit(g, 0, &ok, err, sizeof err), SF_OK, "%s", err);

    struct sf__gpu_job j = ok;
    cr_expect_eq(sf__gpu_submit(g, 2, &j, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__gpu_submit(g, 0, NULL, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    j.bytes = bytes + 1;
    cr_expect_eq(sf__gpu_submit(g, 0, &j, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    j = ok;
    j.n_images = 3; /* more pixels than the job copies */
    cr_expect_eq(sf__gpu_submit(g, 0, &j, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    j = ok;
    j.std[1] = 0.0f;
    cr_expect_eq(sf__gpu_submit(g, 0, &j, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    j = ok;
    j.layout = (enum sf_layout)7;
    cr_expect_eq(sf__gpu_submit(g, 0, &j, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    j = ok;
    j.width = 0x10000;
    j.height = 0x10000; /* 2^32 pixels: one image's index would not fit 32 bits */
    cr_expect_eq(sf__gpu_submit(g, 0, &j, err, sizeof err), SF_ERR_LIMIT);
    cr_expect_neq(err[0], '\0');
    cr_expect_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    sf__gpu_close(g);

    /* No float buffer: copying works, normalising does not fit. */
    cr_assert_eq(open_ring(1, bytes, 0, &g, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(sf__gpu_submit(g, 0, &ok, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    j = ok;
    j.normalize = 0;
    cr_expect_eq(sf__gpu_submit(g, 0, &j, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    sf__gpu_close(g);
}

Test(gpu, copy_round_trips_random_bytes_per_slot)
{
    need_device();
    const size_t bytes = (5u << 20) + 3; /* not a multiple of anything useful */
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(3, bytes, 0, &g, err, sizeof err), SF_OK, "%s", err);
    int pinned[3];
    unsigned char *host[3];
    for (unsigned s = 0; s < 3; s++) {
        host[s] = sf__host_alloc(bytes, 1, &pinned[s]);
        cr_assert_not_null(host[s]);
        fill_random(host[s], bytes, 100 + s);
        struct sf__gpu_job job = {.host = host[s], .bytes = bytes};
        cr_assert_eq(sf__gpu_submit(g, s, &job, err, sizeof err), SF_OK, "%s", err);
    }
    unsigned char *back = malloc(bytes);
    cr_assert_not_null(back);
    for (unsigned s = 0; s < 3; s++) {
        double t = -1.0;
        cr_assert_eq(sf__gpu_wait(g, s, &t, err, sizeof err), SF_OK, "%s", err);
        cr_expect_gt(t, 0.0, "slot %u: GPU time %g s", s, t);
        cr_expect_lt(t, 10.0, "slot %u: GPU time %g s", s, t);
        cr_expect_eq(sf__gpu_query(g, s), 1);
        memset(back, 0, bytes);
        cr_assert_eq(sf__gpu_read(g, s, 0, back, bytes, NULL, 0), SF_OK);
        cr_expect(memcmp(back, host[s], bytes) == 0, "slot %u differs after the round trip", s);
    }
    cr_expect_neq(sf__gpu_read(g, 0, 0, back, bytes + 1, NULL, 0), SF_OK);
    cr_expect_neq(sf__gpu_read(g, 0, 1, back, 4, NULL, 0), SF_OK, "no float buffer to read");
    free(back);
    sf__gpu_close(g);
    for (unsigned s = 0; s < 3; s++)
        sf__host_free(host[s], pinned[s]);
}

Test(gpu, query_reports_progress_and_wait_completes)
{
    need_device();
    const size_t bytes = 64u << 20;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(2, bytes, 0, &g, err, sizeof err), SF_OK, "%s", err);
    int pinned = 0;
    unsigned char *host = sf__host_alloc(bytes, 1, &pinned);
    cr_assert_not_null(host);
    memset(host, 1, bytes);
    struct sf__gpu_job job = {.host = host, .bytes = bytes};
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    int q = sf__gpu_query(g, 0);
    cr_expect(q == 0 || q == 1, "query %d", q);
    double t = 0.0;
    cr_assert_eq(sf__gpu_wait(g, 0, &t, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(sf__gpu_query(g, 0), 1);
    cr_expect_gt(t, 0.0);
    /* A second job on the same slot replaces the first one's timing. */
    job.bytes = 4096;
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    double t2 = 0.0;
    cr_assert_eq(sf__gpu_wait(g, 0, &t2, err, sizeof err), SF_OK, "%s", err);
    cr_expect_lt(t2, t, "4 KiB took %g s, 64 MiB %g s", t2, t);
    sf__gpu_close(g);
    sf__host_free(host, pinned);
}

/* Normalises n images of w x h on slot 1 and compares with the CPU formula,
 * the channel taken from the flat index as the layout defines it. */
static void check_normalize(enum sf_layout layout, size_t n, unsigned w, unsigned h)
{
    const size_t plane = (size_t)w * h, count = n * plane * 3;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(2, count, count * sizeof(float), &g, err, sizeof err), SF_OK, "%s",
                 err);
    int pinned = 0;
    unsigned char *host = sf__host_alloc(count, 1, &pinned);
    float *got = malloc(count * sizeof(float));
    unsigned char *back = malloc(count);
    cr_assert(host != NULL && got != NULL && back != NULL);
    fill_random(host, count, count ^ (size_t)layout);
    for (size_t i = 0; i < count && i < 768; i++)
        host[i] = (unsigned char)(i % 256); /* every value in every channel */

    struct sf__gpu_job job = normalize_job(host, n, w, h, layout, imagenet_mean, imagenet_std);
    cr_assert_eq(sf__gpu_submit(g, 1, &job, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_wait(g, 1, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_read(g, 1, 1, got, count * sizeof(float), NULL, 0), SF_OK);
    cr_assert_eq(sf__gpu_read(g, 1, 0, back, count, NULL, 0), SF_OK);
    cr_expect(memcmp(back, host, count) == 0, "u8 copy differs");

    /* Bit for bit: the host normalisation runs the same arithmetic. */
    float *want = malloc(count * sizeof(float));
    cr_assert_not_null(want);
    sf__normalize_u8(host, want, n, w, h, layout, imagenet_mean, imagenet_std);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0)
            first = i;
    }
    cr_expect_eq(bad, 0, "%s %zux%ux%u: %zu of %zu differ, first at %zu: %a, want %a",
                 layout == SF_LAYOUT_CHW ? "CHW" : "HWC", n, w, h, bad, count, first,
                 bad ? (double)got[first] : 0.0, bad ? (double)want[first] : 0.0);
    free(want);
    free(back);
    free(got);
    sf__host_free(host, pinned);
    sf__gpu_close(g);
}

/* n images of w x h, for check_normalize. */
struct image_size {
    size_t n;
    unsigned w, h;
};

/* check_normalize of every size in every layout, layouts varying fastest. */
static void check_normalize_sizes(const enum sf_layout *layouts, size_t n_layouts,
                                  const struct image_size *sizes, size_t n_sizes)
{
    need_device();
    for (size_t i = 0; i < n_sizes; i++)
        for (size_t k = 0; k < n_layouts; k++)
            check_normalize(layouts[k], sizes[i].n, sizes[i].w, sizes[i].h);
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const enum sf_layout chw[] = {SF_LAYOUT_CHW}, hwc[] = {SF_LAYOUT_HWC},
                            both_layouts[] = {SF_LAYOUT_CHW, SF_LAYOUT_HWC};

/* 37 x 29 x 3 is odd: images 1 and 2 start off a 4-byte boundary, so the
 * per-image head and tail paths run. */
static const struct image_size odd_sizes[] = {{3, 37, 29}, {5, 5, 3}, {1, 1, 1}};

Test(gpu, normalize_chw_odd_sizes)
{
    check_normalize_sizes(chw, N_OF(chw), odd_sizes, N_OF(odd_sizes));
}

Test(gpu, normalize_hwc_odd_sizes)
{
    check_normalize_sizes(hwc, N_OF(hwc), odd_sizes, N_OF(odd_sizes));
}

Test(gpu, normalize_aligned_sizes)
{
    static const struct image_size aligned[] = {{4, 32, 24}, {8, 224, 224}};
    check_normalize_sizes(both_layouts, N_OF(both_layouts), aligned, N_OF(aligned));
}

/* More images than resident blocks (grid-stride over images) and one image
 * larger than the whole grid (grid-stride within an image). */
Test(gpu, normalize_beyond_one_grid)
{
    need_device();
    check_normalize(SF_LAYOUT_CHW, 3000, 5, 3);
    check_normalize(SF_LAYOUT_HWC, 3000, 4, 3);
    check_normalize(SF_LAYOUT_CHW, 1, 1283, 1021);
    check_normalize(SF_LAYOUT_HWC, 1, 1283, 1021);
}

Test(gpu, normalize_writes_only_the_jobs_images)
{
    need_device();
    const unsigned w = 7, h = 5;
    const size_t img = (size_t)w * h * 3;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(1, 2 * img, 2 * img * sizeof(float), &g, err, sizeof err), SF_OK,
                 "%s", err);
    unsigned char host[2 * 7 * 5 * 3];
    fill_random(host, sizeof host, 7);
    static const float mean[3] = {0.5f, 0.25f, 0.125f}, std[3] = {2.0f, 0.5f, 0.25f};
    struct sf__gpu_job job = normalize_job(host, 2, w, h, SF_LAYOUT_HWC, mean, std);
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    float first[2 * 7 * 5 * 3], second[2 * 7 * 5 * 3];
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_read(g, 0, 1, first, sizeof first, NULL, 0), SF_OK);

    /* One shorter batch: image 0 is rewritten, image 1's floats stay. */
    for (size_t i = 0; i < img; i++)
        host[i] = (unsigned char)(255 - host[i]);
    job.bytes = img;
    job.n_images = 1;
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_read(g, 0, 1, second, sizeof second, NULL, 0), SF_OK);
    cr_expect(memcmp(first + img, second + img, img * sizeof(float)) == 0,
              "image 1 was overwritten by a one-image job");
    for (size_t i = 0; i < img; i++) {
        float want = ((float)host[i] / 255.0f - job.mean[i % 3]) / job.std[i % 3];
        cr_expect_eq(second[i], want, "element %zu: %.9g, want %.9g", i, (double)second[i],
                     (double)want);
    }
    sf__gpu_close(g);
}

/* ------------------------------------------------------------------ emulated device only */

static struct sf__emu_options emu_defaults(void)
{
    struct sf__emu_options eo;
    sf__emu_options_default(&eo);
    return eo;
}

/* An emulated ring of slots u8-byte slots (no float32 buffers) whose
 * operations run up to delay_us after they are queued; fails the test when
 * it does not open. */
static struct sf_gpu *open_delayed_ring(unsigned delay_us, unsigned slots, size_t u8)
{
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = delay_us;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_emulated(&eo, slots, u8, 0, &g, err, sizeof err), SF_OK, "%s", err);
    return g;
}

Test(gpu, host_dereference_of_device_memory_crashes)
{
    need_emulator();
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    volatile unsigned char *dev = sf__gpu_u8(g, 0);
    cr_assert(sf__emu_is_device_ptr(sf__gpu_emu(g), (const void *)dev));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not the sanitizer's report: the plain crash */
        signal(SIGBUS, SIG_DFL);
        unsigned char v = dev[17];
        _exit(v == 0 ? 3 : 4); /* reaching here is the failure */
    }
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_expect(WIFSIGNALED(ws) && (WTERMSIG(ws) == SIGSEGV || WTERMSIG(ws) == SIGBUS),
              "a host read of device memory did not crash (status 0x%x)", ws);
    sf__gpu_close(g);
}

/* The copy reads the host buffer when it runs, not when it is queued: a
 * buffer changed before the wait shows in the device copy. */
Test(gpu, copy_reads_the_host_buffer_when_it_runs)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 20000; /* the copy runs 0..20 ms after it is queued */
    eo.seed = 7;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_emulated(&eo, 1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    struct sf__emu *emu = sf__gpu_emu(g);
    void *blocker = NULL;
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    cr_assert_eq(ops->stream_create(emu, &blocker), 0);
    unsigned char host[4096], back[4096];
    memset(host, 1, sizeof host);
    struct sf__gpu_job job = {.host = host, .bytes = sizeof host};
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    memset(host, 2, sizeof host); /* before the copy ran (delay) or while: not after */
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_read(g, 0, 0, back, sizeof back, NULL, 0), SF_OK);
    size_t twos = 0;
    for (size_t i = 0; i < sizeof back; i++)
        twos += back[i] == 2;
    cr_expect_gt(twos, 0u, "the copy took the bytes at submit time, not when it ran");
    cr_assert_eq(ops->stream_destroy(emu, blocker), 0);
    sf__gpu_close(g);
}

/* rc must be the emulator's refusal of a handle, an invalid argument whose
 * text names what was missing. */
static void expect_refused(const struct sf__gpu_ops *ops, struct sf__emu *e, int rc,
                           const char *call, const char *what)
{
    cr_expect_neq(rc, 0, "%s succeeded", call);
    cr_expect_eq(ops->status_of(rc), SF_ERR_INVALID_ARGUMENT, "%s", call);
    char t[256] = "";
    ops->error_text(e, rc, t, sizeof t);
    cr_expect(strstr(t, what), "%s: '%s' does not say '%s'", call, t, what);
}

/* Streams and events that were destroyed, or never existed, are refused by
 * every call that names them (as CUDA's invalid handle), and the refusal is
 * not sticky: the live handles work on. */
Test(gpu, emulator_refuses_destroyed_and_unknown_handles)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 0;
    struct sf__emu *e = NULL;
    cr_assert_eq(sf__emu_new(&eo, &e), 0);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *s = NULL, *v = NULL, *dead_s = NULL, *dead_v = NULL;
    int unknown = 0;
    cr_assert_eq(ops->stream_create(e, &s), 0);
    cr_assert_eq(ops->event_create(e, &v, 0), 0);
    cr_assert_eq(ops->stream_create(e, &dead_s), 0);
    cr_assert_eq(ops->event_create(e, &dead_v, 0), 0);
    cr_assert_eq(ops->stream_destroy(e, dead_s), 0);
    cr_assert_eq(ops->event_destroy(e, dead_v), 0);
    void *streams[] = {dead_s, &unknown}, *events[] = {dead_v, &unknown};
    for (int i = 0; i < 2; i++) {
        expect_refused(ops, e, ops->stream_sync(e, streams[i]), "stream sync", "no stream");
        expect_refused(ops, e, ops->event_record(e, v, streams[i]), "record on", "no stream");
        expect_refused(ops, e, ops->stream_wait_event(e, streams[i], v), "wait on", "no stream");
        expect_refused(ops, e, ops->event_sync(e, events[i]), "event sync", "no event");
        expect_refused(ops, e, ops->event_query(e, events[i]), "event query", "no event");
        expect_refused(ops, e, ops->event_record(e, events[i], s), "record of", "no event");
        expect_refused(ops, e, ops->stream_wait_event(e, s, events[i]), "wait for", "no event");
    }
    cr_expect_eq(ops->event_record(e, v, s), 0, "the live handles work on");
    cr_expect_eq(ops->stream_sync(e, s), 0);
    cr_expect_eq(ops->event_query(e, v), 0, "recorded and synced: done");
    cr_expect_eq(ops->event_destroy(e, v), 0);
    cr_expect_eq(ops->stream_destroy(e, s), 0);
    sf__emu_destroy(e);
}

/* A consumer stream's read of slot 0 (4 KiB) behind a gate the test opens
 * (emu_gated_read_open). */
struct consumer_read {
    struct emu_gated_read r;
    unsigned char got[4096];
};

/* c's stream waits for slot 0's copy and queues a read of it behind c's
 * gate (shut until emu_gated_read_open). */
static void queue_gated_read(struct sf_gpu *g, void *consumer, struct consumer_read *c)
{
    cr_assert_eq(sf__gpu_stream_wait(g, sf__gpu_event(g, 0), consumer), SF_OK);
    emu_gated_read_queue(&c->r, sf__gpu_emu(g), consumer, sf__gpu_u8(g, 0), sizeof c->got, c->got,
                         0);
}

/* Batch a (4 KiB) copied into slot 0 of g; the consumer stream waits for
 * it, queues a read of the slot behind c's gate (shut until
 * emu_gated_read_open) and releases the slot with sf__gpu_release_after. */
static void read_behind_a_gate(struct sf_gpu *g, void *consumer, const unsigned char *a,
                               struct consumer_read *c)
{
    char err[256] = "";
    struct sf__gpu_job job = {.host = a, .bytes = sizeof c->got};
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    queue_gated_read(g, consumer, c);
    cr_assert_eq(sf__gpu_release_after(g, 0, consumer), SF_OK);
}

/*
 * The consumer queues a read of batch A on its stream, releases the slot
 * with sf__gpu_release_after, and the ring copies batch B into the same
 * slot. The consumer's read must see A. With `ignore` (the ring before
 * release events existed), the emulated device shows B overwriting A.
 */
static void reuse_after_release(int ignore)
{
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    sf__gpu_test_ignore_release(g, ignore);
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *consumer = NULL;
    cr_assert_eq(ops->stream_create(emu, &consumer), 0);

    unsigned char a[4096], b[4096];
    memset(a, 0xA1, sizeof a);
    memset(b, 0xB2, sizeof b);
    struct consumer_read c = {0};
    read_behind_a_gate(g, consumer, a, &c);

    struct sf__gpu_job job = {.host = b, .bytes = sizeof b};
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    if (ignore) /* nothing orders B after the read: B lands first */
        cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    else /* B waits for the release: B must not complete while the gate is shut */
        cr_expect_eq(sf__gpu_query(g, 0), 0, "the copy into a released slot did not wait");
    emu_gated_read_open(&c.r);
    cr_assert_eq(ops->stream_sync(emu, consumer), 0);
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(c.r.rc, 0);
    if (ignore)
        cr_expect(memcmp(c.got, b, sizeof b) == 0, "expected the hazard: B overwrote A");
    else
        cr_expect(memcmp(c.got, a, sizeof a) == 0,
                  "the consumer's read of batch A saw other bytes (first byte 0x%02x)", c.got[0]);
    unsigned char back[4096];
    cr_assert_eq(sf__gpu_read(g, 0, 0, back, sizeof back, NULL, 0), SF_OK);
    cr_expect(memcmp(back, b, sizeof b) == 0, "the slot does not hold batch B at the end");
    cr_assert_eq(ops->stream_destroy(emu, consumer), 0);
    emu_gated_read_destroy(&c.r);
    sf__gpu_close(g);
}

Test(gpu, released_slot_is_not_overwritten_while_the_consumer_reads_it)
{
    need_emulator();
    reuse_after_release(0);
}

Test(gpu, emulator_catches_a_slot_reused_without_the_release_event)
{
    need_emulator();
    reuse_after_release(1);
}

/* The last batch is released with sf__gpu_release_after and the ring closes
 * at once (Python: the last tensor freed closes the loader): the consumer's
 * read, still queued behind its gate, must find the slot's buffer alive. */
Test(gpu, close_waits_for_work_the_consumer_queued_before_its_release)
{
    need_emulator();
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *consumer = NULL; /* goes with the ring's device */
    cr_assert_eq(ops->stream_create(emu, &consumer), 0);
    unsigned char a[4096];
    memset(a, 0xA1, sizeof a);
    struct consumer_read c = {0};
    read_behind_a_gate(g, consumer, a, &c);
    pthread_t opener;
    cr_assert_eq(pthread_create(&opener, NULL, emu_gated_read_open_later, &c.r), 0);
    sf__gpu_close(g);
    pthread_join(opener, NULL);
    cr_expect_eq(c.r.rc, 0, "the consumer's read ran after close freed the slot");
    cr_expect(memcmp(c.got, a, sizeof a) == 0, "the consumer's read saw other bytes");
    emu_gated_read_destroy(&c.r);
}

/* A release on a stream the device does not know (destroyed, or never one)
 * is the caller's mistake, reported as such: not SF_ERR_INTERNAL ("a bug:
 * an invariant did not hold"), the status the other calls map it to. */
Test(gpu, release_on_an_unknown_stream_is_an_invalid_argument)
{
    need_emulator();
    struct sf_gpu *g = open_delayed_ring(0, 1, 64);
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *gone = NULL;
    cr_assert_eq(ops->stream_create(emu, &gone), 0);
    cr_assert_eq(ops->stream_destroy(emu, gone), 0);
    int unknown = 0;
    void *const streams[] = {gone, &unknown};
    for (size_t i = 0; i < N_OF(streams); i++) {
        cr_expect_eq(sf__gpu_release_after(g, 0, streams[i]), SF_ERR_INVALID_ARGUMENT, "stream %zu",
                     i);
        cr_expect_eq(sf__gpu_stream_wait(g, sf__gpu_event(g, 0), streams[i]),
                     SF_ERR_INVALID_ARGUMENT, "stream %zu", i);
    }
    /* Refused, it left nothing to wait for: the slot takes a job at once. */
    unsigned char host[64] = {7};
    struct sf__gpu_job job = {.host = host, .bytes = sizeof host};
    char err[256] = "";
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    sf__gpu_close(g);
}

/* The per-thread default stream is the releasing thread's: a release event
 * goes on the legacy default stream, which waits for every blocking stream. */
Test(gpu, release_after_the_per_thread_stream_records_on_the_legacy_one)
{
    int x = 0;
    cr_expect_eq(sf__gpu_stream_for_release((void *)2), (void *)1);
    cr_expect_eq(sf__gpu_stream_for_release((void *)1), (void *)1);
    cr_expect_null(sf__gpu_stream_for_release(NULL));
    cr_expect_eq(sf__gpu_stream_for_release(&x), (void *)&x);
}

/* A one-slot emulated ring of 4 KiB whose slot 0 was given batch A (0xA1
 * bytes) with job; b is batch B (0xB2 bytes), for a later copy. */
struct batch_a_ring {
    struct sf_gpu *g;
    struct sf__emu *emu;
    const struct sf__gpu_ops *ops;
    unsigned char a[4096], b[4096];
    struct sf__gpu_job job;
};

static void open_with_batch_a(struct batch_a_ring *r)
{
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &r->g, err, sizeof err), SF_OK, "%s", err);
    r->emu = sf__gpu_emu(r->g);
    r->ops = sf__gpu_emu_ops();
    memset(r->a, 0xA1, sizeof r->a);
    memset(r->b, 0xB2, sizeof r->b);
    r->job = (struct sf__gpu_job){.host = r->a, .bytes = sizeof r->a};
    cr_assert_eq(sf__gpu_submit(r->g, 0, &r->job, err, sizeof err), SF_OK, "%s", err);
}

#define N_READERS 3

/*
 * Batch A in slot 0 is read on three consumer streams, each behind its own
 * gate, and released after all three; batch B is then copied into the slot.
 * The last stream's read is let through at once; the first two must still
 * see A when their gates open: B's copy waits for every stream, not only
 * the last. (Their gates open when B's copy is seen complete, which only
 * the defect allows, or after 100 ms, so a correct ring never waits long.)
 */
Test(gpu, released_slot_waits_for_every_stream_it_was_released_after)
{
    need_emulator();
    static struct batch_a_ring r;
    open_with_batch_a(&r);
    char err[256] = "";
    void *consumer[N_READERS];
    static struct consumer_read c[N_READERS];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N_READERS; i++) {
        cr_assert_eq(r.ops->stream_create(r.emu, &consumer[i]), 0);
        queue_gated_read(r.g, consumer[i], &c[i]);
    }
    cr_assert_eq(sf__gpu_release_after_streams(r.g, 0, consumer, N_READERS), SF_OK);
    r.job.host = r.b;
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    emu_gated_read_open(&c[N_READERS - 1].r);
    cr_assert_eq(r.ops->stream_sync(r.emu, consumer[N_READERS - 1]), 0);
    cr_expect_eq(sf__gpu_query(r.g, 0), 0,
                 "the copy into the slot waited for the last stream only");
    pthread_t opener[N_READERS - 1];
    for (int i = 0; i < N_READERS - 1; i++)
        cr_assert_eq(pthread_create(&opener[i], NULL, emu_gated_read_open_later, &c[i].r), 0);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    for (int i = 0; i < N_READERS - 1; i++)
        emu_gated_read_open(&c[i].r);
    for (int i = 0; i < N_READERS; i++) {
        if (i < N_READERS - 1)
            pthread_join(opener[i], NULL);
        cr_assert_eq(r.ops->stream_sync(r.emu, consumer[i]), 0);
        cr_expect_eq(c[i].r.rc, 0);
        cr_expect(memcmp(c[i].got, r.a, sizeof r.a) == 0,
                  "stream %d's read of batch A saw other bytes (first byte 0x%02x)", i,
                  c[i].got[0]);
        cr_assert_eq(r.ops->stream_destroy(r.emu, consumer[i]), 0);
        emu_gated_read_destroy(&c[i].r);
    }
    sf__gpu_close(r.g);
}

/* Duplicates count once (so the bound holds for distinct streams); more
 * distinct streams than SF_LOADER_RELEASE_STREAMS_MAX are refused with
 * nothing recorded: the next copy does not wait for the shut gate of the
 * first stream (with an event recorded there, the wait would never end). */
Test(gpu, release_after_too_many_streams_is_refused_whole, .timeout = 60)
{
    need_emulator();
    static struct batch_a_ring r;
    open_with_batch_a(&r);
    char err[256] = "";
    enum { N = SF_LOADER_RELEASE_STREAMS_MAX + 1 };
    void *s[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(r.ops->stream_create(r.emu, &s[i]), 0);
    static struct consumer_read c;
    memset(&c, 0, sizeof c);
    queue_gated_read(r.g, s[0], &c);
    cr_expect_eq(sf__gpu_release_after_streams(r.g, 0, s, N), SF_ERR_LIMIT);
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    /* the bound's worth of distinct streams, each twice: accepted, and the
     * next copy waits for the first one's gate */
    void *twice[2 * SF_LOADER_RELEASE_STREAMS_MAX];
    for (int i = 0; i < 2 * SF_LOADER_RELEASE_STREAMS_MAX; i++)
        twice[i] = s[i % SF_LOADER_RELEASE_STREAMS_MAX];
    cr_expect_eq(sf__gpu_release_after_streams(r.g, 0, twice, N_OF(twice)), SF_OK);
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(sf__gpu_query(r.g, 0), 0, "the copy did not wait for the first stream");
    emu_gated_read_open(&c.r);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(r.ops->stream_sync(r.emu, s[i]), 0);
        cr_assert_eq(r.ops->stream_destroy(r.emu, s[i]), 0);
    }
    emu_gated_read_destroy(&c.r);
    sf__gpu_close(r.g);
}

/* A stream the device refuses among good ones: its status comes back, and
 * the copy still waits for the good stream's read. */
Test(gpu, release_after_streams_with_a_refused_one_still_waits_for_the_others)
{
    need_emulator();
    static struct batch_a_ring r;
    open_with_batch_a(&r);
    char err[256] = "";
    void *good = NULL;
    cr_assert_eq(r.ops->stream_create(r.emu, &good), 0);
    static struct consumer_read c;
    memset(&c, 0, sizeof c);
    queue_gated_read(r.g, good, &c);
    int unknown = 0;
    void *const streams[] = {&unknown, good};
    cr_expect_eq(sf__gpu_release_after_streams(r.g, 0, streams, N_OF(streams)),
                 SF_ERR_INVALID_ARGUMENT);
    r.job.host = r.b;
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(sf__gpu_query(r.g, 0), 0, "the copy did not wait for the good stream");
    emu_gated_read_open(&c.r);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(r.ops->stream_sync(r.emu, good), 0);
    cr_expect(memcmp(c.got, r.a, sizeof r.a) == 0, "the good stream's read saw other bytes");
    cr_assert_eq(r.ops->stream_destroy(r.emu, good), 0);
    emu_gated_read_destroy(&c.r);
    sf__gpu_close(r.g);
}

/* The consumer's stream waits for the done event: its read sees the copy
 * complete although the copy is slow. */
Test(gpu, consumer_stream_waits_for_the_copy_without_the_host)
{
    need_emulator();
    struct sf_gpu *g = open_delayed_ring(5000, 2, 4096);
    char err[256] = "";
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *consumer = NULL;
    cr_assert_eq(ops->stream_create(emu, &consumer), 0);
    for (int round = 0; round < 8; round++) {
        unsigned char host[4096];
        memset(host, 0x40 + round, sizeof host);
        unsigned slot = (unsigned)round % 2;
        struct sf__gpu_job job = {.host = host, .bytes = sizeof host};
        cr_assert_eq(sf__gpu_submit(g, slot, &job, err, sizeof err), SF_OK, "%s", err);
        struct consumer_read c = {0};
        cr_assert_eq(sf__gpu_stream_wait(g, sf__gpu_event(g, slot), consumer), SF_OK);
        /* its gate open: the read runs as soon as the stream reaches it */
        emu_gated_read_queue(&c.r, emu, consumer, sf__gpu_u8(g, slot), sizeof c.got, c.got, 1);
        cr_assert_eq(ops->stream_sync(emu, consumer), 0);
        cr_expect(memcmp(c.got, host, sizeof host) == 0, "round %d: read before the copy", round);
        emu_gated_read_destroy(&c.r);
        cr_assert_eq(sf__gpu_wait(g, slot, NULL, err, sizeof err), SF_OK, "%s", err);
    }
    cr_assert_eq(ops->stream_destroy(emu, consumer), 0);
    sf__gpu_close(g);
}

/* One job through a ring of 2 slots with normalisation; returns the first
 * failing status (and its message in err). */
static sf_status ring_cycle(const struct sf__emu_options *eo, char *err, size_t err_len)
{
    const unsigned w = 5, h = 3;
    const size_t bytes = 2 * w * h * 3;
    struct sf_gpu *g = NULL;
    sf_status st = open_emulated(eo, 2, bytes, bytes * sizeof(float), &g, err, err_len);
    if (st != SF_OK)
        return st;
    unsigned char host[2 * 5 * 3 * 3];
    fill_random(host, sizeof host, 3);
    struct sf__gpu_job job = normalize_job(host, 2, w, h, SF_LAYOUT_CHW, half_mean, quarter_std);
    for (unsigned slot = 0; slot < 2 && st == SF_OK; slot++) {
        st = sf__gpu_submit(g, slot, &job, err, err_len);
        double t = 0;
        if (st == SF_OK)
            st = sf__gpu_wait(g, slot, &t, err, err_len);
    }
    float f[2 * 5 * 3 * 3], want[2 * 5 * 3 * 3];
    if (st == SF_OK) {
        st = sf__gpu_read(g, 1, 1, f, sizeof f, err, err_len);
        sf__normalize_u8(host, want, 2, w, h, SF_LAYOUT_CHW, job.mean, job.std);
        if (st == SF_OK && memcmp(f, want, sizeof f) != 0) {
            snprintf(err, err_len, "wrong result without an error");
            st = SF_ERR_INTERNAL;
        }
    }
    sf__gpu_close(g);
    return st;
}

/* Every operation of open, submit, wait, read fails once in turn: each
 * failure is reported (status and a message naming the operation and the
 * injected failure), and nothing leaks or hangs (ASan and the ctest
 * timeout watch). */
Test(gpu, every_failing_operation_is_reported_and_cleaned_up, .timeout = 120)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 0;
    char err[512] = "";
    cr_assert_eq(ring_cycle(&eo, err, sizeof err), SF_OK, "%s", err);
    /* How many operations a clean cycle calls. */
    struct sf_gpu *probe = NULL;
    cr_assert_eq(open_emulated(&eo, 2, 90, 360, &probe, err, sizeof err), SF_OK);
    unsigned long at_open = sf__emu_op_count(sf__gpu_emu(probe));
    sf__gpu_close(probe);
    unsigned long total = at_open + 2 * 8 + 8; /* generous: extra calls only pass */
    unsigned failed = 0;
    for (int async = 0; async <= 1; async++) {
        for (unsigned long n = 1; n <= total; n++) {
            eo.fail_at = n;
            eo.fail_async = async;
            err[0] = '\0';
            sf_status st = ring_cycle(&eo, err, sizeof err);
            if (st == SF_OK)
                continue; /* n is past the cycle's last operation */
            failed++;
            cr_expect_neq(st, SF_ERR_INTERNAL, "fail_at %lu async %d: %s", n, async, err);
            cr_expect_not_null(strstr(err, "injected failure of operation"),
                               "fail_at %lu async %d: %s", n, async, err);
            cr_expect_not_null(strstr(err, "emulated "), "fail_at %lu: no operation named: %s", n,
                               err);
        }
    }
    cr_expect_geq(failed, at_open + 10, "only %u injected failures surfaced", failed);
}

Test(gpu, kernel_checks_catch_a_missing_and_a_double_write)
{
    need_emulator();
    for (int fault = 1; fault <= 2; fault++) {
        struct sf__emu_options eo = emu_defaults();
        eo.kernel_fault = fault;
        char err[512] = "";
        sf_status st = ring_cycle(&eo, err, sizeof err);
        cr_expect_eq(st, SF_ERR_IO, "fault %d: status %d: %s", fault, (int)st, err);
        cr_expect_not_null(strstr(err, fault == 1 ? "written 0 times" : "written 2 times"),
                           "fault %d: %s", fault, err);
    }
}

/* The wait for a job whose kernel faults must report the fault, whether
 * the stream has gone past the job's done event by then or not (a faulted
 * device skips the rest of its queue at once). A wait without timing (as
 * doctor's device check) returned SF_OK over the poisoned floats, and the
 * fault surfaced only at the next call (in the loader: the elapsed-time
 * query, then named as the failing operation). */
Test(gpu, wait_for_a_faulting_kernel_reports_the_fault)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 0;
    eo.kernel_fault = 1;
    unsigned char host[90];
    fill_random(host, sizeof host, 5);
    struct sf__gpu_job job = normalize_job(host, 2, 5, 3, SF_LAYOUT_HWC, half_mean, quarter_std);
    for (int round = 0; round < 10; round++) {
        struct sf_gpu *g = NULL;
        char err[512] = "";
        cr_assert_eq(open_emulated(&eo, 1, 90, 360, &g, err, sizeof err), SF_OK, "%s", err);
        cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
        sf_status st = sf__gpu_wait(g, 0, NULL, err, sizeof err);
        cr_expect_eq(st, SF_ERR_IO, "round %d: status %d: %s", round, (int)st, err);
        cr_expect_not_null(strstr(err, "written 0 times"), "round %d: %s", round, err);
        sf__gpu_close(g);
    }
}

Test(gpu, close_with_work_still_queued)
{
    need_emulator();
    struct sf_gpu *g = open_delayed_ring(3000, 3, 1 << 16);
    char err[256] = "";
    unsigned char *host = malloc(1 << 16);
    cr_assert_not_null(host);
    memset(host, 9, 1 << 16);
    for (unsigned s = 0; s < 3; s++) {
        struct sf__gpu_job job = {.host = host, .bytes = 1 << 16};
        cr_assert_eq(sf__gpu_submit(g, s, &job, err, sizeof err), SF_OK, "%s", err);
    }
    sf__gpu_close(g); /* waits for the copies: host must outlive it */
    free(host);
}

Test(gpu, emulator_options_from_the_environment)
{
    struct sf__emu_options eo = emu_defaults();
    char err[256] = "";
    setenv("SF_GPU_EMULATOR",
           "seed=9,delay_us=0,fail_at=12,fail_async=1,units=3,mem_mib=64,kernel_fault=2", 1);
    cr_assert_eq(sf__emu_options_from_env(&eo, err, sizeof err), 0, "%s", err);
    cr_expect_eq(eo.seed, 9u);
    cr_expect_eq(eo.delay_us, 0u);
    cr_expect_eq(eo.fail_at, 12u);
    cr_expect_eq(eo.fail_async, 1);
    cr_expect_eq(eo.units, 3);
    cr_expect_eq(eo.mem_bytes, (uint64_t)64 << 20);
    cr_expect_eq(eo.kernel_fault, 2); /* so a kernel fault can be shown through the loader */
    /* strtoull alone would take "-1" as 2^64 - 1 and skip leading blanks. */
    const char *bad[] = {"seed",           "units=0",    "delay_us=x", "colour=3",
                         "fail_at=-1",     "seed=-3",    "mem_mib= 8", "units=+2",
                         "kernel_fault=3", "fail_async=2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("SF_GPU_EMULATOR", bad[i], 1);
        err[0] = '\0';
        cr_expect_eq(sf__emu_options_from_env(&eo, err, sizeof err), -1, "%s accepted", bad[i]);
        cr_expect_not_null(strstr(err, "SF_GPU_EMULATOR"), "%s: %s", bad[i], err);
    }
    /* A ring opened with a bad variable fails naming it. */
    struct sf_gpu *g = NULL;
    struct sf__gpu_config c = {SF__GPU_EMULATED, 0, 1, 64, 0, NULL};
    cr_expect_eq(sf__gpu_open(&c, &g, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(g);
    unsetenv("SF_GPU_EMULATOR");
}

Test(gpu, emulated_device_memory_is_bounded)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.mem_bytes = 1 << 20;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    sf_status st = open_emulated(&eo, 4, 300 << 10, 0, &g, err, sizeof err);
    cr_expect_eq(st, SF_ERR_NO_MEMORY, "%s", err);
    cr_expect_not_null(strstr(err, "slot 3 u8"), "%s", err);
    cr_expect_null(g);
}
