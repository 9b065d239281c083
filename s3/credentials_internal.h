/*
 * What the files of the credential chain share: the chain's struct (and which
 * fields its mutex guards), the synchronous HTTP request of the network
 * providers, and the helpers one file lends another. Not installed.
 *
 * credentials.c   the chain: environment, explicit options, profiles, the
 *                 provider order, caching and refresh, the JSON document
 * cred_http.c     one request to a credentials endpoint (libcurl easy)
 * cred_container.c  the ECS / EKS container provider
 * cred_imds.c     the EC2 instance metadata provider (IMDSv2)
 */
#ifndef SF_S3_CREDENTIALS_INTERNAL_H
#define SF_S3_CREDENTIALS_INTERNAL_H

#include "s3/credentials.h"

#include "common/strbuf.h"

#include <curl/curl.h>
#include <pthread.h>
#include <time.h>

#define BODY_MAX_BYTES ((size_t)64 * 1024)
#define WHY_BYTES      1024
#define IMDS_TOKEN_MAX 1024

enum provider {
    P_NONE,
    P_EXPLICIT,
    P_ENV,
    P_PROFILE,
    P_CONTAINER,
    P_IMDS,
};

/* A key id, secret and optional token as given (explicit options, or the
 * environment); NULL when unset. */
struct cred_keys {
    char *access_key_id, *secret_access_key, *session_token;
};

/* The profile provider's settings: which profile, in which files. */
struct cred_profile {
    char *name;                    /* resolved */
    char *cred_path, *config_path; /* NULL: no such file (HOME unset) */
};

/* The container provider's settings: the environment and the base URL a
 * RELATIVE_URI goes under (no trailing '/'). */
struct cred_container {
    char *full_uri, *relative_uri, *base;
    char *token, *token_file;
};

struct sf__cred_chain {
    /* Set by sf__cred_chain_new, read-only afterwards (any thread). */
    struct cred_keys explicit_keys;
    int no_sign_request;
    struct cred_keys env_keys;
    struct cred_profile profile;
    struct cred_container container;
    int imds_disabled;
    char *imds_endpoint; /* no trailing '/' */
    char *ca_bundle;
    unsigned timeout_ms, attempts, margin_s;
    void (*log)(void *user, enum sf_log_level level, const char *message);
    void *log_user;

    pthread_mutex_t mu;
    /* Under mu. */
    CURL *curl; /* reused so IMDS's three requests share a connection */
    int have;
    enum provider provider; /* the one that gave cur */
    struct sf__credentials cur;
    time_t retry_after; /* no refresh attempt before this while cur is still valid */
    char imds_token[IMDS_TOKEN_MAX];
    struct timespec imds_token_expiry; /* CLOCK_MONOTONIC */
};

/* ------------------------------------------------------------ credentials.c */

/* Copies an untrusted, non-secret string (an error Code) for a message. */
void sf__cred_sanitize(const char *s, char *buf, size_t len);
/* Key ids, secrets and tokens go into HTTP headers: visible ASCII only. */
int sf__cred_visible_ascii(const char *s);
void sf__cred_format_time(time_t t, char *buf, size_t len);
struct timespec sf__cred_mono_now(void);
/* The credentials a network provider answered with: parses the JSON
 * document in body and checks that they expire after now. On failure *out
 * is wiped and why says what was wrong. */
sf_status sf__cred_from_document(const struct sf__strbuf *body, time_t now,
                                 struct sf__credentials *out, char *why, size_t why_len);

/* ------------------------------------------------------------ cred_http.c */

struct http_resp {
    long status;
    struct sf__strbuf body;
};

void sf__cred_http_resp_free(struct http_resp *r);
/* url for messages: no user info, no query, no fragment. */
void sf__cred_display_url(const char *url, char *buf, size_t len);
/*
 * One request, retried up to c->attempts times on transport errors and 5xx.
 * put: an empty-bodied PUT. headers may hold secrets; they are never
 * reported. On a transport failure why says what curl said.
 */
sf_status sf__cred_http_request(struct sf__cred_chain *c, int put, const char *url,
                                struct curl_slist *headers, struct http_resp *r, char *why,
                                size_t why_len);

/* ------------------------------------------------------------ providers */

sf_status sf__cred_from_container(struct sf__cred_chain *c, time_t now, struct sf__credentials *out,
                                  char *why, size_t why_len);
sf_status sf__cred_from_imds(struct sf__cred_chain *c, time_t now, struct sf__credentials *out,
                             char *why, size_t why_len);

#endif
