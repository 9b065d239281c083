/* The pieces every parser of a fixed-format timestamp needs (ISO-8601 in
 * S3 listings and credential documents, x-amz-date in SigV4): fixed-width
 * decimal fields and days since the epoch, with no timegm, no locale and no
 * time_t range. What a format accepts stays with its parser. */
#ifndef SF_COMMON_CALENDAR_H
#define SF_COMMON_CALENDAR_H

#include <stdint.h>

/* The number the n ASCII digits at s spell, into *out. 0 (and *out
 * untouched) when one of them is not a digit. */
static inline int sf__read_digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (Howard
 * Hinnant's days_from_civil); m in 1..12, d in 1..31. */
static inline int64_t sf__days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

#endif
