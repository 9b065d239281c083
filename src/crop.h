/* The crop window and flip of each sample (src/crop.c): per-sample
 * randomness and the crop geometry, defined bit for bit in docs/decode.md
 * with a Python reference. Pure functions; nothing here allocates or locks.
 * Internal (sf__ prefix); src/decode.h includes it. */
#ifndef SF_SRC_CROP_H
#define SF_SRC_CROP_H

#include "shardfeed_loader.h"

#include <stdint.h>

/* The crop window in source pixels, and how it is read. */
struct sf__crop_box {
    unsigned x, y, w, h; /* window in the full-resolution source image */
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

#endif /* SF_SRC_CROP_H */
