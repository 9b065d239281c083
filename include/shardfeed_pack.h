/*
 * shardfeed — packing a folder of files into shards.
 *
 * sf_pack() turns an ImageFolder tree (one folder per class) or a flat,
 * WebDataset-style folder into tar or record shards of a bounded size, in a
 * local folder or under an s3:// prefix, and writes an index.json that lists
 * the shards with their sizes, sample counts and XXH3-64 checksums. The same
 * input always gives byte-identical shards and index. docs/pack.md has the
 * rules (layouts, keys, determinism, the index schema).
 *
 * Thread safety: sf_pack() may be called from any thread; it blocks until the
 * whole pack is done. Calls on different sources are independent.
 */
#ifndef SHARDFEED_PACK_H
#define SHARDFEED_PACK_H

#include "shardfeed.h"
#include "shardfeed/export.h"

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
 * and after every sample, and once more when everything is written. Return 0
 * to go on; anything else stops the pack with SF_ERR_CANCELLED (shards this
 * call renamed into a local destination are removed; see docs/pack.md).
 */
typedef int (*sf_pack_progress_fn)(void *user, const struct sf_pack_progress *progress);

/* Options of sf_pack(). Strings are borrowed for the duration of the call. */
struct sf_pack_options {
    enum sf_pack_format format;     /* default SF_PACK_FORMAT_TAR */
    enum sf_pack_layout layout;     /* default SF_PACK_LAYOUT_AUTO */
    unsigned long long shard_bytes; /* a shard is closed before the sample that would make it
                                       larger than this (a bigger sample gets a shard of its
                                       own); default 256 MiB; for s3:// at most SF_PUT_MAX_BYTES */
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
};

/*
 * Packs the folder src_dir into shards at dest_url and writes
 * dest_url/index.json last.
 *
 * dest_url: a local folder (a path or file:// URL; created with its parents
 * when missing; it may not lie inside src_dir) or "s3://bucket/prefix"
 * (o->s3 must be a client; each shard is staged in o->tmp_dir and uploaded
 * with sf_s3_put() by a second thread while the next one is written, so at
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
 * truncated to err_len. Returns SF_ERR_NOT_FOUND (src_dir missing or
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

#ifdef __cplusplus
}
#endif

#endif /* SHARDFEED_PACK_H */
