/*
 * The public S3 client: configuration resolution (options, environment,
 * profile), request preparation and signing for the fetch engine, stat,
 * and fetches of local files. Listings and source expansion are in
 * s3/s3_list.c, uploads (PUT and multipart) in s3/s3_upload.c;
 * s3/s3_client_impl.h is what they share.
 */
#include "s3/aws_config.h"
#include "s3/credentials.h"
#include "s3/endpoint.h"
#include "s3/fetch.h"
#include "s3/s3_client.h"
#include "s3/s3_client_impl.h"
#include "s3/sigv4.h"
#include "shardfeed_s3.h"
#include "common/strbuf.h"
#include "common/file.h"
#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ small helpers */

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

__attribute__((format(printf, 3, 4))) sf_status sf__s3_set_err(struct sf_s3 *s3, sf_status st,
                                                               const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&s3->lock);
    memcpy(s3->errmsg, buf, sizeof(buf));
    pthread_mutex_unlock(&s3->lock);
    return st;
}

sf_status sf__s3_parse_url(struct sf_s3 *s3, const char *url, struct sf__locator *loc)
{
    char err[512];
    sf_status st = sf__locator_parse(url, loc, err, sizeof(err));
    if (st != SF_OK)
        sf__s3_set_err(s3, st, "%s", err);
    return st;
}

SF_API const char *sf_s3_errmsg(struct sf_s3 *s3, char *buf, size_t buf_len)
{
    if (!buf || !buf_len)
        return "";
    if (!s3) {
        buf[0] = '\0';
        return buf;
    }
    pthread_mutex_lock(&s3->lock);
    snprintf(buf, buf_len, "%s", s3->errmsg);
    pthread_mutex_unlock(&s3->lock);
    return buf;
}

SF_API void sf_s3_options_init_default(struct sf_s3_options *o)
{
    memset(o, 0, sizeof(*o));
    o->concurrency = 32;
    o->chunk_bytes = 8ull << 20;
    o->max_attempts = 10;
    o->retry_base_ms = 50;
    o->throttle_base_ms = 500;
    o->retry_cap_ms = 20000;
    o->retry_quota = 500;
    o->stall_timeout_ms = 30000;
    o->connect_timeout_ms = 10000;
    o->first_byte_timeout_ms = 15000;
    o->request_timeout_ms = 45000;
    o->max_object_bytes = 64ull << 30;
    o->log_level = SF_LOG_WARN;
}

/* ------------------------------------------------------------ signing */

static sf_status add_header(struct curl_slist **list, const char *name, const char *value)
{
    char line[8192];
    int n = snprintf(line, sizeof(line), "%s: %s", name, value);
    if (n < 0 || (size_t)n >= sizeof(line))
        return SF_ERR_LIMIT;
    struct curl_slist *l = curl_slist_append(*list, line);
    if (!l)
        return SF_ERR_NO_MEMORY;
    *list = l;
    return SF_OK;
}

static sf_status prepare(void *user, const struct sf__req_spec *spec, char **url,
                         struct curl_slist **headers, char *err, size_t err_len)
{
    struct sf_s3 *s3 = user;
    sf_status st = SF_OK;
    *url = NULL;
    *headers = NULL;
    if (spec->range_first != SF__NO_RANGE) {
        char range[96];
        if (spec->range_last == SF__NO_RANGE)
            snprintf(range, sizeof(range), "bytes=%" PRIu64 "-", spec->range_first);
        else
            snprintf(range, sizeof(range), "bytes=%" PRIu64 "-%" PRIu64, spec->range_first,
                     spec->range_last);
        st = add_header(headers, "Range", range);
    }
    if (st == SF_OK && spec->if_match)
        st = add_header(headers, "If-Match", spec->if_match);
    /* no "Expect: 100-continue", no Accept noise */
    if (st == SF_OK)
        st = add_header(headers, "Accept", "*/*");
    if (st != SF_OK)
        return st;
    if (spec->loc->kind == SF__LOC_HTTP) {
        *url = strdup(spec->loc->url);
        return *url ? SF_OK : SF_ERR_NO_MEMORY;
    }
    struct sf__target t;
    const char *bucket = spec->loc->bucket && *spec->loc->bucket ? spec->loc->bucket : NULL;
    st = sf__endpoint_target(&s3->ep, bucket, bucket ? spec->loc->key : NULL, spec->query, &t);
    if (st != SF_OK)
        return st;
    st = add_header(headers, "Host", t.host);
    struct sf__credentials cr;
    if (st == SF_OK)
        st = sf__cred_chain_get(s3->creds, spec->sign_time, &cr, err, err_len);
    if (st == SF_OK && !cr.anonymous) {
        struct sf__sigv4_signer signer;
        sf__sigv4_signer_init(&signer, cr.access_key_id, cr.secret_access_key,
                              cr.session_token[0] ? cr.session_token : NULL, s3->ep.region, "s3");
        struct sf__header host = {"host", t.host};
        struct sf__sigv4_request req = {
            .method = spec->method,
            .path = t.path,
            .query = spec->query,
            .headers = &host,
            .n_headers = 1,
            .payload_hash = spec->payload_hash ? spec->payload_hash : SF__EMPTY_SHA256,
        };
        char amz_date[SF__AMZ_DATE_LEN + 1];
        struct sf__header extra[3];
        size_t n_extra = 0;
        struct sf__sigv4_result res;
        memset(&res, 0, sizeof(res));
        st =
            sf__sigv4_sign_request(&signer, &req, spec->sign_time, amz_date, extra, &n_extra, &res);
        for (size_t i = 0; st == SF_OK && i < n_extra; i++)
            st = add_header(headers, extra[i].name, extra[i].value);
        if (st == SF_OK)
            st = add_header(headers, "Authorization", res.authorization);
        sf__sigv4_result_free(&res);
        sf__sigv4_signer_destroy(&signer);
        if (st != SF_OK)
            snprintf(err, err_len, "signing failed: %s", sf_status_str(st));
    }
    memset(&cr, 0, sizeof(cr));
    if (st == SF_OK) {
        *url = t.url;
        t.url = NULL;
    }
    sf__target_free(&t);
    return st;
}

static void invalidate(void *user)
{
    struct sf_s3 *s3 = user;
    sf__cred_chain_invalidate(s3->creds);
}

/* Resolves (or refreshes) credentials on the caller's thread, so the I/O
 * thread rarely waits for IMDS or a container endpoint while signing, and a
 * missing credential fails at once with the chain's explanation. */
sf_status sf__s3_ensure_creds(struct sf_s3 *s3, const char *display)
{
    struct sf__credentials cr;
    char err[768] = "";
    sf_status st = sf__cred_chain_get(s3->creds, time(NULL), &cr, err, sizeof(err));
    memset(&cr, 0, sizeof(cr));
    if (st != SF_OK)
        sf__s3_set_err(s3, st, "%s: %s", display, err);
    return st;
}

/* ------------------------------------------------------------ new / destroy */

static void cred_log(void *user, enum sf_log_level level, const char *message)
{
    struct sf_s3 *s3 = user;
    if (s3->opt.log && level <= s3->opt.log_level)
        s3->opt.log(s3->opt.log_user, level, message);
}

SF_API sf_status sf_s3_new(const struct sf_s3_options *o, struct sf_s3 **out, char *err,
                           size_t err_len)
{
    char dummy[8];
    if (!err || !err_len) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    err[0] = '\0';
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    struct sf_s3_options def;
    if (!o) {
        sf_s3_options_init_default(&def);
        o = &def;
    }
    if (o->concurrency < 1 || o->concurrency > SF_S3_CONCURRENCY_MAX) {
        snprintf(err, err_len, "concurrency must be 1..%u, not %u", SF_S3_CONCURRENCY_MAX,
                 o->concurrency);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (o->io_threads > SF__IO_THREADS_MAX) {
        snprintf(err, err_len, "io_threads must be 0 (automatic) or 1..%u, not %u",
                 SF__IO_THREADS_MAX, o->io_threads);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (o->chunk_bytes < SF_S3_CHUNK_BYTES_MIN || o->chunk_bytes > SF_S3_CHUNK_BYTES_MAX) {
        snprintf(err, err_len, "chunk_bytes must be 1 KiB..5 GiB, not %llu", o->chunk_bytes);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (o->max_attempts < 1 || o->max_attempts > SF_S3_MAX_ATTEMPTS_MAX) {
        snprintf(err, err_len, "max_attempts must be 1..%u, not %u", SF_S3_MAX_ATTEMPTS_MAX,
                 o->max_attempts);
        return SF_ERR_INVALID_ARGUMENT;
    }
    const struct {
        const char *name;
        unsigned v, min;
    } timeouts[] = {{"stall_timeout_ms", o->stall_timeout_ms, 1},
                    {"connect_timeout_ms", o->connect_timeout_ms, 1},
                    {"first_byte_timeout_ms", o->first_byte_timeout_ms, 0},
                    {"request_timeout_ms", o->request_timeout_ms, 0}};
    for (size_t i = 0; i < sizeof(timeouts) / sizeof(timeouts[0]); i++)
        if (timeouts[i].v < timeouts[i].min || timeouts[i].v > SF_S3_TIMEOUT_MS_MAX) {
            snprintf(err, err_len, "%s must be %u..%u, not %u", timeouts[i].name, timeouts[i].min,
                     SF_S3_TIMEOUT_MS_MAX, timeouts[i].v);
            return SF_ERR_INVALID_ARGUMENT;
        }
    if (!o->access_key_id != !o->secret_access_key) {
        snprintf(err, err_len, "access_key_id and secret_access_key go together");
        return SF_ERR_INVALID_ARGUMENT;
    }
    struct sf_s3 *s3 = calloc(1, sizeof(*s3));
    if (!s3)
        return SF_ERR_NO_MEMORY;
    pthread_mutex_init(&s3->lock, NULL);
    s3->opt = *o;

    struct sf__aws_profile prof;
    memset(&prof, 0, sizeof(prof));
    sf_status st = SF_OK;
    /* A profile the user named (option or AWS_PROFILE) must exist, even when
     * nothing is taken from it: aws-cli refuses it too, and a typo would
     * otherwise run with whatever other credentials are about. */
    const char *named = o->profile && *o->profile ? o->profile : env_nonempty("AWS_PROFILE");
    if (named || !o->endpoint_url || !o->region || !o->ca_bundle ||
        o->addressing == SF_ADDRESSING_AUTO)
        st = sf__aws_profile_load(o->profile, &prof, err, err_len);
    if (st == SF_OK && named && !prof.found) {
        char *cred = sf__aws_config_path(0), *conf = sf__aws_config_path(1);
        snprintf(err, err_len, "profile '%s' not found in %s or %s", named,
                 cred ? cred : "~/.aws/credentials", conf ? conf : "~/.aws/config");
        free(cred);
        free(conf);
        st = SF_ERR_INVALID_ARGUMENT;
    }
    if (st == SF_OK) {
        const char *ep = o->endpoint_url                       ? o->endpoint_url
                         : env_nonempty("AWS_ENDPOINT_URL_S3") ? env_nonempty("AWS_ENDPOINT_URL_S3")
                         : env_nonempty("AWS_ENDPOINT_URL")    ? env_nonempty("AWS_ENDPOINT_URL")
                                                               : prof.endpoint_url;
        const char *region = o->region                    ? o->region
                             : env_nonempty("AWS_REGION") ? env_nonempty("AWS_REGION")
                             : env_nonempty("AWS_DEFAULT_REGION")
                                 ? env_nonempty("AWS_DEFAULT_REGION")
                             : prof.region ? prof.region
                                           : "us-east-1";
        const char *ca = o->ca_bundle                    ? o->ca_bundle
                         : env_nonempty("AWS_CA_BUNDLE") ? env_nonempty("AWS_CA_BUNDLE")
                                                         : prof.ca_bundle;
        enum sf_addressing addressing = o->addressing;
        if (addressing == SF_ADDRESSING_AUTO && prof.addressing_style) {
            if (!strcasecmp(prof.addressing_style, "path"))
                addressing = SF_ADDRESSING_PATH;
            else if (!strcasecmp(prof.addressing_style, "virtual"))
                addressing = SF_ADDRESSING_VIRTUAL;
        }
        /* ca may be the profile's, freed below: the client keeps a copy. */
        if (ca && !(s3->ca_bundle = strdup(ca)))
            st = sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
        if (st == SF_OK)
            st = sf__endpoint_init(&s3->ep, ep, region, addressing, err, err_len);
    }
    sf__aws_profile_free(&prof);
    if (st == SF_OK && s3->ca_bundle && access(s3->ca_bundle, R_OK) != 0) {
        snprintf(err, err_len, "CA bundle '%s' cannot be read: %s", s3->ca_bundle, strerror(errno));
        st = SF_ERR_INVALID_ARGUMENT;
    }
    if (st == SF_OK) {
        struct sf__cred_options co = {
            .access_key_id = o->access_key_id,
            .secret_access_key = o->secret_access_key,
            .session_token = o->session_token,
            .profile = o->profile,
            .no_sign_request = o->no_sign_request,
            .ca_bundle = s3->ca_bundle,
            .log = cred_log,
            .log_user = s3,
        };
        st = sf__cred_chain_new(&co, &s3->creds);
        if (st != SF_OK)
            snprintf(err, err_len, "credentials: %s", sf_status_str(st));
    }
    if (st == SF_OK) {
        struct sf__engine_config ec = {
            .opt = *o,
            .prepare = prepare,
            .invalidate = invalidate,
            .user = s3,
        };
        snprintf(ec.region, sizeof(ec.region), "%s", s3->ep.region);
        if (!ec.opt.io_threads)
            ec.opt.io_threads = sf__io_threads_default();
        if (!ec.opt.max_object_bytes)
            ec.opt.max_object_bytes = 64ull << 30;
        ec.opt.ca_bundle = s3->ca_bundle;
        st = sf__engine_new(&ec, &s3->engine, err, err_len);
    }
    if (st != SF_OK) {
        sf_s3_destroy(s3);
        return st;
    }
    *out = s3;
    return SF_OK;
}

SF_API void sf_s3_destroy(struct sf_s3 *s3)
{
    if (!s3)
        return;
    sf__engine_destroy(s3->engine);
    sf__cred_chain_destroy(s3->creds);
    sf__endpoint_free(&s3->ep);
    free(s3->ca_bundle);
    pthread_mutex_destroy(&s3->lock);
    free(s3);
}

SF_API void sf_s3_get_stats(struct sf_s3 *s3, struct sf_s3_stats *out)
{
    sf__engine_stats(s3->engine, out);
}

/* ------------------------------------------------------------ stat */

sf_status sf__s3_stat_local(struct sf_s3 *s3, const char *path, const char *display,
                            struct sf_object_info *out)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        return sf__s3_set_err(s3, sf__errno_status(e), "%s: %s", display, strerror(e));
    }
    if (!S_ISREG(sb.st_mode))
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: not a regular file", display);
    out->url = strdup(display);
    out->key = strdup(path);
    out->size = (uint64_t)sb.st_size;
    out->last_modified = sb.st_mtim.tv_sec;
    if (!out->url || !out->key) {
        sf_object_info_clear(out);
        return SF_ERR_NO_MEMORY;
    }
    return SF_OK;
}

/* HEAD of an s3:// or http(s):// object: fills size, etag and
 * last_modified of *out (nothing else). Only s3:// requests need
 * credentials. */
sf_status sf__s3_head_object(struct sf_s3 *s3, const struct sf__locator *loc,
                             struct sf_object_info *out)
{
    sf_status st = SF_OK;
    if (loc->kind == SF__LOC_S3 && (st = sf__s3_ensure_creds(s3, loc->display)) != SF_OK)
        return st;
    struct sf__response r;
    st = sf__engine_call(s3->engine, "HEAD", loc, NULL, 1024, &r);
    if (st != SF_OK) {
        sf__s3_set_err(s3, st, "%s", r.errmsg);
    } else {
        out->size = r.content_length;
        snprintf(out->etag, sizeof(out->etag), "%s", r.etag);
        out->last_modified = r.last_modified;
    }
    sf__response_free(&r);
    return st;
}

SF_API sf_status sf_s3_stat(struct sf_s3 *s3, const char *url, struct sf_object_info *out)
{
    if (!s3 || !url || !out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    struct sf__locator loc;
    sf_status st = sf__s3_parse_url(s3, url, &loc);
    if (st != SF_OK)
        return st;
    if (loc.kind == SF__LOC_FILE) {
        st = sf__s3_stat_local(s3, loc.key, loc.display, out);
        sf__locator_free(&loc);
        return st;
    }
    if (loc.kind == SF__LOC_S3 && (!*loc.bucket || !*loc.key)) {
        sf__locator_free(&loc);
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: stat needs s3://bucket/key", url);
    }
    st = sf__s3_head_object(s3, &loc, out);
    if (st == SF_OK) {
        out->url = strdup(loc.display);
        out->key = strdup(loc.key);
        if (!out->url || !out->key) {
            sf_object_info_clear(out);
            st = SF_ERR_NO_MEMORY;
        }
    }
    sf__locator_free(&loc);
    return st;
}

/* ------------------------------------------------------------ fetch */

static sf_status read_local(struct sf_s3 *s3, const struct sf__locator *loc,
                            const struct sf_fetch_options *o, struct sf_fetch **out)
{
    char msg[1024] = "";
    sf_status st = SF_OK;
    void *owned = NULL;
    uint64_t total = 0, object_size = SF_SIZE_UNKNOWN;
    struct stat sb;
    int fd = sf__open_stat(loc->key, &sb);
    if (fd < 0) {
        int e = errno;
        snprintf(msg, sizeof(msg), "%s: %s", loc->display, strerror(e));
        st = sf__errno_status(e);
    } else if (!S_ISREG(sb.st_mode)) {
        snprintf(msg, sizeof(msg), "%s: not a regular file", loc->display);
        st = SF_ERR_INVALID_ARGUMENT;
    } else if (o->offset > (uint64_t)sb.st_size ||
               (o->offset == (uint64_t)sb.st_size && sb.st_size > 0 && o->length != 0)) {
        snprintf(msg, sizeof(msg), "%s: offset %llu is past the end (%lld bytes)", loc->display,
                 o->offset, (long long)sb.st_size);
        st = SF_ERR_RANGE;
    } else {
        object_size = (uint64_t)sb.st_size;
        total = (uint64_t)sb.st_size - o->offset;
        if (o->length != SF_SIZE_UNKNOWN && o->length < total)
            total = o->length;
        unsigned char *dst = o->buffer;
        if (dst && total > o->buffer_bytes) {
            snprintf(msg, sizeof(msg), "%s: %" PRIu64 " bytes do not fit the %llu-byte buffer",
                     loc->display, total, o->buffer_bytes);
            st = SF_ERR_LIMIT;
        } else if (o->fd < 0 && !dst) {
            if (total > s3->opt.max_object_bytes && s3->opt.max_object_bytes) {
                snprintf(msg, sizeof(msg), "%s: %" PRIu64 " bytes exceed max_object_bytes",
                         loc->display, total);
                st = SF_ERR_LIMIT;
            } else if (!(dst = owned = malloc(total ? total : 1))) {
                st = SF_ERR_NO_MEMORY;
            }
        }
        unsigned char tmp[1 << 16];
        uint64_t done = 0;
        while (st == SF_OK && done < total) {
            size_t want = total - done;
            unsigned char *to = dst ? dst + done : tmp;
            if (!dst && want > sizeof(tmp))
                want = sizeof(tmp);
            size_t got;
            int rc = sf__pread_full(fd, to, want, o->offset + done, &got);
            int read_errno = errno, wrc = 0;
            /* what was read goes to the file before a stop is reported */
            if (!dst && got)
                wrc = sf__pwrite_full(o->fd, tmp, got, o->file_offset + done, NULL);
            if (wrc) {
                snprintf(msg, sizeof(msg), "%s: write: %s", loc->display,
                         wrc < 0 ? strerror(errno) : "no progress");
                st = SF_ERR_IO;
            } else if (rc) {
                snprintf(msg, sizeof(msg), "%s: read at offset %" PRIu64 ": %s", loc->display,
                         (uint64_t)(o->offset + done + got),
                         rc < 0 ? strerror(read_errno) : "file shrank");
                st = rc < 0 ? SF_ERR_IO : SF_ERR_CHANGED;
            }
            done += got;
        }
    }
    if (fd >= 0)
        close(fd);
    if (st != SF_OK) {
        free(owned);
        owned = NULL;
        sf__s3_set_err(s3, st, "%s", msg);
    }
    return sf__fetch_new_done(o, object_size, total, st, st == SF_OK ? NULL : msg, owned, out);
}

SF_API sf_status sf_fetch_start(struct sf_s3 *s3, const char *url, const struct sf_fetch_options *o,
                                struct sf_fetch **out)
{
    if (!s3 || !url || !out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    struct sf_fetch_options def;
    if (!o) {
        sf_fetch_options_init_default(&def);
        o = &def;
    }
    if (o->buffer && o->fd >= 0)
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT,
                              "%s: a fetch has one destination: buffer or fd, not both", url);
    int fl = o->fd >= 0 ? fcntl(o->fd, F_GETFL) : -1;
    if (fl != -1 && (fl & O_APPEND))
        /* pwrite() on it would put every range at the end, in arrival order */
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT,
                              "%s: the fd is open with O_APPEND, which ignores the offsets the "
                              "ranges are written at",
                              url);
    struct sf__locator loc;
    sf_status st = sf__s3_parse_url(s3, url, &loc);
    if (st != SF_OK)
        return st;
    if (loc.kind == SF__LOC_S3 && (!*loc.bucket || !*loc.key)) {
        sf__locator_free(&loc);
        return sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: fetch needs s3://bucket/key", url);
    }
    if (loc.kind == SF__LOC_FILE) {
        st = read_local(s3, &loc, o, out);
        sf__locator_free(&loc);
        return st == SF_OK ? SF_OK : st;
    }
    if (loc.kind == SF__LOC_S3 && (st = sf__s3_ensure_creds(s3, loc.display)) != SF_OK) {
        sf__locator_free(&loc);
        return st;
    }
    char err[512];
    st = sf__engine_fetch(s3->engine, &loc, o, out, err, sizeof(err));
    if (st != SF_OK)
        sf__s3_set_err(s3, st, "%s", err);
    sf__locator_free(&loc);
    return st;
}

/* ------------------------------------------------------------ identity */

sf_status sf__s3_identity(struct sf_s3 *s3, const char *url, char *endpoint, size_t endpoint_len,
                          char *bucket, size_t bucket_len, char *key, size_t key_len)
{
    struct sf__locator loc;
    sf_status st = sf__s3_parse_url(s3, url, &loc);
    if (st != SF_OK)
        return st;
    int n1, n2, n3;
    if (loc.kind == SF__LOC_S3) {
        n1 = snprintf(endpoint, endpoint_len, "%s://%s%s", s3->ep.scheme, s3->ep.authority,
                      s3->ep.base_path ? s3->ep.base_path : "");
        n2 = snprintf(bucket, bucket_len, "%s", loc.bucket);
        n3 = snprintf(key, key_len, "%s", loc.key);
    } else {
        n1 = snprintf(endpoint, endpoint_len, "%s", loc.kind == SF__LOC_HTTP ? "url" : "file");
        n2 = snprintf(bucket, bucket_len, "%s", "");
        n3 = snprintf(key, key_len, "%s", loc.kind == SF__LOC_HTTP ? loc.url : loc.key);
    }
    sf__locator_free(&loc);
    if (n1 >= (int)endpoint_len || n2 >= (int)bucket_len || n3 >= (int)key_len)
        return sf__s3_set_err(s3, SF_ERR_LIMIT, "%s: name too long for a cache identity", url);
    return SF_OK;
}
