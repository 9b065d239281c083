/* The GPU ring suite's fixture, shared by tests/test_gpu*.c (one executable,
 * one suite): the backend SF_TEST_GPU_BACKEND names, rings opened on it or
 * on the emulator, seeded bytes and normalisation jobs. */
#ifndef SF_TEST_GPU_FIXTURE_H
#define SF_TEST_GPU_FIXTURE_H

#include "shardfeed.h"
#include "src/gpu.h"
#include "src/gpu_dev.h"

#include <stddef.h>
#include <stdint.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* SF_TEST_GPU_BACKEND: "cuda" is CUDA, anything else (or unset) the emulator. */
enum sf__gpu_backend backend(void);

/* Skips the test unless the suite runs on the emulator (its test hooks). */
void need_emulator(void);

/* A ring of slots slots of u8 bytes and f32 floats on backend(). */
sf_status open_ring(unsigned slots, size_t u8, size_t f32, struct sf_gpu **g, char *err,
                    size_t err_len);

/* The same ring on the emulator with eo's delays, failures and checks. */
sf_status open_emulated(const struct sf__emu_options *eo, unsigned slots, size_t u8, size_t f32,
                        struct sf_gpu **g, char *err, size_t err_len);

/* n bytes of a xorshift sequence seeded by seed. */
void fill_random(unsigned char *p, size_t n, uint64_t seed);

/* Copies n images of w x h x 3 bytes from host and normalises them with
 * mean and std. */
struct sf__gpu_job normalize_job(const unsigned char *host, size_t n, unsigned w, unsigned h,
                                 enum sf_layout layout, const float mean[3], const float std[3]);

/* Normalisation parameters whose results are exact in float32. */
extern const float half_mean[3], quarter_std[3];

#endif
