/*
 * pack --max-side: a JPEG whose longer side is over the limit is decoded (at
 * the smallest DCT scale that still covers the target, as decoding a 4000 px
 * photo in full to shrink it to 512 px wastes most of the work), resized
 * with an antialiasing filter (stb_image_resize: Mitchell when shrinking) so
 * its longer side is the limit, and encoded again at the given quality.
 * docs/pack.md "Re-encoding" has the decisions.
 */
#include "src/pack_reencode.h"
#include "common/strbuf.h"

#include <stb_image_resize.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

/* Target size: longer side max_side, the other rounded, at least 1. */
static void target_size(unsigned w, unsigned h, unsigned max_side, unsigned *tw, unsigned *th)
{
    if (w >= h) {
        *tw = max_side;
        *th = (unsigned)(((unsigned long long)h * max_side + w / 2) / w);
    } else {
        *th = max_side;
        *tw = (unsigned)(((unsigned long long)w * max_side + h / 2) / h);
    }
    if (*tw < 1)
        *tw = 1;
    if (*th < 1)
        *th = 1;
}

sf_status sf__reencode_jpeg(const struct sf__reencode *r, const unsigned char *src, size_t n,
                            unsigned char **out, size_t *out_n, char *err, size_t err_len)
{
    *out = NULL;
    *out_n = 0;
    if (n > (size_t)0x7fffffff)
        return sf__fail(err, err_len, SF_ERR_CORRUPT, "%zu bytes: too large to re-encode", n);
    tjhandle dec = tjInitDecompress();
    if (!dec)
        return sf__fail(err, err_len, SF_ERR_CORRUPT, "TurboJPEG: %s", tjGetErrorStr2(NULL));
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    sf_status st = SF_OK;
    unsigned char *pix = NULL, *small = NULL, *jpeg = NULL;
    if (tjDecompressHeader3(dec, src, (unsigned long)n, &w, &h, &subsamp, &colorspace) != 0) {
        st = sf__fail(err, err_len, SF_ERR_CORRUPT, "not a JPEG TurboJPEG can read: %s", tjGetErrorStr2(dec));
        goto done;
    }
    if ((unsigned)w <= r->max_side && (unsigned)h <= r->max_side)
        goto done; /* small enough: the original bytes are kept */
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
        st = sf__fail(err, err_len, SF_ERR_CORRUPT, "a %dx%d CMYK JPEG: pack --max-side re-encodes RGB and "
                                 "grayscale JPEGs only; convert it first",
                   w, h);
        goto done;
    }
    const int gray = colorspace == TJCS_GRAY;
    const int ch = gray ? 1 : 3;
    unsigned tw, th;
    target_size((unsigned)w, (unsigned)h, r->max_side, &tw, &th);
    /* The smallest scale whose output still covers the target in both
     * directions; the filter then shrinks by less than 2x. */
    int nsf = 0;
    tjscalingfactor *sf = tjGetScalingFactors(&nsf);
    int sw = w, sh = h;
    for (int i = 0; sf && i < nsf; i++) {
        int cw = TJSCALED(w, sf[i]), chh = TJSCALED(h, sf[i]);
        if (cw >= (int)tw && chh >= (int)th && (long long)cw * chh < (long long)sw * sh) {
            sw = cw;
            sh = chh;
        }
    }
    pix = malloc((size_t)sw * (size_t)sh * (size_t)ch);
    small = malloc((size_t)tw * th * (size_t)ch);
    if (!pix || !small) {
        st = SF_ERR_NO_MEMORY;
        sf__fail(err, err_len, SF_ERR_NO_MEMORY, "no memory to re-encode a %dx%d JPEG", w, h);
        goto done;
    }
    /* A warning (a truncated file, bad data libjpeg papers over) fails too:
     * the loader refuses such a JPEG, and pack time is the time to know. */
    if (tjDecompress2(dec, src, (unsigned long)n, pix, sw, 0, sh, gray ? TJPF_GRAY : TJPF_RGB,
                      0) != 0) {
        st = sf__fail(err, err_len, SF_ERR_CORRUPT, "corrupt %dx%d JPEG: %s", w, h, tjGetErrorStr2(dec));
        goto done;
    }
    if (!stbir_resize_uint8(pix, sw, sh, 0, small, (int)tw, (int)th, 0, ch)) {
        st = sf__fail(err, err_len, SF_ERR_CORRUPT, "resizing %dx%d to %ux%u failed", sw, sh, tw, th);
        goto done;
    }
    tjhandle enc = tjInitCompress();
    if (!enc) {
        st = sf__fail(err, err_len, SF_ERR_CORRUPT, "TurboJPEG: %s", tjGetErrorStr2(NULL));
        goto done;
    }
    unsigned long jn = 0;
    if (tjCompress2(enc, small, (int)tw, 0, (int)th, gray ? TJPF_GRAY : TJPF_RGB, &jpeg, &jn,
                    gray ? TJSAMP_GRAY : TJSAMP_420, r->quality, 0) != 0) {
        st = sf__fail(err, err_len, SF_ERR_CORRUPT, "encoding %ux%u at quality %d: %s", tw, th, r->quality,
                   tjGetErrorStr2(enc));
        tjDestroy(enc);
        goto done;
    }
    tjDestroy(enc);
    /* The caller frees with free(): TurboJPEG's buffer is its own. */
    *out = malloc(jn ? jn : 1);
    if (!*out) {
        st = SF_ERR_NO_MEMORY;
        sf__fail(err, err_len, SF_ERR_CORRUPT, "no memory for a %lu-byte JPEG", jn);
        goto done;
    }
    memcpy(*out, jpeg, jn);
    *out_n = jn;
done:
    if (jpeg)
        tjFree(jpeg);
    free(small);
    free(pix);
    tjDestroy(dec);
    return st;
}
