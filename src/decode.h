/* Decode workers' per-thread machinery: JPEG (the libjpeg API of
 * libjpeg-turbo for every path: whole, region and DCT-scaled decode), crop
 * geometry, bilinear resize, flip, layout, CPU normalisation, labels and
 * zstd pass-through fields. One struct sf_decoder per thread; nothing here
 * locks. Internal (sf__ prefix). */
#ifndef SF_DECODE_H
#define SF_DECODE_H

#include "shardfeed.h"
#include "shardfeed_loader.h"

#include <stddef.h>
#include <stdint.h>

/* The crop window in source pixels, and how it is read. */
struct sf__crop_box {
    unsigned x, y, w, h; /* window in the full-resolution source image */
};

/* What one decode did (for tests, stats and error messages). */
struct sf__decode_info {
    unsigned src_width, src_height; /* the JPEG's size */
    struct sf__crop_box box;        /* the window cut (full-resolution coordinates) */
    unsigned scale_num;             /* DCT scale used: scale_num / 8 (8 = full size) */
    int flipped;                    /* 1 when mirrored horizontally */
    int progressive;
};

/*
 * Per-sample random state: a splitmix64 hash of (seed, epoch, shard, sample),
 * so the same sample in the same epoch gets the same crop and flip on every
 * run, whatever thread decodes it. Defined exactly in docs/decode.md.
 */
uint64_t sf__sample_rng_seed(uint64_t seed, uint64_t epoch, uint64_t shard, uint64_t sample);

/*
 * The crop window of an image of src_w x src_h for the options and rng seed:
 * RandomResizedCrop (torchvision's algorithm: 10 tries of area in
 * [scale_min, scale_max] x src area and log-uniform ratio, then the centre
 * fallback clamped to [ratio_min, ratio_max]), Resize + CenterCrop mapped
 * back to source pixels, or the whole image. *flip gets the flip decision.
 * Pure function; the tests check its geometry.
 */
void sf__crop_window(const struct sf_image_options *o, unsigned src_w, unsigned src_h,
                     uint64_t rng_seed, struct sf__crop_box *box, int *flip);

/* Bytes of one output image for the options (width x height x 3 x 1 or 4). */
size_t sf__image_bytes(const struct sf_image_options *o);

struct sf_decoder;

sf_status sf__decoder_new(struct sf_decoder **out);
void sf__decoder_destroy(struct sf_decoder *d);

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
 * nothing corrupt is delivered silently. info may be NULL.
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

/* Fills o with the defaults of struct sf_image_options (shardfeed_loader.h). */
void sf__image_options_default(struct sf_image_options *o);

/* Checks o; SF_ERR_INVALID_ARGUMENT with a message naming the option. */
sf_status sf__image_options_check(const struct sf_image_options *o, char *err, size_t err_len);

#endif /* SF_DECODE_H */
