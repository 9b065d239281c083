/* URLs and endpoints (s3/endpoint.c, s3/uri.c). Input: a flags byte, then
 * NUL-separated: the source URL, the endpoint URL (empty: AWS), the region,
 * the bucket, the key, the query. Percent-encoding must round-trip. */
#include "fuzz.h"
#include "s3/endpoint.h"
#include "common/strbuf.h"
#include "s3/uri.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    unsigned flags = fz_u8(&f);
    char *url = fz_str(&f, NULL);
    char *ep_url = fz_str(&f, NULL);
    char *region = fz_str(&f, NULL);
    char *bucket = fz_str(&f, NULL);
    size_t key_len;
    char *key = fz_str(&f, &key_len);
    char *query = fz_str(&f, NULL);
    char err[256];

    struct sf__locator loc;
    memset(&loc, 0, sizeof loc);
    if (sf__locator_parse(url, &loc, err, sizeof err) == SF_OK) {
        fz_check(loc.display != NULL, "no display form");
        struct sf__locator copy;
        memset(&copy, 0, sizeof copy);
        if (sf__locator_copy(&loc, &copy) == SF_OK)
            fz_check(copy.kind == loc.kind, "copy kind");
        sf__locator_free(&copy);
    }
    sf__locator_free(&loc);

    struct sf__endpoint e;
    memset(&e, 0, sizeof e);
    enum sf_addressing addr = (enum sf_addressing)(flags % 3);
    if (sf__endpoint_init(&e, ep_url[0] ? ep_url : NULL, region[0] ? region : "us-east-1", addr,
                          err, sizeof err) == SF_OK) {
        struct sf__target t;
        memset(&t, 0, sizeof t);
        if (sf__endpoint_target(&e, (flags & 4) ? NULL : bucket, key, query[0] ? query : NULL,
                                &t) == SF_OK)
            fz_check(t.url && t.host && t.path && t.path[0] == '/', "target %s", t.path);
        sf__target_free(&t);
        sf__endpoint_free(&e);
    }

    struct sf__strbuf enc, dec;
    sf__strbuf_init(&enc, 0);
    sf__strbuf_init(&dec, 0);
    if (sf__uri_encode(&enc, key, key_len, flags & 8) == SF_OK &&
        sf__uri_decode(&dec, enc.data ? enc.data : "", enc.len, flags & 16) == SF_OK)
        fz_check(dec.len == key_len && (key_len == 0 || !memcmp(dec.data, key, key_len)),
                 "percent-encoding does not round-trip");
    sf__strbuf_free(&enc);
    sf__strbuf_free(&dec);

    free(url);
    free(ep_url);
    free(region);
    free(bucket);
    free(key);
    free(query);
    return 0;
}
