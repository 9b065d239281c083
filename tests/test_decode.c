/*
 * Decode workers (src/decode.c, docs/decode.md): full decodes byte-identical
 * to djpeg, crop geometry against the Python reference of docs/decode.md,
 * region and DCT-scaled decodes against a naive crop + bilinear resize of the
 * full decode, flip, layouts, float output, corrupt input, limits, CMYK,
 * labels and zstd fields.
 *
 * Test JPEGs are made here with TurboJPEG from seeded synthetic images
 * (gradients, a texture and noise), so nothing is stored in tests/data.
 *
 * Suite `decode`, one executable: this file (full decodes against djpeg,
 * region and scaled decodes), test_decode_crop.c (crop geometry) and
 * test_decode_input.c (bad input, limits, labels, zstd), over
 * decode_fixture.c.
 */
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

TestSuite(decode, .init = decode_setup, .fini = decode_teardown);

/* A fresh temporary directory and file names in it. */
struct tmp {
    char dir[64];
    char jpg[96];
    char pnm[96];
};

static void tmp_open(struct tmp *t)
{
    snprintf(t->dir, sizeof t->dir, "/tmp/sf_test_decode_XXXXXX");
    cr_assert_not_null(mkdtemp(t->dir));
    snprintf(t->jpg, sizeof t->jpg, "%s/in.jpg", t->dir);
    snprintf(t->pnm, sizeof t->pnm, "%s/out.pnm", t->dir);
}

static void tmp_close(struct tmp *t)
{
    unlink(t->jpg);
    unlink(t->pnm);
    rmdir(t->dir);
}

static int pnm_int(FILE *f)
{
    int c = fgetc(f);
    while (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '#') {
        if (c == '#')
            while (c != '\n' && c != EOF)
                c = fgetc(f);
        c = fgetc(f);
    }
    int v = 0;
    while (c >= '0' && c <= '9') {
        v = v * 10 + (c - '0');
        c = fgetc(f);
    }
    return v; /* the single whitespace after the last number is consumed */
}

/* djpeg -ppm of j, as RGB (a PGM from a grayscale JPEG is expanded). */
static unsigned char *djpeg_rgb(const struct jpeg *j)
{
    struct tmp t;
    tmp_open(&t);
    FILE *f = fopen(t.jpg, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(j->data, 1, j->size, f), j->size);
    fclose(f);
    char cmd[320];
    snprintf(cmd, sizeof cmd, "djpeg -ppm -outfile '%s' '%s'", t.pnm, t.jpg);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    f = fopen(t.pnm, "rb");
    cr_assert_not_null(f);
    char magic[3] = {0};
    cr_assert_eq(fread(magic, 1, 2, f), 2u);
    int gray = magic[1] == '5';
    cr_assert(magic[0] == 'P' && (magic[1] == '5' || magic[1] == '6'), "not a PNM: %s", magic);
    int w = pnm_int(f), h = pnm_int(f), maxv = pnm_int(f);
    cr_assert_eq((unsigned)w, j->w);
    cr_assert_eq((unsigned)h, j->h);
    cr_assert_eq(maxv, 255);
    size_t n = (size_t)w * h, ch = gray ? 1 : 3;
    unsigned char *raw = malloc(n * ch), *rgb = malloc(n * 3);
    cr_assert_eq(fread(raw, 1, n * ch, f), n * ch);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < 3; c++)
            rgb[i * 3 + c] = raw[i * ch + (gray ? 0 : (size_t)c)];
    free(raw);
    tmp_close(&t);
    return rgb;
}

/* Output pixel i of n across a box side of len source pixels: src = (i +
 * 0.5) * len / n - 0.5 clamped to the side; its two source neighbours and
 * the weight of the second. */
static void naive_src(unsigned i, unsigned n, unsigned len, unsigned *p0, unsigned *p1, double *f)
{
    double s = ((double)i + 0.5) * len / n - 0.5;
    if (s < 0)
        s = 0;
    if (s > len - 1)
        s = len - 1;
    *p0 = (unsigned)s;
    *p1 = *p0 + 1 < len ? *p0 + 1 : *p0;
    *f = s - *p0;
}

/* Naive reference: crop box out of a full RGB decode (W wide), bilinear to
 * ow x oh (naive_src on each axis), as torchvision's resized_crop on a
 * tensor (bilinear, antialias off). */
static void naive_resized_crop(const unsigned char *full, unsigned W, struct sf__crop_box b,
                               unsigned ow, unsigned oh, double *out)
{
    for (unsigned y = 0; y < oh; y++) {
        unsigned y0, y1;
        double fy;
        naive_src(y, oh, b.h, &y0, &y1, &fy);
        for (unsigned x = 0; x < ow; x++) {
            unsigned x0, x1;
            double fx;
            naive_src(x, ow, b.w, &x0, &x1, &fx);
            for (int c = 0; c < 3; c++) {
#define PX(xx, yy) ((double)full[(((size_t)(b.y + (yy))) * W + b.x + (xx)) * 3 + (size_t)c])
                double top = PX(x0, y0) * (1 - fx) + PX(x1, y0) * fx;
                double bot = PX(x0, y1) * (1 - fx) + PX(x1, y1) * fx;
#undef PX
                out[((size_t)y * ow + x) * 3 + (size_t)c] = top * (1 - fy) + bot * fy;
            }
        }
    }
}

struct diff {
    double max, mean;
};

static struct diff compare(const unsigned char *got, const double *want, size_t n)
{
    struct diff r = {0, 0};
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - want[i];
        if (e < 0)
            e = -e;
        if (e > r.max)
            r.max = e;
        r.mean += e;
    }
    r.mean /= (double)n;
    return r;
}

/* got (ow x oh HWC) against naive_resized_crop of box in full (W wide). */
static struct diff diff_to_naive(const unsigned char *got, const unsigned char *full, unsigned W,
                                 struct sf__crop_box box, unsigned ow, unsigned oh)
{
    size_t n = (size_t)ow * oh * 3;
    double *want = malloc(n * sizeof *want);
    cr_assert_not_null(want);
    naive_resized_crop(full, W, box, ow, oh, want);
    struct diff df = compare(got, want, n);
    free(want);
    return df;
}

/* Decodes j with o (HWC) and seed, and checks the result against the naive
 * crop and resize of j's full decode: at most max per value and under mean
 * on average. Returns where the crop came from. */
static struct sf__decode_info expect_decode_near_naive(const struct sf_image_options *o,
                                                       const struct jpeg *j, uint64_t seed,
                                                       double max, double mean)
{
    unsigned char *full = tj_decode(j, TJPF_RGB);
    struct sf__decode_info info;
    unsigned char *got = decode_ok(dec, o, j, seed, &info);
    struct diff df = diff_to_naive(got, full, j->w, info.box, o->width, o->height);
    cr_assert(df.max <= max && df.mean < mean, "seed %llu: max %.2f mean %.3f",
              (unsigned long long)seed, df.max, df.mean);
    free(got);
    free(full);
    return info;
}

/* ------------------------------------------------------------------ full decode == djpeg */

static void check_djpeg(int subsamp, int flags)
{
    static const unsigned sizes[][2] = {{333, 251}, {17, 9}, {64, 48}, {1, 1}};
    struct sf_decoder *d = new_decoder();
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        struct jpeg j = make_jpeg(sizes[s][0], sizes[s][1], subsamp, flags, 100 + s);
        unsigned char *ref = djpeg_rgb(&j);
        struct sf__decode_info info;
        struct sf_image_options o = opts(SF_CROP_NONE, 0, 0, SF_LAYOUT_HWC);
        unsigned char *got = decode_ok(d, &o, &j, 1, &info);
        size_t n = (size_t)j.w * j.h * 3;
        cr_assert_eq(memcmp(got, ref, n), 0, "%ux%u subsamp %d flags %d differs from djpeg", j.w,
                     j.h, subsamp, flags);
        cr_assert_eq(info.scale_num, 8u);
        cr_assert_eq(info.src_width, j.w);
        cr_assert_eq(info.box.w, j.w);
        cr_assert_eq(info.box.h, j.h);
        cr_assert_eq(info.progressive, (flags & TJFLAG_PROGRESSIVE) ? 1 : 0);
        free(got);
        /* The explicit source size is the same decode. */
        o.width = j.w;
        o.height = j.h;
        got = decode_ok(d, &o, &j, 2, NULL);
        cr_assert_eq(memcmp(got, ref, n), 0, "%ux%u with explicit size differs", j.w, j.h);
        free(got);
        free(ref);
        free(j.data);
    }
    sf__decoder_destroy(d);
}

Test(decode, full_decode_equals_djpeg_444)
{
    check_djpeg(TJSAMP_444, 0);
}

Test(decode, full_decode_equals_djpeg_420)
{
    check_djpeg(TJSAMP_420, 0);
}

Test(decode, full_decode_equals_djpeg_422_and_440)
{
    check_djpeg(TJSAMP_422, 0);
    check_djpeg(TJSAMP_440, 0);
}

Test(decode, full_decode_equals_djpeg_grayscale)
{
    check_djpeg(TJSAMP_GRAY, 0);
}

Test(decode, full_decode_equals_djpeg_progressive)
{
    check_djpeg(TJSAMP_420, TJFLAG_PROGRESSIVE);
    check_djpeg(TJSAMP_444, TJFLAG_PROGRESSIVE);
    check_djpeg(TJSAMP_GRAY, TJFLAG_PROGRESSIVE);
}

/* A centre crop at exactly the source scale takes the no-resize path with
 * jpeg_crop_scanline and jpeg_skip_scanlines: the pixels must be djpeg's. */
Test(decode, exact_scale_center_crop_equals_djpeg_crop)
{
    static const int subs[] = {TJSAMP_444, TJSAMP_420, TJSAMP_422, TJSAMP_GRAY};
    struct sf_decoder *d = new_decoder();
    for (int prog = 0; prog < 2; prog++)
        for (size_t s = 0; s < sizeof subs / sizeof subs[0]; s++) {
            struct jpeg j = make_jpeg(333, 251, subs[s], prog ? TJFLAG_PROGRESSIVE : 0, 7 + s);
            unsigned char *ref = djpeg_rgb(&j);
            /* floor(200 / 0.795) = 251 = the shorter side: one source pixel per
             * output pixel; the box is centred at (66, 50). */
            struct sf_image_options o = opts(SF_CROP_CENTER, 200, 150, SF_LAYOUT_HWC);
            o.center_fraction = 0.795f;
            for (int flip = 0; flip < 2; flip++) {
                o.hflip = (float)flip;
                struct sf__decode_info info;
                unsigned char *got = decode_ok(d, &o, &j, 3, &info);
                cr_assert_eq(info.box.x, 66u);
                cr_assert_eq(info.box.y, 50u);
                cr_assert_eq(info.box.w, 200u);
                cr_assert_eq(info.box.h, 150u);
                cr_assert_eq(info.scale_num, 8u);
                cr_assert_eq(info.flipped, flip);
                for (unsigned y = 0; y < 150; y++)
                    for (unsigned x = 0; x < 200; x++) {
                        unsigned sx = flip ? 66 + 199 - x : 66 + x;
                        const unsigned char *a = got + ((size_t)y * 200 + x) * 3;
                        const unsigned char *b = ref + ((size_t)(50 + y) * 333 + sx) * 3;
                        cr_assert(a[0] == b[0] && a[1] == b[1] && a[2] == b[2],
                                  "subsamp %d prog %d flip %d: pixel (%u, %u) differs", subs[s],
                                  prog, flip, x, y);
                    }
                free(got);
            }
            free(ref);
            free(j.data);
        }
    sf__decoder_destroy(d);
}

Test(decode, chw_is_the_planar_form_of_hwc)
{
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 11);
    struct {
        enum sf_crop crop;
        unsigned w, h;
    } cases[] = {{SF_CROP_NONE, 0, 0}, {SF_CROP_RANDOM_RESIZED, 96, 80}, {SF_CROP_CENTER, 64, 64}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct sf_image_options o = opts(cases[k].crop, cases[k].w, cases[k].h, SF_LAYOUT_HWC);
        o.hflip = 0.5f;
        unsigned char *hwc = decode_ok(dec, &o, &j, 42, NULL);
        o.layout = SF_LAYOUT_CHW;
        unsigned char *chw = decode_ok(dec, &o, &j, 42, NULL);
        size_t plane = cases[k].w ? (size_t)cases[k].w * cases[k].h : (size_t)j.w * j.h;
        for (size_t i = 0; i < plane; i++)
            for (size_t c = 0; c < 3; c++)
                cr_assert_eq(chw[c * plane + i], hwc[i * 3 + c], "case %zu pixel %zu channel %zu",
                             k, i, c);
        free(hwc);
        free(chw);
    }
    free(j.data);
}

/* ------------------------------------------------------------------ region and scaled decode */

Test(decode, region_decode_matches_naive_crop_and_resize)
{
    static const int subs[] = {TJSAMP_444, TJSAMP_420, TJSAMP_422, TJSAMP_GRAY};
    /* outputs that keep every box of a 333x251 source at scale 8/8 */
    static const unsigned outs[][2] = {{224, 224}, {160, 96}, {171, 129}};
    struct sf_decoder *d = new_decoder();
    for (int prog = 0; prog < 2; prog++)
        for (size_t s = 0; s < sizeof subs / sizeof subs[0]; s++) {
            struct jpeg j = make_jpeg(333, 251, subs[s], prog ? TJFLAG_PROGRESSIVE : 0, 20 + s);
            unsigned char *full = tj_decode(&j, TJPF_RGB);
            for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++)
                for (uint64_t seed = 0; seed < 6; seed++) {
                    struct sf_image_options o =
                        opts(SF_CROP_RANDOM_RESIZED, outs[k][0], outs[k][1], SF_LAYOUT_HWC);
                    struct sf__decode_info info;
                    unsigned char *got = decode_ok(d, &o, &j, seed, &info);
                    cr_assert_eq(info.scale_num, 8u, "a 333x251 source is never scaled down");
                    struct diff df =
                        diff_to_naive(got, full, j.w, info.box, outs[k][0], outs[k][1]);
                    cr_assert(df.max <= 1.0 && df.mean < 0.5,
                              "subsamp %d prog %d out %ux%u seed %llu box (%u, %u, %u, %u): max "
                              "%.2f mean %.3f",
                              subs[s], prog, outs[k][0], outs[k][1], (unsigned long long)seed,
                              info.box.x, info.box.y, info.box.w, info.box.h, df.max, df.mean);
                    free(got);
                }
            free(full);
            free(j.data);
        }
    sf__decoder_destroy(d);
}

Test(decode, none_resizes_the_whole_image)
{
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 5);
    struct sf_image_options o = opts(SF_CROP_NONE, 300, 140, SF_LAYOUT_HWC);
    struct sf__decode_info info = expect_decode_near_naive(&o, &j, 0, 1.0, 0.5);
    cr_assert(info.box.x == 0 && info.box.y == 0 && info.box.w == 333 && info.box.h == 251);
    free(j.data);
}

Test(decode, flip_mirrors_the_region_exactly)
{
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 8);
    for (int layout = 0; layout < 2; layout++)
        for (uint64_t seed = 0; seed < 8; seed++) {
            const unsigned W = 97, H = 64;
            struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, W, H, (enum sf_layout)layout);
            struct sf__decode_info i0, i1;
            unsigned char *plain = decode_ok(dec, &o, &j, seed, &i0);
            o.hflip = 1.0f;
            unsigned char *flipped = decode_ok(dec, &o, &j, seed, &i1);
            cr_assert_eq(memcmp(&i0.box, &i1.box, sizeof i0.box), 0);
            cr_assert(!i0.flipped && i1.flipped);
            for (unsigned y = 0; y < H; y++)
                for (unsigned x = 0; x < W; x++)
                    for (unsigned c = 0; c < 3; c++) {
                        size_t a, b;
                        if (layout == SF_LAYOUT_HWC) {
                            a = ((size_t)y * W + x) * 3 + c;
                            b = ((size_t)y * W + (W - 1 - x)) * 3 + c;
                        } else {
                            a = (size_t)c * W * H + (size_t)y * W + x;
                            b = (size_t)c * W * H + (size_t)y * W + (W - 1 - x);
                        }
                        cr_assert_eq(flipped[a], plain[b], "seed %llu (%u, %u, %u)",
                                     (unsigned long long)seed, x, y, c);
                    }
            free(plain);
            free(flipped);
        }
    free(j.data);
}

Test(decode, large_crops_are_decoded_at_a_reduced_dct_scale)
{
    /* Smooth content, so that a reduced-scale decode and a full decode
     * resized without antialiasing are comparable. */
    unsigned char *px = make_smooth(2000, 1500);
    struct jpeg j = compress_pixels(px, 2000, 1500, TJPF_RGB, TJSAMP_420, 0, 90);
    free(px);
    struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_HWC);
    o.scale_min = o.scale_max = 1.0f;
    for (uint64_t seed = 0; seed < 3; seed++) {
        struct sf__decode_info info = expect_decode_near_naive(&o, &j, seed, 12.0, 1.0);
        /* 1500 x 2/8 = 375 >= 224, 1500 x 1/8 < 224 */
        cr_assert_eq(info.scale_num, 2u, "scale %u/8 for box %ux%u", info.scale_num, info.box.w,
                     info.box.h);
    }
    /* A smaller crop of the same image: scale 4/8 (box 600..895 px). */
    o.scale_min = o.scale_max = 0.25f;
    o.ratio_min = o.ratio_max = 1.0f;
    struct sf__decode_info info = expect_decode_near_naive(&o, &j, 1, 12.0, 1.0);
    cr_assert_eq(info.box.w, 866u);
    cr_assert_eq(info.scale_num, 4u);
    free(j.data);
}

Test(decode, float_output_is_normalize_u8_of_the_uint8_output)
{
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 9);
    for (int layout = 0; layout < 2; layout++)
        for (int crop = 0; crop < 3; crop++) {
            const unsigned W = crop == SF_CROP_NONE ? 0 : 120, H = crop == SF_CROP_NONE ? 0 : 88;
            struct sf_image_options o = opts((enum sf_crop)crop, W, H, (enum sf_layout)layout);
            o.hflip = 0.5f;
            o.mean[1] = 0.5f;
            o.std[2] = 0.3f;
            unsigned char *u8 = decode_ok(dec, &o, &j, 13, NULL);
            o.dtype = SF_DTYPE_FLOAT32;
            unsigned char *f32 = decode_ok(dec, &o, &j, 13, NULL);
            const unsigned w = W ? W : j.w, h = H ? H : j.h;
            size_t n = (size_t)w * h * 3;
            float *ref = malloc(n * sizeof *ref);
            sf__normalize_u8(u8, ref, 1, w, h, (enum sf_layout)layout, o.mean, o.std);
            cr_assert_eq(memcmp(f32, ref, n * sizeof *ref), 0, "layout %d crop %d", layout, crop);
            /* and the formula itself, for the first value of each channel */
            for (size_t c = 0; c < 3; c++) {
                size_t at = layout == SF_LAYOUT_HWC ? c : c * w * h;
                float want = ((float)u8[at] / 255.0f - o.mean[c]) / o.std[c];
                float got;
                memcpy(&got, f32 + at * 4, sizeof got);
                cr_assert_eq(got, want);
            }
            free(ref);
            free(u8);
            free(f32);
        }
    free(j.data);
}

Test(decode, cmyk_comes_out_rgb)
{
    const unsigned W = 65, H = 47;
    unsigned char *rgb = make_rgb(W, H, 4, 10);
    unsigned char *cmyk = malloc((size_t)W * H * 4);
    for (size_t i = 0; i < (size_t)W * H; i++) {
        for (int c = 0; c < 3; c++)
            cmyk[i * 4 + (size_t)c] = rgb[i * 3 + (size_t)c];
        cmyk[i * 4 + 3] = (unsigned char)(128 + (i % 97));
    }
    struct jpeg j = compress_pixels(cmyk, W, H, TJPF_CMYK, TJSAMP_444, 0, 95);
    unsigned char *ref = tj_decode(&j, TJPF_CMYK);
    struct sf_decoder *d = new_decoder();
    struct sf_image_options o = opts(SF_CROP_NONE, 0, 0, SF_LAYOUT_HWC);
    unsigned char *got = decode_ok(d, &o, &j, 0, NULL);
    /* TurboJPEG writes Adobe (inverted) CMYK: R = C K / 255. */
    for (size_t i = 0; i < (size_t)W * H; i++)
        for (int c = 0; c < 3; c++) {
            unsigned want = (ref[i * 4 + (size_t)c] * ref[i * 4 + 3] + 127u) / 255u;
            cr_assert_eq(got[i * 3 + (size_t)c], want, "pixel %zu channel %d", i, c);
        }
    free(got);
    free(ref);
    free(j.data);
    free(cmyk);
    free(rgb);
    sf__decoder_destroy(d);
}
