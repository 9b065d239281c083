/* The tar suite's fixture, shared by tests/test_tar*.c (one executable):
 * the reader driven over a buffer in several feed modes with the checks
 * every sample must pass, a tar builder for hand-made archives, and the
 * expected samples. */
#ifndef SF_TEST_TAR_FIXTURE_H
#define SF_TEST_TAR_FIXTURE_H

#include "shardfeed_shard.h"
#include "support/bytes.h"
#include "support/shard_parse.h"

#include <stddef.h>
#include <stdint.h>

/* test.tar, steps up to 1500 bytes, one jump in four. */
extern const struct feed_style tar_style;
/* parse_shard in tar_style (support/shard_parse.h). */
void parse_with(const unsigned char *buf, size_t len, const struct sf_shard_reader_options *o,
                enum feed_mode mode, uint64_t seed, size_t max_step, struct parse_result *res);
/* parse_with the defaults, all at once. */
void parse(const unsigned char *buf, size_t len, struct parse_result *res);
/* The same samples, status and offset whatever the feed mode and steps. */
void expect_same_in_all_feed_modes(const unsigned char *buf, size_t len);
void fill_random(unsigned char *p, size_t n, uint64_t seed);
/* A name of len bytes: fill repeated, then suffix; malloc'd, NUL-terminated. */
char *long_name(size_t len, char fill, const char *suffix);

/* ------------------------------------------------------------ tar builder */

#define BLK 512

enum tb_magic { TB_POSIX, TB_GNU, TB_V7 };

/* Recomputes the header's checksum. */
void tb_checksum(unsigned char *h);
/* Appends a header; returns its offset. The size field is octal; callers
 * patch it for special cases and call tb_checksum again. */
size_t tb_header(struct bytes *b, const char *name, char type, uint64_t size, enum tb_magic m);
/* Appends data padded to a block. */
void tb_data(struct bytes *b, const void *d, size_t n);
/* A regular file (ustar); returns its header's offset. */
size_t tb_file(struct bytes *b, const char *name, const void *d, size_t n);
/* A GNU long name ('L', 'K') or pax ('x', 'g') member; its offset. */
size_t tb_meta(struct bytes *b, char type, const void *d, size_t n);
/* The two zero blocks. */
void tb_end(struct bytes *b);
/* tb_end, then parse of the whole archive. */
void tb_end_and_parse(struct bytes *b, struct parse_result *res);
/* A pax record with its correct length prefix. */
void pax_rec(struct bytes *b, const char *kw, const char *val, size_t val_len);
/* A pax header ('x') of the one record kw=val; its offset. */
size_t tb_pax(struct bytes *b, const char *kw, const char *val, size_t val_len);

/* ------------------------------------------------------------ expected samples */

struct want_field {
    const char *name;
    const void *data;
    size_t size;
};

struct want_sample {
    const char *key;
    size_t nf;
    struct want_field f[8];
};

/* The samples serialized as parse_result.ser is. */
void serialize_want(struct bytes *out, const struct want_sample *w, size_t n);
/* r parsed fine into exactly w. */
void expect_samples(const struct parse_result *r, const struct want_sample *w, size_t n);

#endif
