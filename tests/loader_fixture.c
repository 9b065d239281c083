/* The loader suite's fixture (loader_fixture.h). */
#include "loader_fixture.h"

#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/spawn.h"
#include "support/s3_client.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>

char *tmp;
struct mock_proc srv;
char shards[700];
char root[700];
unsigned n_samples;

void loader_teardown(void)
{
    mock_env_stop(&srv, &tmp, NULL);
}

void loader_tmpdir(void)
{
    tmp = test_tmpdir();
    cr_assert(tmp);
    test_isolate_aws_env(tmp);
}

/* ------------------------------------------------------------ data */

#define N_CLASSES 4

/* Class k's colour: far apart, so a decoded pixel tells the class. */
static void class_color(int k, unsigned char rgb[3])
{
    static const unsigned char c[N_CLASSES][3] = {
        {220, 40, 40}, {40, 200, 60}, {50, 60, 210}, {230, 220, 50}};
    memcpy(rgb, c[k], 3);
}

static int class_of(const unsigned char *px, size_t n_px, enum sf_layout layout)
{
    double m[3] = {0, 0, 0};
    for (size_t i = 0; i < n_px; i++)
        for (int c = 0; c < 3; c++)
            m[c] += layout == SF_LAYOUT_HWC ? px[i * 3 + c] : px[c * n_px + i];
    int best = -1;
    double bd = 1e30;
    for (int k = 0; k < N_CLASSES; k++) {
        unsigned char rgb[3];
        class_color(k, rgb);
        double d = 0;
        for (int c = 0; c < 3; c++) {
            double x = m[c] / (double)n_px - rgb[c];
            d += x * x;
        }
        if (d < bd) {
            bd = d;
            best = k;
        }
    }
    return bd < 30 * 30 ? best : -1;
}

static unsigned char *make_jpeg(int cls, unsigned w, unsigned h, unsigned seed, unsigned long *len)
{
    unsigned char *px = malloc((size_t)w * h * 3);
    cr_assert(px);
    unsigned char rgb[3];
    class_color(cls, rgb);
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < (size_t)w * h; i++) {
        s = s * 1103515245u + 12345u;
        int noise = (int)((s >> 16) % 9) - 4; /* texture, so images differ */
        for (int c = 0; c < 3; c++) {
            int v = rgb[c] + noise;
            px[i * 3 + c] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    tjhandle tj = tjInitCompress();
    cr_assert(tj);
    unsigned char *jpeg = NULL;
    *len = 0;
    cr_assert(tjCompress2(tj, px, (int)w, 0, (int)h, TJPF_RGB, &jpeg, len, TJSAMP_420, 90, 0) == 0,
              "%s", tjGetErrorStr2(tj));
    tjDestroy(tj);
    free(px);
    return jpeg;
}

/* Sample i of class cls as a w x h JPEG (cut to 60 % when corrupt: the
 * entropy data stops mid-scan) with its .cls and .txt ("key sNNNNN"). */
static void write_sample(const char *dir, unsigned i, int cls, unsigned w, unsigned h, int corrupt)
{
    unsigned long len;
    unsigned char *j = make_jpeg(cls, w, h, i, &len);
    char rel[64], txt[64];
    if (corrupt)
        len = len * 6 / 10;
    snprintf(rel, sizeof(rel), "s%05u.jpg", i);
    cr_assert(test_write_file(dir, rel, j, len) == 0);
    tjFree(j);
    snprintf(rel, sizeof(rel), "s%05u.cls", i);
    snprintf(txt, sizeof(txt), "%d", cls);
    cr_assert(test_write_file(dir, rel, txt, strlen(txt)) == 0);
    snprintf(rel, sizeof(rel), "s%05u.txt", i);
    snprintf(txt, sizeof(txt), "key s%05u", i);
    cr_assert(test_write_file(dir, rel, txt, strlen(txt)) == 0);
}

static void make_images(const char *dir, unsigned n, int corrupt_index, unsigned side)
{
    cr_assert(mkdir(dir, 0755) == 0 || errno == EEXIST, "%s", dir);
    for (unsigned i = 0; i < n; i++) {
        unsigned w = side ? side : 48 + (i * 13) % 80, h = side ? side * 3 / 4 : 40 + (i * 29) % 72;
        write_sample(dir, i, (int)((i * 7 + 3) % N_CLASSES), w, h, (int)i == corrupt_index);
    }
}

void make_flat(const char *dir, unsigned n, int corrupt_index)
{
    make_images(dir, n, corrupt_index, 0);
}

void pack(const char *src, const char *dest, unsigned long long shard_bytes, struct sf_s3 *s3)
{
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.layout = SF_PACK_LAYOUT_FLAT;
    o.shard_bytes = shard_bytes;
    o.s3 = s3;
    struct sf_pack_result r;
    char err[1024] = "";
    cr_assert(sf_pack(src, dest, &o, &r, err, sizeof(err)) == SF_OK, "pack: %s", err);
}

void local_dataset_sized(unsigned n, unsigned long long shard_bytes, int corrupt_index,
                         unsigned side)
{
    loader_tmpdir();
    char src[700];
    snprintf(src, sizeof(src), "%s/src", tmp);
    make_images(src, n, corrupt_index, side);
    snprintf(shards, sizeof(shards), "%s/shards/", tmp);
    pack(src, shards, shard_bytes, NULL);
    n_samples = n;
}

void local_dataset(unsigned n, unsigned long long shard_bytes, int corrupt_index)
{
    local_dataset_sized(n, shard_bytes, corrupt_index, 0);
}

void local_dataset_large(unsigned n)
{
    local_dataset_sized(n, 1 << 20, -1, 640);
}

void base_options(struct sf_loader_options *o, const char *const *sources, size_t n)
{
    sf_loader_options_init_default(o);
    o->sources = sources;
    o->source_count = n;
    o->batch_size = 16;
    o->prefetch_batches = 3;
    o->prefetch_shards = 2;
    o->decode_threads = 2;
    o->image.width = 32;
    o->image.height = 24;
    o->sampler.shuffle_buffer = 50;
    o->sampler.seed = 7;
    o->sampler.rank = 0;
    o->sampler.world_size = 1;
    o->extra_fields = "txt";
    o->device = SF_DEVICE_HOST;
}

const char *shards_src[1] = {shards};

void rank_options(struct sf_loader_options *o, const char *const *sources, size_t n, int rank,
                  int world_size)
{
    base_options(o, sources, n);
    o->sampler.rank = rank;
    o->sampler.world_size = world_size;
}
const char *bucket_src[1] = {"s3://bucket/data/"};

void local_options(struct sf_loader_options *o, unsigned n, unsigned long long shard_bytes)
{
    local_dataset(n, shard_bytes, -1);
    base_options(o, shards_src, 1);
}

void bucket_options(struct sf_loader_options *o, unsigned n, unsigned long long shard_bytes,
                    const char *const *mock_args, const char *cache_dir)
{
    mock_dataset_with(n, shard_bytes, mock_args);
    s3_options(o, bucket_src, cache_dir);
}

struct sf_loader *open_loader(const struct sf_loader_options *o)
{
    struct sf_loader *l = NULL;
    char err[1024] = "";
    sf_status st = sf_loader_open(o, &l, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "open: %s (%s)", err, sf_status_name(st));
    return l;
}

struct sf_loader *reopen_from_state(struct sf_loader *l, const struct sf_loader_options *o,
                                    const unsigned char *state)
{
    sf_loader_close(l);
    l = open_loader(o);
    cr_assert_eq(sf_loader_state_restore(l, state, SF_LOADER_STATE_BYTES), SF_OK, "%s",
                 sf_loader_errmsg(l));
    return l;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

sf_status run_epoch(struct sf_loader *l, struct epoch_log *e, unsigned max_batches)
{
    memset(e, 0, sizeof(*e));
    e->digest = 0xcbf29ce484222325ULL;
    e->seen = calloc(n_samples, 1);
    e->labels_ok = 1;
    for (;;) {
        if (max_batches && e->batches >= max_batches)
            return SF_OK;
        struct sf_batch b;
        sf_status st = sf_loader_next(l, &b);
        if (st != SF_OK)
            return st;
        cr_assert(b.size > 0 && b.size <= 16);
        cr_assert_eq(b.channels, 3u);
        e->digest = fnv(e->digest, b.images, b.size * b.image_bytes);
        e->digest = fnv(e->digest, b.labels, b.size * sizeof(*b.labels));
        for (size_t i = 0; i < b.size; i++) {
            const unsigned char *px = (const unsigned char *)b.images + i * b.image_bytes;
            int cls = class_of(px, (size_t)b.width * b.height, b.layout);
            if (cls != b.labels[i])
                e->labels_ok = 0;
            unsigned k = 0;
            cr_assert(sscanf(b.keys[i], "s%u", &k) == 1, "key %s", b.keys[i]);
            cr_assert(k < n_samples);
            char want[64];
            snprintf(want, sizeof(want), "key %s", b.keys[i]);
            cr_assert_eq(b.field_count, 1u);
            const struct sf_batch_field *f = &b.fields[0];
            size_t len = f->offsets[i + 1] - f->offsets[i];
            cr_assert(len == strlen(want) && !memcmp(f->data + f->offsets[i], want, len),
                      "txt field of %s", b.keys[i]);
            if (b.flags[i] & SF_SAMPLE_PAD)
                e->pads++;
            else
                e->seen[k]++;
        }
        e->images += (unsigned)b.size;
        e->batches++;
        sf_loader_release(l, &b);
    }
}

struct sf_loader *open_and_run_epoch(const struct sf_loader_options *o, struct epoch_log *e)
{
    struct sf_loader *l = open_loader(o);
    cr_assert_eq(run_epoch(l, e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    return l;
}

struct sf_loader *open_and_save_mid_epoch(const struct sf_loader_options *o, unsigned head_batches,
                                          unsigned char *state, struct epoch_log *head,
                                          struct epoch_log *tail)
{
    struct sf_loader *l = open_loader(o);
    cr_assert_eq(run_epoch(l, head, head_batches), SF_OK, "%s", sf_loader_errmsg(l));
    cr_assert_eq(sf_loader_state_save(l, state, SF_LOADER_STATE_BYTES), SF_OK, "%s",
                 sf_loader_errmsg(l));
    cr_assert_eq(run_epoch(l, tail, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    return l;
}

void expect_resumes_to_tail(struct sf_loader *l, const unsigned char *state, struct epoch_log *head,
                            struct epoch_log *tail)
{
    struct epoch_log again;
    cr_assert_eq(sf_loader_state_restore(l, state, SF_LOADER_STATE_BYTES), SF_OK, "%s",
                 sf_loader_errmsg(l));
    cr_assert_eq(run_epoch(l, &again, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(again.digest, tail->digest, "resumed batches differ");
    free(head->seen);
    free(tail->seen);
    free(again.seen);
    sf_loader_close(l);
}

/* ------------------------------------------------------------ against the mock */

void mock_dataset_with(unsigned n, unsigned long long shard_bytes, const char *const *mock_args)
{
    tmp = mock_env_root(root, sizeof(root));
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    char src[700];
    snprintf(src, sizeof(src), "%s/src", tmp);
    make_flat(src, n, -1);
    /* pack straight into the bucket's folder: the mock serves it */
    char dest[900];
    snprintf(dest, sizeof(dest), "%s/bucket/data/", root);
    pack(src, dest, shard_bytes, NULL);
    n_samples = n;
    mock_env_start(&srv, root, mock_args);
}

void mock_dataset(unsigned n, unsigned long long shard_bytes)
{
    mock_dataset_with(n, shard_bytes, NULL);
}

void s3_options(struct sf_loader_options *o, const char *const *src, const char *cache_dir)
{
    base_options(o, src, 1);
    o->s3.endpoint_url = srv.url;
    o->s3.retry_base_ms = 5;
    o->s3.retry_cap_ms = 100;
    o->s3.chunk_bytes = 16 << 10;
    o->cache.dir = cache_dir;
    o->ram_only = cache_dir == NULL;
}

long admin(const char *method, const char *path_query, const char *body)
{
    return mock_env_admin(&srv, method, path_query, body, NULL);
}

int run_cli(const char *const *args, char *out, size_t out_len)
{
    return run_cli_err(args, out, out_len, NULL, 0);
}

void expect_usage_error(const char *const *args)
{
    char out[8192];
    cr_expect_eq(run_cli(args, out, sizeof(out)), 2, "%s %s: %s", args[1], args[2], out);
}

void remove_index(const char *dir)
{
    char p[900];
    snprintf(p, sizeof(p), "%sindex.json", dir);
    cr_assert(unlink(p) == 0, "no index.json in %s", dir);
}

void remove_bucket_index(void)
{
    char dir[900];
    snprintf(dir, sizeof(dir), "%s/bucket/data/", root);
    remove_index(dir);
}

/* The loader's log, kept (any loader thread may log). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
char log_text[16384];

static void keep_log(void *user, enum sf_log_level level, const char *message)
{
    (void)user;
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%s\n", message);
    pthread_mutex_unlock(&log_mu);
}

int log_has(const char *what)
{
    pthread_mutex_lock(&log_mu);
    int has = strstr(log_text, what) != NULL;
    pthread_mutex_unlock(&log_mu);
    return has;
}

void log_clear(void)
{
    pthread_mutex_lock(&log_mu);
    log_text[0] = 0;
    pthread_mutex_unlock(&log_mu);
}

void keep_log_in(struct sf_loader_options *o)
{
    o->log = keep_log;
    o->log_level = SF_LOG_INFO;
}

void make_sized(const char *dir, unsigned first, unsigned n, unsigned mid_to, unsigned big_to)
{
    cr_assert(mkdir(dir, 0755) == 0 || errno == EEXIST, "%s", dir);
    for (unsigned i = first; i < n; i++) {
        unsigned px = i < mid_to ? 160 : i < big_to ? 320 : 8;
        write_sample(dir, i, (int)((i * 7 + 3) % N_CLASSES), px, px, 0);
    }
}

void sized_dataset(unsigned n, unsigned mid_to, unsigned big_to, unsigned long long shard_bytes)
{
    loader_tmpdir();
    char src_dir[700];
    snprintf(src_dir, sizeof(src_dir), "%s/src", tmp);
    make_sized(src_dir, 0, n, mid_to, big_to);
    snprintf(shards, sizeof(shards), "%s/shards/", tmp);
    pack(src_dir, shards, shard_bytes, NULL);
    n_samples = n;
    remove_index(shards);
}

int run_cli_err(const char *const *args, char *out, size_t out_len, char *err, size_t err_len)
{
    char path[900], epath[900];
    snprintf(path, sizeof(path), "%s/cli.out", tmp);
    snprintf(epath, sizeof(epath), "%s/cli.err", tmp);
    /* run_cli runs without a tmp too (then out stays empty) */
    int rc = test_run(args, tmp ? path : NULL, err ? epath : NULL);
    cr_assert(rc >= 0, "%s did not run", args[0]);
    const char *paths[2] = {path, epath};
    char *bufs[2] = {out, err};
    size_t lens[2] = {out_len, err_len};
    for (int i = 0; i < (err ? 2 : 1); i++) {
        FILE *f = fopen(paths[i], "r");
        size_t n = f ? fread(bufs[i], 1, lens[i] - 1, f) : 0;
        bufs[i][n] = 0;
        if (f)
            fclose(f);
    }
    return rc;
}
