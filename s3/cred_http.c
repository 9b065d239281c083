/*
 * One request to a credentials endpoint (container or IMDS): a synchronous
 * libcurl easy transfer on the chain's reused handle, in the calling thread
 * under the chain's mutex, with a capped body, no proxy and no redirects.
 */
#include "s3/credentials_internal.h"
#include "common/secret.h"
#include "s3/socket.h"

#include <stdio.h>

static size_t on_body(char *data, size_t size, size_t nmemb, void *user)
{
    struct http_resp *r = user;
    size_t n = size * nmemb;
    if (sf__strbuf_append(&r->body, data, n) != SF_OK)
        return 0; /* over the cap: CURLE_WRITE_ERROR */
    return n;
}

void sf__cred_http_resp_free(struct http_resp *r)
{
    if (r->body.data)
        sf__wipe(r->body.data, r->body.cap);
    sf__strbuf_free(&r->body);
}

/* url for messages: no user info, no query, no fragment. */
void sf__cred_display_url(const char *url, char *buf, size_t len)
{
    CURLU *u = curl_url();
    char *s = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK) {
        curl_url_set(u, CURLUPART_USER, NULL, 0);
        curl_url_set(u, CURLUPART_PASSWORD, NULL, 0);
        curl_url_set(u, CURLUPART_QUERY, NULL, 0);
        curl_url_set(u, CURLUPART_FRAGMENT, NULL, 0);
        curl_url_get(u, CURLUPART_URL, &s, 0);
    }
    snprintf(buf, len, "%s", s ? s : "(unparsable URL)");
    curl_free(s);
    curl_url_cleanup(u);
}

/*
 * One request, retried up to c->attempts times on transport errors and 5xx.
 * put: an empty-bodied PUT. headers may hold secrets; they are never
 * reported. On a transport failure why says what curl said.
 */
sf_status sf__cred_http_request(struct sf__cred_chain *c, int put, const char *url,
                                struct curl_slist *headers, struct http_resp *r, char *why,
                                size_t why_len)
{
    char shown[512];
    sf__cred_display_url(url, shown, sizeof(shown));
    if (!c->curl) {
        c->curl = curl_easy_init();
        if (!c->curl)
            return sf__fail(why, why_len, SF_ERR_NO_MEMORY, "curl_easy_init failed");
    }
    sf_status st = SF_ERR_NETWORK;
    for (unsigned attempt = 1; attempt <= c->attempts; attempt++) {
        CURL *h = c->curl;
        curl_easy_reset(h);
        sf__cred_http_resp_free(r);
        sf__strbuf_init(&r->body, BODY_MAX_BYTES);
        r->status = 0;
        char ebuf[CURL_ERROR_SIZE];
        ebuf[0] = '\0';
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        /* Credentials endpoints are link-local or loopback: never via a proxy. */
        curl_easy_setopt(h, CURLOPT_PROXY, "");
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->timeout_ms);
        curl_easy_setopt(h, CURLOPT_USERAGENT, "shardfeed/" SF_VERSION_STRING);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
        if (c->ca_bundle)
            curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_bundle);
        int socket_errno = 0;
        curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, sf__socket_open);
        curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, &socket_errno);
        if (put) {
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
        }
        CURLcode rc = curl_easy_perform(h);
        /* Nothing of ours may outlive this call inside the reused handle. */
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
        curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, NULL);
        if (rc == CURLE_WRITE_ERROR && r->body.err == SF_ERR_LIMIT)
            return sf__fail(why, why_len, SF_ERR_LIMIT, "%s %s: response over %zu bytes",
                            put ? "PUT" : "GET", shown, BODY_MAX_BYTES);
        if (rc == CURLE_OK) {
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
            if (r->status < 500 || attempt == c->attempts)
                return SF_OK;
            sf__fail(why, why_len, SF_OK, "%s %s: HTTP %ld", put ? "PUT" : "GET", shown, r->status);
            continue;
        }
        st = rc == CURLE_OPERATION_TIMEDOUT ? SF_ERR_TIMEOUT : SF_ERR_NETWORK;
        char said[CURL_ERROR_SIZE + 200];
        snprintf(said, sizeof(said), "%s", ebuf[0] ? ebuf : curl_easy_strerror(rc));
        sf__socket_why(socket_errno, said, sizeof(said));
        sf__fail(why, why_len, SF_OK, "%s %s: %s (%u attempt%s, timeout %u ms each)",
                 put ? "PUT" : "GET", shown, said, c->attempts, c->attempts == 1 ? "" : "s",
                 c->timeout_ms);
    }
    return st;
}
