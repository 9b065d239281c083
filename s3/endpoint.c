#include "s3/endpoint.h"

#include "common/strbuf.h"
#include "common/strpack.h"
#include "s3/uri.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEY_BYTES    1024
#define MAX_BUCKET_BYTES 255

static int valid_bucket(const char *b, size_t n)
{
    if (n == 0 || n > MAX_BUCKET_BYTES)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)b[i];
        if (!isalnum(c) && c != '.' && c != '-' && c != '_')
            return 0;
    }
    return 1;
}

void sf__locator_free(struct sf__locator *l)
{
    if (!l)
        return;
    free(l->mem);
    memset(l, 0, sizeof(*l));
}

/* Sets out to kind and copies of the strings given (bucket_len bytes of
 * bucket; a NULL string stays NULL), all in one allocation. */
static sf_status locator_set(struct sf__locator *out, enum sf__loc_kind kind, const char *bucket,
                             size_t bucket_len, const char *key, const char *url,
                             const char *display)
{
    const struct sf__strpack_item it[] = {
        {bucket, bucket_len, &out->bucket},
        {key, sf__strpack_len(key), &out->key},
        {url, sf__strpack_len(url), &out->url},
        {display, sf__strpack_len(display), &out->display},
    };
    memset(out, 0, sizeof(*out));
    if (sf__strpack(&out->mem, it, sizeof(it) / sizeof(it[0])) != 0)
        return SF_ERR_NO_MEMORY;
    out->kind = kind;
    return SF_OK;
}

sf_status sf__locator_parse(const char *url, struct sf__locator *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof(*out));
    if (!url || !*url)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "empty source URL");
    if (strncmp(url, "s3://", 5) == 0) {
        const char *b = url + 5;
        const char *slash = strchr(b, '/');
        size_t bn = slash ? (size_t)(slash - b) : strlen(b);
        const char *k = slash ? slash + 1 : "";
        if (bn > 0 && !valid_bucket(b, bn))
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "'%s': not a valid bucket name",
                            url);
        if (bn == 0 && *k)
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "'%s': missing bucket name",
                            url);
        if (strlen(k) > MAX_KEY_BYTES)
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                            "'%.200s...': key longer than 1024 bytes", url);
        return locator_set(out, SF__LOC_S3, b, bn, k, NULL, url);
    } else if (strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0) {
        const char *auth = strstr(url, "://") + 3;
        if (!*auth || *auth == '/')
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "'%s': missing host", url);
        const char *path = strchr(auth, '/');
        return locator_set(out, SF__LOC_HTTP, NULL, 0, path ? path : "/", url, url);
    } else if (strncmp(url, "file://", 7) == 0) {
        const char *p = url + 7;
        if (strncmp(p, "localhost/", 10) == 0)
            p += 9;
        if (*p != '/')
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                            "'%s': file URLs need an absolute path (file:///path)", url);
        struct sf__strbuf b;
        sf__strbuf_init(&b, 1u << 16);
        sf__uri_decode(&b, p, strlen(p), 0);
        if (b.err != SF_OK || memchr(sf__strbuf_str(&b), '\0', b.len)) {
            sf__strbuf_free(&b);
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "'%s': bad file URL", url);
        }
        sf_status st = locator_set(out, SF__LOC_FILE, NULL, 0, sf__strbuf_str(&b), NULL, url);
        sf__strbuf_free(&b);
        return st;
    } else if (strstr(url, "://")) {
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "'%s': unknown URL scheme (use s3://, http(s)://, file:// or a path)", url);
    }
    return locator_set(out, SF__LOC_FILE, NULL, 0, url, NULL, url);
}

sf_status sf__locator_copy(const struct sf__locator *src, struct sf__locator *dst)
{
    return locator_set(dst, src->kind, src->bucket, sf__strpack_len(src->bucket), src->key,
                       src->url, src->display);
}

void sf__endpoint_free(struct sf__endpoint *e)
{
    if (!e)
        return;
    free(e->mem);
    memset(e, 0, sizeof(*e));
}

sf_status sf__endpoint_init(struct sf__endpoint *e, const char *endpoint_url, const char *region,
                            enum sf_addressing addressing, char *err, size_t err_len)
{
    memset(e, 0, sizeof(*e));
    if (!region || !*region)
        region = "us-east-1";
    for (const char *r = region; *r; r++)
        if (!isalnum((unsigned char)*r) && *r != '-')
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "region '%s' is not valid",
                            region);
    char host[128];
    const char *scheme = "https", *auth = host, *path = "";
    size_t sn = 5, an, pn = 0;
    int aws = !endpoint_url || !*endpoint_url;
    if (aws) {
        an = (size_t)snprintf(host, sizeof(host), "s3.%s.amazonaws.com", region);
        if (an >= sizeof(host))
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "region '%s' is too long",
                            region);
        if (addressing != SF_ADDRESSING_PATH)
            addressing = SF_ADDRESSING_VIRTUAL;
    } else {
        const char *sep = strstr(endpoint_url, "://");
        sn = sep ? (size_t)(sep - endpoint_url) : 0;
        if (!sep || !((sn == 4 && strncmp(endpoint_url, "http", 4) == 0) ||
                      (sn == 5 && strncmp(endpoint_url, "https", 5) == 0)))
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                            "endpoint URL '%s' must start with http:// or https://", endpoint_url);
        scheme = endpoint_url;
        auth = sep + 3;
        an = strcspn(auth, "/?#");
        if (an == 0 || auth[an] == '?' || auth[an] == '#' || memchr(auth, '@', an))
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                            "endpoint URL '%s': expected scheme://host[:port][/path]",
                            endpoint_url);
        path = auth + an;
        pn = strlen(path);
        while (pn > 0 && path[pn - 1] == '/')
            pn--;
    }
    const struct sf__strpack_item it[] = {
        {scheme, sn, &e->scheme},
        {auth, an, &e->authority},
        {path, pn, &e->base_path},
        {region, strlen(region), &e->region},
    };
    if (sf__strpack(&e->mem, it, sizeof(it) / sizeof(it[0])) != 0)
        return SF_ERR_NO_MEMORY;
    for (char *p = e->authority; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    e->is_aws = aws || strstr(e->authority, "amazonaws.com") != NULL;
    if (addressing == SF_ADDRESSING_AUTO)
        addressing = e->is_aws ? SF_ADDRESSING_VIRTUAL : SF_ADDRESSING_PATH;
    e->addressing = addressing;
    return SF_OK;
}

/* A bucket name that can be the first label of a TLS-verified host name. */
static int dns_safe_bucket(const char *b, int https)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (!https && c == '.')))
            return 0;
    }
    return b[0] != '-' && b[n - 1] != '-';
}

void sf__target_free(struct sf__target *t)
{
    if (!t)
        return;
    free(t->url);
    free(t->host);
    free(t->path);
    memset(t, 0, sizeof(*t));
}

sf_status sf__endpoint_target(const struct sf__endpoint *e, const char *bucket, const char *key,
                              const char *query, struct sf__target *out)
{
    memset(out, 0, sizeof(*out));
    int https = strcmp(e->scheme, "https") == 0;
    int virt = bucket && *bucket && e->addressing == SF_ADDRESSING_VIRTUAL &&
               dns_safe_bucket(bucket, https);
    struct sf__strbuf host, path, url;
    sf__strbuf_init(&host, 4096);
    sf__strbuf_init(&path, 8192);
    sf__strbuf_init(&url, 16384);
    if (virt)
        sf__strbuf_printf(&host, "%s.%s", bucket, e->authority);
    else
        sf__strbuf_puts(&host, e->authority);
    sf__strbuf_puts(&path, e->base_path);
    if (bucket && *bucket && !virt) {
        sf__strbuf_putc(&path, '/');
        sf__uri_encode(&path, bucket, strlen(bucket), 0);
    }
    sf__strbuf_putc(&path, '/');
    if (key && *key)
        sf__uri_encode(&path, key, strlen(key), 1);
    sf__strbuf_printf(&url, "%s://%s%s", e->scheme, sf__strbuf_str(&host), sf__strbuf_str(&path));
    if (query && *query)
        sf__strbuf_printf(&url, "?%s", query);
    sf_status st = host.err ? host.err : path.err ? path.err : url.err;
    if (st == SF_OK) {
        out->host = sf__strbuf_take(&host);
        out->path = sf__strbuf_take(&path);
        out->url = sf__strbuf_take(&url);
        if (!out->host || !out->path || !out->url)
            st = SF_ERR_NO_MEMORY;
    }
    sf__strbuf_free(&host);
    sf__strbuf_free(&path);
    sf__strbuf_free(&url);
    if (st != SF_OK)
        sf__target_free(out);
    return st;
}
