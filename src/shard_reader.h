/* Shard readers, internal side: what the tar and record readers share, and
 * the dispatcher behind the public sf_shard_reader (include/shardfeed_shard.h). */
#ifndef SF_SRC_SHARD_READER_H
#define SF_SRC_SHARD_READER_H

#include "shardfeed.h"
#include "shardfeed_shard.h"

#include <stddef.h>
#include <stdint.h>

/* The bytes a reader may look at during one call: [0, avail) of base are
 * final; total is the shard size or SF_SIZE_UNKNOWN. */
struct sf__shard_input {
    const unsigned char *base;
    uint64_t avail;
    uint64_t total;
};

/* Error, progress and counters every reader keeps. */
struct sf__shard_common {
    const char *name;    /* shard name for messages; owned by whoever made the reader */
    char err[512];       /* "" while no failure */
    uint64_t err_offset; /* SF_SIZE_UNKNOWN while no failure */
    sf_status err_status;
    uint64_t wanted; /* contiguous bytes needed for the next step */
    struct sf_shard_stats stats;
};

void sf__shard_common_init(struct sf__shard_common *c, const char *name);
/* Records a failure once (the first one sticks) as "<name>: offset N: <msg>"
 * and returns the sticky status. */
sf_status sf__shard_fail(struct sf__shard_common *c, sf_status st, uint64_t offset, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));

/* Result of asking for the shard bytes [start, start + len). */
enum sf__shard_need { SF__SHARD_HAVE, SF__SHARD_NEED, SF__SHARD_PAST_END };
/* HAVE when the bytes are in in; PAST_END when they run past the shard's
 * known size (or overflow); otherwise NEED, with c->wanted set to their end. */
enum sf__shard_need sf__shard_need(struct sf__shard_common *c, const struct sf__shard_input *in,
                                   uint64_t start, uint64_t len);
/* The same for a reader whose only answer to PAST_END is a truncation error:
 * 1 when the bytes are in; 0 when they are not, either waiting (NEED) or
 * after recording the failure fmt at offset fail_at (PAST_END). On 0 the
 * caller returns c->err_status (SF_OK while it waits). */
int sf__shard_have(struct sf__shard_common *c, const struct sf__shard_input *in, uint64_t start,
                   uint64_t len, uint64_t fail_at, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Builds one sample's field table and its strings (key, field names) in
 * memory that is reused from sample to sample. Field data is kept as an
 * offset from a base given at emit time, because the shard buffer may move
 * between feeds while a sample is being collected. */
struct sf__sample_builder {
    struct sf_sample_field *fields;
    size_t *name_at;    /* offset of each field's name in strings */
    uint64_t *data_rel; /* offset of each field's data from the emit base */
    size_t count, cap;
    char *strings;
    size_t str_len, str_cap;
    size_t key_len; /* the key is at strings[0] */
};

void sf__sample_builder_free(struct sf__sample_builder *b);
/* Starts a sample; key is copied (key_len bytes, no NUL needed). */
sf_status sf__sample_builder_start(struct sf__sample_builder *b, const char *key, size_t key_len);
/* 1 when the current key is key[0, key_len). */
int sf__sample_builder_key_is(const struct sf__sample_builder *b, const char *key, size_t key_len);
/* Appends a field; its name is copied, lower-cased when lower is 1. The data
 * will be base + data_rel at emit time; offset is its place in the shard.
 * Returns SF_ERR_NO_MEMORY only; limits are the caller's. */
sf_status sf__sample_builder_add(struct sf__sample_builder *b, const char *name, size_t name_len,
                                 int lower, uint64_t data_rel, size_t size, uint64_t offset);
/* 1 when a field named name (lower-cased first when lower is 1) exists. */
int sf__sample_builder_has(const struct sf__sample_builder *b, const char *name, size_t name_len,
                           int lower);
/* Fills out's key and fields (pointers into b valid until the next start;
 * data = base + data_rel). Leaves index, offset, end and reader_owned alone. */
void sf__sample_builder_emit(struct sf__sample_builder *b, const unsigned char *base,
                             struct sf_sample *out);

/* The lowest shard offset the reader may read on a later call: bytes before
 * it can be dropped by a caller that streams the shard through a window
 * (sf_index_shards()). 0 until the format is known. Tar member data does not
 * count: the reader only points at it. After SF_SHARD_NEED_MORE, the next
 * call reads within [keep_from, sf_shard_reader_wanted()). */
uint64_t sf__shard_reader_keep_from(const struct sf_shard_reader *r);

/* 1 when name (an object key or a path) names a shard file: longer than
 * ".tar" and ending in .tar or .sfr. A listing keeps these and leaves out
 * what lies beside them (index.json). */
int sf__shard_file_name(const char *name);

/* 1 when a source is a listing, whose shards (sf__shard_file_name) are
 * sources while the files beside them are not: a URL or path ending in '/',
 * or a local folder named without it. The loader and warm-cache share it. */
int sf__source_is_listing(const char *source);

/* Decides the format from the first bytes (n of them, total the shard size or
 * SF_SIZE_UNKNOWN) and the name. Returns SF_SHARD_FORMAT_AUTO while more
 * bytes are needed. */
enum sf_shard_format sf__shard_detect(const unsigned char *p, uint64_t n, uint64_t total,
                                      const char *name);

#endif
