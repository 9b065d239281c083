/* The sigv4 suite's fixture, shared by tests/test_sigv4*.c (one
 * executable): the S3 documentation's example key pair and request, a
 * signer of it, and SigV4's key derivation written out from the AWS docs. */
#ifndef SF_TEST_SIGV4_FIXTURE_H
#define SF_TEST_SIGV4_FIXTURE_H

#include "s3/sigv4.h"

#define DOC_AK     "AKIAIOSFODNN7EXAMPLE"
#define DOC_SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define DOC_DATE   "20130524T000000Z"
#define DOC_HOST   "examplebucket.s3.amazonaws.com"
#define DOC_SIG    "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"

/* The signature of string_to_sign, derived independently of the code under
 * test (HMAC chain of the AWS docs), as 64 hex digits. */
void expected_signature(const char *secret, const char *date, const char *region,
                        const char *service, const char *string_to_sign,
                        char out[SF__SHA256_HEX_LEN + 1]);
/* A signer of the documentation's key pair, for us-east-1 and s3. */
void doc_signer(struct sf__sigv4_signer *s);
/* The second line of a canonical request (malloc'd). */
char *canonical_path_line(const char *creq);

#endif
