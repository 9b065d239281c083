/* The pack suite's fixture, shared by tests/test_pack*.c (one executable):
 * a source folder written file by file and remembered, checks of packed
 * shards against it, the mock for S3 destinations, and the CLI as a
 * program. */
#ifndef SF_TEST_PACK_FIXTURE_H
#define SF_TEST_PACK_FIXTURE_H

#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "support/files.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <stddef.h>

#define MAX_FILES 512

/* A file the test wrote into the source folder. */
struct tfile {
    char rel[1024];
    unsigned char *data;
    size_t size;
    int seen;
};

extern char *tmp;                     /* the test's directory */
extern char src[700];                 /* tmp/src, the folder to pack */
extern struct tfile files[MAX_FILES]; /* what src holds (hidden files not) */
extern size_t n_files;
extern struct mock_proc srv;         /* after start_mock */
extern struct sf_s3 *s3;             /* a client of srv, after start_mock */
extern const char *const classes[3]; /* the imagefolder's, in byte order */

/* The suite's .init (tmp and an empty src) and .fini. */
void pack_setup(void);
void pack_teardown(void);

/* Writes src/rel and remembers it. */
void add_bytes(const char *rel, const void *data, size_t size);
void add_random(const char *rel, size_t size, unsigned seed);
/* Compressible: the same line over and over. */
void add_text(const char *rel, size_t size);
/* Hidden: written but not packed, so not in files[]. */
void add_hidden(const char *rel);
/* Three classes, 36 files of 0..12 KB, one nested folder, one hidden file. */
void make_imagefolder(void);
/* WebDataset-style: multi-field samples, a field with a dot, upper-case
 * extensions, a sample in a subfolder. */
void make_flat(void);
/* 24 random files taking 1 MiB each in a tar: two shards of 12 MiB with
 * --shard-size 13M. */
void make_large(void);

void path_in(char *out, size_t n, const char *dir, const char *name);
/* Names in dir (index.json excluded), sorted; fails on leftover temporary files. */
size_t list_shards(const char *dir, char names[][256], size_t max);
/* Checks a local pack: index.json against the shard files (names, sizes,
 * checksums, sample counts), every source file read back exactly once,
 * labels and classes, and the shard size bound. Returns the shard count. */
size_t check_pack(const char *dest, const char *format, int labels, unsigned long long shard_bytes,
                  unsigned long long *decompressed);
void expect_same_file(const char *a, const char *b);

/* sf_pack of src. */
sf_status do_pack(const char *dest, const struct sf_pack_options *o, struct sf_pack_result *res,
                  char *err, size_t err_len);
/* tmp/name */
void dest_path(char *out, size_t n, const char *name);
/* Packs src into tmp/out (dest: 800 bytes), failing the test on an error. */
void pack_out(const struct sf_pack_options *o, char *dest, struct sf_pack_result *res);

/* The mock on tmp/root with bucket/, s3 a client of it, and its key pair in
 * the environment (for the CLI). */
void start_mock(void);
long admin(const char *method, const char *path_query, char **out);
/* stats operations[op] (op not NULL) or status[status]. */
double mock_count(const char *op, const char *status);
/* stats keys[key] operations[op]. */
double mock_key_count(const char *key, const char *op);
/* GETs url with the engine into memory (free it). */
unsigned char *get_object(const char *url, size_t *size);
/* A signed request to the mock; returns the status, the body in *out (free it). */
long signed_call(const char *method, const char *target, char **out, char *etag, size_t etag_len);
/* Multipart uploads in progress in the mock's bucket. */
int uploads_in_progress(void);
/* S3's ETag of a file sent in parts of part bytes: md5 of the parts' md5s, "-N". */
void multipart_etag_of(const unsigned char *data, size_t n, size_t part, char *out, size_t out_len);
/* The defaults, to the mock, spooled in tmp; shards of shard_bytes unless 0. */
void s3_options(struct sf_pack_options *o, unsigned long long shard_bytes);
/* Shards of 13 MiB in 5 MiB parts to the mock, spooled in tmp. */
void large_options(struct sf_pack_options *o);

/* Runs the built shardfeed with args; stdout and stderr go to files. */
extern char out_path[900], err_path[900];
int cli(const char *args);
/* cli(args), which must exit 0 (else the test fails with its stderr). */
void cli_ok(const char *args);

#endif
