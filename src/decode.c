/*
 * Decode workers' JPEG path (docs/decode.md): image options, region +
 * DCT-scaled JPEG decode through the libjpeg API of libjpeg-turbo, bilinear
 * resize, flip, layout and normalisation into the batch slot. The crop
 * window comes from src/crop.c; labels and zstd fields are decoded in
 * src/decode_fields.c.
 *
 * One struct sf_decoder per thread. It owns a jpeg_decompress_struct (created
 * once, reset with jpeg_abort_decompress between images), the error, source
 * and progress managers that point back into it, a ZSTD_DCtx and scratch
 * buffers that only ever grow, so a worker in its steady state allocates
 * nothing itself (libjpeg's own per-image pools aside).
 */
#include "src/decode.h"
#include "src/gpu_kernel.h"
#include "src/resize.h"

#include "common/strbuf.h"

#include <zstd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

/* ------------------------------------------------------------------ options */

void sf__image_options_default(struct sf_image_options *o)
{
    memset(o, 0, sizeof *o);
    o->width = 224;
    o->height = 224;
    o->crop = SF_CROP_RANDOM_RESIZED;
    o->scale_min = 0.08f;
    o->scale_max = 1.0f;
    o->ratio_min = 3.0f / 4.0f;
    o->ratio_max = 4.0f / 3.0f;
    o->center_fraction = 0.875f;
    o->hflip = 0.5f;
    o->layout = SF_LAYOUT_CHW;
    o->dtype = SF_DTYPE_UINT8;
    o->mean[0] = 0.485f;
    o->mean[1] = 0.456f;
    o->mean[2] = 0.406f;
    o->std[0] = 0.229f;
    o->std[1] = 0.224f;
    o->std[2] = 0.225f;
    o->max_side = 16384;
    o->max_pixels = 64ULL << 20;
    o->max_scans = 64;
}

/* Output sides above this are refused: far beyond any training input, and it
 * keeps width x height x 12 far from overflowing. */
#define SF__MAX_OUTPUT_SIDE 65535u

static int finite_f(float v)
{
    return v == v && v - v == 0.0f;
}

sf_status sf__image_options_check(const struct sf_image_options *o, char *err, size_t err_len)
{
    const sf_status bad = SF_ERR_INVALID_ARGUMENT;
    if (!o)
        return sf__fail(err, err_len, bad, "image options are NULL");
    if (o->crop != SF_CROP_RANDOM_RESIZED && o->crop != SF_CROP_CENTER && o->crop != SF_CROP_NONE)
        return sf__fail(err, err_len, bad, "crop %d is not a crop mode", (int)o->crop);
    if ((o->width == 0) != (o->height == 0))
        return sf__fail(err, err_len, bad, "width %u and height %u: both or neither must be 0",
                        o->width, o->height);
    if (o->width == 0 && o->crop != SF_CROP_NONE)
        return sf__fail(err, err_len, bad,
                        "width and height 0 (keep the image size) need crop \"none\"");
    if (o->width > SF__MAX_OUTPUT_SIDE || o->height > SF__MAX_OUTPUT_SIDE)
        return sf__fail(err, err_len, bad, "width %u x height %u: each must be at most %u",
                        o->width, o->height, SF__MAX_OUTPUT_SIDE);
    if (!finite_f(o->scale_min) || !finite_f(o->scale_max) || !(o->scale_min > 0.0f) ||
        o->scale_max < o->scale_min || o->scale_max > 1e6f)
        return sf__fail(err, err_len, bad,
                        "scale_min %g, scale_max %g: need 0 < scale_min <= scale_max",
                        (double)o->scale_min, (double)o->scale_max);
    if (!finite_f(o->ratio_min) || !finite_f(o->ratio_max) || !(o->ratio_min >= 1e-6f) ||
        o->ratio_max < o->ratio_min || o->ratio_max > 1e6f)
        return sf__fail(err, err_len, bad,
                        "ratio_min %g, ratio_max %g: need 1e-6 <= ratio_min <= ratio_max <= 1e6",
                        (double)o->ratio_min, (double)o->ratio_max);
    if (!finite_f(o->center_fraction) || !(o->center_fraction > 0.0f) || o->center_fraction > 1.0f)
        return sf__fail(err, err_len, bad, "center_fraction %g must be in (0, 1]",
                        (double)o->center_fraction);
    if (!finite_f(o->hflip) || o->hflip < 0.0f || o->hflip > 1.0f)
        return sf__fail(err, err_len, bad, "hflip %g must be in [0, 1]", (double)o->hflip);
    if (o->layout != SF_LAYOUT_CHW && o->layout != SF_LAYOUT_HWC)
        return sf__fail(err, err_len, bad, "layout %d is not a layout", (int)o->layout);
    if (o->dtype != SF_DTYPE_UINT8 && o->dtype != SF_DTYPE_FLOAT32)
        return sf__fail(err, err_len, bad, "dtype %d is not a dtype", (int)o->dtype);
    for (int c = 0; c < 3; c++) {
        if (!finite_f(o->mean[c]))
            return sf__fail(err, err_len, bad, "mean[%d] %g is not finite", c, (double)o->mean[c]);
        if (!finite_f(o->std[c]) || o->std[c] == 0.0f)
            return sf__fail(err, err_len, bad, "std[%d] %g must be finite and non-zero", c,
                            (double)o->std[c]);
    }
    if (o->max_side == 0 || o->max_side > JPEG_MAX_DIMENSION)
        return sf__fail(err, err_len, bad, "max_side %u must be in 1..%u", o->max_side,
                        (unsigned)JPEG_MAX_DIMENSION);
    if (o->max_pixels == 0)
        return sf__fail(err, err_len, bad, "max_pixels must be at least 1");
    if (o->max_scans == 0)
        return sf__fail(err, err_len, bad, "max_scans must be at least 1");
    return SF_OK;
}

size_t sf__image_bytes(const struct sf_image_options *o)
{
    size_t elem = o->dtype == SF_DTYPE_FLOAT32 ? sizeof(float) : 1;
    return (size_t)o->width * o->height * 3 * elem;
}

/* ------------------------------------------------------------------ decoder */

/* DCT scales M/8 the region decode may use. Measured (docs/decode.md): the
 * non-power-of-two scales of libjpeg-turbo 2.1.5 have no SIMD IDCT and are
 * slower than the next power of two up, so only these are used. */
static const unsigned scale_choices[] = {1, 2, 4, 8};

#define W_ONE SF__W_ONE

/* Rows/columns decoded beyond the ones the resize reads, so that the pixels
 * used never sit at the edge of the decoded region, where fancy upsampling
 * replicates chroma instead of reading the neighbour. */
#define REGION_MARGIN 2u

struct sf_decoder {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr jerr;
    struct jpeg_source_mgr src;
    struct jpeg_progress_mgr progress;
    jmp_buf jmp;
    int cinfo_ready;

    /* The image being decoded. */
    const unsigned char *data;
    size_t size;
    int src_eof;
    unsigned max_scans;
    /* Set by raise_() just before the longjmp. */
    sf_status fail_status;
    char msg[JMSG_LENGTH_MAX + 160];

    /* Scratch, grown and reused. */
    unsigned char *win; /* resize rows: two horizontal (int16), one output (bytes) */
    size_t win_cap;
    unsigned char *line; /* one decoded line (CMYK), then the same line as RGB */
    size_t line_cap;
    int32_t *tab; /* resize tables: x, y (i0, i1, w), x taps (offset), x weights */
    size_t tab_cap;

    /* dtype float32: lut[c][v] = (v / 255 - mean[c]) / std[c], for lut_mean/std. */
    float lut[3][256];
    float lut_mean[3], lut_std[3];
    int lut_ok;

    ZSTD_DCtx *zstd;
    enum sf__simd simd; /* the resize kernels': the CPU's best unless a test sets it */
};

static struct sf_decoder *decoder_of(j_common_ptr c)
{
    return (struct sf_decoder *)(void *)((char *)c - offsetof(struct sf_decoder, cinfo));
}

static size_t input_offset(const struct sf_decoder *d)
{
    if (d->src_eof || !d->src.next_input_byte)
        return d->size;
    return (size_t)(d->src.next_input_byte - d->data);
}

static _Noreturn void raise_(struct sf_decoder *d, sf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static _Noreturn void raise_(struct sf_decoder *d, sf_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    va_end(ap);
    d->fail_status = st;
    longjmp(d->jmp, 1);
}

static sf_status status_of_jpeg_error(int code)
{
    switch (code) {
    case JERR_OUT_OF_MEMORY: return SF_ERR_NO_MEMORY;
    case JERR_BAD_PRECISION:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_NOT_COMPILED:
    case JERR_NOTIMPL:
    case JERR_SOF_UNSUPPORTED:
    case JERR_ARITH_NOTIMPL:
    case JERR_NO_SOI: return SF_ERR_UNSUPPORTED;
    case JERR_NO_BACKING_STORE:
    case JERR_IMAGE_TOO_BIG:
    case JERR_WIDTH_OVERFLOW: return SF_ERR_LIMIT;
    default: return SF_ERR_CORRUPT;
    }
}

/* libjpeg's error_exit, and its warnings: both end the decode. */
static _Noreturn void jpeg_fail(j_common_ptr c, int warning)
{
    struct sf_decoder *d = decoder_of(c);
    char text[JMSG_LENGTH_MAX];
    (*c->err->format_message)(c, text);
    sf_status st = warning ? SF_ERR_CORRUPT : status_of_jpeg_error(c->err->msg_code);
    const char *what = st == SF_ERR_UNSUPPORTED ? "unsupported JPEG"
                       : st == SF_ERR_LIMIT     ? "JPEG over a libjpeg limit"
                       : st == SF_ERR_NO_MEMORY ? "out of memory decoding a JPEG"
                                                : "bad JPEG";
    raise_(d, st, "%s at byte %zu of %zu: %s%s", what, input_offset(d), d->size, text,
           warning ? " (a libjpeg warning, treated as an error)" : "");
}

static void on_error_exit(j_common_ptr c)
{
    jpeg_fail(c, 0);
}

/* The two warnings about headers, not data: a JFIF APP0 version other than
 * 1.x (only the marker's metadata is affected) and sequential-scan SOS
 * parameters other than 0, 63, 0, 0 (which the sequential decoders never
 * read: the pixels are the same). Both come from real encoders, on images
 * every other decoder shows; every other warning is damage. */
static int warning_is_benign(int code)
{
    return code == JWRN_JFIF_MAJOR || code == JWRN_NOT_SEQUENTIAL;
}

static void on_emit_message(j_common_ptr c, int level)
{
    /* a warning: the data is corrupt but libjpeg would go on */
    if (level < 0 && !warning_is_benign(c->err->msg_code))
        jpeg_fail(c, 1);
    /* benign warnings and level >= 0 (trace messages): ignored */
}

static void on_output_message(j_common_ptr c)
{
    (void)c; /* the library never prints */
}

static void on_progress(j_common_ptr c)
{
    struct sf_decoder *d = decoder_of(c);
    if (d->cinfo.input_scan_number > (int)d->max_scans)
        raise_(d, SF_ERR_LIMIT, "JPEG at byte %zu of %zu has more than %u scans (max_scans)",
               input_offset(d), d->size, d->max_scans);
}

/* Source manager over the image bytes: like jpeg_mem_src, but it knows where
 * it is (for messages), and running out of data is a libjpeg warning, which
 * on_emit_message turns into an error. */
static void src_init(j_decompress_ptr c)
{
    (void)c;
}

static boolean src_fill(j_decompress_ptr c)
{
    static const JOCTET fake_eoi[2] = {0xFF, JPEG_EOI};
    struct sf_decoder *d = decoder_of((j_common_ptr)c);
    d->src_eof = 1;
    WARNMS(c, JWRN_JPEG_EOF);
    /* Not reached (the warning raises); libjpeg's own recovery otherwise. */
    c->src->next_input_byte = fake_eoi;
    c->src->bytes_in_buffer = 2;
    return TRUE;
}

static void src_skip(j_decompress_ptr c, long n)
{
    struct jpeg_source_mgr *s = c->src;
    if (n <= 0)
        return;
    while ((size_t)n > s->bytes_in_buffer) {
        n -= (long)s->bytes_in_buffer;
        (void)(*s->fill_input_buffer)(c);
    }
    s->next_input_byte += n;
    s->bytes_in_buffer -= (size_t)n;
}

static void src_term(j_decompress_ptr c)
{
    (void)c;
}

sf_status sf__decoder_new(struct sf_decoder **out)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    struct sf_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return SF_ERR_NO_MEMORY;
    d->cinfo.err = jpeg_std_error(&d->jerr);
    d->jerr.error_exit = on_error_exit;
    d->jerr.emit_message = on_emit_message;
    d->jerr.output_message = on_output_message;
    if (setjmp(d->jmp)) { /* jpeg_create_decompress ran out of memory */
        free(d);
        return SF_ERR_NO_MEMORY;
    }
    jpeg_create_decompress(&d->cinfo);
    d->cinfo_ready = 1;
    d->src.init_source = src_init;
    d->src.fill_input_buffer = src_fill;
    d->src.skip_input_data = src_skip;
    d->src.resync_to_restart = jpeg_resync_to_restart;
    d->src.term_source = src_term;
    d->progress.progress_monitor = on_progress;
    d->simd = sf__simd_best();
    d->zstd = ZSTD_createDCtx();
    if (!d->zstd) {
        sf__decoder_destroy(d);
        return SF_ERR_NO_MEMORY;
    }
    *out = d;
    return SF_OK;
}

void sf__decoder_destroy(struct sf_decoder *d)
{
    if (!d)
        return;
    if (d->cinfo_ready)
        jpeg_destroy_decompress(&d->cinfo);
    ZSTD_freeDCtx(d->zstd);
    free(d->win);
    free(d->line);
    free(d->tab);
    free(d);
}

sf_status sf__decoder_set_simd(struct sf_decoder *d, enum sf__simd level)
{
    if (!d || !sf__simd_available(level))
        return SF_ERR_UNSUPPORTED;
    d->simd = level;
    return SF_OK;
}

ZSTD_DCtx *sf__decoder_zstd(struct sf_decoder *d)
{
    return d->zstd;
}

/* Grows *buf to at least n bytes (raises SF_ERR_NO_MEMORY). */
static void *grow(struct sf_decoder *d, void **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return *buf;
    size_t want = n + n / 4;
    void *p = realloc(*buf, want);
    if (!p)
        raise_(d, SF_ERR_NO_MEMORY, "out of memory for a %zu-byte decode buffer", want);
    *buf = p;
    *cap = want;
    return p;
}

static void build_lut(struct sf_decoder *d, const float mean[3], const float std[3])
{
    if (d->lut_ok && !memcmp(d->lut_mean, mean, sizeof d->lut_mean) &&
        !memcmp(d->lut_std, std, sizeof d->lut_std))
        return;
    for (int c = 0; c < 3; c++)
        for (unsigned v = 0; v < 256; v++)
            d->lut[c][v] = sf_k_norm(v, mean[c], std[c]);
    memcpy(d->lut_mean, mean, sizeof d->lut_mean);
    memcpy(d->lut_std, std, sizeof d->lut_std);
    d->lut_ok = 1;
}

/* Where finished output rows go: one RGB row (width x 3) at a time. */
struct emitter {
    unsigned char *out;
    unsigned width, height;
    enum sf_layout layout;
    enum sf_dtype dtype;
    const float (*lut)[256];
    enum sf__simd simd; /* the resize kernels' level */
};

static void put_f32(unsigned char *out, size_t index, float v)
{
    memcpy(out + index * sizeof v, &v, sizeof v); /* out has any alignment */
}

/* Writes RGB row `rgb` (width pixels) as output row y; reverse mirrors it. */
static void emit_row(const struct emitter *e, unsigned y, const unsigned char *rgb, int reverse)
{
    const unsigned W = e->width;
    const size_t plane = (size_t)W * e->height;
    const size_t row = (size_t)y * W;
    if (e->dtype == SF_DTYPE_UINT8 && e->layout == SF_LAYOUT_HWC) {
        unsigned char *dst = e->out + row * 3;
        if (!reverse) {
            memcpy(dst, rgb, (size_t)W * 3);
            return;
        }
        for (unsigned x = 0; x < W; x++) {
            const unsigned char *s = rgb + (size_t)(W - 1 - x) * 3;
            dst[3 * x] = s[0];
            dst[3 * x + 1] = s[1];
            dst[3 * x + 2] = s[2];
        }
        return;
    }
    if (e->dtype == SF_DTYPE_UINT8) {
        unsigned char *r = e->out + row, *g = r + plane, *b = g + plane;
        for (unsigned x = 0; x < W; x++) {
            const unsigned char *s = rgb + (size_t)(reverse ? W - 1 - x : x) * 3;
            r[x] = s[0];
            g[x] = s[1];
            b[x] = s[2];
        }
        return;
    }
    for (unsigned x = 0; x < W; x++) {
        const unsigned char *s = rgb + (size_t)(reverse ? W - 1 - x : x) * 3;
        for (unsigned c = 0; c < 3; c++) {
            size_t at = e->layout == SF_LAYOUT_HWC ? (row + x) * 3 + c : c * plane + row + x;
            put_f32(e->out, at, e->lut[c][s[c]]);
        }
    }
}

/* CMYK (4 bytes a pixel) to RGB. Adobe files (the usual CMYK JPEG, from
 * Photoshop) store the inks inverted; as PIL does, R = C' K' / 255 there and
 * (255 - C)(255 - K) / 255 otherwise. */
static void cmyk_to_rgb(const unsigned char *src, unsigned char *dst, unsigned n, int inverted)
{
    for (unsigned i = 0; i < n; i++, src += 4, dst += 3) {
        unsigned k = inverted ? src[3] : 255u - src[3];
        for (int c = 0; c < 3; c++) {
            unsigned v = inverted ? src[c] : 255u - src[c];
            dst[c] = (unsigned char)((v * k + 127) / 255);
        }
    }
}

/* Reads the next scanline (cw pixels) as RGB into dst. */
static void read_line(struct sf_decoder *d, unsigned char *dst, unsigned cw)
{
    struct jpeg_decompress_struct *ci = &d->cinfo;
    int cmyk = ci->out_color_space == JCS_CMYK;
    JSAMPROW p = cmyk ? d->line : dst;
    if (jpeg_read_scanlines(ci, &p, 1) != 1)
        raise_(d, SF_ERR_INTERNAL, "libjpeg returned no scanline at row %u of %u",
               ci->output_scanline, ci->output_height);
    if (cmyk)
        cmyk_to_rgb(d->line, dst, cw, ci->saw_Adobe_marker);
}

/* Restricts decoding to columns [c0, c1] and moves to row r0: returns the
 * first decoded column (jpeg_crop_scanline widens left to an iMCU boundary)
 * and the decoded width in *cw. */
static unsigned set_region(struct sf_decoder *d, unsigned c0, unsigned c1, unsigned r0,
                           unsigned *cw)
{
    struct jpeg_decompress_struct *ci = &d->cinfo;
    JDIMENSION xoff = c0, width = c1 - c0 + 1;
    if (width < ci->output_width)
        jpeg_crop_scanline(ci, &xoff, &width);
    if (r0 > 0 && jpeg_skip_scanlines(ci, r0) != r0)
        raise_(d, SF_ERR_INTERNAL, "libjpeg skipped fewer than %u rows", r0);
    *cw = width;
    return xoff;
}

static unsigned umin(unsigned a, unsigned b)
{
    return a < b ? a : b;
}

/*
 * Sample positions for one axis: output pixel i of n reads scaled pixels
 * i0, i1 (relative to the decoded region's first pixel, region_lo) with
 * weight w/2048 for i1. Box [lo, lo + len) in full-resolution pixels, s =
 * M/8: src = lo s + (i + 0.5) len s / n - 0.5, clamped to [lo s, (lo + len) s
 * - 1] (the pixel centres inside the box), like a crop then
 * upsample_bilinear2d(align_corners=False).
 */
static void axis_table(int32_t *t, unsigned n, unsigned lo, unsigned len, unsigned M,
                       unsigned limit, int reverse)
{
    double s = (double)M / 8.0;
    double step = (double)len * s / (double)n;
    double first = (double)lo * s, last = (double)(lo + len) * s - 1.0;
    if (last < first)
        last = first;
    for (unsigned i = 0; i < n; i++) {
        double f = first + ((double)i + 0.5) * step - 0.5;
        if (f < first)
            f = first;
        if (f > last)
            f = last;
        double fl = (double)(uint64_t)f; /* floor: f >= 0 */
        unsigned i0 = (unsigned)fl;
        int w = (int)((f - fl) * W_ONE + 0.5);
        if (w >= W_ONE) {
            i0++;
            w = 0;
        }
        if (i0 > limit)
            i0 = limit;
        unsigned i1 = i0 + 1 <= limit ? i0 + 1 : i0;
        int32_t *e = t + 3 * (size_t)(reverse ? n - 1 - i : i);
        e[0] = (int32_t)i0;
        e[1] = (int32_t)i1;
        e[2] = w;
    }
}

/*
 * The bilinear resize, separable and streamed: each decoded row an output
 * row needs goes once through the horizontal pass into 16-bit values, and
 * an output row is two such rows blended, written straight into its place
 * in the batch slot (plane by plane for CHW). The per-row kernels, with
 * their exact arithmetic, are in src/resize.c. Per output pixel the x table
 * holds the byte offset of its left source pixel in the decoded row and the
 * packed weights (2048 - wx) | wx << 16; where the box edge clamps both taps
 * to one pixel the weight of the right one is 0 (the same value). The table
 * has W rounded up to SF__RESIZE_STEP entries (copies of the last), the
 * decoded row SF__RESIZE_ROW_PAD bytes of padding.
 */

/* Output row y of e from horizontal rows h0, h1 (wp values a plane); tmp:
 * 3 wp bytes for float32 output. */
static void resize_out(const struct emitter *e, unsigned y, const int16_t *h0, const int16_t *h1,
                       uint32_t wy, unsigned wp, unsigned char *tmp)
{
    const unsigned W = e->width;
    const size_t plane = (size_t)W * e->height, row = (size_t)y * W;
    const int planar = e->layout == SF_LAYOUT_CHW;
    if (e->dtype == SF_DTYPE_UINT8) {
        if (!planar) {
            sf__resize_v(e->simd, e->out + row * 3, h0, h1, (size_t)W * 3, wy);
            return;
        }
        for (unsigned c = 0; c < 3; c++)
            sf__resize_v(e->simd, e->out + c * plane + row, h0 + c * (size_t)wp,
                         h1 + c * (size_t)wp, W, wy);
        return;
    }
    if (!planar) {
        sf__resize_v(e->simd, tmp, h0, h1, (size_t)W * 3, wy);
        for (size_t i = 0; i < (size_t)W * 3; i++)
            put_f32(e->out, row * 3 + i, e->lut[i % 3][tmp[i]]);
        return;
    }
    for (unsigned c = 0; c < 3; c++) {
        sf__resize_v(e->simd, tmp, h0 + c * (size_t)wp, h1 + c * (size_t)wp, W, wy);
        for (unsigned x = 0; x < W; x++)
            put_f32(e->out, c * plane + row + x, e->lut[c][tmp[x]]);
    }
}

/* When the window reaches the image's last row, the rows the resize did not
 * need below it (a downscale samples above the edge) are read too, into
 * `line` (cw pixels), and then the rest of the stream up to EOI, so that
 * trailing damage (a cut, extraneous bytes, a missing EOI) is an error. The
 * rows are read, not skipped: jpeg_skip_scanlines() to the end marks the EOI
 * reached without reading it. Otherwise the caller aborts: rows after the
 * window are never decoded. */
static void finish_if_complete(struct sf_decoder *d, int reaches_bottom, unsigned char *line,
                               unsigned cw)
{
    struct jpeg_decompress_struct *ci = &d->cinfo;
    if (reaches_bottom)
        while (ci->output_scanline < ci->output_height)
            read_line(d, line, cw);
    if (ci->output_scanline == ci->output_height)
        jpeg_finish_decompress(ci);
}

static unsigned choose_scale(const struct sf__crop_box *b, unsigned ow, unsigned oh)
{
    for (size_t i = 0; i < sizeof scale_choices / sizeof scale_choices[0]; i++) {
        unsigned M = scale_choices[i];
        if ((uint64_t)b->w * M >= 8ull * ow && (uint64_t)b->h * M >= 8ull * oh)
            return M;
    }
    return 8;
}

/* Everything between jpeg_read_header and the last row; errors raise. */
static void decode_body(struct sf_decoder *d, const struct sf_image_options *o, uint64_t rng_seed,
                        unsigned char *out, struct sf__decode_info *info)
{
    struct jpeg_decompress_struct *ci = &d->cinfo;
    jpeg_read_header(ci, TRUE);
    const unsigned W = ci->image_width, H = ci->image_height;
    info->src_width = W;
    info->src_height = H;
    info->progressive = ci->progressive_mode ? 1 : 0;
    if (W > o->max_side || H > o->max_side)
        raise_(d, SF_ERR_LIMIT, "JPEG is %ux%u, a side over max_side %u", W, H, o->max_side);
    if ((uint64_t)W * H > o->max_pixels)
        raise_(d, SF_ERR_LIMIT, "JPEG is %ux%u = %llu pixels, over max_pixels %llu", W, H,
               (unsigned long long)W * H, (unsigned long long)o->max_pixels);

    int cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
    ci->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
    /* djpeg's defaults, so a full-size decode is byte-identical to it. */
    ci->dct_method = JDCT_ISLOW;
    ci->do_fancy_upsampling = TRUE;
    ci->do_block_smoothing = TRUE;
    ci->quantize_colors = FALSE;

    struct sf__crop_box box;
    int flip;
    sf__crop_window(o, W, H, rng_seed, &box, &flip);
    const unsigned ow = o->width ? o->width : box.w, oh = o->height ? o->height : box.h;
    const unsigned M = choose_scale(&box, ow, oh);
    info->box = box;
    info->flipped = flip;
    info->scale_num = M;
    ci->scale_num = M;
    ci->scale_denom = 8;

    jpeg_start_decompress(ci); /* multi-scan files are entropy-decoded here */
    const unsigned sw = ci->output_width, sh = ci->output_height;
    const unsigned nch = cmyk ? 4 : 3;
    if ((unsigned)ci->output_components != nch)
        raise_(d, SF_ERR_INTERNAL, "libjpeg gives %d components, expected %u",
               ci->output_components, nch);

    struct emitter e = {out, ow, oh, o->layout, o->dtype, NULL, d->simd};
    if (o->dtype == SF_DTYPE_FLOAT32) {
        build_lut(d, o->mean, o->std);
        e.lut = (const float(*)[256])d->lut;
    }

    if (M == 8 && box.w == ow && box.h == oh) {
        /* No resize: the decoded pixels themselves (djpeg's, for the whole
         * image), mirrored when flipped. */
        unsigned c0 = box.x > REGION_MARGIN ? box.x - REGION_MARGIN : 0;
        unsigned c1 = umin(box.x + box.w - 1 + REGION_MARGIN, sw - 1);
        unsigned r0 = box.y > REGION_MARGIN ? box.y - REGION_MARGIN : 0;
        unsigned cw;
        unsigned xoff = set_region(d, c0, c1, r0, &cw);
        grow(d, (void **)&d->line, &d->line_cap, (size_t)cw * (nch + 3));
        unsigned char *rgb = d->line + (size_t)cw * nch;
        const int straight = o->dtype == SF_DTYPE_UINT8 && o->layout == SF_LAYOUT_HWC && !flip &&
                             xoff == box.x && cw == box.w;
        for (unsigned y = r0; y < box.y + box.h; y++) {
            if (y < box.y) {
                read_line(d, rgb, cw);
                continue;
            }
            if (straight) {
                read_line(d, out + (size_t)(y - box.y) * ow * 3, cw);
                continue;
            }
            read_line(d, rgb, cw);
            emit_row(&e, y - box.y, rgb + (size_t)(box.x - xoff) * 3, flip);
        }
        finish_if_complete(d, box.y + box.h == H, rgb, cw);
        return;
    }

    /* Resize: sample positions first (they say which region to decode),
     * then the region, row by row, each row resized as it arrives. */
    const unsigned wp = sf__resize_pad(ow);
    int32_t *t = grow(d, (void **)&d->tab, &d->tab_cap,
                      sizeof(int32_t) * (3 * ((size_t)ow + oh) + 2 * (size_t)wp));
    int32_t *xt = t, *yt = t + 3 * (size_t)ow, *xo = yt + 3 * (size_t)oh;
    uint32_t *xw = (uint32_t *)(void *)(xo + wp);
    axis_table(xt, ow, box.x, box.w, M, sw - 1, flip);
    axis_table(yt, oh, box.y, box.h, M, sh - 1, 0);
    const int32_t *xfirst = flip ? xt + 3 * (size_t)(ow - 1) : xt;
    const int32_t *xlast = flip ? xt : xt + 3 * (size_t)(ow - 1);
    unsigned c0 = (unsigned)xfirst[0], c1 = (unsigned)xlast[1];
    unsigned r0 = (unsigned)yt[0], r1 = (unsigned)yt[3 * (size_t)(oh - 1) + 1];
    c0 = c0 > REGION_MARGIN ? c0 - REGION_MARGIN : 0;
    c1 = umin(c1 + REGION_MARGIN, sw - 1);
    r0 = r0 > REGION_MARGIN ? r0 - REGION_MARGIN : 0;
    unsigned cw;
    unsigned xoff = set_region(d, c0, c1, r0, &cw);
    for (unsigned i = 0; i < wp; i++) { /* byte offset of the left tap, packed weights */
        const int32_t *x = xt + 3 * (size_t)(i < ow ? i : ow - 1);
        const uint32_t w = x[1] == x[0] ? 0 : (uint32_t)x[2];
        xo[i] = (x[0] - (int32_t)xoff) * 3;
        xw[i] = (W_ONE - w) | w << 16;
    }
    for (unsigned i = 0; i < oh; i++) {
        yt[3 * i] -= (int32_t)r0;
        yt[3 * i + 1] -= (int32_t)r0;
    }
    const int planar = o->layout == SF_LAYOUT_CHW;
    const size_t hn = 3 * (size_t)wp + SF__RESIZE_HPAD;
    /* line: the CMYK scanline, then the RGB one (+ padding: 8-byte tap loads);
     * win: two horizontal rows, then a byte row for float32 output. */
    unsigned char *line =
        grow(d, (void **)&d->line, &d->line_cap, (size_t)cw * (nch + 3) + SF__RESIZE_ROW_PAD);
    unsigned char *rgb = line + (size_t)cw * nch;
    memset(rgb + (size_t)cw * 3, 0, SF__RESIZE_ROW_PAD);
    int16_t *h = grow(d, (void **)&d->win, &d->win_cap, 2 * hn * sizeof(int16_t) + 3 * (size_t)wp);
    unsigned char *tmp = (unsigned char *)(h + 2 * hn);
    const unsigned rows = r1 - r0 + 1;
    unsigned y = 0; /* the next output row: it reads rows yt[3y] and yt[3y + 1] */
    for (unsigned r = 0; r < rows; r++) {
        read_line(d, rgb, cw);
        /* Rows r - 1 and r are kept (in the slots of their parity): the
         * output rows still to come read nothing older. */
        if (y < oh && ((unsigned)yt[3 * y] == r || (unsigned)yt[3 * y + 1] == r))
            sf__resize_h(d->simd, h + (r & 1) * hn, rgb, xo, xw, wp, planar);
        for (; y < oh && (unsigned)yt[3 * y + 1] == r; y++)
            resize_out(&e, y, h + ((unsigned)yt[3 * y] & 1) * hn, h + (r & 1) * hn,
                       (uint32_t)yt[3 * y + 2], wp, tmp);
    }
    finish_if_complete(d, box.y + box.h == H, rgb, cw);
}

/* The setjmp frame: nothing here changes between setjmp and a longjmp. */
static sf_status run_decode(struct sf_decoder *d, const struct sf_image_options *o,
                            uint64_t rng_seed, unsigned char *out, struct sf__decode_info *info,
                            char *err, size_t err_len)
{
    if (setjmp(d->jmp)) {
        jpeg_abort_decompress(&d->cinfo);
        return sf__fail(err, err_len, d->fail_status, "%s", d->msg);
    }
    decode_body(d, o, rng_seed, out, info);
    /* Rows after the window are never decoded: abort, not finish. */
    jpeg_abort_decompress(&d->cinfo);
    return SF_OK;
}

/* What the first bytes look like, for the message about a non-JPEG. */
static const char *sniff(const unsigned char *p, size_t n)
{
    if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
        return "PNG";
    if (n >= 6 && (!memcmp(p, "GIF87a", 6) || !memcmp(p, "GIF89a", 6)))
        return "GIF";
    if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4))
        return "WebP";
    if (n >= 2 && p[0] == 'B' && p[1] == 'M')
        return "BMP";
    if (n >= 4 && (!memcmp(p, "II*\0", 4) || !memcmp(p, "MM\0*", 4)))
        return "TIFF";
    if (n >= 12 && !memcmp(p + 4, "ftyp", 4))
        return "ISO media (HEIF/AVIF/MP4)";
    if (n >= 4 && !memcmp(p, "\x28\xb5\x2f\xfd", 4))
        return "zstd";
    return "unknown";
}

sf_status sf__decode_jpeg(struct sf_decoder *d, const struct sf_image_options *o, const void *data,
                          size_t size, uint64_t rng_seed, void *out, struct sf__decode_info *info,
                          char *err, size_t err_len)
{
    struct sf__decode_info scratch_info;
    if (!info)
        info = &scratch_info;
    memset(info, 0, sizeof *info);
    if (!d || !o || (!data && size) || !out)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "sf__decode_jpeg: decoder, options, data or out is NULL");
    sf_status st = sf__image_options_check(o, err, err_len);
    if (st != SF_OK)
        return st;
    const unsigned char *p = data;
    if (size == 0)
        return sf__fail(err, err_len, SF_ERR_CORRUPT, "image data is empty (0 bytes)");
    if (size < 2 || p[0] != 0xFF || p[1] != 0xD8)
        return sf__fail(err, err_len, SF_ERR_UNSUPPORTED,
                        "not a JPEG (no SOI marker; first bytes %02x %02x, looks like %s), %zu "
                        "bytes",
                        p[0], size > 1 ? p[1] : 0u, sniff(p, size), size);

    d->data = p;
    d->size = size;
    d->src_eof = 0;
    d->max_scans = o->max_scans;
    d->src.next_input_byte = p;
    d->src.bytes_in_buffer = size;
    d->cinfo.src = &d->src;
    d->cinfo.progress = &d->progress;
    d->fail_status = SF_OK;
    return run_decode(d, o, rng_seed, out, info, err, err_len);
}

/* ------------------------------------------------------------------ normalisation */

void sf__normalize_u8(const uint8_t *src, float *dst, size_t n_images, unsigned width,
                      unsigned height, enum sf_layout layout, const float mean[3],
                      const float std[3])
{
    /* The device kernel's own arithmetic (gpu_kernel.h): the same bits. */
    float lut[3][256];
    for (int c = 0; c < 3; c++)
        for (unsigned v = 0; v < 256; v++)
            lut[c][v] = sf_k_norm(v, mean[c], std[c]);
    const size_t plane = (size_t)width * height;
    for (size_t img = 0; img < n_images; img++) {
        const uint8_t *s = src + img * plane * 3;
        float *o = dst + img * plane * 3;
        if (layout == SF_LAYOUT_HWC) {
            for (size_t i = 0; i < plane; i++)
                for (int c = 0; c < 3; c++)
                    o[3 * i + c] = lut[c][s[3 * i + c]];
        } else {
            for (int c = 0; c < 3; c++)
                for (size_t i = 0; i < plane; i++)
                    o[c * plane + i] = lut[c][s[c * plane + i]];
        }
    }
}
