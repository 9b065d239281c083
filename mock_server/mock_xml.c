/* S3's XML answers: escaping, elements, and the <Error> body of a refused
 * request (HEAD errors carry only x-amz-error-code). */

#include "mock_server/mock_internal.h"

#include "mock_server/faults.h"
#include "s3/uri.h"
#include "common/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mock_xml_escape(struct sf__strbuf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '&': sf__strbuf_puts(b, "&amp;"); break;
        case '<': sf__strbuf_puts(b, "&lt;"); break;
        case '>': sf__strbuf_puts(b, "&gt;"); break;
        case '"': sf__strbuf_puts(b, "&quot;"); break;
        case '\'': sf__strbuf_puts(b, "&apos;"); break;
        default:
            if (c < 0x20 && c != '\t' && c != '\n')
                sf__strbuf_printf(b, "&#x%X;", c);
            else
                sf__strbuf_putc(b, (char)c);
        }
    }
}

/* <tag>escaped value</tag>, url-encoded first when url_encode. */
void mock_xml_elem(struct sf__strbuf *b, const char *tag, const char *value, int url_encode)
{
    sf__strbuf_printf(b, "<%s>", tag);
    if (url_encode) {
        struct sf__strbuf enc;
        sf__strbuf_init(&enc, 0);
        sf__uri_encode(&enc, value, strlen(value), 1);
        mock_xml_escape(b, sf__strbuf_str(&enc), enc.len);
        sf__strbuf_free(&enc);
    } else {
        mock_xml_escape(b, value, strlen(value));
    }
    sf__strbuf_printf(b, "</%s>", tag);
}

/* A listing's encoding-type: "url" is the only one S3 knows. */
int mock_param_url_encoding(const struct request *rq, struct s3_error *e)
{
    const char *enc = mock_param_get(rq, "encoding-type");
    if (!enc)
        return 0;
    if (strcmp(enc, "url") != 0) {
        mock_set_error(e, 400, "InvalidArgument", "Invalid Encoding Method specified in Request");
        return -1;
    }
    return 1;
}

void mock_set_error(struct s3_error *e, int status, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
}

enum MHD_Result mock_respond_error(struct request *rq, struct MHD_Connection *conn,
                                   struct s3_error *e, const char *fault)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<Error>");
    mock_xml_elem(&b, "Code", e->code, 0);
    mock_xml_elem(&b, "Message", e->message, 0);
    if (rq->bucket)
        mock_xml_elem(&b, "BucketName", rq->bucket, 0);
    if (rq->key)
        mock_xml_elem(&b, "Key", rq->key, 0);
    struct sf__strbuf res;
    sf__strbuf_init(&res, 0);
    sf__uri_decode(&res, rq->path ? rq->path : "/", rq->path ? strlen(rq->path) : 1, 0);
    mock_xml_elem(&b, "Resource", sf__strbuf_str(&res), 0);
    sf__strbuf_free(&res);
    mock_xml_elem(&b, "RequestId", rq->request_id, 0);
    if (e->bucket_region)
        mock_xml_elem(&b, "Region", e->bucket_region, 0);
    if (e->extra_xml)
        sf__strbuf_puts(&b, e->extra_xml);
    sf__strbuf_puts(&b, "</Error>");
    free(e->extra_xml);
    e->extra_xml = NULL;
    struct MHD_Response *resp;
    size_t len = 0;
    if (strcmp(rq->method, "HEAD") == 0) {
        /* S3 answers HEAD errors without a body; libmicrohttpd drops it anyway. */
        sf__strbuf_free(&b);
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (resp)
            MHD_add_response_header(resp, "x-amz-error-code", e->code);
    } else {
        len = b.len;
        char *data = sf__strbuf_take(&b);
        if (!data)
            return MHD_NO;
        resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
            free(data);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "application/xml");
    }
    if (resp && e->bucket_region)
        MHD_add_response_header(resp, "x-amz-bucket-region", e->bucket_region);
    return mock_queue(rq, conn, e->status, resp, len, fault);
}

enum MHD_Result mock_respond_fault_status(struct request *rq, struct MHD_Connection *conn,
                                          const struct mock_fault_plan *plan)
{
    struct s3_error e = {0};
    if (plan->status == 400)
        mock_set_error(&e, 400, "InvalidRequest", "A 400 forced by a queued or header fault.");
    else if (plan->status == 500)
        mock_set_error(&e, 500, "InternalError",
                       "We encountered an internal error. Please try again.");
    else
        mock_set_error(&e, 503, "SlowDown", "Please reduce your request rate.");
    const char *fault = plan->status == 400   ? "400"
                        : plan->status == 500 ? "500"
                        : plan->throttled     ? "rate_limit"
                                              : "503";
    return mock_respond_error(rq, conn, &e, fault);
}
