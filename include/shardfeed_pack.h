/*
 * shardfeed — packing a folder of files into shards.
 *
 * sf_pack() turns an ImageFolder tree (one folder per class) or a flat,
 * WebDataset-style folder into tar or record shards of a bounded size, in a
 * local folder or under an s3:// prefix, and writes an index.json that lists
 * the shards with their sizes, sample counts and XXH3-64 checksums. The same
 * input always gives byte-identical shards and index. docs/pack.md has the
 * rules (layouts, keys, determinism, the index schema). sf_index_shards()
 * builds that index.json for shards that exist already (made by other tools).
 *
 * Thread safety: sf_pack() and sf_index_shards() may be called from any
 * thread; they block until the whole job is done. Calls on different sources
 * are independent.
 */
#ifndef SHARDFEED_PACK_H
#define SHARDFEED_PACK_H

#include "shardfeed/common.h"
#include "shardfeed_s3.h"
#include "shardfeed_shard.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Shard format written by sf_pack(). */
enum sf_pack_format {
    SF_PACK_FORMAT_TAR = 1,    /* POSIX ustar (pax headers only for long names or sizes) */
    SF_PACK_FORMAT_RECORD = 2, /* shardfeed record shards, .sfr (docs/FORMAT.md) */
};

/*
 * How the source folder is read.
 *  - IMAGEFOLDER: every immediate subfolder is a class; class names sorted
 *    byte-wise get labels 0..n-1; every file below a class folder (at any
 *    depth) is one sample keyed "<class>/<path up to the first '.' of the base
 *    name>", with its extension as the field and a "cls" field holding the
 *    label as decimal text. A file directly in the source folder is an error.
 *  - FLAT: files are grouped into samples WebDataset-style: the key is the
 *    path (relative to the source) up to the first '.' of the base name, the
 *    field is the rest ("a/001.seg.png" -> key "a/001", field "seg.png").
 *  - AUTO: IMAGEFOLDER when the top level of the source holds at least one
 *    folder and no files, FLAT otherwise.
 * In both layouts names starting with '.' (hidden files and folders) are
 * ignored and counted (sf_pack_result.ignored); every other entry must be a
 * regular file or a folder, else sf_pack() fails naming it.
 */
enum sf_pack_layout {
    SF_PACK_LAYOUT_AUTO = 0,
    SF_PACK_LAYOUT_IMAGEFOLDER = 1,
    SF_PACK_LAYOUT_FLAT = 2,
};

/* Progress of a running pack, passed to the progress callback. */
struct sf_pack_progress {
    unsigned long long bytes_done;  /* source bytes packed so far */
    unsigned long long bytes_total; /* source bytes in all (known after the scan) */
    unsigned long long files_done;  /* source files packed so far */
    unsigned long long files_total; /* source files in all */
    unsigned long long shards_done; /* shards finished: renamed into place, or uploaded */
};

/*
 * Progress callback: called on the thread that runs sf_pack(), after the scan
 * and after every sample, and once more when every shard is in place, just
 * before index.json is written. Return 0 to go on; anything else stops the
 * pack with SF_ERR_CANCELLED (no index.json is written, and shards this call
 * renamed into a local destination are removed; see docs/pack.md).
 */
typedef int (*sf_pack_progress_fn)(void *user, const struct sf_pack_progress *progress);

/* Limits of sf_pack_options (SF_ERR_INVALID_ARGUMENT outside them). */
#define SF_PACK_ZSTD_LEVEL_MAX   22   /* zstd_level: 0 (off) or 1..this */
#define SF_PACK_MAX_SIDE_MIN     16u  /* max_side: 0 (keep the JPEGs) or at least this */
#define SF_PACK_JPEG_QUALITY_MAX 100  /* jpeg_quality: 0 (the default) or 1..this */
#define SF_PACK_THREADS_MAX      256u /* threads: more are taken as this many */

/* Options of sf_pack(). Strings are borrowed for the duration of the call. */
struct sf_pack_options {
    enum sf_pack_format format;     /* default SF_PACK_FORMAT_TAR */
    enum sf_pack_layout layout;     /* default SF_PACK_LAYOUT_AUTO */
    unsigned long long shard_bytes; /* a shard is closed before the sample that would make it
                                       larger than this (a bigger sample gets a shard of its
                                       own); default 256 MiB; for s3:// at most
                                       SF_UPLOAD_MAX_BYTES (5 TiB) */
    int zstd_level;                 /* 0 = off (default); 1..22: compress each record that
                                       shrinks; record format only (SF_ERR_UNSUPPORTED with tar) */
    const char *name_pattern;       /* shard file names: one %u (or %0Nu, %d) for the shard
                                       number from 0, %% for '%', no '/'; NULL = "shard-%06u.tar"
                                       or "shard-%06u.sfr" */
    int follow_symlinks;            /* 1: follow symbolic links; default 0: a link is an error */
    unsigned long long max_files;   /* cap on source files; 0 = 10 million; SF_ERR_LIMIT beyond */
    struct sf_s3 *s3;               /* the client for s3:// destinations (not used otherwise) */
    const char *tmp_dir;            /* s3:// only: where each shard is staged before its PUT;
                                       NULL = $TMPDIR, else /tmp */
    sf_pack_progress_fn progress;   /* NULL = none */
    void *progress_user;
    /* Re-encoding (docs/pack.md "Re-encoding"): 0 = off (default). N >= 16:
     * a "jpg"/"jpeg" field whose longer side is over N pixels is shrunk to N
     * (aspect kept, antialiased) and encoded again; smaller JPEGs and other
     * fields are kept byte for byte. A JPEG that cannot be read (or CMYK)
     * fails the pack, naming the file. */
    unsigned max_side;
    int jpeg_quality; /* with max_side: 1..100; 0 = 90 */
    unsigned threads; /* re-encoding threads; 0 = the cores online */
    /* s3:// only: a shard larger than this is uploaded as a multipart upload
     * in parts of this size, 4 parts in flight (sf_s3_upload_file());
     * 0 = SF_UPLOAD_PART_BYTES_DEFAULT (64 MiB); else 5 MiB..5 GiB. */
    unsigned long long part_bytes;
};

/* Fills o with the defaults. o may not be NULL. */
SF_API void sf_pack_options_init_default(struct sf_pack_options *o);

/* What a finished pack wrote. */
struct sf_pack_result {
    enum sf_pack_format format;
    enum sf_pack_layout layout;      /* the layout used (never AUTO) */
    unsigned long long shards;       /* shards written */
    unsigned long long samples;      /* samples in all shards */
    unsigned long long files;        /* source files packed */
    unsigned long long source_bytes; /* bytes of those files */
    unsigned long long shard_bytes;  /* bytes of all shards together (index.json not counted) */
    unsigned long long ignored;      /* hidden entries (names starting with '.') not packed */
    unsigned long long classes;      /* ImageFolder classes; 0 for FLAT */
    unsigned long long reencoded;    /* JPEGs shrunk by max_side */
    unsigned long long reencoded_source_bytes; /* their bytes before */
    unsigned long long reencoded_bytes;        /* and after */
};

/*
 * Packs the folder src_dir into shards at dest_url and writes
 * dest_url/index.json last.
 *
 * dest_url: a local folder (a path or file:// URL; created with its parents
 * when missing; it may not lie inside src_dir) or "s3://bucket/prefix"
 * (o->s3 must be a client; each shard is staged in o->tmp_dir and uploaded
 * with sf_s3_upload_file() by a second thread while the next one is written, so at
 * most two staged shards exist at a time and memory does not grow with the
 * shard size). Local shards are written to a hidden temporary name in the
 * destination and renamed into place; existing files of the same names are
 * replaced.
 *
 * o may be NULL (defaults; then an s3:// destination is refused). result may
 * be NULL. On failure nothing that was packed is reported as done: no
 * index.json is written, shards renamed into a local destination by this
 * call are removed (shards already uploaded to S3 are left), and err (when
 * not NULL) receives a message naming the file or object and what went wrong,
 * truncated to err_len. A shard whose multipart upload failed is aborted, so
 * no parts of it stay stored. Returns SF_ERR_NOT_FOUND (src_dir missing or
 * without files), SF_ERR_INVALID_ARGUMENT (options, names that cannot be
 * keys, a symbolic link, a file at the top of an ImageFolder tree, two files
 * giving the same field of one sample), SF_ERR_IO (a file cannot be read or
 * a shard written), SF_ERR_CHANGED (a file changed size while being packed),
 * SF_ERR_LIMIT, SF_ERR_CANCELLED, or a status of sf_s3_put().
 */
SF_API sf_status sf_pack(const char *src_dir, const char *dest_url, const struct sf_pack_options *o,
                         struct sf_pack_result *result, char *err, size_t err_len);

/*
 * The name of shard number index under pattern (as name_pattern; NULL = the
 * default of format), into out (n bytes). SF_ERR_INVALID_ARGUMENT when the
 * pattern is not one sf_pack() accepts (also: names starting with '.' or
 * equal to "index.json"), SF_ERR_LIMIT when out is too small. Any thread.
 */
SF_API sf_status sf_pack_shard_name(const char *pattern, enum sf_pack_format format,
                                    unsigned long long index, char *out, size_t n);

/* "tar" / "record"; "unknown" for other values. Static storage. */
SF_API const char *sf_pack_format_name(enum sf_pack_format format);
/* "auto" / "imagefolder" / "flat"; "unknown" for other values. Static storage. */
SF_API const char *sf_pack_layout_name(enum sf_pack_layout layout);

/* ------------------------------------------------------------ index of existing shards */

/*
 * sf_index_shards() reads shards that were not made by sf_pack() (GNU tar
 * WebDataset shards, record shards) and builds the index.json sf_pack()
 * would have written for them: shard names, sizes, sample counts and XXH3-64
 * checksums (docs/pack.md, "shardfeed index"), so the loader takes its
 * counts from it instead of reading every shard first.
 */

/* Progress of a running index, passed to the progress callback. */
struct sf_index_progress {
    unsigned long long shards_done;  /* shards read and counted */
    unsigned long long shards_total; /* shards to read */
    unsigned long long bytes_done;   /* shard bytes read and hashed so far */
    unsigned long long bytes_total;  /* sum of the shard sizes known so far (sizes of brace
                                        patterns are learned from each shard's first reply,
                                        so this grows) */
};

/*
 * Progress callback: called on the thread that runs sf_index_shards(), about
 * ten times a second while shards are read, when a shard is done, and once
 * more at the end. Return 0 to go on; anything else stops the index with
 * SF_ERR_CANCELLED.
 */
typedef int (*sf_index_progress_fn)(void *user, const struct sf_index_progress *progress);

/* Limits of sf_index_options (SF_ERR_INVALID_ARGUMENT outside them). */
#define SF_INDEX_PARALLEL_MAX     1024u
#define SF_INDEX_WINDOW_BYTES_MIN (64ull << 10) /* 64 KiB */
#define SF_INDEX_WINDOW_BYTES_MAX (16ull << 30) /* 16 GiB */

/* Options of sf_index_shards(). Strings are borrowed for the duration of the call. */
struct sf_index_options {
    unsigned parallel;               /* shards read at once; default 8, at most
                                        SF_INDEX_PARALLEL_MAX */
    unsigned long long window_bytes; /* bytes of each shard in flight held in memory: the shard
                                        streams through this window in ranged GETs of
                                        min(chunk_bytes, window_bytes / 4); default 8 MiB,
                                        SF_INDEX_WINDOW_BYTES_MIN..._MAX
                                        (SF_ERR_INVALID_ARGUMENT outside) */
    const char *index_url;           /* where the index will be written: shard names are made
                                        relative to its folder. NULL = "index.json" in the
                                        folder of the first shard (see sf_index_result) */
    size_t max_shards;               /* cap on shards; 0 = 10 million; SF_ERR_LIMIT beyond */
    sf_index_progress_fn progress;   /* NULL = none */
    void *progress_user;
};

/* Fills o with the defaults. o may not be NULL. */
SF_API void sf_index_options_init_default(struct sf_index_options *o);

/* What sf_index_shards() found. Owned strings: release with sf_index_result_clear(). */
struct sf_index_result {
    char *json;                    /* the index.json text (pretty-printed, ends with '\n'); owned */
    size_t json_len;               /* strlen(json) */
    char *index_url;               /* where it belongs: o->index_url or the default; owned */
    unsigned long long shards;     /* shards listed */
    unsigned long long samples;    /* samples in all of them */
    unsigned long long bytes;      /* bytes of all shards */
    unsigned long long tar_shards; /* shards read as tar */
    unsigned long long record_shards;    /* shards read as record shards */
    unsigned long long counted_by_index; /* record shards whose count came from their own index
                                            (a record or index larger than the window) */
};

/* Frees the strings of r and zeroes it. NULL is a no-op. */
SF_API void sf_index_result_clear(struct sf_index_result *r);

/*
 * Reads every shard the sources name once and returns the index.json that
 * lists them. sources: n_sources strings as sf_s3_expand() takes them (s3://
 * keys, brace patterns, prefixes ending in '/', http(s)://, file:// and
 * local paths); a prefix or local folder keeps its *.tar and *.sfr objects
 * only. Shards are listed in source order. Every named object is checked
 * to exist before any is read (sf_s3_expand_stat()): a missing one fails
 * with SF_ERR_NOT_FOUND naming it, and sizes are known up front.
 *
 * o->parallel shards are read at a time, each by its own thread, as ranged
 * GETs through the client's fetch engine (s3's concurrency caps the
 * requests in flight). Each shard streams through a window of
 * o->window_bytes: its bytes are hashed (XXH3-64, seed 0) and parsed with the
 * shard readers as they arrive, and dropped once both are done, so memory
 * is about o->parallel x o->window_bytes whatever the shard sizes and count
 * (plus a copy of at most one window for a header or record that crosses the
 * window's end, and 16 bytes per record of a record shard). A record shard
 * whose record or index does not fit the window is still hashed whole; its
 * count then comes from its own index (counted_by_index) and the checksums
 * of its records from there on are not verified. Tar member data may be of
 * any size.
 *
 * o may be NULL (defaults). s3 and result may not be NULL, nor sources when
 * n_sources > 0. On success *result holds the JSON; on failure it is
 * zeroed and err (when not NULL) receives a message naming the shard and,
 * for a corrupt or truncated shard, the byte offset (the reader's message),
 * truncated to err_len. When several shards fail, the first in source order
 * among those that failed is reported. Returns SF_ERR_NOT_FOUND (no shards,
 * or a missing object), SF_ERR_CORRUPT / SF_ERR_PARSE / SF_ERR_LIMIT /
 * SF_ERR_UNSUPPORTED (a shard the readers refuse, as sf_shard_reader_next()),
 * SF_ERR_INVALID_ARGUMENT (options; two shards with the same base name: the
 * loader matches index entries by base name), SF_ERR_CANCELLED, or a status
 * of the fetch (SF_ERR_CHANGED when a shard changed while it was read, ...).
 * Writes nothing. Blocks the caller; any thread.
 */
SF_API sf_status sf_index_shards(struct sf_s3 *s3, const char *const *sources, size_t n_sources,
                                 const struct sf_index_options *o, struct sf_index_result *result,
                                 char *err, size_t err_len);

/*
 * Writes result->json to result->index_url: an s3:// URL with one PUT through
 * s3 (SF_ERR_INVALID_ARGUMENT when s3 is NULL); a local path or file:// URL
 * through a temporary file beside it that is renamed over it, so a reader
 * never sees part of an index. http(s):// cannot be written:
 * SF_ERR_INVALID_ARGUMENT. On failure err (when not NULL) names the path or
 * URL and the reason (for s3://, the client's sf_s3_errmsg() text); a local
 * path whose folder does not exist gives SF_ERR_NOT_FOUND, other local
 * failures SF_ERR_IO. Blocks the caller; any thread.
 */
SF_API sf_status sf_index_result_save(struct sf_s3 *s3, const struct sf_index_result *result,
                                      char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* SHARDFEED_PACK_H */
