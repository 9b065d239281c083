/* What the body of a PutObject or UploadPart must pass besides its MD5:
 * aws-chunked decoding (the decoder is chunked.c) and the x-amz-checksum-*
 * headers and trailers (checksum.c). */

#include "mock_server/mock_internal.h"

#include "mock_server/checksum.h"
#include "mock_server/chunked.h"
#include "mock_server/stats.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mock_parse_decimal_u64(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9' || strlen(s) > 19)
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return 0;
    *out = v;
    return 1;
}

/* The x-amz-checksum-* headers of an upload, and the checksums x-amz-trailer
 * announces for an aws-chunked one: which to compute while the body streams. */
int mock_body_checksums_begin(struct request *rq, struct MHD_Connection *conn, int chunked,
                              struct s3_error *e)
{
    for (int i = 0; i < MOCK_CK_COUNT; i++) {
        const char *v = mock_header(conn, mock_checksum_header(i));
        if (!v)
            continue;
        if (strlen(v) >= MOCK_CK_B64_MAX) {
            mock_set_error(e, 400, "InvalidRequest", "Value for %s header is invalid (%s).",
                           mock_checksum_header(i), rq->target);
            return -1;
        }
        rq->up_ck_header_mask |= 1u << i;
        snprintf(rq->up_ck_given[i], MOCK_CK_B64_MAX, "%s", v);
    }
    const char *trailer = chunked ? mock_header(conn, "x-amz-trailer") : NULL;
    while (trailer && *trailer) {
        while (*trailer == ' ' || *trailer == ',')
            trailer++;
        size_t n = strcspn(trailer, ", ");
        char name[64];
        if (n > 0 && n < sizeof name) {
            memcpy(name, trailer, n);
            name[n] = '\0';
            int alg = mock_checksum_from_header(name);
            if (alg >= 0)
                rq->up_ck_trailer_mask |= 1u << alg;
        }
        trailer += n;
    }
    unsigned want = rq->up_ck_header_mask | rq->up_ck_trailer_mask;
    if (!want)
        return 0;
    rq->up_ck_on = 1;
    if (mock_checksums_init(&rq->up_ck, want) != 0) {
        mock_set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    return 0;
}

/* Where an aws-chunked decoder puts the decoded bytes. */
static int chunked_sink(void *cls, const char *data, size_t n)
{
    struct request *rq = cls;
    if (mock_put_consume(rq, data, n) == 0)
        return 0;
    if (rq->up_too_large)
        mock_chunked_fail(rq->up_chunked, 400, "EntityTooLarge",
                          "Your proposed upload exceeds the maximum allowed size");
    return -1;
}

int mock_body_chunked_begin(struct request *rq, enum mock_chunked_mode mode, const char *payload,
                            struct s3_error *e)
{
    if (mode != MOCK_CHUNKED_UNSIGNED_TRAILER && !rq->auth_signed) {
        mock_set_error(e, 400, "InvalidRequest",
                       "%s needs a signed request (the chunks are signed with its signature)",
                       payload);
        return -1;
    }
    struct mock_chunked_config cfg = {
        .mode = mode,
        .sink = chunked_sink,
        .sink_cls = rq,
        .signer = &rq->srv->signer,
        .amz_date = rq->amz_date,
        .scope_date = rq->auth.date,
        .region = rq->auth.region,
        .service = rq->auth.service,
        .seed_signature = rq->auth.signature,
    };
    rq->up_chunked = mock_chunked_new(&cfg);
    if (!rq->up_chunked) {
        mock_set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    rq->up_chunked_mode =
        mode == MOCK_CHUNKED_UNSIGNED_TRAILER ? "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        : mode == MOCK_CHUNKED_SIGNED         ? "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
                                              : "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
    return 0;
}

/* An aws-chunked body that ended: complete, of the declared length, with
 * every announced trailer; the trailers' checksums join the headers'. */
int mock_body_chunked_end(struct request *rq, int failed, struct s3_error *e)
{
    struct mock_chunked *c = rq->up_chunked;
    if (failed || mock_chunked_finish(c) != 0) {
        int status;
        const char *code, *msg;
        mock_chunked_error(c, &status, &code, &msg);
        mock_set_error(e, status, code, "%s (%s)", msg, rq->target);
        return -1;
    }
    uint64_t got = mock_chunked_decoded_bytes(c);
    if (got != rq->up_decoded_len) {
        mock_set_error(e, 400, "IncompleteBody",
                       "You did not provide the number of bytes specified by the "
                       "x-amz-decoded-content-length HTTP header: it says %llu, the aws-chunked "
                       "body of %s decoded to %llu",
                       (unsigned long long)rq->up_decoded_len, rq->target, (unsigned long long)got);
        return -1;
    }
    size_t n = 0;
    const struct mock_trailer *t = mock_chunked_trailers(c, &n);
    unsigned seen = 0;
    for (size_t i = 0; i < n; i++) {
        int alg = mock_checksum_from_header(t[i].name);
        if (alg < 0)
            continue; /* a checksum the mock cannot compute, or another trailer */
        if (!(rq->up_ck_trailer_mask & (1u << alg))) {
            mock_set_error(e, 400, "MalformedTrailerError",
                           "The trailer %s of %s was not announced in x-amz-trailer", t[i].name,
                           rq->target);
            return -1;
        }
        if (strlen(t[i].value) >= MOCK_CK_B64_MAX) {
            mock_set_error(e, 400, "InvalidRequest", "Value for %s trailer is invalid (%s).",
                           t[i].name, rq->target);
            return -1;
        }
        seen |= 1u << alg;
        snprintf(rq->up_ck_given[alg], MOCK_CK_B64_MAX, "%s", t[i].value);
    }
    if (seen != rq->up_ck_trailer_mask) {
        mock_set_error(e, 400, "MalformedTrailerError",
                       "The request of %s announced a checksum trailer in x-amz-trailer that the "
                       "body did not carry",
                       rq->target);
        return -1;
    }
    mock_stats_count(rq->srv->stats, "aws_chunked", rq->up_chunked_mode);
    return 0;
}

/* Checks the computed checksums against the given ones (headers, trailers);
 * the checked values are kept to be echoed in the answer. */
int mock_body_checksums_end(struct request *rq, struct s3_error *e)
{
    if (!rq->up_ck_on)
        return 0;
    char got[MOCK_CK_COUNT][MOCK_CK_B64_MAX];
    if (mock_checksums_final(&rq->up_ck, got) != 0) {
        mock_set_error(e, 500, "InternalError", "Computing the checksum of %s failed", rq->target);
        return -1;
    }
    for (int i = 0; i < MOCK_CK_COUNT; i++) {
        if (!(rq->up_ck.want & (1u << i)))
            continue;
        if (strcmp(got[i], rq->up_ck_given[i]) != 0) {
            mock_set_error(e, 400, "BadDigest",
                           "The %s you specified did not match the calculated checksum (%s: given "
                           "%s, computed %s).",
                           mock_checksum_name(i), rq->target, rq->up_ck_given[i], got[i]);
            return -1;
        }
        memcpy(rq->up_ck_echo[i], got[i], MOCK_CK_B64_MAX);
    }
    for (int i = 0; i < MOCK_CK_COUNT; i++)
        if (rq->up_ck.want & (1u << i))
            mock_stats_count(rq->srv->stats, "checksums", mock_checksum_name(i));
    return 0;
}
