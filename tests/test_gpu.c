/* The GPU ring's suite. Every test of the ring runs on the backend that
 * SF_TEST_GPU_BACKEND names: "emulated" (the default: every build, no GPU)
 * or "cuda" (scripts/gpu-acceptance.sh, on a machine with a GPU). The tests
 * that need the emulator's hooks (consumer streams, injected failures,
 * inaccessible device memory, the kernel checks) run on it only and live in
 * test_gpu_emulated.c; gpu_fixture.c holds what both files use. */
#include <criterion/criterion.h>

#include "gpu_fixture.h"
#include "shardfeed.h"
#include "src/decode.h"
#include "src/gpu.h"
#include "src/gpu_dev.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
static const float imagenet_std[3] = {0.229f, 0.224f, 0.225f};

/* The suite's backend must be there: the emulated one always is; asking for
 * CUDA without a device is a failure, not a skip (gpu-acceptance.sh). */
static void need_device(void)
{
    if (backend() == SF__GPU_CUDA)
        cr_assert(sf__gpu_usable(-1), "SF_TEST_GPU_BACKEND=cuda but no CUDA device");
}

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
