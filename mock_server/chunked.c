#include "mock_server/chunked.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A chunk header is "hex;chunk-signature=<64 hex>": far below this. Trailer
 * lines carry a checksum each. */
#define LINE_MAX_BYTES 1024
#define SIG_EXT        "chunk-signature="
#define TRAILER_SIG    "x-amz-trailer-signature"

enum state {
    ST_SIZE,        /* reading a chunk header line */
    ST_DATA,        /* chunk data, `left` bytes to go */
    ST_DATA_CRLF,   /* the "\r\n" after chunk data */
    ST_FINAL_CRLF,  /* signed, no trailer: the "\r\n" after the final chunk */
    ST_TRAILER,     /* trailer lines up to an empty one */
    ST_DONE,
    ST_FAILED,
};

struct mock_chunked {
    struct mock_chunked_config cfg;
    enum state st;
    char line[LINE_MAX_BYTES + 1];
    size_t line_len;
    uint64_t left;     /* data bytes left in the current chunk */
    uint64_t in_off;   /* encoded bytes consumed, for messages */
    uint64_t decoded;
    size_t crlf_seen;  /* bytes of an expected "\r\n" matched */
    int is_final;      /* the current chunk has size 0 */
    EVP_MD_CTX *chunk_sha; /* signed modes: SHA-256 of the current chunk's data */
    char chunk_sig[SF__SHA256_HEX_LEN + 1]; /* the signature the chunk header gave */
    char prev_sig[SF__SHA256_HEX_LEN + 1];
    int trailer_signed;
    struct mock_trailer trailers[MOCK_CHUNKED_MAX_TRAILERS];
    size_t n_trailers;
    int status;
    const char *code;
    char message[320];
};

int mock_chunked_mode_of(const char *payload_hash, enum mock_chunked_mode *mode)
{
    if (!payload_hash)
        return -1;
    if (strcmp(payload_hash, "STREAMING-UNSIGNED-PAYLOAD-TRAILER") == 0)
        *mode = MOCK_CHUNKED_UNSIGNED_TRAILER;
    else if (strcmp(payload_hash, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD") == 0)
        *mode = MOCK_CHUNKED_SIGNED;
    else if (strcmp(payload_hash, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER") == 0)
        *mode = MOCK_CHUNKED_SIGNED_TRAILER;
    else
        return -1;
    return 0;
}

static int is_signed(const struct mock_chunked_config *cfg)
{
    return cfg->mode != MOCK_CHUNKED_UNSIGNED_TRAILER;
}

static int has_trailer(const struct mock_chunked *c)
{
    return c->cfg.mode != MOCK_CHUNKED_SIGNED;
}

/* A signed stream needs everything its chunk signatures are made from. */
static int config_ok(const struct mock_chunked_config *cfg)
{
    if (!cfg || !cfg->sink)
        return 0;
    if (!is_signed(cfg))
        return 1;
    return cfg->signer && cfg->amz_date && cfg->scope_date && cfg->region && cfg->service &&
           cfg->seed_signature && strlen(cfg->seed_signature) == SF__SHA256_HEX_LEN;
}

struct mock_chunked *mock_chunked_new(const struct mock_chunked_config *cfg)
{
    if (!config_ok(cfg))
        return NULL;
    struct mock_chunked *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->cfg = *cfg;
    if (is_signed(&c->cfg)) {
        memcpy(c->prev_sig, cfg->seed_signature, sizeof c->prev_sig);
        if (!(c->chunk_sha = EVP_MD_CTX_new())) {
            free(c);
            return NULL;
        }
    }
    return c;
}

void mock_chunked_destroy(struct mock_chunked *c)
{
    if (!c)
        return;
    EVP_MD_CTX_free(c->chunk_sha);
    for (size_t i = 0; i < c->n_trailers; i++) {
        free(c->trailers[i].name);
        free(c->trailers[i].value);
    }
    free(c);
}

void mock_chunked_fail(struct mock_chunked *c, int status, const char *code, const char *message)
{
    if (c->st == ST_FAILED)
        return;
    c->st = ST_FAILED;
    c->status = status;
    c->code = code;
    snprintf(c->message, sizeof c->message, "%s", message);
}

static int failf(struct mock_chunked *c, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int failf(struct mock_chunked *c, int status, const char *code, const char *fmt, ...)
{
    char msg[sizeof c->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mock_chunked_fail(c, status, code, msg);
    return -1;
}

static int malformed(struct mock_chunked *c, const char *what)
{
    return failf(c, 400, "InvalidRequest",
                 "Malformed aws-chunked body: %s (at encoded byte %llu)", what,
                 (unsigned long long)c->in_off);
}

void mock_chunked_error(const struct mock_chunked *c, int *status, const char **code,
                        const char **message)
{
    *status = c->status ? c->status : 500;
    *code = c->code ? c->code : "InternalError";
    *message = c->message;
}

uint64_t mock_chunked_decoded_bytes(const struct mock_chunked *c)
{
    return c->decoded;
}

const struct mock_trailer *mock_chunked_trailers(const struct mock_chunked *c, size_t *n)
{
    *n = c->n_trailers;
    return c->trailers;
}

static int is_lower_hex(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
}

/* Checks the chained signature of a piece whose SHA-256 is hash_hex. */
static int check_signature(struct mock_chunked *c, int trailer, const char *hash_hex,
                           const char *given)
{
    char want[SF__SHA256_HEX_LEN + 1];
    if (sf__sigv4_sign_chunk(c->cfg.signer, c->cfg.amz_date, c->cfg.scope_date, c->cfg.region,
                             c->cfg.service, c->prev_sig, trailer, hash_hex, want) != SF_OK)
        return failf(c, 500, "InternalError", "Computing a chunk signature failed");
    if (strlen(given) != SF__SHA256_HEX_LEN ||
        CRYPTO_memcmp(want, given, SF__SHA256_HEX_LEN) != 0)
        return failf(c, 403, "SignatureDoesNotMatch",
                     "The %s signature we calculated does not match the signature you provided "
                     "(ending at encoded byte %llu, after %llu decoded bytes).",
                     trailer ? "trailer" : "chunk", (unsigned long long)c->in_off,
                     (unsigned long long)c->decoded);
    memcpy(c->prev_sig, want, sizeof c->prev_sig);
    return 0;
}

/* The current chunk's data is complete (or it is the final, empty chunk). */
static int chunk_done(struct mock_chunked *c)
{
    if (!is_signed(&c->cfg))
        return 0;
    unsigned char md[32];
    unsigned int len = 0;
    if (!EVP_DigestFinal_ex(c->chunk_sha, md, &len) || len != 32)
        return failf(c, 500, "InternalError", "SHA-256 failed");
    char hex[SF__SHA256_HEX_LEN + 1];
    sf__hex_encode(md, 32, hex);
    return check_signature(c, 0, hex, c->chunk_sig);
}

/* A complete chunk header line (without its "\r\n"). */
static int size_line(struct mock_chunked *c)
{
    const char *p = c->line;
    uint64_t size = 0;
    size_t digits = 0;
    for (; isxdigit((unsigned char)*p); p++, digits++) {
        if (digits == 15)
            return malformed(c, "chunk size too long");
        int v = *p <= '9' ? *p - '0' : (tolower((unsigned char)*p) - 'a' + 10);
        size = size * 16 + (uint64_t)v;
    }
    if (digits == 0)
        return malformed(c, "a chunk header does not start with a hex size");
    c->chunk_sig[0] = '\0';
    while (*p == ';') {
        p++;
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > sizeof SIG_EXT - 1 && strncmp(p, SIG_EXT, sizeof SIG_EXT - 1) == 0) {
            size_t sl = n - (sizeof SIG_EXT - 1);
            const char *s = p + sizeof SIG_EXT - 1;
            int ok = sl == SF__SHA256_HEX_LEN;
            for (size_t i = 0; ok && i < sl; i++)
                ok = is_lower_hex(s[i]);
            if (!ok)
                return malformed(c, "a chunk-signature is not 64 lower-case hex digits");
            memcpy(c->chunk_sig, s, SF__SHA256_HEX_LEN);
            c->chunk_sig[SF__SHA256_HEX_LEN] = '\0';
        }
        p += n;
    }
    if (*p)
        return malformed(c, "unexpected characters in a chunk header");
    if (is_signed(&c->cfg) && !c->chunk_sig[0])
        return failf(c, 403, "SignatureDoesNotMatch",
                     "A chunk of a signed aws-chunked body has no chunk-signature (at encoded "
                     "byte %llu).",
                     (unsigned long long)c->in_off);
    if (c->chunk_sha && !EVP_DigestInit_ex(c->chunk_sha, EVP_sha256(), NULL))
        return failf(c, 500, "InternalError", "SHA-256 failed");
    c->left = size;
    c->is_final = size == 0;
    if (size > 0) {
        c->st = ST_DATA;
        return 0;
    }
    if (chunk_done(c) != 0)
        return -1;
    c->st = has_trailer(c) ? ST_TRAILER : ST_FINAL_CRLF;
    c->crlf_seen = 0;
    return 0;
}

static int malformed_trailer(struct mock_chunked *c, const char *what)
{
    return failf(c, 400, "MalformedTrailerError",
                 "The request contained trailing data that was not well-formed or did not "
                 "conform to our published schema: %s.",
                 what);
}

/* The trailers as signed: "name:value\n" each, in the order received. */
static int check_trailer_signature(struct mock_chunked *c, const char *given)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned int len = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    for (size_t i = 0; ok && i < c->n_trailers; i++) {
        ok = EVP_DigestUpdate(ctx, c->trailers[i].name, strlen(c->trailers[i].name)) &&
             EVP_DigestUpdate(ctx, ":", 1) &&
             EVP_DigestUpdate(ctx, c->trailers[i].value, strlen(c->trailers[i].value)) &&
             EVP_DigestUpdate(ctx, "\n", 1);
    }
    ok = ok && EVP_DigestFinal_ex(ctx, md, &len) && len == 32;
    EVP_MD_CTX_free(ctx);
    if (!ok)
        return failf(c, 500, "InternalError", "SHA-256 failed");
    char hex[SF__SHA256_HEX_LEN + 1];
    sf__hex_encode(md, 32, hex);
    return check_signature(c, 1, hex, given);
}

/* A complete trailer line (without its line end). */
static int trailer_line(struct mock_chunked *c)
{
    if (c->line_len == 0) {
        if (c->cfg.mode == MOCK_CHUNKED_SIGNED_TRAILER && !c->trailer_signed)
            return malformed_trailer(c, "no x-amz-trailer-signature");
        c->st = ST_DONE;
        return 0;
    }
    if (c->trailer_signed)
        return malformed_trailer(c, "a trailer after x-amz-trailer-signature");
    char *colon = strchr(c->line, ':');
    if (!colon || colon == c->line)
        return malformed_trailer(c, "a trailer line is not name:value");
    *colon = '\0';
    for (char *q = c->line; *q; q++)
        *q = (char)tolower((unsigned char)*q);
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t vl = strlen(v);
    while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
        v[--vl] = '\0';
    if (strcmp(c->line, TRAILER_SIG) == 0) {
        if (c->cfg.mode != MOCK_CHUNKED_SIGNED_TRAILER)
            return 0; /* nothing to check it with */
        if (check_trailer_signature(c, v) != 0)
            return -1;
        c->trailer_signed = 1;
        return 0;
    }
    if (c->n_trailers == MOCK_CHUNKED_MAX_TRAILERS)
        return malformed_trailer(c, "too many trailers");
    struct mock_trailer *t = &c->trailers[c->n_trailers];
    t->name = strdup(c->line);
    t->value = strdup(v);
    if (!t->name || !t->value) {
        free(t->name);
        free(t->value);
        t->name = t->value = NULL;
        return failf(c, 500, "InternalError", "Out of memory");
    }
    c->n_trailers++;
    return 0;
}

/* Collects a line up to '\n'; *used is what was taken from data. 1 when a
 * line is complete (in c->line, NUL-terminated, "\r" and "\n" removed). */
static int take_line(struct mock_chunked *c, const char *data, size_t n, size_t *used, int need_cr,
                     int *err)
{
    const char *nl = memchr(data, '\n', n);
    size_t take = nl ? (size_t)(nl - data) : n;
    *err = 0;
    if (c->line_len + take > LINE_MAX_BYTES) {
        *err = malformed(c, "a framing line is too long");
        return 0;
    }
    memcpy(c->line + c->line_len, data, take);
    c->line_len += take;
    *used = nl ? take + 1 : take;
    if (!nl)
        return 0;
    if (c->line_len > 0 && c->line[c->line_len - 1] == '\r') {
        c->line_len--;
    } else if (need_cr) {
        *err = malformed(c, "a framing line does not end with CRLF");
        return 0;
    }
    c->line[c->line_len] = '\0';
    if (memchr(c->line, '\0', c->line_len)) {
        *err = malformed(c, "a NUL byte in a framing line");
        return 0;
    }
    return 1;
}

int mock_chunked_feed(struct mock_chunked *c, const char *data, size_t n)
{
    while (n > 0) {
        size_t used = 0;
        int err = 0;
        switch (c->st) {
        case ST_FAILED:
            return -1;
        case ST_DONE:
            c->in_off += n;
            return malformed(c, "data after the final chunk");
        case ST_SIZE:
        case ST_TRAILER: {
            int st_trailer = c->st == ST_TRAILER;
            int got = take_line(c, data, n, &used, !st_trailer, &err);
            if (err)
                return -1;
            c->in_off += used;
            if (got) {
                if ((st_trailer ? trailer_line(c) : size_line(c)) != 0)
                    return -1;
                c->line_len = 0;
            }
            break;
        }
        case ST_DATA: {
            used = n < c->left ? n : (size_t)c->left;
            if (c->chunk_sha && !EVP_DigestUpdate(c->chunk_sha, data, used))
                return failf(c, 500, "InternalError", "SHA-256 failed");
            if (c->cfg.sink(c->cfg.sink_cls, data, used) != 0)
                return failf(c, 500, "InternalError", "Writing the upload failed");
            c->left -= used;
            c->decoded += used;
            c->in_off += used;
            if (c->left == 0) {
                c->st = ST_DATA_CRLF;
                c->crlf_seen = 0;
            }
            break;
        }
        case ST_DATA_CRLF:
        case ST_FINAL_CRLF: {
            char want = c->crlf_seen == 0 ? '\r' : '\n';
            if (*data != want)
                return malformed(c, c->st == ST_DATA_CRLF ? "chunk data is not followed by CRLF"
                                                          : "the final chunk is not followed "
                                                            "by CRLF");
            used = 1;
            c->in_off++;
            if (++c->crlf_seen == 2) {
                if (c->st == ST_FINAL_CRLF) {
                    c->st = ST_DONE;
                } else {
                    if (chunk_done(c) != 0)
                        return -1;
                    c->st = ST_SIZE;
                    c->line_len = 0;
                }
            }
            break;
        }
        }
        data += used;
        n -= used;
    }
    return c->st == ST_FAILED ? -1 : 0;
}

int mock_chunked_finish(struct mock_chunked *c)
{
    switch (c->st) {
    case ST_FAILED:
        return -1;
    case ST_DONE:
        return 0;
    case ST_FINAL_CRLF:
        if (c->crlf_seen == 0)
            break; /* lenient: the body ended right after the final chunk */
        return malformed(c, "the body ended inside the final CRLF");
    case ST_TRAILER:
        if (c->line_len == 0) { /* lenient: no empty line after the trailers */
            c->line_len = 0;
            return trailer_line(c);
        }
        /* fall through */
    default:
        return failf(c, 400, "IncompleteBody",
                     "The aws-chunked body ended early: %s at encoded byte %llu (%llu bytes "
                     "decoded).",
                     c->st == ST_DATA ? "inside a chunk's data"
                     : c->st == ST_TRAILER ? "inside a trailer"
                                           : "before the final 0-size chunk",
                     (unsigned long long)c->in_off, (unsigned long long)c->decoded);
    }
    c->st = ST_DONE;
    return 0;
}
