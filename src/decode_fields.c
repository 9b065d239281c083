/*
 * The fields of a sample other than the image (docs/decode.md, "Labels" and
 * ".zst fields"): a label parsed from a `cls` / `txt` / `json` field, and a
 * `.zst` field decompressed with the decoder's own zstd context under a size
 * limit. Fields are untrusted input: every error names the field and says
 * what was wrong.
 */
#include "src/decode.h"

#include "common/strbuf.h"

#include <cjson/cJSON.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ labels */

/* The field's text for a message: at most 24 bytes, non-printables as '.'. */
static void preview(const unsigned char *p, size_t n, char *buf, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap && i < 24; i++)
        buf[k++] = (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"') ? (char)p[i] : '.';
    if (n > 24 && k + 4 < cap) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* [spaces] ['-'] digits [whitespace]; 0 when not that or out of int64. */
static int parse_decimal(const unsigned char *p, size_t n, int64_t *out)
{
    size_t i = 0;
    while (i < n && is_space(p[i]))
        i++;
    int neg = 0;
    if (i < n && p[i] == '-') {
        neg = 1;
        i++;
    }
    size_t start = i;
    uint64_t v = 0;
    const uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (i < n && p[i] >= '0' && p[i] <= '9') {
        uint64_t digit = (uint64_t)(p[i] - '0');
        if (v > (lim - digit) / 10)
            return 0;
        v = v * 10 + digit;
        i++;
    }
    if (i == start)
        return 0;
    while (i < n && is_space(p[i]))
        i++;
    if (i != n)
        return 0;
    *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return 1;
}

/* An integral JSON number (exact in a double: |v| <= 2^53). */
static int json_integer(const cJSON *item, int64_t *out)
{
    if (!cJSON_IsNumber(item))
        return 0;
    double v = item->valuedouble;
    if (!(v >= -0x1.0p53 && v <= 0x1.0p53))
        return 0;
    int64_t i = (int64_t)v;
    if ((double)i != v)
        return 0;
    *out = i;
    return 1;
}

/* The syntax comes from the name's last dot-separated part: "json" is JSON,
 * anything else ("cls", "txt", "cls2", ...) a decimal integer. */
static int name_is_json(const char *name)
{
    const char *dot = strrchr(name, '.');
    return strcmp(dot ? dot + 1 : name, "json") == 0;
}

sf_status sf__parse_label(const char *name, const void *data, size_t size, int64_t *out, char *err,
                          size_t err_len)
{
    if (!name || (!data && size) || !out)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "sf__parse_label: name, data or out is NULL");
    const unsigned char *p = data;
    char shown[40];
    preview(p, size, shown, sizeof shown);
    if (memchr(p, '\0', size))
        return sf__fail(err, err_len, SF_ERR_PARSE, "label field \"%s\" contains a NUL byte", name);
    if (!name_is_json(name)) {
        if (parse_decimal(p, size, out))
            return SF_OK;
        return sf__fail(err, err_len, SF_ERR_PARSE,
                        "label field \"%s\" (\"%s\", %zu bytes) is not a decimal integer", name,
                        shown, size);
    }
    /* A bare number, the common case, without a parse tree. */
    if (parse_decimal(p, size, out))
        return SF_OK;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)p, size, &end, 0);
    if (!root)
        return sf__fail(err, err_len, SF_ERR_PARSE,
                        "label field \"%s\" (\"%s\", %zu bytes) is not valid JSON", name, shown,
                        size);
    size_t rest = end ? (size_t)(end - (const char *)p) : size;
    while (rest < size && is_space(p[rest]))
        rest++;
    int64_t v = 0;
    int ok = rest == size;
    if (ok) {
        if (cJSON_IsObject(root))
            ok = json_integer(cJSON_GetObjectItemCaseSensitive(root, "label"), &v);
        else
            ok = json_integer(root, &v);
    }
    cJSON_Delete(root);
    if (!ok)
        return sf__fail(err, err_len, SF_ERR_PARSE,
                        "label field \"%s\" (\"%s\", %zu bytes) is neither an integer nor an "
                        "object with an integer member \"label\"",
                        name, shown, size);
    *out = v;
    return SF_OK;
}

/* ------------------------------------------------------------------ zstd */

/* The largest window a zstd field may ask for: 2^27 (128 MiB), zstd's own
 * default limit, set explicitly so it does not depend on the version. */
#define SF__ZSTD_WINDOW_LOG_MAX 27

sf_status sf__decode_zstd(struct sf_decoder *d, const void *src, size_t size,
                          unsigned long long max_bytes, unsigned char **out, size_t *cap,
                          size_t *out_len, char *err, size_t err_len)
{
    if (!d || (!src && size) || !out || !cap || !out_len)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "sf__decode_zstd: decoder, src, out, cap or out_len is NULL");
    *out_len = 0;
    if (size == 0)
        return sf__fail(err, err_len, SF_ERR_CORRUPT, "zstd field is empty (0 bytes)");
    /* Room for one byte more than allowed: producing it proves the limit is
     * exceeded, whatever zstd still holds back. */
    size_t limit = max_bytes >= SIZE_MAX - 1 ? SIZE_MAX - 1 : (size_t)max_bytes;
    size_t hard_cap = limit + 1;

    unsigned long long declared = ZSTD_getFrameContentSize(src, size);
    if (declared == ZSTD_CONTENTSIZE_ERROR)
        return sf__fail(err, err_len, SF_ERR_CORRUPT, "not a zstd frame (%zu bytes)", size);
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > limit)
        return sf__fail(err, err_len, SF_ERR_LIMIT,
                        "zstd frame declares %llu bytes, over the limit of %llu", declared,
                        max_bytes);

    size_t want = declared != ZSTD_CONTENTSIZE_UNKNOWN ? (size_t)declared
                  : size <= hard_cap / 4               ? size * 4
                                                       : hard_cap;
    if (want == 0)
        want = 1;
    if (want > hard_cap)
        want = hard_cap;

    ZSTD_DCtx *z = sf__decoder_zstd(d);
    ZSTD_DCtx_reset(z, ZSTD_reset_session_only);
    ZSTD_DCtx_setParameter(z, ZSTD_d_windowLogMax, SF__ZSTD_WINDOW_LOG_MAX);
    ZSTD_inBuffer in = {src, size, 0};
    size_t len = 0;
    for (;;) {
        if (*cap < want || !*out) {
            unsigned char *p = realloc(*out, want);
            if (!p)
                return sf__fail(err, err_len, SF_ERR_NO_MEMORY,
                                "out of memory for %zu bytes of zstd output", want);
            *out = p;
            *cap = want;
        }
        ZSTD_outBuffer ob = {*out, *cap, len};
        size_t in_before = in.pos;
        size_t ret = ZSTD_decompressStream(z, &ob, &in);
        if (ZSTD_isError(ret)) {
            ZSTD_ErrorCode code = ZSTD_getErrorCode(ret);
            sf_status st = code == ZSTD_error_frameParameter_windowTooLarge ? SF_ERR_LIMIT
                           : code == ZSTD_error_memory_allocation           ? SF_ERR_NO_MEMORY
                                                                            : SF_ERR_CORRUPT;
            return sf__fail(err, err_len, st, "zstd: %s (input byte %zu of %zu)",
                            ZSTD_getErrorName(ret), in.pos, size);
        }
        int progress = ob.pos != len || in.pos != in_before;
        len = ob.pos;
        if (len > limit)
            return sf__fail(err, err_len, SF_ERR_LIMIT,
                            "zstd field decompresses to more than %llu bytes", max_bytes);
        if (ret == 0 && in.pos == in.size)
            break;
        if (len == *cap) { /* full: grow, up to one byte past the limit */
            want = *cap > hard_cap / 2 ? hard_cap : *cap * 2;
            continue;
        }
        if (!progress)
            return sf__fail(err, err_len, SF_ERR_CORRUPT,
                            "zstd frame is truncated (%zu bytes of input, %zu bytes out)", size,
                            len);
    }
    *out_len = len;
    return SF_OK;
}
