/* pack --max-side: JPEGs over a side limit shrunk and encoded again. */
#ifndef SF_PACK_REENCODE_H
#define SF_PACK_REENCODE_H

#include "shardfeed.h"

#include <stddef.h>

struct sf__reencode {
    unsigned max_side; /* longer side after re-encoding */
    int quality;       /* 1..100 */
};

/*
 * src (n bytes) is a JPEG. Over max_side on a side: *out receives a new JPEG
 * (free() it) whose longer side is max_side. Otherwise *out is NULL and the
 * original bytes are to be kept. SF_ERR_CORRUPT with a message in err for a
 * JPEG that cannot be read or a CMYK one; SF_ERR_NO_MEMORY.
 */
sf_status sf__reencode_jpeg(const struct sf__reencode *r, const unsigned char *src, size_t n,
                            unsigned char **out, size_t *out_n, char *err, size_t err_len);

#endif
