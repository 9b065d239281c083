/*
 * S3 XML bodies parsed with expat: ListObjectsV2 results, ListAllMyBuckets
 * results and <Error> documents. Bodies are untrusted: every string is capped,
 * entities are decoded by expat (no external entities, no DTD expansion
 * beyond expat's own limits), and keys are URL-decoded when the body says
 * <EncodingType>url</EncodingType>.
 */
#ifndef SF_S3_XML_H
#define SF_S3_XML_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>

/* <Error><Code/><Message/><RequestId/><HostId/><Key/><BucketName/></Error> */
struct sf__s3_error {
    char code[64];        /* "NoSuchKey", "" when the body was not an S3 error */
    char message[256];
    char request_id[128];
    char host_id[256];
    char key[256];        /* <Key> when present (truncated) */
    char bucket[64];      /* <BucketName> when present */
    char region[64];      /* <Region>: where the bucket is (a wrong-region answer) */
    char endpoint[256];   /* <Endpoint>: where to send it (301, 307 redirects) */
};

/* Parses an error body. Returns SF_OK when an <Error> element with a <Code>
 * was found, SF_ERR_PARSE otherwise (*out is then zeroed). */
sf_status sf__xml_parse_error(const char *body, size_t n, struct sf__s3_error *out);

struct sf__list_entry {
    char *key;           /* decoded key (may hold any UTF-8); malloc'd */
    uint64_t size;
    char etag[128];      /* as sent, quotes included */
    int64_t last_modified; /* seconds since the epoch, 0 if absent/unparsable */
};

/* One page of ListObjectsV2 (or ListBuckets: entries are the buckets, size 0). */
struct sf__list_page {
    struct sf__list_entry *entries;
    size_t n_entries;
    char **prefixes; /* CommonPrefixes/Prefix, decoded; malloc'd */
    size_t n_prefixes;
    int is_truncated;
    char *next_token; /* NextContinuationToken as sent (not decoded), NULL if none */
};

/* Parses a ListBucketResult (v2). At most max_entries (0 = 100000) entries
 * and prefixes per page, else SF_ERR_LIMIT. SF_ERR_PARSE on malformed XML or
 * a missing <ListBucketResult>, with a reason in err. Free with
 * sf__list_page_free even on failure. */
sf_status sf__xml_parse_list_v2(const char *body, size_t n, size_t max_entries,
                                struct sf__list_page *out, char *err, size_t err_len);

/* Parses a ListAllMyBucketsResult into out->entries (key = bucket name,
 * last_modified = CreationDate). */
sf_status sf__xml_parse_list_buckets(const char *body, size_t n, struct sf__list_page *out,
                                     char *err, size_t err_len);

void sf__list_page_free(struct sf__list_page *p);

/* The UploadId of an InitiateMultipartUploadResult (CreateMultipartUpload)
 * into upload_id (cap bytes). SF_ERR_PARSE when malformed, another root or
 * no UploadId; SF_ERR_LIMIT when it does not fit. */
sf_status sf__xml_parse_initiate(const char *body, size_t n, char *upload_id, size_t cap, char *err,
                                 size_t err_len);

/* One <Part> of a CompleteMultipartUpload body. */
struct sf__xml_part {
    unsigned number;
    char etag[80]; /* as sent (quotes kept), cut to fit */
};

/* The parts of a CompleteMultipartUpload body, in document order, into a
 * malloc'd *parts (free it; NULL when there are none). At most max_parts
 * (0 = 100000), else SF_ERR_LIMIT; a <Part> without <PartNumber> or <ETag>,
 * a number that is not one, another root or malformed XML: SF_ERR_PARSE. */
sf_status sf__xml_parse_complete(const char *body, size_t n, size_t max_parts,
                                 struct sf__xml_part **parts, size_t *n_parts, char *err,
                                 size_t err_len);

/* "2009-10-12T17:50:30.000Z" or without fraction -> seconds since the epoch (UTC). */
sf_status sf__parse_iso8601(const char *s, int64_t *out);

#endif
