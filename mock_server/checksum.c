#include "mock_server/checksum.h"

#include <openssl/evp.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

static const char *const headers[MOCK_CK_COUNT] = {
    "x-amz-checksum-crc32",
    "x-amz-checksum-crc32c",
    "x-amz-checksum-sha1",
    "x-amz-checksum-sha256",
};
static const char *const names[MOCK_CK_COUNT] = {"CRC32", "CRC32C", "SHA1", "SHA256"};

const char *mock_checksum_header(enum mock_checksum_alg alg)
{
    return alg < MOCK_CK_COUNT ? headers[alg] : "";
}

const char *mock_checksum_name(enum mock_checksum_alg alg)
{
    return alg < MOCK_CK_COUNT ? names[alg] : "";
}

int mock_checksum_from_header(const char *name)
{
    for (int i = 0; i < MOCK_CK_COUNT; i++)
        if (strcasecmp(name, headers[i]) == 0)
            return i;
    return -1;
}

void mock_crc32c_table(uint32_t table[256])
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
}

uint32_t mock_crc32c(const uint32_t table[256], uint32_t crc, const void *data, size_t n)
{
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

int mock_checksums_init(struct mock_checksums *c, unsigned want)
{
    memset(c, 0, sizeof *c);
    c->want = want;
    c->crc32 = (uint32_t)crc32(0L, Z_NULL, 0);
    if (want & (1u << MOCK_CK_CRC32C))
        mock_crc32c_table(c->crc32c_table);
    if (want & (1u << MOCK_CK_SHA1)) {
        c->sha1 = EVP_MD_CTX_new();
        if (!c->sha1 || !EVP_DigestInit_ex(c->sha1, EVP_sha1(), NULL))
            return -1;
    }
    if (want & (1u << MOCK_CK_SHA256)) {
        c->sha256 = EVP_MD_CTX_new();
        if (!c->sha256 || !EVP_DigestInit_ex(c->sha256, EVP_sha256(), NULL))
            return -1;
    }
    return 0;
}

void mock_checksums_update(struct mock_checksums *c, const void *data, size_t n)
{
    if (c->want & (1u << MOCK_CK_CRC32)) {
        const unsigned char *p = data;
        size_t left = n;
        while (left > 0) { /* zlib takes a uInt length */
            uInt step = left > (1u << 30) ? (1u << 30) : (uInt)left;
            c->crc32 = (uint32_t)crc32(c->crc32, p, step);
            p += step;
            left -= step;
        }
    }
    if (c->want & (1u << MOCK_CK_CRC32C))
        c->crc32c = mock_crc32c(c->crc32c_table, c->crc32c, data, n);
    if (c->sha1)
        EVP_DigestUpdate(c->sha1, data, n);
    if (c->sha256)
        EVP_DigestUpdate(c->sha256, data, n);
}

static void b64(const unsigned char *in, size_t n, char out[MOCK_CK_B64_MAX])
{
    EVP_EncodeBlock((unsigned char *)out, in, (int)n);
}

static void b64_crc(uint32_t v, char out[MOCK_CK_B64_MAX])
{
    unsigned char be[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 8), (unsigned char)v};
    b64(be, 4, out);
}

int mock_checksums_final(struct mock_checksums *c, char out[MOCK_CK_COUNT][MOCK_CK_B64_MAX])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    for (int i = 0; i < MOCK_CK_COUNT; i++)
        out[i][0] = '\0';
    if (c->want & (1u << MOCK_CK_CRC32))
        b64_crc(c->crc32, out[MOCK_CK_CRC32]);
    if (c->want & (1u << MOCK_CK_CRC32C))
        b64_crc(c->crc32c, out[MOCK_CK_CRC32C]);
    if (c->sha1) {
        if (!EVP_DigestFinal_ex(c->sha1, md, &len))
            return -1;
        b64(md, len, out[MOCK_CK_SHA1]);
    }
    if (c->sha256) {
        if (!EVP_DigestFinal_ex(c->sha256, md, &len))
            return -1;
        b64(md, len, out[MOCK_CK_SHA256]);
    }
    return 0;
}

void mock_checksums_free(struct mock_checksums *c)
{
    if (!c)
        return;
    EVP_MD_CTX_free(c->sha1);
    EVP_MD_CTX_free(c->sha256);
    c->sha1 = c->sha256 = NULL;
}
