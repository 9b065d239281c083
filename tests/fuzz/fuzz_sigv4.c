/* SigV4 (s3/sigv4.c): Authorization header parsing, x-amz-date parsing,
 * signing and verification of a request made of the input. Input: NUL-
 * separated strings: the Authorization value, the method, the path, the
 * query, the x-amz-date, then "name:value" headers. A request the signer
 * signs must verify with its own Authorization header. */
#include "fuzz.h"
#include "s3/sigv4.h"

#define MAX_HEADERS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    char *auth_value = fz_str(&f, NULL);
    char *method = fz_str(&f, NULL);
    char *path = fz_str(&f, NULL);
    char *query = fz_str(&f, NULL);
    char *date = fz_str(&f, NULL);
    char *lines[MAX_HEADERS];
    struct sf__header h[MAX_HEADERS + 2];
    size_t nh = 0, nl = 0;
    while (f.n && nl < MAX_HEADERS) {
        char *l = lines[nl++] = fz_str(&f, NULL);
        char *colon = strchr(l, ':');
        if (!colon)
            continue;
        *colon = '\0';
        h[nh].name = l;
        h[nh].value = colon + 1;
        nh++;
    }

    struct sf__sigv4_auth auth;
    sf_status pst = sf__sigv4_parse_authorization(auth_value, &auth);
    if (pst == SF_OK)
        fz_check(strlen(auth.signature) == SF__SHA256_HEX_LEN, "signature length");
    time_t t;
    if (sf__sigv4_parse_date(date, &t) == SF_OK) {
        char back[SF__AMZ_DATE_LEN + 1];
        sf__sigv4_format_date(t, back);
        fz_check(!strcmp(back, date), "date %s formats back as %s", date, back);
    }

    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", NULL,
                          "us-east-1", "s3");
    struct sf__sigv4_request req = {.method = method,
                                    .path = path,
                                    .query = query[0] ? query : NULL,
                                    .headers = h,
                                    .n_headers = nh,
                                    .payload_hash = SF__UNSIGNED_PAYLOAD};
    struct sf__sigv4_result res;
    memset(&res, 0, sizeof res);
    if (pst == SF_OK) {
        sf__sigv4_verify(&s, &auth, &req, date, &res);
        sf__sigv4_result_free(&res);
        memset(&res, 0, sizeof res);
    }

    /* Round trip: what the signer signs verifies. */
    char amz_date[SF__AMZ_DATE_LEN + 1];
    struct sf__header extra[3];
    size_t n_extra = 0;
    h[nh].name = "host";
    h[nh].value = "bucket.s3.amazonaws.com";
    req.n_headers = nh + 1;
    /* The parser holds SignedHeaders lists up to 1023 bytes. */
    if (sf__sigv4_sign_request(&s, &req, (time_t)1440938160, amz_date, extra, &n_extra, &res) ==
            SF_OK &&
        strlen(res.signed_headers) < sizeof(((struct sf__sigv4_auth *)0)->signed_headers)) {
        struct sf__header all[MAX_HEADERS + 4];
        memcpy(all, h, (nh + 1) * sizeof h[0]);
        memcpy(all + nh + 1, extra, n_extra * sizeof extra[0]);
        struct sf__sigv4_request vreq = req;
        vreq.headers = all;
        vreq.n_headers = nh + 1 + n_extra;
        struct sf__sigv4_auth back;
        fz_check(sf__sigv4_parse_authorization(res.authorization, &back) == SF_OK,
                 "own Authorization does not parse: %s", res.authorization);
        struct sf__sigv4_result vres;
        memset(&vres, 0, sizeof vres);
        sf_status vst = sf__sigv4_verify(&s, &back, &vreq, amz_date, &vres);
        fz_check(vst == SF_OK, "own signature does not verify (%d):\n%s\n--- verified as\n%s",
                 (int)vst, res.canonical_request,
                 vres.canonical_request ? vres.canonical_request : "(none)");
        sf__sigv4_result_free(&vres);
    }
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);

    for (size_t i = 0; i < nl; i++)
        free(lines[i]);
    free(auth_value);
    free(method);
    free(path);
    free(query);
    free(date);
    return 0;
}
