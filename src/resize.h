/* The bilinear resize's two passes (docs/decode.md, *Resize*), in portable
 * C, SSE2 and AVX2 (chosen at run time), all giving the same bytes. The
 * geometry (which source pixels, which weights) is src/decode.c's; these
 * are the per-row kernels. Internal (sf__ prefix); no state, any thread. */
#ifndef SF_RESIZE_H
#define SF_RESIZE_H

#include <stddef.h>
#include <stdint.h>

/* Weights in 1/2048ths: 255 * 2048 * 2048 fits in 32 bits. */
#define SF__W_BITS 11
#define SF__W_ONE  (1 << SF__W_BITS)

/* Output pixels are processed 8 at a time: tables and planes have the output
 * width rounded up to this (sf__resize_pad). */
#define SF__RESIZE_STEP 8u
/* int16s after an interleaved horizontal row (its stores overlap the end). */
#define SF__RESIZE_HPAD 8u
/* Bytes readable after the last source pixel a row's taps start at (an
 * 8-byte load per tap pair). */
#define SF__RESIZE_ROW_PAD 16u

enum sf__simd {
    SF__SIMD_C = 0,    /* portable C */
    SF__SIMD_SSE2 = 1, /* x86-64 baseline */
    SF__SIMD_AVX2 = 2, /* where the CPU has it (checked at run time) */
};

/* The best level this build and this CPU can run. */
enum sf__simd sf__simd_best(void);

/* 1 if this build and this CPU can run `level`. */
int sf__simd_available(enum sf__simd level);

/* The output width rounded up to SF__RESIZE_STEP. */
static inline unsigned sf__resize_pad(unsigned width)
{
    return (width + SF__RESIZE_STEP - 1) & ~(SF__RESIZE_STEP - 1);
}

/*
 * Horizontal pass of one row of RGB bytes into 16-bit values (1/128ths):
 * for output pixel x < wp, with a = row + xo[x], wa = xw[x] & 0xffff,
 * wb = xw[x] >> 16 (wa + wb = 2048) and each channel c,
 *   h = (a[c] wa + a[3 + c] wb + 8) >> 4
 * into h[c wp + x] (planar) or h[3 x + c] (interleaved). wp is a multiple of
 * SF__RESIZE_STEP; row has SF__RESIZE_ROW_PAD readable bytes after
 * row + xo[x] + 2 for every x; h has 3 wp (planar) or 3 wp +
 * SF__RESIZE_HPAD (interleaved) values. `level` must be available.
 */
void sf__resize_h(enum sf__simd level, int16_t *h, const unsigned char *row, const int32_t *xo,
                  const uint32_t *xw, unsigned wp, int planar);

/*
 * Vertical pass: n bytes dst[i] = (h0[i] (2048 - wy) + h1[i] wy + 2^17) >> 18
 * from horizontal values h0 (upper row) and h1, each in [0, 255 * 128];
 * wy <= 2048. Writes exactly n bytes. `level` must be available.
 */
void sf__resize_v(enum sf__simd level, unsigned char *dst, const int16_t *h0, const int16_t *h1,
                  size_t n, uint32_t wy);

#endif /* SF_RESIZE_H */
