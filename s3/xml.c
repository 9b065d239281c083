/*
 * S3 XML bodies with expat. The parser keeps a stack of element tags (local
 * names: S3 puts its namespace in the default xmlns, other servers leave it
 * out or use a prefix) and collects character data only for the leaf
 * elements it needs, each capped. Any DTD is refused outright, so entity
 * expansion attacks never start; expat decodes the predefined entities,
 * character references and CDATA.
 */
#include "s3/xml.h"

#include "common/calendar.h"
#include "common/strbuf.h"
#include "common/strv.h"
#include "s3/etag.h"
#include "s3/uri.h"

#include <expat.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bodies are already in memory; the cap bounds parse time and what the
 * parsed page may hold (at most a few times the body). A 100000-entry page
 * with long keys stays well under it. */
#define XML_MAX_BODY_BYTES ((size_t)256 << 20)
/* One element's text: S3 keys are at most 1024 bytes, three times that
 * when URL-encoded; tokens are a few hundred bytes. */
#define XML_MAX_TEXT_BYTES      ((size_t)64 << 10)
#define XML_MAX_DEPTH           64
#define XML_DEFAULT_MAX_ENTRIES ((size_t)100000)
/* XML_Parse takes an int length. */
#define XML_CHUNK_BYTES ((size_t)1 << 20)

enum tag {
    T_OTHER,
    T_LIST_BUCKET_RESULT,
    T_CONTENTS,
    T_KEY,
    T_SIZE,
    T_ETAG,
    T_LAST_MODIFIED,
    T_COMMON_PREFIXES,
    T_PREFIX,
    T_IS_TRUNCATED,
    T_NEXT_CONTINUATION_TOKEN,
    T_ENCODING_TYPE,
    T_LIST_ALL_MY_BUCKETS_RESULT,
    T_BUCKETS,
    T_BUCKET,
    T_NAME,
    T_CREATION_DATE,
    T_CONTINUATION_TOKEN,
    T_ERROR,
    T_CODE,
    T_MESSAGE,
    T_REQUEST_ID,
    T_HOST_ID,
    T_BUCKET_NAME,
    T_INITIATE_RESULT,
    T_UPLOAD_ID,
    T_COMPLETE_UPLOAD,
    T_PART,
    T_PART_NUMBER,
    T_REGION,
    T_ENDPOINT,
    T_COUNT_
};

static const char *const tag_names[T_COUNT_] = {
    [T_OTHER] = "",
    [T_LIST_BUCKET_RESULT] = "ListBucketResult",
    [T_CONTENTS] = "Contents",
    [T_KEY] = "Key",
    [T_SIZE] = "Size",
    [T_ETAG] = "ETag",
    [T_LAST_MODIFIED] = "LastModified",
    [T_COMMON_PREFIXES] = "CommonPrefixes",
    [T_PREFIX] = "Prefix",
    [T_IS_TRUNCATED] = "IsTruncated",
    [T_NEXT_CONTINUATION_TOKEN] = "NextContinuationToken",
    [T_ENCODING_TYPE] = "EncodingType",
    [T_LIST_ALL_MY_BUCKETS_RESULT] = "ListAllMyBucketsResult",
    [T_BUCKETS] = "Buckets",
    [T_BUCKET] = "Bucket",
    [T_NAME] = "Name",
    [T_CREATION_DATE] = "CreationDate",
    [T_CONTINUATION_TOKEN] = "ContinuationToken",
    [T_ERROR] = "Error",
    [T_CODE] = "Code",
    [T_MESSAGE] = "Message",
    [T_REQUEST_ID] = "RequestId",
    [T_HOST_ID] = "HostId",
    [T_BUCKET_NAME] = "BucketName",
    [T_INITIATE_RESULT] = "InitiateMultipartUploadResult",
    [T_UPLOAD_ID] = "UploadId",
    [T_COMPLETE_UPLOAD] = "CompleteMultipartUpload",
    [T_PART] = "Part",
    [T_PART_NUMBER] = "PartNumber",
    [T_REGION] = "Region",
    [T_ENDPOINT] = "Endpoint",
};

enum doc_kind { DOC_LIST_V2, DOC_BUCKETS, DOC_ERROR, DOC_INITIATE, DOC_COMPLETE };

struct xml_ctx {
    XML_Parser parser;
    enum doc_kind kind;
    enum tag stack[XML_MAX_DEPTH];
    size_t depth;    /* elements open */
    size_t collect;  /* depth of the leaf whose text is collected, 0 = none */
    int truncate_ok; /* over-long text is cut (error bodies) instead of failing */
    struct sf__strbuf text;
    sf_status status; /* first failure, sticky */
    char *err;
    size_t err_len;
    char root[64]; /* local name of the root element, for messages */

    /* DOC_LIST_V2, DOC_BUCKETS */
    struct sf__list_page *page;
    size_t max_entries;
    size_t cap_entries, cap_prefixes;
    struct sf__list_entry cur; /* the <Contents> or <Bucket> being read */
    char *cur_prefix;          /* the <CommonPrefixes> being read */
    int url_encoded;

    /* DOC_ERROR */
    struct sf__s3_error *error;
    int have_code;

    /* DOC_INITIATE */
    char *upload_id;
    size_t upload_id_len;
    int have_upload_id;

    /* DOC_COMPLETE */
    struct sf__xml_part *parts;
    size_t n_parts, cap_parts, max_parts;
    struct sf__xml_part cur_part;
    int cur_has_number, cur_has_etag;
};

/* Records the first failure and stops expat; later calls keep the first. */
__attribute__((format(printf, 3, 4))) static void fail(struct xml_ctx *c, sf_status st,
                                                       const char *fmt, ...)
{
    if (c->status != SF_OK)
        return;
    c->status = st;
    if (c->err && c->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
    }
    XML_StopParser(c->parser, XML_FALSE);
}

static const char *local_name(const char *name)
{
    const char *colon = strrchr(name, ':');
    return colon ? colon + 1 : name;
}

static enum tag lookup_tag(const char *local)
{
    for (int t = 1; t < T_COUNT_; t++)
        if (strcmp(tag_names[t], local) == 0)
            return (enum tag)t;
    return T_OTHER;
}

/* Is the element just pushed (at c->depth) a leaf whose text we need? */
static int wanted_leaf(const struct xml_ctx *c)
{
    const enum tag *s = c->stack;
    enum tag t = s[c->depth - 1];
    switch (c->kind) {
    case DOC_LIST_V2:
        if (c->depth == 2)
            return t == T_IS_TRUNCATED || t == T_NEXT_CONTINUATION_TOKEN || t == T_ENCODING_TYPE;
        if (c->depth == 3 && s[1] == T_CONTENTS)
            return t == T_KEY || t == T_SIZE || t == T_ETAG || t == T_LAST_MODIFIED;
        if (c->depth == 3 && s[1] == T_COMMON_PREFIXES)
            return t == T_PREFIX;
        return 0;
    case DOC_BUCKETS:
        if (c->depth == 2)
            return t == T_CONTINUATION_TOKEN;
        if (c->depth == 4 && s[1] == T_BUCKETS && s[2] == T_BUCKET)
            return t == T_NAME || t == T_CREATION_DATE;
        return 0;
    case DOC_ERROR:
        return c->depth == 2 &&
               (t == T_CODE || t == T_MESSAGE || t == T_REQUEST_ID || t == T_HOST_ID ||
                t == T_KEY || t == T_BUCKET_NAME || t == T_REGION || t == T_ENDPOINT);
    case DOC_INITIATE: return c->depth == 2 && t == T_UPLOAD_ID;
    case DOC_COMPLETE:
        return c->depth == 3 && s[1] == T_PART && (t == T_PART_NUMBER || t == T_ETAG);
    }
    return 0;
}

static enum tag expected_root(enum doc_kind kind)
{
    switch (kind) {
    case DOC_LIST_V2: return T_LIST_BUCKET_RESULT;
    case DOC_BUCKETS: return T_LIST_ALL_MY_BUCKETS_RESULT;
    case DOC_ERROR: return T_ERROR;
    case DOC_INITIATE: return T_INITIATE_RESULT;
    case DOC_COMPLETE: return T_COMPLETE_UPLOAD;
    }
    return T_OTHER;
}

static void XMLCALL on_start(void *ud, const XML_Char *name, const XML_Char **atts)
{
    struct xml_ctx *c = ud;
    (void)atts;
    if (c->status != SF_OK)
        return;
    const char *local = local_name(name);
    if (c->collect) {
        fail(c, SF_ERR_PARSE, "unexpected element <%.64s> inside <%s>", local,
             tag_names[c->stack[c->collect - 1]]);
        return;
    }
    if (c->depth == XML_MAX_DEPTH) {
        fail(c, SF_ERR_LIMIT, "elements nested deeper than %d", XML_MAX_DEPTH);
        return;
    }
    enum tag t = lookup_tag(local);
    c->stack[c->depth++] = t;
    if (c->depth == 1) {
        snprintf(c->root, sizeof c->root, "%s", local);
        if (t != expected_root(c->kind)) {
            fail(c, SF_ERR_PARSE, "expected <%s>, found <%.64s>", tag_names[expected_root(c->kind)],
                 local);
            return;
        }
    }
    if (c->kind == DOC_LIST_V2 && c->depth == 2 && t == T_CONTENTS) {
        free(c->cur.key);
        memset(&c->cur, 0, sizeof c->cur);
    } else if (c->kind == DOC_LIST_V2 && c->depth == 2 && t == T_COMMON_PREFIXES) {
        free(c->cur_prefix);
        c->cur_prefix = NULL;
    } else if (c->kind == DOC_BUCKETS && c->depth == 3 && t == T_BUCKET) {
        free(c->cur.key);
        memset(&c->cur, 0, sizeof c->cur);
    } else if (c->kind == DOC_COMPLETE && c->depth == 2 && t == T_PART) {
        memset(&c->cur_part, 0, sizeof c->cur_part);
        c->cur_has_number = c->cur_has_etag = 0;
    }
    if (wanted_leaf(c)) {
        sf__strbuf_reset(&c->text);
        c->collect = c->depth;
    }
}

static void XMLCALL on_text(void *ud, const XML_Char *s, int len)
{
    struct xml_ctx *c = ud;
    if (c->status != SF_OK || !c->collect || len <= 0)
        return;
    size_t n = (size_t)len;
    size_t room = c->text.max_bytes - c->text.len;
    if (n > room) {
        if (!c->truncate_ok) {
            fail(c, SF_ERR_LIMIT, "<%s> text longer than %zu bytes",
                 tag_names[c->stack[c->collect - 1]], c->text.max_bytes);
            return;
        }
        n = room;
    }
    if (sf__strbuf_append(&c->text, s, n) != SF_OK)
        fail(c, c->text.err, "out of memory reading <%s>", tag_names[c->stack[c->collect - 1]]);
}

/* The collected text with leading and trailing XML whitespace removed, for
 * numbers, booleans and dates (never for keys, which may hold spaces). */
static const char *trimmed(struct sf__strbuf *b, size_t *len)
{
    const char *s = sf__strbuf_str(b);
    size_t n = b->len;
    while (n && strchr(" \t\r\n", s[0])) {
        s++;
        n--;
    }
    while (n && strchr(" \t\r\n", s[n - 1]))
        n--;
    *len = n;
    return s;
}

static int parse_u64(const char *s, size_t n, uint64_t *out)
{
    if (n == 0)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Copies at most cap-1 bytes and a NUL, never cutting a UTF-8 sequence. */
static void copy_field(char *dst, size_t cap, const char *src, size_t len)
{
    if (len >= cap) {
        len = cap - 1;
        while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80)
            len--;
    }
    memcpy(dst, src, len);
    dst[len] = '\0';
}

static char *take_text(struct xml_ctx *c)
{
    char *s = sf__strbuf_take(&c->text);
    if (!s)
        fail(c, SF_ERR_NO_MEMORY, "out of memory");
    return s;
}

static int64_t parse_date_or_zero(struct sf__strbuf *b)
{
    size_t n;
    const char *s = trimmed(b, &n);
    char tmp[64];
    if (n >= sizeof tmp)
        return 0;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    int64_t t = 0;
    return sf__parse_iso8601(tmp, &t) == SF_OK ? t : 0;
}

static void list_leaf(struct xml_ctx *c, enum tag t)
{
    size_t n;
    const char *s;
    switch (t) {
    case T_KEY:
    case T_NAME:
        free(c->cur.key);
        c->cur.key = take_text(c);
        break;
    case T_SIZE:
        s = trimmed(&c->text, &n);
        if (parse_u64(s, n, &c->cur.size) != 0)
            fail(c, SF_ERR_PARSE, "bad <Size> \"%.*s\" in entry %zu", (int)(n > 32 ? 32 : n), s,
                 c->page->n_entries + 1);
        break;
    case T_ETAG: {
        /* one room more than the field: a bare tag that only fits once its
         * quotes are added is refused, not cut */
        char canon[sizeof c->cur.etag + 1];
        if (c->text.len < sizeof c->cur.etag)
            sf__etag_canon(canon, sizeof canon, sf__strbuf_str(&c->text), c->text.len);
        if (c->text.len >= sizeof c->cur.etag || strlen(canon) >= sizeof c->cur.etag)
            fail(c, SF_ERR_LIMIT, "<ETag> longer than %zu bytes", sizeof c->cur.etag - 1);
        else
            memcpy(c->cur.etag, canon, strlen(canon) + 1);
        break;
    }
    case T_LAST_MODIFIED:
    case T_CREATION_DATE: c->cur.last_modified = parse_date_or_zero(&c->text); break;
    case T_PREFIX:
        free(c->cur_prefix);
        c->cur_prefix = take_text(c);
        break;
    case T_IS_TRUNCATED:
        s = trimmed(&c->text, &n);
        if (n == 4 && memcmp(s, "true", 4) == 0)
            c->page->is_truncated = 1;
        else if (n == 5 && memcmp(s, "false", 5) == 0)
            c->page->is_truncated = 0;
        else
            fail(c, SF_ERR_PARSE, "bad <IsTruncated> \"%.*s\"", (int)(n > 32 ? 32 : n), s);
        break;
    case T_NEXT_CONTINUATION_TOKEN:
    case T_CONTINUATION_TOKEN:
        free(c->page->next_token);
        c->page->next_token = NULL;
        if (c->text.len)
            c->page->next_token = take_text(c);
        /* ListBuckets pages only when it sends a token. */
        if (t == T_CONTINUATION_TOKEN)
            c->page->is_truncated = c->page->next_token != NULL;
        break;
    case T_ENCODING_TYPE:
        s = trimmed(&c->text, &n);
        if (n == 3 && memcmp(s, "url", 3) == 0)
            c->url_encoded = 1;
        else if (n != 0)
            fail(c, SF_ERR_PARSE, "unsupported <EncodingType> \"%.*s\"", (int)(n > 32 ? 32 : n), s);
        break;
    default: break;
    }
}

static void error_leaf(struct xml_ctx *c, enum tag t)
{
    struct sf__s3_error *e = c->error;
    size_t n;
    const char *s = trimmed(&c->text, &n);
    switch (t) {
    case T_CODE:
        copy_field(e->code, sizeof e->code, s, n);
        c->have_code = n > 0;
        break;
    case T_MESSAGE: copy_field(e->message, sizeof e->message, s, n); break;
    case T_REQUEST_ID: copy_field(e->request_id, sizeof e->request_id, s, n); break;
    case T_HOST_ID: copy_field(e->host_id, sizeof e->host_id, s, n); break;
    case T_KEY: /* keys may start or end with spaces: kept as sent */
        copy_field(e->key, sizeof e->key, sf__strbuf_str(&c->text), c->text.len);
        break;
    case T_BUCKET_NAME: copy_field(e->bucket, sizeof e->bucket, s, n); break;
    case T_REGION: copy_field(e->region, sizeof e->region, s, n); break;
    case T_ENDPOINT: copy_field(e->endpoint, sizeof e->endpoint, s, n); break;
    default: break;
    }
}

/* Room for one more item in *arr (used of them, *cap allocated, elem bytes
 * each), at most max: else the parse fails, "more than max what". 0 when
 * there is room. */
static int make_room(struct xml_ctx *c, void **arr, size_t *cap, size_t used, size_t max,
                     size_t elem, const char *what)
{
    if (used == max) {
        fail(c, SF_ERR_LIMIT, "more than %zu %s", max, what);
        return -1;
    }
    if (used < *cap)
        return 0;
    size_t new_cap = *cap ? *cap * 2 : 16;
    if (new_cap > max)
        new_cap = max;
    void *p = new_cap > SIZE_MAX / elem ? NULL : realloc(*arr, new_cap * elem);
    if (!p) {
        fail(c, SF_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    *arr = p;
    *cap = new_cap;
    return 0;
}

static void multipart_leaf(struct xml_ctx *c, enum tag t)
{
    size_t n;
    const char *s = trimmed(&c->text, &n);
    if (c->kind == DOC_INITIATE) {
        if (n == 0 || n >= c->upload_id_len) {
            fail(c, n ? SF_ERR_LIMIT : SF_ERR_PARSE, "<UploadId> is %s", n ? "too long" : "empty");
            return;
        }
        memcpy(c->upload_id, s, n);
        c->upload_id[n] = '\0';
        c->have_upload_id = 1;
        return;
    }
    if (t == T_PART_NUMBER) {
        uint64_t v;
        if (parse_u64(s, n, &v) != 0 || v > UINT32_MAX) {
            fail(c, SF_ERR_PARSE, "part %zu: <PartNumber> \"%.*s\" is not a number", c->n_parts + 1,
                 (int)(n > 32 ? 32 : n), s);
            return;
        }
        c->cur_part.number = (unsigned)v;
        c->cur_has_number = 1;
    } else if (t == T_ETAG) {
        copy_field(c->cur_part.etag, sizeof c->cur_part.etag, s, n);
        c->cur_has_etag = 1;
    }
}

static void push_part(struct xml_ctx *c)
{
    if (!c->cur_has_number || !c->cur_has_etag) {
        fail(c, SF_ERR_PARSE, "<Part> %zu has no <%s>", c->n_parts + 1,
             c->cur_has_number ? "ETag" : "PartNumber");
        return;
    }
    if (make_room(c, (void **)&c->parts, &c->cap_parts, c->n_parts, c->max_parts, sizeof *c->parts,
                  "parts") != 0)
        return;
    c->parts[c->n_parts++] = c->cur_part;
}

static void push_entry(struct xml_ctx *c, const char *what)
{
    struct sf__list_page *p = c->page;
    if (!c->cur.key) {
        fail(c, SF_ERR_PARSE, "<%s> %zu has no <%s>", what, p->n_entries + 1,
             c->kind == DOC_BUCKETS ? "Name" : "Key");
        return;
    }
    if (make_room(c, (void **)&p->entries, &c->cap_entries, p->n_entries, c->max_entries,
                  sizeof *p->entries, "entries in one page") != 0)
        return;
    p->entries[p->n_entries++] = c->cur;
    memset(&c->cur, 0, sizeof c->cur);
}

static void push_prefix(struct xml_ctx *c)
{
    struct sf__list_page *p = c->page;
    if (!c->cur_prefix)
        return; /* <CommonPrefixes/> without a <Prefix>: nothing to list */
    if (make_room(c, (void **)&p->prefixes, &c->cap_prefixes, p->n_prefixes, c->max_entries,
                  sizeof *p->prefixes, "common prefixes in one page") != 0)
        return;
    p->prefixes[p->n_prefixes++] = c->cur_prefix;
    c->cur_prefix = NULL;
}

static void XMLCALL on_end(void *ud, const XML_Char *name)
{
    struct xml_ctx *c = ud;
    (void)name;
    if (c->status != SF_OK || c->depth == 0)
        return;
    enum tag t = c->stack[c->depth - 1];
    if (c->collect == c->depth) {
        c->collect = 0;
        if (c->kind == DOC_ERROR)
            error_leaf(c, t);
        else if (c->kind == DOC_INITIATE || c->kind == DOC_COMPLETE)
            multipart_leaf(c, t);
        else
            list_leaf(c, t);
    } else if (c->kind == DOC_LIST_V2 && c->depth == 2 && t == T_CONTENTS) {
        push_entry(c, "Contents");
    } else if (c->kind == DOC_LIST_V2 && c->depth == 2 && t == T_COMMON_PREFIXES) {
        push_prefix(c);
    } else if (c->kind == DOC_BUCKETS && c->depth == 3 && t == T_BUCKET) {
        push_entry(c, "Bucket");
    } else if (c->kind == DOC_COMPLETE && c->depth == 2 && t == T_PART) {
        push_part(c);
    }
    c->depth--;
}

/* Any DTD is refused: S3 never sends one, and entity declarations are the
 * way into billion-laughs and external-entity attacks. */
static void XMLCALL on_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                               const XML_Char *pubid, int has_internal_subset)
{
    (void)name;
    (void)sysid;
    (void)pubid;
    (void)has_internal_subset;
    fail(ud, SF_ERR_PARSE, "DOCTYPE declarations are not allowed");
}

static void XMLCALL on_entity_decl(void *ud, const XML_Char *name, int is_param,
                                   const XML_Char *value, int value_len, const XML_Char *base,
                                   const XML_Char *sysid, const XML_Char *pubid,
                                   const XML_Char *notation)
{
    (void)name;
    (void)is_param;
    (void)value;
    (void)value_len;
    (void)base;
    (void)sysid;
    (void)pubid;
    (void)notation;
    fail(ud, SF_ERR_PARSE, "entity declarations are not allowed");
}

/* Runs expat over body with c's handlers; returns c->status or SF_ERR_PARSE
 * for malformed XML. */
static sf_status run_parser(struct xml_ctx *c, const char *body, size_t n)
{
    if (!body && n) {
        sf__fail(c->err, c->err_len, SF_OK, "NULL body");
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (n > XML_MAX_BODY_BYTES) {
        sf__fail(c->err, c->err_len, SF_OK, "XML body of %zu bytes is over the %zu-byte limit", n,
                 XML_MAX_BODY_BYTES);
        return SF_ERR_LIMIT;
    }
    c->parser = XML_ParserCreate(NULL);
    if (!c->parser) {
        sf__fail(c->err, c->err_len, SF_OK, "out of memory");
        return SF_ERR_NO_MEMORY;
    }
    XML_SetUserData(c->parser, c);
    XML_SetElementHandler(c->parser, on_start, on_end);
    XML_SetCharacterDataHandler(c->parser, on_text);
    XML_SetStartDoctypeDeclHandler(c->parser, on_doctype);
    XML_SetEntityDeclHandler(c->parser, on_entity_decl);
    XML_SetParamEntityParsing(c->parser, XML_PARAM_ENTITY_PARSING_NEVER);

    size_t off = 0;
    do {
        size_t chunk = n - off > XML_CHUNK_BYTES ? XML_CHUNK_BYTES : n - off;
        int final = off + chunk == n;
        if (XML_Parse(c->parser, body ? body + off : "", (int)chunk, final) != XML_STATUS_OK) {
            if (c->status == SF_OK) {
                c->status = SF_ERR_PARSE;
                sf__fail(c->err, c->err_len, SF_OK, "malformed XML at line %lu, column %lu: %s",
                         (unsigned long)XML_GetCurrentLineNumber(c->parser),
                         (unsigned long)XML_GetCurrentColumnNumber(c->parser) + 1,
                         XML_ErrorString(XML_GetErrorCode(c->parser)));
            }
            break;
        }
        off += chunk;
    } while (off < n && c->status == SF_OK);
    XML_ParserFree(c->parser);
    c->parser = NULL;
    return c->status;
}

static void ctx_init(struct xml_ctx *c, enum doc_kind kind, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->err = err;
    c->err_len = err_len;
    sf__clear_err(err, err_len);
    sf__strbuf_init(&c->text, XML_MAX_TEXT_BYTES);
}

static void ctx_free(struct xml_ctx *c)
{
    sf__strbuf_free(&c->text);
    free(c->cur.key);
    c->cur.key = NULL;
    free(c->cur_prefix);
    c->cur_prefix = NULL;
}

sf_status sf__xml_parse_error(const char *body, size_t n, struct sf__s3_error *out)
{
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    struct xml_ctx c;
    ctx_init(&c, DOC_ERROR, NULL, 0);
    c.error = out;
    /* Error fields are informational: long ones are cut, not refused. */
    c.truncate_ok = 1;
    sf_status st = run_parser(&c, body, n);
    ctx_free(&c);
    if (st == SF_OK && !c.have_code)
        st = SF_ERR_PARSE;
    if (st != SF_OK) {
        memset(out, 0, sizeof *out);
        return st == SF_ERR_INVALID_ARGUMENT ? st : SF_ERR_PARSE;
    }
    return SF_OK;
}

/* URL-decodes *s in place (S3's encoding-type=url writes ' ' as '+'). */
static sf_status url_decode_field(char **s, const char *what, char *err, size_t err_len)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, XML_MAX_TEXT_BYTES);
    sf_status st = sf__uri_decode(&b, *s, strlen(*s), 1);
    if (st == SF_OK && memchr(sf__strbuf_str(&b), '\0', b.len)) {
        sf__fail(err, err_len, SF_OK, "URL-decoded %s \"%.64s\" holds a NUL byte", what, *s);
        st = SF_ERR_PARSE;
    }
    char *dec = st == SF_OK ? sf__strbuf_take(&b) : NULL;
    if (st == SF_OK && !dec) {
        sf__fail(err, err_len, SF_OK, "out of memory");
        st = SF_ERR_NO_MEMORY;
    }
    sf__strbuf_free(&b);
    if (st != SF_OK)
        return st;
    free(*s);
    *s = dec;
    return SF_OK;
}

/* Checks done once the whole document is read: EncodingType may come after
 * the entries it applies to. */
static sf_status finish_list(struct xml_ctx *c)
{
    struct sf__list_page *p = c->page;
    for (size_t i = 0; i < p->n_entries; i++) {
        if (c->url_encoded) {
            sf_status st = url_decode_field(&p->entries[i].key, "key", c->err, c->err_len);
            if (st != SF_OK)
                return st;
        }
        if (!p->entries[i].key[0]) {
            sf__fail(c->err, c->err_len, SF_OK, "entry %zu has an empty key", i + 1);
            return SF_ERR_PARSE;
        }
    }
    for (size_t i = 0; c->url_encoded && i < p->n_prefixes; i++) {
        sf_status st = url_decode_field(&p->prefixes[i], "prefix", c->err, c->err_len);
        if (st != SF_OK)
            return st;
    }
    if (c->kind == DOC_LIST_V2 && p->is_truncated && !p->next_token) {
        sf__fail(c->err, c->err_len, SF_OK,
                 "<IsTruncated> is true but there is no <NextContinuationToken> "
                 "(a ListObjects v1 answer?)");
        return SF_ERR_PARSE;
    }
    return SF_OK;
}

static sf_status parse_list(enum doc_kind kind, const char *body, size_t n, size_t max_entries,
                            struct sf__list_page *out, char *err, size_t err_len)
{
    if (!out) {
        sf__fail(err, err_len, SF_OK, "NULL argument");
        return SF_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    struct xml_ctx c;
    ctx_init(&c, kind, err, err_len);
    c.page = out;
    c.max_entries = max_entries ? max_entries : XML_DEFAULT_MAX_ENTRIES;
    sf_status st = run_parser(&c, body, n);
    ctx_free(&c);
    if (st == SF_OK)
        st = finish_list(&c);
    if (st != SF_OK) {
        /* An S3 error where a listing was expected says more as itself. */
        struct sf__s3_error e;
        if (strcmp(c.root, "Error") == 0 && sf__xml_parse_error(body, n, &e) == SF_OK)
            sf__fail(err, err_len, SF_OK, "expected <%s>, got S3 error %s: %s",
                     tag_names[expected_root(kind)], e.code, e.message);
        sf__list_page_free(out);
    }
    return st;
}

sf_status sf__xml_parse_list_v2(const char *body, size_t n, size_t max_entries,
                                struct sf__list_page *out, char *err, size_t err_len)
{
    return parse_list(DOC_LIST_V2, body, n, max_entries, out, err, err_len);
}

sf_status sf__xml_parse_list_buckets(const char *body, size_t n, struct sf__list_page *out,
                                     char *err, size_t err_len)
{
    return parse_list(DOC_BUCKETS, body, n, 0, out, err, err_len);
}

void sf__list_page_free(struct sf__list_page *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_entries; i++)
        free(p->entries[i].key);
    free(p->entries);
    sf__strv_free(p->prefixes, p->n_prefixes);
    free(p->next_token);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------ multipart */

sf_status sf__xml_parse_initiate(const char *body, size_t n, char *upload_id, size_t cap, char *err,
                                 size_t err_len)
{
    if (!upload_id || cap < 2) {
        sf__fail(err, err_len, SF_OK, "NULL argument");
        return SF_ERR_INVALID_ARGUMENT;
    }
    upload_id[0] = '\0';
    struct xml_ctx c;
    ctx_init(&c, DOC_INITIATE, err, err_len);
    c.upload_id = upload_id;
    c.upload_id_len = cap;
    sf_status st = run_parser(&c, body, n);
    ctx_free(&c);
    if (st == SF_OK && !c.have_upload_id) {
        sf__fail(err, err_len, SF_OK, "<InitiateMultipartUploadResult> has no <UploadId>");
        st = SF_ERR_PARSE;
    }
    if (st != SF_OK)
        upload_id[0] = '\0';
    return st;
}

sf_status sf__xml_parse_complete(const char *body, size_t n, size_t max_parts,
                                 struct sf__xml_part **parts, size_t *n_parts, char *err,
                                 size_t err_len)
{
    if (!parts || !n_parts) {
        sf__fail(err, err_len, SF_OK, "NULL argument");
        return SF_ERR_INVALID_ARGUMENT;
    }
    *parts = NULL;
    *n_parts = 0;
    struct xml_ctx c;
    ctx_init(&c, DOC_COMPLETE, err, err_len);
    c.max_parts = max_parts ? max_parts : XML_DEFAULT_MAX_ENTRIES;
    sf_status st = run_parser(&c, body, n);
    ctx_free(&c);
    if (st != SF_OK) {
        free(c.parts);
        return st;
    }
    *parts = c.parts;
    *n_parts = c.n_parts;
    return SF_OK;
}

/* ------------------------------------------------------------------ dates */

sf_status sf__parse_iso8601(const char *s, int64_t *out)
{
    if (!s || !out)
        return SF_ERR_INVALID_ARGUMENT;
    /* YYYY-MM-DDTHH:MM:SS then an optional .fraction, then Z. strnlen keeps
     * the fixed-position reads inside the string. */
    if (strnlen(s, 20) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
        s[16] != ':')
        return SF_ERR_PARSE;
    int year, mon, day, hour, min, sec;
    if (!sf__read_digits(s, 4, &year) || !sf__read_digits(s + 5, 2, &mon) ||
        !sf__read_digits(s + 8, 2, &day) || !sf__read_digits(s + 11, 2, &hour) ||
        !sf__read_digits(s + 14, 2, &min) || !sf__read_digits(s + 17, 2, &sec))
        return SF_ERR_PARSE;
    if (mon < 1 || mon > 12 || day < 1 || hour > 23 || min > 59 || sec > 59)
        return SF_ERR_PARSE;
    static const unsigned char mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    if (day > mdays[mon - 1] + (mon == 2 && leap))
        return SF_ERR_PARSE;
    const char *p = s + 19;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return SF_ERR_PARSE;
        while (*p >= '0' && *p <= '9')
            p++; /* sub-second precision is dropped */
    }
    if (p[0] != 'Z' || p[1] != '\0')
        return SF_ERR_PARSE;
    *out = sf__days_from_civil(year, (unsigned)mon, (unsigned)day) * 86400 + hour * 3600 +
           min * 60 + sec;
    return SF_OK;
}
