/*
 * Listings and source expansion of the S3 client: object lists, bucket
 * and prefix listings, local directory walks, brace and prefix expansion
 * (sf_s3_list, sf_s3_expand, sf_s3_expand_stat). The rest of the client is
 * in s3/s3_client.c; s3/s3_client_impl.h is what they share.
 */
#include "s3/braces.h"
#include "s3/endpoint.h"
#include "s3/fetch.h"
#include "s3/s3_client_impl.h"
#include "common/strbuf.h"
#include "common/file.h"
#include "common/grow.h"
#include "common/text.h"
#include "s3/uri.h"
#include "s3/xml.h"
#include "shardfeed_s3.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_LIST_BODY       (16u << 20)
#define DEFAULT_MAX_OBJECTS ((size_t)10 * 1000 * 1000)

struct sf_object_list {
    struct sf_object_info *items;
    size_t n, cap;
};

/* ------------------------------------------------------------ object lists */

SF_API void sf_object_info_clear(struct sf_object_info *info)
{
    if (!info)
        return;
    free(info->url);
    free(info->key);
    memset(info, 0, sizeof(*info));
}

SF_API size_t sf_object_list_count(const struct sf_object_list *l)
{
    return l ? l->n : 0;
}

SF_API const struct sf_object_info *sf_object_list_get(const struct sf_object_list *l, size_t i)
{
    return l && i < l->n ? &l->items[i] : NULL;
}

SF_API void sf_object_list_destroy(struct sf_object_list *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        sf_object_info_clear(&l->items[i]);
    free(l->items);
    free(l);
}

static sf_status list_push(struct sf_object_list *l, size_t max, char *url, char *key,
                           uint64_t size, const char *etag, int64_t mtime, int is_prefix)
{
    if (!url || !key) {
        free(url);
        free(key);
        return SF_ERR_NO_MEMORY;
    }
    if (l->n >= max) {
        free(url);
        free(key);
        return SF_ERR_LIMIT;
    }
    struct sf_object_info *p = sf__grow(l->items, l->n, &l->cap, sizeof(*p), 64);
    if (!p) {
        free(url);
        free(key);
        return SF_ERR_NO_MEMORY;
    }
    l->items = p;
    struct sf_object_info *it = &l->items[l->n++];
    memset(it, 0, sizeof(*it));
    it->url = url;
    it->key = key;
    it->size = size;
    snprintf(it->etag, sizeof(it->etag), "%s", etag ? etag : "");
    it->last_modified = mtime;
    it->is_prefix = is_prefix;
    return SF_OK;
}

static char *s3_url(const char *bucket, const char *key)
{
    size_t n = strlen(bucket) + strlen(key) + 7;
    char *u = malloc(n);
    if (u)
        snprintf(u, n, "s3://%s/%s", bucket, key);
    return u;
}

/* ------------------------------------------------------------ listing */

static sf_status list_buckets(struct sf_s3 *s3, const struct sf__locator *loc, size_t max,
                              struct sf_object_list *l)
{
    struct sf__response r;
    sf_status st = sf__engine_call(s3->engine, "GET", loc, NULL, MAX_LIST_BODY, &r);
    if (st != SF_OK) {
        sf__s3_set_err(s3, st, "%s", r.errmsg);
        sf__response_free(&r);
        return st;
    }
    struct sf__list_page page;
    memset(&page, 0, sizeof(page));
    char err[256] = "";
    st = sf__xml_parse_list_buckets(r.body.data ? r.body.data : "", r.body.len, &page, err,
                                    sizeof(err));
    if (st != SF_OK)
        sf__s3_set_err(s3, st, "s3://: bad ListBuckets answer: %s", err);
    for (size_t i = 0; st == SF_OK && i < page.n_entries; i++) {
        const struct sf__list_entry *en = &page.entries[i];
        st = list_push(l, max, s3_url(en->key, ""), strdup(en->key), 0, "", en->last_modified, 1);
    }
    sf__list_page_free(&page);
    sf__response_free(&r);
    return st;
}

static sf_status append_query(struct sf__strbuf *q, const char *name, const char *value)
{
    if (q->len)
        sf__strbuf_putc(q, '&');
    sf__strbuf_puts(q, name);
    sf__strbuf_putc(q, '=');
    return sf__uri_encode(q, value, strlen(value), 0);
}

/* One ListObjectsV2 page: sends the query (freed here), parses the answer
 * into *page. On failure the client's message is set and *page is empty. */
static sf_status list_page(struct sf_s3 *s3, const struct sf__locator *bucket_loc,
                           struct sf__strbuf *q, const char *display, struct sf__list_page *page)
{
    memset(page, 0, sizeof(*page));
    struct sf__response r;
    sf_status st =
        sf__engine_call(s3->engine, "GET", bucket_loc, sf__strbuf_str(q), MAX_LIST_BODY, &r);
    sf__strbuf_free(q);
    if (st != SF_OK) {
        sf__s3_set_err(s3, st, "%s", r.errmsg);
        sf__response_free(&r);
        return st;
    }
    char err[256] = "";
    st = sf__xml_parse_list_v2(r.body.data ? r.body.data : "", r.body.len, 0, page, err,
                               sizeof(err));
    sf__response_free(&r);
    if (st != SF_OK) {
        sf__s3_set_err(s3, st, "%s: bad ListObjectsV2 answer: %s", display, err);
        sf__list_page_free(page);
        memset(page, 0, sizeof(*page));
    }
    return st;
}

static sf_status list_objects(struct sf_s3 *s3, const struct sf__locator *loc, int recursive,
                              int skip_dir_markers, size_t max, struct sf_object_list *l)
{
    char *token = NULL;
    sf_status st = SF_OK;
    struct sf__locator bucket_loc = *loc;
    bucket_loc.key = (char *)"";
    do {
        struct sf__strbuf q;
        sf__strbuf_init(&q, 8192);
        if (token)
            append_query(&q, "continuation-token", token);
        if (!recursive)
            append_query(&q, "delimiter", "/");
        append_query(&q, "encoding-type", "url");
        append_query(&q, "list-type", "2");
        if (*loc->key)
            append_query(&q, "prefix", loc->key);
        if (q.err) {
            st = sf__s3_set_err(s3, q.err, "%s: listing query too long", loc->display);
            sf__strbuf_free(&q);
            break;
        }
        struct sf__list_page page;
        st = list_page(s3, &bucket_loc, &q, loc->display, &page);
        if (st != SF_OK)
            break;
        for (size_t i = 0; st == SF_OK && i < page.n_prefixes; i++)
            st = list_push(l, max, s3_url(loc->bucket, page.prefixes[i]), strdup(page.prefixes[i]),
                           0, "", 0, 1);
        for (size_t i = 0; st == SF_OK && i < page.n_entries; i++) {
            const struct sf__list_entry *en = &page.entries[i];
            size_t kl = strlen(en->key);
            if (skip_dir_markers && kl > 0 && en->key[kl - 1] == '/' && en->size == 0)
                continue;
            st = list_push(l, max, s3_url(loc->bucket, en->key), strdup(en->key), en->size,
                           en->etag, en->last_modified, 0);
        }
        char *sent = token;
        token = NULL;
        if (st == SF_OK && page.is_truncated) {
            if (!page.next_token || !*page.next_token)
                st = sf__s3_set_err(s3, SF_ERR_PARSE,
                                    "%s: truncated listing without a continuation token",
                                    loc->display);
            else if (sent && !strcmp(sent, page.next_token))
                /* the same page again: asking for it would never end */
                st = sf__s3_set_err(s3, SF_ERR_PARSE,
                                    "%s: the listing repeats its continuation token", loc->display);
            else if (!(token = strdup(page.next_token)))
                st = SF_ERR_NO_MEMORY;
        }
        free(sent);
        sf__list_page_free(&page);
    } while (st == SF_OK && token);
    if (st == SF_ERR_LIMIT)
        sf__s3_set_err(s3, st, "%s: more than %zu objects", loc->display, max);
    free(token);
    return st;
}

static struct sf_object_list *list_new(void)
{
    return calloc(1, sizeof(struct sf_object_list));
}

SF_API sf_status sf_s3_list(struct sf_s3 *s3, const char *url, int flags, size_t max_objects,
                            struct sf_object_list **out)
{
    if (!s3 || !url || !out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!max_objects)
        max_objects = DEFAULT_MAX_OBJECTS;
    struct sf__locator loc;
    sf_status st = sf__s3_parse_url(s3, url, &loc);
    if (st != SF_OK)
        return st;
    struct sf_object_list *l = list_new();
    if (!l) {
        sf__locator_free(&loc);
        return SF_ERR_NO_MEMORY;
    }
    if (loc.kind != SF__LOC_S3)
        st = sf__s3_set_err(s3, SF_ERR_UNSUPPORTED, "%s: only s3:// URLs can be listed", url);
    else if ((st = sf__s3_ensure_creds(s3, loc.display)) == SF_OK) {
        if (!*loc.bucket)
            st = list_buckets(s3, &loc, max_objects, l);
        else
            st = list_objects(s3, &loc, flags & SF_LIST_RECURSIVE, 0, max_objects, l);
    }
    sf__locator_free(&loc);
    if (st != SF_OK) {
        sf_object_list_destroy(l);
        return st;
    }
    *out = l;
    return SF_OK;
}

/* ------------------------------------------------------------ expansion */

static int cmp_info(const void *a, const void *b)
{
    return strcmp(((const struct sf_object_info *)a)->key, ((const struct sf_object_info *)b)->key);
}

/* Regular files under dir, recursively; depth and count capped. */
static sf_status walk_dir(struct sf_s3 *s3, const char *dir, int depth, size_t max,
                          struct sf_object_list *l)
{
    if (depth > 64)
        return sf__s3_set_err(s3, SF_ERR_LIMIT, "%s: directories nested more than 64 deep", dir);
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return sf__s3_set_err(s3, sf__errno_status(e), "%s: %s", dir, strerror(e));
    }
    sf_status st = SF_OK;
    struct dirent *de;
    while (st == SF_OK && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        size_t n = strlen(dir) + strlen(de->d_name) + 2;
        char *path = malloc(n);
        if (!path) {
            st = SF_ERR_NO_MEMORY;
            break;
        }
        snprintf(path, n, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", de->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) {
            st = sf__s3_set_err(s3, SF_ERR_IO, "%s: %s", path, strerror(errno));
        } else if (S_ISDIR(sb.st_mode)) {
            st = walk_dir(s3, path, depth + 1, max, l);
        } else if (S_ISREG(sb.st_mode)) {
            st = list_push(l, max, strdup(path), strdup(path), (uint64_t)sb.st_size, "",
                           sb.st_mtim.tv_sec, 0);
            if (st == SF_ERR_LIMIT)
                sf__s3_set_err(s3, st, "%s: more than %zu files", dir, max);
        }
        free(path);
    }
    closedir(d);
    return st;
}

static sf_status expand_one(struct sf_s3 *s3, const char *source, size_t max,
                            struct sf_object_list *l)
{
    struct sf__locator loc;
    sf_status st = sf__s3_parse_url(s3, source, &loc);
    if (st != SF_OK)
        return st;
    if (loc.kind == SF__LOC_S3) {
        size_t kl = strlen(loc.key);
        if (!*loc.bucket)
            st = sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: name a bucket", source);
        else if (kl == 0 || loc.key[kl - 1] == '/') {
            size_t before = l->n;
            st = sf__s3_ensure_creds(s3, loc.display);
            if (st == SF_OK)
                st = list_objects(s3, &loc, 1, 1, max, l);
            if (st == SF_OK && l->n == before)
                st = sf__s3_set_err(s3, SF_ERR_NOT_FOUND, "%s: no objects under this prefix",
                                    source);
        } else
            st = list_push(l, max, strdup(source), strdup(loc.key), SF_SIZE_UNKNOWN, "", 0, 0);
    } else if (loc.kind == SF__LOC_HTTP) {
        st = list_push(l, max, strdup(source), strdup(loc.key), SF_SIZE_UNKNOWN, "", 0, 0);
    } else {
        struct stat sb;
        if (stat(loc.key, &sb) != 0) {
            int e = errno;
            st = sf__s3_set_err(s3, sf__errno_status(e), "%s: %s", source, strerror(e));
        } else if (S_ISDIR(sb.st_mode)) {
            size_t before = l->n;
            st = walk_dir(s3, loc.key, 0, max, l);
            if (st == SF_OK)
                qsort(l->items + before, l->n - before, sizeof(*l->items), cmp_info);
            if (st == SF_OK && l->n == before)
                st = sf__s3_set_err(s3, SF_ERR_NOT_FOUND, "%s: no files in this directory", source);
        } else {
            st = list_push(l, max, strdup(loc.key), strdup(loc.key), (uint64_t)sb.st_size, "",
                           sb.st_mtim.tv_sec, 0);
        }
    }
    if (st == SF_ERR_LIMIT)
        sf__s3_set_err(s3, st, "%s: more than %zu objects", source, max);
    sf__locator_free(&loc);
    return st;
}

/* What sf_s3_expand and sf_s3_expand_stat share: the arguments, the
 * default cap and the list, which fill appends to; *out only on success. */
typedef sf_status (*expand_fn)(struct sf_s3 *s3, const char *source, size_t max,
                               struct sf_object_list *l);

static sf_status expand_into_list(struct sf_s3 *s3, const char *source, size_t max_objects,
                                  struct sf_object_list **out, expand_fn fill)
{
    if (!s3 || !source || !out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    struct sf_object_list *l = list_new();
    if (!l)
        return SF_ERR_NO_MEMORY;
    sf_status st = fill(s3, source, max_objects ? max_objects : DEFAULT_MAX_OBJECTS, l);
    if (st != SF_OK) {
        sf_object_list_destroy(l);
        return st;
    }
    *out = l;
    return SF_OK;
}

static sf_status expand(struct sf_s3 *s3, const char *source, size_t max_objects,
                        struct sf_object_list *l)
{
    sf_status st = SF_OK;
    if (sf__has_braces(source)) {
        char **v = NULL;
        size_t n = 0;
        char err[512] = "";
        st = sf__brace_expand(source, max_objects, &v, &n, err, sizeof(err));
        if (st != SF_OK)
            sf__s3_set_err(s3, st, "%s: %s", source, err);
        for (size_t i = 0; st == SF_OK && i < n; i++) {
            struct sf__locator loc;
            st = sf__s3_parse_url(s3, v[i], &loc);
            if (st != SF_OK)
                break;
            size_t kl = strlen(loc.key);
            if (loc.kind == SF__LOC_S3 && (kl == 0 || loc.key[kl - 1] == '/'))
                st = expand_one(s3, v[i], max_objects, l);
            else
                st = list_push(l, max_objects, strdup(v[i]), strdup(loc.key), SF_SIZE_UNKNOWN, "",
                               0, 0);
            sf__locator_free(&loc);
            if (st == SF_ERR_LIMIT)
                sf__s3_set_err(s3, st, "%s: more than %zu objects", source, max_objects);
        }
        sf__strv_free(v, n);
    } else {
        st = expand_one(s3, source, max_objects, l);
    }
    return st;
}

SF_API int sf_s3_is_pattern(const char *url)
{
    return sf__has_braces(url);
}

SF_API sf_status sf_s3_expand(struct sf_s3 *s3, const char *source, size_t max_objects,
                              struct sf_object_list **out)
{
    return expand_into_list(s3, source, max_objects, out, expand);
}

/* ------------------------------------------------------------ checked expansion */

/* One object a source names, waiting to be checked. */
struct pending {
    size_t slot; /* index of its entry in the result list */
    enum sf__loc_kind kind;
    char *bucket;    /* s3: owned; NULL otherwise */
    const char *key; /* the entry's key (owned by the list, which outlives this) */
    int found;
};

struct pending_set {
    struct pending *v;
    size_t n, cap;
};

static void pending_free(struct pending_set *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        free(ps->v[i].bucket);
    free(ps->v);
}

/* Appends the object named by url (parsed as loc) to l, size unknown, and
 * remembers to check it. */
static sf_status pending_add(struct pending_set *ps, struct sf_object_list *l, size_t max,
                             const char *url, const struct sf__locator *loc)
{
    struct pending *v = sf__grow(ps->v, ps->n, &ps->cap, sizeof(*v), 64);
    if (!v)
        return SF_ERR_NO_MEMORY;
    ps->v = v;
    char *bucket = NULL;
    if (loc->kind == SF__LOC_S3 && !(bucket = strdup(loc->bucket)))
        return SF_ERR_NO_MEMORY;
    sf_status st = list_push(l, max, strdup(url), strdup(loc->key), SF_SIZE_UNKNOWN, "", 0, 0);
    if (st != SF_OK) {
        free(bucket);
        return st;
    }
    struct pending *p = &ps->v[ps->n++];
    p->slot = l->n - 1;
    p->kind = loc->kind;
    p->bucket = bucket;
    p->key = l->items[p->slot].key;
    p->found = 0;
    return SF_OK;
}

/* Length of s without its last UTF-8 character: the longest proper prefix
 * that ends on a character boundary, so it sorts just before s. */
static size_t cut_last_char(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    n--;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--;
    return n;
}

static int cmp_pending_s3(const void *a, const void *b)
{
    const struct pending *x = *(const struct pending *const *)a;
    const struct pending *y = *(const struct pending *const *)b;
    int c = strcmp(x->bucket, y->bucket);
    return c ? c : strcmp(x->key, y->key);
}

/* Checks w[0..m) (one bucket, sorted by key, m > 0) with ListObjectsV2,
 * relying on S3 listing keys in ascending UTF-8 byte order (strcmp order).
 * Keys a page proves absent stay found = 0. */
static sf_status list_range(struct sf_s3 *s3, const char *bucket, struct pending **w, size_t m,
                            struct sf_object_list *l)
{
    const char *lo = w[0]->key, *hi = w[m - 1]->key;
    size_t plen = 0;
    while (lo[plen] && lo[plen] == hi[plen])
        plen++;
    /* a prefix that ends inside a multi-byte character is not valid UTF-8 */
    while (plen > 0 && ((unsigned char)lo[plen] & 0xC0) == 0x80)
        plen--;
    char *prefix = strndup(lo, plen);
    char *display = prefix ? s3_url(bucket, prefix) : NULL;
    if (!prefix || !display) {
        free(prefix);
        return SF_ERR_NO_MEMORY;
    }
    struct sf__locator bucket_loc = {
        .kind = SF__LOC_S3, .bucket = (char *)bucket, .key = (char *)"", .display = display};
    char *after = NULL; /* the last key listed so far */
    /* The token of a truncated page without keys: S3 may end a page early,
     * even before any key (while it scans past deleted objects), and
     * start-after has no key to move to, so the next page is asked with the
     * token. NULL once a page had keys. */
    char *token = NULL;
    sf_status st = SF_OK;
    size_t p = 0;
    while (st == SF_OK && p < m) {
        /* skip ahead: start just before the next key not yet seen, unless the
         * last page already went further */
        char *start = strndup(w[p]->key, cut_last_char(w[p]->key, strlen(w[p]->key)));
        if (!start) {
            st = SF_ERR_NO_MEMORY;
            break;
        }
        const char *sa = after && strcmp(after, start) > 0 ? after : start;
        struct sf__strbuf q;
        sf__strbuf_init(&q, 8192);
        if (token)
            append_query(&q, "continuation-token", token);
        append_query(&q, "encoding-type", "url");
        append_query(&q, "list-type", "2");
        if (*prefix)
            append_query(&q, "prefix", prefix);
        if (*sa && !token)
            append_query(&q, "start-after", sa);
        free(start);
        if (q.err) {
            st = sf__s3_set_err(s3, q.err, "%s: listing query too long", display);
            sf__strbuf_free(&q);
            break;
        }
        struct sf__list_page page;
        st = list_page(s3, &bucket_loc, &q, display, &page);
        if (st != SF_OK)
            break;
        for (size_t i = 0; i < page.n_entries && p < m; i++) {
            const struct sf__list_entry *en = &page.entries[i];
            while (p < m && strcmp(w[p]->key, en->key) < 0)
                p++; /* listed past it: absent */
            for (; p < m && !strcmp(w[p]->key, en->key); p++) {
                struct sf_object_info *it = &l->items[w[p]->slot];
                it->size = en->size;
                snprintf(it->etag, sizeof(it->etag), "%s", en->etag);
                it->last_modified = en->last_modified;
                w[p]->found = 1;
            }
        }
        if (p < m && page.is_truncated) {
            const char *last = page.n_entries ? page.entries[page.n_entries - 1].key : NULL;
            char *sent = token;
            token = NULL;
            if (!last && (!page.next_token || !*page.next_token)) {
                st = sf__s3_set_err(s3, SF_ERR_PARSE,
                                    "%s: truncated listing without keys or a continuation token",
                                    display);
            } else if (!last && sent && !strcmp(sent, page.next_token)) {
                /* the same empty page again: asking for it would never end */
                st = sf__s3_set_err(s3, SF_ERR_PARSE,
                                    "%s: the listing repeats its continuation token", display);
            } else if (!last) {
                if (!(token = strdup(page.next_token)))
                    st = SF_ERR_NO_MEMORY;
            } else if (after && strcmp(last, after) <= 0) {
                /* the page did not move past the last one: the same request
                 * would come back for ever */
                st = sf__s3_set_err(s3, SF_ERR_PARSE,
                                    "%s: the listing does not advance past '%s'", display, after);
            } else {
                free(after);
                if (!(after = strdup(page.entries[page.n_entries - 1].key)))
                    st = SF_ERR_NO_MEMORY;
            }
            free(sent);
        } else {
            p = m; /* the listing ended: the keys left do not exist */
        }
        sf__list_page_free(&page);
    }
    free(token);
    free(after);
    free(display);
    free(prefix);
    return st;
}

/* Fills and checks every pending entry; absent ones keep found = 0. */
static sf_status check_pending(struct sf_s3 *s3, struct pending_set *ps, struct sf_object_list *l)
{
    sf_status st = SF_OK;
    size_t n_s3 = 0;
    for (size_t i = 0; st == SF_OK && i < ps->n; i++) {
        struct pending *p = &ps->v[i];
        struct sf_object_info *it = &l->items[p->slot];
        if (p->kind == SF__LOC_S3) {
            n_s3++;
        } else if (p->kind == SF__LOC_FILE) {
            struct sf_object_info tmp;
            memset(&tmp, 0, sizeof(tmp));
            st = sf__s3_stat_local(s3, it->key, it->url, &tmp);
            if (st == SF_OK) {
                it->size = tmp.size;
                it->last_modified = tmp.last_modified;
                p->found = 1;
            }
            sf_object_info_clear(&tmp);
            if (st == SF_ERR_NOT_FOUND)
                st = SF_OK;
        } else {
            struct sf__locator loc;
            st = sf__s3_parse_url(s3, it->url, &loc);
            if (st != SF_OK)
                break;
            st = sf__s3_head_object(s3, &loc, it);
            sf__locator_free(&loc);
            p->found = st == SF_OK;
            if (st == SF_ERR_NOT_FOUND)
                st = SF_OK;
        }
    }
    if (st != SF_OK || n_s3 == 0)
        return st;
    struct pending **w = malloc(n_s3 * sizeof(*w));
    if (!w)
        return SF_ERR_NO_MEMORY;
    size_t k = 0;
    for (size_t i = 0; i < ps->n; i++)
        if (ps->v[i].kind == SF__LOC_S3)
            w[k++] = &ps->v[i];
    qsort(w, n_s3, sizeof(*w), cmp_pending_s3);
    for (size_t a = 0; st == SF_OK && a < n_s3;) {
        size_t b = a + 1;
        while (b < n_s3 && !strcmp(w[b]->bucket, w[a]->bucket))
            b++;
        st = sf__s3_ensure_creds(s3, l->items[w[a]->slot].url);
        if (st == SF_OK && b - a > SF_EXPAND_HEAD_MAX) {
            st = list_range(s3, w[a]->bucket, w + a, b - a, l);
        } else {
            for (size_t i = a; st == SF_OK && i < b; i++) {
                struct sf_object_info *it = &l->items[w[i]->slot];
                struct sf__locator loc = {.kind = SF__LOC_S3,
                                          .bucket = w[i]->bucket,
                                          .key = (char *)w[i]->key,
                                          .display = it->url};
                st = sf__s3_head_object(s3, &loc, it);
                w[i]->found = st == SF_OK;
                if (st == SF_ERR_NOT_FOUND)
                    st = SF_OK;
            }
        }
        a = b;
    }
    free(w);
    return st;
}

static sf_status expand_stat(struct sf_s3 *s3, const char *source, size_t max_objects,
                             struct sf_object_list *l)
{
    int braces = sf__has_braces(source);
    char **v = NULL;
    size_t n = 0;
    char err[512] = "";
    sf_status st = SF_OK;
    if (braces) {
        st = sf__brace_expand(source, max_objects, &v, &n, err, sizeof(err));
        if (st != SF_OK)
            sf__s3_set_err(s3, st, "%s: %s", source, err);
    }
    struct pending_set ps;
    memset(&ps, 0, sizeof(ps));
    for (size_t i = 0; st == SF_OK && i < (braces ? n : 1); i++) {
        const char *item = braces ? v[i] : source;
        struct sf__locator loc;
        st = sf__s3_parse_url(s3, item, &loc);
        if (st != SF_OK)
            break;
        size_t kl = strlen(loc.key);
        struct stat sb;
        if (loc.kind == SF__LOC_S3 && !*loc.bucket)
            st = sf__s3_set_err(s3, SF_ERR_INVALID_ARGUMENT, "%s: name a bucket", item);
        else if ((loc.kind == SF__LOC_S3 && (kl == 0 || loc.key[kl - 1] == '/')) ||
                 (!braces && loc.kind == SF__LOC_FILE && stat(loc.key, &sb) == 0 &&
                  S_ISDIR(sb.st_mode)))
            st = expand_one(s3, item, max_objects, l); /* listings come with sizes */
        else
            st = pending_add(&ps, l, max_objects, item, &loc);
        sf__locator_free(&loc);
        if (st == SF_ERR_LIMIT)
            sf__s3_set_err(s3, st, "%s: more than %zu objects", source, max_objects);
    }
    if (st == SF_OK)
        st = check_pending(s3, &ps, l);
    size_t missing = 0, first = 0;
    for (size_t i = 0; st == SF_OK && i < ps.n; i++)
        if (!ps.v[i].found && missing++ == 0)
            first = i;
    char name[SF__MSG_NAME_BYTES], of[SF__MSG_NAME_BYTES];
    if (missing && (braces || ps.n > 1))
        st = sf__s3_set_err(s3, SF_ERR_NOT_FOUND,
                            "%s: no such object (%zu of the %zu objects of %s %s)",
                            sf__msg_name(l->items[ps.v[first].slot].url, name), missing, ps.n,
                            sf__msg_name(source, of), missing == 1 ? "is missing" : "are missing");
    else if (missing)
        st = SF_ERR_NOT_FOUND; /* the HEAD or stat() already said why */
    pending_free(&ps);
    sf__strv_free(v, n);
    return st;
}

SF_API sf_status sf_s3_expand_stat(struct sf_s3 *s3, const char *source, size_t max_objects,
                                   struct sf_object_list **out)
{
    return expand_into_list(s3, source, max_objects, out, expand_stat);
}
