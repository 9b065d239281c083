/*
 * The resize kernels (src/resize.c): every level this build and CPU can run
 * (portable C, SSE2, AVX2) against the arithmetic of docs/decode.md computed
 * here, on random rows, offsets, weights and widths; and whole decodes at
 * each level, which must give the same bytes. Part of the `decode` suite
 * (tests/test_decode.c).
 */
#include "decode_fixture.h"

#include <criterion/criterion.h>

#include "src/decode.h"
#include "src/resize.h"
#include "src/sampler.h"

#include <turbojpeg.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *level_name(enum sf__simd level)
{
    return level == SF__SIMD_AVX2 ? "avx2" : level == SF__SIMD_SSE2 ? "sse2" : "c";
}

Test(decode, simd_best_is_the_cpus)
{
    enum sf__simd best = sf__simd_best();
    cr_assert(sf__simd_available(best));
    cr_assert(sf__simd_available(SF__SIMD_C));
#if defined(__x86_64__) && defined(__GNUC__)
    cr_assert(sf__simd_available(SF__SIMD_SSE2));
    if (__builtin_cpu_supports("avx2"))
        cr_assert_eq(best, SF__SIMD_AVX2, "the CPU has AVX2 but the decoder would use %s",
                     level_name(best));
    else
        cr_assert(!sf__simd_available(SF__SIMD_AVX2));
#endif
    struct sf_decoder *d = new_decoder();
    for (int l = SF__SIMD_C; l <= SF__SIMD_AVX2; l++)
        cr_assert_eq(sf__decoder_set_simd(d, (enum sf__simd)l) == SF_OK,
                     sf__simd_available((enum sf__simd)l) != 0);
    cr_assert_eq(sf__decoder_set_simd(d, (enum sf__simd)7), SF_ERR_UNSUPPORTED);
    sf__decoder_destroy(d);
}

/* The horizontal pass as docs/decode.md states it. */
static int16_t h_want(const unsigned char *row, int32_t xo, uint32_t xw, unsigned c)
{
    const unsigned char *a = row + xo;
    return (int16_t)((a[c] * (xw & 0xffff) + a[3 + c] * (xw >> 16) + 8) >> 4);
}

Test(decode, resize_kernels_give_the_documented_values)
{
    struct sf__rng rng = {0x5eed};
    int levels = 0;
    for (int l = SF__SIMD_C; l <= SF__SIMD_AVX2; l++) {
        const enum sf__simd level = (enum sf__simd)l;
        if (!sf__simd_available(level))
            continue;
        levels++;
        for (int trial = 0; trial < 400; trial++) {
            const unsigned src_px = 1 + (unsigned)sf__rng_below(&rng, 700);
            const unsigned width = 1 + (unsigned)sf__rng_below(&rng, 300);
            const unsigned wp = sf__resize_pad(width);
            const int planar = (int)(trial & 1);
            const size_t row_bytes = (size_t)src_px * 3 + SF__RESIZE_ROW_PAD;
            unsigned char *row = malloc(row_bytes);
            int32_t *xo = malloc(wp * sizeof *xo);
            uint32_t *xw = malloc(wp * sizeof *xw);
            const size_t hn = 3 * (size_t)wp + SF__RESIZE_HPAD;
            int16_t *h = malloc(hn * sizeof *h);
            cr_assert(row && xo && xw && h);
            for (size_t i = 0; i < row_bytes; i++)
                row[i] = (unsigned char)sf__rng_next(&rng);
            for (unsigned x = 0; x < wp; x++) {
                /* any byte offset whose taps lie in the row, not only whole pixels */
                xo[x] = (int32_t)sf__rng_below(&rng, (uint64_t)src_px * 3 - 2);
                uint32_t w = (uint32_t)sf__rng_below(&rng, SF__W_ONE);
                if (sf__rng_below(&rng, 8) == 0)
                    w = 0; /* a clamped edge */
                xw[x] = (SF__W_ONE - w) | w << 16;
            }
            memset(h, 0xa5, hn * sizeof *h);
            sf__resize_h(level, h, row, xo, xw, wp, planar);
            for (unsigned x = 0; x < wp; x++)
                for (unsigned c = 0; c < 3; c++) {
                    const size_t at = planar ? c * (size_t)wp + x : 3 * (size_t)x + c;
                    cr_assert_eq(h[at], h_want(row, xo[x], xw[x], c),
                                 "%s %s, width %u, pixel %u channel %u", level_name(level),
                                 planar ? "planar" : "interleaved", width, x, c);
                }

            /* vertical: any length, values in [0, 255 * 128], both ends of wy */
            const size_t n = 1 + (size_t)sf__rng_below(&rng, 3 * 300);
            int16_t *h0 = malloc(n * sizeof *h0), *h1 = malloc(n * sizeof *h1);
            unsigned char *dst = malloc(n + 32);
            cr_assert(h0 && h1 && dst);
            for (size_t i = 0; i < n; i++) {
                h0[i] = (int16_t)sf__rng_below(&rng, 255 * 128 + 1);
                h1[i] = (int16_t)sf__rng_below(&rng, 255 * 128 + 1);
            }
            const uint32_t wy = trial % 7 == 0   ? 0
                                : trial % 7 == 1 ? SF__W_ONE
                                                 : (uint32_t)sf__rng_below(&rng, SF__W_ONE);
            memset(dst, 0x5a, n + 32);
            sf__resize_v(level, dst, h0, h1, n, wy);
            for (size_t i = 0; i < n; i++) {
                const unsigned want =
                    ((uint32_t)h0[i] * (SF__W_ONE - wy) + (uint32_t)h1[i] * wy + (1u << 17)) >> 18;
                cr_assert_eq(dst[i], want, "%s vertical, n %zu, wy %u, value %zu",
                             level_name(level), n, wy, i);
            }
            for (size_t i = n; i < n + 32; i++)
                cr_assert_eq(dst[i], 0x5a, "%s vertical wrote byte %zu of %zu", level_name(level),
                             i, n);
            free(h0);
            free(h1);
            free(dst);
            free(row);
            free(xo);
            free(xw);
            free(h);
        }
    }
    cr_assert_geq(levels, 1);
}

Test(decode, every_resize_level_gives_the_same_decode)
{
    struct jpeg js[] = {
        make_jpeg(333, 251, TJSAMP_420, 0, 31),
        make_jpeg(201, 317, TJSAMP_444, TJFLAG_PROGRESSIVE, 32),
        make_jpeg(250, 190, TJSAMP_GRAY, 0, 33),
        make_jpeg(640, 480, TJSAMP_422, 0, 34),
    };
    static const struct {
        enum sf_crop crop;
        unsigned w, h;
        enum sf_layout layout;
        enum sf_dtype dtype;
        float hflip;
    } cases[] = {
        {SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_CHW, SF_DTYPE_UINT8, 0.5f},
        {SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_HWC, SF_DTYPE_UINT8, 0.5f},
        {SF_CROP_RANDOM_RESIZED, 97, 61, SF_LAYOUT_CHW, SF_DTYPE_FLOAT32, 1.0f},
        {SF_CROP_RANDOM_RESIZED, 13, 5, SF_LAYOUT_HWC, SF_DTYPE_FLOAT32, 0.0f},
        {SF_CROP_CENTER, 160, 96, SF_LAYOUT_CHW, SF_DTYPE_UINT8, 0.5f},
        {SF_CROP_NONE, 300, 140, SF_LAYOUT_HWC, SF_DTYPE_UINT8, 0.0f},
    };
    struct sf_decoder *d = new_decoder();
    int compared = 0;
    for (size_t j = 0; j < sizeof js / sizeof js[0]; j++) {
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (uint64_t seed = 0; seed < 4; seed++) {
                struct sf_image_options o =
                    opts(cases[k].crop, cases[k].w, cases[k].h, cases[k].layout);
                o.dtype = cases[k].dtype;
                o.hflip = cases[k].hflip;
                const size_t bytes = sf__image_bytes(&o);
                cr_assert_eq(sf__decoder_set_simd(d, SF__SIMD_C), SF_OK);
                unsigned char *ref = decode_ok(d, &o, &js[j], seed, NULL);
                for (int l = SF__SIMD_SSE2; l <= SF__SIMD_AVX2; l++) {
                    if (sf__decoder_set_simd(d, (enum sf__simd)l) != SF_OK)
                        continue;
                    unsigned char *got = decode_ok(d, &o, &js[j], seed, NULL);
                    cr_assert_eq(memcmp(got, ref, bytes), 0,
                                 "%s differs from c: image %zu, case %zu, seed %llu",
                                 level_name((enum sf__simd)l), j, k, (unsigned long long)seed);
                    compared++;
                    free(got);
                }
                free(ref);
            }
        free(js[j].data);
    }
#if defined(__SSE2__)
    cr_assert_gt(compared, 0);
#endif
    sf__decoder_destroy(d);
}
