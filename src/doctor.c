/*
 * shardfeed doctor: each stage of the pipeline on its own, on the user's
 * data and options, to find the one that bounds it (docs/doctor.md). The
 * method is the stage-caching one: feed a stage from a cached copy of its
 * input, so that it runs as fast as it alone can.
 *
 *   fetch     ranged GETs of the shards from the store into memory (the
 *             loader's concurrency, then 4x), the cache untouched
 *   read      tar / record parsing of shard bytes held in memory
 *   decode    the loader's decoder (crop, resize, flip, layout) on raw
 *             samples held in memory: one thread, then decode_threads
 *   assembly  copying decoded images into a batch buffer
 *   device    host-to-device copy (+ normalise) of one host batch, on the
 *             loader's device (CUDA or the emulated one)
 *
 * The caller adds its training step and a run of the whole pipeline with it
 * (sf_doctor_conclude, in src/doctor_conclude.c).
 */
#include "shardfeed.h"
#include "shardfeed_loader.h"
#include "shardfeed_shard.h"

#include "src/decode.h"
#include "src/doctor.h"
#include "src/gpu.h"
#include "src/loader.h"
#include "src/pack_reencode.h"
#include "src/shard_reader.h"
#include "common/clock.h"
#include "common/cpu.h"
#include "common/strbuf.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define READ_CAP_BYTES   (64ull << 20) /* shard bytes kept for the read and decode stages */
#define MAX_RAW          512u          /* raw samples kept for the decode stage */
#define FETCH_SLOT_BYTES (16ull << 20) /* per fetch in the fetch stage */
#define MAX_SLOTS        64u           /* fetches in flight in the fetch stage */
#define FETCH_MEMORY     (256ull << 20) /* their buffers in all */

struct raw {
    unsigned char *data;
    size_t size;
    const char *shard;         /* its shard's URL (the listing's) */
    char *key;                 /* its key, owned; NULL in re-encoded copies */
    unsigned long long offset; /* of the image in the shard */
};

struct sf__doctor {
    const struct sf_loader_options *o;
    struct sf_doctor_result *r;
    double stage_s;
    struct sf_s3 *s3;
    struct sf_object_list **lists;
    size_t n_lists;
    const struct sf_object_info **shards;
    size_t n_shards;
    /* shard bytes held for the read stage */
    unsigned char **held;
    size_t *held_len;
    const char **held_name;
    unsigned long long *held_size; /* the object's size (SF_SIZE_UNKNOWN: unknown) */
    size_t n_held;
    struct raw raw[MAX_RAW];
    unsigned n_raw;
    /* 1: raw[i] failed to decode and on_error is skip: left out, as the
     * loader leaves it out. Set by any decode thread. */
    atomic_uchar bad[MAX_RAW];
    int remote;
    double bytes_per_sample;
    unsigned long long held_bytes;
};

static int is_image_field(const struct sf_loader_options *o, const char *name)
{
    const char *list = o->image_fields ? o->image_fields : "jpg;jpeg";
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ';');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, name, n))
            return 1;
        p += l + (e != NULL);
    }
    return 0;
}

static sf_status list_shards(struct sf__doctor *d, char *err, size_t len)
{
    size_t total = 0;
    sf_status st = sf__loader_expand_each(d->s3, d->o, 0, &d->lists, &d->n_lists, &total, err, len);
    if (st != SF_OK)
        return st;
    d->shards = calloc(total ? total : 1, sizeof(*d->shards));
    if (!d->shards)
        return SF_ERR_NO_MEMORY;
    for (size_t i = 0; i < d->n_lists; i++)
        for (size_t k = 0; k < sf_object_list_count(d->lists[i]); k++) {
            const struct sf_object_info *obj = sf_object_list_get(d->lists[i], k);
            if (sf__shard_file_name(obj->key))
                d->shards[d->n_shards++] = obj;
            if (!strncmp(obj->url, "s3://", 5) || !strncmp(obj->url, "http", 4))
                d->remote = 1;
        }
    if (d->n_shards == 0)
        return sf__fail(err, len, SF_ERR_NOT_FOUND, "no shards in the sources (*.tar, *.sfr)");
    return SF_OK;
}

/* Reads whole shards (the first ones, READ_CAP_BYTES in all at most; the
 * last one may be cut) into memory. */
static sf_status hold_shards(struct sf__doctor *d, char *err, size_t len)
{
    d->held = calloc(d->n_shards, sizeof(*d->held));
    d->held_len = calloc(d->n_shards, sizeof(*d->held_len));
    d->held_name = calloc(d->n_shards, sizeof(*d->held_name));
    d->held_size = calloc(d->n_shards, sizeof(*d->held_size));
    struct sf_fetch **f = calloc(d->n_shards ? d->n_shards : 1, sizeof(*f));
    if (!d->held || !d->held_len || !d->held_name || !d->held_size || !f) {
        free(f);
        return SF_ERR_NO_MEMORY;
    }
    /* All started at once, so a link with a per-connection cap reads them
     * in the time of one, not one after the other. */
    unsigned long long left = READ_CAP_BYTES;
    size_t n = 0;
    sf_status st = SF_OK;
    for (size_t i = 0; i < d->n_shards && left > 0 && st == SF_OK; i++) {
        const struct sf_object_info *obj = d->shards[i];
        unsigned long long want = obj->size != SF_SIZE_UNKNOWN && obj->size < left ? obj->size
                                                                                   : left;
        if (want == 0)
            continue;
        unsigned char *buf = malloc((size_t)want);
        if (!buf) {
            st = SF_ERR_NO_MEMORY;
            break;
        }
        struct sf_fetch_options fo;
        sf_fetch_options_init_default(&fo);
        fo.buffer = buf;
        fo.buffer_bytes = want;
        fo.length = want;
        fo.size = obj->size;
        d->held[n] = buf;
        d->held_name[n] = obj->url;
        d->held_size[n] = obj->size;
        st = sf_fetch_start(d->s3, obj->url, &fo, &f[n]);
        if (st != SF_OK) {
            char why[1024];
            sf_s3_errmsg(d->s3, why, sizeof(why));
            st = sf__fail(err, len, st, "reading %s: %s", obj->url,
                          why[0] ? why : sf_status_str(st));
        }
        n++;
        left -= want;
    }
    for (size_t i = 0; i < n; i++) {
        struct sf_fetch_progress p;
        sf_status w = SF_OK;
        if (st == SF_OK && f[i]) {
            w = sf_fetch_wait(f[i], SF_SIZE_UNKNOWN, -1, &p);
            if (w == SF_OK && p.status != SF_OK)
                w = p.status;
            if (w != SF_OK)
                st = sf__fail(err, len, w, "reading %s: %s", d->held_name[i],
                          sf_fetch_errmsg(f[i])[0] ? sf_fetch_errmsg(f[i]) : sf_status_str(w));
            else
                d->held_len[i] = p.total == SF_SIZE_UNKNOWN ? 0 : (size_t)p.total;
        }
        sf_fetch_destroy(f[i]);
    }
    free(f);
    /* Every buffer is owned by held[] (freed by sf__doctor_close). */
    d->n_held = n;
    return st;
}

/* Parses every held shard once; keeps raw samples when `keep`. Returns the
 * samples parsed, or -1 (err filled). */
static long long parse_all(struct sf__doctor *d, int keep, unsigned long long *bytes, char *err,
                           size_t len)
{
    long long n = 0;
    *bytes = 0;
    for (size_t i = 0; i < d->n_held; i++) {
        struct sf_shard_reader_options ro;
        sf_shard_reader_options_init_default(&ro);
        ro.name = d->held_name[i];
        struct sf_shard_reader *rd = NULL;
        if (sf_shard_reader_new(&ro, &rd, err, len) != SF_OK)
            return -1;
        /* held[i] is not shards[i] once an empty shard was skipped */
        const int whole = d->held_size[i] == d->held_len[i];
        sf_shard_reader_feed(rd, d->held[i], d->held_len[i],
                             whole ? d->held_len[i] : SF_SIZE_UNKNOWN);
        unsigned long long end = 0;
        for (;;) {
            struct sf_sample s;
            enum sf_shard_event ev;
            sf_status st = sf_shard_reader_next(rd, &s, &ev);
            if (st != SF_OK) {
                sf__fail(err, len, st, "%s", sf_shard_reader_errmsg(rd));
                sf_shard_reader_destroy(rd);
                return -1;
            }
            if (ev != SF_SHARD_SAMPLE)
                break; /* the end, or the cut end of the last shard held */
            n++;
            end = s.end;
            for (size_t k = 0; keep && k < s.field_count && d->n_raw < MAX_RAW; k++)
                if (is_image_field(d->o, s.fields[k].name)) {
                    struct raw *r = &d->raw[d->n_raw];
                    r->data = malloc(s.fields[k].size ? s.fields[k].size : 1);
                    if (!r->data) {
                        sf_shard_reader_destroy(rd);
                        sf__fail(err, len, SF_ERR_NO_MEMORY, "out of memory");
                        return -1;
                    }
                    memcpy(r->data, s.fields[k].data, s.fields[k].size);
                    r->size = s.fields[k].size;
                    r->shard = d->held_name[i];
                    r->offset = s.fields[k].offset;
                    r->key = strdup(s.key);
                    d->n_raw++; /* freed by sf__doctor_close, key NULL or not */
                    if (!r->key) {
                        sf_shard_reader_destroy(rd);
                        sf__fail(err, len, SF_ERR_NO_MEMORY, "out of memory");
                        return -1;
                    }
                    break;
                }
        }
        *bytes += end;
        sf_shard_reader_destroy(rd);
    }
    return n;
}

/* The first pass: keeps the raw samples and the mean bytes per sample. */
static sf_status first_parse(struct sf__doctor *d, char *err, size_t len)
{
    unsigned long long bytes = 0;
    long long n = parse_all(d, 1, &bytes, err, len);
    if (n < 0)
        return SF_ERR_CORRUPT;
    if (n == 0 && d->n_held == 0) /* every shard is 0 bytes: none was held */
        return sf__fail(err, len, SF_ERR_NOT_FOUND, "no samples: %s is 0 bytes%s",
                        d->shards[0]->url, d->n_shards > 1 ? ", and so are the others" : "");
    if (n == 0)
        return sf__fail(err, len, SF_ERR_NOT_FOUND, "no samples in the first shards (%s)",
                        d->held_name[0]);
    d->bytes_per_sample = (double)bytes / (double)n;
    d->held_bytes = bytes;
    return SF_OK;
}

static sf_status stage_read(struct sf__doctor *d, char *err, size_t len)
{
    struct sf_doctor_result *r = d->r;
    const unsigned long long bytes = d->held_bytes;
    r->bytes_per_sample = d->bytes_per_sample;
    unsigned long long total = 0;
    double t0 = sf__now_s(), t;
    do {
        unsigned long long b;
        long long k = parse_all(d, 0, &b, err, len);
        if (k < 0)
            return SF_ERR_CORRUPT;
        total += (unsigned long long)k;
        t = sf__now_s() - t0;
    } while (t < d->stage_s);
    r->stage_per_s[SF_STAGE_READ] = (double)total / t;
    snprintf(r->stage_note[SF_STAGE_READ], sizeof(r->stage_note[0]),
             "parse %zu shard(s) held in memory (%.1f MiB, %.0f KiB per sample), one thread",
             d->n_held, (double)bytes / 1048576.0, r->bytes_per_sample / 1024.0);
    return SF_OK;
}

struct decode_job {
    struct sf__doctor *d;
    double until;
    unsigned first;
    unsigned long long done;
    double busy_s;
    sf_status st;
    const struct raw *bad; /* the sample that failed */
    char err[256];
};

static void *decode_main(void *arg)
{
    struct decode_job *j = arg;
    struct sf__doctor *d = j->d;
    struct sf_decoder *dec = NULL;
    size_t bytes = sf__image_bytes(&d->o->image);
    unsigned char *out = malloc(bytes ? bytes : 1);
    if (!out || sf__decoder_new(&dec) != SF_OK) {
        j->st = SF_ERR_NO_MEMORY;
        free(out);
        return NULL;
    }
    const int skip = d->o->on_error == SF_ON_ERROR_SKIP;
    double t0 = sf__now_s();
    /* At least one image each: a thread the scheduler starts after the span
     * (a loaded machine, a short --seconds) still measures something; unless
     * every sample is left out (bad_run: those seen one after the other). */
    unsigned bad_run = 0;
    for (unsigned i = j->first; (j->done == 0 || sf__now_s() < j->until) && bad_run < d->n_raw;
         i++) {
        const unsigned k = i % d->n_raw;
        const struct raw *r = &d->raw[k];
        if (atomic_load_explicit(&d->bad[k], memory_order_relaxed)) {
            bad_run++;
            continue;
        }
        struct sf__decode_info info;
        sf_status st = sf__decode_jpeg(dec, &d->o->image, r->data, r->size,
                                       sf__sample_rng_seed(7, 0, 0, i), out, &info, j->err,
                                       sizeof(j->err));
        if (st != SF_OK) {
            j->bad = r; /* the last failure: named if every sample fails */
            if (!skip) {
                j->st = st;
                break;
            }
            atomic_store_explicit(&d->bad[k], 1, memory_order_relaxed);
            bad_run++;
            continue;
        }
        bad_run = 0;
        j->done++;
    }
    j->busy_s = sf__now_s() - t0;
    sf__decoder_destroy(dec);
    free(out);
    return NULL;
}

/* decode_threads threads for span_s; returns samples/s (0 with st set). */
static double decode_for(struct sf__doctor *d, unsigned threads, double span_s, sf_status *st,
                         char *err, size_t len)
{
    struct decode_job *jobs = calloc(threads, sizeof(*jobs));
    pthread_t *tid = calloc(threads, sizeof(*tid));
    *st = SF_OK;
    if (!jobs || !tid) {
        free(jobs);
        free(tid);
        *st = SF_ERR_NO_MEMORY;
        return 0;
    }
    double t0 = sf__now_s();
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        jobs[i].d = d;
        jobs[i].until = t0 + span_s;
        jobs[i].first = i * 7919u;
        if (pthread_create(&tid[i], NULL, decode_main, &jobs[i]) != 0)
            break;
        started++;
    }
    unsigned long long done = 0;
    for (unsigned i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        done += jobs[i].done;
        if (jobs[i].st != SF_OK && *st == SF_OK) {
            *st = jobs[i].st;
            const struct raw *b = jobs[i].bad;
            if (b)
                sf__fail(err, len, *st, "decoding %s: sample '%s', image at offset %llu: %s",
                         b->shard, b->key, b->offset, jobs[i].err);
            else
                sf__fail(err, len, *st, "decoding: %s", sf_status_str(*st));
        }
    }
    double t = sf__now_s() - t0;
    for (unsigned i = 0; i < started && *st == SF_OK && done == 0; i++)
        if (jobs[i].bad) {
            const struct raw *b = jobs[i].bad;
            *st = sf__fail(err, len, SF_ERR_CORRUPT,
                           "decoding: none of the %u images held decodes (on_error skip); "
                           "%s: sample '%s', image at offset %llu: %s",
                           d->n_raw, b->shard, b->key, b->offset, jobs[i].err);
        }
    free(jobs);
    free(tid);
    if (started == 0 && *st == SF_OK)
        *st = sf__fail(err, len, SF_ERR_NO_MEMORY, "cannot start a decode thread");
    return *st == SF_OK && t > 0 ? (double)done / t : 0;
}

/* One thread decoding imgs round for span_s: images/s. */
static double decode_round(const struct sf__doctor *d, const struct raw *imgs, unsigned n,
                           double span_s, sf_status *st, char *err, size_t len)
{
    struct sf_decoder *dec = NULL;
    unsigned char *out = malloc(sf__image_bytes(&d->o->image));
    if (!out || sf__decoder_new(&dec) != SF_OK) {
        free(out);
        *st = SF_ERR_NO_MEMORY;
        return 0;
    }
    unsigned long long done = 0;
    double t0 = sf__now_s(), t = t0;
    for (unsigned i = 0; t - t0 < span_s || i < n; i++, t = sf__now_s()) {
        *st = sf__decode_jpeg(dec, &d->o->image, imgs[i % n].data, imgs[i % n].size,
                              sf__sample_rng_seed(7, 0, 0, i % n), out, NULL, err, len);
        if (*st != SF_OK)
            break;
        done++;
    }
    sf__decoder_destroy(dec);
    free(out);
    return *st == SF_OK && t > t0 ? (double)done / (t - t0) : 0;
}

/* What pack --max-side would give: up to 32 raw samples re-encoded in
 * memory (as pack does), then one thread decoding the originals and the
 * re-encoded ones in turn, the same crops. */
static void max_side_gain(struct sf__doctor *d)
{
    struct sf_doctor_result *r = d->r;
    struct raw pick[32], small[32]; /* up to 32 of those not left out */
    unsigned n = 0;
    for (unsigned i = 0; i < d->n_raw && n < 32; i++)
        if (!atomic_load_explicit(&d->bad[i], memory_order_relaxed))
            pick[n++] = d->raw[i];
    const struct sf__reencode re = {SF_DOCTOR_MAX_SIDE, 90};
    unsigned shrunk = 0;
    unsigned long long before = 0, after = 0;
    char err[256];
    for (unsigned i = 0; i < n; i++) {
        unsigned char *o = NULL;
        size_t on = 0;
        if (sf__reencode_jpeg(&re, pick[i].data, pick[i].size, &o, &on, err, sizeof(err)) !=
            SF_OK) {
            o = NULL; /* CMYK or unreadable: pack keeps those as they are */
        }
        small[i] = o ? (struct raw){.data = o, .size = on} : pick[i];
        shrunk += o != NULL;
        before += pick[i].size;
        after += small[i].size;
    }
    if (shrunk == 0) {
        r->max_side_speedup = r->max_side_bytes = n ? 1 : 0;
    } else {
        sf_status st = SF_OK;
        const double span = fmin(0.5, d->stage_s / 4);
        double a = decode_round(d, pick, n, span, &st, err, sizeof(err));
        double b = st == SF_OK ? decode_round(d, small, n, span, &st, err, sizeof(err)) : 0;
        r->max_side_speedup = st == SF_OK && a > 0 ? b / a : 0;
        r->max_side_bytes = before ? (double)after / (double)before : 0;
    }
    for (unsigned i = 0; i < n; i++)
        if (small[i].data != pick[i].data)
            free(small[i].data);
}

static sf_status stage_decode(struct sf__doctor *d, char *err, size_t len)
{
    struct sf_doctor_result *r = d->r;
    if (d->n_raw == 0) {
        snprintf(r->stage_note[SF_STAGE_DECODE], sizeof(r->stage_note[0]),
                 "no image field in the first shards: nothing to decode");
        return SF_OK;
    }
    sf_status st;
    r->decode_per_thread_per_s = decode_for(d, 1, d->stage_s / 2, &st, err, len);
    if (st != SF_OK)
        return st;
    r->stage_per_s[SF_STAGE_DECODE] = decode_for(d, r->decode_threads, d->stage_s / 2, &st, err, len);
    if (st != SF_OK)
        return st;
    unsigned skipped = 0;
    for (unsigned i = 0; i < d->n_raw; i++)
        skipped += atomic_load_explicit(&d->bad[i], memory_order_relaxed) != 0;
    r->samples_measured = d->n_raw - skipped;
    max_side_gain(d);
    char left_out[64] = "";
    if (skipped)
        snprintf(left_out, sizeof(left_out), "; %u skipped (on_error skip)", skipped);
    snprintf(r->stage_note[SF_STAGE_DECODE], sizeof(r->stage_note[0]),
             "%u raw samples held in memory, %ux%u output: %.0f img/s on one thread, %u threads "
             "together%s",
             d->n_raw, d->o->image.width, d->o->image.height, r->decode_per_thread_per_s,
             r->decode_threads, left_out);
    return SF_OK;
}

static sf_status stage_assembly(struct sf__doctor *d, char *err, size_t len)
{
    struct sf_doctor_result *r = d->r;
    const size_t img = sf__image_bytes(&d->o->image);
    const unsigned bs = d->o->batch_size ? d->o->batch_size : 1;
    /* 16 decoded images copied round into a batch buffer, as the workers'
     * outputs land in a ring slot. */
    unsigned char *src = malloc(16 * img), *dst = malloc(bs * img);
    int64_t *labels = malloc(bs * sizeof(*labels));
    if (!src || !dst || !labels) {
        free(src);
        free(dst);
        free(labels);
        return sf__fail(err, len, SF_ERR_NO_MEMORY, "out of memory for a batch of %u images", bs);
    }
    memset(src, 0x5a, 16 * img);
    unsigned long long n = 0;
    double t0 = sf__now_s(), t;
    do {
        for (unsigned i = 0; i < bs; i++) {
            memcpy(dst + (size_t)i * img, src + (size_t)(i % 16) * img, img);
            labels[i] = (int64_t)i;
        }
        n += bs;
        t = sf__now_s() - t0;
    } while (t < d->stage_s / 4);
    r->stage_per_s[SF_STAGE_ASSEMBLY] = (double)n / t;
    snprintf(r->stage_note[SF_STAGE_ASSEMBLY], sizeof(r->stage_note[0]),
             "copy %u decoded images of %zu bytes into a batch buffer, one thread", bs, img);
    volatile unsigned char sink = dst[img - 1];
    (void)sink;
    (void)labels[0];
    free(src);
    free(dst);
    free(labels);
    return SF_OK;
}

static sf_status stage_device(struct sf__doctor *d, char *err, size_t len)
{
    struct sf_doctor_result *r = d->r;
    const struct sf_loader_options *o = d->o;
    enum sf__gpu_backend be;
    if (o->device == SF_DEVICE_EMULATED)
        be = SF__GPU_EMULATED;
    else if ((o->device == SF_DEVICE_CUDA || o->device == SF_DEVICE_AUTO) && sf__gpu_usable(-1))
        be = SF__GPU_CUDA;
    else {
        snprintf(r->stage_note[SF_STAGE_DEVICE], sizeof(r->stage_note[0]),
                 "host batches: no device copy");
        return SF_OK;
    }
    const size_t img = sf__image_bytes(&o->image);
    const unsigned bs = o->batch_size ? o->batch_size : 1;
    const int norm = o->normalize_on_device && o->image.dtype == SF_DTYPE_UINT8;
    struct sf__gpu_config c = {be, o->cuda_device >= 0 ? o->cuda_device : 0, 2, bs * img,
                               norm ? bs * img * sizeof(float) : 0, NULL};
    struct sf_gpu *g = NULL;
    char e[256] = "";
    sf_status st = sf__gpu_open(&c, &g, e, sizeof(e));
    if (st != SF_OK)
        return sf__fail(err, len, st, "device: %s", e);
    int pinned = 0;
    void *host = sf__host_alloc(bs * img, 1, &pinned);
    if (!host) {
        sf__gpu_close(g);
        return sf__fail(err, len, SF_ERR_NO_MEMORY, "out of memory for a host batch");
    }
    memset(host, 0x33, bs * img);
    struct sf__gpu_job job = {.host = host,
                              .bytes = bs * img,
                              .normalize = norm,
                              .n_images = bs,
                              .width = o->image.width,
                              .height = o->image.height,
                              .layout = o->image.layout};
    memcpy(job.mean, o->image.mean, sizeof(job.mean));
    memcpy(job.std, o->image.std, sizeof(job.std));
    unsigned long long n = 0;
    double t0 = sf__now_s(), t;
    unsigned slot = 0;
    do {
        st = sf__gpu_submit(g, slot, &job, e, sizeof(e));
        if (st == SF_OK)
            st = sf__gpu_wait(g, slot, NULL, e, sizeof(e));
        if (st != SF_OK)
            break;
        slot ^= 1;
        n += bs;
        t = sf__now_s() - t0;
    } while (t < d->stage_s / 2);
    sf__host_free(host, pinned);
    sf__gpu_close(g);
    if (st != SF_OK)
        return sf__fail(err, len, st, "device: %s", e);
    r->stage_per_s[SF_STAGE_DEVICE] = (double)n / t;
    snprintf(r->stage_note[SF_STAGE_DEVICE], sizeof(r->stage_note[0]),
             "%s: copy%s of one %s host batch of %u images", be == SF__GPU_CUDA ? "CUDA" : "emulated device",
             norm ? " + normalise" : "", pinned ? "pinned" : "pageable", bs);
    return SF_OK;
}

/* Fetches shards from the store into memory with `concurrency` in flight
 * for span_s: MiB/s. */
static sf_status fetch_for(struct sf__doctor *d, unsigned concurrency,
                           unsigned long long chunk_bytes, double span_s, double *mib_s,
                           double *agg_mib_s, char *err, size_t len)
{
    struct sf_s3_options so = d->o->s3;
    so.concurrency = concurrency;
    if (chunk_bytes)
        so.chunk_bytes = chunk_bytes;
    struct sf_s3 *s3 = NULL;
    sf_status st = sf_s3_new(&so, &s3, err, len);
    if (st != SF_OK)
        return st;
    /* Enough objects in flight for `concurrency` ranges of chunk bytes (as
     * the loader's prefetch_shards would be set for them), at least 4 and
     * at most MAX_SLOTS, FETCH_MEMORY bytes of buffers in all. */
    const unsigned long long chunk = so.chunk_bytes ? so.chunk_bytes : 8ull << 20;
    unsigned long long shard = 0, k = 0;
    for (size_t i = 0; i < d->n_shards; i++)
        if (d->shards[i]->size != SF_SIZE_UNKNOWN) {
            shard += d->shards[i]->size;
            k++;
        }
    shard = k ? shard / k : FETCH_SLOT_BYTES;
    const unsigned long long per = shard < FETCH_SLOT_BYTES ? (shard ? shard : 1) : FETCH_SLOT_BYTES;
    unsigned long long want = (concurrency * chunk + per - 1) / per;
    if (want < 4)
        want = 4;
    if (want > MAX_SLOTS)
        want = MAX_SLOTS;
    if (want * per > FETCH_MEMORY)
        want = FETCH_MEMORY / per ? FETCH_MEMORY / per : 1;
    const unsigned slots = (unsigned)want;
    /* As the loader's reader consumes them: objects in order, `slots` in
     * flight, a new one started when the oldest completes. What counts is
     * what the reader could have parsed: the objects completed in order plus
     * what arrived of the oldest one. So the chunk size shows where it
     * matters (one range per object makes the head object crawl at one
     * connection's rate), and so does the concurrency. */
    struct sf_fetch *f[MAX_SLOTS] = {0};
    unsigned char *buf[MAX_SLOTS] = {0};
    unsigned long long length[MAX_SLOTS] = {0};
    size_t next = 0;
    unsigned head = 0, live = 0;
    unsigned long long delivered = 0;
    double t0 = sf__now_s(), t = 0;
    for (unsigned i = 0; i < slots && st == SF_OK; i++) {
        buf[i] = malloc((size_t)per);
        if (!buf[i])
            st = sf__fail(err, len, SF_ERR_NO_MEMORY, "out of memory");
    }
    while (st == SF_OK && (t = sf__now_s() - t0) < span_s) {
        /* top up the window, in order, behind the head */
        while (st == SF_OK && live < slots) {
            const unsigned i = (head + live) % slots;
            const struct sf_object_info *obj = d->shards[next++ % d->n_shards];
            struct sf_fetch_options fo;
            sf_fetch_options_init_default(&fo);
            fo.buffer = buf[i];
            fo.buffer_bytes = per;
            fo.length = obj->size != SF_SIZE_UNKNOWN && obj->size < per ? obj->size : per;
            fo.size = obj->size;
            if (fo.length == 0)
                continue;
            length[i] = fo.length;
            st = sf_fetch_start(s3, obj->url, &fo, &f[i]);
            if (st != SF_OK) {
                char why[1024];
                sf_s3_errmsg(s3, why, sizeof(why));
                sf__fail(err, len, st, "fetching %s: %s", obj->url,
                         why[0] ? why : sf_status_str(st));
            } else {
                live++;
            }
        }
        if (st != SF_OK)
            break;
        struct sf_fetch_progress p;
        memset(&p, 0, sizeof(p));
        sf_fetch_set_priority(f[head], 1);
        sf_fetch_wait(f[head], SF_SIZE_UNKNOWN, 5, &p);
        if (!p.done)
            continue;
        if (p.status != SF_OK) {
            st = sf__fail(err, len, p.status, "fetching: %s", sf_fetch_errmsg(f[head]));
            break;
        }
        delivered += length[head];
        sf_fetch_destroy(f[head]);
        f[head] = NULL;
        head = (head + 1) % slots;
        live--;
    }
    if (live && f[head]) {
        struct sf_fetch_progress p;
        sf_fetch_progress(f[head], &p);
        delivered += p.received;
    }
    struct sf_s3_stats ss;
    sf_s3_get_stats(s3, &ss);
    for (unsigned i = 0; i < slots; i++)
        sf_fetch_destroy(f[i]);
    sf_s3_destroy(s3);
    for (unsigned i = 0; i < slots; i++)
        free(buf[i]);
    *mib_s = t > 0 ? (double)delivered / 1048576.0 / t : 0;
    if (agg_mib_s)
        *agg_mib_s = t > 0 ? (double)ss.bytes_received / 1048576.0 / t : 0;
    return st;
}

static sf_status stage_fetch(struct sf__doctor *d, char *err, size_t len)
{
    struct sf_doctor_result *r = d->r;
    if (!d->remote) {
        snprintf(r->stage_note[SF_STAGE_FETCH], sizeof(r->stage_note[0]),
                 "local files: nothing to fetch");
        return SF_OK;
    }
    r->concurrency = d->o->s3.concurrency ? d->o->s3.concurrency : 32;
    r->concurrency_more = r->concurrency * 4;
    double in_order = 0;
    sf_status st = fetch_for(d, r->concurrency, 0, d->stage_s / 2, &in_order,
                             &r->fetch_mib_per_s, err, len);
    if (st == SF_OK)
        st = fetch_for(d, r->concurrency_more, 0, d->stage_s / 2, &in_order,
                       &r->fetch_mib_per_s_more, err, len);
    if (st != SF_OK)
        return st;
    if (r->bytes_per_sample > 0)
        r->stage_per_s[SF_STAGE_FETCH] = r->fetch_mib_per_s * 1048576.0 / r->bytes_per_sample;
    snprintf(r->stage_note[SF_STAGE_FETCH], sizeof(r->stage_note[0]),
             "ranged GETs into memory, cache untouched: %.1f MiB/s at concurrency %u, %.1f MiB/s "
             "at %u",
             r->fetch_mib_per_s, r->concurrency, r->fetch_mib_per_s_more, r->concurrency_more);
    return SF_OK;
}

/* Data smaller than one batch of this rank's epoch has no whole batch to
 * time: every stage rate would still name a bound, and that verdict would
 * be made up. The loader itself says how many samples the epoch holds (its
 * rank split, drop_last and pads are the pipeline's own rule): its epoch
 * size when known at open, else what it delivers up to one batch's worth or
 * the end of the epoch. A loader of its own, in memory and on the host: the
 * cache and the device are left as they were; one shard fetched ahead and
 * a ring of two batches, the least it runs with, so that memory stays
 * small whatever prefetch the options ask for. The CLI and the Python
 * package both get this from sf_doctor_measure(). */
static sf_status check_one_batch(const struct sf_loader_options *o, char *err, size_t len)
{
    struct sf_loader_options lo = *o;
    lo.ram_only = 1;
    lo.device = SF_DEVICE_HOST;
    lo.prefetch_shards = 1;
    lo.prefetch_batches = 2;
    const unsigned bs = o->batch_size ? o->batch_size : 256;
    struct sf_loader *l = NULL;
    sf_status st = sf_loader_open(&lo, &l, err, len);
    if (st != SF_OK)
        return st;
    unsigned long long n = 0;
    if (sf_loader_epoch_size_known(l)) {
        /* No batch: with drop_last the samples still count the short last
         * batch that is never delivered. */
        n = sf_loader_epoch_batches(l) ? sf_loader_epoch_samples(l) : 0;
    } else {
        while (st == SF_OK && n < bs) {
            struct sf_batch b;
            st = sf_loader_next(l, &b);
            if (st == SF_OK) {
                n += b.size;
                sf_loader_release(l, &b);
            }
        }
        if (st == SF_END_OF_EPOCH)
            st = SF_OK;
        else if (st != SF_OK)
            sf__fail(err, len, st, "%s", sf_loader_errmsg(l));
    }
    sf_loader_close(l);
    if (st != SF_OK || n >= bs)
        return st;
    if (n == 0)
        return sf__fail(err, len, SF_ERR_NOT_FOUND,
                        "the data is too small to measure: this rank's epoch delivers no batch "
                        "(batch_size %u%s): it holds fewer samples than one batch",
                        bs, o->drop_last ? ", drop_last" : "");
    return sf__fail(err, len, SF_ERR_NOT_FOUND,
                    "the data is too small to measure: this rank's epoch holds %llu sample%s, "
                    "fewer than one batch (batch_size %u): every batch is a partial one",
                    n, n == 1 ? "" : "s", bs);
}

void sf__doctor_close(struct sf__doctor *d)
{
    if (!d)
        return;
    for (unsigned i = 0; i < d->n_raw; i++) {
        free(d->raw[i].data);
        free(d->raw[i].key);
    }
    for (size_t i = 0; i < d->n_held; i++)
        free(d->held[i]);
    free(d->held);
    free(d->held_len);
    free(d->held_name);
    free(d->held_size);
    free(d->shards);
    sf__loader_lists_free(d->lists, d->n_lists);
    sf_s3_destroy(d->s3);
    free(d);
}

typedef sf_status (*doctor_step)(struct sf__doctor *d, char *err, size_t len);

/* Runs the n steps in order up to the first failure. */
static sf_status run_steps(struct sf__doctor *d, const doctor_step *steps, size_t n, char *err,
                           size_t len)
{
    sf_status st = SF_OK;
    for (size_t i = 0; st == SF_OK && i < n; i++)
        st = steps[i](d, err, len);
    return st;
}

sf_status sf__doctor_open(const struct sf_loader_options *o, struct sf__doctor **out, char *err,
                          size_t err_len)
{
    static const doctor_step steps[] = {list_shards, hold_shards, first_parse};
    *out = NULL;
    struct sf__doctor *d = calloc(1, sizeof(*d));
    if (!d)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    d->o = o;
    d->stage_s = 2.0;
    sf_status st = sf_s3_new(&o->s3, &d->s3, err, err_len);
    if (st == SF_OK)
        st = run_steps(d, steps, sizeof(steps) / sizeof(steps[0]), err, err_len);
    if (st != SF_OK) {
        sf__doctor_close(d);
        return st;
    }
    *out = d;
    return SF_OK;
}

int sf__doctor_remote(const struct sf__doctor *d)
{
    return d->remote;
}

double sf__doctor_bytes_per_sample(const struct sf__doctor *d)
{
    return d->bytes_per_sample;
}

unsigned long long sf__doctor_mean_shard_bytes(const struct sf__doctor *d)
{
    unsigned long long sum = 0, n = 0;
    for (size_t i = 0; i < d->n_shards; i++)
        if (d->shards[i]->size != SF_SIZE_UNKNOWN) {
            sum += d->shards[i]->size;
            n++;
        }
    return n ? sum / n : 0;
}

double sf__doctor_decode_rate(struct sf__doctor *d, unsigned threads, double span_s, sf_status *st,
                              char *err, size_t len)
{
    if (d->n_raw == 0) {
        *st = SF_OK;
        return 0;
    }
    return decode_for(d, threads ? threads : 1, span_s, st, err, len);
}

sf_status sf__doctor_fetch_rate(struct sf__doctor *d, unsigned concurrency,
                                unsigned long long chunk_bytes, double span_s, double *mib_s,
                                double *agg_mib_s, char *err, size_t len)
{
    *mib_s = 0;
    if (agg_mib_s)
        *agg_mib_s = 0;
    if (!d->remote)
        return SF_OK;
    return fetch_for(d, concurrency, chunk_bytes, span_s, mib_s, agg_mib_s, err, len);
}

sf_status sf_doctor_measure(const struct sf_loader_options *o, double stage_s,
                            struct sf_doctor_result *out, char *err, size_t err_len)
{
    if (!o || !out)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "doctor: no options or result");
    memset(out, 0, sizeof(*out));
    if (err && err_len)
        err[0] = 0;
    if (o->source_count == 0 || !o->sources)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "doctor: no sources");
    sf_status st = sf__image_options_check(&o->image, err, err_len);
    if (st != SF_OK)
        return st;
    out->cores = sf__cores_available();
    out->decode_threads = o->decode_threads ? o->decode_threads : out->cores;
    out->bound = SF_STAGE_NONE;
    struct sf__doctor *d = NULL;
    st = sf__doctor_open(o, &d, err, err_len);
    if (st != SF_OK)
        return st;
    d->r = out;
    d->stage_s = stage_s > 0 ? stage_s : 2.0;
    static const doctor_step stages[] = {stage_read, stage_decode, stage_assembly, stage_device,
                                         stage_fetch};
    st = run_steps(d, stages, sizeof(stages) / sizeof(stages[0]), err, err_len);
    sf__doctor_close(d);
    /* Last, so that a stage's own failure (a sample that does not decode)
     * is the one named. */
    if (st == SF_OK)
        st = check_one_batch(o, err, err_len);
    return st;
}
