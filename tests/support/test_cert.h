/* Test support: a self-signed TLS certificate made with OpenSSL at run time. */
#ifndef SF_TEST_CERT_H
#define SF_TEST_CERT_H

#include <stddef.h>

/* Writes dir/cert.pem and dir/key.pem: a self-signed CA:TRUE certificate
 * for "localhost" and IP 127.0.0.1, valid for a day, so the cert file is
 * also its own CA bundle. Paths are written into cert_path / key_path.
 * Returns 0 or -1. */
int test_make_cert(const char *dir, char *cert_path, size_t cert_len, char *key_path,
                   size_t key_len);

#endif
