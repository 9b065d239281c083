/* The GPU ring suite's fixture (gpu_fixture.h). */
#include "gpu_fixture.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

enum sf__gpu_backend backend(void)
{
    const char *b = getenv("SF_TEST_GPU_BACKEND");
    return b && !strcmp(b, "cuda") ? SF__GPU_CUDA : SF__GPU_EMULATED;
}

void need_emulator(void)
{
    if (backend() != SF__GPU_EMULATED)
        cr_skip_test("emulated device only (its test hooks)");
}

sf_status open_ring(unsigned slots, size_t u8, size_t f32, struct sf_gpu **g, char *err,
                    size_t err_len)
{
    struct sf__gpu_config c = {backend(), 0, slots, u8, f32, NULL};
    return sf__gpu_open(&c, g, err, err_len);
}

sf_status open_emulated(const struct sf__emu_options *eo, unsigned slots, size_t u8, size_t f32,
                        struct sf_gpu **g, char *err, size_t err_len)
{
    struct sf__gpu_config c = {SF__GPU_EMULATED, 0, slots, u8, f32, eo};
    return sf__gpu_open(&c, g, err, err_len);
}

void fill_random(unsigned char *p, size_t n, uint64_t seed)
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
struct sf__gpu_job normalize_job(const unsigned char *host, size_t n, unsigned w, unsigned h,
                                 enum sf_layout layout, const float mean[3], const float std[3])
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

const float half_mean[3] = {0.5f, 0.5f, 0.5f}, quarter_std[3] = {0.25f, 0.25f, 0.25f};
