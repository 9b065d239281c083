/*
 * shardfeed — shard readers: samples out of tar (WebDataset) and record shards.
 *
 * A shard reader parses one shard as its bytes arrive. The caller owns the
 * shard buffer and tells the reader, with sf_shard_reader_feed(), how many
 * leading bytes of it are final; sf_shard_reader_next() then returns samples
 * whose fields point into that buffer (no copies), or says it needs more
 * bytes, or that the shard ended. Formats: docs/FORMAT.md.
 *
 * This header includes shardfeed.h (for sf_status and SF_SIZE_UNKNOWN); when
 * shardfeed.h includes it in turn, it must do so after those declarations.
 *
 * Thread safety: a reader belongs to one thread at a time (no internal
 * locking); different readers are independent. Functions without a handle
 * may be called from any thread. The reader handle may not be NULL, except
 * for sf_shard_reader_destroy().
 */
#ifndef SHARDFEED_SHARD_H
#define SHARDFEED_SHARD_H

#include "shardfeed/common.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Shard formats. */
enum sf_shard_format {
    SF_SHARD_FORMAT_AUTO = 0,   /* decide from the first bytes (record magic, else tar) */
    SF_SHARD_FORMAT_TAR = 1,    /* ustar / GNU / pax tar, WebDataset grouping */
    SF_SHARD_FORMAT_RECORD = 2, /* shardfeed record shard (docs/FORMAT.md) */
};

/* One field of a sample: the bytes of one tar member, or one named field of a
 * record. */
struct sf_sample_field {
    /* Field name, NUL-terminated: for tar the member name after the key's dot,
     * lower-cased ("jpg", "seg.png"); for records the name as written. Owned by
     * the reader, valid until the next sf_shard_reader_next() or _destroy(). */
    const char *name;
    size_t name_len;
    /* The field's bytes. Points into the caller's shard buffer (the base given
     * to the sf_shard_reader_feed() call before the sf_shard_reader_next()
     * that returned it), unless the sample's reader_owned is 1. Not
     * NUL-terminated. Non-NULL even when size is 0. */
    const void *data;
    size_t size;
    /* Byte offset of data in the shard; for a compressed record, the offset
     * of the record. */
    unsigned long long offset;
};

/* One sample: a key and its fields, in shard order. */
struct sf_sample {
    /* Sample key, NUL-terminated: for tar the member path up to the first '.'
     * of its base name ("train/000123"). Owned by the reader, valid until the
     * next sf_shard_reader_next() or _destroy(). */
    const char *key;
    size_t key_len;
    /* field_count fields, owned by the reader, valid as key is. Field names
     * within one sample are unique. */
    const struct sf_sample_field *fields;
    size_t field_count;
    unsigned long long index;  /* 0-based number of the sample in the shard */
    unsigned long long offset; /* first byte of the sample (its first header or record) */
    unsigned long long end;    /* one past the sample's last byte (data or padding) */
    /* 1 when the field bytes live in memory owned by the reader (a zstd
     * record, decompressed): valid until the next sf_shard_reader_next() or
     * _destroy(); copy them out to keep them longer. 0 when they point into
     * the caller's shard buffer and live as long as the caller keeps it. */
    int reader_owned;
};

/* What sf_shard_reader_next() produced. */
enum sf_shard_event {
    SF_SHARD_SAMPLE = 1,    /* *sample is filled */
    SF_SHARD_NEED_MORE = 2, /* feed more bytes (see sf_shard_reader_wanted()) and call again */
    SF_SHARD_END = 3,       /* the shard ended cleanly; every later call says SF_SHARD_END */
};

/*
 * Options of a shard reader. A zeroed struct means "all defaults" (what
 * sf_shard_reader_options_init_default() sets); 0 in any field means that
 * field's default.
 */
struct sf_shard_reader_options {
    const char *name;                    /* shard name for messages ("s3://b/train-000001.tar");
                                            copied; NULL: "shard". A name ending in .tar or .sfr
                                            only matters for shards shorter than 8 bytes. */
    enum sf_shard_format format;         /* default SF_SHARD_FORMAT_AUTO */
    size_t max_name_bytes;               /* member path (GNU long name, pax path), sample key and
                                            field name cap; default 4096; SF_ERR_LIMIT beyond */
    size_t max_pax_bytes;                /* data of one pax header ('x' or 'g'); default 1 MiB */
    size_t max_fields;                   /* fields per sample; default 1024 */
    unsigned long long max_record_bytes; /* a record's stored and decompressed body;
                                            default 1 GiB */
    unsigned zstd_window_log_max;        /* zstd frames needing a larger window are
                                            refused (SF_ERR_LIMIT); default 27 (128 MiB) */
    int require_end_marker;              /* 1: a tar shard that ends after a complete member
                                            without the two zero blocks is SF_ERR_CORRUPT;
                                            default 0: accepted and counted */
    int skip_checksums;                  /* 1: do not verify record checksums (tar header
                                            checksums are always verified); default 0 */
};

/* Fills o with the defaults. o may not be NULL. */
SF_API void sf_shard_reader_options_init_default(struct sf_shard_reader_options *o);

/* Counters of one reader. */
struct sf_shard_stats {
    unsigned long long samples;            /* samples returned */
    unsigned long long fields;             /* fields returned */
    unsigned long long members;            /* tar headers read, meta headers included */
    unsigned long long skipped_dirs;       /* tar directories */
    unsigned long long skipped_links;      /* tar hard and symbolic links */
    unsigned long long skipped_other;      /* devices, FIFOs, sparse and unknown types */
    unsigned long long skipped_unnamed;    /* regular members without key or extension
                                              ("README", ".hidden", "a.") */
    unsigned long long records;            /* records read */
    unsigned long long decompressed_bytes; /* bytes produced by zstd */
    int missing_end_marker;                /* 1: the tar ended without two zero blocks */
    int lone_zero_block;                   /* 1: the tar ended after one zero block */
};

/* A shard reader. */
struct sf_shard_reader;

/*
 * Creates a reader for one shard. o may be NULL (all defaults). On failure
 * (SF_ERR_INVALID_ARGUMENT, SF_ERR_NO_MEMORY) *out is NULL and err, when not
 * NULL, receives a message truncated to err_len. out may not be NULL.
 */
SF_API sf_status sf_shard_reader_new(const struct sf_shard_reader_options *o,
                                     struct sf_shard_reader **out, char *err, size_t err_len);

/*
 * Tells the reader that bytes [0, contiguous_bytes) of the shard, starting at
 * base, are final. total_bytes is the shard's size, or SF_SIZE_UNKNOWN until
 * it is known; the shard is complete once contiguous_bytes == total_bytes.
 * contiguous_bytes may not decrease, total_bytes may not change once known,
 * and base must hold the same bytes as before (it may move, e.g. after a
 * realloc; samples returned earlier still point at the old place). The
 * reader copies nothing: the caller keeps the buffer alive while it uses the
 * samples. SF_ERR_INVALID_ARGUMENT when these rules are broken (the reader
 * is then failed). base may be NULL only while contiguous_bytes is 0.
 */
SF_API sf_status sf_shard_reader_feed(struct sf_shard_reader *r, const void *base,
                                      unsigned long long contiguous_bytes,
                                      unsigned long long total_bytes);

/*
 * Parses on from where it stopped. On SF_OK, *event says what happened:
 * SF_SHARD_SAMPLE with *sample filled, SF_SHARD_NEED_MORE (nothing is lost;
 * call again after the next feed) or SF_SHARD_END. A sample is returned once
 * the bytes after it (the next member's header, or the end of the shard)
 * have arrived, since only then is it known to be complete. On failure
 * (SF_ERR_CORRUPT, SF_ERR_PARSE, SF_ERR_LIMIT, SF_ERR_UNSUPPORTED for
 * compressed tars, SF_ERR_NO_MEMORY) the reader stays failed and returns the
 * same status on every later call; sf_shard_reader_errmsg() names the shard
 * and the byte offset. Neither sample nor event may be NULL.
 */
SF_API sf_status sf_shard_reader_next(struct sf_shard_reader *r, struct sf_sample *sample,
                                      enum sf_shard_event *event);

/*
 * How many contiguous bytes the reader needs before its next call can make
 * progress (after SF_SHARD_NEED_MORE), e.g. for sf_fetch_wait(). Never less
 * than what was fed plus one while it needs more; for a huge member it may
 * name an offset beyond the shard (the shard is then truncated).
 */
SF_API unsigned long long sf_shard_reader_wanted(const struct sf_shard_reader *r);

/* The format being read: SF_SHARD_FORMAT_AUTO until enough bytes arrived to
 * tell. */
SF_API enum sf_shard_format sf_shard_reader_format(const struct sf_shard_reader *r);

/* Detail of the failure ("" while none): shard name, byte offset, what was
 * wrong. Valid until sf_shard_reader_destroy(). */
SF_API const char *sf_shard_reader_errmsg(const struct sf_shard_reader *r);

/* Byte offset the failure is about (a header, a record, the truncation
 * point); SF_SIZE_UNKNOWN while there is no failure. */
SF_API unsigned long long sf_shard_reader_error_offset(const struct sf_shard_reader *r);

/* Copies the reader's counters into *out. Neither may be NULL. */
SF_API void sf_shard_reader_stats(const struct sf_shard_reader *r, struct sf_shard_stats *out);

/* Frees the reader and what it owns (keys, names, decompressed records).
 * The shard buffer is the caller's and is not touched. NULL is a no-op. */
SF_API void sf_shard_reader_destroy(struct sf_shard_reader *r);

#ifdef __cplusplus
}
#endif

#endif /* SHARDFEED_SHARD_H */
