/* S3 XML (s3/xml.c): the answers the client reads (ListObjectsV2,
 * ListAllMyBuckets, <Error>, InitiateMultipartUploadResult, ISO 8601 dates)
 * and the CompleteMultipartUpload body the mock reads from any client. The
 * whole input is the body. */
#include "fuzz.h"
#include "s3/xml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = (char *)fz_copy(data, size, 0);
    char err[256];
    struct sf__list_page page;
    memset(&page, 0, sizeof page);
    sf_status st = sf__xml_parse_list_v2(body, size, 64, &page, err, sizeof err);
    if (st == SF_OK) {
        fz_check(page.n_entries <= 64 && page.n_prefixes <= 64, "over max_entries");
        for (size_t i = 0; i < page.n_entries; i++)
            fz_check(page.entries[i].key != NULL, "entry without a key");
    }
    sf__list_page_free(&page);
    memset(&page, 0, sizeof page);
    sf__xml_parse_list_buckets(body, size, &page, err, sizeof err);
    sf__list_page_free(&page);
    char upload_id[128];
    if (sf__xml_parse_initiate(body, size, upload_id, sizeof upload_id, err, sizeof err) == SF_OK)
        fz_check(memchr(upload_id, '\0', sizeof upload_id) != NULL, "upload id not terminated");
    struct sf__xml_part *parts = NULL;
    size_t n_parts = 0;
    if (sf__xml_parse_complete(body, size, 16, &parts, &n_parts, err, sizeof err) == SF_OK) {
        fz_check(n_parts <= 16, "over max_parts");
        for (size_t i = 0; i < n_parts; i++)
            fz_check(memchr(parts[i].etag, '\0', sizeof parts[i].etag) != NULL,
                     "etag not terminated");
    }
    free(parts);
    struct sf__s3_error e;
    if (sf__xml_parse_error(body, size, &e) == SF_OK)
        fz_check(e.code[0] != '\0', "an error without a code");
    free(body);
    char *s = (char *)fz_copy(data, size < 64 ? size : 64, 1);
    int64_t t;
    sf__parse_iso8601(s, &t);
    free(s);
    return 0;
}
