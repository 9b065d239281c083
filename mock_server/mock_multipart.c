/* Multipart upload operations: CreateMultipartUpload, UploadPart's end,
 * CompleteMultipartUpload (assembling the parts), AbortMultipartUpload,
 * ListParts and ListMultipartUploads. The bookkeeping is in uploads.c. */

#include "mock_server/mock_internal.h"

#include "mock_server/objects.h"
#include "mock_server/uploads.h"
#include "s3/sigv4.h"
#include "s3/xml.h"
#include "common/strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum MHD_Result mock_respond_no_such_upload(struct request *rq, struct MHD_Connection *conn)
{
    struct s3_error e = {0};
    mock_set_error(
        &e, 404, "NoSuchUpload",
        "The specified upload does not exist. The upload ID may be invalid, or the upload "
        "may have been aborted or completed.");
    struct sf__strbuf x;
    sf__strbuf_init(&x, 0);
    mock_xml_elem(&x, "UploadId", rq->upload_id ? rq->upload_id : "", 0);
    e.extra_xml = sf__strbuf_take(&x);
    return mock_respond_error(rq, conn, &e, NULL);
}

/* The end of an UploadPart whose body was received and checked: the
 * temporary file becomes the part. */
enum MHD_Result mock_upload_part_finish(struct request *rq, struct MHD_Connection *conn,
                                        const unsigned char md5[16])
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (fsync(rq->up_fd) != 0 || close(rq->up_fd) != 0) {
        rq->up_fd = -1;
        mock_upload_abort(rq);
        mock_set_error(&e, 500, "InternalError", "Writing part %u failed", rq->part_number);
        return mock_respond_error(rq, conn, &e, NULL);
    }
    rq->up_fd = -1;
    struct mock_part part = {
        .number = rq->part_number,
        .size = rq->up_bytes,
        .mtime = time(NULL),
        .path = rq->up_tmp,
    };
    memcpy(part.md5, md5, 16);
    sf_status st = mock_uploads_add_part(srv->uploads, rq->bucket, rq->key, rq->upload_id, &part);
    if (st == SF_ERR_NOT_FOUND) {
        mock_upload_abort(rq);
        return mock_respond_no_such_upload(rq, conn);
    }
    if (st != SF_OK) {
        mock_upload_abort(rq);
        if (st == SF_ERR_LIMIT)
            mock_set_error(
                &e, 400, "InvalidRequest",
                "The mock holds at most %d parts of uploads in progress; complete or abort "
                "some uploads",
                MOCK_MAX_PARTS_TOTAL);
        else
            mock_set_error(&e, 500, "InternalError", "Recording part %u failed: %s",
                           rq->part_number, sf_status_str(st));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    rq->up_tmp = NULL; /* the registry owns the file now */
    char etag[MOCK_ETAG_LEN + 1];
    mock_format_etag(md5, etag);
    return mock_respond_stored(rq, conn, etag);
}

enum MHD_Result mock_op_create_upload(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (!mock_bucket_exists(srv->store, rq->bucket)) {
        mock_set_error(&e, 404, "NoSuchBucket", "The specified bucket does not exist");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    char id[MOCK_UPLOAD_ID_LEN + 1];
    sf_status st = mock_uploads_create(srv->uploads, rq->bucket, rq->key, id);
    if (st != SF_OK) {
        if (st == SF_ERR_LIMIT)
            mock_set_error(&e, 400, "InvalidRequest",
                           "The mock holds at most %d multipart uploads in progress; complete or "
                           "abort some first",
                           MOCK_MAX_UPLOADS);
        else
            mock_set_error(&e, 500, "InternalError", "Cannot start the upload: %s",
                           sf_status_str(st));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<InitiateMultipartUploadResult xmlns=\"" S3_XMLNS "\">");
    mock_xml_elem(&b, "Bucket", rq->bucket, 0);
    mock_xml_elem(&b, "Key", rq->key, 0);
    mock_xml_elem(&b, "UploadId", id, 0);
    sf__strbuf_puts(&b, "</InitiateMultipartUploadResult>");
    return mock_respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

/* Compares a part's ETag as a client sends it (quoted or bare, any case). */
static int part_etag_matches(const char *given, const unsigned char md5[16])
{
    size_t n = strlen(given);
    if (n >= 2 && given[0] == '"' && given[n - 1] == '"') {
        given++;
        n -= 2;
    }
    char hex[33];
    sf__hex_encode(md5, 16, hex);
    return n == 32 && strncasecmp(given, hex, 32) == 0;
}

/* errno of a failed publish that means the key clashes with a key prefix
 * (a file where a folder is needed, or the reverse): 400, set in e. */
static int key_conflict(int err, struct s3_error *e)
{
    if (err != EISDIR && err != ENOTDIR && err != EEXIST && err != ENOTEMPTY)
        return 0;
    mock_set_error(e, 400, "InvalidArgument",
                   "The key conflicts with a key prefix already stored (the mock keeps objects as "
                   "files)");
    return 1;
}

/* Concatenates the listed parts into a temporary file in the bucket and
 * publishes it as the key, with the multipart ETag pinned. */
static int assemble_object(struct request *rq, const struct mock_part *const *use, size_t n,
                           const char *etag, struct s3_error *e)
{
    struct mock_server *srv = rq->srv;
    char *dir = mock_store_path(srv->store, rq->bucket, NULL);
    size_t len = dir ? strlen(dir) + sizeof("/" MOCK_TMP_PREFIX "upload-XXXXXX") : 0;
    char *tmp = dir ? malloc(len) : NULL;
    if (!tmp) {
        free(dir);
        mock_set_error(e, 500, "InternalError", "Out of memory");
        return -1;
    }
    snprintf(tmp, len, "%s/" MOCK_TMP_PREFIX "upload-XXXXXX", dir);
    free(dir);
    int out = mkostemp(tmp, O_CLOEXEC);
    if (out < 0) {
        mock_set_error(e, 500, "InternalError", "Cannot create the object file: %s",
                       strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = 1;
    uint64_t total = 0;
    for (size_t i = 0; ok && i < n; i++) {
        int in = open(use[i]->path, O_RDONLY | O_CLOEXEC);
        uint64_t left = use[i]->size;
        while (in >= 0 && left > 0) {
            ssize_t c =
                copy_file_range(in, NULL, out, NULL, left > (1u << 30) ? (1u << 30) : left, 0);
            if (c < 0 && errno == EINTR)
                continue;
            if (c <= 0)
                break;
            left -= (uint64_t)c;
        }
        if (in < 0 || left > 0) {
            mock_set_error(e, 500, "InternalError", "Copying part %u into the object failed: %s",
                           use[i]->number, in < 0 ? strerror(errno) : "short copy");
            ok = 0;
        }
        if (in >= 0)
            close(in);
        total += use[i]->size;
    }
    struct stat sb;
    if (ok && (fchmod(out, 0644) != 0 || fsync(out) != 0 || fstat(out, &sb) != 0 ||
               (uint64_t)sb.st_size != total)) {
        mock_set_error(e, 500, "InternalError", "Writing the object failed");
        ok = 0;
    }
    if (ok)
        mock_store_set_etag(srv->store, &sb, etag);
    close(out);
    char *final = ok ? mock_store_path(srv->store, rq->bucket, rq->key) : NULL;
    if (ok && !final) {
        mock_set_error(e, 500, "InternalError", "Out of memory");
        ok = 0;
    }
    /* the sidecar first: the object never appears without its ETag */
    if (ok && (mock_make_parents(srv, rq->bucket, rq->key) != 0 ||
               mock_store_persist_etag(final, &sb, etag) != SF_OK)) {
        int err = errno;
        if (!key_conflict(err, e))
            mock_set_error(e, 500, "InternalError", "Persisting the ETag of %s failed: %s",
                           rq->target, strerror(err));
        ok = 0;
    }
    if (ok && rename(tmp, final) != 0) {
        int err = errno;
        if (!key_conflict(err, e))
            mock_set_error(e, 500, "InternalError", "Publishing the object failed: %s",
                           strerror(err));
        mock_store_forget_etag(final);
        ok = 0;
    }
    if (!ok)
        unlink(tmp);
    free(final);
    free(tmp);
    return ok ? 0 : -1;
}

enum MHD_Result mock_op_complete_upload(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    if (rq->body.err != SF_OK) {
        mock_set_error(&e, 400, "MalformedXML", "The part list is larger than the mock's %d bytes",
                       MAX_SMALL_BODY);
        return mock_respond_error(rq, conn, &e, NULL);
    }
    const char *payload = mock_header(conn, "x-amz-content-sha256");
    if (payload && strlen(payload) == SF__SHA256_HEX_LEN) {
        char hex[SF__SHA256_HEX_LEN + 1];
        sf__sha256_hex(rq->body.data ? rq->body.data : "", rq->body.len, hex);
        if (strcmp(hex, payload) != 0) {
            mock_set_error(&e, 400, "XAmzContentSHA256Mismatch",
                           "The provided 'x-amz-content-sha256' header does not match what was "
                           "computed.");
            return mock_respond_error(rq, conn, &e, NULL);
        }
    }
    struct sf__xml_part *given = NULL;
    size_t n_given = 0;
    char xerr[256] = "";
    sf_status st =
        sf__xml_parse_complete(sf__strbuf_str(&rq->body), rq->body.len, MOCK_MAX_PART_NUMBER,
                               &given, &n_given, xerr, sizeof(xerr));
    if (st != SF_OK || n_given == 0) {
        free(given);
        mock_set_error(&e, 400, "MalformedXML",
                       "The XML you provided was not well-formed or did not validate against our "
                       "published schema (%s)",
                       st != SF_OK ? xerr : "no <Part>");
        return mock_respond_error(rq, conn, &e, NULL);
    }
    struct mock_part *parts = NULL;
    size_t n_parts = 0;
    st = mock_uploads_parts(srv->uploads, rq->bucket, rq->key, rq->upload_id, 1, &parts, &n_parts);
    if (st != SF_OK) {
        free(given);
        if (st == SF_ERR_NOT_FOUND)
            return mock_respond_no_such_upload(rq, conn);
        mock_set_error(&e, 500, "InternalError", "%s", sf_status_str(st));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    /* The checks of S3 (and MinIO): ascending order first, then each part
     * exists with that ETag, then every part but the last is >= 5 MiB. */
    const struct mock_part **use = calloc(n_given, sizeof(*use));
    int bad = !use;
    if (bad)
        mock_set_error(&e, 500, "InternalError", "Out of memory");
    for (size_t i = 1; !bad && i < n_given; i++) {
        if (given[i].number <= given[i - 1].number) {
            mock_set_error(&e, 400, "InvalidPartOrder",
                           "The list of parts was not in ascending order. The parts list must be "
                           "specified in order by part number. (part %u after part %u)",
                           given[i].number, given[i - 1].number);
            bad = 1;
        }
    }
    for (size_t i = 0; !bad && i < n_given; i++) {
        const struct mock_part *found = NULL;
        for (size_t j = 0; j < n_parts && !found; j++)
            if (parts[j].number == given[i].number)
                found = &parts[j];
        if (!found || !part_etag_matches(given[i].etag, found->md5)) {
            mock_set_error(
                &e, 400, "InvalidPart",
                "One or more of the specified parts could not be found. The part may not "
                "have been uploaded, or the specified entity tag may not match the part's "
                "entity tag. (part %u: %s)",
                given[i].number, found ? "ETag differs" : "not uploaded");
            struct sf__strbuf x;
            sf__strbuf_init(&x, 0);
            mock_xml_elem(&x, "UploadId", rq->upload_id, 0);
            sf__strbuf_printf(&x, "<PartNumber>%u</PartNumber>", given[i].number);
            mock_xml_elem(&x, "ETag", given[i].etag, 0);
            e.extra_xml = sf__strbuf_take(&x);
            bad = 1;
        }
        use[i] = found;
    }
    for (size_t i = 0; !bad && i + 1 < n_given; i++) {
        if (use[i]->size < MOCK_MIN_PART_BYTES) {
            mock_set_error(&e, 400, "EntityTooSmall",
                           "Your proposed upload is smaller than the minimum allowed object size. "
                           "(part %u: %llu bytes, every part but the last needs %llu)",
                           use[i]->number, (unsigned long long)use[i]->size, MOCK_MIN_PART_BYTES);
            struct sf__strbuf x;
            sf__strbuf_init(&x, 0);
            sf__strbuf_printf(&x,
                              "<ProposedSize>%llu</ProposedSize><MinSizeAllowed>%llu"
                              "</MinSizeAllowed><PartNumber>%u</PartNumber>",
                              (unsigned long long)use[i]->size, MOCK_MIN_PART_BYTES,
                              use[i]->number);
            mock_xml_elem(&x, "ETag", given[i].etag, 0);
            e.extra_xml = sf__strbuf_take(&x);
            bad = 1;
        }
    }
    char etag[MOCK_ETAG_LEN + 1];
    if (!bad) {
        /* S3's multipart ETag: MD5 of the parts' binary MD5s, then "-N" */
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        unsigned char md[16];
        unsigned int md_len = 0;
        if (!ctx || !EVP_DigestInit_ex(ctx, EVP_md5(), NULL)) {
            mock_set_error(&e, 500, "InternalError", "MD5 failed");
            bad = 1;
        }
        for (size_t i = 0; !bad && i < n_given; i++)
            EVP_DigestUpdate(ctx, use[i]->md5, 16);
        if (!bad && (!EVP_DigestFinal_ex(ctx, md, &md_len) || md_len != 16)) {
            mock_set_error(&e, 500, "InternalError", "MD5 failed");
            bad = 1;
        }
        EVP_MD_CTX_free(ctx);
        if (!bad) {
            char hex[33];
            sf__hex_encode(md, 16, hex);
            snprintf(etag, sizeof(etag), "\"%s-%zu\"", hex, n_given);
            bad = assemble_object(rq, use, n_given, etag, &e) != 0;
        }
    }
    free(use);
    free(given);
    mock_parts_free(parts, n_parts);
    mock_uploads_end_complete(srv->uploads, rq->upload_id, !bad);
    if (bad)
        return mock_respond_error(rq, conn, &e, NULL);
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<CompleteMultipartUploadResult xmlns=\"" S3_XMLNS "\">");
    struct sf__strbuf loc;
    sf__strbuf_init(&loc, 0);
    sf__strbuf_printf(&loc, "%s://%s%s", mock_server_scheme(srv),
                      mock_header(conn, "Host") ? mock_header(conn, "Host") : "localhost",
                      rq->path);
    mock_xml_elem(&b, "Location", sf__strbuf_str(&loc), 0);
    sf__strbuf_free(&loc);
    mock_xml_elem(&b, "Bucket", rq->bucket, 0);
    mock_xml_elem(&b, "Key", rq->key, 0);
    mock_xml_elem(&b, "ETag", etag, 0);
    sf__strbuf_puts(&b, "</CompleteMultipartUploadResult>");
    return mock_respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

enum MHD_Result mock_op_abort_upload(struct request *rq, struct MHD_Connection *conn)
{
    if (mock_uploads_abort(rq->srv->uploads, rq->bucket, rq->key, rq->upload_id) != SF_OK)
        return mock_respond_no_such_upload(rq, conn);
    return mock_respond_empty(rq, conn, 204);
}

/* A query parameter that must be an integer in [lo, hi] when present. */
static int param_uint(struct request *rq, const char *name, unsigned long lo, unsigned long hi,
                      unsigned long *out, struct s3_error *e)
{
    const char *v = mock_param_get(rq, name);
    if (!v)
        return 0;
    char *end;
    errno = 0;
    unsigned long x = strtoul(v, &end, 10);
    if (!*v || *v == '-' || *end || errno || x < lo || x > hi) {
        mock_set_error(e, 400, "InvalidArgument", "%s must be an integer from %lu to %lu", name, lo,
                       hi);
        return -1;
    }
    *out = x;
    return 0;
}

enum MHD_Result mock_op_list_parts(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    unsigned long max_parts = 1000, marker = 0;
    if (param_uint(rq, "max-parts", 0, 2147483647ul, &max_parts, &e) != 0 ||
        param_uint(rq, "part-number-marker", 0, 2147483647ul, &marker, &e) != 0)
        return mock_respond_error(rq, conn, &e, NULL);
    if (max_parts > 1000)
        max_parts = 1000;
    struct mock_part *parts = NULL;
    size_t n = 0;
    sf_status st =
        mock_uploads_parts(srv->uploads, rq->bucket, rq->key, rq->upload_id, 0, &parts, &n);
    if (st == SF_ERR_NOT_FOUND)
        return mock_respond_no_such_upload(rq, conn);
    if (st != SF_OK) {
        mock_set_error(&e, 500, "InternalError", "%s", sf_status_str(st));
        return mock_respond_error(rq, conn, &e, NULL);
    }
    struct sf__strbuf items;
    sf__strbuf_init(&items, 0);
    unsigned long count = 0;
    unsigned last = 0;
    int truncated = 0;
    for (size_t i = 0; i < n; i++) {
        if (parts[i].number <= marker)
            continue;
        if (count == max_parts) {
            truncated = 1;
            break;
        }
        char when[32], etag[MOCK_ETAG_LEN + 1];
        mock_format_iso8601(parts[i].mtime, when);
        mock_format_etag(parts[i].md5, etag);
        sf__strbuf_printf(&items, "<Part><PartNumber>%u</PartNumber>", parts[i].number);
        mock_xml_elem(&items, "LastModified", when, 0);
        mock_xml_elem(&items, "ETag", etag, 0);
        sf__strbuf_printf(&items, "<Size>%llu</Size></Part>", (unsigned long long)parts[i].size);
        last = parts[i].number;
        count++;
    }
    mock_parts_free(parts, n);
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<ListPartsResult xmlns=\"" S3_XMLNS "\">");
    mock_xml_elem(&b, "Bucket", rq->bucket, 0);
    mock_xml_elem(&b, "Key", rq->key, 0);
    mock_xml_elem(&b, "UploadId", rq->upload_id, 0);
    sf__strbuf_puts(&b, "<Initiator><ID>mock</ID><DisplayName>mock</DisplayName></Initiator>"
                        "<Owner><ID>mock</ID><DisplayName>mock</DisplayName></Owner>"
                        "<StorageClass>STANDARD</StorageClass>");
    sf__strbuf_printf(&b,
                      "<PartNumberMarker>%lu</PartNumberMarker><NextPartNumberMarker>%u"
                      "</NextPartNumberMarker><MaxParts>%lu</MaxParts><IsTruncated>%s"
                      "</IsTruncated>",
                      marker, last, max_parts, truncated ? "true" : "false");
    sf__strbuf_append(&b, sf__strbuf_str(&items), items.len);
    sf__strbuf_free(&items);
    sf__strbuf_puts(&b, "</ListPartsResult>");
    return mock_respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}

enum MHD_Result mock_op_list_uploads(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    struct s3_error e = {0};
    const char *prefix = mock_param_get(rq, "prefix");
    const char *key_marker = mock_param_get(rq, "key-marker");
    const char *id_marker = mock_param_get(rq, "upload-id-marker");
    if (!prefix)
        prefix = "";
    if (!key_marker)
        key_marker = "";
    int url = mock_param_url_encoding(rq, &e);
    if (url < 0)
        return mock_respond_error(rq, conn, &e, NULL);
    unsigned long max_uploads = 1000;
    if (param_uint(rq, "max-uploads", 0, 2147483647ul, &max_uploads, &e) != 0)
        return mock_respond_error(rq, conn, &e, NULL);
    if (max_uploads > 1000)
        max_uploads = 1000;
    struct mock_upload_info *v = NULL;
    size_t n = 0;
    if (mock_uploads_list(srv->uploads, rq->bucket, prefix, &v, &n) != SF_OK)
        return MHD_NO;
    struct sf__strbuf items;
    sf__strbuf_init(&items, 0);
    unsigned long count = 0;
    int truncated = 0;
    const struct mock_upload_info *last = NULL;
    for (size_t i = 0; i < n; i++) {
        /* after the markers: keys past key-marker, or the same key past
         * upload-id-marker (S3 ignores the id marker without a key marker) */
        int c = strcmp(v[i].key, key_marker);
        if (*key_marker && (c < 0 || (c == 0 && (!id_marker || strcmp(v[i].id, id_marker) <= 0))))
            continue;
        if (count == max_uploads) {
            truncated = 1;
            break;
        }
        char when[32];
        mock_format_iso8601(v[i].initiated, when);
        sf__strbuf_puts(&items, "<Upload>");
        mock_xml_elem(&items, "Key", v[i].key, url);
        mock_xml_elem(&items, "UploadId", v[i].id, 0);
        sf__strbuf_puts(&items, "<Initiator><ID>mock</ID><DisplayName>mock</DisplayName>"
                                "</Initiator><Owner><ID>mock</ID><DisplayName>mock</DisplayName>"
                                "</Owner><StorageClass>STANDARD</StorageClass>");
        mock_xml_elem(&items, "Initiated", when, 0);
        sf__strbuf_puts(&items, "</Upload>");
        last = &v[i];
        count++;
    }
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, XML_DECL "<ListMultipartUploadsResult xmlns=\"" S3_XMLNS "\">");
    mock_xml_elem(&b, "Bucket", rq->bucket, 0);
    mock_xml_elem(&b, "KeyMarker", key_marker, url);
    mock_xml_elem(&b, "UploadIdMarker", id_marker ? id_marker : "", 0);
    if (truncated && last) {
        mock_xml_elem(&b, "NextKeyMarker", last->key, url);
        mock_xml_elem(&b, "NextUploadIdMarker", last->id, 0);
    }
    mock_xml_elem(&b, "Prefix", prefix, url);
    if (url)
        mock_xml_elem(&b, "EncodingType", "url", 0);
    sf__strbuf_printf(&b, "<MaxUploads>%lu</MaxUploads><IsTruncated>%s</IsTruncated>", max_uploads,
                      truncated ? "true" : "false");
    sf__strbuf_append(&b, sf__strbuf_str(&items), items.len);
    sf__strbuf_free(&items);
    sf__strbuf_puts(&b, "</ListMultipartUploadsResult>");
    mock_upload_infos_free(v, n);
    return mock_respond_buffer(rq, conn, 200, "application/xml", &b, NULL);
}
