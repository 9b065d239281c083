/* SigV4 authentication of a request: the Authorization header, the clock
 * skew, x-amz-content-sha256, the session token, and the signature checked
 * with the client's own code (s3/sigv4.c). */

#include "mock_server/mock_internal.h"

#include "mock_server/chunked.h"
#include "s3/sigv4.h"
#include "common/strbuf.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_SKEW_S  (15 * 60)
#define MAX_HEADERS 128

struct header_vec {
    struct sf__header h[MAX_HEADERS];
    size_t n;
    int overflow;
};

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    struct header_vec *hv = cls;
    if (hv->n == MAX_HEADERS) {
        hv->overflow = 1;
        return MHD_NO;
    }
    hv->h[hv->n].name = key;
    hv->h[hv->n].value = value ? value : "";
    hv->n++;
    return MHD_YES;
}

int mock_authenticate(struct request *rq, struct MHD_Connection *conn, struct s3_error *e)
{
    struct mock_server *srv = rq->srv;
    const char *authz = mock_header(conn, "Authorization");
    if (!authz) {
        if (mock_param_has(rq, "X-Amz-Signature")) {
            mock_set_error(e, 501, "NotImplemented",
                           "Presigned URLs are not supported by the mock.");
            return -1;
        }
        if (srv->cfg.anonymous)
            return 0;
        mock_set_error(e, 403, "AccessDenied", "Access Denied: the request is not signed.");
        return -1;
    }
    struct sf__sigv4_auth auth;
    if (sf__sigv4_parse_authorization(authz, &auth) != SF_OK) {
        mock_set_error(e, 400, "AuthorizationHeaderMalformed",
                       "The authorization header is malformed; expected AWS4-HMAC-SHA256 "
                       "Credential=..., SignedHeaders=..., Signature=...");
        return -1;
    }
    if (strcmp(auth.access_key_id, srv->cfg.access_key) != 0) {
        mock_set_error(e, 403, "InvalidAccessKeyId",
                       "The AWS Access Key Id you provided does not exist in our records.");
        return -1;
    }
    if (strcmp(auth.region, srv->cfg.region) != 0 || strcmp(auth.service, "s3") != 0) {
        mock_set_error(e, 400, "AuthorizationHeaderMalformed",
                       "The authorization header is malformed; the region '%s' is wrong; "
                       "expecting '%s' (service '%s', expecting 's3')",
                       auth.region, srv->cfg.region, auth.service);
        if (rq->bucket)
            e->bucket_region = srv->cfg.region;
        return -1;
    }
    const char *amz_date = mock_header(conn, "x-amz-date");
    time_t t;
    if (!amz_date || sf__sigv4_parse_date(amz_date, &t) != SF_OK) {
        mock_set_error(e, 403, "AccessDenied",
                       "AWS authentication requires a valid Date or x-amz-date header");
        return -1;
    }
    time_t now = time(NULL);
    if (t > now + MAX_SKEW_S || t < now - MAX_SKEW_S) {
        mock_set_error(e, 403, "RequestTimeTooSkewed",
                       "The difference between the request time (%s) and the current time is too "
                       "large.",
                       amz_date);
        return -1;
    }
    const char *payload = mock_header(conn, "x-amz-content-sha256");
    if (!payload) {
        mock_set_error(e, 400, "InvalidRequest",
                       "Missing required header for this request: x-amz-content-sha256");
        return -1;
    }
    enum mock_chunked_mode chunked_mode;
    int streaming = mock_chunked_mode_of(payload, &chunked_mode) == 0;
    if (!streaming && strncmp(payload, "STREAMING-", 10) == 0) {
        mock_set_error(e, 501, "NotImplemented",
                       "aws-chunked payloads of the form %s are not supported by the mock",
                       payload);
        return -1;
    }
    if (!streaming && strcmp(payload, SF__UNSIGNED_PAYLOAD) != 0) {
        size_t n = strlen(payload);
        int hex = n == SF__SHA256_HEX_LEN;
        for (size_t i = 0; hex && i < n; i++)
            hex = (payload[i] >= '0' && payload[i] <= '9') ||
                  (payload[i] >= 'a' && payload[i] <= 'f');
        if (!hex) {
            mock_set_error(e, 400, "InvalidArgument",
                           "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, "
                           "STREAMING-... or a lower-case hex SHA-256");
            return -1;
        }
    }
    if (mock_check_session_token(srv, mock_header(conn, "x-amz-security-token"), e) != 0)
        return -1;
    struct header_vec hv = {.n = 0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, &hv);
    if (hv.overflow) {
        mock_set_error(e, 400, "InvalidRequest", "Too many request headers");
        return -1;
    }
    struct sf__sigv4_request sreq = {
        .method = rq->method,
        .path = rq->path,
        .query = rq->query,
        .headers = hv.h,
        .n_headers = hv.n,
        .payload_hash = payload,
    };
    struct sf__sigv4_result res = {0};
    sf_status rc = sf__sigv4_verify(&srv->signer, &auth, &sreq, amz_date, &res);
    if (rc == SF_OK) {
        sf__sigv4_result_free(&res);
        rq->auth_signed = 1;
        rq->auth = auth;
        snprintf(rq->amz_date, sizeof rq->amz_date, "%s", amz_date);
        return 0;
    }
    if (rc == SF_ERR_SIGNATURE || rc == SF_ERR_PARSE) {
        mock_set_error(e, 403, "SignatureDoesNotMatch",
                       "The request signature we calculated does not match the signature you "
                       "provided. Check your key and signing method.");
        struct sf__strbuf x;
        sf__strbuf_init(&x, 0);
        sf__strbuf_puts(&x, "<AWSAccessKeyId>");
        mock_xml_escape(&x, auth.access_key_id, strlen(auth.access_key_id));
        sf__strbuf_puts(&x, "</AWSAccessKeyId>");
        if (res.string_to_sign)
            mock_xml_elem(&x, "StringToSign", res.string_to_sign, 0);
        mock_xml_elem(&x, "SignatureProvided", auth.signature, 0);
        if (res.canonical_request)
            mock_xml_elem(&x, "CanonicalRequest", res.canonical_request, 0);
        e->extra_xml = sf__strbuf_take(&x);
    } else {
        mock_set_error(e, 500, "InternalError", "Signature verification failed: %s",
                       sf_status_str(rc));
    }
    sf__sigv4_result_free(&res);
    return -1;
}
