#include <criterion/criterion.h>

#include "common/strbuf.h"
#include "s3/xml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XMLNS     "http://s3.amazonaws.com/doc/2006-03-01/"
#define DECL      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define LBR_OPEN  DECL "<ListBucketResult xmlns=\"" XMLNS "\">"
#define LBR_CLOSE "</ListBucketResult>"

static void parse_list_ok(const char *body, struct sf__list_page *page)
{
    char err[256] = "";
    sf_status st = sf__xml_parse_list_v2(body, strlen(body), 0, page, err, sizeof err);
    cr_assert_eq(st, SF_OK, "parse failed: %d %s", (int)st, err);
}

/* The page's keys are keys[0..n_keys) and its common prefixes
 * prefixes[0..n_prefixes), in that order. */
static void expect_names(const struct sf__list_page *p, const char *const *keys, size_t n_keys,
                         const char *const *prefixes, size_t n_prefixes)
{
    cr_assert_eq(p->n_entries, n_keys);
    for (size_t i = 0; i < n_keys; i++)
        cr_expect_str_eq(p->entries[i].key, keys[i], "entry %zu", i);
    cr_assert_eq(p->n_prefixes, n_prefixes, "the top-level <Prefix> is not a common prefix");
    for (size_t i = 0; i < n_prefixes; i++)
        cr_expect_str_eq(p->prefixes[i], prefixes[i], "prefix %zu", i);
}

/* Expects parse_list_v2 to fail with want and a message holding frag. */
static void expect_list_fails(const char *body, size_t n, size_t max_entries, sf_status want,
                              const char *frag)
{
    struct sf__list_page page;
    char err[256] = "";
    sf_status st = sf__xml_parse_list_v2(body, n, max_entries, &page, err, sizeof err);
    cr_expect_eq(st, want, "status %d, want %d (%s)", (int)st, (int)want, err);
    if (frag)
        cr_expect(strstr(err, frag) != NULL, "message \"%s\" lacks \"%s\"", err, frag);
    cr_expect_eq(page.n_entries, 0, "a failed parse leaves no entries");
    cr_expect_null(page.entries);
    cr_expect_null(page.next_token);
    sf__list_page_free(&page);
}

/* expect_list_fails of the whole of body, a C string, with no entry cap. */
static void expect_parse_fails(const char *body, sf_status want, const char *frag)
{
    expect_list_fails(body, strlen(body), 0, want, frag);
}

static void expect_date(const char *s, int64_t want)
{
    int64_t got = -12345;
    sf_status st = sf__parse_iso8601(s, &got);
    cr_expect_eq(st, SF_OK, "parse_iso8601(\"%s\") failed: %d", s, (int)st);
    cr_expect_eq(got, want, "parse_iso8601(\"%s\") = %lld, want %lld", s, (long long)got,
                 (long long)want);
}

static void expect_bad_date(const char *s)
{
    int64_t got = 0;
    cr_expect_eq(sf__parse_iso8601(s, &got), SF_ERR_PARSE, "parse_iso8601(\"%s\") accepted", s);
}

/* ------------------------------------------------------------------ ListObjectsV2 */

Test(xml, list_page_with_several_entries)
{
    const char *body =
        LBR_OPEN "<Name>bucket</Name><Prefix>train/</Prefix><KeyCount>3</KeyCount>"
                 "<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
                 "<Contents><Key>train/000000.tar</Key>"
                 "<LastModified>2009-10-12T17:50:30.000Z</LastModified>"
                 "<ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag>"
                 "<Size>434234</Size><StorageClass>STANDARD</StorageClass></Contents>"
                 "<Contents><Key>train/000001.tar</Key>"
                 "<LastModified>1970-01-01T00:00:00Z</LastModified>"
                 "<ETag>\"abc-2\"</ETag><Size>0</Size>"
                 "<Owner><ID>x</ID><DisplayName>y</DisplayName></Owner></Contents>"
                 "<Contents><Key>train/000002.tar</Key>"
                 "<Size>18446744073709551615</Size></Contents>" LBR_CLOSE;
    struct sf__list_page p;
    parse_list_ok(body, &p);
    cr_assert_eq(p.n_entries, 3);
    cr_expect_str_eq(p.entries[0].key, "train/000000.tar");
    cr_expect_eq(p.entries[0].size, 434234);
    cr_expect_str_eq(p.entries[0].etag, "\"fba9dede5f27731c9771645a39863328\"");
    cr_expect_eq(p.entries[0].last_modified, 1255369830);
    cr_expect_str_eq(p.entries[1].key, "train/000001.tar");
    cr_expect_eq(p.entries[1].size, 0);
    cr_expect_str_eq(p.entries[1].etag, "\"abc-2\"");
    cr_expect_eq(p.entries[1].last_modified, 0);
    cr_expect_str_eq(p.entries[2].key, "train/000002.tar");
    cr_expect_eq(p.entries[2].size, UINT64_MAX);
    cr_expect_str_eq(p.entries[2].etag, "", "absent ETag is empty");
    cr_expect_eq(p.n_prefixes, 0);
    cr_expect_eq(p.is_truncated, 0);
    cr_expect_null(p.next_token);
    sf__list_page_free(&p);
    cr_expect_null(p.entries, "free leaves the page empty");
    cr_expect_eq(p.n_entries, 0);
    sf__list_page_free(&p); /* twice is harmless */
    sf__list_page_free(NULL);
}

/* Ceph RGW and NetApp ONTAP list ETags bare while their GETs quote them;
 * a proxy may weaken one. Kept as sent, a listed ETag never equalled the
 * GET's and every listed object read as changed: the page holds the one
 * form the headers give (s3/etag.h). */
Test(xml, listed_etags_take_the_quoted_strong_form)
{
    /* each ETag as a store lists it, and as the page holds it */
    static const char *const sent[] = {"fba9dede5f27", "W/&quot;abc-2&quot;", " \"d41d\" ",
                                       "&quot;&quot;"};
    static const char *const listed[] = {"\"fba9dede5f27\"", "\"abc-2\"", "\"d41d\"",
                                         "" /* an empty tag is no ETag */};
    enum { N = sizeof(sent) / sizeof(sent[0]) };
    char body[1024];
    int len = snprintf(body, sizeof(body), "%s", LBR_OPEN);
    for (size_t i = 0; i < N; i++)
        len +=
            snprintf(body + len, sizeof(body) - (size_t)len,
                     "<Contents><Key>%c</Key><ETag>%s</ETag></Contents>", (int)('a' + i), sent[i]);
    len += snprintf(body + len, sizeof(body) - (size_t)len, "%s", LBR_CLOSE);
    cr_assert_lt((size_t)len, sizeof(body));
    struct sf__list_page p;
    parse_list_ok(body, &p);
    cr_assert_eq(p.n_entries, N);
    for (size_t i = 0; i < N; i++)
        cr_expect_str_eq(p.entries[i].etag, listed[i], "the ETag sent as <%s>", sent[i]);
    sf__list_page_free(&p);
}

Test(xml, empty_listing)
{
    struct sf__list_page p;
    parse_list_ok(LBR_OPEN "<Name>b</Name><KeyCount>0</KeyCount>"
                           "<IsTruncated>false</IsTruncated>" LBR_CLOSE,
                  &p);
    cr_expect_eq(p.n_entries, 0);
    cr_expect_eq(p.n_prefixes, 0);
    sf__list_page_free(&p);
}

Test(xml, truncated_page_with_continuation_token)
{
    /* The token is returned as sent: entities decoded by XML, never
     * URL-decoded, even with EncodingType url. */
    const char *body =
        LBR_OPEN "<IsTruncated>true</IsTruncated>"
                 "<EncodingType>url</EncodingType>"
                 "<ContinuationToken>old</ContinuationToken>"
                 "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
                 "%2B&amp;x</NextContinuationToken>"
                 "<Contents><Key>a</Key><Size>1</Size></Contents>" LBR_CLOSE;
    struct sf__list_page p;
    parse_list_ok(body, &p);
    cr_expect_eq(p.is_truncated, 1);
    cr_assert_not_null(p.next_token);
    cr_expect_str_eq(p.next_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=%2B&x");
    cr_expect_eq(p.n_entries, 1);
    sf__list_page_free(&p);
}

Test(xml, truncated_without_token_is_an_error)
{
    const char *body = LBR_OPEN "<IsTruncated>true</IsTruncated><NextMarker>a</NextMarker>"
                                "<Contents><Key>a</Key></Contents>" LBR_CLOSE;
    expect_parse_fails(body, SF_ERR_PARSE, "NextContinuationToken");
}

Test(xml, bad_is_truncated_rejected)
{
    const char *body = LBR_OPEN "<IsTruncated>yes</IsTruncated>" LBR_CLOSE;
    expect_parse_fails(body, SF_ERR_PARSE, "IsTruncated");
}

Test(xml, common_prefixes)
{
    const char *body = LBR_OPEN "<Name>b</Name><Prefix>data/</Prefix><Delimiter>/</Delimiter>"
                                "<IsTruncated>false</IsTruncated>"
                                "<Contents><Key>data/readme.txt</Key><Size>5</Size></Contents>"
                                "<CommonPrefixes><Prefix>data/train/</Prefix></CommonPrefixes>"
                                "<CommonPrefixes><Prefix>data/val/</Prefix></CommonPrefixes>"
                                "<CommonPrefixes></CommonPrefixes>" LBR_CLOSE;
    struct sf__list_page p;
    parse_list_ok(body, &p);
    expect_names(&p, (const char *const[]){"data/readme.txt"}, 1,
                 (const char *const[]){"data/train/", "data/val/"}, 2);
    sf__list_page_free(&p);
}

Test(xml, url_encoded_keys_are_decoded)
{
    /* S3 encodes ' ' as '+' and a literal '+' as %2B; our mock sends %20
     * for a space. Both must decode. EncodingType comes last here: decoding
     * must not depend on its position. */
    const char *body =
        LBR_OPEN "<IsTruncated>false</IsTruncated>"
                 "<Contents><Key>dir/a+b%20c</Key><Size>1</Size></Contents>"
                 "<Contents><Key>plus%2Bsign</Key><Size>2</Size></Contents>"
                 "<Contents><Key>100%25%26more&amp;%3Cx%3E</Key><Size>3</Size></Contents>"
                 "<Contents><Key>caf%C3%A9/%E6%97%A5%E6%9C%AC.tar</Key><Size>4</Size></Contents>"
                 "<Contents><Key>ctl%01%0Abyte</Key><Size>5</Size></Contents>"
                 "<CommonPrefixes><Prefix>sp+ace%2Fdir%2B/</Prefix></CommonPrefixes>"
                 "<EncodingType>url</EncodingType>" LBR_CLOSE;
    struct sf__list_page p;
    parse_list_ok(body, &p);
    static const char *const keys[] = {"dir/a b c", "plus+sign", "100%&more&<x>",
                                       "caf\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac.tar",
                                       "ctl\x01\nbyte"};
    expect_names(&p, keys, 5, (const char *const[]){"sp ace/dir+/"}, 1);
    sf__list_page_free(&p);
}

Test(xml, keys_without_encoding_type_are_literal)
{
    const char *body = LBR_OPEN "<Contents><Key>a+b%20c</Key></Contents>"
                                "<CommonPrefixes><Prefix>x+y/</Prefix></CommonPrefixes>" LBR_CLOSE;
    struct sf__list_page p;
    parse_list_ok(body, &p);
    expect_names(&p, (const char *const[]){"a+b%20c"}, 1, (const char *const[]){"x+y/"}, 1);
    sf__list_page_free(&p);
}

Test(xml, mock_server_style_url_listing)
{
    /* Exactly what mock_server/mock_s3.c writes for encoding-type=url:
     * sf__uri_encode with '/' kept, then XML-escaped. */
    const char *body = DECL "<ListBucketResult xmlns=\"" XMLNS "\"><Name>b</Name>"
                            "<Prefix>my%20dir/</Prefix><MaxKeys>1000</MaxKeys>"
                            "<EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
                            "<KeyCount>1</KeyCount><Contents>"
                            "<Key>my%20dir/a%2Bb%20%26%25.tar</Key>"
                            "<LastModified>2024-02-29T12:00:00.000Z</LastModified>"
                            "<ETag>&quot;d41d8cd98f00b204e9800998ecf8427e&quot;</ETag>"
                            "<Size>1024</Size><StorageClass>STANDARD</StorageClass>"
                            "</Contents></ListBucketResult>";
    struct sf__list_page p;
    parse_list_ok(body, &p);
    expect_names(&p, (const char *const[]){"my dir/a+b &%.tar"}, 1, NULL, 0);
    cr_expect_eq(p.entries[0].size, 1024);
    cr_expect_eq(p.entries[0].last_modified, 1709208000);
    cr_expect_str_eq(p.entries[0].etag, "\"d41d8cd98f00b204e9800998ecf8427e\"");
    sf__list_page_free(&p);
}

Test(xml, decoded_nul_byte_rejected)
{
    const char *body = LBR_OPEN "<EncodingType>url</EncodingType>"
                                "<Contents><Key>a%00b</Key></Contents>" LBR_CLOSE;
    expect_parse_fails(body, SF_ERR_PARSE, "NUL");
}

Test(xml, unknown_encoding_type_rejected)
{
    const char *body = LBR_OPEN "<EncodingType>base64</EncodingType>" LBR_CLOSE;
    expect_parse_fails(body, SF_ERR_PARSE, "base64");
}

Test(xml, entities_cdata_and_character_references)
{
    const char *body = LBR_OPEN
        "<Contents><Key>a&amp;b&lt;c&gt;d&quot;e&apos;f&#x41;&#66;&#x1F600;</Key></Contents>"
        "<Contents><Key><![CDATA[raw <not> & tags]]></Key></Contents>"
        "<Contents><Key>mix<![CDATA[&amp;]]>&amp;</Key></Contents>" LBR_CLOSE;
    struct sf__list_page p;
    parse_list_ok(body, &p);
    static const char *const keys[] = {"a&b<c>d\"e'fAB\xf0\x9f\x98\x80", "raw <not> & tags",
                                       "mix&amp;&"};
    expect_names(&p, keys, 3, NULL, 0);
    sf__list_page_free(&p);
}

Test(xml, whitespace_between_elements_and_in_numbers)
{
    /* Pretty-printed; numbers, booleans and dates are trimmed, keys never. */
    const char *body = DECL "<ListBucketResult xmlns=\"" XMLNS "\">\n"
                            "  <IsTruncated>\n    true\n  </IsTruncated>\n"
                            "  <NextContinuationToken>tok</NextContinuationToken>\n"
                            "  <Contents>\n"
                            "    <Key> spaced key </Key>\n"
                            "    <Size>\t42\r\n</Size>\n"
                            "    <LastModified> 1970-01-02T00:00:00.000Z </LastModified>\n"
                            "  </Contents>\n"
                            "</ListBucketResult>\n";
    struct sf__list_page p;
    parse_list_ok(body, &p);
    cr_expect_eq(p.is_truncated, 1);
    expect_names(&p, (const char *const[]){" spaced key "}, 1, NULL, 0);
    cr_expect_eq(p.entries[0].size, 42);
    cr_expect_eq(p.entries[0].last_modified, 86400);
    sf__list_page_free(&p);
}

Test(xml, namespaces_matched_by_local_name)
{
    /* Prefixed namespace, and no namespace at all (some S3-compatibles). */
    const char *prefixed = "<s3:ListBucketResult xmlns:s3=\"" XMLNS "\">"
                           "<s3:Contents><s3:Key>k1</s3:Key><s3:Size>7</s3:Size></s3:Contents>"
                           "</s3:ListBucketResult>";
    const char *bare = "<ListBucketResult><Contents><Key>k2</Key></Contents></ListBucketResult>";
    struct sf__list_page p;
    parse_list_ok(prefixed, &p);
    expect_names(&p, (const char *const[]){"k1"}, 1, NULL, 0);
    cr_expect_eq(p.entries[0].size, 7);
    sf__list_page_free(&p);
    parse_list_ok(bare, &p);
    expect_names(&p, (const char *const[]){"k2"}, 1, NULL, 0);
    sf__list_page_free(&p);
}

Test(xml, bad_sizes_rejected)
{
    const char *bodies[] = {
        LBR_OPEN "<Contents><Key>a</Key><Size>18446744073709551616</Size></Contents>" LBR_CLOSE,
        LBR_OPEN "<Contents><Key>a</Key><Size>-1</Size></Contents>" LBR_CLOSE,
        LBR_OPEN "<Contents><Key>a</Key><Size>1.5</Size></Contents>" LBR_CLOSE,
        LBR_OPEN "<Contents><Key>a</Key><Size></Size></Contents>" LBR_CLOSE,
        LBR_OPEN "<Contents><Key>a</Key><Size>12 34</Size></Contents>" LBR_CLOSE,
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        expect_list_fails(bodies[i], strlen(bodies[i]), 0, SF_ERR_PARSE, "<Size>");
}

Test(xml, contents_without_key_or_with_empty_key_rejected)
{
    const char *no_key = LBR_OPEN "<Contents><Size>1</Size></Contents>" LBR_CLOSE;
    expect_parse_fails(no_key, SF_ERR_PARSE, "no <Key>");
    const char *empty = LBR_OPEN "<Contents><Key></Key></Contents>" LBR_CLOSE;
    expect_parse_fails(empty, SF_ERR_PARSE, "empty key");
}

Test(xml, unparsable_last_modified_is_zero)
{
    struct sf__list_page p;
    parse_list_ok(LBR_OPEN "<Contents><Key>a</Key><LastModified>yesterday</LastModified>"
                           "</Contents>" LBR_CLOSE,
                  &p);
    cr_assert_eq(p.n_entries, 1);
    cr_expect_eq(p.entries[0].last_modified, 0);
    sf__list_page_free(&p);
}

/* ------------------------------------------------------------------ limits */

static char *repeat_entries(size_t n, const char *item)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, LBR_OPEN);
    for (size_t i = 0; i < n; i++)
        sf__strbuf_puts(&b, item);
    sf__strbuf_puts(&b, LBR_CLOSE);
    char *s = sf__strbuf_take(&b);
    cr_assert_not_null(s);
    return s;
}

Test(xml, entry_count_over_max_entries_is_limit)
{
    char *body = repeat_entries(11, "<Contents><Key>k</Key></Contents>");
    struct sf__list_page p;
    char err[256];
    cr_expect_eq(sf__xml_parse_list_v2(body, strlen(body), 11, &p, err, sizeof err), SF_OK);
    cr_expect_eq(p.n_entries, 11, "exactly max_entries is fine");
    sf__list_page_free(&p);
    expect_list_fails(body, strlen(body), 10, SF_ERR_LIMIT, "more than 10 entries");
    free(body);

    body = repeat_entries(4, "<CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes>");
    expect_list_fails(body, strlen(body), 3, SF_ERR_LIMIT, "common prefixes");
    free(body);
}

Test(xml, default_entry_cap_is_100000)
{
    char *body = repeat_entries(100001, "<Contents><Key>k</Key></Contents>");
    expect_parse_fails(body, SF_ERR_LIMIT, "100000");
    free(body);
}

Test(xml, over_long_key_is_limit)
{
    size_t n = 70000;
    char *body = malloc(n + 200);
    cr_assert_not_null(body);
    int at = snprintf(body, 200, "<ListBucketResult><Contents><Key>");
    memset(body + at, 'k', n);
    strcpy(body + at + n, "</Key></Contents></ListBucketResult>");
    expect_parse_fails(body, SF_ERR_LIMIT, "<Key>");
    free(body);
}

Test(xml, over_long_etag_is_limit)
{
    char body[512];
    char etag[200];
    memset(etag, 'e', 150);
    etag[150] = '\0';
    snprintf(body, sizeof body,
             "<ListBucketResult><Contents><Key>k</Key><ETag>%s</ETag>"
             "</Contents></ListBucketResult>",
             etag);
    expect_parse_fails(body, SF_ERR_LIMIT, "ETag");
}

Test(xml, deep_nesting_is_limit)
{
    struct sf__strbuf b;
    sf__strbuf_init(&b, 0);
    sf__strbuf_puts(&b, "<ListBucketResult>");
    for (int i = 0; i < 100; i++)
        sf__strbuf_puts(&b, "<a>");
    for (int i = 0; i < 100; i++)
        sf__strbuf_puts(&b, "</a>");
    sf__strbuf_puts(&b, "</ListBucketResult>");
    expect_list_fails(b.data, b.len, 0, SF_ERR_LIMIT, "deeper");
    sf__strbuf_free(&b);
}

Test(xml, over_cap_body_is_limit)
{
    /* Refused on its size before a byte is read, so the pages of this
     * allocation are never touched. */
    size_t n = ((size_t)256 << 20) + 1;
    char *body = malloc(n);
    cr_assert_not_null(body);
    expect_list_fails(body, n, 0, SF_ERR_LIMIT, "limit");
    free(body);
}

/* ------------------------------------------------------------------ hostile and broken input */

Test(xml, doctype_with_entities_rejected)
{
    const char *laughs =
        DECL "<!DOCTYPE lolz [<!ENTITY lol \"lol\">"
             "<!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">"
             "<!ENTITY lol3 \"&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;\">]>"
             "<ListBucketResult><Contents><Key>&lol3;</Key></Contents></ListBucketResult>";
    expect_parse_fails(laughs, SF_ERR_PARSE, "DOCTYPE");

    const char *xxe = DECL "<!DOCTYPE r [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>"
                           "<Error><Code>&x;</Code></Error>";
    struct sf__s3_error e;
    cr_expect_eq(sf__xml_parse_error(xxe, strlen(xxe), &e), SF_ERR_PARSE);
    cr_expect_str_eq(e.code, "");

    const char *bare_doctype = "<!DOCTYPE ListBucketResult><ListBucketResult/>";
    expect_parse_fails(bare_doctype, SF_ERR_PARSE, "DOCTYPE");
}

Test(xml, undefined_entity_is_parse_error)
{
    const char *body = "<ListBucketResult><Contents><Key>&nope;</Key></Contents>"
                       "</ListBucketResult>";
    expect_parse_fails(body, SF_ERR_PARSE, "entity");
}

Test(xml, malformed_xml_has_a_message_with_position)
{
    const char *unclosed = LBR_OPEN "<Contents><Key>a</Key>";
    expect_parse_fails(unclosed, SF_ERR_PARSE, "malformed XML at line");
    const char *mismatched = "<ListBucketResult>\n<Contents></Key></ListBucketResult>";
    expect_parse_fails(mismatched, SF_ERR_PARSE, "line 2");
    const char *junk = "<ListBucketResult/><x/>";
    expect_parse_fails(junk, SF_ERR_PARSE, "malformed");
    expect_list_fails("Not Found", 9, 0, SF_ERR_PARSE, "malformed");
    expect_list_fails("", 0, 0, SF_ERR_PARSE, "malformed");
    expect_list_fails(NULL, 0, 0, SF_ERR_PARSE, "malformed");
    const char *element_in_key = "<ListBucketResult><Contents><Key>a<b/>c</Key></Contents>"
                                 "</ListBucketResult>";
    expect_parse_fails(element_in_key, SF_ERR_PARSE, "inside <Key>");
}

Test(xml, wrong_root_rejected)
{
    const char *html = "<html><body>502 Bad Gateway</body></html>";
    expect_parse_fails(html, SF_ERR_PARSE, "expected <ListBucketResult>, found");
    const char *buckets = "<ListAllMyBucketsResult/>";
    expect_parse_fails(buckets, SF_ERR_PARSE, "ListAllMyBucketsResult");
}

Test(xml, error_body_where_a_listing_was_expected)
{
    const char *body = DECL "<Error><Code>NoSuchBucket</Code>"
                            "<Message>The specified bucket does not exist</Message></Error>";
    expect_parse_fails(body, SF_ERR_PARSE, "NoSuchBucket");
}

Test(xml, null_arguments)
{
    struct sf__list_page p;
    char err[64];
    cr_expect_eq(sf__xml_parse_list_v2("<a/>", 4, 0, NULL, err, sizeof err),
                 SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__xml_parse_list_v2(NULL, 4, 0, &p, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    sf__list_page_free(&p);
    cr_expect_eq(sf__xml_parse_error("<a/>", 4, NULL), SF_ERR_INVALID_ARGUMENT);
    /* err is optional. */
    cr_expect_eq(sf__xml_parse_list_v2("x", 1, 0, &p, NULL, 0), SF_ERR_PARSE);
    sf__list_page_free(&p);
}

/* ------------------------------------------------------------------ error bodies */

Test(xml, error_body_all_fields)
{
    const char *body = DECL "<Error><Code>NoSuchKey</Code>"
                            "<Message>The specified key does not exist.</Message>"
                            "<Key> train/0001 &amp; more.tar</Key><BucketName>data</BucketName>"
                            "<Resource>/data/train/0001 &amp; more.tar</Resource>"
                            "<RequestId>4442587FB7D0A2F9</RequestId>"
                            "<HostId>aGVsbG8=</HostId></Error>";
    struct sf__s3_error e;
    cr_assert_eq(sf__xml_parse_error(body, strlen(body), &e), SF_OK);
    cr_expect_str_eq(e.code, "NoSuchKey");
    cr_expect_str_eq(e.message, "The specified key does not exist.");
    cr_expect_str_eq(e.key, " train/0001 & more.tar", "keys are not trimmed");
    cr_expect_str_eq(e.bucket, "data");
    cr_expect_str_eq(e.request_id, "4442587FB7D0A2F9");
    cr_expect_str_eq(e.host_id, "aGVsbG8=");
}

Test(xml, error_body_without_request_id)
{
    /* Minimal, with a namespace and whitespace (some S3-compatibles). */
    const char *body = "<Error xmlns=\"" XMLNS "\">\n  <Code> SlowDown </Code>\n"
                       "  <Message>Please reduce your request rate.</Message>\n</Error>\n";
    struct sf__s3_error e;
    memset(&e, 'x', sizeof e);
    cr_assert_eq(sf__xml_parse_error(body, strlen(body), &e), SF_OK);
    cr_expect_str_eq(e.code, "SlowDown");
    cr_expect_str_eq(e.message, "Please reduce your request rate.");
    cr_expect_str_eq(e.request_id, "");
    cr_expect_str_eq(e.host_id, "");
    cr_expect_str_eq(e.key, "");
    cr_expect_str_eq(e.bucket, "");
}

Test(xml, error_body_extra_elements_ignored)
{
    /* As the mock answers SignatureDoesNotMatch: nested extras, a nested
     * <Code> that is not the error code. */
    const char *body = "<Error><Code>SignatureDoesNotMatch</Code><Message>m</Message>"
                       "<CanonicalRequest>GET\n/\n</CanonicalRequest>"
                       "<Detail><Code>inner</Code></Detail>"
                       "<StringToSign>AWS4-HMAC-SHA256</StringToSign></Error>";
    struct sf__s3_error e;
    cr_assert_eq(sf__xml_parse_error(body, strlen(body), &e), SF_OK);
    cr_expect_str_eq(e.code, "SignatureDoesNotMatch");
}

Test(xml, error_body_long_fields_truncated_on_utf8_boundary)
{
    /* 300 bytes of two-byte characters into a 256-byte field: 255 bytes
     * would split a character, so 254 are kept. */
    char msg[400] = "";
    for (int i = 0; i < 150; i++)
        strcat(msg, "\xc3\xa9");
    char body[600];
    snprintf(body, sizeof body, "<Error><Code>X</Code><Message>%s</Message></Error>", msg);
    struct sf__s3_error e;
    cr_assert_eq(sf__xml_parse_error(body, strlen(body), &e), SF_OK);
    cr_expect_eq(strlen(e.message), 254);
    cr_expect_eq(memcmp(e.message, msg, 254), 0);

    /* Over the per-element text cap too: still truncated, not refused. */
    size_t n = 100000;
    char *big = malloc(n + 100);
    cr_assert_not_null(big);
    int at = snprintf(big, 100, "<Error><Code>Big</Code><Message>");
    memset(big + at, 'm', n);
    strcpy(big + at + n, "</Message></Error>");
    cr_assert_eq(sf__xml_parse_error(big, strlen(big), &e), SF_OK);
    cr_expect_str_eq(e.code, "Big");
    cr_expect_eq(strlen(e.message), sizeof e.message - 1);
    free(big);
}

Test(xml, not_an_error_body)
{
    struct sf__s3_error e;
    const char *cases[] = {
        "<Error><Message>no code</Message></Error>",
        "<Error><Code></Code></Error>",
        "<ListBucketResult/>",
        "<Error><Code>X</Code>",
        "<html>Service Unavailable</html>",
        "Service Unavailable",
        "",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&e, 'x', sizeof e);
        cr_expect_eq(sf__xml_parse_error(cases[i], strlen(cases[i]), &e), SF_ERR_PARSE,
                     "case %zu accepted", i);
        cr_expect_str_eq(e.code, "", "case %zu: *out zeroed", i);
        cr_expect_str_eq(e.message, "", "case %zu: *out zeroed", i);
    }
}

/* ------------------------------------------------------------------ ListBuckets */

Test(xml, list_all_my_buckets)
{
    const char *body = DECL "<ListAllMyBucketsResult xmlns=\"" XMLNS "\">"
                            "<Owner><ID>mock</ID><DisplayName>mock</DisplayName></Owner>"
                            "<Buckets>"
                            "<Bucket><Name>alpha</Name>"
                            "<CreationDate>2006-02-03T16:45:09.000Z</CreationDate></Bucket>"
                            "<Bucket><Name>beta&amp;co</Name>"
                            "<CreationDate>1970-01-01T00:00:00.000Z</CreationDate></Bucket>"
                            "</Buckets></ListAllMyBucketsResult>";
    struct sf__list_page p;
    char err[256] = "";
    cr_assert_eq(sf__xml_parse_list_buckets(body, strlen(body), &p, err, sizeof err), SF_OK, "%s",
                 err);
    cr_assert_eq(p.n_entries, 2);
    cr_expect_str_eq(p.entries[0].key, "alpha");
    cr_expect_eq(p.entries[0].last_modified, 1138985109);
    cr_expect_eq(p.entries[0].size, 0);
    cr_expect_str_eq(p.entries[1].key, "beta&co");
    cr_expect_eq(p.entries[1].last_modified, 0);
    cr_expect_eq(p.n_prefixes, 0);
    cr_expect_eq(p.is_truncated, 0);
    cr_expect_null(p.next_token);
    sf__list_page_free(&p);
}

Test(xml, list_buckets_paginated_and_broken)
{
    const char *paged = "<ListAllMyBucketsResult><Buckets><Bucket><Name>a</Name></Bucket>"
                        "</Buckets><ContinuationToken>next-page</ContinuationToken>"
                        "</ListAllMyBucketsResult>";
    struct sf__list_page p;
    char err[256] = "";
    cr_assert_eq(sf__xml_parse_list_buckets(paged, strlen(paged), &p, err, sizeof err), SF_OK);
    cr_expect_eq(p.n_entries, 1);
    cr_expect_eq(p.is_truncated, 1);
    cr_expect_str_eq(p.next_token, "next-page");
    sf__list_page_free(&p);

    const char *no_name = "<ListAllMyBucketsResult><Buckets><Bucket><CreationDate>"
                          "2006-02-03T16:45:09.000Z</CreationDate></Bucket></Buckets>"
                          "</ListAllMyBucketsResult>";
    cr_expect_eq(sf__xml_parse_list_buckets(no_name, strlen(no_name), &p, err, sizeof err),
                 SF_ERR_PARSE);
    cr_expect(strstr(err, "no <Name>") != NULL, "%s", err);
    sf__list_page_free(&p);

    const char *v2 = LBR_OPEN LBR_CLOSE;
    cr_expect_eq(sf__xml_parse_list_buckets(v2, strlen(v2), &p, err, sizeof err), SF_ERR_PARSE);
    cr_expect(strstr(err, "expected <ListAllMyBucketsResult>") != NULL, "%s", err);
    sf__list_page_free(&p);
}

/* ------------------------------------------------------------------ ISO 8601 */

Test(xml, iso8601_valid)
{
    expect_date("2009-10-12T17:50:30.000Z", 1255369830);
    expect_date("2009-10-12T17:50:30Z", 1255369830);
    expect_date("2009-10-12T17:50:30.5Z", 1255369830);
    expect_date("2009-10-12T17:50:30.123456789Z", 1255369830);
    expect_date("1970-01-01T00:00:00.000Z", 0);
    expect_date("1969-12-31T23:59:59Z", -1);
    expect_date("2000-02-29T23:59:59Z", 951868799);    /* divisible by 400: leap */
    expect_date("2038-01-19T03:14:08Z", 2147483648LL); /* past 32-bit time_t */
    expect_date("9999-12-31T23:59:59Z", 253402300799LL);
    expect_date("1600-03-01T00:00:00Z", -11670912000LL);
}

Test(xml, iso8601_invalid)
{
    expect_bad_date("");
    expect_bad_date("2009-10-12");
    expect_bad_date("2009-10-12T17:50:30");       /* no Z */
    expect_bad_date("2009-10-12T17:50:30.000");   /* no Z */
    expect_bad_date("2009-10-12T17:50:30.Z");     /* empty fraction */
    expect_bad_date("2009-10-12T17:50:30+00:00"); /* offsets are not S3's */
    expect_bad_date("2009-10-12 17:50:30Z");
    expect_bad_date("2009-10-12t17:50:30Z");
    expect_bad_date("2009-10-12T17:50:30ZZ");
    expect_bad_date("2009-10-12T17:50:30.000Z ");
    expect_bad_date(" 2009-10-12T17:50:30Z");
    expect_bad_date("2009-1-12T17:50:30Z");
    expect_bad_date("209a-10-12T17:50:30Z");
    expect_bad_date("2009-13-12T17:50:30Z");
    expect_bad_date("2009-00-12T17:50:30Z");
    expect_bad_date("2009-10-00T17:50:30Z");
    expect_bad_date("2009-10-32T17:50:30Z");
    expect_bad_date("2009-04-31T17:50:30Z");
    expect_bad_date("2001-02-29T00:00:00Z"); /* not a leap year */
    expect_bad_date("1900-02-29T00:00:00Z"); /* divisible by 100: not leap */
    expect_bad_date("2009-10-12T24:00:00Z");
    expect_bad_date("2009-10-12T23:60:00Z");
    expect_bad_date("2009-10-12T23:59:60Z");
    expect_bad_date("2009-10-12T-1:59:59Z");
    int64_t t;
    cr_expect_eq(sf__parse_iso8601(NULL, &t), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf__parse_iso8601("2009-10-12T17:50:30Z", NULL), SF_ERR_INVALID_ARGUMENT);
}

Test(xml, multipart_initiate_and_complete_bodies)
{
    char id[64], err[256];
    const char *init = "<?xml version=\"1.0\"?><InitiateMultipartUploadResult xmlns=\"x\">"
                       "<Bucket>b</Bucket><Key>k</Key><UploadId> abc.DEF-1 </UploadId>"
                       "</InitiateMultipartUploadResult>";
    cr_assert_eq(sf__xml_parse_initiate(init, strlen(init), id, sizeof(id), err, sizeof(err)),
                 SF_OK, "%s", err);
    cr_expect_str_eq(id, "abc.DEF-1");
    const char *none =
        "<InitiateMultipartUploadResult><Key>k</Key></InitiateMultipartUploadResult>";
    cr_expect_eq(sf__xml_parse_initiate(none, strlen(none), id, sizeof(id), err, sizeof(err)),
                 SF_ERR_PARSE);
    cr_expect_str_eq(id, "");
    const char *other = "<Error><Code>NoSuchBucket</Code></Error>";
    cr_expect_eq(sf__xml_parse_initiate(other, strlen(other), id, sizeof(id), err, sizeof(err)),
                 SF_ERR_PARSE);
    cr_expect_eq(sf__xml_parse_initiate(init, strlen(init), id, 4, err, sizeof(err)), SF_ERR_LIMIT);

    const char *list = "<CompleteMultipartUpload xmlns=\"x\"><Part><PartNumber>1</PartNumber>"
                       "<ETag>&quot;aa&quot;</ETag><ChecksumCRC32>x</ChecksumCRC32></Part>"
                       "<Part><ETag>\"bb\"</ETag><PartNumber> 7 </PartNumber></Part>"
                       "</CompleteMultipartUpload>";
    struct sf__xml_part *parts = NULL;
    size_t n = 0;
    cr_assert_eq(sf__xml_parse_complete(list, strlen(list), 0, &parts, &n, err, sizeof(err)), SF_OK,
                 "%s", err);
    cr_assert_eq(n, 2);
    cr_expect_eq(parts[0].number, 1);
    cr_expect_str_eq(parts[0].etag, "\"aa\"");
    cr_expect_eq(parts[1].number, 7);
    cr_expect_str_eq(parts[1].etag, "\"bb\"");
    free(parts);
    cr_expect_eq(sf__xml_parse_complete(list, strlen(list), 1, &parts, &n, err, sizeof(err)),
                 SF_ERR_LIMIT);
    cr_expect_null(parts);
    const char *no_etag = "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part>"
                          "</CompleteMultipartUpload>";
    cr_expect_eq(sf__xml_parse_complete(no_etag, strlen(no_etag), 0, &parts, &n, err, sizeof(err)),
                 SF_ERR_PARSE);
    cr_expect(strstr(err, "ETag"), "%s", err);
    const char *bad_num = "<CompleteMultipartUpload><Part><PartNumber>x1</PartNumber><ETag>e"
                          "</ETag></Part></CompleteMultipartUpload>";
    cr_expect_eq(sf__xml_parse_complete(bad_num, strlen(bad_num), 0, &parts, &n, err, sizeof(err)),
                 SF_ERR_PARSE);
}
