/* The public shard reader fed a shard in random increments, each feed in a
 * fresh exact-size copy of the prefix (so a field pointing past the bytes
 * fed is a heap overflow ASan reports, and a pointer kept across feeds is a
 * use after free), checking what must hold for every sample. Shared by the
 * tar and record harnesses. */
#ifndef SF_TESTS_FUZZ_SHARD_FEED_H
#define SF_TESTS_FUZZ_SHARD_FEED_H

#include "fuzz.h"
#include "shardfeed_shard.h"

/* flags: bit 0 the size is known from the first feed (else only with the
 * last), bit 1 require_end_marker, bit 2 skip_checksums, bit 3 small steps
 * (1..64 bytes; else 1..4096). */
static inline void fz_feed_shard(const uint8_t *data, size_t len, enum sf_shard_format format,
                                 unsigned flags, uint64_t seed)
{
    struct sf_shard_reader_options o;
    sf_shard_reader_options_init_default(&o);
    o.name = "fuzz";
    o.format = format;
    o.require_end_marker = (flags >> 1) & 1;
    o.skip_checksums = (flags >> 2) & 1;
    o.max_record_bytes = 1u << 20; /* libFuzzer's memory limit, not the reader's */
    o.zstd_window_log_max = 20;
    o.max_pax_bytes = 1u << 16;
    struct sf_shard_reader *r = NULL;
    char err[256];
    fz_check(sf_shard_reader_new(&o, &r, err, sizeof err) == SF_OK, "new: %s", err);
    const int known_early = flags & 1;
    const size_t max_step = (flags & 8) ? 64 : 4096;
    size_t fed = 0;
    int fed_once = 0;
    unsigned char *buf = NULL;
    uint64_t next_index = 0, last_end = 0;
    for (unsigned long iter = 0;; iter++) {
        fz_check(iter < 10u * 1000 * 1000, "the reader does not terminate");
        struct sf_sample s;
        enum sf_shard_event ev;
        sf_status st = sf_shard_reader_next(r, &s, &ev);
        if (st != SF_OK) {
            fz_check(sf_shard_reader_errmsg(r)[0] != '\0', "a failure without a message");
            fz_check(sf_shard_reader_next(r, &s, &ev) == st, "a failure that is not sticky");
            break;
        }
        if (ev == SF_SHARD_END) {
            fz_check(sf_shard_reader_next(r, &s, &ev) == SF_OK && ev == SF_SHARD_END,
                     "END does not stay");
            break;
        }
        if (ev == SF_SHARD_SAMPLE) {
            fz_check(s.index == next_index, "sample index %llu, want %llu",
                     (unsigned long long)s.index, (unsigned long long)next_index);
            next_index++;
            fz_check(s.offset < s.end && s.end <= fed,
                     "sample [%llu, %llu) outside the %zu bytes fed", (unsigned long long)s.offset,
                     (unsigned long long)s.end, fed);
            fz_check(s.offset >= last_end, "samples overlap");
            last_end = s.end;
            fz_check(s.key && strlen(s.key) == s.key_len, "key length");
            unsigned sum = 0;
            for (size_t i = 0; i < s.field_count; i++) {
                const struct sf_sample_field *f = &s.fields[i];
                fz_check(f->name && strlen(f->name) == f->name_len, "field name length");
                fz_check(f->size == 0 || f->data != NULL, "field without data");
                if (!s.reader_owned) {
                    fz_check(f->offset + f->size <= fed,
                             "field [%llu, +%llu) past the %zu bytes fed",
                             (unsigned long long)f->offset, (unsigned long long)f->size, fed);
                    fz_check((const unsigned char *)f->data == buf + f->offset,
                             "field data is not a pointer into the shard");
                }
                const unsigned char *d = f->data;
                for (size_t k = 0; k < f->size; k++) /* touched: ASan checks the bounds */
                    sum += d[k];
            }
            (void)sum;
            continue;
        }
        fz_check(ev == SF_SHARD_NEED_MORE, "unknown event %d", (int)ev);
        fz_check(!fed_once || fed < len, "NEED_MORE after all %zu bytes were fed", len);
        unsigned long long wanted = sf_shard_reader_wanted(r);
        fz_check(!fed_once || wanted > fed, "wanted %llu <= fed %zu", wanted, fed);
        size_t step = 1 + (size_t)(fz_rng(&seed) % max_step);
        if (fz_rng(&seed) % 4 == 0 && wanted > fed && wanted - fed < len)
            step = (size_t)(wanted - fed);
        if (step > len - fed)
            step = len - fed;
        fed += step;
        fed_once = 1;
        unsigned char *c = fz_copy(data, fed, 0);
        unsigned long long total = known_early || fed == len ? len : SF_SIZE_UNKNOWN;
        fz_check(sf_shard_reader_feed(r, c, fed, total) == SF_OK, "feed refused: %s",
                 sf_shard_reader_errmsg(r));
        free(buf);
        buf = c;
    }
    struct sf_shard_stats stats;
    sf_shard_reader_stats(r, &stats);
    fz_check(stats.samples == next_index, "stats.samples %llu, %llu returned",
             (unsigned long long)stats.samples, (unsigned long long)next_index);
    sf_shard_reader_destroy(r);
    free(buf);
}

#endif
