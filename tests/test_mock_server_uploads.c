/* The mock S3 server's uploads: multipart (ETags, part lists, abort,
 * authentication, restarts) and aws-chunked bodies with their signatures
 * and checksums. Suites `mock_server` and `mock_server_cfg`
 * (test_mock_server.c). */
#include "mock_server_fixture.h"
#include "s3/sigv4.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/test_cert.h"

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ============================================================ multipart upload */

#define MiB (1024 * 1024)

static void md5_of(const void *data, size_t n, unsigned char out[16])
{
    unsigned int len = 0;
    EVP_Digest(data, n, out, &len, EVP_md5(), NULL);
}

/* S3's ETag of an object made of these parts: md5 of the binary md5s, "-N". */
static void multipart_etag(const unsigned char *data, const size_t *sizes, size_t n, char *out,
                           size_t out_len)
{
    unsigned char *cat = malloc(16 * n), md[16];
    cr_assert(cat);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        md5_of(data + off, sizes[i], cat + 16 * i);
        off += sizes[i];
    }
    md5_of(cat, 16 * n, md);
    free(cat);
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    snprintf(out, out_len, "\"%s-%zu\"", hex, n);
}

static void create_upload(const char *key_path, char *id, size_t id_len)
{
    char target[512];
    snprintf(target, sizeof(target), "%s?uploads", key_path);
    struct s3_resp r;
    cr_assert_eq(call("POST", target, NULL, &r), 200, "%s", sf__strbuf_str(&r.body));
    cr_assert_eq(s3_xml_value(&r, "UploadId", id, id_len), 0, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
}

/* UploadPart; returns the status and writes the ETag header. */
static long upload_part(const char *key_path, const char *id, unsigned n, const void *data,
                        size_t len, char *etag, size_t etag_len)
{
    char target[512];
    snprintf(target, sizeof(target), "%s?partNumber=%u&uploadId=%s", key_path, n, id);
    struct s3_call c = {
        .method = "PUT", .target = target, .body = data, .body_len = len, .creds = &creds};
    struct s3_resp r;
    s3_call(srv.url, &c, &r);
    if (etag && s3_resp_header(&r, "ETag", etag, etag_len) != 0)
        etag[0] = '\0';
    long st = r.status;
    s3_resp_free(&r);
    return st;
}

static long complete_upload(const char *key_path, const char *id, const char *xml,
                            struct s3_resp *r)
{
    char target[512];
    snprintf(target, sizeof(target), "%s?uploadId=%s", key_path, id);
    struct s3_call c = {
        .method = "POST", .target = target, .body = xml, .body_len = strlen(xml), .creds = &creds};
    s3_call(srv.url, &c, r);
    return r->status;
}

/* Files under the bucket folder whose names start with prefix. */
static int files_named(const char *prefix)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/bucket1", root);
    DIR *d = opendir(path);
    cr_assert(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Staged parts or uploads: the mock's temporary files, not the hidden ETag
 * files of multipart objects. */
static int staged_files(void)
{
    return files_named(".sfmock-") - files_named(".sfmock-etag-");
}

static int count_tag(const struct s3_resp *r, const char *tag)
{
    int n = 0;
    for (const char *p = sf__strbuf_str(&r->body); (p = strstr(p, tag)); p += strlen(tag))
        n++;
    return n;
}

Test(mock_server, multipart_upload_round_trip_has_the_s3_etag)
{
    size_t sizes[3] = {5 * MiB, 5 * MiB + 3, 1000};
    size_t total = sizes[0] + sizes[1] + sizes[2];
    unsigned char *data = filled(total, 77);
    char id[128], etags[3][64];
    create_upload("/bucket1/dir/big.bin", id, sizeof(id));
    /* parts arrive in any order; part 2 is sent twice, the second one counts */
    cr_assert_eq(upload_part("/bucket1/dir/big.bin", id, 3, data + sizes[0] + sizes[1], sizes[2],
                             etags[2], sizeof(etags[2])),
                 200);
    cr_assert_eq(upload_part("/bucket1/dir/big.bin", id, 2, data, 100, NULL, 0), 200);
    cr_assert_eq(upload_part("/bucket1/dir/big.bin", id, 2, data + sizes[0], sizes[1], etags[1],
                             sizeof(etags[1])),
                 200);
    cr_assert_eq(
        upload_part("/bucket1/dir/big.bin", id, 1, data, sizes[0], etags[0], sizeof(etags[0])),
        200);
    unsigned char md[16];
    md5_of(data, sizes[0], md);
    char want[40];
    snprintf(want, sizeof(want), "\"");
    for (int i = 0; i < 16; i++)
        snprintf(want + 1 + 2 * i, 3, "%02x", md[i]);
    strcat(want, "\"");
    cr_expect_str_eq(etags[0], want, "a part's ETag is its quoted MD5");
    cr_expect_eq(staged_files(), 3, "three parts held as files");

    struct s3_resp r;
    char target[512];
    snprintf(target, sizeof(target), "/bucket1/dir/big.bin?uploadId=%s", id);
    cr_assert_eq(call("GET", target, NULL, &r), 200, "ListParts: %s", sf__strbuf_str(&r.body));
    cr_expect_eq(count_tag(&r, "<Part>"), 3);
    cr_expect(strstr(sf__strbuf_str(&r.body), "<Size>5242883</Size>"), "%s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    snprintf(target, sizeof(target), "/bucket1/dir/big.bin?uploadId=%s&max-parts=2", id);
    cr_assert_eq(call("GET", target, NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Part>"), 2);
    char v[64];
    cr_expect(s3_xml_value(&r, "IsTruncated", v, sizeof(v)) == 0 && !strcmp(v, "true"));
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 1, "%s", sf__strbuf_str(&r.body));
    cr_expect(s3_xml_value(&r, "Key", v, sizeof(v)) == 0 && !strcmp(v, "dir/big.bin"));
    s3_resp_free(&r);

    char xml[1024];
    snprintf(xml, sizeof(xml),
             "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part>"
             "<Part><PartNumber>2</PartNumber><ETag>%s</ETag></Part>"
             "<Part><ETag>%s</ETag><PartNumber>3</PartNumber></Part></CompleteMultipartUpload>",
             etags[0], etags[1], etags[2]);
    cr_assert_eq(complete_upload("/bucket1/dir/big.bin", id, xml, &r), 200, "%s",
                 sf__strbuf_str(&r.body));
    char etag[64] = "", want_etag[64];
    multipart_etag(data, sizes, 3, want_etag, sizeof(want_etag));
    s3_xml_value(&r, "ETag", etag, sizeof(etag));
    cr_expect(strstr(sf__strbuf_str(&r.body), "-3&quot;") || strstr(etag, "-3\""), "%s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);

    cr_assert_eq(call("GET", "/bucket1/dir/big.bin", NULL, &r), 200);
    cr_expect(r.body.len == total && memcmp(r.body.data, data, total) == 0, "object differs");
    cr_expect_eq(s3_resp_header(&r, "ETag", etag, sizeof(etag)), 0);
    cr_expect_str_eq(etag, want_etag);
    s3_resp_free(&r);
    expect_get_has("/bucket1?list-type=2", "-3&quot;</ETag>");
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 0, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "no part file left");
    expect_call_error("GET", target, NULL, 404, "NoSuchUpload");

    cJSON *j = stats();
    cr_expect_eq(group_count(j, "operations", "UploadPart"), 4);
    cr_expect_eq(group_count(j, "operations", "CompleteMultipartUpload"), 1);
    cr_expect_eq(group_count(j, "operations", "CreateMultipartUpload"), 1);
    cJSON_Delete(j);
    free(data);
}

/* A CompleteMultipartUpload body of n parts: part num[i] with ETag
 * tags[tag[i]]. */
static void parts_xml(char *xml, size_t len, unsigned n, const unsigned *num,
                      const char *const *tags, const unsigned *tag)
{
    size_t at = (size_t)snprintf(xml, len, "<CompleteMultipartUpload>");
    for (unsigned i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(xml + at, len - at,
                               "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>", num[i],
                               tags[tag[i]]);
    cr_assert(at < len);
    snprintf(xml + at, len - at, "</CompleteMultipartUpload>");
    cr_assert(strlen(xml) == at + strlen("</CompleteMultipartUpload>"), "%s", xml);
}

Test(mock_server, complete_multipart_refuses_bad_part_lists_as_s3_does)
{
    size_t n = 5 * MiB;
    unsigned char *data = filled(n, 78);
    char id[128], e1[64], e2[64], e3[64], xml[1024];
    create_upload("/bucket1/k", id, sizeof(id));
    cr_assert_eq(upload_part("/bucket1/k", id, 1, data, n, e1, sizeof(e1)), 200);
    cr_assert_eq(upload_part("/bucket1/k", id, 2, data, 1000, e2, sizeof(e2)), 200);
    cr_assert_eq(upload_part("/bucket1/k", id, 3, data, 10, e3, sizeof(e3)), 200);
    struct s3_resp r;
    /* Each list (part numbers, ETags: 0 a wrong one, else eN) and its error. */
    const char *tags[] = {"\"00000000000000000000000000000000\"", e1, e2, e3};
    static const struct {
        const char *what;
        unsigned n, num[3], tag[3];
        const char *code, *body; /* body: in the answer too (NULL: not checked) */
    } bad[] = {
        {"a wrong ETag", 2, {1, 2}, {1, 0}, "InvalidPart", NULL},
        {"a part never uploaded", 2, {1, 4}, {1, 2}, "InvalidPart", NULL},
        {"out of order", 2, {2, 1}, {2, 1}, "InvalidPartOrder", NULL},
        {"a repeated number", 2, {1, 1}, {1, 1}, "InvalidPartOrder", NULL},
        {"a part under 5 MiB that is not the last", 3, {1, 2, 3}, {1, 2, 3}, "EntityTooSmall",
         "<ProposedSize>1000</ProposedSize>"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        parts_xml(xml, sizeof(xml), bad[i].n, bad[i].num, tags, bad[i].tag);
        complete_upload("/bucket1/k", id, xml, &r);
        expect_error(&r, 400, bad[i].code);
        if (bad[i].body)
            cr_expect(strstr(sf__strbuf_str(&r.body), bad[i].body), "%s: %s", bad[i].what,
                      sf__strbuf_str(&r.body));
        s3_resp_free(&r);
    }
    /* no parts, or not XML */
    complete_upload("/bucket1/k", id, "<CompleteMultipartUpload></CompleteMultipartUpload>", &r);
    expect_error(&r, 400, "MalformedXML");
    s3_resp_free(&r);
    complete_upload("/bucket1/k", id, "<CompleteMultipartUpload><Part>", &r);
    expect_error(&r, 400, "MalformedXML");
    s3_resp_free(&r);
    /* an unknown upload id, on every operation; and another key's id */
    complete_upload("/bucket1/k", "nosuchupload", xml, &r);
    expect_error(&r, 404, "NoSuchUpload");
    s3_resp_free(&r);
    complete_upload("/bucket1/other", id, xml, &r);
    expect_error(&r, 404, "NoSuchUpload");
    s3_resp_free(&r);
    cr_expect_eq(upload_part("/bucket1/k", "nosuchupload", 1, data, 10, NULL, 0), 404);
    expect_call_error("GET", "/bucket1/k?uploadId=nosuchupload", NULL, 404, "NoSuchUpload");
    expect_call_error("DELETE", "/bucket1/k?uploadId=nosuchupload", NULL, 404, "NoSuchUpload");
    /* part numbers outside 1..10000 */
    cr_expect_eq(upload_part("/bucket1/k", id, 0, data, 10, NULL, 0), 400);
    cr_expect_eq(upload_part("/bucket1/k", id, 10001, data, 10, NULL, 0), 400);
    cr_expect_eq(call("HEAD", "/bucket1/k", NULL, &r), 404, "nothing was published");
    s3_resp_free(&r);

    /* the refused lists left the upload as it was: a good list completes it,
     * and part 3, not listed, is dropped */
    parts_xml(xml, sizeof(xml), 2, (const unsigned[]){1, 2}, tags, (const unsigned[]){1, 2});
    cr_expect_eq(complete_upload("/bucket1/k", id, xml, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1/k", NULL, &r), 200);
    cr_expect(r.body.len == n + 1000 && memcmp(r.body.data, data, n) == 0 &&
                  memcmp((char *)r.body.data + n, data, 1000) == 0,
              "object differs");
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "the dropped part's file is gone too");
    free(data);
}

Test(mock_server, abort_multipart_frees_its_parts)
{
    char id[128], id2[128];
    create_upload("/bucket1/a", id, sizeof(id));
    create_upload("/bucket1/a", id2, sizeof(id2));
    cr_expect_str_neq(id, id2);
    cr_assert_eq(upload_part("/bucket1/a", id, 1, "hello", 5, NULL, 0), 200);
    cr_assert_eq(upload_part("/bucket1/a", id, 2, "world", 5, NULL, 0), 200);
    cr_expect_eq(staged_files(), 2);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1?uploads&prefix=a", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 2, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    char target[512];
    snprintf(target, sizeof(target), "/bucket1/a?uploadId=%s", id);
    cr_expect_eq(call("DELETE", target, NULL, &r), 204);
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "an aborted upload's parts are deleted");
    expect_call_error("GET", target, NULL, 404, "NoSuchUpload");
    cr_expect_eq(upload_part("/bucket1/a", id, 3, "late", 4, NULL, 0), 404);
    cr_expect_eq(call("HEAD", "/bucket1/a", NULL, &r), 404);
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 1);
    s3_resp_free(&r);
    snprintf(target, sizeof(target), "/bucket1/a?uploadId=%s", id2);
    cr_expect_eq(call("DELETE", target, NULL, &r), 204);
    s3_resp_free(&r);
    cr_assert_eq(call("GET", "/bucket1?uploads", NULL, &r), 200);
    cr_expect_eq(count_tag(&r, "<Upload>"), 0);
    s3_resp_free(&r);
    expect_call_error("POST", "/nosuchbucket/a?uploads", NULL, 404, "NoSuchBucket");
}

/* A signed request whose x-amz-content-sha256 is another body's: refused
 * with S3's code. */
static void expect_wrong_hash_refused(const char *method, const char *target, const char *body)
{
    struct s3_call c = {.method = method,
                        .target = target,
                        .body = body,
                        .body_len = strlen(body),
                        .creds = &creds,
                        .payload_hash =
                            "0000000000000000000000000000000000000000000000000000000000000000"};
    expect_sent_error(&c, 400, "XAmzContentSHA256Mismatch");
}

Test(mock_server, upload_part_is_authenticated_and_hash_checked)
{
    char id[128], target[512];
    create_upload("/bucket1/p", id, sizeof(id));
    snprintf(target, sizeof(target), "/bucket1/p?partNumber=1&uploadId=%s", id);
    struct s3_resp r;
    expect_wrong_hash_refused("PUT", target, "data");
    const struct s3_creds bad = {"test-ak", "wrong-secret", NULL, NULL};
    struct s3_call c = {.method = "PUT", .target = target, .body = "data", .body_len = 4};
    c.creds = &bad;
    expect_sent_error(&c, 403, "SignatureDoesNotMatch");
    c.creds = NULL;
    expect_sent_error(&c, 403, "AccessDenied");
    c.creds = &creds;
    c.unsigned_payload = 1;
    cr_expect_eq(s3_call(srv.url, &c, &r), 0);
    cr_expect_eq(r.status, 200, "UNSIGNED-PAYLOAD: %s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 1, "only the accepted part is kept");
    /* the complete request's body is hash-checked too */
    snprintf(target, sizeof(target), "/bucket1/p?uploadId=%s", id);
    expect_wrong_hash_refused("POST", target, "<CompleteMultipartUpload/>");
}

static size_t stop_after(char *ptr, size_t size, size_t nmemb, void *user)
{
    (void)ptr;
    size_t *got = user;
    *got += size * nmemb;
    return *got >= 4096 ? 0 : size * nmemb; /* 0 aborts the transfer */
}

static double bytes_sent(void)
{
    cJSON *j = stats();
    double v = cJSON_GetObjectItem(j, "bytes_sent")->valuedouble;
    cJSON_Delete(j);
    return v;
}

/* A client that reads a few KiB of a large object and hangs up: the
 * statistics count what went out, not the whole object. Once over plain
 * GET (sendfile), once with a body fault (the callback body). */
Test(mock_server_cfg, bytes_sent_counts_what_a_cut_transfer_sent)
{
    const char *args[] = {"--anonymous", NULL};
    start_with(args);
    size_t size = 64 * MiB;
    char path[700];
    snprintf(path, sizeof(path), "%s/bucket1/huge.bin", root);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    close(fd);
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(admin_post("/_mock/reset", NULL), 200);
        CURL *h = curl_easy_init();
        char url[256];
        snprintf(url, sizeof(url), "%s/bucket1/huge.bin", srv.url);
        struct curl_slist *hdr = round ? curl_slist_append(NULL, "x-sfmock-fault: stall=10") : NULL;
        size_t got = 0;
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stop_after);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &got);
        curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 4096L);
        CURLcode rc = curl_easy_perform(h);
        curl_easy_cleanup(h); /* closes the connection */
        curl_slist_free_all(hdr);
        cr_expect_eq(rc, CURLE_WRITE_ERROR);
        cr_expect_geq(got, 4096);
        /* the server learns of the hang-up when its next write fails */
        double sent = bytes_sent();
        for (int i = 0; i < 100 && sent >= (double)size; i++) {
            usleep(50000);
            sent = bytes_sent();
        }
        cr_expect_lt(sent, (double)size / 2, "round %d: %.0f of %zu bytes counted as sent", round,
                     sent, size);
        cr_expect_geq(sent, (double)got, "round %d: %.0f sent but the client read %zu", round, sent,
                      got);
    }
}

/* ------------------------------------------------------------ aws-chunked */

#define STREAMING_SIGNED         "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
#define STREAMING_SIGNED_TRAILER "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
#define STREAMING_UNSIGNED       "STREAMING-UNSIGNED-PAYLOAD-TRAILER"

/* Bitwise reflected CRCs, independent of the mock's zlib and table code. */
static uint32_t crc_bitwise(uint32_t poly, const void *data, size_t n)
{
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
    }
    return ~c;
}

static void crc_b64(uint32_t v, char out[16])
{
    unsigned char be[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 8), (unsigned char)v};
    EVP_EncodeBlock((unsigned char *)out, be, 4);
}

static void crc32_b64(const void *data, size_t n, char out[16])
{
    crc_b64(crc_bitwise(0xEDB88320u, data, n), out);
}

/* An aws-chunked PUT built by hand, as SDKs send it. */
struct chunked_put {
    const char *target;
    const void *data;
    size_t n;
    size_t chunk;          /* data bytes per chunk */
    const char *mode;      /* one of the STREAMING_* values */
    const char *trailer;   /* trailer header name ("x-amz-checksum-crc32"), or NULL */
    const char *trailer_value; /* NULL: the right CRC32 of data */
    int bad_chunk_sig;     /* corrupt the second chunk's signature */
    int bad_trailer_sig;   /* corrupt the trailer signature */
    long long decoded_len; /* x-amz-decoded-content-length; -1: n, -2: absent */
    size_t cut;            /* send only the first `cut` encoded bytes (0: all) */
    const char *garbage;   /* replaces the first chunk header line */
};

static void chunk_sign(struct sf__sigv4_signer *s, const char *amz_date, char prev[65],
                       int trailer, const void *data, size_t n)
{
    char hash[65], sig[65];
    sf__sha256_hex(data, n, hash);
    char day[9];
    memcpy(day, amz_date, 8);
    day[8] = '\0';
    cr_assert_eq(sf__sigv4_sign_chunk(s, amz_date, day, "us-east-1", "s3", prev, trailer, hash, sig),
                 SF_OK);
    memcpy(prev, sig, 65);
}

static long chunked_put(const struct chunked_put *p, struct s3_resp *r)
{
    int is_signed = strcmp(p->mode, STREAMING_UNSIGNED) != 0;
    int has_trailer = strcmp(p->mode, STREAMING_SIGNED) != 0;
    char crc[64];
    if (p->trailer_value)
        snprintf(crc, sizeof crc, "%s", p->trailer_value);
    else
        crc32_b64(p->data, p->n, crc);

    /* the request's own signature seeds the chain */
    char amz_date[SF__AMZ_DATE_LEN + 1], dlen[32], trailer_hdr[96];
    snprintf(dlen, sizeof dlen, "%lld", p->decoded_len == -1 ? (long long)p->n : p->decoded_len);
    snprintf(trailer_hdr, sizeof trailer_hdr, "%s",
             p->trailer ? p->trailer : "x-amz-checksum-crc32");
    struct sf__header hdrs[6];
    size_t nh = 0;
    hdrs[nh++] = (struct sf__header){"host", srv.host};
    hdrs[nh++] = (struct sf__header){"content-encoding", "aws-chunked"};
    if (p->decoded_len != -2)
        hdrs[nh++] = (struct sf__header){"x-amz-decoded-content-length", dlen};
    if (has_trailer)
        hdrs[nh++] = (struct sf__header){"x-amz-trailer", trailer_hdr};
    struct sf__sigv4_signer s;
    sf__sigv4_signer_init(&s, creds.access_key, creds.secret_key, NULL, "us-east-1", "s3");
    const char *q = strchr(p->target, '?');
    char path[512];
    snprintf(path, sizeof path, "%.*s", (int)(q ? q - p->target : (long)strlen(p->target)),
             p->target);
    struct sf__sigv4_request req = {"PUT", path, q ? q + 1 : NULL, hdrs, nh, p->mode};
    struct sf__header extra[3];
    size_t n_extra = 0;
    struct sf__sigv4_result res = {0};
    cr_assert_eq(sf__sigv4_sign_request(&s, &req, time(NULL), amz_date, extra, &n_extra, &res),
                 SF_OK);
    char prev[65];
    memcpy(prev, res.signature, 65);

    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    const unsigned char *d = p->data;
    size_t off = 0;
    for (int i = 0;; i++) {
        size_t len = p->n - off < p->chunk ? p->n - off : p->chunk;
        if (i == 0 && p->garbage) {
            sf__strbuf_puts(&b, p->garbage);
        } else {
            sf__strbuf_printf(&b, "%zx", len);
            if (is_signed) {
                chunk_sign(&s, amz_date, prev, 0, d + off, len);
                char sig[65];
                memcpy(sig, prev, 65);
                if (i == 1 && p->bad_chunk_sig)
                    sig[0] = sig[0] == '0' ? '1' : '0';
                sf__strbuf_printf(&b, ";chunk-signature=%s", sig);
            }
        }
        sf__strbuf_puts(&b, "\r\n");
        sf__strbuf_append(&b, (const char *)d + off, len);
        if (len == 0)
            break;
        sf__strbuf_puts(&b, "\r\n");
        off += len;
    }
    if (has_trailer) {
        char line[256];
        snprintf(line, sizeof line, "%s:%s\n", trailer_hdr, crc);
        sf__strbuf_printf(&b, "%s:%s\r\n", trailer_hdr, crc);
        if (is_signed) {
            chunk_sign(&s, amz_date, prev, 1, line, strlen(line));
            if (p->bad_trailer_sig)
                prev[5] = prev[5] == 'a' ? 'b' : 'a';
            sf__strbuf_printf(&b, "x-amz-trailer-signature:%s\r\n", prev);
        }
    }
    sf__strbuf_puts(&b, "\r\n");
    cr_assert_eq(b.err, SF_OK);

    char lines[8][640];
    const char *hl[9];
    size_t nl = 0;
    for (size_t i = 1; i < nh; i++) /* host: curl sends it */
        snprintf(lines[nl++], sizeof lines[0], "%s: %s", hdrs[i].name, hdrs[i].value);
    for (size_t i = 0; i < n_extra; i++)
        snprintf(lines[nl++], sizeof lines[0], "%s: %s", extra[i].name, extra[i].value);
    snprintf(lines[nl++], sizeof lines[0], "Authorization: %s", res.authorization);
    for (size_t i = 0; i < nl; i++)
        hl[i] = lines[i];
    hl[nl] = NULL;
    struct s3_call c = {.method = "PUT",
                        .target = p->target,
                        .headers = hl,
                        .body = b.data,
                        .body_len = p->cut ? p->cut : b.len};
    s3_call(srv.url, &c, r);
    sf__strbuf_free(&b);
    sf__sigv4_result_free(&res);
    sf__sigv4_signer_destroy(&s);
    return r->status;
}

/* The object's bytes over GET equal data. */
static void expect_object(const char *target, const void *data, size_t n)
{
    struct s3_resp r;
    cr_assert_eq(call("GET", target, NULL, &r), 200, "GET %s", target);
    cr_expect_eq(r.body.len, n, "%s: %zu bytes, want %zu", target, r.body.len, n);
    cr_expect(r.body.len == n && (n == 0 || memcmp(r.body.data, data, n) == 0), "%s differs",
              target);
    s3_resp_free(&r);
}

static void expect_absent(const char *target)
{
    struct s3_resp r;
    cr_expect_eq(call("HEAD", target, NULL, &r), 404, "%s was stored", target);
    s3_resp_free(&r);
    cr_expect_eq(staged_files(), 0, "temporary files left behind");
}

/* The aws-chunked PUT p is refused with status and code, and nothing is stored. */
static void expect_chunked_refused(const struct chunked_put *p, long status, const char *code)
{
    struct s3_resp r;
    chunked_put(p, &r);
    expect_error(&r, status, code);
    s3_resp_free(&r);
    expect_absent(p->target);
}

Test(mock_server, aws_chunked_uploads_are_decoded_byte_exact)
{
    size_t n = 200 * 1024 + 17;
    unsigned char *data = filled(n, 5);
    struct s3_resp r;
    struct chunked_put p = {.target = "/bucket1/signed.bin", .data = data, .n = n,
                            .chunk = 64 * 1024, .mode = STREAMING_SIGNED, .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    expect_object("/bucket1/signed.bin", data, n);

    /* botocore's form: unsigned chunks, a CRC32 trailer; echoed as S3 does */
    p = (struct chunked_put){.target = "/bucket1/unsigned.bin", .data = data, .n = n,
                             .chunk = 8192, .mode = STREAMING_UNSIGNED,
                             .trailer = "x-amz-checksum-crc32", .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    char echo[64] = "", want[16];
    crc32_b64(data, n, want);
    s3_resp_header(&r, "x-amz-checksum-crc32", echo, sizeof echo);
    cr_expect_str_eq(echo, want);
    s3_resp_free(&r);
    expect_object("/bucket1/unsigned.bin", data, n);

    /* AWS's trailer example: 66560 'a' have CRC32C sOO8/Q== */
    char *as = malloc(66560);
    cr_assert(as);
    memset(as, 'a', 66560);
    p = (struct chunked_put){.target = "/bucket1/trailer.bin", .data = as, .n = 66560,
                             .chunk = 65536, .mode = STREAMING_SIGNED_TRAILER,
                             .trailer = "x-amz-checksum-crc32c", .trailer_value = "sOO8/Q==",
                             .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_header(&r, "x-amz-checksum-crc32c", echo, sizeof echo);
    cr_expect_str_eq(echo, "sOO8/Q==");
    s3_resp_free(&r);
    expect_object("/bucket1/trailer.bin", as, 66560);

    /* an empty object is one final chunk */
    p = (struct chunked_put){.target = "/bucket1/empty", .data = "", .n = 0, .chunk = 1,
                             .mode = STREAMING_SIGNED, .decoded_len = -1};
    cr_assert_eq(chunked_put(&p, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    expect_object("/bucket1/empty", "", 0);

    cJSON *st = stats();
    cr_expect_eq(group_count(st, "aws_chunked", STREAMING_SIGNED), 2);
    cr_expect_eq(group_count(st, "aws_chunked", STREAMING_UNSIGNED), 1);
    cr_expect_eq(group_count(st, "aws_chunked", STREAMING_SIGNED_TRAILER), 1);
    cr_expect_eq(group_count(st, "checksums", "CRC32"), 1);
    cr_expect_eq(group_count(st, "checksums", "CRC32C"), 1);
    cJSON_Delete(st);
    free(as);
    free(data);
}

Test(mock_server, aws_chunked_bad_signatures_are_refused_and_not_stored)
{
    size_t n = 100 * 1024;
    unsigned char *data = filled(n, 6);
    struct chunked_put p = {.target = "/bucket1/k", .data = data, .n = n, .chunk = 32 * 1024,
                            .mode = STREAMING_SIGNED, .decoded_len = -1, .bad_chunk_sig = 1};
    expect_chunked_refused(&p, 403, "SignatureDoesNotMatch");

    p.mode = STREAMING_SIGNED_TRAILER;
    p.trailer = "x-amz-checksum-crc32";
    p.bad_chunk_sig = 0;
    p.bad_trailer_sig = 1;
    expect_chunked_refused(&p, 403, "SignatureDoesNotMatch");
    free(data);
}

Test(mock_server, aws_chunked_wrong_trailer_checksum_is_bad_digest)
{
    size_t n = 50 * 1024;
    unsigned char *data = filled(n, 7);
    const char *modes[2] = {STREAMING_UNSIGNED, STREAMING_SIGNED_TRAILER};
    for (int i = 0; i < 2; i++) {
        struct chunked_put p = {.target = "/bucket1/k", .data = data, .n = n, .chunk = 16384,
                                .mode = modes[i], .trailer = "x-amz-checksum-crc32",
                                .trailer_value = "AAAAAA==", .decoded_len = -1};
        expect_chunked_refused(&p, 400, "BadDigest");
    }
    free(data);
}

Test(mock_server, aws_chunked_length_and_framing_errors_are_400)
{
    size_t n = 40 * 1024;
    unsigned char *data = filled(n, 8);
    struct s3_resp r;
    struct chunked_put p = {.target = "/bucket1/k", .data = data, .n = n, .chunk = 16384,
                            .mode = STREAMING_SIGNED, .decoded_len = (long long)n + 1};
    expect_chunked_refused(&p, 400, "IncompleteBody");

    p.decoded_len = -2;
    chunked_put(&p, &r);
    expect_error(&r, 411, "MissingContentLength");
    s3_resp_free(&r);

    /* cut inside the second chunk's data: a complete HTTP body, a truncated encoding */
    p.decoded_len = -1;
    p.cut = 16384 + 20000;
    expect_chunked_refused(&p, 400, "IncompleteBody");

    p.cut = 0;
    p.mode = STREAMING_UNSIGNED;
    p.trailer = "x-amz-checksum-crc32";
    p.garbage = "zz";
    expect_chunked_refused(&p, 400, "InvalidRequest");
    free(data);
}

Test(mock_server, checksum_headers_of_plain_uploads_are_verified_and_echoed)
{
    size_t n = 3000;
    unsigned char *data = filled(n, 9);
    char crc[16], crcc[16], sha[64], hdr[3][128];
    crc32_b64(data, n, crc);
    crc_b64(crc_bitwise(0x82F63B78u, data, n), crcc);
    unsigned char md[32];
    unsigned int ml = 0;
    EVP_Digest(data, n, md, &ml, EVP_sha256(), NULL);
    EVP_EncodeBlock((unsigned char *)sha, md, 32);
    snprintf(hdr[0], sizeof hdr[0], "x-amz-checksum-crc32: %s", crc);
    snprintf(hdr[1], sizeof hdr[1], "x-amz-checksum-crc32c: %s", crcc);
    snprintf(hdr[2], sizeof hdr[2], "x-amz-checksum-sha256: %s", sha);
    for (int i = 0; i < 3; i++) {
        const char *h[] = {hdr[i], NULL};
        struct s3_call c = {.method = "PUT", .target = "/bucket1/ok", .headers = h, .body = data,
                            .body_len = n, .creds = &creds};
        struct s3_resp r;
        s3_call(srv.url, &c, &r);
        cr_expect_eq(r.status, 200, "%s: %s", hdr[i], sf__strbuf_str(&r.body));
        char name[64], echo[64] = "";
        snprintf(name, sizeof name, "%.*s", (int)(strchr(hdr[i], ':') - hdr[i]), hdr[i]);
        s3_resp_header(&r, name, echo, sizeof echo);
        cr_expect_str_eq(echo, strchr(hdr[i], ' ') + 1);
        s3_resp_free(&r);
    }
    const char *bad[] = {"x-amz-checksum-sha1: 2jmj7l5rSw0yVb/vlWAYkK/YBwk=", NULL};
    struct s3_call c = {.method = "PUT", .target = "/bucket1/bad", .headers = bad, .body = data,
                        .body_len = n, .creds = &creds};
    expect_sent_error(&c, 400, "BadDigest");
    expect_absent("/bucket1/bad");

    /* UploadPart checks them the same way */
    char id[128];
    create_upload("/bucket1/mp", id, sizeof id);
    char target[256];
    snprintf(target, sizeof target, "/bucket1/mp?partNumber=1&uploadId=%s", id);
    const char *wrong[] = {"x-amz-checksum-crc32: AAAAAA==", NULL};
    c = (struct s3_call){.method = "PUT", .target = target, .headers = wrong, .body = data,
                         .body_len = n, .creds = &creds};
    expect_sent_error(&c, 400, "BadDigest");
    cr_expect_eq(staged_files(), 0);
    free(data);
}

/* Uploads data as a 2-part multipart object (5 MiB + the rest); its ETag. */
static void multipart_put(const char *key_path, const unsigned char *data, size_t n,
                          char *etag, size_t etag_len)
{
    size_t sizes[2] = {5 * MiB, n - 5 * MiB};
    char id[128], etags[2][64], xml[512];
    create_upload(key_path, id, sizeof id);
    cr_assert_eq(upload_part(key_path, id, 1, data, sizes[0], etags[0], sizeof etags[0]), 200);
    cr_assert_eq(upload_part(key_path, id, 2, data + sizes[0], sizes[1], etags[1], sizeof etags[1]),
                 200);
    snprintf(xml, sizeof xml,
             "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part>"
             "<Part><PartNumber>2</PartNumber><ETag>%s</ETag></Part></CompleteMultipartUpload>",
             etags[0], etags[1]);
    struct s3_resp r;
    cr_assert_eq(complete_upload(key_path, id, xml, &r), 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    multipart_etag(data, sizes, 2, etag, etag_len);
}

static void expect_etag(const char *target, const char *want)
{
    struct s3_resp r;
    char etag[64] = "";
    cr_assert_eq(call("HEAD", target, NULL, &r), 200, "HEAD %s", target);
    s3_resp_header(&r, "ETag", etag, sizeof etag);
    s3_resp_free(&r);
    cr_expect_str_eq(etag, want, "ETag of %s", target);
}

Test(mock_server, multipart_etag_survives_a_restart_and_goes_with_the_object)
{
    size_t n = 5 * MiB + 1000;
    unsigned char *data = filled(n, 10);
    char want[64], want2[64];
    multipart_put("/bucket1/mp.bin", data, n, want, sizeof want);
    multipart_put("/bucket1/d/mp2.bin", data, n, want2, sizeof want2);
    expect_etag("/bucket1/mp.bin", want);
    cr_expect_eq(files_named(".sfmock-etag-mp.bin"), 1, "the hidden ETag file of mp.bin");
    cr_expect_eq(staged_files(), 0);

    /* a new server on the same root answers the multipart ETags */
    cr_assert_eq(mock_proc_stop(&srv), 0);
    const char *args[] = {"--access-key", "test-ak", "--secret-key", "test-secret", NULL};
    cr_assert_eq(mock_proc_start(&srv, root, args), 0);
    expect_etag("/bucket1/mp.bin", want);
    expect_etag("/bucket1/d/mp2.bin", want2);
    struct s3_resp r;
    cr_assert_eq(call("GET", "/bucket1?list-type=2", NULL, &r), 200);
    cr_expect(strstr(sf__strbuf_str(&r.body), "-2&quot;</ETag>"), "listing: %s",
              sf__strbuf_str(&r.body));
    cr_expect(!strstr(sf__strbuf_str(&r.body), ".sfmock"), "the sidecar is listed: %s",
              sf__strbuf_str(&r.body));
    s3_resp_free(&r);

    /* overwritten: the content's MD5 again, and the sidecar is gone */
    put_object("/bucket1/mp.bin", data, 100);
    unsigned char md[16];
    md5_of(data, 100, md);
    char md5_etag[40] = "\"";
    for (int i = 0; i < 16; i++)
        snprintf(md5_etag + 1 + 2 * i, 3, "%02x", md[i]);
    strcat(md5_etag, "\"");
    expect_etag("/bucket1/mp.bin", md5_etag);
    cr_expect_eq(files_named(".sfmock-"), 0, "a hidden file is left");

    /* deleted: the folder d/ holds nothing and is pruned */
    cr_assert_eq(call("DELETE", "/bucket1/d/mp2.bin", NULL, &r), 204);
    s3_resp_free(&r);
    char path[700];
    snprintf(path, sizeof path, "%s/bucket1/d", root);
    struct stat sb;
    cr_expect_neq(stat(path, &sb), 0, "bucket1/d still exists (a sidecar left in it?)");
    free(data);
}
