/* JPEG decode with a crop (src/decode.c): header limits, region decode at a
 * DCT scale, resize, flip, layout, dtype. Input: 8 bytes of options (output
 * size, crop mode, layout, dtype, flip, scale), an 8-byte rng seed for the
 * crop window, then the JPEG. Also the label parsers on the same bytes. */
#include "fuzz.h"
#include "shardfeed_loader.h"
#include "src/decode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct sf_decoder *dec;
    if (!dec)
        fz_check(sf__decoder_new(&dec) == SF_OK, "decoder");
    struct fz f = {data, size};
    struct sf_image_options o;
    sf__image_options_default(&o);
    o.width = 1 + fz_u8(&f) % 96;
    o.height = 1 + fz_u8(&f) % 96;
    unsigned m = fz_u8(&f);
    o.crop = (enum sf_crop)(m % 3);
    o.layout = (m >> 2) & 1 ? SF_LAYOUT_HWC : SF_LAYOUT_CHW;
    o.dtype = (m >> 3) & 1 ? SF_DTYPE_FLOAT32 : SF_DTYPE_UINT8;
    o.hflip = (m >> 4) & 1 ? 0.5f : 0.0f;
    o.scale_min = (float)(1 + fz_u8(&f) % 100) / 100.0f;
    o.scale_max = 1.0f;
    o.center_fraction = (float)(1 + fz_u8(&f) % 100) / 100.0f;
    o.max_scans = 1 + fz_u8(&f) % 64;
    fz_u8(&f);
    fz_u8(&f);
    /* Small limits keep each input fast; the code under test is the same. */
    o.max_side = 2048;
    o.max_pixels = 1u << 20;
    uint64_t seed = fz_u64(&f);
    char err[256];
    if (sf__image_options_check(&o, err, sizeof err) != SF_OK)
        return 0;
    size_t out_bytes = sf__image_bytes(&o);
    unsigned char *jpg = fz_copy(f.p, f.n, 0);
    {
        void *out = malloc(out_bytes);
        fz_check(out != NULL, "out of memory");
        struct sf__decode_info info;
        err[0] = '\0';
        sf_status st = sf__decode_jpeg(dec, &o, jpg, f.n, seed, out, &info, err, sizeof err);
        if (st == SF_OK) {
            fz_check(info.box.w >= 1 && info.box.h >= 1 &&
                         info.box.x + info.box.w <= info.src_width &&
                         info.box.y + info.box.h <= info.src_height,
                     "crop box %ux%u+%u+%u outside %ux%u", info.box.w, info.box.h, info.box.x,
                     info.box.y, info.src_width, info.src_height);
        } else {
            fz_check(err[0] != '\0', "a failure without a message");
        }
        free(out);
    }
    int64_t label;
    sf__parse_label("cls", jpg, f.n, &label, err, sizeof err);
    sf__parse_label("json", jpg, f.n, &label, err, sizeof err);
    free(jpg);
    return 0;
}
