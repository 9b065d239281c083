/* The mock's aws-chunked body decoder (mock_server/chunked.c): what any
 * client sends as Content-Encoding: aws-chunked. Input: a flags byte (its
 * low two bits pick the form: unsigned with trailers, signed, signed with
 * trailers; the rest seeds the sizes of the pieces fed), then the body, fed
 * in pieces of 1..64 bytes. Signed forms check against a fixed key and seed
 * signature, so their chunks are refused at the first signature; the
 * framing before it is what they reach. */
#include "fuzz.h"
#include "mock_server/chunked.h"

struct sink {
    uint64_t bytes;
};

static int sink_cb(void *cls, const char *data, size_t n)
{
    (void)data;
    ((struct sink *)cls)->bytes += n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    const uint8_t flags = fz_u8(&f);
    static const enum mock_chunked_mode modes[] = {
        MOCK_CHUNKED_UNSIGNED_TRAILER, MOCK_CHUNKED_SIGNED, MOCK_CHUNKED_SIGNED_TRAILER,
        MOCK_CHUNKED_UNSIGNED_TRAILER};
    struct sf__sigv4_signer signer;
    sf__sigv4_signer_init(&signer, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                          NULL, "us-east-1", "s3");
    struct sink out = {0};
    struct mock_chunked_config cfg = {
        .mode = modes[flags & 3],
        .sink = sink_cb,
        .sink_cls = &out,
        .signer = &signer,
        .amz_date = "20130524T000000Z",
        .scope_date = "20130524",
        .region = "us-east-1",
        .service = "s3",
        .seed_signature = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"};
    struct mock_chunked *c = mock_chunked_new(&cfg);
    fz_check(c != NULL, "out of memory");
    unsigned step = flags >> 2;
    int rc = 0;
    size_t fed = 0;
    while (f.n && rc == 0) {
        size_t n = 1 + (step = step * 33 + 7) % 64;
        if (n > f.n)
            n = f.n;
        /* an exact-size copy: a read past the piece is an ASan error */
        unsigned char *piece = fz_copy(f.p, n, 0);
        rc = mock_chunked_feed(c, (const char *)piece, n);
        free(piece);
        f.p += n;
        f.n -= n;
        fed += n;
    }
    if (rc == 0)
        rc = mock_chunked_finish(c);
    fz_check(out.bytes <= fed, "decoded more bytes (%llu) than were fed (%zu)",
             (unsigned long long)out.bytes, fed);
    fz_check(mock_chunked_decoded_bytes(c) == out.bytes, "decoded count and sink disagree");
    if (rc != 0) {
        int status = 0;
        const char *code = NULL, *message = NULL;
        mock_chunked_error(c, &status, &code, &message);
        fz_check(status >= 400 && status < 600 && code && *code && message && *message,
                 "a refusal without a status, code and message");
        fz_check(mock_chunked_feed(c, "0\r\n", 3) == -1, "fed again after a refusal");
    } else {
        size_t n = 0;
        const struct mock_trailer *t = mock_chunked_trailers(c, &n);
        fz_check(n <= MOCK_CHUNKED_MAX_TRAILERS, "too many trailers");
        for (size_t i = 0; i < n; i++)
            fz_check(t[i].name && t[i].value, "a trailer without a name or value");
    }
    mock_chunked_destroy(c);
    sf__sigv4_signer_destroy(&signer);
    return 0;
}
