/*
 * Decode workers (src/decode.c, docs/decode.md): full decodes byte-identical
 * to djpeg, crop geometry against the Python reference of docs/decode.md,
 * region and DCT-scaled decodes against a naive crop + bilinear resize of the
 * full decode, flip, layouts, float output, corrupt input, limits, CMYK,
 * labels and zstd fields.
 *
 * Test JPEGs are made here with TurboJPEG from seeded synthetic images
 * (gradients, a texture and noise), so nothing is stored in tests/data.
 */
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

/* ------------------------------------------------------------------ helpers */

struct jpeg {
    unsigned char *data;
    size_t size;
    unsigned w, h;
};

/* A textured RGB image: per-channel gradients, a checker, and noise of
 * +-noise from a seeded splitmix64. */
static unsigned char *make_rgb(unsigned w, unsigned h, uint64_t seed, int noise)
{
    unsigned char *p = malloc((size_t)w * h * 3);
    cr_assert_not_null(p);
    struct sf__rng r = {seed};
    for (unsigned y = 0; y < h; y++)
        for (unsigned x = 0; x < w; x++) {
            int v[3] = {(int)(x * 255 / w), (int)(y * 255 / h),
                        (int)((((x / 9) + (y / 7)) & 1) * 90 + ((x + 2 * y) & 63))};
            for (int c = 0; c < 3; c++) {
                int n = noise ? (int)(sf__rng_next(&r) % (uint64_t)(2 * noise + 1)) - noise : 0;
                int s = v[c] + n;
                p[((size_t)y * w + x) * 3 + c] = (unsigned char)(s < 0 ? 0 : s > 255 ? 255 : s);
            }
        }
    return p;
}

/* Gradients and a triangle wave of period 256 px: no detail that a 1/8
 * scale decode would average away. */
static unsigned char *make_smooth(unsigned w, unsigned h)
{
    unsigned char *p = malloc((size_t)w * h * 3);
    cr_assert_not_null(p);
    for (unsigned y = 0; y < h; y++)
        for (unsigned x = 0; x < w; x++) {
            unsigned t = (x + 2 * y) % 256;
            unsigned char *q = p + ((size_t)y * w + x) * 3;
            q[0] = (unsigned char)(x * 255 / w);
            q[1] = (unsigned char)(y * 255 / h);
            q[2] = (unsigned char)(t < 128 ? 2 * t : 2 * (255 - t));
        }
    return p;
}

static struct jpeg compress_pixels(const unsigned char *px, unsigned w, unsigned h, int pf,
                                   int subsamp, int flags, int quality)
{
    tjhandle t = tjInitCompress();
    cr_assert_not_null(t);
    unsigned char *buf = NULL;
    unsigned long size = 0;
    int rc = tjCompress2(t, px, (int)w, 0, (int)h, pf, &buf, &size, subsamp, quality, flags);
    cr_assert_eq(rc, 0, "tjCompress2: %s", tjGetErrorStr2(t));
    struct jpeg j = {malloc(size), size, w, h};
    cr_assert_not_null(j.data);
    memcpy(j.data, buf, size);
    tjFree(buf);
    tjDestroy(t);
    return j;
}

static struct jpeg make_jpeg(unsigned w, unsigned h, int subsamp, int flags, uint64_t seed)
{
    unsigned char *px = make_rgb(w, h, seed, 20);
    struct jpeg j = compress_pixels(px, w, h, TJPF_RGB, subsamp, flags, 90);
    free(px);
    return j;
}

/* TurboJPEG's own full decode (same defaults as djpeg: islow, fancy upsampling). */
static unsigned char *tj_decode(const struct jpeg *j, int pf)
{
    tjhandle t = tjInitDecompress();
    cr_assert_not_null(t);
    int bpp = tjPixelSize[pf];
    unsigned char *out = malloc((size_t)j->w * j->h * (size_t)bpp);
    cr_assert_not_null(out);
    int rc = tjDecompress2(t, j->data, j->size, out, (int)j->w, 0, (int)j->h, pf, 0);
    cr_assert_eq(rc, 0, "tjDecompress2: %s", tjGetErrorStr2(t));
    tjDestroy(t);
    return out;
}

static struct sf_image_options opts(enum sf_crop crop, unsigned w, unsigned h,
                                    enum sf_layout layout)
{
    struct sf_image_options o;
    sf__image_options_default(&o);
    o.crop = crop;
    o.width = w;
    o.height = h;
    o.layout = layout;
    o.hflip = 0.0f;
    return o;
}

/* Decodes j with o; the output buffer is sized for the source when o keeps it. */
static unsigned char *decode_ok(struct sf_decoder *d, const struct sf_image_options *o,
                                const struct jpeg *j, uint64_t seed, struct sf__decode_info *info)
{
    size_t elem = o->dtype == SF_DTYPE_FLOAT32 ? 4 : 1;
    size_t n = o->width ? sf__image_bytes(o) : (size_t)j->w * j->h * 3 * elem;
    unsigned char *out = malloc(n);
    cr_assert_not_null(out);
    char err[256] = "";
    sf_status st = sf__decode_jpeg(d, o, j->data, j->size, seed, out, info, err, sizeof err);
    cr_assert_eq(st, SF_OK, "decode: %s: %s", sf_status_name(st), err);
    return out;
}

static struct sf_decoder *new_decoder(void)
{
    struct sf_decoder *d = NULL;
    cr_assert_eq(sf__decoder_new(&d), SF_OK);
    cr_assert_not_null(d);
    return d;
}

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

/* Naive reference: crop box out of a full RGB decode (W wide), bilinear to
 * ow x oh with src = (dst + 0.5) * box / out - 0.5 clamped to the box, as
 * torchvision's resized_crop on a tensor (bilinear, antialias off). */
static void naive_resized_crop(const unsigned char *full, unsigned W, struct sf__crop_box b,
                               unsigned ow, unsigned oh, double *out)
{
    for (unsigned y = 0; y < oh; y++) {
        double sy = ((double)y + 0.5) * b.h / oh - 0.5;
        if (sy < 0)
            sy = 0;
        if (sy > b.h - 1)
            sy = b.h - 1;
        unsigned y0 = (unsigned)sy, y1 = y0 + 1 < b.h ? y0 + 1 : y0;
        double fy = sy - y0;
        for (unsigned x = 0; x < ow; x++) {
            double sx = ((double)x + 0.5) * b.w / ow - 0.5;
            if (sx < 0)
                sx = 0;
            if (sx > b.w - 1)
                sx = b.w - 1;
            unsigned x0 = (unsigned)sx, x1 = x0 + 1 < b.w ? x0 + 1 : x0;
            double fx = sx - x0;
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
    struct sf_decoder *d = new_decoder();
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 11);
    struct {
        enum sf_crop crop;
        unsigned w, h;
    } cases[] = {{SF_CROP_NONE, 0, 0}, {SF_CROP_RANDOM_RESIZED, 96, 80}, {SF_CROP_CENTER, 64, 64}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct sf_image_options o = opts(cases[k].crop, cases[k].w, cases[k].h, SF_LAYOUT_HWC);
        o.hflip = 0.5f;
        unsigned char *hwc = decode_ok(d, &o, &j, 42, NULL);
        o.layout = SF_LAYOUT_CHW;
        unsigned char *chw = decode_ok(d, &o, &j, 42, NULL);
        size_t plane = cases[k].w ? (size_t)cases[k].w * cases[k].h : (size_t)j.w * j.h;
        for (size_t i = 0; i < plane; i++)
            for (size_t c = 0; c < 3; c++)
                cr_assert_eq(chw[c * plane + i], hwc[i * 3 + c], "case %zu pixel %zu channel %zu",
                             k, i, c);
        free(hwc);
        free(chw);
    }
    free(j.data);
    sf__decoder_destroy(d);
}

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
                    size_t n = (size_t)outs[k][0] * outs[k][1] * 3;
                    double *want = malloc(n * sizeof *want);
                    naive_resized_crop(full, j.w, info.box, outs[k][0], outs[k][1], want);
                    struct diff df = compare(got, want, n);
                    cr_assert(df.max <= 1.0 && df.mean < 0.5,
                              "subsamp %d prog %d out %ux%u seed %llu box (%u, %u, %u, %u): max "
                              "%.2f mean %.3f",
                              subs[s], prog, outs[k][0], outs[k][1], (unsigned long long)seed,
                              info.box.x, info.box.y, info.box.w, info.box.h, df.max, df.mean);
                    free(want);
                    free(got);
                }
            free(full);
            free(j.data);
        }
    sf__decoder_destroy(d);
}

Test(decode, none_resizes_the_whole_image)
{
    struct sf_decoder *d = new_decoder();
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 5);
    unsigned char *full = tj_decode(&j, TJPF_RGB);
    struct sf_image_options o = opts(SF_CROP_NONE, 300, 140, SF_LAYOUT_HWC);
    struct sf__decode_info info;
    unsigned char *got = decode_ok(d, &o, &j, 0, &info);
    cr_assert(info.box.x == 0 && info.box.y == 0 && info.box.w == 333 && info.box.h == 251);
    double *want = malloc((size_t)300 * 140 * 3 * sizeof *want);
    naive_resized_crop(full, j.w, info.box, 300, 140, want);
    struct diff df = compare(got, want, (size_t)300 * 140 * 3);
    cr_assert(df.max <= 1.0 && df.mean < 0.5, "max %.2f mean %.3f", df.max, df.mean);
    free(want);
    free(got);
    free(full);
    free(j.data);
    sf__decoder_destroy(d);
}

Test(decode, flip_mirrors_the_region_exactly)
{
    struct sf_decoder *d = new_decoder();
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 8);
    for (int layout = 0; layout < 2; layout++)
        for (uint64_t seed = 0; seed < 8; seed++) {
            const unsigned W = 97, H = 64;
            struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, W, H, (enum sf_layout)layout);
            struct sf__decode_info i0, i1;
            unsigned char *plain = decode_ok(d, &o, &j, seed, &i0);
            o.hflip = 1.0f;
            unsigned char *flipped = decode_ok(d, &o, &j, seed, &i1);
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
    sf__decoder_destroy(d);
}

Test(decode, large_crops_are_decoded_at_a_reduced_dct_scale)
{
    struct sf_decoder *d = new_decoder();
    /* Smooth content, so that a reduced-scale decode and a full decode
     * resized without antialiasing are comparable. */
    unsigned char *px = make_smooth(2000, 1500);
    struct jpeg j = compress_pixels(px, 2000, 1500, TJPF_RGB, TJSAMP_420, 0, 90);
    free(px);
    unsigned char *full = tj_decode(&j, TJPF_RGB);
    struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, 224, 224, SF_LAYOUT_HWC);
    o.scale_min = o.scale_max = 1.0f;
    for (uint64_t seed = 0; seed < 3; seed++) {
        struct sf__decode_info info;
        unsigned char *got = decode_ok(d, &o, &j, seed, &info);
        /* 1500 x 2/8 = 375 >= 224, 1500 x 1/8 < 224 */
        cr_assert_eq(info.scale_num, 2u, "scale %u/8 for box %ux%u", info.scale_num, info.box.w,
                     info.box.h);
        double *want = malloc((size_t)224 * 224 * 3 * sizeof *want);
        naive_resized_crop(full, j.w, info.box, 224, 224, want);
        struct diff df = compare(got, want, (size_t)224 * 224 * 3);
        cr_assert(df.mean < 1.0 && df.max <= 12.0, "max %.2f mean %.3f", df.max, df.mean);
        free(want);
        free(got);
    }
    /* A smaller crop of the same image: scale 4/8 (box 600..895 px). */
    o.scale_min = o.scale_max = 0.25f;
    o.ratio_min = o.ratio_max = 1.0f;
    struct sf__decode_info info;
    unsigned char *got = decode_ok(d, &o, &j, 1, &info);
    cr_assert_eq(info.box.w, 866u);
    cr_assert_eq(info.scale_num, 4u);
    double *want = malloc((size_t)224 * 224 * 3 * sizeof *want);
    naive_resized_crop(full, j.w, info.box, 224, 224, want);
    struct diff df = compare(got, want, (size_t)224 * 224 * 3);
    cr_assert(df.mean < 1.0 && df.max <= 12.0, "max %.2f mean %.3f", df.max, df.mean);
    free(want);
    free(got);
    free(full);
    free(j.data);
    sf__decoder_destroy(d);
}

Test(decode, float_output_is_normalize_u8_of_the_uint8_output)
{
    struct sf_decoder *d = new_decoder();
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 9);
    for (int layout = 0; layout < 2; layout++)
        for (int crop = 0; crop < 3; crop++) {
            const unsigned W = crop == SF_CROP_NONE ? 0 : 120, H = crop == SF_CROP_NONE ? 0 : 88;
            struct sf_image_options o = opts((enum sf_crop)crop, W, H, (enum sf_layout)layout);
            o.hflip = 0.5f;
            o.mean[1] = 0.5f;
            o.std[2] = 0.3f;
            unsigned char *u8 = decode_ok(d, &o, &j, 13, NULL);
            o.dtype = SF_DTYPE_FLOAT32;
            unsigned char *f32 = decode_ok(d, &o, &j, 13, NULL);
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
    sf__decoder_destroy(d);
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

/* ------------------------------------------------------------------ bad input, limits */

static sf_status try_decode(struct sf_decoder *d, const struct sf_image_options *o,
                            const void *data, size_t size, char *err, size_t err_len)
{
    static unsigned char out[333 * 251 * 3 * 4];
    cr_assert_leq(sf__image_bytes(o), sizeof out);
    err[0] = '\0';
    return sf__decode_jpeg(d, o, data, size, 0, out, NULL, err, err_len);
}

static size_t first_sos(const struct jpeg *j)
{
    for (size_t i = 2; i + 1 < j->size; i++)
        if (j->data[i] == 0xFF && j->data[i + 1] == 0xDA)
            return i;
    cr_assert_fail("no SOS marker");
    return 0;
}

Test(decode, corrupt_input_fails_with_a_message)
{
    struct sf_decoder *d = new_decoder();
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 30);
    struct sf_image_options full = opts(SF_CROP_NONE, 333, 251, SF_LAYOUT_HWC);
    char err[256];
    unsigned char *buf = malloc(j.size + 64);
    size_t sos = first_sos(&j);

    /* Truncated in the headers, in the entropy data, just before EOI. */
    size_t cuts[] = {2, 20, sos, sos + 20, j.size / 3, j.size / 2, j.size - 100, j.size - 2};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        memcpy(buf, j.data, cuts[k]);
        sf_status st = try_decode(d, &full, buf, cuts[k], err, sizeof err);
        cr_assert_eq(st, SF_ERR_CORRUPT, "cut at %zu of %zu: %s", cuts[k], j.size,
                     sf_status_name(st));
        cr_assert(strstr(err, "byte"), "message without an offset: %s", err);
    }

    /* A run of stuffed 0xFF bytes (all-ones bits: no valid Huffman code). */
    memcpy(buf, j.data, j.size);
    for (size_t i = 0; i < 32; i += 2) {
        buf[j.size / 2 + i] = 0xFF;
        buf[j.size / 2 + i + 1] = 0x00;
    }
    cr_assert_eq(try_decode(d, &full, buf, j.size, err, sizeof err), SF_ERR_CORRUPT);
    cr_assert(strstr(err, "Huffman") || strstr(err, "Corrupt"), "%s", err);

    /* Random bit flips in the entropy data: JPEG has no checksum, so some
     * decode to other valid codes; most are caught, none may crash. */
    struct sf__rng r = {1};
    unsigned caught = 0;
    for (int k = 0; k < 100; k++) {
        memcpy(buf, j.data, j.size);
        for (int f = 0; f < 8; f++) {
            size_t at = sos + 20 + (size_t)sf__rng_below(&r, j.size - sos - 24);
            buf[at] ^= (unsigned char)(1u << sf__rng_below(&r, 8));
        }
        sf_status st = try_decode(d, &full, buf, j.size, err, sizeof err);
        cr_assert(st == SF_OK || st == SF_ERR_CORRUPT, "%s", sf_status_name(st));
        if (st != SF_OK) {
            caught++;
            cr_assert(err[0] != '\0');
        }
        /* the region path on the same data */
        struct sf_image_options rrc = opts(SF_CROP_RANDOM_RESIZED, 64, 64, SF_LAYOUT_CHW);
        st = try_decode(d, &rrc, buf, j.size, err, sizeof err);
        cr_assert(st == SF_OK || st == SF_ERR_CORRUPT, "%s", sf_status_name(st));
    }
    cr_assert_geq(caught, 60u, "only %u of 100 damaged JPEGs detected", caught);

    /* Not JPEG at all. */
    cr_assert_eq(try_decode(d, &full, "", 0, err, sizeof err), SF_ERR_CORRUPT);
    cr_assert(err[0] != '\0');
    static const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n',
                                        0,    0,   0,   13,  'I',  'H',  'D',  'R'};
    cr_assert_eq(try_decode(d, &full, png, sizeof png, err, sizeof err), SF_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "PNG"), "%s", err);
    for (size_t i = 0; i < 4096; i++)
        buf[i] = (unsigned char)sf__rng_next(&r);
    buf[0] = 0x12;
    cr_assert_eq(try_decode(d, &full, buf, 4096, err, sizeof err), SF_ERR_UNSUPPORTED);
    buf[0] = 0xFF;
    buf[1] = 0xD8; /* an SOI, then garbage */
    sf_status st = try_decode(d, &full, buf, 4096, err, sizeof err);
    cr_assert(st == SF_ERR_CORRUPT || st == SF_ERR_UNSUPPORTED, "%s", sf_status_name(st));
    cr_assert(strstr(err, "byte"), "%s", err);

    /* The decoder is still good after all that. */
    struct sf_decoder *fresh = new_decoder();
    unsigned char *a = decode_ok(d, &full, &j, 0, NULL);
    unsigned char *b = decode_ok(fresh, &full, &j, 0, NULL);
    cr_assert_eq(memcmp(a, b, (size_t)333 * 251 * 3), 0);
    free(a);
    free(b);
    sf__decoder_destroy(fresh);
    free(buf);
    free(j.data);
    sf__decoder_destroy(d);
}

Test(decode, size_limits_are_checked_before_any_pixel)
{
    struct sf_decoder *d = new_decoder();
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 31);
    /* Headers intact, entropy data destroyed: a limit error proves the
     * check came first (decoding would say CORRUPT). */
    size_t sos = first_sos(&j);
    unsigned char *bad = malloc(j.size);
    memcpy(bad, j.data, j.size);
    memset(bad + sos + 30, 0xFF, j.size - sos - 32);
    char err[256];
    struct sf_image_options o = opts(SF_CROP_RANDOM_RESIZED, 64, 64, SF_LAYOUT_CHW);
    o.max_side = 332;
    cr_assert_eq(try_decode(d, &o, bad, j.size, err, sizeof err), SF_ERR_LIMIT);
    cr_assert(strstr(err, "max_side"), "%s", err);
    o.max_side = 333;
    o.max_pixels = 333 * 251 - 1;
    cr_assert_eq(try_decode(d, &o, bad, j.size, err, sizeof err), SF_ERR_LIMIT);
    cr_assert(strstr(err, "max_pixels"), "%s", err);
    o.max_pixels = 333 * 251; /* exactly at the limits: decodes (and finds the damage) */
    cr_assert_eq(try_decode(d, &o, bad, j.size, err, sizeof err), SF_ERR_CORRUPT);
    cr_assert_eq(try_decode(d, &o, j.data, j.size, err, sizeof err), SF_OK, "%s", err);
    free(bad);
    free(j.data);
    sf__decoder_destroy(d);
}

Test(decode, progressive_scan_limit)
{
    struct sf_decoder *d = new_decoder();
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, TJFLAG_PROGRESSIVE, 32);
    unsigned scans = 0;
    for (size_t i = 0; i + 1 < j.size; i++) /* entropy data never holds an unstuffed FF DA */
        scans += j.data[i] == 0xFF && j.data[i + 1] == 0xDA;
    cr_assert_gt(scans, 3u);
    char err[256];
    for (int crop = 0; crop < 3; crop++) {
        struct sf_image_options o = opts((enum sf_crop)crop, 64, 64, SF_LAYOUT_CHW);
        o.max_scans = scans;
        cr_assert_eq(try_decode(d, &o, j.data, j.size, err, sizeof err), SF_OK, "%s", err);
        o.max_scans = scans - 1;
        cr_assert_eq(try_decode(d, &o, j.data, j.size, err, sizeof err), SF_ERR_LIMIT);
        cr_assert(strstr(err, "max_scans"), "%s", err);
        o.max_scans = 1;
        cr_assert_eq(try_decode(d, &o, j.data, j.size, err, sizeof err), SF_ERR_LIMIT);
    }
    free(j.data);
    sf__decoder_destroy(d);
}

Test(decode, options_are_checked)
{
    struct sf_image_options o;
    sf__image_options_default(&o);
    char err[256] = "";
    cr_assert_eq(sf__image_options_check(&o, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(o.width, 224u);
    cr_assert_eq(o.crop, SF_CROP_RANDOM_RESIZED);
    cr_assert_eq(o.layout, SF_LAYOUT_CHW);
    cr_assert_eq(sf__image_bytes(&o), (size_t)224 * 224 * 3);
    o.dtype = SF_DTYPE_FLOAT32;
    cr_assert_eq(sf__image_bytes(&o), (size_t)224 * 224 * 3 * 4);

#define EXPECT_BAD(field, stmt)                                                                    \
    do {                                                                                           \
        struct sf_image_options b_;                                                                \
        sf__image_options_default(&b_);                                                            \
        stmt;                                                                                      \
        err[0] = '\0';                                                                             \
        cr_assert_eq(sf__image_options_check(&b_, err, sizeof err), SF_ERR_INVALID_ARGUMENT,       \
                     "%s accepted", #stmt);                                                        \
        cr_assert(strstr(err, field), "%s: message \"%s\" does not name %s", #stmt, err, field);   \
    } while (0)
    EXPECT_BAD("scale_min", b_.scale_min = 0.0f);
    EXPECT_BAD("scale_min", b_.scale_max = 0.01f);
    EXPECT_BAD("ratio_min", b_.ratio_min = -1.0f);
    EXPECT_BAD("ratio_min", b_.ratio_max = 0.5f);
    EXPECT_BAD("hflip", b_.hflip = 1.5f);
    EXPECT_BAD("center_fraction", b_.center_fraction = 0.0f);
    EXPECT_BAD("width", b_.width = 0);
    EXPECT_BAD("width", (b_.width = 0, b_.height = 0));
    EXPECT_BAD("std[1]", b_.std[1] = 0.0f);
    EXPECT_BAD("max_scans", b_.max_scans = 0);
    EXPECT_BAD("max_side", b_.max_side = 0);
    EXPECT_BAD("layout", b_.layout = (enum sf_layout)7);
#undef EXPECT_BAD
    sf__image_options_default(&o);
    o.crop = SF_CROP_NONE;
    o.width = o.height = 0;
    cr_assert_eq(sf__image_options_check(&o, err, sizeof err), SF_OK, "%s", err);
    sf__decoder_destroy(NULL);
}

/* ------------------------------------------------------------------ labels */

static void label_ok(const char *name, const char *text, int64_t want)
{
    int64_t v = 12345;
    char err[256] = "";
    sf_status st = sf__parse_label(name, text, strlen(text), &v, err, sizeof err);
    cr_assert_eq(st, SF_OK, "%s \"%s\": %s %s", name, text, sf_status_name(st), err);
    cr_assert_eq(v, want, "%s \"%s\": %lld", name, text, (long long)v);
}

static void label_bad(const char *name, const void *text, size_t n)
{
    int64_t v = 0;
    char err[256] = "";
    sf_status st = sf__parse_label(name, text, n, &v, err, sizeof err);
    cr_assert_eq(st, SF_ERR_PARSE, "%s \"%.*s\" accepted (%lld)", name, (int)n, (const char *)text,
                 (long long)v);
    cr_assert(strstr(err, name), "message \"%s\" does not name the field", err);
}

#define LABEL_BAD(name, lit) label_bad(name, lit, sizeof lit - 1)

Test(decode, labels_cls_and_txt)
{
    label_ok("cls", "7", 7);
    label_ok("cls", " 12\n", 12);
    label_ok("cls", "-1", -1);
    label_ok("cls", "\t0042 \r\n", 42);
    label_ok("txt", "9223372036854775807", INT64_MAX);
    label_ok("txt", "-9223372036854775808", INT64_MIN);
    label_ok("label.cls", "3", 3);
    LABEL_BAD("cls", "");
    LABEL_BAD("cls", "  \n");
    LABEL_BAD("cls", "+3");
    LABEL_BAD("cls", "7a");
    LABEL_BAD("cls", "1 2");
    LABEL_BAD("cls", "-");
    LABEL_BAD("cls", "3.0");
    LABEL_BAD("cls", "0x10");
    LABEL_BAD("cls", "9223372036854775808");
    LABEL_BAD("txt", "cat");
    LABEL_BAD("cls", "5\0");
}

Test(decode, labels_json)
{
    label_ok("json", "3", 3);
    label_ok("json", " -2 ", -2);
    label_ok("json", "3.0", 3);
    label_ok("json", "{\"label\": 5}", 5);
    label_ok("json", "{\"name\": \"x\", \"boxes\": [[1, 2]], \"label\": 17}\n", 17);
    label_ok("sample.json", "{\"label\":-1}", -1);
    LABEL_BAD("json", "");
    LABEL_BAD("json", "3.5");
    LABEL_BAD("json", "1e300");
    LABEL_BAD("json", "\"3\"");
    LABEL_BAD("json", "[5]");
    LABEL_BAD("json", "{\"lbl\": 5}");
    LABEL_BAD("json", "{\"label\": \"5\"}");
    LABEL_BAD("json", "{\"label\": 2.5}");
    LABEL_BAD("json", "{\"label\": 5");
    LABEL_BAD("json", "{\"label\": 5} x");
    LABEL_BAD("json", "null");
}

/* ------------------------------------------------------------------ zstd */

static unsigned char *compressible(size_t n, uint64_t seed)
{
    unsigned char *p = malloc(n);
    struct sf__rng r = {seed};
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i % 251 < 200 ? 'a' + i % 7 : sf__rng_next(&r));
    return p;
}

Test(decode, zstd_round_trip_and_reuse)
{
    struct sf_decoder *d = new_decoder();
    unsigned char *out = NULL;
    size_t cap = 0, len = 0;
    char err[256];
    for (size_t n = 0; n <= 300000; n = n * 7 + 1000) {
        unsigned char *src = compressible(n, n);
        size_t bound = ZSTD_compressBound(n);
        unsigned char *z = malloc(bound);
        size_t zn = ZSTD_compress(z, bound, src, n, 3);
        cr_assert(!ZSTD_isError(zn));
        sf_status st = sf__decode_zstd(d, z, zn, 1 << 20, &out, &cap, &len, err, sizeof err);
        cr_assert_eq(st, SF_OK, "%zu bytes: %s", n, err);
        cr_assert_eq(len, n);
        cr_assert(n == 0 || memcmp(out, src, n) == 0);
        cr_assert_geq(cap, len);
        free(z);
        free(src);
    }
    /* A frame without a declared size (streamed) decodes through the
     * growing path. */
    unsigned char *src = compressible(200000, 9);
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
    size_t bound = ZSTD_compressBound(200000);
    unsigned char *z = malloc(bound);
    ZSTD_outBuffer ob = {z, bound, 0};
    ZSTD_inBuffer ib = {src, 200000, 0};
    cr_assert_eq(ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_end), 0u);
    cr_assert_eq(ZSTD_getFrameContentSize(z, ob.pos), ZSTD_CONTENTSIZE_UNKNOWN);
    free(out);
    out = NULL;
    cap = 0;
    cr_assert_eq(sf__decode_zstd(d, z, ob.pos, 200000, &out, &cap, &len, err, sizeof err), SF_OK,
                 "%s", err);
    cr_assert_eq(len, 200000u);
    cr_assert_eq(memcmp(out, src, 200000), 0);
    /* ... and is refused one byte under its size */
    cr_assert_eq(sf__decode_zstd(d, z, ob.pos, 199999, &out, &cap, &len, err, sizeof err),
                 SF_ERR_LIMIT);
    cr_assert(strstr(err, "199999"), "%s", err);
    ZSTD_freeCCtx(c);
    free(z);
    free(src);
    free(out);
    sf__decoder_destroy(d);
}

Test(decode, zstd_bad_frames_and_limits)
{
    struct sf_decoder *d = new_decoder();
    unsigned char *out = NULL;
    size_t cap = 0, len = 0;
    char err[256];
    unsigned char *src = compressible(50000, 3);
    /* with a checksum, so that damage to the payload is detectable */
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    size_t bound = ZSTD_compressBound(50000);
    unsigned char *z = malloc(bound), *bad = malloc(bound);
    size_t zn = ZSTD_compress2(c, z, bound, src, 50000);
    cr_assert(!ZSTD_isError(zn));

    cr_assert_eq(sf__decode_zstd(d, z, zn, 50000, &out, &cap, &len, err, sizeof err), SF_OK);
    cr_assert_eq(sf__decode_zstd(d, z, zn, 49999, &out, &cap, &len, err, sizeof err), SF_ERR_LIMIT);
    cr_assert(strstr(err, "49999"), "%s", err);

    memcpy(bad, z, zn);
    bad[0] ^= 0xFF; /* magic */
    cr_assert_eq(sf__decode_zstd(d, bad, zn, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    cr_assert(err[0] != '\0');
    memcpy(bad, z, zn);
    bad[zn / 2] ^= 0x10; /* payload */
    cr_assert_eq(sf__decode_zstd(d, bad, zn, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    memcpy(bad, z, zn);
    bad[zn - 1] ^= 0x01; /* checksum */
    cr_assert_eq(sf__decode_zstd(d, bad, zn, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    for (size_t cut = 1; cut < zn; cut += zn / 7) /* truncated */
        cr_assert_eq(sf__decode_zstd(d, z, cut, 1 << 20, &out, &cap, &len, err, sizeof err),
                     SF_ERR_CORRUPT, "cut at %zu", cut);
    cr_assert_eq(sf__decode_zstd(d, z, 0, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    /* still usable */
    cr_assert_eq(sf__decode_zstd(d, z, zn, 1 << 20, &out, &cap, &len, err, sizeof err), SF_OK);
    cr_assert_eq(memcmp(out, src, 50000), 0);
    ZSTD_freeCCtx(c);
    free(z);
    free(bad);
    free(src);
    free(out);
    sf__decoder_destroy(d);
}
