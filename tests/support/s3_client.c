#include "support/s3_client.h"

#include "s3/sigv4.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
    struct sf__strbuf *b = ud;
    return sf__strbuf_append(b, data, size * n) == SF_OK ? size * n : 0;
}

static size_t on_header(char *data, size_t size, size_t n, void *ud)
{
    struct sf__strbuf *b = ud;
    return sf__strbuf_append(b, data, size * n) == SF_OK ? size * n : 0;
}

int s3_call(const char *base, const struct s3_call *c, struct s3_resp *resp)
{
    memset(resp, 0, sizeof(*resp));
    sf__strbuf_init(&resp->body, 512u << 20);
    sf__strbuf_init(&resp->headers, 0);
    CURL *h = curl_easy_init();
    if (!h)
        return -1;
    char url[8192];
    snprintf(url, sizeof(url), "%s%s", base, c->target);
    const char *host = strstr(base, "://");
    host = host ? host + 3 : base;

    struct curl_slist *list = NULL;
    struct sf__header hdrs[40];
    char names[40][128];
    size_t nh = 0;
    hdrs[nh++] = (struct sf__header){"host", host};
    for (size_t i = 0; c->headers && c->headers[i] && nh < 36; i++) {
        list = curl_slist_append(list, c->headers[i]);
        const char *colon = strchr(c->headers[i], ':');
        size_t nl = colon ? (size_t)(colon - c->headers[i]) : 0;
        if (!colon || nl >= sizeof(names[0]))
            continue;
        memcpy(names[nh], c->headers[i], nl);
        names[nh][nl] = '\0';
        const char *v = colon + 1;
        while (*v == ' ')
            v++;
        hdrs[nh] = (struct sf__header){names[nh], v};
        nh++;
    }
    char hash[SF__SHA256_HEX_LEN + 1];
    if (c->unsigned_payload)
        snprintf(hash, sizeof(hash), "%s", SF__UNSIGNED_PAYLOAD);
    else
        sf__sha256_hex(c->body ? c->body : "", c->body_len, hash);
    const char *payload = c->payload_hash ? c->payload_hash : hash;

    struct sf__sigv4_signer signer;
    int have_signer = 0;
    if (c->creds) {
        sf__sigv4_signer_init(&signer, c->creds->access_key, c->creds->secret_key,
                              c->creds->session_token,
                              c->creds->region ? c->creds->region : "us-east-1", "s3");
        have_signer = 1;
        const char *q = strchr(c->target, '?');
        char path[8192];
        size_t pl = q ? (size_t)(q - c->target) : strlen(c->target);
        memcpy(path, c->target, pl);
        path[pl] = '\0';
        struct sf__sigv4_request req = {
            .method = c->method,
            .path = path,
            .query = q ? q + 1 : NULL,
            .headers = hdrs,
            .n_headers = nh,
            .payload_hash = payload,
        };
        char amz_date[SF__AMZ_DATE_LEN + 1];
        struct sf__header extra[3];
        size_t n_extra = 0;
        struct sf__sigv4_result res = {0};
        if (sf__sigv4_sign_request(&signer, &req, c->when ? c->when : time(NULL), amz_date, extra,
                                   &n_extra, &res) != SF_OK) {
            sf__sigv4_signer_destroy(&signer);
            curl_slist_free_all(list);
            curl_easy_cleanup(h);
            return -1;
        }
        char line[4096];
        for (size_t i = 0; i < n_extra; i++) {
            snprintf(line, sizeof(line), "%s: %s", extra[i].name, extra[i].value);
            list = curl_slist_append(list, line);
        }
        snprintf(line, sizeof(line), "Authorization: %s", res.authorization);
        list = curl_slist_append(list, line);
        sf__sigv4_result_free(&res);
    }
    /* curl would add "Expect: 100-continue" to bodies; the mock answers it,
     * but tests want one plain round trip. */
    list = curl_slist_append(list, "Expect:");

    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, c->method);
    if (strcmp(c->method, "HEAD") == 0)
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    if (c->body || strcmp(c->method, "PUT") == 0 || strcmp(c->method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body ? c->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->body_len);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &resp->body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &resp->headers);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (c->ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
    if (c->low_speed_time_s) {
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->low_speed_time_s);
    }
    resp->curl_code = (int)curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
    curl_slist_free_all(list);
    curl_easy_cleanup(h);
    if (have_signer)
        sf__sigv4_signer_destroy(&signer);
    return resp->status ? 0 : -1;
}

void s3_resp_free(struct s3_resp *r)
{
    sf__strbuf_free(&r->body);
    sf__strbuf_free(&r->headers);
}

int s3_resp_header(const struct s3_resp *r, const char *name, char *out, size_t out_len)
{
    const char *p = sf__strbuf_str(&r->headers);
    size_t nl = strlen(name);
    while (p && *p) {
        const char *eol = strstr(p, "\r\n");
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t vl = len - (size_t)(v - p);
            if (vl >= out_len)
                vl = out_len - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return 0;
        }
        p = eol ? eol + 2 : NULL;
    }
    return -1;
}

int s3_xml_value(const struct s3_resp *r, const char *tag, char *out, size_t out_len)
{
    char open[128], close_[128];
    snprintf(open, sizeof(open), "<%s>", tag);
    snprintf(close_, sizeof(close_), "</%s>", tag);
    const char *a = strstr(sf__strbuf_str(&r->body), open);
    if (!a)
        return -1;
    a += strlen(open);
    const char *b = strstr(a, close_);
    if (!b)
        return -1;
    size_t n = (size_t)(b - a);
    if (n >= out_len)
        n = out_len - 1;
    memcpy(out, a, n);
    out[n] = '\0';
    return 0;
}

long mock_admin(const char *base, const char *method, const char *path_query, const char *body,
                char **out)
{
    struct s3_call c = {.method = method, .target = path_query, .body = body,
                        .body_len = body ? strlen(body) : 0};
    struct s3_resp r;
    if (s3_call(base, &c, &r) != 0) {
        s3_resp_free(&r);
        return -1;
    }
    if (out)
        *out = sf__strbuf_take(&r.body);
    long st = r.status;
    s3_resp_free(&r);
    return st;
}
