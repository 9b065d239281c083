/* The loader suite's fixture, shared by tests/test_loader*.c (one
 * executable, one suite): generated JPEG datasets packed into shards (local
 * or served by the mock), the options every test starts from, an epoch run
 * that checks each sample, the CLI run as a child, and a kept log. */
#ifndef SF_TEST_LOADER_FIXTURE_H
#define SF_TEST_LOADER_FIXTURE_H

#include "shardfeed.h"
#include "support/mock_proc.h"

#include <stddef.h>
#include <stdint.h>

/* Set by the dataset makers, cleared by loader_teardown (the suite's .fini). */
extern char *tmp;            /* the test's temporary directory */
extern struct mock_proc srv; /* the mock, when a test started one */
extern char shards[700];     /* local folder of shards, with a trailing '/' */
extern char root[700];       /* the mock's root: root/bucket/data/ holds the shards */
extern unsigned n_samples;   /* samples in the dataset (keys s00000..) */
extern char log_text[16384]; /* what keep_log_in's sink received */

void loader_teardown(void);
/* tmp = a fresh directory, with the AWS environment isolated inside it. */
void loader_tmpdir(void);

/* A flat folder of n samples in dir: sNNNNN.jpg (small images of varied
 * sizes, class (i * 7 + 3) % 4 by colour; corrupt_index's cut short), .cls
 * (the class) and .txt ("key sNNNNN"). */
void make_flat(const char *dir, unsigned n, int corrupt_index);
/* As make_flat, samples first..n-1 of three sizes: i < mid_to are 160 x 160
 * images, then big_to - mid_to of 320 x 320, then 8 x 8 ones. Shards of very
 * different bytes per sample, so estimates from the first shard's are many
 * times too high for some shards and too low for others. */
void make_sized(const char *dir, unsigned first, unsigned n, unsigned mid_to, unsigned big_to);
/* Packs src into dest (a folder or s3:// URL) as tar shards of ~shard_bytes. */
void pack(const char *src, const char *dest, unsigned long long shard_bytes, struct sf_s3 *s3);
/* A local dataset of n samples in `shards` (side 0: make_flat's images,
 * else side x side * 3 / 4). */
void local_dataset_sized(unsigned n, unsigned long long shard_bytes, int corrupt_index,
                         unsigned side);
void local_dataset(unsigned n, unsigned long long shard_bytes, int corrupt_index);
/* n photo-sized noisy JPEGs (640x480), packed in 1 MiB shards: a decode
 * costs milliseconds, reading a sample microseconds. */
void local_dataset_large(unsigned n);
/* make_sized's n samples packed in `shards`, without their index.json. */
void sized_dataset(unsigned n, unsigned mid_to, unsigned big_to, unsigned long long shard_bytes);
/* make_flat's n samples in root/bucket/data/, served by a mock started with
 * mock_args (NULL-terminated, may be NULL); mock credentials in the env. */
void mock_dataset_with(unsigned n, unsigned long long shard_bytes, const char *const *mock_args);
void mock_dataset(unsigned n, unsigned long long shard_bytes);
/* Removes dir's index.json (dir ends with '/'), failing the test if absent. */
void remove_index(const char *dir);
/* remove_index of the mock's bucket/data/. */
void remove_bucket_index(void);

/* 16 per batch, 32 x 24 images, seed 7, the txt field, host delivery. */
void base_options(struct sf_loader_options *o, const char *const *sources, size_t n);
/* base_options, as rank of world_size ranks. */
void rank_options(struct sf_loader_options *o, const char *const *sources, size_t n, int rank,
                  int world_size);
/* base_options for one source on the mock, fast retries, 16 KiB chunks;
 * cache_dir NULL = RAM only. */
void s3_options(struct sf_loader_options *o, const char *const *src, const char *cache_dir);
/* The sources of the two datasets: {shards} and {"s3://bucket/data/"}. */
extern const char *shards_src[1];
extern const char *bucket_src[1];
/* local_dataset(n, shard_bytes, -1) with base_options over it. */
void local_options(struct sf_loader_options *o, unsigned n, unsigned long long shard_bytes);
/* mock_dataset_with(n, shard_bytes, mock_args) with s3_options over it. */
void bucket_options(struct sf_loader_options *o, unsigned n, unsigned long long shard_bytes,
                    const char *const *mock_args, const char *cache_dir);
/* Opens, failing the test with the error otherwise. */
struct sf_loader *open_loader(const struct sf_loader_options *o);
/* Closes l and returns a loader opened with o and restored from state
 * (SF_LOADER_STATE_BYTES), failing the test when either fails. */
struct sf_loader *reopen_from_state(struct sf_loader *l, const struct sf_loader_options *o,
                                    const unsigned char *state);

/* Everything one epoch delivered. */
struct epoch_log {
    uint64_t digest;
    unsigned images, batches, pads;
    unsigned char *seen; /* per sample number (from the key); free it */
    int labels_ok;
};
/* Runs batches until the end of the epoch (or max_batches) and checks each
 * sample: label = class of its pixels, txt field = its key. Returns what
 * ended the run (SF_OK after max_batches). */
sf_status run_epoch(struct sf_loader *l, struct epoch_log *e, unsigned max_batches);
/* Opens a loader on o and runs one whole epoch into e, which must end with
 * SF_END_OF_EPOCH. Returns the loader. */
struct sf_loader *open_and_run_epoch(const struct sf_loader_options *o, struct epoch_log *e);
/* Opens a loader on o, runs head_batches batches into head, saves the
 * state into state (SF_LOADER_STATE_BYTES) and runs the rest of the epoch
 * into tail. Returns the loader, at the epoch's end. */
struct sf_loader *open_and_save_mid_epoch(const struct sf_loader_options *o, unsigned head_batches,
                                          unsigned char *state, struct epoch_log *head,
                                          struct epoch_log *tail);
/* Restores state (SF_LOADER_STATE_BYTES) into l and runs the rest of the
 * epoch, which must deliver tail's batches; then frees head's and tail's
 * seen and closes l. */
void expect_resumes_to_tail(struct sf_loader *l, const unsigned char *state, struct epoch_log *head,
                            struct epoch_log *tail);

/* The mock's admin endpoint; fails the test when no answer came. */
long admin(const char *method, const char *path_query, const char *body);

/* Runs SF_CLI_BIN with args (argv, NULL-terminated), its stdout into out;
 * run_cli_err keeps stderr too (err NULL: left to the test's). Returns the
 * exit status, -1 when killed. */
int run_cli(const char *const *args, char *out, size_t out_len);
int run_cli_err(const char *const *args, char *out, size_t out_len, char *err, size_t err_len);
/* The CLI run with args (argv, NULL-terminated) exits 2: bad usage. */
void expect_usage_error(const char *const *args);

/* The loader's log into log_text (any loader thread may log). */
void keep_log_in(struct sf_loader_options *o);
int log_has(const char *what);
void log_clear(void);

#endif
