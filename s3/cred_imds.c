/*
 * The EC2 instance metadata provider, IMDSv2: a session token (PUT
 * /latest/api/token, cached in the chain), then the role name and its
 * credentials.
 */
#include "s3/credentials_internal.h"
#include "common/secret.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define IMDS_TOKEN_TTL_S   21600
#define STR_(x)            #x
#define STR(x)             STR_(x)
#define IMDS_TOKEN_EARLY_S 300 /* fetch a new IMDS token this long before the old one expires */
#define IMDS_CREDS_PATH    "/latest/meta-data/iam/security-credentials/"

static int imds_token_valid(const struct sf__cred_chain *c)
{
    if (!c->imds_token[0])
        return 0;
    struct timespec now = sf__cred_mono_now();
    return now.tv_sec < c->imds_token_expiry.tv_sec;
}

static void imds_token_drop(struct sf__cred_chain *c)
{
    sf__wipe(c->imds_token, sizeof(c->imds_token));
    c->imds_token_expiry.tv_sec = 0;
}

/* PUT /latest/api/token unless the cached token is still good. */
static sf_status imds_get_token(struct sf__cred_chain *c, char *why, size_t why_len)
{
    if (imds_token_valid(c))
        return SF_OK;
    imds_token_drop(c);
    char url[600];
    snprintf(url, sizeof(url), "%s/latest/api/token", c->imds_endpoint);
    struct curl_slist *headers =
        curl_slist_append(NULL, "X-aws-ec2-metadata-token-ttl-seconds: " STR(IMDS_TOKEN_TTL_S));
    if (!headers)
        return sf__fail(why, why_len, SF_ERR_NO_MEMORY, "out of memory");
    struct http_resp r = {0};
    struct timespec asked = sf__cred_mono_now();
    sf_status st = sf__cred_http_request(c, 1, url, headers, &r, why, why_len);
    curl_slist_free_all(headers);
    if (st == SF_OK && r.status != 200) {
        char shown[512];
        sf__cred_display_url(url, shown, sizeof(shown));
        st = sf__fail(why, why_len,
                      r.status == 401 || r.status == 403 ? SF_ERR_ACCESS_DENIED : SF_ERR_HTTP,
                      "PUT %s: HTTP %ld", shown, r.status);
    }
    if (st == SF_OK) {
        const char *t = sf__strbuf_str(&r.body);
        size_t n = r.body.len;
        while (n && isspace((unsigned char)t[n - 1]))
            n--;
        if (n == 0 || n >= sizeof(c->imds_token)) {
            st = sf__fail(why, why_len, SF_ERR_PARSE, "PUT %s/latest/api/token: token of %zu bytes",
                          c->imds_endpoint, n);
        } else {
            memcpy(c->imds_token, t, n);
            c->imds_token[n] = '\0';
            if (!sf__cred_visible_ascii(c->imds_token)) {
                imds_token_drop(c);
                st = sf__fail(why, why_len, SF_ERR_PARSE,
                              "PUT %s/latest/api/token: token is not visible ASCII",
                              c->imds_endpoint);
            } else {
                /* Counted from before the request, so it is never late. */
                c->imds_token_expiry.tv_sec = asked.tv_sec + IMDS_TOKEN_TTL_S - IMDS_TOKEN_EARLY_S;
            }
        }
    }
    sf__cred_http_resp_free(&r);
    return st;
}

/* GET an IMDS path with the session token; one retry with a new token after
 * a 401 (the token expired or the instance was restarted). */
static sf_status imds_get(struct sf__cred_chain *c, const char *path, struct http_resp *r,
                          char *why, size_t why_len)
{
    char url[700];
    snprintf(url, sizeof(url), "%s%s", c->imds_endpoint, path);
    for (int round = 0; round < 2; round++) {
        sf_status st = imds_get_token(c, why, why_len);
        if (st != SF_OK)
            return st;
        char hdr[IMDS_TOKEN_MAX + 64];
        snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", c->imds_token);
        struct curl_slist *headers = curl_slist_append(NULL, hdr);
        sf__wipe(hdr, sizeof(hdr));
        if (!headers)
            return sf__fail(why, why_len, SF_ERR_NO_MEMORY, "out of memory");
        st = sf__cred_http_request(c, 0, url, headers, r, why, why_len);
        sf__wipe(headers->data, strlen(headers->data));
        curl_slist_free_all(headers);
        if (st != SF_OK)
            return st;
        if (r->status != 401)
            break;
        imds_token_drop(c);
    }
    if (r->status != 200) {
        char shown[800];
        sf__cred_display_url(url, shown, sizeof(shown));
        return sf__fail(why, why_len,
                        r->status == 401 || r->status == 403 ? SF_ERR_ACCESS_DENIED
                        : r->status == 404                   ? SF_ERR_NOT_FOUND
                                                             : SF_ERR_HTTP,
                        "GET %s: HTTP %ld", shown, r->status);
    }
    return SF_OK;
}

/* IAM role names: [A-Za-z0-9+=,.@_-], 1..64 (we allow 128). */
static int valid_role(const char *s, size_t n)
{
    if (n == 0 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!isalnum(ch) && !strchr("+=,.@_-", ch))
            return 0;
    }
    return 1;
}

sf_status sf__cred_from_imds(struct sf__cred_chain *c, time_t now, struct sf__credentials *out,
                             char *why, size_t why_len)
{
    if (c->imds_disabled)
        return sf__fail(why, why_len, SF_ERR_NOT_FOUND,
                        "imds: disabled by AWS_EC2_METADATA_DISABLED");
    char w[WHY_BYTES];
    w[0] = '\0';
    struct http_resp r = {0};
    sf_status st = imds_get(c, IMDS_CREDS_PATH, &r, w, sizeof(w));
    if (st != SF_OK) {
        sf__cred_http_resp_free(&r);
        return sf__fail(why, why_len, st, "imds: %s", w);
    }
    const char *list = sf__strbuf_str(&r.body);
    size_t n = strcspn(list, "\r\n");
    while (n && isspace((unsigned char)list[n - 1]))
        n--;
    if (!valid_role(list, n)) {
        sf__cred_http_resp_free(&r);
        return sf__fail(why, why_len, n ? SF_ERR_PARSE : SF_ERR_NOT_FOUND,
                        n ? "imds: the instance profile's role name is not a valid IAM role name"
                          : "imds: no IAM role attached to the instance");
    }
    char role[129];
    memcpy(role, list, n);
    role[n] = '\0';
    char path[sizeof(IMDS_CREDS_PATH) + sizeof(role)];
    snprintf(path, sizeof(path), "%s%s", IMDS_CREDS_PATH, role);
    st = imds_get(c, path, &r, w, sizeof(w));
    if (st == SF_OK)
        st = sf__cred_from_document(&r.body, now, out, w, sizeof(w));
    sf__cred_http_resp_free(&r);
    if (st != SF_OK)
        return sf__fail(why, why_len, st, "imds: role %s: %s", role, w);
    snprintf(out->source, sizeof(out->source), "imds:%.58s", role); /* IAM allows 64 */
    return SF_OK;
}
