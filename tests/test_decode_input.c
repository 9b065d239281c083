/* Decoding untrusted input: corrupt JPEGs fail with a message, size and
 * scan limits hold before any pixel, options are checked; labels and zstd
 * fields. Suite `decode` (test_decode.c). */
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

/* ------------------------------------------------------------------ bad input, limits */

Test(decode, corrupt_input_fails_with_a_message)
{
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, 0, 30);
    struct sf_image_options full = opts(SF_CROP_NONE, 333, 251, SF_LAYOUT_HWC);
    char err[256];
    unsigned char *buf = malloc(j.size + 64);
    size_t sos = first_sos(&j);

    /* Truncated in the headers, in the entropy data, just before EOI. */
    size_t cuts[] = {2, 20, sos, sos + 20, j.size / 3, j.size / 2, j.size - 100, j.size - 2};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        memcpy(buf, j.data, cuts[k]);
        sf_status st = try_decode(dec, &full, buf, cuts[k], err, sizeof err);
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
    cr_assert_eq(try_decode(dec, &full, buf, j.size, err, sizeof err), SF_ERR_CORRUPT);
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
        sf_status st = try_decode(dec, &full, buf, j.size, err, sizeof err);
        cr_assert(st == SF_OK || st == SF_ERR_CORRUPT, "%s", sf_status_name(st));
        if (st != SF_OK) {
            caught++;
            cr_assert(err[0] != '\0');
        }
        /* the region path on the same data */
        struct sf_image_options rrc = opts(SF_CROP_RANDOM_RESIZED, 64, 64, SF_LAYOUT_CHW);
        st = try_decode(dec, &rrc, buf, j.size, err, sizeof err);
        cr_assert(st == SF_OK || st == SF_ERR_CORRUPT, "%s", sf_status_name(st));
    }
    cr_assert_geq(caught, 60u, "only %u of 100 damaged JPEGs detected", caught);

    /* Not JPEG at all. */
    cr_assert_eq(try_decode(dec, &full, "", 0, err, sizeof err), SF_ERR_CORRUPT);
    cr_assert(err[0] != '\0');
    static const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n',
                                        0,    0,   0,   13,  'I',  'H',  'D',  'R'};
    cr_assert_eq(try_decode(dec, &full, png, sizeof png, err, sizeof err), SF_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "PNG"), "%s", err);
    for (size_t i = 0; i < 4096; i++)
        buf[i] = (unsigned char)sf__rng_next(&r);
    buf[0] = 0x12;
    cr_assert_eq(try_decode(dec, &full, buf, 4096, err, sizeof err), SF_ERR_UNSUPPORTED);
    buf[0] = 0xFF;
    buf[1] = 0xD8; /* an SOI, then garbage */
    sf_status st = try_decode(dec, &full, buf, 4096, err, sizeof err);
    cr_assert(st == SF_ERR_CORRUPT || st == SF_ERR_UNSUPPORTED, "%s", sf_status_name(st));
    cr_assert(strstr(err, "byte"), "%s", err);

    /* The decoder is still good after all that. */
    struct sf_decoder *fresh = new_decoder();
    unsigned char *a = decode_ok(dec, &full, &j, 0, NULL);
    unsigned char *b = decode_ok(fresh, &full, &j, 0, NULL);
    cr_assert_eq(memcmp(a, b, (size_t)333 * 251 * 3), 0);
    free(a);
    free(b);
    sf__decoder_destroy(fresh);
    free(buf);
    free(j.data);
}

/* A window reaching the last row reads the stream to its EOI, even when the
 * downscale samples no pixel of its last rows (SF_CROP_NONE 200 -> 8 at
 * scale 1/8 needs rows up to 23 of 25, and the last iMCU row, 24, was never
 * decoded): a cut file is an error, not the pixels of the rows that happened
 * to be complete. */
Test(decode, a_window_reaching_the_bottom_detects_a_cut_tail)
{
    struct jpeg j = make_jpeg(200, 200, TJSAMP_420, 0, 32);
    struct sf_image_options small = opts(SF_CROP_NONE, 8, 8, SF_LAYOUT_CHW);
    free(decode_ok(dec, &small, &j, 0, NULL));
    char err[256];
    size_t cuts[] = {j.size - 2, j.size - 50};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        sf_status st = try_decode(dec, &small, j.data, cuts[k], err, sizeof err);
        cr_assert_eq(st, SF_ERR_CORRUPT, "cut to %zu of %zu: %s", cuts[k], j.size,
                     sf_status_name(st));
        cr_assert(strstr(err, "Premature end"), "%s", err);
    }
    free(j.data);
}

/* Two libjpeg warnings are about headers, not pixels: a JFIF version other
 * than 1.x, and sequential SOS parameters other than Ss 0, Se 63, Ah/Al 0
 * (which the sequential decoder never reads; real encoders write them). The
 * image decodes to the same pixels as the untouched file, for the full and
 * the region path. */
Test(decode, header_only_warnings_are_not_errors)
{
    struct jpeg j = make_jpeg(67, 45, TJSAMP_420, 0, 31);
    struct sf_image_options full = opts(SF_CROP_NONE, 67, 45, SF_LAYOUT_HWC);
    struct sf_image_options center = opts(SF_CROP_CENTER, 24, 16, SF_LAYOUT_CHW);
    unsigned char *want_full = decode_ok(dec, &full, &j, 0, NULL);
    unsigned char *want_center = decode_ok(dec, &center, &j, 0, NULL);
    cr_assert(j.size > 13 && !memcmp(j.data + 6, "JFIF", 5), "TurboJPEG wrote no JFIF APP0");
    size_t sos = first_sos(&j);
    size_t tail = sos + 2 + (size_t)(j.data[sos + 2] << 8 | j.data[sos + 3]) - 3; /* Ss Se AhAl */
    cr_assert_eq(j.data[tail + 1], 63);
    const struct {
        size_t at;
        unsigned char v;
    } patches[] = {{11, 2}, {tail, 1}, {tail + 1, 0}, {tail + 2, 0x01}};
    unsigned char *buf = malloc(j.size);
    for (size_t k = 0; k < sizeof patches / sizeof patches[0]; k++) {
        memcpy(buf, j.data, j.size);
        buf[patches[k].at] = patches[k].v;
        struct jpeg p = {buf, j.size, j.w, j.h};
        unsigned char *got = decode_ok(dec, &full, &p, 0, NULL);
        cr_assert_eq(memcmp(got, want_full, (size_t)67 * 45 * 3), 0, "patch %zu: other pixels", k);
        free(got);
        got = decode_ok(dec, &center, &p, 0, NULL);
        cr_assert_eq(memcmp(got, want_center, sf__image_bytes(&center)), 0, "patch %zu", k);
        free(got);
    }
    free(buf);
    free(want_full);
    free(want_center);
    free(j.data);
}

Test(decode, size_limits_are_checked_before_any_pixel)
{
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
    cr_assert_eq(try_decode(dec, &o, bad, j.size, err, sizeof err), SF_ERR_LIMIT);
    cr_assert(strstr(err, "max_side"), "%s", err);
    o.max_side = 333;
    o.max_pixels = 333 * 251 - 1;
    cr_assert_eq(try_decode(dec, &o, bad, j.size, err, sizeof err), SF_ERR_LIMIT);
    cr_assert(strstr(err, "max_pixels"), "%s", err);
    o.max_pixels = 333 * 251; /* exactly at the limits: decodes (and finds the damage) */
    cr_assert_eq(try_decode(dec, &o, bad, j.size, err, sizeof err), SF_ERR_CORRUPT);
    cr_assert_eq(try_decode(dec, &o, j.data, j.size, err, sizeof err), SF_OK, "%s", err);
    /* A side of 65535 is over libjpeg's own 65500: a limit, and said so. */
    memcpy(bad, j.data, j.size);
    size_t sof = 2;
    while (sof + 8 < j.size && !(bad[sof] == 0xFF && bad[sof + 1] == 0xC0))
        sof++;
    cr_assert(sof + 8 < j.size, "no SOF0");
    bad[sof + 7] = 0xFF; /* width, big-endian */
    bad[sof + 8] = 0xFF;
    o.max_side = 65500;
    o.max_pixels = UINT64_MAX;
    cr_assert_eq(try_decode(dec, &o, bad, j.size, err, sizeof err), SF_ERR_LIMIT, "%s", err);
    cr_assert(strstr(err, "65500") && !strstr(err, "bad JPEG"), "%s", err);
    free(bad);
    free(j.data);
}

Test(decode, progressive_scan_limit)
{
    struct jpeg j = make_jpeg(333, 251, TJSAMP_420, TJFLAG_PROGRESSIVE, 32);
    unsigned scans = 0;
    for (size_t i = 0; i + 1 < j.size; i++) /* entropy data never holds an unstuffed FF DA */
        scans += j.data[i] == 0xFF && j.data[i + 1] == 0xDA;
    cr_assert_gt(scans, 3u);
    char err[256];
    for (int crop = 0; crop < 3; crop++) {
        struct sf_image_options o = opts((enum sf_crop)crop, 64, 64, SF_LAYOUT_CHW);
        o.max_scans = scans;
        cr_assert_eq(try_decode(dec, &o, j.data, j.size, err, sizeof err), SF_OK, "%s", err);
        o.max_scans = scans - 1;
        cr_assert_eq(try_decode(dec, &o, j.data, j.size, err, sizeof err), SF_ERR_LIMIT);
        cr_assert(strstr(err, "max_scans"), "%s", err);
        o.max_scans = 1;
        cr_assert_eq(try_decode(dec, &o, j.data, j.size, err, sizeof err), SF_ERR_LIMIT);
    }
    free(j.data);
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
    unsigned char *out = NULL;
    size_t cap = 0, len = 0;
    char err[256];
    for (size_t n = 0; n <= 300000; n = n * 7 + 1000) {
        unsigned char *src = compressible(n, n);
        size_t bound = ZSTD_compressBound(n);
        unsigned char *z = malloc(bound);
        size_t zn = ZSTD_compress(z, bound, src, n, 3);
        cr_assert(!ZSTD_isError(zn));
        sf_status st = sf__decode_zstd(dec, z, zn, 1 << 20, &out, &cap, &len, err, sizeof err);
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
    cr_assert_eq(sf__decode_zstd(dec, z, ob.pos, 200000, &out, &cap, &len, err, sizeof err), SF_OK,
                 "%s", err);
    cr_assert_eq(len, 200000u);
    cr_assert_eq(memcmp(out, src, 200000), 0);
    /* ... and is refused one byte under its size */
    cr_assert_eq(sf__decode_zstd(dec, z, ob.pos, 199999, &out, &cap, &len, err, sizeof err),
                 SF_ERR_LIMIT);
    cr_assert(strstr(err, "199999"), "%s", err);
    ZSTD_freeCCtx(c);
    free(z);
    free(src);
    free(out);
}

Test(decode, zstd_bad_frames_and_limits)
{
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

    cr_assert_eq(sf__decode_zstd(dec, z, zn, 50000, &out, &cap, &len, err, sizeof err), SF_OK);
    cr_assert_eq(sf__decode_zstd(dec, z, zn, 49999, &out, &cap, &len, err, sizeof err),
                 SF_ERR_LIMIT);
    cr_assert(strstr(err, "49999"), "%s", err);

    memcpy(bad, z, zn);
    bad[0] ^= 0xFF; /* magic */
    cr_assert_eq(sf__decode_zstd(dec, bad, zn, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    cr_assert(err[0] != '\0');
    memcpy(bad, z, zn);
    bad[zn / 2] ^= 0x10; /* payload */
    cr_assert_eq(sf__decode_zstd(dec, bad, zn, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    memcpy(bad, z, zn);
    bad[zn - 1] ^= 0x01; /* checksum */
    cr_assert_eq(sf__decode_zstd(dec, bad, zn, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    for (size_t cut = 1; cut < zn; cut += zn / 7) /* truncated */
        cr_assert_eq(sf__decode_zstd(dec, z, cut, 1 << 20, &out, &cap, &len, err, sizeof err),
                     SF_ERR_CORRUPT, "cut at %zu", cut);
    cr_assert_eq(sf__decode_zstd(dec, z, 0, 1 << 20, &out, &cap, &len, err, sizeof err),
                 SF_ERR_CORRUPT);
    /* still usable */
    cr_assert_eq(sf__decode_zstd(dec, z, zn, 1 << 20, &out, &cap, &len, err, sizeof err), SF_OK);
    cr_assert_eq(memcmp(out, src, 50000), 0);
    ZSTD_freeCCtx(c);
    free(z);
    free(bad);
    free(src);
    free(out);
}
