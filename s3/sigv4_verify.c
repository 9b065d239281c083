/* SigV4, the server's side: parsing an Authorization header and checking
 * its signature (the mock server's authentication). Signing is s3/sigv4.c. */
#include "s3/sigv4.h"
#include "s3/sigv4_internal.h"

#include "common/strbuf.h"
#include "common/text.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Longest Authorization header value parse_authorization looks at. */
#define SIGV4_MAX_AUTH_BYTES ((size_t)4096)

/* ------------------------------------------------------- authorization */

static int sigv4_is_lower_tchar(char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
        return 1;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Copies src[0..n) into dst[dst_size] when it is 1..dst_size-1 visible ASCII
 * characters; 0 otherwise. */
static int sigv4_copy_field(char *dst, size_t dst_size, const char *src, size_t n)
{
    if (n == 0 || n >= dst_size)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c <= 0x20 || c >= 0x7f)
            return 0;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 1;
}

static int sigv4_parse_credential(const char *v, size_t n, struct sf__sigv4_auth *out)
{
    const char *parts[5];
    size_t lens[5];
    size_t k = 0;
    const char *p = v, *end = v + n;
    for (;;) {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        const char *part_end = slash ? slash : end;
        if (k == 5)
            return 0;
        parts[k] = p;
        lens[k++] = (size_t)(part_end - p);
        if (!slash)
            break;
        p = slash + 1;
    }
    if (k != 5)
        return 0;
    if (!sigv4_copy_field(out->access_key_id, sizeof out->access_key_id, parts[0], lens[0]))
        return 0;
    int ignored;
    if (lens[1] != 8 || !sf__read_digits(parts[1], 8, &ignored) ||
        !sigv4_copy_field(out->date, sizeof out->date, parts[1], lens[1]))
        return 0;
    if (!sigv4_copy_field(out->region, sizeof out->region, parts[2], lens[2]) ||
        !sigv4_copy_field(out->service, sizeof out->service, parts[3], lens[3]))
        return 0;
    return lens[4] == sizeof SIGV4_TERMINATOR - 1 &&
           memcmp(parts[4], SIGV4_TERMINATOR, lens[4]) == 0;
}

static int sigv4_parse_signed_headers(const char *v, size_t n, struct sf__sigv4_auth *out)
{
    if (n == 0 || n >= sizeof out->signed_headers)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] == ';') {
            if (i == 0 || i == n - 1 || v[i - 1] == ';')
                return 0;
        } else if (!sigv4_is_lower_tchar(v[i])) {
            return 0;
        }
    }
    memcpy(out->signed_headers, v, n);
    out->signed_headers[n] = '\0';
    return 1;
}

static int sigv4_parse_signature(const char *v, size_t n, struct sf__sigv4_auth *out)
{
    if (n != SF__SHA256_HEX_LEN)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f')))
            return 0;
    }
    memcpy(out->signature, v, n);
    out->signature[n] = '\0';
    return 1;
}

static int sigv4_is_ows(char c)
{
    return c == ' ' || c == '\t';
}

sf_status sf__sigv4_parse_authorization(const char *value, struct sf__sigv4_auth *out)
{
    enum { SEEN_CREDENTIAL = 1, SEEN_SIGNED_HEADERS = 2, SEEN_SIGNATURE = 4 };
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (!value)
        return SF_ERR_PARSE;
    size_t len = strnlen(value, SIGV4_MAX_AUTH_BYTES + 1);
    if (len > SIGV4_MAX_AUTH_BYTES)
        return SF_ERR_PARSE;

    /* Indices rather than pointers: every bound below is visibly in range. */
    size_t pos = 0;
    while (pos < len && sigv4_is_ows(value[pos]))
        pos++;
    size_t alg_len = sizeof SIGV4_ALGORITHM - 1;
    if (len - pos <= alg_len || memcmp(value + pos, SIGV4_ALGORITHM, alg_len) != 0 ||
        !sigv4_is_ows(value[pos + alg_len]))
        goto fail;
    pos += alg_len;

    unsigned seen = 0;
    for (;;) {
        while (pos < len && sigv4_is_ows(value[pos]))
            pos++;
        const char *comp = value + pos;
        const char *comma = memchr(comp, ',', len - pos);
        size_t comp_len = comma ? (size_t)(comma - comp) : len - pos;
        while (comp_len > 0 && sigv4_is_ows(comp[comp_len - 1]))
            comp_len--;
        size_t name_len, v_len;
        const char *v;
        if (!sf__split_at(comp, comp_len, '=', &name_len, &v, &v_len))
            goto fail;

#define SIGV4_NAME_IS(lit) (name_len == sizeof(lit) - 1 && memcmp(comp, lit, name_len) == 0)
        if (SIGV4_NAME_IS("Credential")) {
            if ((seen & SEEN_CREDENTIAL) || !sigv4_parse_credential(v, v_len, out))
                goto fail;
            seen |= SEEN_CREDENTIAL;
        } else if (SIGV4_NAME_IS("SignedHeaders")) {
            if ((seen & SEEN_SIGNED_HEADERS) || !sigv4_parse_signed_headers(v, v_len, out))
                goto fail;
            seen |= SEEN_SIGNED_HEADERS;
        } else if (SIGV4_NAME_IS("Signature")) {
            if ((seen & SEEN_SIGNATURE) || !sigv4_parse_signature(v, v_len, out))
                goto fail;
            seen |= SEEN_SIGNATURE;
        } else {
            goto fail;
        }
#undef SIGV4_NAME_IS
        if (!comma)
            break;
        pos = (size_t)(comma - value) + 1;
    }
    if (seen != (SEEN_CREDENTIAL | SEEN_SIGNED_HEADERS | SEEN_SIGNATURE))
        goto fail;
    return SF_OK;

fail:
    memset(out, 0, sizeof *out);
    return SF_ERR_PARSE;
}

/* ---------------------------------------------------------- verification */

static int sigv4_terminated(const char *s, size_t size)
{
    return memchr(s, '\0', size) != NULL;
}

/* Whether name is one of the entries of the ';'-separated list. */
static int sigv4_list_has(const char *list, const char *name)
{
    const char *p = list;
    for (;;) {
        const char *semi = strchr(p, ';');
        size_t n = semi ? (size_t)(semi - p) : strlen(p);
        if (sf__sigv4_name_eq(name, p, n))
            return 1;
        if (!semi)
            return 0;
        p = semi + 1;
    }
}

sf_status sf__sigv4_verify(struct sf__sigv4_signer *s, const struct sf__sigv4_auth *auth,
                           const struct sf__sigv4_request *req, const char *amz_date,
                           struct sf__sigv4_result *out)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (!s || !auth || !req || !sf__sigv4_signer_ok(s) || !sf__sigv4_request_ok(req))
        return SF_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < req->n_headers; i++) {
        if (!req->headers[i].name)
            return SF_ERR_INVALID_ARGUMENT;
    }
    /* auth may have been filled by hand: never read past its arrays. */
    if (!sigv4_terminated(auth->access_key_id, sizeof auth->access_key_id) ||
        !sigv4_terminated(auth->date, sizeof auth->date) ||
        !sigv4_terminated(auth->region, sizeof auth->region) ||
        !sigv4_terminated(auth->service, sizeof auth->service) ||
        !sigv4_terminated(auth->signed_headers, sizeof auth->signed_headers) ||
        !sigv4_terminated(auth->signature, sizeof auth->signature))
        return SF_ERR_PARSE;
    if (strcmp(auth->access_key_id, s->access_key_id) != 0)
        return SF_ERR_ACCESS_DENIED;

    time_t t;
    if (!amz_date || sf__sigv4_parse_date(amz_date, &t) != SF_OK)
        return SF_ERR_PARSE;
    /* S3 refuses a credential scope whose day is not the request's day. */
    if (strlen(auth->date) != 8 || memcmp(auth->date, amz_date, 8) != 0)
        return SF_ERR_PARSE;
    if (!auth->region[0] || !auth->service[0] || !auth->signed_headers[0] ||
        strlen(auth->signature) != SF__SHA256_HEX_LEN)
        return SF_ERR_PARSE;
    if (!sigv4_list_has(auth->signed_headers, "host"))
        return SF_ERR_PARSE;

    /* Every name in the list must be present in the request. */
    const char *p = auth->signed_headers;
    for (;;) {
        const char *semi = strchr(p, ';');
        size_t n = semi ? (size_t)(semi - p) : strlen(p);
        int found = 0;
        if (n == 0)
            return SF_ERR_PARSE;
        for (size_t i = 0; i < req->n_headers && !found; i++)
            found = sf__sigv4_name_eq(req->headers[i].name, p, n);
        if (!found)
            return SF_ERR_PARSE;
        if (!semi)
            break;
        p = semi + 1;
    }

    struct sf__header *selected = calloc(req->n_headers ? req->n_headers : 1, sizeof *selected);
    if (!selected)
        return SF_ERR_NO_MEMORY;
    size_t n_selected = 0;
    for (size_t i = 0; i < req->n_headers; i++) {
        if (sigv4_list_has(auth->signed_headers, req->headers[i].name))
            selected[n_selected++] = req->headers[i];
    }

    struct sf__sigv4_scope scope = {auth->date, auth->region, auth->service};
    sf_status st = sf__sigv4_compute(s, &scope, req, selected, n_selected, amz_date, out);
    free(selected);
    if (st != SF_OK)
        return st;
    if (CRYPTO_memcmp(out->signature, auth->signature, SF__SHA256_HEX_LEN) != 0)
        return SF_ERR_SIGNATURE;
    return SF_OK;
}
