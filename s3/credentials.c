/*
 * The credential provider chain (see s3/credentials.h for the order): the
 * explicit, environment and profile providers, the order, caching and
 * refresh, the JSON credentials document. The container and IMDS providers
 * are in cred_container.c and cred_imds.c, their request in cred_http.c;
 * what the files share is in credentials_internal.h.
 *
 * Everything the chain needs from the environment is read once, in
 * sf__cred_chain_new; files and the network are touched on the first get.
 * Container and IMDS requests are synchronous libcurl easy transfers in the
 * calling thread, under the chain's mutex, so concurrent callers wait for one
 * refresh instead of each asking the endpoint.
 *
 * Secrets (secret access keys, session tokens, the container authorization
 * token, the IMDS token) never reach a message or a log line; an access key
 * id, a role name, a path or a URL (without user info or query) may.
 */
#include "s3/credentials_internal.h"

#include "s3/aws_config.h"
#include "common/calendar.h"
#include "common/json.h"
#include "common/log.h"
#include "common/secret.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MSG_MAX_BYTES          ((size_t)4096)
#define REFRESH_RETRY_S        10 /* after a failed refresh of still-valid credentials */
#define DEFAULT_TIMEOUT_MS     1000u
#define DEFAULT_ATTEMPTS       2u
#define DEFAULT_MARGIN_S       300u
#define DEFAULT_CONTAINER_BASE "http://169.254.170.2"
#define DEFAULT_IMDS_ENDPOINT  "http://169.254.169.254"
#define IMDS_IPV6_ENDPOINT     "http://[fd00:ec2::254]"

__attribute__((format(printf, 3, 4))) static void
logf_(const struct sf__cred_chain *c, enum sf_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sf__vlog(c->log, c->log_user, SF_LOG_DEBUG, level, fmt, ap);
    va_end(ap);
}

/* A copy of a non-empty string, else NULL (an empty variable counts as unset,
 * as botocore treats it). *oom is set when the copy failed. */
static char *dup_nonempty(const char *s, int *oom)
{
    if (!s || !*s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = 1;
    return d;
}

static char *env_dup(const char *name, int *oom)
{
    return dup_nonempty(getenv(name), oom);
}

/* ------------------------------------------------------------ time */

/* "2026-11-21T12:00:00Z", optionally with a fraction and/or a +HH:MM / -HH:MM
 * offset instead of Z. A local parser keeps this file free of a dependency on
 * the XML module. */
static int parse_iso8601(const char *s, int64_t *out)
{
    int Y, M, D, h, m, sec;
    if (strlen(s) < 19 || !sf__read_digits(s, 4, &Y) || s[4] != '-' ||
        !sf__read_digits(s + 5, 2, &M) || s[7] != '-' || !sf__read_digits(s + 8, 2, &D) ||
        (s[10] != 'T' && s[10] != 't') || !sf__read_digits(s + 11, 2, &h) || s[13] != ':' ||
        !sf__read_digits(s + 14, 2, &m) || s[16] != ':' || !sf__read_digits(s + 17, 2, &sec))
        return 0;
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (Y % 4 == 0 && Y % 100 != 0) || Y % 400 == 0;
    if (M < 1 || M > 12 || D < 1 || D > mdays[M - 1] + (M == 2 && leap) || h > 23 || m > 59 ||
        sec > 60)
        return 0;
    const char *p = s + 19;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    int64_t offset = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om;
        if (!sf__read_digits(p + 1, 2, &oh) || p[3] != ':' || !sf__read_digits(p + 4, 2, &om) ||
            oh > 23 || om > 59)
            return 0;
        offset = (int64_t)(oh * 3600 + om * 60) * (*p == '-' ? -1 : 1);
        p += 6;
    } else {
        return 0;
    }
    if (*p)
        return 0;
    *out =
        sf__days_from_civil(Y, (unsigned)M, (unsigned)D) * 86400 + h * 3600 + m * 60 + sec - offset;
    return 1;
}

void sf__cred_format_time(time_t t, char *buf, size_t len)
{
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "%lld", (long long)t);
}

struct timespec sf__cred_mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts;
}

/* ------------------------------------------------------------ credentials */

/* Key ids, secrets and tokens go into HTTP headers: visible ASCII only. */
int sf__cred_visible_ascii(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e)
            return 0;
    return 1;
}

/* Fills out from the parts, checking sizes and characters. Messages name
 * the field, never its value. */
static sf_status fill_creds(struct sf__credentials *out, const char *ak, const char *sk,
                            const char *token, time_t expiration, const char *source, char *err,
                            size_t err_len)
{
    memset(out, 0, sizeof(*out));
    if (!ak || !*ak)
        return sf__fail(err, err_len, SF_ERR_PARSE, "empty access key id");
    if (!sk || !*sk)
        return sf__fail(err, err_len, SF_ERR_PARSE, "empty secret access key");
    if (strlen(ak) >= sizeof(out->access_key_id))
        return sf__fail(err, err_len, SF_ERR_LIMIT, "access key id longer than %zu bytes",
                        sizeof(out->access_key_id) - 1);
    if (strlen(sk) >= sizeof(out->secret_access_key))
        return sf__fail(err, err_len, SF_ERR_LIMIT, "secret access key longer than %zu bytes",
                        sizeof(out->secret_access_key) - 1);
    if (token && strlen(token) >= sizeof(out->session_token))
        return sf__fail(err, err_len, SF_ERR_LIMIT, "session token longer than %zu bytes",
                        sizeof(out->session_token) - 1);
    if (!sf__cred_visible_ascii(ak))
        return sf__fail(err, err_len, SF_ERR_PARSE,
                        "access key id has characters other than "
                        "visible ASCII");
    if (!sf__cred_visible_ascii(sk))
        return sf__fail(err, err_len, SF_ERR_PARSE,
                        "secret access key has characters other than "
                        "visible ASCII");
    if (token && !sf__cred_visible_ascii(token))
        return sf__fail(err, err_len, SF_ERR_PARSE,
                        "session token has characters other than "
                        "visible ASCII");
    memcpy(out->access_key_id, ak, strlen(ak) + 1);
    memcpy(out->secret_access_key, sk, strlen(sk) + 1);
    if (token)
        memcpy(out->session_token, token, strlen(token) + 1);
    out->expiration = expiration;
    snprintf(out->source, sizeof(out->source), "%s", source);
    return SF_OK;
}

static const char *json_string(const cJSON *doc, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(doc, name);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Copies an untrusted, non-secret string (an error Code) for a message. */
void sf__cred_sanitize(const char *s, char *buf, size_t len)
{
    size_t j = 0;
    for (; s && *s && j + 1 < len; s++)
        buf[j++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
    buf[j] = '\0';
}

sf_status sf__credentials_parse_json(const char *body, size_t n, struct sf__credentials *out,
                                     char *err, size_t err_len)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    sf__clear_err(err, err_len);
    if (!body)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "no body");
    if (n > BODY_MAX_BYTES)
        return sf__fail(err, err_len, SF_ERR_LIMIT, "credentials document over %zu bytes",
                        BODY_MAX_BYTES);
    /* cJSON keeps C strings: a NUL, raw or escaped, would cut a key or a
     * token short without a word. */
    const char *nul = memchr(body, '\0', n);
    if (nul)
        return sf__fail(err, err_len, SF_ERR_PARSE,
                        "credentials document holds a NUL byte at offset %zu",
                        (size_t)(nul - body));
    /* A document with an escaped NUL is refused below; it is parsed from a
     * copy with those masked, so the wipe at the end reaches each secret's
     * whole copy in the tree, not only its bytes before the NUL. */
    char *masked = NULL;
    if (memmem(body, n, "u0000", 5)) {
        masked = malloc(n ? n : 1);
        if (!masked)
            return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
        memcpy(masked, body, n);
        if (!sf__json_mask_nuls(masked, n)) {
            sf__wipe(masked, n);
            free(masked);
            masked = NULL;
        }
    }
    cJSON *doc = cJSON_ParseWithLength(masked ? masked : body, n);
    if (masked) {
        sf__wipe(masked, n);
        free(masked);
    }
    if (!doc)
        return sf__fail(err, err_len, SF_ERR_PARSE, "credentials document is not valid JSON");
    sf_status st = SF_OK;
    if (!cJSON_IsObject(doc)) {
        st = sf__fail(err, err_len, SF_ERR_PARSE, "credentials document is not a JSON object");
        goto done;
    }
    char where[300];
    if (sf__json_nul_where_n(body, n, doc, where, sizeof(where))) {
        st = sf__fail(err, err_len, SF_ERR_PARSE,
                      "credentials document: %.160s holds a NUL character (\\u0000)", where);
        goto done;
    }
    const char *code = json_string(doc, "Code");
    if (cJSON_GetObjectItemCaseSensitive(doc, "Code") && (!code || strcmp(code, "Success") != 0)) {
        char c[64];
        sf__cred_sanitize(code ? code : "(not a string)", c, sizeof(c));
        st = sf__fail(err, err_len, SF_ERR_ACCESS_DENIED, "credentials document has Code '%s'", c);
        goto done;
    }
    const char *ak = json_string(doc, "AccessKeyId");
    const char *sk = json_string(doc, "SecretAccessKey");
    const char *token = json_string(doc, "Token");
    const char *exp = json_string(doc, "Expiration");
    if (!ak || !sk) {
        st = sf__fail(err, err_len, SF_ERR_PARSE,
                      "credentials document lacks AccessKeyId or SecretAccessKey");
        goto done;
    }
    if (cJSON_GetObjectItemCaseSensitive(doc, "Token") && !token) {
        st = sf__fail(err, err_len, SF_ERR_PARSE, "credentials document: Token is not a string");
        goto done;
    }
    int64_t expiration = 0;
    if (cJSON_GetObjectItemCaseSensitive(doc, "Expiration")) {
        if (!exp || !parse_iso8601(exp, &expiration) || expiration <= 0) {
            st = sf__fail(err, err_len, SF_ERR_PARSE,
                          "credentials document: Expiration is not an ISO-8601 UTC time");
            goto done;
        }
        if ((int64_t)(time_t)expiration != expiration) {
            st = sf__fail(err, err_len, SF_ERR_PARSE,
                          "credentials document: Expiration out of range");
            goto done;
        }
    }
    st = fill_creds(out, ak, sk, token && *token ? token : NULL, (time_t)expiration, "json", err,
                    err_len);
done:
    if (st != SF_OK)
        sf__wipe(out, sizeof(*out));
    /* The parsed tree holds the secret too. */
    for (const char *const *k = (const char *const[]){"SecretAccessKey", "Token", NULL}; *k; k++) {
        cJSON *it = cJSON_GetObjectItemCaseSensitive(doc, *k);
        if (cJSON_IsString(it) && it->valuestring)
            sf__wipe(it->valuestring, strlen(it->valuestring));
    }
    cJSON_Delete(doc);
    return st;
}

sf_status sf__cred_from_document(const struct sf__strbuf *body, time_t now,
                                 struct sf__credentials *out, char *why, size_t why_len)
{
    sf_status st = sf__credentials_parse_json(sf__strbuf_str(body), body->len, out, why, why_len);
    if (st == SF_OK && out->expiration != 0 && out->expiration <= now) {
        char t[32];
        sf__cred_format_time(out->expiration, t, sizeof(t));
        st = sf__fail(why, why_len, SF_ERR_PARSE, "returned credentials that expired at %s", t);
    }
    if (st != SF_OK)
        sf__wipe(out, sizeof(*out));
    return st;
}

/* ------------------------------------------------------------ providers */

static sf_status from_explicit(struct sf__cred_chain *c, struct sf__credentials *out, char *why,
                               size_t why_len)
{
    const struct cred_keys *k = &c->explicit_keys;
    if (!k->access_key_id)
        return sf__fail(why, why_len, SF_ERR_NOT_FOUND, "explicit options not set");
    return fill_creds(out, k->access_key_id, k->secret_access_key, k->session_token, 0, "explicit",
                      why, why_len);
}

static sf_status from_env(struct sf__cred_chain *c, struct sf__credentials *out, char *why,
                          size_t why_len)
{
    const struct cred_keys *k = &c->env_keys;
    if (!k->access_key_id && !k->secret_access_key)
        return sf__fail(why, why_len, SF_ERR_NOT_FOUND, "AWS_ACCESS_KEY_ID not set");
    if (!k->access_key_id)
        return sf__fail(why, why_len, SF_ERR_INVALID_ARGUMENT,
                        "AWS_SECRET_ACCESS_KEY set but AWS_ACCESS_KEY_ID not set");
    if (!k->secret_access_key)
        return sf__fail(why, why_len, SF_ERR_INVALID_ARGUMENT,
                        "AWS_ACCESS_KEY_ID set but AWS_SECRET_ACCESS_KEY not set");
    char e[256];
    sf_status st = fill_creds(out, k->access_key_id, k->secret_access_key, k->session_token, 0,
                              "env", e, sizeof(e));
    if (st != SF_OK)
        return sf__fail(why, why_len, st, "environment: %s", e);
    return SF_OK;
}

static sf_status from_profile(struct sf__cred_chain *c, struct sf__credentials *out, char *why,
                              size_t why_len)
{
    const struct cred_profile *pr = &c->profile;
    char files[1100];
    snprintf(files, sizeof(files), "%s, %s",
             pr->cred_path ? pr->cred_path : "(no credentials file: HOME unset)",
             pr->config_path ? pr->config_path : "(no config file: HOME unset)");
    struct sf__aws_profile p;
    char e[512];
    sf_status st =
        sf__aws_profile_load_files(pr->name, pr->cred_path, pr->config_path, &p, e, sizeof(e));
    if (st != SF_OK)
        return sf__fail(why, why_len, st, "profile '%s': %s", pr->name, e);
    if (!p.found) {
        st = sf__fail(why, why_len, SF_ERR_NOT_FOUND, "profile '%s': not found in %s", pr->name,
                      files);
    } else if (!p.aws_access_key_id || !p.aws_secret_access_key) {
        st = sf__fail(why, why_len, SF_ERR_NOT_FOUND,
                      "profile '%s': no aws_access_key_id and aws_secret_access_key in %s "
                      "(role_arn, sso and credential_process are not supported)",
                      pr->name, files);
    } else {
        char source[64];
        snprintf(source, sizeof(source), "profile:%s", pr->name);
        st = fill_creds(out, p.aws_access_key_id, p.aws_secret_access_key, p.aws_session_token, 0,
                        source, e, sizeof(e));
        if (st != SF_OK)
            sf__fail(why, why_len, st, "profile '%s': %s", pr->name, e);
    }
    sf__aws_profile_free(&p); /* wipes the keys */
    return st;
}
static sf_status fetch(struct sf__cred_chain *c, enum provider p, time_t now,
                       struct sf__credentials *out, char *why, size_t why_len)
{
    switch (p) {
    case P_EXPLICIT: return from_explicit(c, out, why, why_len);
    case P_ENV: return from_env(c, out, why, why_len);
    case P_PROFILE: return from_profile(c, out, why, why_len);
    case P_CONTAINER: return sf__cred_from_container(c, now, out, why, why_len);
    case P_IMDS: return sf__cred_from_imds(c, now, out, why, why_len);
    case P_NONE: break;
    }
    return sf__fail(why, why_len, SF_ERR_INTERNAL, "no provider");
}

/* Caches cr as the current credentials. Credentials that already expire
 * within the margin (IMDS hands out new ones only minutes before the old
 * expire) are not asked for again on every call: the next try waits
 * REFRESH_RETRY_S, as after a failed refresh. */
static void adopt(struct sf__cred_chain *c, enum provider p, const struct sf__credentials *cr,
                  time_t now)
{
    c->have = 1;
    c->provider = p;
    c->cur = *cr;
    c->retry_after = 0;
    if (cr->expiration != 0 && now >= cr->expiration - (time_t)c->margin_s)
        c->retry_after = now + REFRESH_RETRY_S;
}

/* Walks the whole chain. On failure err lists every provider's reason. */
static sf_status resolve(struct sf__cred_chain *c, time_t now, struct sf__credentials *out,
                         char *err, size_t err_len)
{
    static const enum provider order[] = {P_EXPLICIT, P_ENV, P_PROFILE, P_CONTAINER, P_IMDS};
    struct sf__strbuf msg;
    sf__strbuf_init(&msg, MSG_MAX_BYTES);
    sf__strbuf_puts(&msg, "no credentials: ");
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        char why[WHY_BYTES];
        why[0] = '\0';
        sf_status st = fetch(c, order[i], now, out, why, sizeof(why));
        if (st == SF_OK) {
            adopt(c, order[i], out, now);
            sf__strbuf_free(&msg);
            return SF_OK;
        }
        if (st == SF_ERR_NO_MEMORY) {
            sf__strbuf_free(&msg);
            return sf__fail(err, err_len, st, "out of memory");
        }
        sf__strbuf_printf(&msg, "%s%s", i ? "; " : "", why);
    }
    sf__fail(err, err_len, SF_ERR_ACCESS_DENIED, "%s", sf__strbuf_str(&msg));
    sf__strbuf_free(&msg);
    return SF_ERR_ACCESS_DENIED;
}

/* ------------------------------------------------------------ chain */

static void keys_free(struct cred_keys *k)
{
    free(k->access_key_id);
    sf__free_secret(k->secret_access_key);
    sf__free_secret(k->session_token);
}

static void profile_free(struct cred_profile *pr)
{
    free(pr->name);
    free(pr->cred_path);
    free(pr->config_path);
}

static void container_free(struct cred_container *ct)
{
    free(ct->full_uri);
    free(ct->relative_uri);
    free(ct->base);
    sf__free_secret(ct->token);
    free(ct->token_file);
}

/* Cuts the trailing '/' off url in place and returns it (NULL stays NULL). */
static char *strip_trailing_slashes(char *url)
{
    size_t n = url ? strlen(url) : 0;
    while (n > 0 && url[n - 1] == '/')
        url[--n] = '\0';
    return url;
}

sf_status sf__cred_chain_new(const struct sf__cred_options *o, struct sf__cred_chain **out)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    struct sf__cred_options defaults = {0};
    if (!o)
        o = &defaults;
    struct sf__cred_chain *c = calloc(1, sizeof(*c));
    if (!c)
        return SF_ERR_NO_MEMORY;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return SF_ERR_NO_MEMORY;
    }
    c->log = o->log;
    c->log_user = o->log_user;
    c->no_sign_request = o->no_sign_request != 0;
    c->timeout_ms = o->imds_timeout_ms ? o->imds_timeout_ms : DEFAULT_TIMEOUT_MS;
    c->attempts = o->imds_attempts ? o->imds_attempts : DEFAULT_ATTEMPTS;
    c->margin_s = o->refresh_margin_s ? o->refresh_margin_s : DEFAULT_MARGIN_S;
    if (c->timeout_ms > 600000u)
        c->timeout_ms = 600000u;
    if (c->attempts > 10u)
        c->attempts = 10u;

    int have_ak = o->access_key_id && *o->access_key_id;
    int have_sk = o->secret_access_key && *o->secret_access_key;
    int have_tok = o->session_token && *o->session_token;
    if (have_ak != have_sk || (have_tok && !have_ak)) {
        logf_(c, SF_LOG_ERROR,
              "credentials: explicit access key id and secret access key "
              "must be given together (a session token only with both)");
        sf__cred_chain_destroy(c);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (have_ak) {
        struct sf__credentials probe;
        char e[256];
        sf_status st = fill_creds(&probe, o->access_key_id, o->secret_access_key,
                                  have_tok ? o->session_token : NULL, 0, "explicit", e, sizeof(e));
        sf__wipe(&probe, sizeof(probe));
        if (st != SF_OK) {
            logf_(c, SF_LOG_ERROR, "credentials: explicit options: %s", e);
            sf__cred_chain_destroy(c);
            return SF_ERR_INVALID_ARGUMENT;
        }
    }

    int oom = 0;
    if (have_ak) {
        c->explicit_keys.access_key_id = dup_nonempty(o->access_key_id, &oom);
        c->explicit_keys.secret_access_key = dup_nonempty(o->secret_access_key, &oom);
        c->explicit_keys.session_token = dup_nonempty(o->session_token, &oom);
    }
    c->env_keys.access_key_id = env_dup("AWS_ACCESS_KEY_ID", &oom);
    c->env_keys.secret_access_key = env_dup("AWS_SECRET_ACCESS_KEY", &oom);
    c->env_keys.session_token = env_dup("AWS_SESSION_TOKEN", &oom);

    const char *profile = o->profile && *o->profile ? o->profile : getenv("AWS_PROFILE");
    c->profile.name = strdup(profile && *profile ? profile : "default");
    if (!c->profile.name)
        oom = 1;
    c->profile.cred_path = sf__aws_config_path(0);
    c->profile.config_path = sf__aws_config_path(1);

    c->container.relative_uri = env_dup("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", &oom);
    c->container.full_uri = env_dup("AWS_CONTAINER_CREDENTIALS_FULL_URI", &oom);
    c->container.token = env_dup("AWS_CONTAINER_AUTHORIZATION_TOKEN", &oom);
    c->container.token_file = env_dup("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &oom);
    c->container.base = strip_trailing_slashes(
        dup_nonempty(o->container_base_url && *o->container_base_url ? o->container_base_url
                                                                     : DEFAULT_CONTAINER_BASE,
                     &oom));

    const char *disabled = getenv("AWS_EC2_METADATA_DISABLED");
    c->imds_disabled = disabled && strcasecmp(disabled, "true") == 0;
    const char *ep = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    const char *mode = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
    if (!(ep && *ep))
        ep = mode && strcasecmp(mode, "IPv6") == 0 ? IMDS_IPV6_ENDPOINT : DEFAULT_IMDS_ENDPOINT;
    if (strlen(ep) > 512) {
        logf_(c, SF_LOG_WARN,
              "credentials: AWS_EC2_METADATA_SERVICE_ENDPOINT is over 512 bytes; "
              "using " DEFAULT_IMDS_ENDPOINT);
        ep = DEFAULT_IMDS_ENDPOINT;
    }
    c->imds_endpoint = strip_trailing_slashes(dup_nonempty(ep, &oom));
    c->ca_bundle = dup_nonempty(o->ca_bundle, &oom);

    if (oom) {
        sf__cred_chain_destroy(c);
        return SF_ERR_NO_MEMORY;
    }
    *out = c;
    return SF_OK;
}

void sf__cred_chain_destroy(struct sf__cred_chain *c)
{
    if (!c)
        return;
    if (c->curl)
        curl_easy_cleanup(c->curl);
    pthread_mutex_destroy(&c->mu);
    keys_free(&c->explicit_keys);
    keys_free(&c->env_keys);
    profile_free(&c->profile);
    container_free(&c->container);
    free(c->imds_endpoint);
    free(c->ca_bundle);
    sf__wipe(c, sizeof(*c));
    free(c);
}

void sf__cred_chain_invalidate(struct sf__cred_chain *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->have = 0;
    c->provider = P_NONE;
    c->retry_after = 0;
    sf__wipe(&c->cur, sizeof(c->cur));
    pthread_mutex_unlock(&c->mu);
}

sf_status sf__cred_chain_get(struct sf__cred_chain *c, time_t now, struct sf__credentials *out,
                             char *err, size_t err_len)
{
    sf__clear_err(err, err_len);
    if (!c || !out)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "NULL chain or output");
    memset(out, 0, sizeof(*out));
    if (c->no_sign_request) {
        out->anonymous = 1;
        snprintf(out->source, sizeof(out->source), "anonymous");
        return SF_OK;
    }

    /* Log lines are made under the lock and sent after it, so a log callback
     * may call back into the chain. */
    char note[MSG_MAX_BYTES];
    note[0] = '\0';
    enum sf_log_level note_level = SF_LOG_INFO;
    sf_status st = SF_OK;

    pthread_mutex_lock(&c->mu);
    if (!c->have) {
        st = resolve(c, now, out, err, err_len);
        if (st == SF_OK) {
            char t[32] = "never";
            if (out->expiration)
                sf__cred_format_time(out->expiration, t, sizeof(t));
            snprintf(note, sizeof(note), "credentials: from %s (access key id %s), expire %s",
                     out->source, out->access_key_id, t);
        }
    } else if (c->cur.expiration == 0 || now < c->cur.expiration - (time_t)c->margin_s ||
               (now < c->cur.expiration && now < c->retry_after)) {
        *out = c->cur;
    } else {
        char why[WHY_BYTES];
        struct sf__credentials fresh;
        st = fetch(c, c->provider, now, &fresh, why, sizeof(why));
        char t[32];
        sf__cred_format_time(c->cur.expiration, t, sizeof(t));
        if (st == SF_OK) {
            adopt(c, c->provider, &fresh, now);
            *out = fresh;
            snprintf(note, sizeof(note), "credentials: refreshed from %s", out->source);
        } else if (now < c->cur.expiration) {
            c->retry_after = now + REFRESH_RETRY_S;
            *out = c->cur;
            note_level = SF_LOG_WARN;
            snprintf(note, sizeof(note),
                     "credentials: refresh from %s failed (%s); using the current ones until "
                     "they expire at %s",
                     c->cur.source, why, t);
            st = SF_OK;
        } else {
            sf__fail(err, err_len, st,
                     "credentials from %s expired at %s and the refresh failed: %s", c->cur.source,
                     t, why);
        }
        sf__wipe(&fresh, sizeof(fresh));
    }
    pthread_mutex_unlock(&c->mu);
    if (note[0])
        logf_(c, note_level, "%s", note);
    return st;
}
