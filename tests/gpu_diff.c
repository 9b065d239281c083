/*
 * The GPU ring on one backend against the emulated device, bit for bit:
 * the same batches (odd and large shapes, CHW and HWC, several mean/std
 * sets) go through a ring on each; the u8 copies and the normalised floats
 * read back from both must be equal to each other and to the host
 * normalisation (sf__normalize_u8).
 *
 *   gpu_diff cuda       the CUDA backend (scripts/gpu-acceptance.sh); exit
 *                       77 (skipped) when the build has no CUDA or there is
 *                       no device
 *   gpu_diff emulated   a second emulated device with other delays and
 *                       unit count (ctest gpu_diff_emulated: the program
 *                       itself runs in every build)
 *
 * Exit 0 when equal, 1 on the first difference, naming the batch, the
 * buffer and the element.
 */
#include "src/decode.h"
#include "src/gpu.h"
#include "src/gpu_dev.h"
#include "support/float_bits.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 3u

struct shape {
    size_t n_images;
    unsigned width, height;
    enum sf_layout layout;
};

static const struct shape SHAPES[] = {
    {3, 37, 29, SF_LAYOUT_CHW},   {5, 5, 3, SF_LAYOUT_HWC},     {1, 1, 1, SF_LAYOUT_CHW},
    {64, 224, 224, SF_LAYOUT_CHW}, {7, 283, 221, SF_LAYOUT_HWC}, {1, 1283, 1021, SF_LAYOUT_CHW},
    {3000, 5, 3, SF_LAYOUT_HWC},  {2, 1283, 1021, SF_LAYOUT_HWC},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

static const float MEAN[3][3] = {
    {0.485f, 0.456f, 0.406f}, {0.5f, -0.25f, 1.0f / 3.0f}, {0.0f, 0.0f, 0.0f}};
static const float STD[3][3] = {
    {0.229f, 0.224f, 0.225f}, {1e-3f, 3.0f, 0.7f}, {1.0f, 1.0f, 1.0f}};

static size_t bytes_of(const struct shape *s)
{
    return s->n_images * (size_t)s->width * s->height * 3u;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int differ_u8(const unsigned char *a, const unsigned char *b, size_t n, const char *what,
                     const char *names)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "gpu_diff: FAIL: %s: u8 byte %zu of %zu differs (%s): %u vs %u\n", what,
                    i, n, names, a[i], b[i]);
            return 1;
        }
    return 0;
}

static int differ_f32(const float *a, const float *b, size_t n, const char *what, const char *names)
{
    for (size_t i = 0; i < n; i++)
        if (float_bits(a[i]) != float_bits(b[i])) {
            fprintf(stderr,
                    "gpu_diff: FAIL: %s: float %zu of %zu differs (%s): %a (0x%08x) vs %a "
                    "(0x%08x)\n",
                    what, i, n, names, (double)a[i], (unsigned)float_bits(a[i]), (double)b[i],
                    (unsigned)float_bits(b[i]));
            return 1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "cuda";
    enum sf__gpu_backend other;
    if (!strcmp(which, "cuda"))
        other = SF__GPU_CUDA;
    else if (!strcmp(which, "emulated"))
        other = SF__GPU_EMULATED;
    else {
        fprintf(stderr, "usage: %s [cuda|emulated]\n", argv[0]);
        return 2;
    }
    if (other == SF__GPU_CUDA && !sf__gpu_usable(-1)) {
        printf("gpu_diff: no CUDA in this build or no device: skipped\n");
        return 77;
    }

    size_t max_u8 = 0;
    for (size_t k = 0; k < N_SHAPES; k++)
        if (bytes_of(&SHAPES[k]) > max_u8)
            max_u8 = bytes_of(&SHAPES[k]);

    /* The reference: the emulated device as the tests use it (random
     * delays). The one compared: CUDA, or an emulated device with other
     * delays, a fixed unit count and its own seed. */
    struct sf__emu_options ref_opt, alt_opt;
    sf__emu_options_default(&ref_opt);
    sf__emu_options_default(&alt_opt);
    ref_opt.seed = 1;
    ref_opt.delay_us = 50;
    alt_opt.seed = 977;
    alt_opt.delay_us = 200;
    alt_opt.units = 3;
    const struct sf__gpu_config ref_cfg = {SF__GPU_EMULATED, 0, SLOTS, max_u8,
                                           max_u8 * sizeof(float), &ref_opt};
    const struct sf__gpu_config alt_cfg = {other, 0, SLOTS, max_u8, max_u8 * sizeof(float),
                                           other == SF__GPU_EMULATED ? &alt_opt : NULL};
    char err[512];
    struct sf_gpu *ref = NULL, *alt = NULL;
    if (sf__gpu_open(&ref_cfg, &ref, err, sizeof err) != SF_OK) {
        fprintf(stderr, "gpu_diff: FAIL: opening the emulated ring: %s\n", err);
        return 1;
    }
    if (sf__gpu_open(&alt_cfg, &alt, err, sizeof err) != SF_OK) {
        fprintf(stderr, "gpu_diff: FAIL: opening the %s ring: %s\n", which, err);
        sf__gpu_close(ref);
        return 1;
    }

    int pinned[SLOTS];
    unsigned char *host[SLOTS];
    for (unsigned s = 0; s < SLOTS; s++)
        host[s] = sf__host_alloc(max_u8, 1, &pinned[s]);
    unsigned char *u8_ref = malloc(max_u8), *u8_alt = malloc(max_u8);
    float *f_ref = malloc(max_u8 * sizeof(float)), *f_alt = malloc(max_u8 * sizeof(float));
    float *f_host = malloc(max_u8 * sizeof(float));
    int failed = !u8_ref || !u8_alt || !f_ref || !f_alt || !f_host;
    for (unsigned s = 0; s < SLOTS; s++)
        failed |= host[s] == NULL;
    if (failed)
        fprintf(stderr, "gpu_diff: FAIL: out of memory\n");

    /* Every shape with every mean/std set, each batch in the next slot, so
     * that slots are reused with other shapes over them. */
    uint64_t rng = 0x9e3779b97f4a7c15u;
    unsigned batch = 0;
    for (size_t k = 0; k < N_SHAPES && !failed; k++)
        for (int set = 0; set < 3 && !failed; set++, batch++) {
            const struct shape *sh = &SHAPES[k];
            const unsigned slot = batch % SLOTS;
            const size_t n = bytes_of(sh);
            for (size_t i = 0; i < n; i++)
                host[slot][i] = (unsigned char)(rng_next(&rng) >> 56);
            for (size_t i = 0; i < n && i < 256; i++) /* every byte value at least once */
                host[slot][i] = (unsigned char)(i * 167u + 89u);
            struct sf__gpu_job job = {.host = host[slot],
                                      .bytes = n,
                                      .normalize = 1,
                                      .n_images = sh->n_images,
                                      .width = sh->width,
                                      .height = sh->height,
                                      .layout = sh->layout};
            memcpy(job.mean, MEAN[set], sizeof job.mean);
            memcpy(job.std, STD[set], sizeof job.std);
            char what[128];
            snprintf(what, sizeof what, "batch %u (slot %u, %zu x %ux%u %s, mean/std set %d)",
                     batch, slot, sh->n_images, sh->width, sh->height,
                     sh->layout == SF_LAYOUT_HWC ? "HWC" : "CHW", set);
            struct sf_gpu *rings[2] = {ref, alt};
            for (int r = 0; r < 2 && !failed; r++)
                if (sf__gpu_submit(rings[r], slot, &job, err, sizeof err) != SF_OK ||
                    sf__gpu_wait(rings[r], slot, NULL, err, sizeof err) != SF_OK ||
                    sf__gpu_read(rings[r], slot, 0, r ? u8_alt : u8_ref, n, err, sizeof err) !=
                        SF_OK ||
                    sf__gpu_read(rings[r], slot, 1, r ? f_alt : f_ref, n * sizeof(float), err,
                                 sizeof err) != SF_OK) {
                    fprintf(stderr, "gpu_diff: FAIL: %s on the %s ring: %s\n", what,
                            r ? which : "emulated", err);
                    failed = 1;
                }
            if (failed)
                break;
            sf__normalize_u8(host[slot], f_host, sh->n_images, sh->width, sh->height, sh->layout,
                             MEAN[set], STD[set]);
            failed = differ_u8(u8_alt, host[slot], n, what, "ring vs host batch") ||
                     differ_u8(u8_ref, host[slot], n, what, "emulated vs host batch") ||
                     differ_f32(f_alt, f_ref, n, what, "ring vs emulated") ||
                     differ_f32(f_alt, f_host, n, what, "ring vs sf__normalize_u8");
            if (!failed)
                printf("ok  %s\n", what);
        }

    free(f_host);
    free(f_alt);
    free(f_ref);
    free(u8_alt);
    free(u8_ref);
    for (unsigned s = 0; s < SLOTS; s++)
        sf__host_free(host[s], pinned[s]);
    sf__gpu_close(alt);
    sf__gpu_close(ref);
    if (failed)
        return 1;
    printf("gpu_diff: %u batches, the %s ring equals the emulated device and the host path bit "
           "for bit\n",
           batch, which);
    return 0;
}
