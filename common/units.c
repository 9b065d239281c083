/*
 * Byte sizes for options and flags: "8M", "8MB", "8MiB", "512", "1g".
 *
 * Grammar (case-insensitive, nothing else allowed, not even whitespace):
 *   digits [ unit [ "i" ] [ "B" ] | "B" ]
 *   unit = K M G T P, each a power of 1024 (docs/configuration.md)
 * so "8Mi" is accepted and means 8 MiB: rejecting it would only make users
 * guess which of the spellings of the same binary unit we happen to allow.
 * "E" is not a unit: an exbibyte is past any sensible buffer size and 16E
 * would not fit in 64 bits anyway.
 */
#include "shardfeed/common.h"

#include <limits.h>

/* log2 of the multiplier for a unit letter, -1 when it is not one. */
static int unit_shift(char c)
{
    switch (c) {
    case 'k':
    case 'K': return 10;
    case 'm':
    case 'M': return 20;
    case 'g':
    case 'G': return 30;
    case 't':
    case 'T': return 40;
    case 'p':
    case 'P': return 50;
    default: return -1;
    }
}

sf_status sf_parse_bytes(const char *text, unsigned long long *out)
{
    if (!text || !out)
        return SF_ERR_INVALID_ARGUMENT;

    const char *p = text;
    unsigned long long value = 0;
    /* Only ASCII digits: isdigit() depends on the locale. */
    while (*p >= '0' && *p <= '9') {
        unsigned d = (unsigned)(*p - '0');
        if (value > (ULLONG_MAX - d) / 10)
            return SF_ERR_INVALID_ARGUMENT;
        value = value * 10 + d;
        p++;
    }
    if (p == text)
        return SF_ERR_INVALID_ARGUMENT; /* empty, sign, leading space or unit only */

    int shift = 0;
    if (*p) {
        shift = unit_shift(*p);
        if (shift >= 0) {
            p++;
            if (*p == 'i' || *p == 'I')
                p++;
        } else {
            shift = 0; /* a bare "B" is handled below */
        }
        if (*p == 'b' || *p == 'B')
            p++;
        if (*p)
            return SF_ERR_INVALID_ARGUMENT; /* unknown unit, fraction, trailing text */
    }

    if (shift > 0 && value > (ULLONG_MAX >> shift))
        return SF_ERR_INVALID_ARGUMENT;
    *out = value << shift;
    return SF_OK;
}
