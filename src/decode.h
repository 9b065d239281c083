/* Decode workers' per-thread machinery: JPEG (the libjpeg API of
 * libjpeg-turbo for every path: whole, region and DCT-scaled decode),
 * bilinear resize, flip, layout, CPU normalisation (src/decode.c), labels and
 * zstd pass-through fields (src/decode_fields.c); the crop geometry is in
 * src/crop.h. One struct sf_decoder per thread; nothing here locks.
 * Internal (sf__ prefix). */
#ifndef SF_DECODE_H
#define SF_DECODE_H

#include "shardfeed.h"
#include "shardfeed_loader.h"
#include "src/crop.h"
#include "src/resize.h"

#include <stddef.h>
#include <stdint.h>

/* What one decode did (for tests, stats and error messages). */
struct sf__decode_info {
    unsigned src_width, src_height; /* the JPEG's size */
    struct sf__crop_box box;        /* the window cut (full-resolution coordinates) */
    unsigned scale_num;             /* DCT scale used: scale_num / 8 (8 = full size) */
    int flipped;                    /* 1 when mirrored horizontally */
    int progressive;
};

/* Bytes of one output image for the options (width x height x 3 x 1 or 4). */
size_t sf__image_bytes(const struct sf_image_options *o);

struct sf_decoder;

sf_status sf__decoder_new(struct sf_decoder **out);
void sf__decoder_destroy(struct sf_decoder *d);

/* Makes d resize with the kernels of `level` (src/resize.h) instead of the
 * best the CPU has, for the tests that compare them: the output is the same
 * bytes. SF_ERR_UNSUPPORTED if this build or CPU lacks the level. */
sf_status sf__decoder_set_simd(struct sf_decoder *d, enum sf__simd level);

/*
 * Decodes one JPEG into out (sf__image_bytes(o) bytes, any alignment):
 * crop window from sf__crop_window(rng_seed), only that region decoded (rows
 * skipped with jpeg_skip_scanlines, columns cut with jpeg_crop_scanline, the
 * rows after the window never decoded) at the smallest DCT scale M/8 whose
 * scaled window still covers width x height, then bilinear resize to width x
 * height (pixel centres aligned, as torchvision/PIL bilinear without
 * antialias), flip, layout, and dtype (float: (x/255 - mean)/std).
 * Grayscale and CMYK JPEGs come out RGB. With SF_CROP_NONE and width/height
 * equal to the source size (or 0), the pixels are exactly libjpeg-turbo's own
 * full decode (djpeg's).
 *
 * Limits (o->max_side, max_pixels, max_scans) are checked from the header
 * before any pixel is decoded. Errors (SF_ERR_CORRUPT for a bad JPEG with
 * libjpeg's message, SF_ERR_LIMIT, SF_ERR_UNSUPPORTED for a non-JPEG) leave a
 * message in err naming the byte offset within the image data where known.
 * libjpeg warnings (corrupt data the library recovers from) are errors too:
 * nothing corrupt is delivered silently; only the two about headers alone
 * (JFIF version, sequential SOS parameters) are not. info may be NULL.
 */
sf_status sf__decode_jpeg(struct sf_decoder *d, const struct sf_image_options *o, const void *data,
                          size_t size, uint64_t rng_seed, void *out, struct sf__decode_info *info,
                          char *err, size_t err_len);

/*
 * uint8 image (width x height x 3 in `layout`) to float32 in the same layout:
 * (x / 255 - mean[c]) / std[c]. The CPU reference the CUDA kernel is tested
 * against; also the dtype float32 path.
 */
void sf__normalize_u8(const uint8_t *src, float *dst, size_t n_images, unsigned width,
                      unsigned height, enum sf_layout layout, const float mean[3],
                      const float std[3]);

/*
 * A label from a field: `cls` / `txt` (optional spaces, a decimal integer,
 * optional trailing whitespace), `json` (a number, or an object whose
 * member "label" is an integer). Anything else is SF_ERR_PARSE with a
 * message. name is the field name (decides the syntax).
 */
sf_status sf__parse_label(const char *name, const void *data, size_t size, int64_t *out, char *err,
                          size_t err_len);

/*
 * Decompresses a zstd frame (a ".zst" field) with the decoder's own context
 * into *out (grown with realloc, capacity in *cap); at most max_bytes of
 * output (else SF_ERR_LIMIT). *out_len gets the size. SF_ERR_CORRUPT on bad
 * data.
 */
sf_status sf__decode_zstd(struct sf_decoder *d, const void *src, size_t size,
                          unsigned long long max_bytes, unsigned char **out, size_t *cap,
                          size_t *out_len, char *err, size_t err_len);

struct ZSTD_DCtx_s;
/* The decoder's zstd context, for sf__decode_zstd (decode_fields.c). */
struct ZSTD_DCtx_s *sf__decoder_zstd(struct sf_decoder *d);

/* Fills o with the defaults of struct sf_image_options (shardfeed_loader.h). */
void sf__image_options_default(struct sf_image_options *o);

/* Checks o; SF_ERR_INVALID_ARGUMENT with a message naming the option. */
sf_status sf__image_options_check(const struct sf_image_options *o, char *err, size_t err_len);

#endif /* SF_DECODE_H */
