/* The decode suite's fixture (decode_fixture.h). */
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

/* ------------------------------------------------------------------ helpers */

unsigned char *make_rgb(unsigned w, unsigned h, uint64_t seed, int noise)
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

unsigned char *make_smooth(unsigned w, unsigned h)
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

struct jpeg compress_pixels(const unsigned char *px, unsigned w, unsigned h, int pf, int subsamp,
                            int flags, int quality)
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

struct jpeg make_jpeg(unsigned w, unsigned h, int subsamp, int flags, uint64_t seed)
{
    unsigned char *px = make_rgb(w, h, seed, 20);
    struct jpeg j = compress_pixels(px, w, h, TJPF_RGB, subsamp, flags, 90);
    free(px);
    return j;
}

unsigned char *tj_decode(const struct jpeg *j, int pf)
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

struct sf_image_options opts(enum sf_crop crop, unsigned w, unsigned h, enum sf_layout layout)
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

unsigned char *decode_ok(struct sf_decoder *d, const struct sf_image_options *o,
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

struct sf_decoder *new_decoder(void)
{
    struct sf_decoder *d = NULL;
    cr_assert_eq(sf__decoder_new(&d), SF_OK);
    cr_assert_not_null(d);
    return d;
}

sf_status try_decode(struct sf_decoder *d, const struct sf_image_options *o, const void *data,
                     size_t size, char *err, size_t err_len)
{
    static unsigned char out[333 * 251 * 3 * 4];
    cr_assert_leq(sf__image_bytes(o), sizeof out);
    err[0] = '\0';
    return sf__decode_jpeg(d, o, data, size, 0, out, NULL, err, err_len);
}

size_t first_sos(const struct jpeg *j)
{
    for (size_t i = 2; i + 1 < j->size; i++)
        if (j->data[i] == 0xFF && j->data[i + 1] == 0xDA)
            return i;
    cr_assert_fail("no SOS marker");
    return 0;
}

struct sf_decoder *dec;

void decode_setup(void)
{
    dec = new_decoder();
}

void decode_teardown(void)
{
    sf__decoder_destroy(dec);
    dec = NULL;
}
