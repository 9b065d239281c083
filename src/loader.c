/*
 * The loader: sampler -> fetch/cache -> shard reader -> decode workers ->
 * batch ring -> GPU prefetcher -> consumer (include/shardfeed_loader.h,
 * docs/loader.md).
 *
 * Threads:
 *  - the reader thread owns the S3 client's fetches, the cache (single
 *    threaded by contract), the shard readers and the sampler. It opens
 *    shards prefetch_shards ahead in plan order, parses them as bytes arrive,
 *    takes the sampler's order and puts each sample in its batch slot on the
 *    decode queue;
 *  - decode_threads workers decode into the slot and finish a batch when its
 *    last slot is done;
 *  - with a GPU, the gpu thread copies finished batches, in order, to the
 *    device slot of the same ring index and waits for the copy's event;
 *  - the consumer calls next/release.
 *
 * One mutex (l->mu) guards the shared state; the decode itself, parsing and
 * fetch waits run outside it. Shards stay open while a sample of theirs is
 * still to be delivered (counted per epoch by a second sampler run through
 * the epoch) or being decoded, so sample pointers into them stay valid.
 *
 * This file: open/close (options, sources, sample counts, thread start
 * and stop) and the helpers the other loader_*.c files share; it runs on
 * the thread that calls sf_loader_open / sf_loader_close. The rest is in
 * loader_api.c, loader_reader.c, loader_workers.c and loader_shard.c.
 */
#include "src/loader_internal.h"

#include "src/counts.h"
#include "src/decode.h"
#include "src/index_json.h"
#include "src/shard_reader.h"
#include "src/gpu.h"
#include "common/cpu.h"
#include "common/file.h"
#include "common/strbuf.h"
#include "common/strv.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

void sf__loader_log(struct sf_loader *l, enum sf_log_level lv, const char *fmt, ...)
{
    if (!l->o.log || lv > l->o.log_level)
        return;
    char buf[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    l->o.log(l->o.log_user, lv, buf);
}

/* Wakes every thread that waits on the loader. Under mu. */
static void wake_all(struct sf_loader *l)
{
    pthread_cond_broadcast(&l->cv_consumer);
    pthread_cond_broadcast(&l->cv_reader);
    pthread_cond_broadcast(&l->cv_work);
    pthread_cond_broadcast(&l->cv_gpu);
}

/* Records the first error (sticky) and wakes everyone. Takes mu. */
void sf__loader_fail(struct sf_loader *l, sf_status st, const char *fmt, ...)
{
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&l->mu);
    int first = l->error == SF_OK;
    if (first) {
        l->error = st;
        snprintf(l->errmsg, sizeof(l->errmsg), "%s", msg);
    }
    wake_all(l);
    pthread_mutex_unlock(&l->mu);
    if (first)
        sf__loader_log(l, SF_LOG_ERROR, "%s", msg);
}

void sf__loader_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* Splits "a;b;c" into a NULL-terminated array of owned strings (NULL when
 * out of memory). */
static char **split_names(const char *s, size_t *n)
{
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ';';
    char **v = calloc(cap + 1, sizeof(*v));
    if (!v)
        return NULL;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ';');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len) {
            v[*n] = strndup(p, len);
            if (!v[*n]) {
                sf__strv_free(v, *n);
                *n = 0;
                return NULL;
            }
            (*n)++;
        }
        p += len + (e ? 1 : 0);
    }
    return v;
}

int sf__loader_is_local(const char *url)
{
    return strncmp(url, "s3://", 5) && strncmp(url, "http://", 7) && strncmp(url, "https://", 8);
}

/* ------------------------------------------------------------ open / close */

void sf_loader_close(struct sf_loader *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    wake_all(l);
    pthread_mutex_unlock(&l->mu);
    for (unsigned i = 0; i < l->n_workers; i++)
        pthread_join(l->workers[i], NULL);
    /* Workers are gone: nothing decodes, so the reader's final wait ends. */
    pthread_mutex_lock(&l->mu);
    l->active_decodes = 0;
    pthread_mutex_unlock(&l->mu);
    if (l->reader_started)
        pthread_join(l->reader_th, NULL);
    if (l->gpu_started)
        pthread_join(l->gpu_th, NULL);
    sf__gpu_close(l->gpu);
    if (l->batches)
        for (unsigned i = 0; i < l->ring; i++)
            sf__loader_batch_free(l, &l->batches[i]);
    free(l->batches);
    free(l->workers);
    free(l->q);
    sf_sampler_destroy(l->sampler);
    sf_sampler_destroy(l->counter);
    sf_sampler_destroy(l->state_smp);
    sf_sampler_destroy(l->next_sampler);
    sf_sampler_destroy(l->next_counter);
    free(l->est_counts);
    free(l->known);
    free(l->stored);
    free(l->learned);
    free(l->learned_known);
    free(l->counts_dir);
    free(l->deliveries);
    free(l->slot_of);
    free(l->counts);
    free(l->objs);
    sf__loader_lists_free(l->lists, l->n_lists);
    sf_cache_destroy(l->cache);
    sf_s3_destroy(l->s3);
    sf__strv_free(l->img_names, l->n_img);
    sf__strv_free(l->lbl_names, l->n_lbl);
    sf__strv_free(l->extra_names, l->n_extra);
    sf__strv_free(l->extra_zst, l->n_extra);
    free(l->image_fields);
    free(l->label_fields);
    free(l->extra_fields);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_reader);
    pthread_cond_destroy(&l->cv_consumer);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_gpu);
    free(l);
}

sf_status sf__loader_expand_each(struct sf_s3 *s3, const struct sf_loader_options *o, int stat,
                                 struct sf_object_list ***lists, size_t *n_lists, size_t *total,
                                 char *err, size_t err_len)
{
    *n_lists = 0;
    *total = 0;
    *lists = calloc(o->source_count ? o->source_count : 1, sizeof(**lists));
    if (!*lists)
        return SF_ERR_NO_MEMORY;
    for (size_t i = 0; i < o->source_count; i++) {
        struct sf_object_list **l = &(*lists)[i];
        sf_status st = stat ? sf_s3_expand_stat(s3, o->sources[i], 0, l)
                            : sf_s3_expand(s3, o->sources[i], 0, l);
        if (st != SF_OK) {
            char m[ERR_LEN];
            sf_s3_errmsg(s3, m, sizeof(m));
            return sf__fail(err, err_len, st, "source '%s': %s", o->sources[i],
                            m[0] ? m : sf_status_str(st));
        }
        (*n_lists)++;
        *total += sf_object_list_count(*l);
    }
    return SF_OK;
}

void sf__loader_lists_free(struct sf_object_list **lists, size_t n_lists)
{
    for (size_t i = 0; i < n_lists; i++)
        sf_object_list_destroy(lists[i]);
    free(lists);
}

static sf_status expand_sources(struct sf_loader *l, char *err, size_t err_len)
{
    const struct sf_loader_options *o = &l->o;
    size_t total = 0;
    sf_status st =
        sf__loader_expand_each(l->s3, o, 1, &l->lists, &l->n_lists, &total, err, err_len);
    if (st != SF_OK)
        return st;
    l->objs = calloc(total ? total : 1, sizeof(*l->objs));
    if (!l->objs)
        return SF_ERR_NO_MEMORY;
    for (size_t i = 0; i < l->n_lists; i++) {
        /* A folder, named with or without its final '/', is listed: only
         * its shards are sources, not the index.json beside them. */
        int listing = sf__source_is_listing(o->sources[i]);
        l->sources_listed = (i == 0 || l->sources_listed) && listing;
        size_t n = sf_object_list_count(l->lists[i]);
        for (size_t k = 0; k < n; k++) {
            const struct sf_object_info *obj = sf_object_list_get(l->lists[i], k);
            if (listing && !sf__shard_file_name(obj->key))
                continue; /* index.json and other files beside the shards */
            l->objs[l->n_shards++] = obj;
        }
    }
    if (l->n_shards == 0) {
        snprintf(err, err_len, "no shards in the sources (a listing keeps *.tar and *.sfr)");
        return SF_ERR_NOT_FOUND;
    }
    return SF_OK;
}

/* Reads a whole small object (index.json) into memory. */
static sf_status read_small(struct sf_loader *l, const char *url, char **out, size_t *len)
{
    *out = NULL;
    if (sf__loader_is_local(url)) {
        const char *path = !strncmp(url, "file://", 7) ? url + 7 : url;
        FILE *f = fopen(path, "rb");
        if (!f)
            return sf__errno_status(errno);
        char *buf = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
            if (n + 65536 > cap) {
                if (cap > (64u << 20)) {
                    free(buf);
                    fclose(f);
                    return SF_ERR_LIMIT;
                }
                cap = cap ? cap * 2 : 131072;
                char *nb = realloc(buf, cap + 1);
                if (!nb) {
                    free(buf);
                    fclose(f);
                    return SF_ERR_NO_MEMORY;
                }
                buf = nb;
            }
            size_t r = fread(buf + n, 1, cap - n, f);
            n += r;
            if (r == 0)
                break;
        }
        fclose(f);
        buf[n] = 0;
        *out = buf;
        *len = n;
        return SF_OK;
    }
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(l->s3, url, &fo, &f);
    if (st != SF_OK)
        return st;
    struct sf_fetch_progress p;
    st = sf_fetch_wait(f, SF_SIZE_UNKNOWN, -1, &p);
    if (st == SF_OK && p.done && p.status == SF_OK) {
        size_t n = p.total == SF_SIZE_UNKNOWN ? 0 : (size_t)p.total;
        char *buf = malloc(n + 1);
        if (!buf) {
            sf_fetch_destroy(f);
            return SF_ERR_NO_MEMORY;
        }
        if (n)
            memcpy(buf, sf_fetch_data(f), n);
        buf[n] = 0;
        *out = buf;
        *len = n;
    } else if (st == SF_OK) {
        st = p.status;
    }
    sf_fetch_destroy(f);
    return st;
}

static const char *file_name(const char *url)
{
    const char *s = strrchr(url, '/');
    return s ? s + 1 : url;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A file name two shards have (in the objects' URLs), NULL when none is
 * shared; (const char *)l when out of memory. */
static const char *same_name(const struct sf_loader *l)
{
    const char **v = malloc(l->n_shards * sizeof(*v));
    if (!v)
        return (const char *)l;
    for (size_t i = 0; i < l->n_shards; i++)
        v[i] = file_name(l->objs[i]->url);
    qsort(v, l->n_shards, sizeof(*v), cmp_str);
    const char *dup = NULL;
    for (size_t i = 1; i < l->n_shards && !dup; i++)
        if (!strcmp(v[i - 1], v[i]))
            dup = v[i];
    free(v);
    return dup;
}

/* counts[] from index.json beside the shards (pack writes it), when it
 * lists every shard: *from_index = 1. An index.json whose entry for one of
 * the shards has no valid count, or that does not match the objects
 * (sf__index_json_check), fails the open (whoever controls the bucket controls
 * index.json). */
static sf_status counts_from_index(struct sf_loader *l, int *from_index, char *err, size_t err_len)
{
    *from_index = 0;
    const char *first = l->objs[0]->url;
    const char *slash = strrchr(first, '/');
    char url[4096];
    if (slash)
        snprintf(url, sizeof(url), "%.*s" SF__INDEX_JSON_NAME, (int)(slash - first + 1), first);
    else
        snprintf(url, sizeof(url), SF__INDEX_JSON_NAME);
    /* Its names are relative to its folder: a shard outside that folder is
     * not the one it names, even under the same name (a wrong count fails
     * the shard mid-epoch, or silently cuts it). Such sources run on
     * estimates. */
    size_t dir_len = slash ? (size_t)(slash - first + 1) : 0;
    for (size_t i = 1; i < l->n_shards; i++)
        if (strncmp(l->objs[i]->url, first, dir_len) != 0)
            return SF_OK;
    /* Its entries are matched by file name (`shardfeed index` names a
     * subfolder's shard sub/x.tar, and refuses two of one name): a listing
     * walks subfolders, and two shards of one name in different folders
     * cannot both be the one an entry names. */
    const char *dup = same_name(l);
    if (dup == (const char *)l) {
        snprintf(err, err_len, "out of memory");
        return SF_ERR_NO_MEMORY;
    }
    if (dup) {
        sf__loader_log(l, SF_LOG_INFO,
                       "%s: not used: shards of the same name (%s) in different folders, and "
                       "its entries name shards by file name",
                       url, dup);
        return SF_OK;
    }
    char *text = NULL;
    size_t len = 0;
    if (read_small(l, url, &text, &len) != SF_OK)
        return SF_OK;
    /* An index.json that does not match the objects fails the open: a shard
     * it names whose size (or ETag, when it records one) differs, or that is
     * missing when every source is a listed folder (the epoch would silently
     * lose its samples). Shards it does not name are not its business. */
    sf_status st = sf__index_json_check(text, url, dir_len, l->objs, l->n_shards, l->sources_listed,
                                        err, err_len);
    if (st == SF_OK)
        st = sf__index_json_counts(text, url, l->objs, l->n_shards, l->counts, from_index, err,
                                   err_len);
    free(text);
    if (st == SF_OK && *from_index)
        sf__loader_log(l, SF_LOG_INFO, "sample counts of %zu shards from %s", l->n_shards, url);
    return st;
}

/* Whether the learned-count store may be the basis of an epoch: every rank
 * must see the same store (docs/sampling.md, "When learned counts are used").
 * 0: no. 1: one rank: its own counts, saved or not, and the store. 2: several
 * ranks: the store only, since a count one rank learned but could not save
 * (no ETag, a full disk) would make that rank alone exact, and DDP hang. */
static int learned_allowed(const struct sf_loader_options *o)
{
    if (o->learned_counts == 0)
        return 0;
    struct sf_dist d = {o->sampler.rank, o->sampler.world_size, -1};
    if (sf_dist_from_env(&d, NULL, 0) != SF_OK)
        return o->learned_counts == 1 ? 2 : 0;
    if (d.world_size == 1)
        return 1;
    if (o->learned_counts == 1)
        return 2;
    /* One node: LOCAL_WORLD_SIZE == WORLD_SIZE, both of this job (a world
     * size given in the options counts when it is the environment's: the
     * Python binding passes torch.distributed's). */
    const char *lws = getenv("LOCAL_WORLD_SIZE"), *ws = getenv("WORLD_SIZE");
    int same_job = o->sampler.world_size < 0 || (ws && atoi(ws) == d.world_size);
    return lws && atoi(lws) == d.world_size && same_job ? 2 : 0;
}

int sf__loader_counts_complete(struct sf_loader *l)
{
    if (l->from_index)
        return 1;
    if (!l->learned_allowed)
        return 0;
    int all = 1;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n_shards; i++) {
        if (!l->known[i] && l->learned_known[i] && l->learned_allowed == 1) {
            l->counts[i] = l->learned[i];
            l->known[i] = 1;
        }
        if (!l->known[i] && l->objs[i]->size == 0) {
            /* An empty object holds no sample; nothing of it is ever read,
             * so its count would never be learned. */
            l->counts[i] = 0;
            l->known[i] = 1;
        }
        all &= l->known[i];
    }
    pthread_mutex_unlock(&l->mu);
    if (all || !l->counts_dir)
        return all;
    struct sf__count_key *keys = calloc(l->n_shards, sizeof(*keys));
    if (!keys)
        return 0;
    for (size_t i = 0; i < l->n_shards; i++)
        keys[i] = sf__count_key_of(l->objs[i]->url, l->objs[i]->etag, l->objs[i]->size);
    sf__counts_lookup(l->counts_dir, keys, l->n_shards, l->counts, l->known);
    free(keys);
    all = 1;
    for (size_t i = 0; i < l->n_shards; i++)
        all &= l->known[i];
    return all;
}

void sf__loader_learn(struct sf_loader *l, uint64_t shard, uint64_t count)
{
    pthread_mutex_lock(&l->mu);
    int first = !l->learned_known[shard];
    l->learned[shard] = count;
    l->learned_known[shard] = 1;
    pthread_mutex_unlock(&l->mu);
    if (!first || l->stored[shard] || !l->counts_dir)
        return;
    const struct sf_object_info *obj = l->objs[shard];
    if (!obj->etag[0] || obj->size == SF_SIZE_UNKNOWN)
        return; /* no identity to key it by */
    sf_status st =
        sf__counts_append(l->counts_dir, sf__count_key_of(obj->url, obj->etag, obj->size), count);
    if (st != SF_OK)
        sf__loader_log(l, SF_LOG_WARN, "cannot save the sample count of %s in %s: %s", obj->url,
                       l->counts_dir, sf_status_str(st));
}

/* Estimated counts from the sizes and the probe of the first shard. */
static sf_status estimate_counts(struct sf_loader *l, char *err, size_t err_len)
{
    if (l->bytes_per_sample <= 0) {
        const struct sf_object_info *probe = NULL;
        for (size_t i = 0; i < l->n_shards && !probe; i++)
            if (l->objs[i]->size && l->objs[i]->size != SF_SIZE_UNKNOWN)
                probe = l->objs[i];
        double bps = 1;
        if (probe) {
            sf_status st = sf__probe_bytes_per_sample(l->s3, probe, &bps, err, err_len);
            if (st != SF_OK)
                return st;
        }
        l->bytes_per_sample = bps > 0 ? bps : 1;
        sf__loader_log(l, SF_LOG_INFO,
                       "no sample counts for every shard: estimating from sizes, %.0f bytes per "
                       "sample (head of %s); counts are learned while reading",
                       l->bytes_per_sample, probe ? probe->url : "-");
    }
    for (size_t i = 0; i < l->n_shards; i++) {
        unsigned long long size = l->objs[i]->size;
        if (size == 0)
            l->est_counts[i] = 0;
        else if (size == SF_SIZE_UNKNOWN)
            l->est_counts[i] = 1;
        else {
            double e = (double)size / l->bytes_per_sample + 0.5;
            l->est_counts[i] = e < 1 ? 1 : (uint64_t)e;
        }
    }
    return SF_OK;
}

sf_status sf__loader_make_samplers(struct sf_loader *l, int estimated, uint64_t epoch,
                                   struct sf_sampler **sampler, struct sf_sampler **counter,
                                   struct sf_sampler **state, char *err, size_t err_len)
{
    *sampler = *counter = *state = NULL;
    if (estimated) {
        sf_status st = estimate_counts(l, err, err_len);
        if (st != SF_OK)
            return st;
    }
    struct sf_sampler_options so = l->so;
    so.epoch = epoch;
    so.estimated_counts = estimated;
    const uint64_t *c = estimated ? l->est_counts : l->counts;
    /* No sample anywhere, with a 0-byte object among the shards, is a fact
     * about the data (exit 1 in the CLI), not a bad option: name it. */
    size_t empty = l->n_shards, i = 0;
    for (; i < l->n_shards && c[i] == 0; i++)
        if (empty == l->n_shards && l->objs[i]->size == 0)
            empty = i;
    if (i == l->n_shards && empty < l->n_shards) {
        snprintf(err, err_len,
                 "%s: 0 bytes, not a shard (a tar has at least its 1024-byte end-of-archive "
                 "blocks), and none of the %zu shard(s) has a sample",
                 l->objs[empty]->url, l->n_shards);
        return SF_ERR_CORRUPT;
    }
    sf_status st = sf_sampler_new(&so, c, l->n_shards, sampler, err, err_len);
    if (st == SF_OK)
        st = sf_sampler_new(&so, c, l->n_shards, counter, err, err_len);
    if (st == SF_OK)
        st = sf_sampler_new(&so, c, l->n_shards, state, err, err_len);
    if (st != SF_OK) {
        sf_sampler_destroy(*sampler);
        sf_sampler_destroy(*counter);
        sf_sampler_destroy(*state);
        *sampler = *counter = *state = NULL;
    }
    return st;
}

/* One log sink: the loader's, for a part (client, cache) without its own
 * (retry and throttle messages come from the client). */
static void inherit_log(const struct sf_loader_options *o, sf_log_fn *log, void **user,
                        enum sf_log_level *level)
{
    if (*log)
        return;
    *log = o->log;
    *user = o->log_user;
    *level = o->log_level;
}

sf_status sf_loader_open(const struct sf_loader_options *opts, struct sf_loader **out, char *err,
                         size_t err_len)
{
    char dummy[8];
    if (!err) {
        err = dummy;
        err_len = sizeof(dummy);
    }
    err[0] = 0;
    if (!out)
        return SF_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!opts) {
        snprintf(err, err_len, "loader options are NULL");
        return SF_ERR_INVALID_ARGUMENT;
    }
    sf_status st = sf__loader_options_check(opts, err, err_len);
    if (st != SF_OK)
        return st;
    struct sf_loader *l = calloc(1, sizeof(*l));
    if (!l)
        return SF_ERR_NO_MEMORY;
    clock_gettime(CLOCK_MONOTONIC, &l->t0);
    l->o = *opts;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_reader, NULL);
    pthread_cond_init(&l->cv_consumer, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_gpu, NULL);
    l->image_fields = strdup(opts->image_fields ? opts->image_fields : "jpg;jpeg");
    l->label_fields = strdup(opts->label_fields ? opts->label_fields : "cls;json;txt");
    l->extra_fields = strdup(opts->extra_fields ? opts->extra_fields : "");
    if (!l->image_fields || !l->label_fields || !l->extra_fields)
        goto oom;
    l->o.image_fields = l->image_fields;
    l->o.label_fields = l->label_fields;
    l->o.extra_fields = l->extra_fields;
    l->img_names = split_names(l->image_fields, &l->n_img);
    l->lbl_names = split_names(l->label_fields, &l->n_lbl);
    l->extra_names = split_names(l->extra_fields, &l->n_extra);
    if (!l->img_names || !l->lbl_names || !l->extra_names)
        goto oom;
    l->extra_zst = calloc(l->n_extra + 1, sizeof(*l->extra_zst));
    if (!l->extra_zst)
        goto oom;
    for (size_t i = 0; i < l->n_extra; i++) {
        size_t n = strlen(l->extra_names[i]);
        if (n > 4 && !strcmp(l->extra_names[i] + n - 4, ".zst") &&
            !(l->extra_zst[i] = strndup(l->extra_names[i], n - 4)))
            goto oom;
    }

    /* Where batches go. */
    int want_gpu = opts->device != SF_DEVICE_HOST;
    int emulated = opts->device == SF_DEVICE_EMULATED;
    int dev = opts->cuda_device;
    if (dev < 0 && emulated) {
        dev = 0; /* one emulated device per process, whatever the rank */
    } else if (dev < 0) {
        struct sf_dist d = {-1, -1, -1};
        dev = sf_dist_from_env(&d, NULL, 0) == SF_OK && d.local_rank >= 0 ? d.local_rank : 0;
    }
    if (want_gpu && !emulated && !sf__gpu_usable(dev)) {
        if (opts->device == SF_DEVICE_CUDA) {
            snprintf(err, err_len, "device cuda: %s",
                     sf_cuda_compiled() ? "no CUDA device (or not the one asked for) is visible"
                                        : "this build has no CUDA");
            sf_loader_close(l);
            return SF_ERR_UNSUPPORTED;
        }
        want_gpu = 0;
    }
    l->on_device = want_gpu;

    struct sf_s3_options s3o = opts->s3;
    inherit_log(opts, &s3o.log, &s3o.log_user, &s3o.log_level);
    st = sf_s3_new(&s3o, &l->s3, err, err_len);
    if (st != SF_OK)
        goto fail_out;
    l->o.s3.endpoint_url = l->o.s3.region = l->o.s3.profile = NULL;
    l->o.s3.access_key_id = l->o.s3.secret_access_key = l->o.s3.session_token = NULL;
    l->o.s3.ca_bundle = NULL;
    st = expand_sources(l, err, err_len);
    l->o.sources = NULL; /* borrowed during open only */
    if (st != SF_OK)
        goto fail_out;
    int all_local = 1;
    for (size_t i = 0; i < l->n_shards; i++)
        all_local &= sf__loader_is_local(l->objs[i]->url);
    if (!opts->ram_only && !all_local) {
        struct sf_cache_options co = opts->cache;
        inherit_log(opts, &co.log, &co.log_user, &co.log_level);
        st = sf_cache_new(&co, &l->cache, err, err_len);
        if (st != SF_OK)
            goto fail_out;
    }
    l->o.cache.dir = NULL;
    l->counts = calloc(l->n_shards, sizeof(*l->counts));
    l->deliveries = calloc(l->n_shards, sizeof(*l->deliveries));
    l->slot_of = calloc(l->n_shards, sizeof(*l->slot_of));
    l->est_counts = calloc(l->n_shards, sizeof(*l->est_counts));
    l->known = calloc(l->n_shards, 1);
    l->stored = calloc(l->n_shards, 1);
    l->learned = calloc(l->n_shards, sizeof(*l->learned));
    l->learned_known = calloc(l->n_shards, 1);
    if (!l->counts || !l->deliveries || !l->slot_of || !l->est_counts || !l->known ||
        !l->stored || !l->learned || !l->learned_known)
        goto oom;
    /* Sample counts: index.json, else the learned store, else estimates. No
     * shard is read before the first batch (docs/sampling.md). */
    st = counts_from_index(l, &l->from_index, err, err_len);
    if (st != SF_OK)
        goto fail_out;
    if (l->from_index)
        memset(l->known, 1, l->n_shards);
    l->learned_allowed = learned_allowed(opts);
    l->counts_dir = l->cache ? strdup(sf_cache_dir(l->cache)) : NULL;
    if (l->cache && !l->counts_dir)
        goto oom;
    int exact = sf__loader_counts_complete(l);
    memcpy(l->stored, l->known, l->n_shards);
    /* initial_fill defaults to 100 (WebDataset's); a smaller shuffle buffer
     * caps it. */
    l->so = opts->sampler;
    uint64_t buf = l->so.shuffle_buffer ? l->so.shuffle_buffer : 1;
    if (l->so.initial_fill > buf)
        l->so.initial_fill = buf;
    st = sf__loader_make_samplers(l, !exact, opts->sampler.epoch, &l->sampler, &l->counter,
                                  &l->state_smp, err, err_len);
    if (st != SF_OK)
        goto fail_out;
    l->estimated = l->estimated_c = !exact;
    if (exact && !l->from_index)
        sf__loader_log(l, SF_LOG_INFO, "sample counts of the %zu shards learned in earlier runs",
                       l->n_shards);

    l->ring = opts->prefetch_batches;
    if (l->on_device) {
        size_t u8 = (size_t)opts->batch_size * sf__image_bytes(&l->o.image);
        size_t f32 = opts->normalize_on_device && opts->image.dtype == SF_DTYPE_UINT8
                         ? (size_t)opts->batch_size * opts->image.width * opts->image.height * 3 *
                               sizeof(float)
                         : 0;
        /* First: it makes `dev` current, so the pinned batches below belong
         * to its context and no context is created on device 0. */
        struct sf__gpu_config gc = {
            .backend = emulated ? SF__GPU_EMULATED : SF__GPU_CUDA,
            .device = dev,
            .slots = l->ring,
            .u8_bytes = u8,
            .f32_bytes = f32,
        };
        st = sf__gpu_open(&gc, &l->gpu, err, err_len);
        if (st != SF_OK)
            goto fail_out;
    }
    l->image_bytes = sf__image_bytes(&l->o.image);
    l->batches = calloc(l->ring, sizeof(*l->batches));
    if (!l->batches)
        goto oom;
    for (unsigned i = 0; i < l->ring; i++) {
        l->batches[i].index = UINT64_MAX;
        if (sf__loader_batch_alloc(l, &l->batches[i]) != SF_OK)
            goto oom;
    }
    l->q_cap = (size_t)l->ring * opts->batch_size;
    l->q = calloc(l->q_cap, sizeof(*l->q));
    /* Until the reader has planned, the consumer must not see epoch 0 as
     * empty. Set before the reader starts: reader_begin (and, on estimates,
     * the end of the stream) update these under mu, and must not be undone. */
    {
        l->epoch = opts->sampler.epoch;
        struct sf_sampler_info info;
        sf_sampler_get_info(l->state_smp, &info);
        uint64_t n = info.epoch_size, B = opts->batch_size;
        l->epoch_batches = opts->drop_last ? n / B : (n + B - 1) / B;
        l->epoch_positions = n;
        l->size_known = info.size_known;
        l->epoch_estimated = info.estimated;
        l->plan_done = !info.estimated;
        if (!info.size_known)
            l->epoch_batches = UINT64_MAX;
    }
    l->n_workers = opts->decode_threads ? opts->decode_threads : sf__cores_available();
    l->workers = calloc(l->n_workers, sizeof(*l->workers));
    if (!l->q || !l->workers)
        goto oom;
    {
        unsigned started = 0;
        for (; started < l->n_workers; started++)
            if (pthread_create(&l->workers[started], NULL, sf__loader_worker_main, l) != 0)
                break;
        if (started < l->n_workers) {
            l->n_workers = started;
            snprintf(err, err_len, "cannot start decode threads");
            st = SF_ERR_NO_MEMORY;
            goto fail_out;
        }
    }
    if (pthread_create(&l->reader_th, NULL, sf__loader_reader_main, l) != 0) {
        snprintf(err, err_len, "cannot start the reader thread");
        st = SF_ERR_NO_MEMORY;
        goto fail_out;
    }
    l->reader_started = 1;
    if (l->on_device) {
        if (pthread_create(&l->gpu_th, NULL, sf__loader_gpu_main, l) != 0) {
            snprintf(err, err_len, "cannot start the gpu thread");
            st = SF_ERR_NO_MEMORY;
            goto fail_out;
        }
        l->gpu_started = 1;
    }
    *out = l;
    return SF_OK;
oom:
    st = SF_ERR_NO_MEMORY;
    snprintf(err, err_len, "out of memory");
fail_out:
    if (!err[0] && l->errmsg[0])
        snprintf(err, err_len, "%s", l->errmsg);
    sf_loader_close(l);
    return st;
}

size_t sf_loader_shard_count(const struct sf_loader *l)
{
    return l ? l->n_shards : 0;
}

const char *sf_loader_shard_url(const struct sf_loader *l, size_t i)
{
    return l && i < l->n_shards ? l->objs[i]->url : NULL;
}
