/* The decode suite's fixture, shared by tests/test_decode*.c (one
 * executable): synthetic images compressed with TurboJPEG, TurboJPEG's own
 * decode, image options, and decodes that must succeed or may fail. */
#ifndef SF_TEST_DECODE_FIXTURE_H
#define SF_TEST_DECODE_FIXTURE_H

#include "src/decode.h"

#include <stddef.h>
#include <stdint.h>

/* A JPEG in memory (free data) of w x h pixels. */
struct jpeg {
    unsigned char *data;
    size_t size;
    unsigned w, h;
};

/* A textured RGB image: per-channel gradients, a checker, and noise of
 * +-noise from a seeded splitmix64 (malloc'd). */
unsigned char *make_rgb(unsigned w, unsigned h, uint64_t seed, int noise);
/* Gradients and a triangle wave of period 256 px: no detail that a 1/8
 * scale decode would average away (malloc'd). */
unsigned char *make_smooth(unsigned w, unsigned h);
/* px (w x h in pixel format pf) compressed with TurboJPEG. */
struct jpeg compress_pixels(const unsigned char *px, unsigned w, unsigned h, int pf, int subsamp,
                            int flags, int quality);
/* make_rgb(seed, noise 20) at quality 90. */
struct jpeg make_jpeg(unsigned w, unsigned h, int subsamp, int flags, uint64_t seed);
/* TurboJPEG's own full decode (same defaults as djpeg: islow, fancy upsampling). */
unsigned char *tj_decode(const struct jpeg *j, int pf);

/* Options of crop into w x h in layout, no flip. */
struct sf_image_options opts(enum sf_crop crop, unsigned w, unsigned h, enum sf_layout layout);
/* Decodes j with o; the output buffer is sized for the source when o keeps it. */
unsigned char *decode_ok(struct sf_decoder *d, const struct sf_image_options *o,
                         const struct jpeg *j, uint64_t seed, struct sf__decode_info *info);
struct sf_decoder *new_decoder(void);
/* A decode of data into a static buffer (333 x 251 at most); its status. */
sf_status try_decode(struct sf_decoder *d, const struct sf_image_options *o, const void *data,
                     size_t size, char *err, size_t err_len);
/* Offset of j's first SOS marker. */
size_t first_sos(const struct jpeg *j);

/* A decoder for the test, made by the suite's .init and destroyed by its
 * .fini. */
extern struct sf_decoder *dec;
void decode_setup(void);
void decode_teardown(void);

#endif
