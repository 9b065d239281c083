/* The flexible checksums of S3 (x-amz-checksum-*) the mock can compute:
 * CRC32 (zlib), CRC32C (table-driven, Castagnoli), SHA-1 and SHA-256
 * (OpenSSL), computed while a body streams in. Values are base64 of the
 * big-endian CRC or of the digest, as S3 sends them. */
#ifndef SF_MOCK_CHECKSUM_H
#define SF_MOCK_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

enum mock_checksum_alg {
    MOCK_CK_CRC32,
    MOCK_CK_CRC32C,
    MOCK_CK_SHA1,
    MOCK_CK_SHA256,
    MOCK_CK_COUNT
};

/* Longest base64 value (SHA-256: 44 characters) and its NUL. */
#define MOCK_CK_B64_MAX 45

struct mock_checksums {
    unsigned want; /* bit (1u << alg) for each algorithm computed */
    uint32_t crc32;
    uint32_t crc32c;
    void *sha1; /* EVP_MD_CTX */
    void *sha256;
    uint32_t crc32c_table[256];
};

/* "x-amz-checksum-crc32"... for alg. */
const char *mock_checksum_header(enum mock_checksum_alg alg);
/* "CRC32"... as S3 names the algorithm in messages. */
const char *mock_checksum_name(enum mock_checksum_alg alg);
/* The algorithm of a header name (any case), or -1 when the name is not one
 * of the four (x-amz-checksum-crc64nvme, say). */
int mock_checksum_from_header(const char *name);

/* Starts computing the algorithms in want. -1 when out of memory. */
int mock_checksums_init(struct mock_checksums *c, unsigned want);
void mock_checksums_update(struct mock_checksums *c, const void *data, size_t n);
/* Finishes every algorithm of want and writes its base64 value to out[alg]
 * (the others get ""); call once. -1 when a digest fails. */
int mock_checksums_final(struct mock_checksums *c, char out[MOCK_CK_COUNT][MOCK_CK_B64_MAX]);
void mock_checksums_free(struct mock_checksums *c);

/* CRC32C (Castagnoli) of data continuing from crc (0 to start). */
uint32_t mock_crc32c(const uint32_t table[256], uint32_t crc, const void *data, size_t n);
void mock_crc32c_table(uint32_t table[256]);

#endif
