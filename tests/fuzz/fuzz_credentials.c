/* The credentials documents of the container endpoint and IMDS
 * (s3/credentials.c, sf__credentials_parse_json: a pure parser; the
 * providers hand it the body as received). The whole input is the body,
 * exactly its bytes (no NUL after them).
 *
 * Invariant: accepted credentials have a non-empty key id and secret of
 * visible ASCII, held whole (no NUL, raw or escaped, cut a string of the
 * input: a key that came out shorter than its text would sign as another);
 * a refusal has a message and leaves nothing in the output. */
#include "fuzz.h"
#include "s3/credentials_internal.h"

#include <cjson/cJSON.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = (char *)fz_copy(data, size, 0);
    struct sf__credentials cr;
    char err[256];
    err[0] = '\0';
    sf_status st = sf__credentials_parse_json(body, size, &cr, err, sizeof err);
    if (st == SF_OK) {
        fz_check(cr.access_key_id[0] && cr.secret_access_key[0], "empty key accepted");
        fz_check(sf__cred_visible_ascii(cr.access_key_id) &&
                     sf__cred_visible_ascii(cr.secret_access_key) &&
                     sf__cred_visible_ascii(cr.session_token),
                 "a key with other than visible ASCII accepted");
        fz_check(!memchr(data, 0, size), "a document with a NUL byte accepted");
        /* An escaped NUL in the document (up to where cJSON stops reading
         * it) is the only way it cuts a string; it must have been refused
         * (an escaped backslash before "u0000" is none: an even run of
         * backslashes). */
        const char *end = NULL;
        cJSON *doc = cJSON_ParseWithLengthOpts(body, size, &end, 0);
        fz_check(doc && end && end >= body && end <= body + size, "accepted, not JSON");
        cJSON_Delete(doc);
        size_t used = (size_t)(end - body);
        for (size_t i = 0; i + 6 <= used; i++) {
            if (data[i] != '\\' || memcmp(data + i + 1, "u0000", 5))
                continue;
            size_t run = 1;
            while (run <= i && data[i - run] == '\\')
                run++;
            fz_check(run % 2 == 0, "accepted with \\u0000 at offset %zu", i);
        }
    } else {
        fz_check(err[0] != '\0', "refusal %d without a message", (int)st);
        fz_check(!cr.access_key_id[0] && !cr.secret_access_key[0], "refusal left keys in out");
    }
    free(body);
    return 0;
}
