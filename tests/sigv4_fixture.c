/* The sigv4 suite's fixture (sigv4_fixture.h). */
#include "sigv4_fixture.h"

#include <criterion/criterion.h>

#include "s3/sigv4.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void expected_signature(const char *secret, const char *date, const char *region,
                        const char *service, const char *string_to_sign,
                        char out[SF__SHA256_HEX_LEN + 1])
{
    /* Independent of the code under test: the derivation from the AWS docs. */
    char k_secret[256];
    int n = snprintf(k_secret, sizeof k_secret, "AWS4%s", secret);
    cr_assert(n > 0 && (size_t)n < sizeof k_secret);
    unsigned char k1[32], k2[32], k3[32], k4[32], sig[32];
    unsigned int len = 0;
    cr_assert_not_null(
        HMAC(EVP_sha256(), k_secret, n, (const unsigned char *)date, strlen(date), k1, &len));
    cr_assert_not_null(
        HMAC(EVP_sha256(), k1, 32, (const unsigned char *)region, strlen(region), k2, &len));
    cr_assert_not_null(
        HMAC(EVP_sha256(), k2, 32, (const unsigned char *)service, strlen(service), k3, &len));
    cr_assert_not_null(
        HMAC(EVP_sha256(), k3, 32, (const unsigned char *)"aws4_request", 12, k4, &len));
    cr_assert_not_null(HMAC(EVP_sha256(), k4, 32, (const unsigned char *)string_to_sign,
                            strlen(string_to_sign), sig, &len));
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[sig[i] >> 4];
        out[2 * i + 1] = hex[sig[i] & 15];
    }
    out[64] = '\0';
}

void doc_signer(struct sf__sigv4_signer *s)
{
    sf__sigv4_signer_init(s, DOC_AK, DOC_SECRET, NULL, "us-east-1", "s3");
}

char *canonical_path_line(const char *creq)
{
    const char *start = strchr(creq, '\n');
    cr_assert_not_null(start);
    start++;
    const char *end = strchr(start, '\n');
    cr_assert_not_null(end);
    size_t n = (size_t)(end - start);
    char *s = malloc(n + 1);
    cr_assert_not_null(s);
    memcpy(s, start, n);
    s[n] = '\0';
    return s;
}
