/* Bucket operations: ListBuckets, CreateBucket, DeleteBucket, HeadBucket,
 * GetBucketLocation, and ListObjects (v1 and v2) with their continuation
 * tokens. */

#include "mock_server/mock_internal.h"

#include "mock_server/objects.h"
#include "s3/sigv4.h"
#include "s3/uri.h"
#include "common/dirnames.h"
#include "common/strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* sf__dirnames filter: the server root's entries that are buckets. */
static int keep_bucket(const char *dir, const char *name, void *store)
{
    (void)dir;
    return mock_bucket_name_valid(name) && mock_bucket_exists(store, name);
}

enum MHD_Result mock_op_list_buckets(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    char **names = NULL;
    size_t n = 0;
    if (sf__dirnames(mock_store_root(srv->store), keep_bucket, srv->store, &names, &n) != 0) {
        mock_set_error(&e, 500, "InternalError", "Cannot read the server root");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL
                    "<ListAllMyBucketsResult xmlns=\"" S3_XMLNS "\">"
                    "<Owner><ID>mock</ID><DisplayName>mock</DisplayName></Owner><Buckets>");
    for (size_t i = 0; i < n; i++) {
        char *path = mock_store_path(srv->store, names[i], NULL);
        struct stat sb;
        char when[32] = "1970-01-01T00:00:00.000Z";
        if (path && stat(path, &sb) == 0)
            mock_format_iso8601(sb.st_mtim.tv_sec, when);
        free(path);
        sf__strbuf_puts(&b, "<Bucket>");
        mock_xml_elem(&b, "Name", names[i], 0);
        mock_xml_elem(&b, "CreationDate", when, 0);
        sf__strbuf_puts(&b, "</Bucket>");
    }
    sf__strv_free(names, n);
    sf__strbuf_puts(&b, "</Buckets></ListAllMyBucketsResult>");
    return mock_respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

enum MHD_Result mock_op_create_bucket(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    char *path = mock_store_path(rq->srv->store, rq->bucket, NULL);
    if (!path)
        return MHD_NO;
    int rc = mkdir(path, 0755);
    int err = errno;
    free(path);
    if (rc != 0) {
        if (err == EEXIST)
            mock_set_error(&e, 409, "BucketAlreadyOwnedByYou",
                           "Your previous request to create the named bucket succeeded and you "
                           "already own it.");
        else
            mock_set_error(&e, 500, "InternalError", "mkdir failed: %s", strerror(err));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp) {
        char loc[128];
        snprintf(loc, sizeof(loc), "/%s", rq->bucket);
        MHD_add_response_header(resp, "Location", loc);
    }
    return mock_queue(rq, conn, 200, resp, 0, NULL);
}

enum MHD_Result mock_op_delete_bucket(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    char *path = mock_store_path(rq->srv->store, rq->bucket, NULL);
    if (!path)
        return MHD_NO;
    int rc = rmdir(path);
    int err = errno;
    free(path);
    if (rc != 0) {
        if (err == ENOENT)
            mock_set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        else if (err == ENOTEMPTY || err == EEXIST)
            mock_set_error(&e, 409, "BucketNotEmpty",
                           "The bucket you tried to delete is not empty");
        else
            mock_set_error(&e, 500, "InternalError", "rmdir failed: %s", strerror(err));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    return mock_respond_empty(rq, conn, 204);
}

enum MHD_Result mock_op_head_bucket(struct request *rq, struct MHD_Connection *conn)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp)
        MHD_add_response_header(resp, "x-amz-bucket-region", rq->srv->cfg.region);
    return mock_queue(rq, conn, 200, resp, 0, NULL);
}

enum MHD_Result mock_op_bucket_location(struct request *rq, struct MHD_Connection *conn)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<LocationConstraint xmlns=\"" S3_XMLNS "\">");
    if (strcmp(rq->srv->cfg.region, "us-east-1") != 0)
        mock_xml_escape(&b, rq->srv->cfg.region, strlen(rq->srv->cfg.region));
    sf__strbuf_puts(&b, "</LocationConstraint>");
    return mock_respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

/* Continuation tokens are 'K' (a key) or 'P' (a common prefix) + hex. */
static char *token_encode(char kind, const char *s)
{
    size_t n = strlen(s);
    char *t = malloc(2 * n + 2);
    if (!t)
        return NULL;
    t[0] = kind;
    sf__hex_encode((const unsigned char *)s, n, t + 1);
    return t;
}

static char *token_decode(const char *t, char *kind)
{
    size_t n = strlen(t);
    if (n < 1 || (t[0] != 'K' && t[0] != 'P') || (n - 1) % 2 != 0 || n > 4096)
        return NULL;
    char *s = malloc((n - 1) / 2 + 1);
    if (!s)
        return NULL;
    for (size_t i = 0; i < (n - 1) / 2; i++) {
        int hi = sf__hex_digit_value((unsigned char)t[1 + 2 * i]);
        int lo = sf__hex_digit_value((unsigned char)t[2 + 2 * i]);
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            free(s);
            return NULL;
        }
        s[i] = (char)(hi * 16 + lo);
    }
    s[(n - 1) / 2] = '\0';
    *kind = t[0];
    return s;
}

enum MHD_Result mock_op_list_objects(struct request *rq, struct MHD_Connection *conn, int v2)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    const char *prefix = mock_param_get(rq, "prefix");
    const char *delim = mock_param_get(rq, "delimiter");
    const char *max_s = mock_param_get(rq, "max-keys");
    const char *token = v2 ? mock_param_get(rq, "continuation-token") : NULL;
    const char *start_after = mock_param_get(rq, v2 ? "start-after" : "marker");
    if (!prefix)
        prefix = "";
    if (delim && !*delim)
        delim = NULL;
    int url = mock_param_url_encoding(rq, &e);
    if (url < 0)
        return mock_respond_error(rq, conn, &e, NULL);
    long max_keys = 1000;
    if (max_s) {
        char *end;
        errno = 0;
        max_keys = strtol(max_s, &end, 10);
        if (end == max_s || *end || errno || max_keys < 0) {
            mock_set_error(&e, 400, "InvalidArgument",
                           "Provided max-keys not an integer or within "
                           "integer range");
            return mock_respond_error(rq, conn, &e, NULL);
        }
        if (max_keys > 1000)
            max_keys = 1000;
    }
    char resume_kind = 0;
    char *resume = NULL;
    if (token) {
        resume = token_decode(token, &resume_kind);
        if (!resume) {
            mock_set_error(&e, 400, "InvalidArgument",
                           "The continuation token provided is incorrect");
            return mock_respond_error(rq, conn, &e, NULL);
        }
    } else if (start_after && *start_after) {
        resume = strdup(start_after);
        resume_kind = 'K';
    }

    struct mock_listing l;
    sf_status rc = mock_store_list(srv->store, rq->bucket, prefix, &l);
    if (rc != SF_OK) {
        free(resume);
        if (rc == SF_ERR_NOT_FOUND)
            mock_set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        else
            mock_set_error(&e, 500, "InternalError", "Listing failed: %s", sf_status_str(rc));
        return mock_respond_error(rq, conn, &e, NULL);
    }

    struct sf__strbuf items;
    sf__strbuf_init(&items, 256u << 20);
    size_t plen = strlen(prefix), dlen = delim ? strlen(delim) : 0;
    long count = 0;
    int truncated = 0;
    char *last_cp = NULL;   /* the last common prefix emitted */
    char *last_item = NULL; /* the last key or prefix emitted */
    char last_kind = 0;
    for (size_t i = 0; i < l.n; i++) {
        const char *k = l.entries[i].key;
        const char *cp_end = NULL;
        if (delim) {
            const char *hit = strstr(k + plen, delim);
            if (hit)
                cp_end = hit + dlen;
        }
        /* Resume after the marker / token / start-after: a key that rolls
         * up into a common prefix is compared as that prefix, so a page that
         * ended on "a/" does not emit "a/" again (S3 semantics). */
        if (resume) {
            size_t cmp_len = cp_end ? (size_t)(cp_end - k) : strlen(k);
            size_t rlen = strlen(resume);
            int c = memcmp(k, resume, cmp_len < rlen ? cmp_len : rlen);
            if (c < 0 || (c == 0 && cmp_len <= rlen))
                continue;
            if (resume_kind == 'P' && strncmp(k, resume, rlen) == 0)
                continue;
        }
        if (cp_end && last_cp && strncmp(k, last_cp, strlen(last_cp)) == 0 &&
            strlen(last_cp) == (size_t)(cp_end - k))
            continue; /* rolled up into the prefix just emitted */
        if (count >= max_keys) {
            truncated = max_keys > 0;
            break;
        }
        if (cp_end) {
            free(last_cp);
            last_cp = strndup(k, (size_t)(cp_end - k));
            free(last_item);
            last_item = last_cp ? strdup(last_cp) : NULL;
            last_kind = 'P';
            if (!last_cp || !last_item) {
                sf__strbuf_free(&items);
                mock_listing_free(&l);
                free(resume);
                free(last_cp);
                free(last_item);
                return MHD_NO;
            }
            sf__strbuf_puts(&items, "<CommonPrefixes>");
            mock_xml_elem(&items, "Prefix", last_cp, url);
            sf__strbuf_puts(&items, "</CommonPrefixes>");
        } else {
            char etag[MOCK_ETAG_LEN + 1] = "\"\"";
            char *path = mock_store_path(srv->store, rq->bucket, k);
            int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
            struct stat sb;
            if (fd >= 0 && fstat(fd, &sb) == 0)
                mock_store_etag(srv->store, path, fd, &sb, etag);
            if (fd >= 0)
                close(fd);
            free(path);
            char when[32];
            mock_format_iso8601(l.entries[i].mtime, when);
            sf__strbuf_puts(&items, "<Contents>");
            mock_xml_elem(&items, "Key", k, url);
            mock_xml_elem(&items, "LastModified", when, 0);
            mock_xml_elem(&items, "ETag", etag, 0);
            sf__strbuf_printf(&items, "<Size>%llu</Size><StorageClass>STANDARD</StorageClass>",
                              (unsigned long long)l.entries[i].size);
            sf__strbuf_puts(&items, "</Contents>");
            free(last_item);
            last_item = strdup(k);
            last_kind = 'K';
        }
        count++;
    }
    mock_listing_free(&l);
    free(last_cp);

    struct sf__strbuf b;
    sf__strbuf_init(&b, 256u << 20);
    sf__strbuf_puts(&b, XML_DECL "<ListBucketResult xmlns=\"" S3_XMLNS "\">");
    mock_xml_elem(&b, "Name", rq->bucket, 0);
    mock_xml_elem(&b, "Prefix", prefix, url);
    if (delim)
        mock_xml_elem(&b, "Delimiter", delim, url);
    sf__strbuf_printf(&b, "<MaxKeys>%ld</MaxKeys>", max_keys);
    if (url)
        mock_xml_elem(&b, "EncodingType", "url", 0);
    sf__strbuf_printf(&b, "<IsTruncated>%s</IsTruncated>", truncated ? "true" : "false");
    if (v2) {
        sf__strbuf_printf(&b, "<KeyCount>%ld</KeyCount>", count);
        if (token)
            mock_xml_elem(&b, "ContinuationToken", token, 0);
        if (start_after)
            mock_xml_elem(&b, "StartAfter", start_after, url);
        if (truncated && last_item) {
            char *next = token_encode(last_kind, last_item);
            if (next)
                mock_xml_elem(&b, "NextContinuationToken", next, 0);
            free(next);
        }
    } else {
        mock_xml_elem(&b, "Marker", start_after ? start_after : "", url);
        if (truncated && last_item)
            mock_xml_elem(&b, "NextMarker", last_item, url);
    }
    free(last_item);
    free(resume);
    sf__strbuf_append(&b, sf__strbuf_str(&items), items.len);
    sf__strbuf_free(&items);
    sf__strbuf_puts(&b, "</ListBucketResult>");
    if (b.err != SF_OK) {
        sf__strbuf_free(&b);
        mock_set_error(&e, 500, "InternalError", "Listing too large");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    return mock_respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}
