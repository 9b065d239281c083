/* S3 XML answers (s3/xml.c): ListObjectsV2, ListAllMyBuckets, <Error>, and
 * the ISO 8601 dates in them. The whole input is the body. */
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
