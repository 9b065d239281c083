/*
 * The container provider (ECS task roles, EKS Pod Identity):
 * AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI, with the
 * authorization token from AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE).
 */
#include "s3/credentials_internal.h"
#include "common/secret.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <unistd.h>

#define TOKEN_FILE_MAX_BYTES ((size_t)16 * 1024)

static int host_is_allowed_for_http(const char *host)
{
    static const char *const allowed[] = {"localhost", "169.254.170.2",  "169.254.170.23",
                                          "[::1]",     "[fd00:ec2::23]", NULL};
    for (size_t i = 0; allowed[i]; i++)
        if (strcasecmp(host, allowed[i]) == 0)
            return 1;
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127)
        return 1;
    return 0;
}

/* FULL_URI may be https anywhere, or http to loopback or to the ECS / EKS
 * Pod Identity agents (the AWS SDKs' rule): credentials must not cross a
 * network in clear text. */
static sf_status check_full_uri(const char *uri, char *why, size_t why_len)
{
    CURLU *u = curl_url();
    if (!u)
        return sf__fail(why, why_len, SF_ERR_NO_MEMORY, "out of memory");
    char *scheme = NULL, *host = NULL;
    sf_status st = SF_OK;
    if (curl_url_set(u, CURLUPART_URL, uri, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
        st = sf__fail(why, why_len, SF_ERR_INVALID_ARGUMENT,
                      "AWS_CONTAINER_CREDENTIALS_FULL_URI is not a valid URL");
    } else if (strcasecmp(scheme, "https") == 0) {
        st = SF_OK;
    } else if (strcasecmp(scheme, "http") != 0) {
        st = sf__fail(why, why_len, SF_ERR_INVALID_ARGUMENT,
                      "AWS_CONTAINER_CREDENTIALS_FULL_URI must be http or https");
    } else if (!host_is_allowed_for_http(host)) {
        char h[128];
        sf__cred_sanitize(host, h, sizeof(h));
        st = sf__fail(why, why_len, SF_ERR_INVALID_ARGUMENT,
                      "AWS_CONTAINER_CREDENTIALS_FULL_URI: http is only allowed to a loopback host "
                      "(127.0.0.0/8, [::1], localhost), 169.254.170.2, 169.254.170.23 or "
                      "[fd00:ec2::23]; use https for '%s'",
                      h);
    }
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    return st;
}

/* The container authorization token, read from the file on every fetch
 * (EKS rotates it), trimmed. Returns a malloc'd string in *out or NULL when
 * none is configured. */
static sf_status container_auth(const struct sf__cred_chain *c, char **out, char *why,
                                size_t why_len)
{
    *out = NULL;
    struct sf__strbuf b;
    sf__strbuf_init(&b, TOKEN_FILE_MAX_BYTES);
    if (c->container.token_file) {
        int fd = open(c->container.token_file, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
            return sf__fail(why, why_len, SF_ERR_IO,
                            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE %s: %s",
                            c->container.token_file, strerror(errno));
        char chunk[4096];
        ssize_t r;
        while ((r = read(fd, chunk, sizeof(chunk))) != 0) {
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 || sf__strbuf_append(&b, chunk, (size_t)r) != SF_OK) {
                int e = errno;
                close(fd);
                sf__wipe(chunk, sizeof(chunk));
                sf__wipe(b.data, b.cap);
                sf__strbuf_free(&b);
                if (r < 0)
                    return sf__fail(why, why_len, SF_ERR_IO,
                                    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE %s: %s",
                                    c->container.token_file, strerror(e));
                return sf__fail(why, why_len, SF_ERR_LIMIT,
                                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE %s: over %zu bytes",
                                c->container.token_file, TOKEN_FILE_MAX_BYTES);
            }
        }
        close(fd);
        sf__wipe(chunk, sizeof(chunk));
    } else if (c->container.token) {
        sf__strbuf_puts(&b, c->container.token);
    } else {
        return SF_OK;
    }
    char *t = sf__strbuf_take(&b);
    if (!t) {
        sf__wipe(b.data, b.cap);
        sf__strbuf_free(&b);
        return sf__fail(why, why_len, SF_ERR_NO_MEMORY, "out of memory");
    }
    size_t n = strlen(t), start = 0;
    while (n > 0 && isspace((unsigned char)t[n - 1]))
        n--;
    while (start < n && isspace((unsigned char)t[start]))
        start++;
    memmove(t, t + start, n - start);
    t[n - start] = '\0';
    for (const char *p = t; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            sf__free_secret(t);
            return sf__fail(why, why_len, SF_ERR_INVALID_ARGUMENT,
                            "the container authorization token has control characters");
        }
    }
    *out = t;
    return SF_OK;
}

sf_status sf__cred_from_container(struct sf__cred_chain *c, time_t now, struct sf__credentials *out,
                                  char *why, size_t why_len)
{
    char w[WHY_BYTES];
    w[0] = '\0';
    sf_status st;
    struct sf__strbuf url;
    sf__strbuf_init(&url, 8192);
    /* RELATIVE_URI wins when both are set, as in botocore and the Java SDK. */
    if (c->container.relative_uri) {
        sf__strbuf_puts(&url, c->container.base);
        if (c->container.relative_uri[0] != '/')
            sf__strbuf_putc(&url, '/');
        sf__strbuf_puts(&url, c->container.relative_uri);
    } else if (c->container.full_uri) {
        st = check_full_uri(c->container.full_uri, w, sizeof(w));
        if (st != SF_OK) {
            sf__strbuf_free(&url);
            return sf__fail(why, why_len, st, "container: %s", w);
        }
        sf__strbuf_puts(&url, c->container.full_uri);
    } else {
        sf__strbuf_free(&url);
        return sf__fail(why, why_len, SF_ERR_NOT_FOUND,
                        "container: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and _FULL_URI not set");
    }
    if (url.err != SF_OK) {
        st = url.err;
        sf__strbuf_free(&url);
        return sf__fail(why, why_len, st, "container: URL too long");
    }
    char *token = NULL;
    st = container_auth(c, &token, w, sizeof(w));
    if (st != SF_OK) {
        sf__strbuf_free(&url);
        return sf__fail(why, why_len, st, "container: %s", w);
    }
    struct curl_slist *headers = curl_slist_append(NULL, "Accept: application/json");
    struct sf__strbuf auth;
    sf__strbuf_init(&auth, TOKEN_FILE_MAX_BYTES + 64);
    if (token && *token) {
        sf__strbuf_printf(&auth, "Authorization: %s", token);
        struct curl_slist *h2 = auth.err == SF_OK ? curl_slist_append(headers, auth.data) : NULL;
        if (!h2) {
            curl_slist_free_all(headers);
            headers = NULL;
        } else {
            headers = h2;
        }
    }
    sf__free_secret(token);
    if (auth.data)
        sf__wipe(auth.data, auth.cap);
    sf__strbuf_free(&auth);
    char shown[512];
    sf__cred_display_url(sf__strbuf_str(&url), shown, sizeof(shown));
    if (!headers) {
        sf__strbuf_free(&url);
        return sf__fail(why, why_len, SF_ERR_NO_MEMORY, "container: out of memory");
    }
    struct http_resp r = {0};
    st = sf__cred_http_request(c, 0, sf__strbuf_str(&url), headers, &r, w, sizeof(w));
    /* The slist holds the authorization token. */
    for (struct curl_slist *h = headers; h; h = h->next)
        sf__wipe(h->data, strlen(h->data));
    curl_slist_free_all(headers);
    sf__strbuf_free(&url);
    if (st != SF_OK) {
        sf__cred_http_resp_free(&r);
        return sf__fail(why, why_len, st, "container: %s", w);
    }
    if (r.status != 200) {
        sf__cred_http_resp_free(&r);
        return sf__fail(why, why_len,
                        r.status == 401 || r.status == 403 ? SF_ERR_ACCESS_DENIED : SF_ERR_HTTP,
                        "container: GET %s: HTTP %ld", shown, r.status);
    }
    st = sf__cred_from_document(&r.body, now, out, w, sizeof(w));
    sf__cred_http_resp_free(&r);
    if (st != SF_OK)
        return sf__fail(why, why_len, st, "container: GET %s: %s", shown, w);
    snprintf(out->source, sizeof(out->source), "container");
    return SF_OK;
}
