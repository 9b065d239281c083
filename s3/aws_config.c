/*
 * The AWS shared config and credentials files (INI with one level of nested
 * sub-sections). The files are untrusted input: lines and files are capped,
 * and no message ever quotes a value (a line number and the path at most).
 *
 * Where readers disagree we chose:
 * - Duplicate keys (and duplicate sections, which merge): the last one wins.
 *   botocore's RawConfigParser is strict and refuses such a file outright
 *   (DuplicateOptionError); the SDK file-format spec (Java v2, the CRT) lets
 *   the later value win. Refusing a file the other SDKs accept helps nobody,
 *   and "later wins" is what a person appending a line expects.
 * - Comments: a line whose first non-blank byte is '#' or ';', and, on a
 *   "key = value" line, '#' or ';' preceded by a blank ends the value (the
 *   SDK spec; botocore keeps such text in the value). Real keys, tokens,
 *   regions and URLs contain no blanks, so no real value is cut.
 * - Keys are case-insensitive (configparser lower-cases them); section names
 *   are not. "[ profile  x ]" and "[profile \"x\"]" both name profile x.
 * - A line that is neither a section, a comment nor "key = value", or a
 *   setting before any section, is SF_ERR_PARSE with its line number, as the
 *   AWS CLI refuses the same file.
 * - An indented line after "key =" (empty value) belongs to the sub-section
 *   `key`; an indented line after "key = value" continues that value, which
 *   we ignore (no setting we read is multi-line).
 * - Paths: only regular files are read. A directory is SF_ERR_IO; other
 *   non-regular files (AWS_CONFIG_FILE=/dev/null) count as absent, as
 *   botocore's os.path.isfile test does.
 */
#include "s3/aws_config.h"

#include "common/strbuf.h"
#include "common/secret.h"
#include "common/text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define LINE_MAX_BYTES ((size_t)64 * 1024)
#define FILE_MAX_BYTES ((size_t)4 * 1024 * 1024)
#define SUB_NAME_BYTES 64

/* The settings read: where each sits in the files and which field of
 * struct sf__aws_profile holds it. */
struct setting {
    const char *sub; /* NULL: the profile's top level; else the sub-section ("s3 =") */
    const char *key;
    size_t field; /* offsetof(struct sf__aws_profile, ...) */
};

#define FIELD(name) offsetof(struct sf__aws_profile, name)
static const struct setting settings[] = {
    {NULL, "aws_access_key_id", FIELD(aws_access_key_id)},
    {NULL, "aws_secret_access_key", FIELD(aws_secret_access_key)},
    {NULL, "aws_session_token", FIELD(aws_session_token)},
    {NULL, "region", FIELD(region)},
    {NULL, "endpoint_url", FIELD(endpoint_url)},
    {NULL, "ca_bundle", FIELD(ca_bundle)},
    {"s3", "endpoint_url", FIELD(endpoint_url)}, /* wins over the top-level one */
    {"s3", "addressing_style", FIELD(addressing_style)},
};
#undef FIELD

static char **field_at(struct sf__aws_profile *p, size_t field)
{
    return (char **)((char *)p + field);
}

struct parser {
    const char *path;
    const char *want; /* profile name */
    size_t want_len;
    int is_config;
    int in_section; /* a section header has been seen */
    int in_target;  /* the current section is the wanted profile */
    int have_key;   /* a key line was seen in the current section */
    int in_sub;     /* the last key had an empty value: indented lines are its sub-section */
    char sub[SUB_NAME_BYTES];
    struct sf__aws_profile *out;
    int *s3_endpoint_set; /* across both files: then the top-level endpoint_url is ignored */
};

static int is_blank(char c)
{
    return c == ' ' || c == '\t';
}

static void trim(const char **p, size_t *n)
{
    while (*n && is_blank(**p)) {
        (*p)++;
        (*n)--;
    }
    while (*n && ((*p)[*n - 1] == ' ' || (*p)[*n - 1] == '\t' || (*p)[*n - 1] == '\r'))
        (*n)--;
}

static int key_is(const char *k, size_t n, const char *name)
{
    return strlen(name) == n && strncasecmp(k, name, n) == 0;
}

/* Replaces *slot with a copy of v[0..n): the last value wins. */
static sf_status set_value(char **slot, const char *v, size_t n)
{
    char *copy = strndup(v, n);
    if (!copy)
        return SF_ERR_NO_MEMORY;
    sf__free_secret(*slot); /* any value may be a key */
    *slot = copy;
    return SF_OK;
}

/* Reads a whole regular file, capped. *absent = 1 when there is no such
 * file (or it is not a regular file and not a directory). */
static sf_status read_file(const char *path, struct sf__strbuf *out, int *absent, char *err,
                           size_t err_len)
{
    *absent = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            *absent = 1;
            return SF_OK;
        }
        return sf__fail(err, err_len, SF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sf__fail(err, err_len, SF_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return sf__fail(err, err_len, SF_ERR_IO, "%s: is a directory", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        *absent = 1;
        return SF_OK;
    }
    if ((unsigned long long)st.st_size > FILE_MAX_BYTES) {
        close(fd);
        return sf__fail(err, err_len, SF_ERR_LIMIT, "%s: larger than %zu bytes", path,
                        FILE_MAX_BYTES);
    }
    char chunk[16384];
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof(chunk));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return sf__fail(err, err_len, SF_ERR_IO, "%s: cannot read: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        /* The file may have grown since fstat. */
        if (sf__strbuf_append(out, chunk, (size_t)r) != SF_OK) {
            sf_status s = out->err;
            close(fd);
            if (s == SF_ERR_LIMIT)
                return sf__fail(err, err_len, SF_ERR_LIMIT, "%s: larger than %zu bytes", path,
                                FILE_MAX_BYTES);
            return sf__fail(err, err_len, s, "%s: %s", path, sf_status_str(s));
        }
    }
    close(fd);
    return SF_OK;
}

/* Profile name a section header names in this file, or NULL (not a profile). */
static const char *section_profile(const struct parser *ps, const char *h, size_t n,
                                   size_t *name_len)
{
    trim(&h, &n);
    if (ps->is_config) {
        if (n > 7 && strncmp(h, "profile", 7) == 0 && is_blank(h[7])) {
            h += 8;
            n -= 8;
            trim(&h, &n);
        } else if (!(n == 7 && memcmp(h, "default", 7) == 0)) {
            return NULL; /* [preview], [sso-session x], [services x]: not profiles */
        }
    }
    if (n >= 2 && h[0] == '"' && h[n - 1] == '"') {
        h++;
        n -= 2;
    }
    *name_len = n;
    return h;
}

/* Stores a value of the wanted profile. sub: the sub-section the line is in,
 * NULL at the top level. Keys the table does not name are ignored. */
static sf_status apply(struct parser *ps, const char *sub, const char *k, size_t kn, const char *v,
                       size_t vn)
{
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        const struct setting *s = &settings[i];
        if (!s->sub != !sub || (sub && strcasecmp(s->sub, sub) != 0) || !key_is(k, kn, s->key))
            continue;
        int is_endpoint = s->field == offsetof(struct sf__aws_profile, endpoint_url);
        if (is_endpoint && !s->sub && *ps->s3_endpoint_set)
            return SF_OK;
        if (is_endpoint && s->sub)
            *ps->s3_endpoint_set = 1;
        return set_value(field_at(ps->out, s->field), v, vn);
    }
    return SF_OK;
}

/* Splits "key = value ; comment" into trimmed key and value. 0 when there is
 * no '=' or the key is empty. */
static int split_kv(const char *p, size_t n, const char **k, size_t *kn, const char **v, size_t *vn)
{
    if (!sf__split_at(p, n, '=', kn, v, vn))
        return 0;
    *k = p;
    trim(k, kn);
    if (*kn == 0)
        return 0;
    for (size_t i = 1; i < *vn; i++) {
        if (((*v)[i] == '#' || (*v)[i] == ';') && is_blank((*v)[i - 1])) {
            *vn = i;
            break;
        }
    }
    trim(v, vn);
    return 1;
}

static sf_status parse_line(struct parser *ps, const char *p, size_t n, size_t lineno, char *err,
                            size_t err_len)
{
    size_t indent = 0;
    while (indent < n && is_blank(p[indent]))
        indent++;
    const char *rest = p + indent;
    size_t rn = n - indent;
    trim(&rest, &rn);
    if (rn == 0 || rest[0] == '#' || rest[0] == ';')
        return SF_OK; /* blank lines do not end a sub-section (configparser) */

    const char *k, *v;
    size_t kn, vn;
    if (indent > 0 && ps->have_key) {
        if (!ps->in_sub)
            return SF_OK; /* continuation of a value: nothing we read is multi-line */
        if (!split_kv(rest, rn, &k, &kn, &v, &vn))
            return sf__fail(err, err_len, SF_ERR_PARSE,
                            "%s: line %zu: expected 'key = value' in a sub-section", ps->path,
                            lineno);
        return ps->in_target ? apply(ps, ps->sub, k, kn, v, vn) : SF_OK;
    }

    if (rest[0] == '[') {
        const char *close = NULL;
        for (size_t i = rn; i > 1; i--) {
            if (rest[i - 1] == ']') {
                close = rest + i - 1;
                break;
            }
        }
        if (!close)
            return sf__fail(err, err_len, SF_ERR_PARSE, "%s: line %zu: '[' without ']'", ps->path,
                            lineno);
        size_t name_len = 0;
        const char *name = section_profile(ps, rest + 1, (size_t)(close - (rest + 1)), &name_len);
        ps->in_section = 1;
        ps->have_key = 0;
        ps->in_sub = 0;
        ps->in_target = name && name_len == ps->want_len && memcmp(name, ps->want, name_len) == 0;
        if (ps->in_target)
            ps->out->found = 1;
        return SF_OK;
    }

    if (!ps->in_section)
        return sf__fail(err, err_len, SF_ERR_PARSE, "%s: line %zu: a setting before any [section]",
                        ps->path, lineno);
    if (!split_kv(rest, rn, &k, &kn, &v, &vn))
        return sf__fail(err, err_len, SF_ERR_PARSE, "%s: line %zu: expected 'key = value'",
                        ps->path, lineno);
    ps->have_key = 1;
    if (vn == 0) {
        ps->in_sub = 1;
        if (kn < sizeof(ps->sub)) {
            memcpy(ps->sub, k, kn);
            ps->sub[kn] = '\0';
        } else {
            ps->sub[0] = '\0'; /* too long to be a name we read */
        }
        return SF_OK;
    }
    ps->in_sub = 0;
    return ps->in_target ? apply(ps, NULL, k, kn, v, vn) : SF_OK;
}

/* The text of a credentials file holds keys: wiped before it is freed. */
static void wipe_free(struct sf__strbuf *b)
{
    sf__wipe(b->data, b->cap);
    sf__strbuf_free(b);
}

/* Parses one file into ps->f. *found = 1 when the profile's section is there. */
static sf_status parse_file(struct parser *ps, char *err, size_t err_len)
{
    struct sf__strbuf buf;
    sf__strbuf_init(&buf, FILE_MAX_BYTES);
    int absent = 0;
    sf_status st = read_file(ps->path, &buf, &absent, err, err_len);
    if (st != SF_OK || absent) {
        wipe_free(&buf);
        return st;
    }
    const char *d = sf__strbuf_str(&buf);
    size_t len = buf.len;
    if (memchr(d, '\0', len)) {
        wipe_free(&buf);
        return sf__fail(err, err_len, SF_ERR_PARSE, "%s: contains a NUL byte", ps->path);
    }
    size_t pos = 0;
    if (len >= 3 && memcmp(d, "\xEF\xBB\xBF", 3) == 0)
        pos = 3; /* UTF-8 byte order mark */
    size_t lineno = 0;
    while (pos < len && st == SF_OK) {
        const char *nl = memchr(d + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (d + pos)) : len - pos;
        lineno++;
        size_t content = n;
        if (content && d[pos + content - 1] == '\r')
            content--;
        if (content > LINE_MAX_BYTES)
            st = sf__fail(err, err_len, SF_ERR_LIMIT, "%s: line %zu is longer than %zu bytes",
                          ps->path, lineno, LINE_MAX_BYTES);
        else
            st = parse_line(ps, d + pos, content, lineno, err, err_len);
        pos += n + (nl ? 1 : 0);
    }
    wipe_free(&buf);
    return st;
}

static sf_status parse_one(const char *path, int is_config, const char *name,
                           struct sf__aws_profile *out, int *s3_endpoint_set, char *err,
                           size_t err_len)
{
    if (!path)
        return SF_OK;
    struct parser ps = {
        .path = path,
        .want = name,
        .want_len = strlen(name),
        .is_config = is_config,
        .out = out,
        .s3_endpoint_set = s3_endpoint_set,
    };
    return parse_file(&ps, err, err_len);
}

sf_status sf__aws_profile_load_files(const char *name, const char *credentials_path,
                                     const char *config_path, struct sf__aws_profile *out,
                                     char *err, size_t err_len)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    sf__clear_err(err, err_len);
    if (!name || !*name)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "empty profile name");

    int s3_endpoint_set = 0;
    /* Config first, then credentials: values from the credentials file
     * replace those from config (the CLI merges them the same way). */
    sf_status st = parse_one(config_path, 1, name, out, &s3_endpoint_set, err, err_len);
    if (st == SF_OK)
        st = parse_one(credentials_path, 0, name, out, &s3_endpoint_set, err, err_len);
    if (st == SF_OK && !(out->name = strdup(name)))
        st = sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    if (st != SF_OK)
        sf__aws_profile_free(out);
    return st;
}

sf_status sf__aws_profile_load(const char *name, struct sf__aws_profile *out, char *err,
                               size_t err_len)
{
    if (!name || !*name) {
        const char *env = getenv("AWS_PROFILE");
        name = env && *env ? env : "default";
    }
    char *cred = sf__aws_config_path(0);
    char *conf = sf__aws_config_path(1);
    sf_status st = sf__aws_profile_load_files(name, cred, conf, out, err, err_len);
    free(cred);
    free(conf);
    return st;
}

void sf__aws_profile_free(struct sf__aws_profile *p)
{
    if (!p)
        return;
    free(p->name);
    /* Any value may be a key. A freed field is set to NULL: endpoint_url,
     * listed twice, is freed once. */
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        char **value = field_at(p, settings[i].field);
        sf__free_secret(*value);
        *value = NULL;
    }
    memset(p, 0, sizeof(*p));
}

static char *join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (s) {
        memcpy(s, a, na);
        memcpy(s + na, b, nb + 1);
    }
    return s;
}

char *sf__aws_config_path(int which)
{
    const char *env = getenv(which ? "AWS_CONFIG_FILE" : "AWS_SHARED_CREDENTIALS_FILE");
    const char *home = getenv("HOME");
    int have_home = home && *home;
    if (env && *env) {
        /* "~/x" as the CLI expands it; "~user" is left alone. */
        if (have_home && env[0] == '~' && (env[1] == '/' || env[1] == '\0'))
            return join(home, env + 1);
        return strdup(env);
    }
    if (!have_home)
        return NULL;
    return join(home, which ? "/.aws/config" : "/.aws/credentials");
}
