/* Test support for the shard suites (tar, record): a shard in a buffer
 * parsed with the public reader, fed at once or in random increments, with
 * the checks every sample must pass on the way; the samples come back
 * serialized (support/bytes.h) for comparison. */
#ifndef SF_TEST_SHARD_PARSE_H
#define SF_TEST_SHARD_PARSE_H

#include "shardfeed_shard.h"
#include "support/bytes.h"

#include <stddef.h>
#include <stdint.h>

enum feed_mode {
    FEED_ALL,          /* everything at once, size known */
    FEED_RANDOM,       /* random increments, size known from the start */
    FEED_RANDOM_LATE,  /* random increments, size known only at the end */
    FEED_RANDOM_MOVING /* random increments, each in a fresh copy of the prefix */
};

/* How a suite feeds: the name given when the options are NULL, the largest
 * random step when the call gives none, and how often (one in jump_one_in)
 * a step goes straight to what the reader wants. */
struct feed_style {
    const char *name;
    size_t max_step;
    unsigned jump_one_in;
};

struct parse_result {
    sf_status st;
    unsigned long long err_offset;
    char err[512];
    struct bytes ser; /* serialized samples */
    size_t samples;
    size_t owned; /* samples in the reader's memory */
    struct sf_shard_stats stats;
    enum sf_shard_format format;
    unsigned long long last_end; /* end of the last sample */
};

/* Parses buf (o NULL: defaults named style->name) fed as mode says (random
 * steps up to max_step, 0: the style's, from seed). Checks on the way:
 * zero-copy pointers into the fed bytes (or, for reader-owned samples,
 * fields at the sample's offset), offsets, sequential indexes, sticky
 * errors with a message, an end that stays. */
void parse_shard(const struct feed_style *style, const unsigned char *buf, size_t len,
                 const struct sf_shard_reader_options *o, enum feed_mode mode, uint64_t seed,
                 size_t max_step, struct parse_result *res);
void parse_result_free(struct parse_result *r);
/* r failed with want at want_offset, with frag (NULL: any) in its message. */
void expect_parse_failed(const struct parse_result *r, sf_status want,
                         unsigned long long want_offset, const char *frag);
/* buf, parsed at once with the style's name, fails as expect_parse_failed
 * says; the message starts "<name>: offset N: " (prefixed) or holds the
 * name and "offset N" (not). */
void expect_shard_error(const struct feed_style *style, const unsigned char *buf, size_t len,
                        sf_status want, unsigned long long want_offset, const char *frag,
                        int prefixed);

#endif
