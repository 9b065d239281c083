/* Crop geometry against the Python reference of docs/decode.md: the pinned
 * sample seed, random resized crops and their fallbacks, flips, center and
 * none. Suite `decode` (test_decode.c). */
#include "decode_fixture.h"

#include <criterion/criterion.h>

#include "src/decode.h"
#include "src/sampler.h"

#include <turbojpeg.h>
#include <zstd.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ crop geometry */

Test(decode, sample_rng_seed_is_pinned)
{
    /* Values of sample_rng_seed() in the Python reference of docs/decode.md. */
    cr_assert_eq(sf__sample_rng_seed(0, 0, 0, 0), 0x7783ff9d9194bb1fULL);
    cr_assert_eq(sf__sample_rng_seed(1234, 5, 17, 99), 0xd93dcb143b5704ddULL);
    uint64_t base = sf__sample_rng_seed(1, 2, 3, 4);
    cr_assert_neq(sf__sample_rng_seed(9, 2, 3, 4), base);
    cr_assert_neq(sf__sample_rng_seed(1, 9, 3, 4), base);
    cr_assert_neq(sf__sample_rng_seed(1, 2, 9, 4), base);
    cr_assert_neq(sf__sample_rng_seed(1, 2, 3, 9), base);
    cr_assert_neq(sf__sample_rng_seed(2, 1, 3, 4), base);
}

Test(decode, crop_window_matches_python_reference)
{
    /* crop_window() of docs/decode.md's Python reference. */
    static const struct {
        unsigned sample, x, y, w, h;
        int flip;
    } def[] = {{0, 75, 22, 305, 347, 1}, {1, 14, 2, 479, 364, 0},   {2, 325, 44, 153, 190, 0},
               {3, 0, 106, 237, 196, 1}, {4, 142, 72, 201, 200, 0}, {5, 5, 11, 419, 363, 1}};
    struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_CHW);
    o.hflip = 0.5f;
    for (size_t i = 0; i < sizeof def / sizeof def[0]; i++) {
        struct sf__crop_box b;
        int flip;
        sf__crop_window(&o, 500, 375, sf__sample_rng_seed(1234, 0, 3, def[i].sample), &b, &flip);
        cr_assert(b.x == def[i].x && b.y == def[i].y && b.w == def[i].w && b.h == def[i].h &&
                      flip == def[i].flip,
                  "sample %u: got (%u, %u, %u, %u) flip %d", def[i].sample, b.x, b.y, b.w, b.h,
                  flip);
    }
    static const struct {
        unsigned x, y, w, h;
    } other[] = {{150, 53, 166, 183}, {88, 31, 231, 135}, {91, 32, 198, 199}};
    o.scale_min = 0.25f;
    o.scale_max = 0.5f;
    o.ratio_min = 0.5f;
    o.ratio_max = 2.0f;
    o.hflip = 0.3f;
    for (unsigned i = 0; i < 3; i++) {
        struct sf__crop_box b;
        int flip;
        sf__crop_window(&o, 333, 251, sf__sample_rng_seed(7, 1, 0, i), &b, &flip);
        cr_assert(b.x == other[i].x && b.y == other[i].y && b.w == other[i].w &&
                      b.h == other[i].h && flip == 0,
                  "sample %u: got (%u, %u, %u, %u) flip %d", i, b.x, b.y, b.w, b.h, flip);
    }
}

Test(decode, random_resized_crop_respects_ranges)
{
    static const unsigned sizes[][2] = {{500, 375}, {333, 251}, {64, 48}, {375, 500}, {4000, 300}};
    struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_CHW);
    for (int cfg = 0; cfg < 2; cfg++) {
        if (cfg == 1) {
            o.scale_min = 0.3f;
            o.scale_max = 0.6f;
            o.ratio_min = 0.5f;
            o.ratio_max = 2.0f;
        }
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const unsigned W = sizes[s][0], H = sizes[s][1];
            unsigned fallbacks = 0, distinct = 0;
            struct sf__crop_box prev = {0, 0, 0, 0};
            for (uint64_t k = 0; k < 3000; k++) {
                struct sf__crop_box b;
                int flip;
                sf__crop_window(&o, W, H, sf__sample_rng_seed(5, (uint64_t)cfg, s, k), &b, &flip);
                cr_assert(b.w >= 1 && b.h >= 1 && b.x + b.w <= W && b.y + b.h <= H,
                          "box (%u, %u, %u, %u) outside %ux%u", b.x, b.y, b.w, b.h, W, H);
                distinct += memcmp(&b, &prev, sizeof b) != 0;
                prev = b;
                /* The sides are rounded from sqrt(area * ratio) and sqrt(area / ratio). */
                double tol = 1.0 / b.w + 1.0 / b.h;
                double frac = (double)b.w * b.h / ((double)W * H), ratio = (double)b.w / b.h;
                int in_range = frac >= o.scale_min * (1 - tol) && frac <= o.scale_max * (1 + tol) &&
                               ratio >= o.ratio_min * (1 - tol) && ratio <= o.ratio_max * (1 + tol);
                if (!in_range) {
                    /* only torchvision's fallback: a full side, centred */
                    cr_assert(b.w == W || b.h == H, "box (%u, %u, %u, %u) of %ux%u out of range",
                              b.x, b.y, b.w, b.h, W, H);
                    cr_assert_eq(b.x, (W - b.w) / 2);
                    cr_assert_eq(b.y, (H - b.h) / 2);
                    fallbacks++;
                }
            }
            if (W < 2 * H && H < 2 * W) {
                cr_assert_gt(distinct, 2900u, "%ux%u: only %u distinct boxes", W, H, distinct);
                cr_assert_lt(fallbacks, 30u, "%ux%u: %u fallbacks", W, H, fallbacks);
            }
        }
    }
}

Test(decode, random_resized_crop_falls_back_for_extreme_aspect)
{
    struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_CHW);
    for (uint64_t k = 0; k < 200; k++) {
        struct sf__crop_box b;
        sf__crop_window(&o, 1000, 50, k, &b, NULL);
        cr_assert(b.x == 466 && b.y == 0 && b.w == 67 && b.h == 50, "(%u, %u, %u, %u)", b.x, b.y,
                  b.w, b.h);
        sf__crop_window(&o, 50, 1000, k, &b, NULL);
        cr_assert(b.x == 0 && b.y == 466 && b.w == 50 && b.h == 67, "(%u, %u, %u, %u)", b.x, b.y,
                  b.w, b.h);
    }
}

Test(decode, crop_window_is_deterministic_and_flip_rate_follows_hflip)
{
    struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_CHW);
    o.hflip = 0.5f;
    unsigned flips = 0;
    for (uint64_t k = 0; k < 2000; k++) {
        uint64_t seed = sf__sample_rng_seed(77, 3, 1, k);
        struct sf__crop_box a, b;
        int fa, fb;
        sf__crop_window(&o, 640, 480, seed, &a, &fa);
        sf__crop_window(&o, 640, 480, seed, &b, &fb);
        cr_assert(!memcmp(&a, &b, sizeof a) && fa == fb, "seed %llu not deterministic",
                  (unsigned long long)seed);
        flips += (unsigned)fa;
    }
    cr_assert(flips > 900 && flips < 1100, "%u flips of 2000 at hflip 0.5", flips);
    for (int p = 0; p <= 1; p++) {
        o.hflip = (float)p;
        unsigned n = 0;
        for (uint64_t k = 0; k < 500; k++) {
            int f;
            sf__crop_window(&o, 640, 480, k, NULL, &f);
            n += (unsigned)f;
        }
        cr_assert_eq(n, p ? 500u : 0u, "hflip %d: %u flips of 500", p, n);
    }
    /* The flip is drawn after the box: hflip does not move the box. */
    struct sf__crop_box a, b;
    o.hflip = 0.0f;
    sf__crop_window(&o, 640, 480, 99, &a, NULL);
    o.hflip = 1.0f;
    sf__crop_window(&o, 640, 480, 99, &b, NULL);
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0);
}

Test(decode, center_crop_and_none_geometry)
{
    struct sf_image_options o = opts(SF_CROP_CENTER, 224, 224, SF_LAYOUT_CHW);
    struct sf__crop_box b;
    /* Resize(256) of 500x375 is 341x256, per resized pixel 375/256 source
     * pixels: 224 of them are 328.1 -> 328, centred at round(172/2), round(47/2). */
    sf__crop_window(&o, 500, 375, 1, &b, NULL);
    cr_assert(b.x == 86 && b.y == 24 && b.w == 328 && b.h == 328, "(%u, %u, %u, %u)", b.x, b.y, b.w,
              b.h);
    sf__crop_window(&o, 375, 500, 1, &b, NULL);
    cr_assert(b.x == 24 && b.y == 86 && b.w == 328 && b.h == 328, "(%u, %u, %u, %u)", b.x, b.y, b.w,
              b.h);
    /* Non-square output: S from the longer output side, the box keeps the
     * output's aspect. */
    o.width = 320;
    o.height = 160;
    o.center_fraction = 1.0f;
    sf__crop_window(&o, 640, 480, 1, &b, NULL);
    cr_assert(b.x == 80 && b.y == 120 && b.w == 480 && b.h == 240, "(%u, %u, %u, %u)", b.x, b.y,
              b.w, b.h);
    o = opts(SF_CROP_NONE, 100, 100, SF_LAYOUT_CHW);
    sf__crop_window(&o, 640, 480, 1, &b, NULL);
    cr_assert(b.x == 0 && b.y == 0 && b.w == 640 && b.h == 480);
}
