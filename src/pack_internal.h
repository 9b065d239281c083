/*
 * What the files of pack share (src/pack.c and the pack_*.c and tar_writer.c
 * it drives): the packer that carries one sf_pack() call, its entries,
 * samples and shards, and the entry points of each file.
 */
#ifndef SF_SRC_PACK_INTERNAL_H
#define SF_SRC_PACK_INTERNAL_H

#include "shardfeed_pack.h"

#include "shardfeed.h"
#include "src/pack_reencode.h"
#include "src/record.h"

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#define OUT_BUFFER_BYTES (1u << 20)
#define TAR_BLOCK        512u
#define DEFAULT_QUALITY  90

/* One source file. */
struct entry {
    char *rel;      /* path relative to the source, '/'-separated */
    size_t key_len; /* rel[0..key_len) is the sample key, rel[key_len] is the '.' */
    long cls;       /* ImageFolder label, -1 for FLAT */
    uint64_t size;  /* at scan time */
    /* --max-side: the re-encoded JPEG written instead of the file, or NULL */
    unsigned char *re;
    uint64_t re_size;
};

/* One sample: entries [first, first + n) of the sorted array. */
struct sample {
    size_t first, n;
    uint64_t bytes; /* what it adds to a shard (tar: headers + padded data) */
};

struct shard_info {
    char *name;
    uint64_t bytes;
    uint64_t samples;
    uint64_t xxh3;
};

/* The second thread of an s3:// pack: uploads one staged shard at a time. */
struct uploader {
    pthread_t thread;
    int started;
    struct sf_s3 *s3;
    struct sf_s3_upload_options upload;
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t cond;
    char *path; /* the staged shard being uploaded (unlinked after), NULL when idle */
    char *url;
    int quit;
    sf_status status; /* first failure */
    char err[1024];
    unsigned long long done;
};

struct packer {
    const struct sf_pack_options *o;
    const char *src; /* as given */
    char *err;
    size_t err_len;

    /* destination */
    int to_s3;
    char *dest_dir; /* local folder */
    char *dest_url; /* s3://bucket/prefix without a trailing '/' */
    const char *tmp_dir;

    /* scan */
    enum sf_pack_layout layout;
    char **classes;
    size_t n_classes;
    uint64_t *class_counts;
    struct entry *entries;
    size_t n_entries, cap_entries;
    unsigned long long ignored;
    uint64_t source_bytes;
    struct sample *samples;
    size_t n_samples;

    /* writing */
    struct shard_info *shards;
    size_t n_shards, cap_shards;
    unsigned long long files_done;
    uint64_t bytes_done;
    unsigned char *out; /* tar output buffer */
    size_t out_len;
    unsigned char *sample_buf; /* record: the current sample's files */
    size_t sample_cap;
    struct uploader up;
    unsigned long long local_done;
    struct reencoder *re; /* --max-side, else NULL */
};

/* A shard being written. */
struct shard {
    char name[NAME_MAX + 1];
    char *tmp_path;
    int fd;
    uint64_t bytes; /* bytes so far (tar: flushed + buffered) */
    uint64_t samples;
    XXH3_state_t *xx; /* tar: hashed as written */
    struct sf__record_writer *rw;
};

/* ------------------------------------------------------------ pack.c */

/* Keeps the first failure's message in the caller's err; returns st. */
__attribute__((format(printf, 3, 4))) sf_status sf__pack_fail(struct packer *p, sf_status st,
                                                              const char *fmt, ...);
sf_status sf__pack_errno_status(int e);
char *sf__pack_path_join(const char *a, const char *b);

/* ------------------------------------------------------------ pack_scan.c */

const char *sf__pack_field_of(const struct entry *e);
uint64_t sf__pack_entry_size(const struct entry *e);
int sf__pack_cmp_str(const void *a, const void *b);
sf_status sf__pack_check_src(struct packer *p);
sf_status sf__pack_scan(struct packer *p);
int sf__pack_label_text(long cls, char *out, size_t n);
uint64_t sf__pack_sample_bytes(const struct packer *p, const struct sample *smp);
sf_status sf__pack_group_samples(struct packer *p);
sf_status sf__pack_open_source(struct packer *p, const struct entry *e, char **abs_out,
                               int *fd_out);
sf_status sf__pack_read_exact(struct packer *p, int fd, const char *abs, unsigned char *dst,
                              size_t n, uint64_t at);

/* ------------------------------------------------------------ tar_writer.c */

uint64_t sf__tar_member_bytes(const char *name, size_t name_len, uint64_t size);
sf_status sf__tar_sample(struct packer *p, struct shard *s, const struct sample *smp);

/* ------------------------------------------------------------ pack_record.c */

sf_status sf__pack_record_sample(struct packer *p, struct shard *s, const struct sample *smp);

/* ------------------------------------------------------------ pack_shard.c */

sf_status sf__pack_write_all(struct packer *p, struct shard *s, const void *data, size_t n);
sf_status sf__pack_out_flush(struct packer *p, struct shard *s);
sf_status sf__pack_out_put(struct packer *p, struct shard *s, const void *data, size_t n);
sf_status sf__pack_out_zeros(struct packer *p, struct shard *s, size_t n);
sf_status sf__pack_shard_open(struct packer *p, struct shard *s, size_t index);
void sf__pack_shard_discard(struct shard *s);
char *sf__pack_object_url(struct packer *p, const char *name);
sf_status sf__pack_shard_close(struct packer *p, struct shard *s);

/* ------------------------------------------------------------ pack_upload.c */

sf_status sf__pack_uploader_start(struct packer *p);
sf_status sf__pack_uploader_submit(struct packer *p, char *path, char *url);
void sf__pack_uploader_stop(struct packer *p);

/* ------------------------------------------------------------ pack_index.c */

sf_status sf__pack_write_index(struct packer *p, uint64_t total_bytes);
/* S3: an index.json already under the prefix is replaced by one naming no
 * shard, before the first shard goes up (pack_index.c says why). */
sf_status sf__pack_s3_clear_old_index(struct packer *p);

/* ------------------------------------------------------------ pack_reencode_pool.c */

/*
 * Re-encoding is CPU work (a decode, a resize, an encode: tens of ms for a
 * large photo), so a pool of threads does it a few samples ahead of the
 * writer, which still writes the samples in their order: the output is the
 * same bytes whatever the thread count. Each sample's buffers are freed once
 * written, so memory is bounded by REENCODE_AHEAD x threads samples.
 */
struct reencoder {
    struct packer *p;
    struct sf__reencode r;
    pthread_t *threads;
    unsigned n_threads, started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t next;         /* next sample to take */
    size_t limit;        /* samples below this may be taken */
    unsigned char *done; /* per sample */
    int quit;
    sf_status st; /* first failure */
    char err[1024];
    /* results */
    unsigned long long images, source_bytes, bytes;
};

sf_status sf__pack_reencoder_start(struct packer *p);
sf_status sf__pack_reencoder_wait(struct packer *p, size_t i);
void sf__pack_reencoder_stop(struct packer *p);
void sf__pack_free_reencoded(struct packer *p, const struct sample *smp);

#endif
