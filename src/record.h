/*
 * Record shards: shardfeed's own indexed shard format (docs/FORMAT.md).
 *
 *   header (16) | record 0 | record 1 | ... | index | footer (40)
 *
 * A writer appends samples (a key and named fields) and finishes with the
 * index and footer; it writes to a file descriptor, a FILE * or a growable
 * memory buffer. A reader streams samples from a contiguous prefix, or reads
 * any record given the index (from one ranged GET of the file's tail).
 *
 * Threads: a writer or reader belongs to one thread at a time.
 */
#ifndef SF_SRC_RECORD_H
#define SF_SRC_RECORD_H

#include "shardfeed.h"
#include "src/shard_reader.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------ layout */

#define SF__RECORD_MAGIC             "\x89SFR\r\n\x1a\n" /* file header, 8 bytes */
#define SF__RECORD_FOOTER_MAGIC      "\x89SFE\r\n\x1a\n" /* last 8 bytes of the file */
#define SF__RECORD_VERSION           1u
#define SF__RECORD_HEADER_BYTES      16u
#define SF__RECORD_REC_HEADER_BYTES  40u
#define SF__RECORD_FOOTER_BYTES      40u
#define SF__RECORD_INDEX_FIXED_BYTES 24u /* index block without its entries */
#define SF__RECORD_INDEX_ENTRY_BYTES 16u
#define SF__RECORD_FIELD_DESC_BYTES  16u
#define SF__RECORD_FLAG_ZSTD         1u
/* Limits the writer enforces and the reader checks (docs/FORMAT.md). */
#define SF__RECORD_MAX_KEY_BYTES  4096u
#define SF__RECORD_MAX_NAME_BYTES 255u
#define SF__RECORD_MAX_FIELDS     65535u
/* A tail of this many bytes holds the footer and the index of shards up to
 * (65536 - 64) / 16 = 4092 records: fetch it first, then exactly what
 * sf__record_index_from_tail() asks for when the index is larger. */
#define SF__RECORD_TAIL_GUESS_BYTES 65536u

/* ------------------------------------------------------------ writer */

/* One field to write. name: NUL-terminated, 1..255 bytes, unique within the
 * sample (stored as given: pass lower-case names for WebDataset-like data).
 * data may be NULL when size is 0. */
struct sf__record_field_in {
    const char *name;
    const void *data;
    size_t size;
};

/* Where and how a writer writes. Exactly one destination: fd >= 0 (write(),
 * at the descriptor's current position; pipes work), else file != NULL
 * (fwrite(); the caller flushes and closes), else a growable memory buffer
 * (see sf__record_writer_take()). */
struct sf__record_writer_options {
    int fd; /* -1 = none */
    FILE *file;
    size_t max_memory_bytes;   /* cap of the memory buffer; 0 = 4 GiB; SF_ERR_LIMIT beyond */
    int zstd_level;            /* 0 = no compression (default); 1..22: each record is tried with
                                  zstd at this level and stored compressed only when smaller */
    uint64_t max_record_bytes; /* cap of one record's uncompressed body; 0 = 1 GiB */
};

/* Defaults: fd -1, file NULL (memory), no compression. o may not be NULL. */
void sf__record_writer_options_init_default(struct sf__record_writer_options *o);

struct sf__record_writer;

/* Creates a writer and writes the 16-byte file header. o may be NULL (memory,
 * defaults). On failure *out is NULL and err (when not NULL) says why. */
sf_status sf__record_writer_new(const struct sf__record_writer_options *o,
                                struct sf__record_writer **out, char *err, size_t err_len);

/*
 * Appends one sample as one record. key: NUL-terminated, 1..4096 bytes.
 * fields: n (0..65535) fields, copied out before the call returns. Errors:
 * SF_ERR_INVALID_ARGUMENT (bad key/name, duplicate name, after finish),
 * SF_ERR_LIMIT (record or memory cap), SF_ERR_IO (write failed),
 * SF_ERR_NO_MEMORY. Any error is sticky: later calls return it again.
 */
sf_status sf__record_writer_add(struct sf__record_writer *w, const char *key,
                                const struct sf__record_field_in *fields, size_t n);

/* Writes the index and the footer. After it, only _take, _count, _bytes and
 * _destroy are allowed. Does not close or flush fd / file. */
sf_status sf__record_writer_finish(struct sf__record_writer *w);

/* Memory destination only, after a successful finish: hands over the shard
 * (free() it) and its size; NULL otherwise. The writer then holds nothing. */
void *sf__record_writer_take(struct sf__record_writer *w, size_t *size);

uint64_t sf__record_writer_count(const struct sf__record_writer *w); /* records so far */
uint64_t sf__record_writer_bytes(const struct sf__record_writer *w); /* bytes written so far */
/* Detail of the sticky error, "" while none. Valid until _destroy. */
const char *sf__record_writer_errmsg(const struct sf__record_writer *w);
/* Frees the writer (and an untaken memory buffer). NULL is a no-op. */
void sf__record_writer_destroy(struct sf__record_writer *w);

/* ------------------------------------------------------------ reader */

struct sf__record_reader_options {
    uint64_t max_record_bytes;    /* stored and decompressed body cap; 0 = 1 GiB */
    size_t max_key_bytes;         /* 0 = 4096 */
    size_t max_fields;            /* 0 = 1024 */
    unsigned zstd_window_log_max; /* 0 = 27 */
    int skip_checksums;
};

struct sf__record_reader;

/* name is copied. o may be NULL (defaults). */
sf_status sf__record_reader_new(const struct sf__record_reader_options *o, const char *name,
                                struct sf__record_reader **out);
void sf__record_reader_destroy(struct sf__record_reader *rr);
/* Error, counters and wanted bytes (see struct sf__shard_common). */
const struct sf__shard_common *sf__record_reader_common(const struct sf__record_reader *rr);
/* The lowest shard offset a later sequential call may read: the start of
 * the next record, of the index, or 0 before the file header. */
uint64_t sf__record_reader_keep_from(const struct sf__record_reader *rr);

/*
 * Sequential reading over a contiguous prefix: the next sample, or
 * SF_SHARD_NEED_MORE, or SF_SHARD_END after the index and footer were read
 * and checked against the records seen. Fields point into in->base, or into
 * the reader's decompression buffer (reader_owned = 1) until the next call.
 */
sf_status sf__record_reader_next(struct sf__record_reader *rr, const struct sf__shard_input *in,
                                 struct sf_sample *out, enum sf_shard_event *event);

/*
 * Random access: decodes record number ordinal whose bytes (rec_bytes of
 * them, as given by the index) start at rec and sit at offset in the shard.
 * Fields point into rec or the reader's buffer as above. Errors are not
 * sticky here: a failed decode leaves the reader usable for other records,
 * and sf__record_reader_errmsg() describes the last one.
 */
sf_status sf__record_reader_decode(struct sf__record_reader *rr, const void *rec, size_t rec_bytes,
                                   uint64_t offset, uint64_t ordinal, struct sf_sample *out);
const char *sf__record_reader_errmsg(const struct sf__record_reader *rr);

/* The index of a record shard. */
struct sf__record_index;

/*
 * Parses the footer and the index from the last tail_bytes bytes of a shard
 * of file_size bytes. When the tail is too short for the index, returns
 * SF_ERR_RANGE and sets *need_tail_bytes (when not NULL) to the tail size
 * that is enough; fetch that and call again. Other errors: SF_ERR_CORRUPT
 * (bad magic, checksum, offsets), SF_ERR_PARSE (unknown version). err names
 * the shard (name may be NULL) and the offset.
 */
sf_status sf__record_index_from_tail(const void *tail, size_t tail_bytes, uint64_t file_size,
                                     const char *name, struct sf__record_index **out,
                                     uint64_t *need_tail_bytes, char *err, size_t err_len);
uint64_t sf__record_index_count(const struct sf__record_index *idx);
/* Offset and size (header included) of record i; SF_ERR_INVALID_ARGUMENT when
 * i >= count. */
sf_status sf__record_index_entry(const struct sf__record_index *idx, uint64_t i, uint64_t *offset,
                                 uint64_t *bytes);
void sf__record_index_destroy(struct sf__record_index *idx);

#endif
