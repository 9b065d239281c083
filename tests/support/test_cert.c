#include "support/test_cert.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static int add_ext(X509 *cert, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!ext)
        return -1;
    int ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : -1;
}

/* A self-signed CA:TRUE certificate for localhost / 127.0.0.1, valid from an
 * hour ago (clock skew) to a day from now. */
static X509 *make_x509(EVP_PKEY *key)
{
    X509 *cert = X509_new();
    if (!cert)
        return NULL;
    BIGNUM *serial = BN_new();
    X509_NAME *name = X509_get_subject_name(cert);
    int ok = serial && X509_set_version(cert, X509_VERSION_3) &&
             BN_rand(serial, 64, BN_RAND_TOP_ONE, BN_RAND_BOTTOM_ANY) &&
             BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert)) &&
             X509_gmtime_adj(X509_getm_notBefore(cert), -3600L) &&
             X509_gmtime_adj(X509_getm_notAfter(cert), 86400L) && X509_set_pubkey(cert, key) &&
             X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                        (const unsigned char *)"shardfeed tests", -1, -1, 0) &&
             X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                        (const unsigned char *)"localhost", -1, -1, 0) &&
             X509_set_issuer_name(cert, name);
    BN_free(serial);
    ok = ok && add_ext(cert, NID_basic_constraints, "critical,CA:TRUE") == 0 &&
         add_ext(cert, NID_key_usage, "critical,digitalSignature,keyCertSign") == 0 &&
         add_ext(cert, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1") == 0 &&
         add_ext(cert, NID_subject_key_identifier, "hash") == 0 &&
         X509_sign(cert, key, EVP_sha256()) > 0;
    if (!ok) {
        X509_free(cert);
        return NULL;
    }
    return cert;
}

/* Opens path for writing with mode 0600, whatever was there before. */
static FILE *open_private(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    if (fchmod(fd, 0600) != 0) {
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f)
        close(fd);
    return f;
}

int test_make_cert(const char *dir, char *cert_path, size_t cert_len, char *key_path,
                   size_t key_len)
{
    int n1 = snprintf(cert_path, cert_len, "%s/cert.pem", dir);
    int n2 = snprintf(key_path, key_len, "%s/key.pem", dir);
    if (n1 < 0 || (size_t)n1 >= cert_len || n2 < 0 || (size_t)n2 >= key_len)
        return -1;
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *cert = key ? make_x509(key) : NULL;
    int rc = -1;
    if (cert) {
        FILE *cf = open_private(cert_path);
        FILE *kf = open_private(key_path);
        int ok = cf && kf && PEM_write_X509(cf, cert) &&
                 PEM_write_PrivateKey(kf, key, NULL, NULL, 0, NULL, NULL);
        if (cf && fclose(cf) != 0)
            ok = 0;
        if (kf && fclose(kf) != 0)
            ok = 0;
        rc = ok ? 0 : -1;
    }
    X509_free(cert);
    EVP_PKEY_free(key);
    return rc;
}
