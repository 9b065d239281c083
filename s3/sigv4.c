#include "s3/sigv4.h"
#include "s3/sigv4_internal.h"

#include "common/strbuf.h"
#include "s3/uri.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Canonical requests, and the path and query that go into them, are bounded:
 * S3 itself refuses request lines and header blocks far smaller than this. */
#define SIGV4_MAX_CANONICAL_BYTES ((size_t)1024 * 1024)
#define SIGV4_MAX_SMALL_BYTES     ((size_t)64 * 1024)

/* ------------------------------------------------------------ small helpers */

static int sigv4_is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static char sigv4_lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* ASCII case-insensitive comparison; locale-independent on purpose. */
static int sigv4_casecmp(const char *a, const char *b)
{
    for (;; a++, b++) {
        unsigned char ca = (unsigned char)sigv4_lower(*a);
        unsigned char cb = (unsigned char)sigv4_lower(*b);
        if (ca != cb || ca == '\0')
            return (int)ca - (int)cb;
    }
}

int sf__sigv4_name_eq(const char *name, const char *name2, size_t n2)
{
    for (size_t i = 0; i < n2; i++) {
        if (name[i] == '\0' || sigv4_lower(name[i]) != sigv4_lower(name2[i]))
            return 0;
    }
    return name[n2] == '\0';
}

/* Header names go into the canonical request verbatim (lower-cased) and into
 * the ';'-separated signed-headers list, so they must be HTTP tokens
 * (RFC 9110 tchar): the same set sf__sigv4_parse_authorization() accepts,
 * so that what is signed can be verified ('=' or '"' in a name was signed,
 * then refused by the parser: fuzz_sigv4). */
static int sigv4_valid_header_name(const char *name)
{
    if (!name || !*name)
        return 0;
    for (const char *p = name; *p; p++) {
        char c = sigv4_lower(*p);
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("!#$%&'*+-.^_`|~", c)))
            return 0;
    }
    return 1;
}

void sf__hex_encode(const unsigned char *in, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    if (!out)
        return;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[in[i] >> 4];
        out[2 * i + 1] = hex[in[i] & 0x0f];
    }
    out[2 * n] = '\0';
}

static sf_status sigv4_sha256(const void *data, size_t n, unsigned char md[32])
{
    unsigned int md_len = 0;
    if (!data)
        data = "";
    if (!EVP_Digest(data, n, md, &md_len, EVP_sha256(), NULL) || md_len != 32)
        return SF_ERR_INTERNAL;
    return SF_OK;
}

void sf__sha256_hex(const void *data, size_t n, char out[SF__SHA256_HEX_LEN + 1])
{
    unsigned char md[32];
    if (!out)
        return;
    if (sigv4_sha256(data, n, md) != SF_OK) {
        /* Cannot report through this signature; an empty hash never matches. */
        out[0] = '\0';
        return;
    }
    sf__hex_encode(md, sizeof md, out);
}

static sf_status sigv4_hmac(const void *key, size_t key_len, const void *data, size_t n,
                            unsigned char out[32])
{
    unsigned int out_len = 0;
    if (key_len > INT_MAX)
        return SF_ERR_INVALID_ARGUMENT;
    if (!HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)data, n, out, &out_len) ||
        out_len != 32)
        return SF_ERR_INTERNAL;
    return SF_OK;
}

/* ------------------------------------------------------------------ dates */

static void sigv4_put_digits(char *dst, int value, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        dst[i] = (char)('0' + value % 10);
        value /= 10;
    }
}

void sf__sigv4_format_date(time_t t, char out[SF__AMZ_DATE_LEN + 1])
{
    struct tm tm;
    if (!out)
        return;
    if (!gmtime_r(&t, &tm) || tm.tm_year < -1900 || tm.tm_year > 9999 - 1900) {
        /* Out of the format's range: a value parse_date rejects (month 00). */
        memcpy(out, "00000000T000000Z", SF__AMZ_DATE_LEN + 1);
        return;
    }
    sigv4_put_digits(out, tm.tm_year + 1900, 4);
    sigv4_put_digits(out + 4, tm.tm_mon + 1, 2);
    sigv4_put_digits(out + 6, tm.tm_mday, 2);
    out[8] = 'T';
    sigv4_put_digits(out + 9, tm.tm_hour, 2);
    sigv4_put_digits(out + 11, tm.tm_min, 2);
    sigv4_put_digits(out + 13, tm.tm_sec, 2);
    out[15] = 'Z';
    out[16] = '\0';
}

sf_status sf__sigv4_parse_date(const char *s, time_t *out)
{
    int year, mon, day, hour, min, sec;
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    if (!s || strnlen(s, SF__AMZ_DATE_LEN + 1) != SF__AMZ_DATE_LEN)
        return SF_ERR_PARSE;
    if (s[8] != 'T' || s[15] != 'Z' || !sf__read_digits(s, 4, &year) ||
        !sf__read_digits(s + 4, 2, &mon) || !sf__read_digits(s + 6, 2, &day) ||
        !sf__read_digits(s + 9, 2, &hour) || !sf__read_digits(s + 11, 2, &min) ||
        !sf__read_digits(s + 13, 2, &sec))
        return SF_ERR_PARSE;
    if (mon < 1 || mon > 12 || day < 1 || day > 31 || hour > 23 || min > 59 || sec > 59)
        return SF_ERR_PARSE;

    struct tm tm;
    memset(&tm, 0, sizeof tm);
    tm.tm_year = year - 1900;
    tm.tm_mon = mon - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = min;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);

    /* timegm() normalizes 20150230 into March; a round trip catches that. */
    struct tm back;
    if (!gmtime_r(&t, &back) || back.tm_year != year - 1900 || back.tm_mon != mon - 1 ||
        back.tm_mday != day || back.tm_hour != hour || back.tm_min != min || back.tm_sec != sec)
        return SF_ERR_PARSE;
    *out = t;
    return SF_OK;
}

/* ----------------------------------------------------------- signer, keys */

void sf__sigv4_signer_init(struct sf__sigv4_signer *s, const char *access_key_id,
                           const char *secret_access_key, const char *session_token,
                           const char *region, const char *service)
{
    if (!s)
        return;
    s->access_key_id = access_key_id;
    s->secret_access_key = secret_access_key;
    s->session_token = session_token;
    s->region = region;
    s->service = service;
    /* With default attributes glibc's pthread_mutex_init cannot fail. */
    (void)pthread_mutex_init(&s->lock, NULL);
    s->key_date[0] = '\0';
    memset(s->key, 0, sizeof s->key);
}

void sf__sigv4_signer_destroy(struct sf__sigv4_signer *s)
{
    if (!s)
        return;
    (void)pthread_mutex_destroy(&s->lock);
    OPENSSL_cleanse(s->key, sizeof s->key);
    s->key_date[0] = '\0';
}

void sf__sigv4_result_free(struct sf__sigv4_result *r)
{
    if (!r)
        return;
    free(r->canonical_request);
    free(r->string_to_sign);
    free(r->authorization);
    free(r->signed_headers);
    memset(r, 0, sizeof *r);
}

static sf_status sigv4_derive_key(const char *secret, const char *date, const char *region,
                                  const char *service, unsigned char key[32])
{
    size_t secret_len = strlen(secret);
    if (secret_len > SIGV4_MAX_SMALL_BYTES)
        return SF_ERR_INVALID_ARGUMENT;
    unsigned char *k_secret = malloc(secret_len + 4);
    if (!k_secret)
        return SF_ERR_NO_MEMORY;
    memcpy(k_secret, "AWS4", 4);
    memcpy(k_secret + 4, secret, secret_len);

    unsigned char k_date[32], k_region[32], k_service[32];
    sf_status st = sigv4_hmac(k_secret, secret_len + 4, date, strlen(date), k_date);
    if (st == SF_OK)
        st = sigv4_hmac(k_date, sizeof k_date, region, strlen(region), k_region);
    if (st == SF_OK)
        st = sigv4_hmac(k_region, sizeof k_region, service, strlen(service), k_service);
    if (st == SF_OK)
        st = sigv4_hmac(k_service, sizeof k_service, SIGV4_TERMINATOR, sizeof SIGV4_TERMINATOR - 1,
                        key);

    OPENSSL_cleanse(k_secret, secret_len + 4);
    free(k_secret);
    OPENSSL_cleanse(k_date, sizeof k_date);
    OPENSSL_cleanse(k_region, sizeof k_region);
    OPENSSL_cleanse(k_service, sizeof k_service);
    return st;
}

/* The signer caches one key: the one for its own region and service on the
 * most recent day asked for. Other scopes (a verifier seeing a client that
 * named another region) are derived each time and never evict it. */
static sf_status sigv4_signing_key(struct sf__sigv4_signer *s, const char *date, const char *region,
                                   const char *service, unsigned char key[32])
{
    if (strcmp(region, s->region) != 0 || strcmp(service, s->service) != 0)
        return sigv4_derive_key(s->secret_access_key, date, region, service, key);

    if (pthread_mutex_lock(&s->lock) != 0)
        return SF_ERR_INTERNAL;
    sf_status st = SF_OK;
    if (strcmp(s->key_date, date) == 0) {
        memcpy(key, s->key, 32);
    } else {
        st = sigv4_derive_key(s->secret_access_key, date, region, service, key);
        if (st == SF_OK) {
            memcpy(s->key, key, 32);
            memcpy(s->key_date, date, sizeof s->key_date);
        }
    }
    (void)pthread_mutex_unlock(&s->lock);
    return st;
}

/* ------------------------------------------------------ canonical request */

/* Appends value trimmed, with every run of whitespace (folded line breaks
 * included) collapsed to one space. */
static void sigv4_put_header_value(struct sf__strbuf *b, const char *value)
{
    const char *p = value ? value : "";
    while (*p && sigv4_is_ws(*p))
        p++;
    while (*p) {
        const char *run = p;
        while (*p && !sigv4_is_ws(*p))
            p++;
        sf__strbuf_append(b, run, (size_t)(p - run));
        while (*p && sigv4_is_ws(*p))
            p++;
        if (*p)
            sf__strbuf_putc(b, ' ');
    }
}

struct sigv4_hdr_ref {
    const char *name;
    const char *value;
    size_t order;
};

static int sigv4_hdr_cmp(const void *a, const void *b)
{
    const struct sigv4_hdr_ref *x = a, *y = b;
    int c = sigv4_casecmp(x->name, y->name);
    if (c != 0)
        return c;
    /* Repeated headers keep the order they appeared in. */
    return (x->order > y->order) - (x->order < y->order);
}

/* Appends the canonical header block (each line ending in '\n') to creq and
 * the signed-headers list to signed_list. */
static sf_status sigv4_put_headers(struct sf__strbuf *creq, struct sf__strbuf *signed_list,
                                   const struct sf__header *hdrs, size_t n)
{
    if (n == 0)
        return SF_OK;
    struct sigv4_hdr_ref *refs = calloc(n, sizeof *refs);
    if (!refs)
        return SF_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if (!sigv4_valid_header_name(hdrs[i].name)) {
            free(refs);
            return SF_ERR_INVALID_ARGUMENT;
        }
        refs[i].name = hdrs[i].name;
        refs[i].value = hdrs[i].value;
        refs[i].order = i;
    }
    qsort(refs, n, sizeof *refs, sigv4_hdr_cmp);

    for (size_t i = 0; i < n; i++) {
        int same_as_prev = i > 0 && sigv4_casecmp(refs[i - 1].name, refs[i].name) == 0;
        if (same_as_prev) {
            sf__strbuf_putc(creq, ',');
        } else {
            if (i > 0) {
                sf__strbuf_putc(creq, '\n');
                sf__strbuf_putc(signed_list, ';');
            }
            for (const char *p = refs[i].name; *p; p++) {
                sf__strbuf_putc(creq, sigv4_lower(*p));
                sf__strbuf_putc(signed_list, sigv4_lower(*p));
            }
            sf__strbuf_putc(creq, ':');
        }
        sigv4_put_header_value(creq, refs[i].value);
    }
    sf__strbuf_putc(creq, '\n');
    free(refs);
    if (creq->err != SF_OK)
        return creq->err;
    return signed_list->err;
}

static sf_status sigv4_put_path(struct sf__strbuf *creq, const char *path)
{
    size_t n = path ? strlen(path) : 0;
    if (n == 0)
        return sf__strbuf_putc(creq, '/');
    if (n > SIGV4_MAX_CANONICAL_BYTES)
        return SF_ERR_LIMIT;
    struct sf__strbuf decoded;
    sf__strbuf_init(&decoded, SIGV4_MAX_CANONICAL_BYTES);
    sf_status st = sf__uri_decode(&decoded, path, n, 0);
    if (st == SF_OK)
        st = sf__uri_encode(creq, decoded.data, decoded.len, 1);
    sf__strbuf_free(&decoded);
    return st;
}

struct sigv4_param {
    size_t key_off, val_off; /* into the pool, each NUL-terminated */
    const char *key, *val;
};

static int sigv4_param_cmp(const void *a, const void *b)
{
    const struct sigv4_param *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c != 0 ? c : strcmp(x->val, y->val);
}

/* Decodes src[0..n) then appends it encoded (slashes too) and a NUL to pool.
 * Encoded text never holds a NUL, so the pool entries are plain C strings. */
static sf_status sigv4_pool_add(struct sf__strbuf *pool, struct sf__strbuf *scratch,
                                const char *src, size_t n, size_t *off)
{
    sf__strbuf_reset(scratch);
    sf_status st = sf__uri_decode(scratch, src, n, 0);
    if (st != SF_OK)
        return st;
    *off = pool->len;
    st = sf__uri_encode(pool, scratch->data, scratch->len, 0);
    if (st != SF_OK)
        return st;
    return sf__strbuf_putc(pool, '\0');
}

static sf_status sigv4_put_query(struct sf__strbuf *creq, const char *query)
{
    size_t n = query ? strlen(query) : 0;
    if (n == 0)
        return SF_OK;
    if (n > SIGV4_MAX_CANONICAL_BYTES)
        return SF_ERR_LIMIT;

    size_t max_params = 1;
    for (size_t i = 0; i < n; i++)
        max_params += query[i] == '&';
    struct sigv4_param *params = calloc(max_params, sizeof *params);
    if (!params)
        return SF_ERR_NO_MEMORY;

    struct sf__strbuf pool, scratch;
    sf__strbuf_init(&pool, SIGV4_MAX_CANONICAL_BYTES);
    sf__strbuf_init(&scratch, SIGV4_MAX_CANONICAL_BYTES);
    size_t count = 0;
    sf_status st = SF_OK;
    const char *p = query, *end = query + n;
    while (p < end && st == SF_OK) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *seg_end = amp ? amp : end;
        if (seg_end > p) { /* "a&&b" has an empty piece: nothing to sign */
            const char *eq = memchr(p, '=', (size_t)(seg_end - p));
            const char *key_end = eq ? eq : seg_end;
            const char *val = eq ? eq + 1 : seg_end;
            st = sigv4_pool_add(&pool, &scratch, p, (size_t)(key_end - p), &params[count].key_off);
            if (st == SF_OK)
                st = sigv4_pool_add(&pool, &scratch, val, (size_t)(seg_end - val),
                                    &params[count].val_off);
            count++;
        }
        p = amp ? amp + 1 : end;
    }

    if (st == SF_OK && count > 0) {
        /* The pool has stopped growing: offsets can become pointers now. */
        for (size_t i = 0; i < count; i++) {
            params[i].key = pool.data + params[i].key_off;
            params[i].val = pool.data + params[i].val_off;
        }
        qsort(params, count, sizeof *params, sigv4_param_cmp);
        for (size_t i = 0; i < count; i++) {
            if (i > 0)
                sf__strbuf_putc(creq, '&');
            sf__strbuf_puts(creq, params[i].key);
            sf__strbuf_putc(creq, '=');
            sf__strbuf_puts(creq, params[i].val);
        }
        st = creq->err;
    }
    sf__strbuf_free(&pool);
    sf__strbuf_free(&scratch);
    free(params);
    return st;
}

/* --------------------------------------------------------------- signing */

sf_status sf__sigv4_compute(struct sf__sigv4_signer *s, const struct sf__sigv4_scope *scope,
                            const struct sf__sigv4_request *req, const struct sf__header *hdrs,
                            size_t n, const char *amz_date, struct sf__sigv4_result *out)
{
    struct sf__strbuf creq, signed_list, sts, auth;
    sf__strbuf_init(&creq, SIGV4_MAX_CANONICAL_BYTES);
    sf__strbuf_init(&signed_list, SIGV4_MAX_SMALL_BYTES);
    sf__strbuf_init(&sts, SIGV4_MAX_SMALL_BYTES);
    sf__strbuf_init(&auth, SIGV4_MAX_SMALL_BYTES);
    unsigned char key[32], mac[32], creq_hash[32];
    char creq_hex[SF__SHA256_HEX_LEN + 1];

    sf__strbuf_puts(&creq, req->method);
    sf__strbuf_putc(&creq, '\n');
    sf_status st = sigv4_put_path(&creq, req->path);
    sf__strbuf_putc(&creq, '\n');
    if (st == SF_OK)
        st = sigv4_put_query(&creq, req->query);
    sf__strbuf_putc(&creq, '\n');
    if (st == SF_OK)
        st = sigv4_put_headers(&creq, &signed_list, hdrs, n);
    sf__strbuf_putc(&creq, '\n');
    sf__strbuf_append(&creq, signed_list.data, signed_list.len);
    sf__strbuf_putc(&creq, '\n');
    sf__strbuf_puts(&creq, req->payload_hash);
    if (st == SF_OK)
        st = creq.err;
    if (st == SF_OK)
        st = sigv4_sha256(creq.data, creq.len, creq_hash);
    if (st != SF_OK)
        goto done;
    sf__hex_encode(creq_hash, sizeof creq_hash, creq_hex);

    sf__strbuf_printf(&sts, SIGV4_ALGORITHM "\n%s\n%s/%s/%s/" SIGV4_TERMINATOR "\n%s", amz_date,
                      scope->date, scope->region, scope->service, creq_hex);
    if ((st = sts.err) != SF_OK)
        goto done;

    st = sigv4_signing_key(s, scope->date, scope->region, scope->service, key);
    if (st == SF_OK)
        st = sigv4_hmac(key, sizeof key, sts.data, sts.len, mac);
    OPENSSL_cleanse(key, sizeof key);
    if (st != SF_OK)
        goto done;
    sf__hex_encode(mac, sizeof mac, out->signature);

    sf__strbuf_printf(&auth,
                      SIGV4_ALGORITHM " Credential=%s/%s/%s/%s/" SIGV4_TERMINATOR
                                      ", SignedHeaders=%s, Signature=%s",
                      s->access_key_id, scope->date, scope->region, scope->service,
                      sf__strbuf_str(&signed_list), out->signature);
    if ((st = auth.err) != SF_OK)
        goto done;

    out->canonical_request = sf__strbuf_take(&creq);
    out->string_to_sign = sf__strbuf_take(&sts);
    out->authorization = sf__strbuf_take(&auth);
    out->signed_headers = sf__strbuf_take(&signed_list);
    if (!out->canonical_request || !out->string_to_sign || !out->authorization ||
        !out->signed_headers)
        st = SF_ERR_NO_MEMORY;

done:
    if (st != SF_OK)
        sf__sigv4_result_free(out);
    sf__strbuf_free(&creq);
    sf__strbuf_free(&signed_list);
    sf__strbuf_free(&sts);
    sf__strbuf_free(&auth);
    return st;
}

int sf__sigv4_signer_ok(const struct sf__sigv4_signer *s)
{
    return s->access_key_id && s->secret_access_key && s->region && s->service &&
           s->access_key_id[0] && s->region[0] && s->service[0];
}

int sf__sigv4_request_ok(const struct sf__sigv4_request *req)
{
    return req->method && req->method[0] && req->payload_hash &&
           (req->n_headers == 0 || req->headers);
}

/* The first header named name (any case), or NULL. */
static const struct sf__header *sigv4_find_header(const struct sf__header *hdrs, size_t n,
                                                  const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (hdrs[i].name && sigv4_casecmp(hdrs[i].name, name) == 0)
            return &hdrs[i];
    }
    return NULL;
}

/* Whether value, trimmed of surrounding whitespace, equals want. */
static int sigv4_trimmed_eq(const char *value, const char *want)
{
    if (!value)
        return 0;
    while (*value && sigv4_is_ws(*value))
        value++;
    size_t n = strlen(value);
    while (n > 0 && sigv4_is_ws(value[n - 1]))
        n--;
    return n == strlen(want) && memcmp(value, want, n) == 0;
}

sf_status sf__sigv4_sign(struct sf__sigv4_signer *s, const struct sf__sigv4_request *req,
                         const char *amz_date, struct sf__sigv4_result *out)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (!s || !req || !amz_date || !sf__sigv4_signer_ok(s) || !sf__sigv4_request_ok(req))
        return SF_ERR_INVALID_ARGUMENT;
    time_t t;
    if (sf__sigv4_parse_date(amz_date, &t) != SF_OK)
        return SF_ERR_INVALID_ARGUMENT;
    const struct sf__header *date_hdr =
        sigv4_find_header(req->headers, req->n_headers, "x-amz-date");
    if (!sigv4_find_header(req->headers, req->n_headers, "host") || !date_hdr ||
        !sigv4_trimmed_eq(date_hdr->value, amz_date))
        return SF_ERR_INVALID_ARGUMENT;

    char date[9];
    memcpy(date, amz_date, 8);
    date[8] = '\0';
    struct sf__sigv4_scope scope = {date, s->region, s->service};
    return sf__sigv4_compute(s, &scope, req, req->headers, req->n_headers, amz_date, out);
}

sf_status sf__sigv4_sign_request(struct sf__sigv4_signer *s, const struct sf__sigv4_request *req,
                                 time_t now, char amz_date_out[SF__AMZ_DATE_LEN + 1],
                                 struct sf__header extra[3], size_t *n_extra,
                                 struct sf__sigv4_result *out)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (n_extra)
        *n_extra = 0;
    if (!s || !req || !amz_date_out || !extra || !n_extra || !sf__sigv4_signer_ok(s) ||
        !sf__sigv4_request_ok(req))
        return SF_ERR_INVALID_ARGUMENT;
    /* Headers this call adds must not be there twice. */
    static const char *const added[] = {"x-amz-date", "x-amz-content-sha256",
                                        "x-amz-security-token"};
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++) {
        if (sigv4_find_header(req->headers, req->n_headers, added[i]))
            return SF_ERR_INVALID_ARGUMENT;
    }
    if (req->n_headers > SIZE_MAX / sizeof(struct sf__header) - 3)
        return SF_ERR_LIMIT;

    sf__sigv4_format_date(now, amz_date_out);
    time_t check;
    if (sf__sigv4_parse_date(amz_date_out, &check) != SF_OK)
        return SF_ERR_INVALID_ARGUMENT;

    size_t n = 0;
    extra[n].name = "x-amz-date";
    extra[n++].value = amz_date_out;
    extra[n].name = "x-amz-content-sha256";
    extra[n++].value = req->payload_hash;
    if (s->session_token && s->session_token[0]) {
        extra[n].name = "x-amz-security-token";
        extra[n++].value = s->session_token;
    }

    size_t total = req->n_headers + n;
    struct sf__header *all = malloc(total * sizeof *all);
    if (!all)
        return SF_ERR_NO_MEMORY;
    if (req->n_headers)
        memcpy(all, req->headers, req->n_headers * sizeof *all);
    memcpy(all + req->n_headers, extra, n * sizeof *all);

    struct sf__sigv4_request signed_req = *req;
    signed_req.headers = all;
    signed_req.n_headers = total;
    sf_status st = sf__sigv4_sign(s, &signed_req, amz_date_out, out);
    free(all);
    if (st == SF_OK)
        *n_extra = n;
    return st;
}

/* ------------------------------------------------- aws-chunked signatures */

sf_status sf__sigv4_sign_chunk(struct sf__sigv4_signer *s, const char *amz_date,
                               const char *scope_date, const char *region, const char *service,
                               const char *prev_signature, int trailer, const char *sha256_hex,
                               char out[SF__SHA256_HEX_LEN + 1])
{
    if (!s || !amz_date || !scope_date || !region || !service || !prev_signature ||
        !sha256_hex || !out || !sf__sigv4_signer_ok(s) ||
        strlen(prev_signature) != SF__SHA256_HEX_LEN || strlen(sha256_hex) != SF__SHA256_HEX_LEN)
        return SF_ERR_INVALID_ARGUMENT;
    struct sf__strbuf sts;
    sf__strbuf_init(&sts, SIGV4_MAX_SMALL_BYTES);
    sf__strbuf_printf(&sts, "%s\n%s\n%s/%s/%s/" SIGV4_TERMINATOR "\n%s\n",
                      trailer ? SIGV4_ALGORITHM "-TRAILER" : SIGV4_ALGORITHM "-PAYLOAD", amz_date,
                      scope_date, region, service, prev_signature);
    if (!trailer)
        sf__strbuf_puts(&sts, SF__EMPTY_SHA256 "\n");
    sf__strbuf_puts(&sts, sha256_hex);
    unsigned char key[32], mac[32];
    sf_status st = sts.err;
    if (st == SF_OK)
        st = sigv4_signing_key(s, scope_date, region, service, key);
    if (st == SF_OK)
        st = sigv4_hmac(key, sizeof key, sts.data, sts.len, mac);
    OPENSSL_cleanse(key, sizeof key);
    sf__strbuf_free(&sts);
    if (st != SF_OK)
        return st;
    sf__hex_encode(mac, sizeof mac, out);
    return SF_OK;
}
