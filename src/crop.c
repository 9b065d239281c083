/*
 * The crop window and flip of each sample (docs/decode.md, "Crop window"):
 * the per-sample random stream, torchvision's RandomResizedCrop and
 * Resize + CenterCrop in source pixels, and the flip draw.
 *
 * Why this file has its own sqrt, exp and log (crop_sqrt & co.) although the
 * library links libm: the crop boxes are part of shardfeed's output, specified
 * bit for bit (docs/decode.md, with a Python reference; the tests pin values
 * that reference computed), and the same seed must give the same crops on
 * every machine, whatever libm it has (docs/DECISIONS.md, "Loader, decode,
 * GPU"). libm's exp and log are not correctly rounded and differ in the last
 * bit between libms and their versions; these are plain IEEE-754 double
 * arithmetic (fdlibm's schemes, within 1 ulp; sqrt correctly rounded), so they
 * give the same bits everywhere. round_even and floor_pos are Python's
 * round() and math.floor() for the non-negative values used here.
 */
#include "src/crop.h"

#include "src/sampler.h"

#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ per-sample randomness */

/* "sf/image" read as a little-endian uint64 (docs/decode.md, docs/sampling.md). */
#define SF__TAG_IMAGE 0x6567616d692f6673ULL

uint64_t sf__sample_rng_seed(uint64_t seed, uint64_t epoch, uint64_t shard, uint64_t sample)
{
    uint64_t h = sf__absorb64(SF__TAG_IMAGE, seed);
    h = sf__absorb64(h, epoch);
    h = sf__absorb64(h, shard);
    return sf__absorb64(h, sample);
}

/* A double in [0, 1) from the top 53 bits of one draw (Python:
 * (next() >> 11) * 2.0**-53). */
static double rng_uniform(struct sf__rng *r)
{
    return (double)(sf__rng_next(r) >> 11) * 0x1.0p-53;
}

/* ------------------------------------------------------------ math, same bits on any libm */

static double from_bits(uint64_t b)
{
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static uint64_t to_bits(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

/* 2^k for -1022 <= k <= 1023, exactly. */
static double pow2i(int k)
{
    return from_bits((uint64_t)(k + 1023) << 52);
}

/* floor(x) for 0 <= x < 2^63. */
static double floor_pos(double x)
{
    return (double)(uint64_t)x;
}

/* Python's round(x) for 0 <= x: nearest integer, ties to even. x - floor(x)
 * is exact for x < 2^52; from 2^52 on every double is an integer. */
static double round_even(double x)
{
    if (!(x < 0x1.0p52))
        return x;
    double f = floor_pos(x);
    double frac = x - f;
    if (frac > 0.5 || (frac == 0.5 && ((uint64_t)f & 1u)))
        f += 1.0;
    return f;
}

/*
 * Correctly rounded square root of a positive finite double (what IEEE sqrt
 * and Python's math.sqrt return): the integer square root of the 53-bit
 * significand shifted left by 64 has 59 or 60 bits; a non-zero remainder is
 * folded into its lowest bit (a sticky bit well below the rounding position),
 * so converting it to double rounds exactly as the real root would.
 */
static double crop_sqrt(double x)
{
    if (!(x > 0.0) || x > 0x1.0p1000)
        return x > 0.0 ? x : 0.0; /* not reached with the crop's arguments */
    uint64_t b = to_bits(x);
    int be = (int)(b >> 52);
    uint64_t m = b & ((1ULL << 52) - 1);
    int e;
    if (be == 0) { /* subnormal: normalise */
        e = -1074;
        while (!(m & (1ULL << 52))) {
            m <<= 1;
            e--;
        }
    } else {
        m |= 1ULL << 52;
        e = be - 1075;
    }
    if (e & 1) { /* make the exponent even */
        m <<= 1;
        e--;
    }
    unsigned __int128 n = (unsigned __int128)m << 64, root = 0;
    unsigned __int128 bit = (unsigned __int128)1 << 126;
    while (bit > n)
        bit >>= 2;
    while (bit) {
        if (n >= root + bit) {
            n -= root + bit;
            root = (root >> 1) + bit;
        } else {
            root >>= 1;
        }
        bit >>= 2;
    }
    uint64_t r = (uint64_t)root | (n != 0);
    return (double)r * pow2i((e - 64) / 2);
}

/* Natural logarithm of a positive normal double, within 1 ulp (fdlibm's
 * scheme): x = (1 + f) 2^k with 1 + f in [sqrt(1/2), sqrt(2)); s = f / (2 + f);
 * log(1 + f) = 2 atanh(s) = f - f^2/2 + s (f^2/2 + R), R = sum 2 s^2n / (2n+1)
 * to n = 12 (|s| < 0.172). */
static double crop_log(double x)
{
    static const double ln2_hi = 6.93147180369123816490e-01; /* ln 2 = hi + lo, */
    static const double ln2_lo = 1.90821492927058770002e-10; /* k hi exact */
    uint64_t b = to_bits(x);
    int k = (int)((b >> 52) & 0x7ff) - 1023;
    double m = from_bits((b & ((1ULL << 52) - 1)) | 0x3ff0000000000000ULL);
    if (m > 1.41421356237309504880) {
        m *= 0.5;
        k++;
    }
    double f = m - 1.0; /* exact */
    double s = f / (2.0 + f), z = s * s;
    double R = 0.0;
    for (int n = 12; n >= 1; n--)
        R = z * (2.0 / (2 * n + 1) + R);
    double hfsq = 0.5 * f * f;
    double dk = (double)k;
    return dk * ln2_hi - ((hfsq - (s * (hfsq + R) + dk * ln2_lo)) - f);
}

/* e^x for |x| <= 700, within 1 ulp (fdlibm's scheme): x = k ln2 + r,
 * |r| <= ln2/2, r = hi - lo; c = r - (r coth(r/2) - 2) by the Bernoulli series
 * of r coth(r/2) to r^12; e^r = 1 - ((lo - r c / (2 - c)) - hi); times 2^k. */
static double crop_exp(double x)
{
    static const double ln2_hi = 6.93147180369123816490e-01;
    static const double ln2_lo = 1.90821492927058770002e-10;
    static const double inv_ln2 = 1.44269504088896338700e+00;
    /* 2 B_2n / (2n)! for n = 1..6 */
    static const double P[6] = {1.0 / 6.0,       -1.0 / 360.0,     1.0 / 15120.0,
                                -1.0 / 604800.0, 1.0 / 23950080.0, -691.0 / 653837184000.0};
    if (x > 700.0)
        x = 700.0;
    if (x < -700.0)
        x = -700.0;
    double kd = x * inv_ln2;
    int k = (int)(kd < 0 ? kd - 0.5 : kd + 0.5);
    double hi = x - (double)k * ln2_hi, lo = (double)k * ln2_lo;
    double r = hi - lo, t = r * r;
    double q = 0.0;
    for (int n = 5; n >= 0; n--)
        q = P[n] + t * q;
    double c = r - t * q;
    double e = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    return e * pow2i(k);
}


/* ------------------------------------------------------------------ crop geometry */

/* uniform(a, b) = a + (b - a) * u, the float options widened to double. */
static double uniform(struct sf__rng *r, double a, double b)
{
    return a + (b - a) * rng_uniform(r);
}

/* A w x h box (at 0, 0) held to 1..W by 1..H; the caller places it. */
static struct sf__crop_box sized_box(double w, double h, unsigned W, unsigned H)
{
    if (w < 1.0)
        w = 1.0;
    if (h < 1.0)
        h = 1.0;
    if (w > (double)W)
        w = W;
    if (h > (double)H)
        h = H;
    struct sf__crop_box b = {0, 0, (unsigned)w, (unsigned)h};
    return b;
}

static struct sf__crop_box random_resized(const struct sf_image_options *o, unsigned W, unsigned H,
                                          struct sf__rng *rng)
{
    double area = (double)W * (double)H;
    double lmin = crop_log((double)o->ratio_min), lmax = crop_log((double)o->ratio_max);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * uniform(rng, (double)o->scale_min, (double)o->scale_max);
        double aspect = crop_exp(uniform(rng, lmin, lmax));
        double w = round_even(crop_sqrt(target * aspect));
        double h = round_even(crop_sqrt(target / aspect));
        if (w > 0.0 && w <= (double)W && h > 0.0 && h <= (double)H) {
            struct sf__crop_box b;
            b.w = (unsigned)w;
            b.h = (unsigned)h;
            b.y = (unsigned)sf__rng_below(rng, (uint64_t)(H - b.h) + 1);
            b.x = (unsigned)sf__rng_below(rng, (uint64_t)(W - b.w) + 1);
            return b;
        }
    }
    /* torchvision's fallback: the whole image, cut to the nearest allowed
     * ratio, centred. */
    double in_ratio = (double)W / (double)H;
    double w = W, h = H;
    if (in_ratio < (double)o->ratio_min)
        h = round_even((double)W / (double)o->ratio_min);
    else if (in_ratio > (double)o->ratio_max)
        w = round_even((double)H * (double)o->ratio_max);
    struct sf__crop_box b = sized_box(w, h, W, H);
    b.x = (W - b.w) / 2;
    b.y = (H - b.h) / 2;
    return b;
}

/* torchvision Resize(S) (shorter side to S = floor(max(width, height) /
 * center_fraction)) then CenterCrop(height, width), expressed in source
 * pixels: one resized pixel is short/S source pixels. */
static struct sf__crop_box center_box(const struct sf_image_options *o, unsigned W, unsigned H)
{
    unsigned side = o->width > o->height ? o->width : o->height;
    double S = floor_pos((double)side / (double)o->center_fraction);
    if (S < 1.0)
        S = 1.0;
    double per = (double)(W < H ? W : H) / S;
    double bw = round_even((double)o->width * per), bh = round_even((double)o->height * per);
    struct sf__crop_box b = sized_box(bw, bh, W, H);
    b.x = (unsigned)round_even((double)(W - b.w) / 2.0);
    b.y = (unsigned)round_even((double)(H - b.h) / 2.0);
    return b;
}

void sf__crop_window(const struct sf_image_options *o, unsigned src_w, unsigned src_h,
                     uint64_t rng_seed, struct sf__crop_box *box, int *flip)
{
    struct sf__rng rng = {rng_seed};
    struct sf__crop_box b = {0, 0, src_w, src_h};
    if (src_w > 0 && src_h > 0) {
        if (o->crop == SF_CROP_RANDOM_RESIZED)
            b = random_resized(o, src_w, src_h, &rng);
        else if (o->crop == SF_CROP_CENTER && o->width > 0 && o->height > 0)
            b = center_box(o, src_w, src_h);
    }
    /* Always drawn, so the flip is the same whatever hflip's value decides. */
    int f = rng_uniform(&rng) < (double)o->hflip;
    if (box)
        *box = b;
    if (flip)
        *flip = f;
}

