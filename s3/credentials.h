/*
 * The credential provider chain, in the AWS order:
 *   1. explicit options (access key, secret, token);
 *   2. environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
 *   3. profile (AWS_PROFILE or the option) in ~/.aws/credentials and ~/.aws/config;
 *   4. container credentials: AWS_CONTAINER_CREDENTIALS_FULL_URI, or
 *      AWS_CONTAINER_CREDENTIALS_RELATIVE_URI appended to http://169.254.170.2,
 *      with AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE) as Authorization;
 *   5. EC2 IMDSv2: PUT /latest/api/token, GET .../iam/security-credentials/
 *      then .../ROLE, short timeouts, skipped when AWS_EC2_METADATA_DISABLED=true;
 *      endpoint AWS_EC2_METADATA_SERVICE_ENDPOINT or http://169.254.169.254;
 *   6. anonymous only when no_sign_request is set (then nothing else is asked).
 * If no provider has credentials, sf__credentials_get fails with
 * SF_ERR_ACCESS_DENIED and a message listing what was tried.
 *
 * Temporary credentials (container, IMDS, or any with an expiration) are
 * refreshed refresh_margin_s before they expire; while a refresh fails and
 * the old credentials are still valid, they keep being used.
 * Secrets never appear in messages or logs.
 */
#ifndef SF_S3_CREDENTIALS_H
#define SF_S3_CREDENTIALS_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct sf__credentials {
    char access_key_id[128];
    char secret_access_key[128];
    char session_token[4096]; /* "" when none */
    time_t expiration;        /* 0 = does not expire */
    int anonymous;            /* 1: sign nothing */
    char source[64];          /* "explicit", "env", "profile:NAME", "container", "imds:ROLE", "anonymous" */
};

struct sf__cred_options {
    const char *access_key_id; /* explicit, or NULL */
    const char *secret_access_key;
    const char *session_token;
    const char *profile; /* NULL: AWS_PROFILE, else "default" */
    int no_sign_request;
    /* Tests and unusual deployments: where the container provider sends a
     * RELATIVE_URI (default "http://169.254.170.2"). */
    const char *container_base_url;
    unsigned imds_timeout_ms;  /* per IMDS/container request; 0 = 1000 */
    unsigned imds_attempts;    /* 0 = 2 */
    unsigned refresh_margin_s; /* 0 = 300 */
    const char *ca_bundle;     /* for an https FULL_URI */
    void (*log)(void *user, enum sf_log_level level, const char *message);
    void *log_user;
};

struct sf__cred_chain;

/* Reads options and environment (not the network, not the files: those are
 * read on the first get). Strings are copied. */
sf_status sf__cred_chain_new(const struct sf__cred_options *o, struct sf__cred_chain **out);
void sf__cred_chain_destroy(struct sf__cred_chain *c);

/*
 * Current credentials into *out (a copy). The first call resolves the chain;
 * later calls return the cached credentials unless they expire within the
 * refresh margin of now, in which case the provider that gave them is asked
 * again. Thread-safe; concurrent callers wait for one refresh. On failure err
 * says which providers were tried and why each failed.
 */
sf_status sf__cred_chain_get(struct sf__cred_chain *c, time_t now, struct sf__credentials *out,
                             char *err, size_t err_len);

/* Forgets the cached credentials so the next get asks the provider again
 * (after an ExpiredToken / InvalidToken answer). */
void sf__cred_chain_invalidate(struct sf__cred_chain *c);

/* Parses the JSON the container endpoint and IMDS return:
 * {"AccessKeyId","SecretAccessKey","Token","Expiration":"2026-...Z"} (IMDS
 * also has "Code":"Success"). Exposed for tests. */
sf_status sf__credentials_parse_json(const char *body, size_t n, struct sf__credentials *out,
                                     char *err, size_t err_len);

#endif
