/* Record shards (src/record.c): the sequential reader through the public
 * reader in random increments, then the index from the tail (at the sizes
 * the reader asks for) and random access to every record it lists, each
 * from an exact-size copy. Input: flags byte, 8-byte seed, the shard. */
#include "shard_feed.h"
#include "src/record.h"

static void by_index(const uint8_t *d, size_t n, unsigned flags)
{
    uint64_t tail = n < 256 ? n : 256;
    struct sf__record_index *idx = NULL;
    char err[256];
    uint64_t need = 0;
    for (int tries = 0; tries < 3; tries++) {
        unsigned char *c = fz_copy(d + (n - tail), (size_t)tail, 0);
        sf_status st =
            sf__record_index_from_tail(c, (size_t)tail, n, "fuzz", &idx, &need, err, sizeof err);
        free(c);
        if (st == SF_OK)
            break;
        fz_check(idx == NULL, "an index on failure");
        fz_check(err[0] != '\0', "a failure without a message");
        if (st != SF_ERR_RANGE)
            return;
        fz_check(need > tail, "asks for a tail of %llu after %llu", (unsigned long long)need,
                 (unsigned long long)tail);
        if (need > n)
            return;
        tail = need;
    }
    if (!idx)
        return;
    struct sf__record_reader_options o = {.max_record_bytes = 1u << 20,
                                          .zstd_window_log_max = 20,
                                          .skip_checksums = (flags >> 2) & 1};
    struct sf__record_reader *rr = NULL;
    fz_check(sf__record_reader_new(&o, "fuzz", &rr) == SF_OK, "reader");
    uint64_t count = sf__record_index_count(idx);
    for (uint64_t i = 0; i < count && i < 256; i++) {
        uint64_t off = 0, bytes = 0;
        fz_check(sf__record_index_entry(idx, i, &off, &bytes) == SF_OK, "entry %llu",
                 (unsigned long long)i);
        fz_check(off <= n && bytes <= n - off, "entry %llu [%llu, +%llu) outside the %zu bytes",
                 (unsigned long long)i, (unsigned long long)off, (unsigned long long)bytes, n);
        unsigned char *c = fz_copy(d + off, (size_t)bytes, 0);
        struct sf_sample s;
        if (sf__record_reader_decode(rr, c, (size_t)bytes, off, i, &s) == SF_OK) {
            unsigned sum = 0;
            for (size_t k = 0; k < s.field_count; k++) {
                const unsigned char *p = s.fields[k].data;
                for (size_t j = 0; j < s.fields[k].size; j++)
                    sum += p[j];
            }
            (void)sum;
        } else {
            fz_check(sf__record_reader_errmsg(rr)[0] != '\0', "a failure without a message");
        }
        free(c);
    }
    fz_check(sf__record_index_entry(idx, count, &(uint64_t){0}, &(uint64_t){0}) ==
                 SF_ERR_INVALID_ARGUMENT,
             "entry past the count");
    sf__record_reader_destroy(rr);
    sf__record_index_destroy(idx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz f = {data, size};
    unsigned flags = fz_u8(&f);
    uint64_t seed = fz_u64(&f);
    fz_feed_shard(f.p, f.n, (flags & 16) ? SF_SHARD_FORMAT_AUTO : SF_SHARD_FORMAT_RECORD, flags,
                  seed);
    by_index(f.p, f.n, flags);
    return 0;
}
