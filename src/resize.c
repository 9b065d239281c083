/*
 * The bilinear resize's per-row kernels (docs/decode.md, *Resize*): the
 * horizontal pass (two taps a pixel, weights in 1/2048ths, into 16-bit
 * values) and the vertical pass (two such rows blended into bytes), each in
 * portable C, SSE2 and AVX2. Integer arithmetic with the same roundings in
 * all three, so they give the same bytes (tests/test_decode_resize.c
 * compares them on random rows). AVX2 is compiled with a function attribute
 * and used only where the CPU reports it, so the library still runs on any
 * x86-64.
 */
#include "src/resize.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SF_HAVE_AVX2_TARGET 1
#define AVX2_FN             __attribute__((target("avx2")))
#endif

/* ------------------------------------------------------------------ portable C */

static void h_c(int16_t *h, const unsigned char *row, const int32_t *xo, const uint32_t *xw,
                unsigned wp, int planar)
{
    for (unsigned x = 0; x < wp; x++) {
        const unsigned char *a = row + xo[x], *b = a + 3;
        const uint32_t wa = xw[x] & 0xffff, wb = xw[x] >> 16;
        for (unsigned c = 0; c < 3; c++) {
            int16_t v = (int16_t)((a[c] * wa + b[c] * wb + 8) >> 4);
            if (planar)
                h[c * (size_t)wp + x] = v;
            else
                h[3 * (size_t)x + c] = v;
        }
    }
}

static void v_c(unsigned char *dst, const int16_t *h0, const int16_t *h1, size_t n, uint32_t wy)
{
    const uint32_t wy0 = SF__W_ONE - wy;
    for (size_t i = 0; i < n; i++)
        dst[i] = (unsigned char)(((uint32_t)h0[i] * wy0 + (uint32_t)h1[i] * wy + (1u << 17)) >> 18);
}

/* ------------------------------------------------------------------ SSE2 */

#if defined(__SSE2__)
/* Source pixels a and a + 1 of p as bytes [Ra Rb Ga Gb Ba Bb . .]. */
static __m128i tap_pair(const unsigned char *p)
{
    const __m128i s = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm_unpacklo_epi8(s, _mm_srli_si128(s, 3));
}

/* Two output pixels: int16 [R0 G0 B0 . R1 G1 B1 .]. */
static __m128i taps_two(const unsigned char *row, const int32_t *xo, __m128i w0, __m128i w1)
{
    const __m128i zero = _mm_setzero_si128(), rnd = _mm_set1_epi32(8);
    const __m128i pp = _mm_unpacklo_epi64(tap_pair(row + xo[0]), tap_pair(row + xo[1]));
    const __m128i m0 = _mm_add_epi32(_mm_madd_epi16(_mm_unpacklo_epi8(pp, zero), w0), rnd);
    const __m128i m1 = _mm_add_epi32(_mm_madd_epi16(_mm_unpackhi_epi8(pp, zero), w1), rnd);
    return _mm_packs_epi32(_mm_srai_epi32(m0, 4), _mm_srai_epi32(m1, 4));
}

/* Four output pixels a step: one 8-byte load gives both taps of a pixel. */
static void h_sse2(int16_t *h, const unsigned char *row, const int32_t *xo, const uint32_t *xw,
                   unsigned wp, int planar)
{
    for (unsigned x = 0; x < wp; x += 4) {
        const __m128i wv = _mm_loadu_si128((const __m128i *)(const void *)(xw + x));
        const __m128i v01 =
            taps_two(row, xo + x, _mm_shuffle_epi32(wv, 0x00), _mm_shuffle_epi32(wv, 0x55));
        const __m128i v23 =
            taps_two(row, xo + x + 2, _mm_shuffle_epi32(wv, 0xaa), _mm_shuffle_epi32(wv, 0xff));
        if (planar) { /* 4x4 transpose of the int16 lanes, then a plane each */
            const __m128i t0 = _mm_unpacklo_epi16(v01, v23), t1 = _mm_unpackhi_epi16(v01, v23);
            const __m128i rg = _mm_unpacklo_epi16(t0, t1), b = _mm_unpackhi_epi16(t0, t1);
            _mm_storel_epi64((__m128i *)(void *)(h + x), rg);
            _mm_storel_epi64((__m128i *)(void *)(h + wp + x), _mm_srli_si128(rg, 8));
            _mm_storel_epi64((__m128i *)(void *)(h + 2 * (size_t)wp + x), b);
        } else { /* 4 lanes a pixel, each store's 4th lane overwritten by the next */
            int16_t *q = h + 3 * (size_t)x;
            _mm_storel_epi64((__m128i *)(void *)q, v01);
            _mm_storel_epi64((__m128i *)(void *)(q + 3), _mm_srli_si128(v01, 8));
            _mm_storel_epi64((__m128i *)(void *)(q + 6), v23);
            _mm_storel_epi64((__m128i *)(void *)(q + 9), _mm_srli_si128(v23, 8));
        }
    }
}

/* Eight values a step from i while they last; returns where it stopped.
 * Always inlined: in v_avx2 it is compiled with VEX encodings, so no legacy
 * SSE instruction runs after AVX2 code with the upper halves dirty. */
static inline __attribute__((always_inline)) size_t v_sse2_steps(unsigned char *dst,
                                                                 const int16_t *h0,
                                                                 const int16_t *h1, size_t i,
                                                                 size_t n, uint32_t wy)
{
    const __m128i wv = _mm_set1_epi32((int)((SF__W_ONE - wy) | (wy << 16)));
    const __m128i rnd = _mm_set1_epi32(1 << 17);
    for (; i + 8 <= n; i += 8) {
        const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(h0 + i));
        const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(h1 + i));
        const __m128i lo = _mm_madd_epi16(_mm_unpacklo_epi16(a, b), wv);
        const __m128i hi = _mm_madd_epi16(_mm_unpackhi_epi16(a, b), wv);
        const __m128i v = _mm_packs_epi32(_mm_srai_epi32(_mm_add_epi32(lo, rnd), 18),
                                          _mm_srai_epi32(_mm_add_epi32(hi, rnd), 18));
        _mm_storel_epi64((__m128i *)(void *)(dst + i), _mm_packus_epi16(v, v));
    }
    return i;
}

static void v_sse2(unsigned char *dst, const int16_t *h0, const int16_t *h1, size_t n, uint32_t wy)
{
    const size_t i = v_sse2_steps(dst, h0, h1, 0, n, wy);
    v_c(dst + i, h0 + i, h1 + i, n - i, wy);
}
#endif /* __SSE2__ */

/* ------------------------------------------------------------------ AVX2 */

#if defined(SF_HAVE_AVX2_TARGET)
/* The 8-byte windows (both taps of a pixel) at a and b: [a0..a7 b0..b7]. */
AVX2_FN static inline __m128i windows2(const unsigned char *a, const unsigned char *b)
{
    long long hi;
    memcpy(&hi, b, sizeof hi);
    return _mm_insert_epi64(_mm_loadl_epi64((const __m128i *)(const void *)a), hi, 1);
}

/* Windows of output pixels x + i, in lanes as [i, i + 1 | i + 4, i + 5]. */
AVX2_FN static inline __m256i windows4(const unsigned char *row, const int32_t *xo, unsigned i)
{
    return _mm256_inserti128_si256(_mm256_castsi128_si256(windows2(row + xo[i], row + xo[i + 1])),
                                   windows2(row + xo[i + 4], row + xo[i + 5]), 1);
}

/*
 * Eight output pixels a step, planar. Each 128-bit lane of `a` holds the
 * windows of pixels 0, 1 (4, 5 in the upper lane) and of `b` pixels 2, 3
 * (6, 7). A byte shuffle puts channel c's two taps of each pixel side by
 * side as int16 (zero-extended), two pixels from `a` into int16 slots 0-3
 * and two from `b` into slots 4-7; one multiply-add with the weights of
 * pixels 0-7 (xw as is) then gives channel c of all eight as int32, in
 * order. Per channel the arithmetic is h_c's.
 */
AVX2_FN static void h_avx2_planar(int16_t *h, const unsigned char *row, const int32_t *xo,
                                  const uint32_t *xw, unsigned wp)
{
    const char Z = (char)0x80; /* pshufb: a zero byte */
#define TAPS_LO(c) c, Z, c + 3, Z, c + 8, Z, c + 11, Z, Z, Z, Z, Z, Z, Z, Z, Z
#define TAPS_HI(c) Z, Z, Z, Z, Z, Z, Z, Z, c, Z, c + 3, Z, c + 8, Z, c + 11, Z
    const __m256i ra = _mm256_setr_epi8(TAPS_LO(0), TAPS_LO(0));
    const __m256i rb = _mm256_setr_epi8(TAPS_HI(0), TAPS_HI(0));
    const __m256i ga = _mm256_setr_epi8(TAPS_LO(1), TAPS_LO(1));
    const __m256i gb = _mm256_setr_epi8(TAPS_HI(1), TAPS_HI(1));
    const __m256i ba = _mm256_setr_epi8(TAPS_LO(2), TAPS_LO(2));
    const __m256i bb = _mm256_setr_epi8(TAPS_HI(2), TAPS_HI(2));
#undef TAPS_LO
#undef TAPS_HI
    const __m256i rnd = _mm256_set1_epi32(8);
    for (unsigned x = 0; x < wp; x += 8) {
        const __m256i a = windows4(row, xo + x, 0), b = windows4(row, xo + x, 2);
        const __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)(xw + x));
        const __m256i r = _mm256_madd_epi16(
            _mm256_or_si256(_mm256_shuffle_epi8(a, ra), _mm256_shuffle_epi8(b, rb)), w);
        const __m256i g = _mm256_madd_epi16(
            _mm256_or_si256(_mm256_shuffle_epi8(a, ga), _mm256_shuffle_epi8(b, gb)), w);
        const __m256i bl = _mm256_madd_epi16(
            _mm256_or_si256(_mm256_shuffle_epi8(a, ba), _mm256_shuffle_epi8(b, bb)), w);
        const __m256i r4 = _mm256_srai_epi32(_mm256_add_epi32(r, rnd), 4);
        const __m256i g4 = _mm256_srai_epi32(_mm256_add_epi32(g, rnd), 4);
        const __m256i b4 = _mm256_srai_epi32(_mm256_add_epi32(bl, rnd), 4);
        /* [R0-3 G0-3 | R4-7 G4-7] -> [R0-7 | G0-7]; [B0-3 B0-3 | B4-7 B4-7] -> [B0-7 | .] */
        const __m256i rg = _mm256_permute4x64_epi64(_mm256_packs_epi32(r4, g4), 0xd8);
        const __m256i bv = _mm256_permute4x64_epi64(_mm256_packs_epi32(b4, b4), 0x08);
        _mm_storeu_si128((__m128i *)(void *)(h + x), _mm256_castsi256_si128(rg));
        _mm_storeu_si128((__m128i *)(void *)(h + wp + x), _mm256_extracti128_si256(rg, 1));
        _mm_storeu_si128((__m128i *)(void *)(h + 2 * (size_t)wp + x), _mm256_castsi256_si128(bv));
    }
}

/*
 * Four output pixels a step, interleaved: lanes hold the windows of pixels
 * [0, 1 | 2, 3]; one shuffle lays out the even pixel's taps as int16 pairs
 * (R, G, B, zero), another the odd one's, each multiplied by its pixel's
 * weight broadcast over the pairs. The result is h_sse2's: [R0 G0 B0 . R1 G1
 * B1 . | R2 G2 B2 . R3 G3 B3 .], stored with the same overlapping stores.
 */
AVX2_FN static void h_avx2_interleaved(int16_t *h, const unsigned char *row, const int32_t *xo,
                                       const uint32_t *xw, unsigned wp)
{
    const char Z = (char)0x80;
#define PIXEL(o) o, Z, o + 3, Z, o + 1, Z, o + 4, Z, o + 2, Z, o + 5, Z, Z, Z, Z, Z
    const __m256i even = _mm256_setr_epi8(PIXEL(0), PIXEL(0));
    const __m256i odd = _mm256_setr_epi8(PIXEL(8), PIXEL(8));
#undef PIXEL
    const __m256i we = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
    const __m256i wo = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
    const __m256i rnd = _mm256_set1_epi32(8);
    for (unsigned x = 0; x < wp; x += 4) {
        const __m256i p =
            _mm256_inserti128_si256(_mm256_castsi128_si256(windows2(row + xo[x], row + xo[x + 1])),
                                    windows2(row + xo[x + 2], row + xo[x + 3]), 1);
        const __m256i w =
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(xw + x)));
        const __m256i m0 =
            _mm256_madd_epi16(_mm256_shuffle_epi8(p, even), _mm256_permutevar8x32_epi32(w, we));
        const __m256i m1 =
            _mm256_madd_epi16(_mm256_shuffle_epi8(p, odd), _mm256_permutevar8x32_epi32(w, wo));
        const __m256i v = _mm256_packs_epi32(_mm256_srai_epi32(_mm256_add_epi32(m0, rnd), 4),
                                             _mm256_srai_epi32(_mm256_add_epi32(m1, rnd), 4));
        const __m128i v01 = _mm256_castsi256_si128(v), v23 = _mm256_extracti128_si256(v, 1);
        int16_t *q = h + 3 * (size_t)x;
        _mm_storel_epi64((__m128i *)(void *)q, v01);
        _mm_storel_epi64((__m128i *)(void *)(q + 3), _mm_srli_si128(v01, 8));
        _mm_storel_epi64((__m128i *)(void *)(q + 6), v23);
        _mm_storel_epi64((__m128i *)(void *)(q + 9), _mm_srli_si128(v23, 8));
    }
}

/* Sixteen values a step; the rest as v_sse2 does them, inlined here (see
 * v_sse2_steps). */
AVX2_FN static void v_avx2(unsigned char *dst, const int16_t *h0, const int16_t *h1, size_t n,
                           uint32_t wy)
{
    size_t i = 0;
    const __m256i wv = _mm256_set1_epi32((int)((SF__W_ONE - wy) | (wy << 16)));
    const __m256i rnd = _mm256_set1_epi32(1 << 17);
    for (; i + 16 <= n; i += 16) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(h0 + i));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(h1 + i));
        /* in-lane unpacks then in-lane packs: values 0-15 back in order */
        const __m256i lo = _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), wv);
        const __m256i hi = _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), wv);
        const __m256i v = _mm256_packs_epi32(_mm256_srai_epi32(_mm256_add_epi32(lo, rnd), 18),
                                             _mm256_srai_epi32(_mm256_add_epi32(hi, rnd), 18));
        const __m256i u = _mm256_permute4x64_epi64(_mm256_packus_epi16(v, v), 0x08);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm256_castsi256_si128(u));
    }
    i = v_sse2_steps(dst, h0, h1, i, n, wy);
    const uint32_t wy0 = SF__W_ONE - wy;
    for (; i < n; i++)
        dst[i] = (unsigned char)(((uint32_t)h0[i] * wy0 + (uint32_t)h1[i] * wy + (1u << 17)) >> 18);
}
#endif /* SF_HAVE_AVX2_TARGET */

/* ------------------------------------------------------------------ dispatch */

int sf__simd_available(enum sf__simd level)
{
    switch (level) {
    case SF__SIMD_C: return 1;
#if defined(__SSE2__)
    case SF__SIMD_SSE2: return 1;
#endif
#if defined(SF_HAVE_AVX2_TARGET)
    case SF__SIMD_AVX2: return __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    default: return 0;
    }
}

enum sf__simd sf__simd_best(void)
{
    if (sf__simd_available(SF__SIMD_AVX2))
        return SF__SIMD_AVX2;
    if (sf__simd_available(SF__SIMD_SSE2))
        return SF__SIMD_SSE2;
    return SF__SIMD_C;
}

void sf__resize_h(enum sf__simd level, int16_t *h, const unsigned char *row, const int32_t *xo,
                  const uint32_t *xw, unsigned wp, int planar)
{
    switch (level) {
#if defined(SF_HAVE_AVX2_TARGET)
    case SF__SIMD_AVX2:
        if (planar)
            h_avx2_planar(h, row, xo, xw, wp);
        else
            h_avx2_interleaved(h, row, xo, xw, wp);
        return;
#endif
#if defined(__SSE2__)
    case SF__SIMD_SSE2: h_sse2(h, row, xo, xw, wp, planar); return;
#endif
    default: h_c(h, row, xo, xw, wp, planar); return;
    }
}

void sf__resize_v(enum sf__simd level, unsigned char *dst, const int16_t *h0, const int16_t *h1,
                  size_t n, uint32_t wy)
{
    switch (level) {
#if defined(SF_HAVE_AVX2_TARGET)
    case SF__SIMD_AVX2: v_avx2(dst, h0, h1, n, wy); return;
#endif
#if defined(__SSE2__)
    case SF__SIMD_SSE2: v_sse2(dst, h0, h1, n, wy); return;
#endif
    default: v_c(dst, h0, h1, n, wy); return;
    }
}
