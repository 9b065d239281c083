/* The index suite's fixture (tests/test_index.c): the mock and its bucket
 * folder, the client, folders of samples, and the checks that compare an
 * index with pack's and with what the loader reads from it. */
#ifndef SF_TEST_INDEX_FIXTURE_H
#define SF_TEST_INDEX_FIXTURE_H

#include "shardfeed.h"
#include "support/mock_proc.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Set by index_setup and start_mock, cleared by index_teardown (the suite's
 * .init and .fini). */
extern char *tmp;
extern char bucket[800]; /* the mock's bucket "bucket", a folder */
extern struct mock_proc srv;
extern struct sf_s3 *s3;

void index_setup(void);
void index_teardown(void);

/* XXH3-64 of the file at path; its size into size. */
uint64_t file_xxh3(const char *path, size_t *size);
/* Member name of j, which must be there. */
const cJSON *jget(const cJSON *j, const char *name);
/* bucket/rel into out (n bytes). */
void in_bucket(char *out, size_t n, const char *rel);
/* mkdir -p */
void mkdirs(const char *dir);
/* Writes a file of size pseudo-random bytes (seed) at dir/rel. */
void put_random(const char *dir, const char *rel, size_t size, unsigned seed);
/* A sample stem in dir: stem.jpg of size random bytes (seed), stem.ext1
 * holding text1 and, when ext2 is not NULL, stem.ext2 holding text2. */
void put_sample(const char *dir, const char *stem, size_t size, unsigned seed, const char *ext1,
                const char *text1, const char *ext2, const char *text2);
/* Starts the mock (extra: more arguments, NULL-terminated, or NULL) and a
 * client s3 for it that retries quickly. */
void start_mock(const char *const *extra);
/* A number from /_mock/stats: stats[group][name], or stats[name] when
 * group is NULL. */
double mock_stat(const char *group, const char *name);
/* Runs sf_index_shards() on one source; the parsed JSON on success. */
sf_status run_index(const char *source, const struct sf_index_options *o,
                    struct sf_index_result *res, cJSON **json, char *err, size_t err_len);
/* The object at url through the engine, as a NUL-terminated string. */
char *get_text(const char *url);
/* WebDataset-style source folder: n samples KEY.jpg (random), KEY.txt, and
 * every third one KEY.seg.png. */
void make_flat(const char *dir, int n, size_t jpg_base);
/* The index must agree with pack's on every field both write. */
void expect_same_as_pack(const cJSON *mine, const cJSON *pack);
/* The loader's reading of index.json gives counts for every shard of source. */
void expect_loader_counts(const char *json, const char *source, const cJSON *shards);

#endif
