/*
 * sf_index_shards(): the index.json of shards that exist already (docs/pack.md,
 * "shardfeed index").
 *
 * Worker threads take shards in turn. A shard streams through its worker's
 * window: a ring of window_bytes split into pieces, each piece one ranged GET
 * written by the fetch engine straight into its place in the ring. The oldest
 * piece is hashed once it is complete, then the shard reader parses as far as
 * the hashed bytes go; a piece is requested again into a slot only once the
 * reader no longer needs the bytes it held. So a shard of any size is read
 * once, at network speed, in window_bytes of memory.
 *
 * The readers index the shard by absolute offset (base + offset) and read only
 * [keep_from, wanted) of it (sf__shard_reader_keep_from()). The ring holds the
 * window's lap [lap, lap + window) at ring[offset - lap], so the reader gets
 * base = ring - lap; a header or record that crosses the ring's end is copied
 * into a bounce buffer first.
 */
#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "src/index_json.h"
#include "src/record.h"
#include "src/shard_reader.h"
#include "common/strbuf.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

#define DEFAULT_PARALLEL  8u
#define DEFAULT_WINDOW    (8ull << 20)
#define PIECES_PER_WINDOW 4u
#define WAIT_SLICE_MS     100
#define PROGRESS_MS       100
#define MAX_TAIL_BYTES    (64ull << 20) /* a record index read apart: 4M records */
#define MAX_FIELD_NAMES   1024u         /* distinct field names counted per shard */
#define DEFAULT_MAX       10000000u
#define ERR_LEN           1024

struct field_count {
    char *name;
    uint64_t n;
};

/* One shard to index. The worker that takes it writes the results; the
 * caller's thread reads them after joining the workers. */
struct shard {
    const struct sf_object_info *obj;
    char *name; /* as listed in the index */
    uint64_t bytes, samples, xxh3;
    enum sf_shard_format format;
    int by_index;     /* count from the record shard's own index */
    int fields_whole; /* fields[] counts every sample */
    int zstd;         /* some record was compressed */
    struct field_count *fields;
    size_t n_fields;
    sf_status st;
    char *err; /* on failure */
};

struct indexer {
    struct sf_s3 *s3;
    uint64_t window, piece;
    size_t slots; /* pieces in a window */
    struct shard *shards;
    size_t n;

    pthread_mutex_t mu;
    pthread_cond_t cond;
    /* under mu */
    size_t next;    /* next shard to hand out */
    size_t running; /* workers that have not exited */
    uint64_t shards_done, bytes_done, bytes_total;
    int stop; /* a shard failed, or the caller cancelled */
};

/* A worker's buffers, reused from shard to shard. Worker thread only. */
struct worker {
    struct indexer *ix;
    pthread_t th;
    unsigned char *ring; /* window bytes */
    unsigned char *bounce;
    size_t bounce_cap;
    struct sf_fetch **slot; /* ix->slots pieces */
    XXH3_state_t *xxh;
};

/* One shard being read. */
struct scan {
    struct worker *w;
    struct indexer *ix;
    struct shard *sh;
    const char *url;
    uint64_t size; /* SF_SIZE_UNKNOWN until the first reply */
    char etag[128];
    uint64_t next_off; /* first byte not requested yet */
    uint64_t hashed;   /* [0, hashed) is hashed and final in the ring */
    struct sf_shard_reader *r;
    uint64_t fed;   /* bytes the reader was told about */
    int reader_end; /* the reader said SF_SHARD_END */
    int too_many;   /* more distinct field names than counted */
    char err[ERR_LEN];
};

__attribute__((format(printf, 3, 4))) static sf_status scan_fail(struct scan *s, sf_status st,
                                                                 const char *fmt, ...)
{
    if (s->err[0])
        return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    return st;
}

static int stopped(struct indexer *ix)
{
    pthread_mutex_lock(&ix->mu);
    int s = ix->stop;
    pthread_mutex_unlock(&ix->mu);
    return s;
}

static uint64_t min64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* A base whose byte `start` is p[0]. The readers add absolute shard offsets
 * to base and only read offsets from keep_from on, all of which lie in p; the
 * address arithmetic is done on integers because base itself points before
 * the buffer (the flat address spaces this library runs on make that
 * well-defined in practice). */
static const unsigned char *shifted(const unsigned char *p, uint64_t start)
{
    return (const unsigned char *)((uintptr_t)p - (uintptr_t)start);
}

/* ------------------------------------------------------------ pieces */

/* Bytes of the piece starting at off. */
static uint64_t piece_len(const struct scan *s, uint64_t off)
{
    uint64_t len = s->ix->piece;
    if (s->size != SF_SIZE_UNKNOWN && len > s->size - off)
        len = s->size - off;
    return len;
}

static size_t slot_of(const struct scan *s, uint64_t off)
{
    return (size_t)((off / s->ix->piece) % s->ix->slots);
}

static sf_status start_piece(struct scan *s)
{
    struct indexer *ix = s->ix;
    uint64_t off = s->next_off, len = piece_len(s, off);
    struct sf_fetch_options fo;
    sf_fetch_options_init_default(&fo);
    fo.buffer = s->w->ring + off % ix->window;
    fo.buffer_bytes = len;
    fo.offset = off;
    fo.length = len;
    fo.size = s->size;
    fo.etag = s->etag[0] ? s->etag : NULL;
    struct sf_fetch **slot = &s->w->slot[slot_of(s, off)];
    if (*slot)
        return scan_fail(s, SF_ERR_INTERNAL, "%s: offset %" PRIu64 ": window slot still in use",
                         s->url, off);
    sf_status st = sf_fetch_start(ix->s3, s->url, &fo, slot);
    if (st != SF_OK) {
        char m[ERR_LEN];
        sf_s3_errmsg(ix->s3, m, sizeof(m));
        return scan_fail(s, st, "%s", m[0] ? m : sf_status_str(st));
    }
    s->next_off = off + len;
    return SF_OK;
}

/* Requests every piece that fits: its slot's old bytes must be hashed and
 * behind what the reader may still read. */
static sf_status start_pieces(struct scan *s)
{
    if (s->size == SF_SIZE_UNKNOWN)
        return SF_OK;
    uint64_t keep = s->hashed;
    if (!s->reader_end && !s->sh->by_index) {
        uint64_t k = sf__shard_reader_keep_from(s->r);
        if (k < keep)
            keep = k;
    }
    while (s->next_off < s->size && s->next_off + s->ix->piece <= keep + s->ix->window) {
        sf_status st = start_piece(s);
        if (st != SF_OK)
            return st;
    }
    return SF_OK;
}

/* ------------------------------------------------------------ samples */

static sf_status count_fields(struct scan *s, const struct sf_sample *smp)
{
    struct shard *sh = s->sh;
    for (size_t i = 0; i < smp->field_count && !s->too_many; i++) {
        const char *name = smp->fields[i].name;
        size_t k = 0;
        while (k < sh->n_fields && strcmp(sh->fields[k].name, name) != 0)
            k++;
        if (k < sh->n_fields) {
            sh->fields[k].n++;
            continue;
        }
        if (sh->n_fields >= MAX_FIELD_NAMES) {
            s->too_many = 1; /* the index then leaves "fields" out */
            break;
        }
        struct field_count *v = realloc(sh->fields, (sh->n_fields + 1) * sizeof(*v));
        if (!v)
            return scan_fail(s, SF_ERR_NO_MEMORY, "%s: out of memory", s->url);
        sh->fields = v;
        v[k].name = strdup(name);
        if (!v[k].name)
            return scan_fail(s, SF_ERR_NO_MEMORY, "%s: out of memory", s->url);
        v[k].n = 1;
        sh->n_fields++;
    }
    return SF_OK;
}

/* A record or index the window cannot hold: the count comes from the
 * shard's own index, read apart from its tail. */
static sf_status count_by_record_index(struct scan *s)
{
    struct indexer *ix = s->ix;
    uint64_t tail = min64(s->size, SF__RECORD_TAIL_GUESS_BYTES);
    sf_status st = SF_OK;
    struct sf__record_index *idx = NULL;
    for (int round = 0; round < 2 && !idx; round++) {
        unsigned char *buf = malloc(tail ? (size_t)tail : 1);
        if (!buf)
            return scan_fail(s, SF_ERR_NO_MEMORY, "%s: out of memory for the index", s->url);
        struct sf_fetch_options fo;
        sf_fetch_options_init_default(&fo);
        fo.buffer = buf;
        fo.buffer_bytes = tail;
        fo.offset = s->size - tail;
        fo.length = tail;
        fo.size = s->size;
        fo.etag = s->etag[0] ? s->etag : NULL;
        struct sf_fetch *f = NULL;
        st = sf_fetch_start(ix->s3, s->url, &fo, &f);
        if (st != SF_OK) {
            char m[ERR_LEN];
            sf_s3_errmsg(ix->s3, m, sizeof(m));
            free(buf);
            return scan_fail(s, st, "%s", m[0] ? m : sf_status_str(st));
        }
        do {
            st = sf_fetch_wait(f, tail, WAIT_SLICE_MS, NULL);
        } while (st == SF_ERR_TIMEOUT && !stopped(ix));
        if (st == SF_ERR_TIMEOUT)
            st = SF_ERR_CANCELLED;
        else if (st != SF_OK)
            scan_fail(s, st, "%s", sf_fetch_errmsg(f));
        sf_fetch_destroy(f);
        uint64_t need = 0;
        char m[ERR_LEN] = "";
        if (st == SF_OK)
            st = sf__record_index_from_tail(buf, (size_t)tail, s->size, s->url, &idx, &need, m,
                                            sizeof(m));
        free(buf);
        if (st == SF_ERR_RANGE && round == 0 && need > tail && need <= s->size) {
            if (need > MAX_TAIL_BYTES)
                return scan_fail(s, SF_ERR_LIMIT,
                                 "%s: offset %" PRIu64 ": the record index of %" PRIu64
                                 " bytes is larger than %llu bytes",
                                 s->url, s->size - need, need, (unsigned long long)MAX_TAIL_BYTES);
            tail = need;
            continue;
        }
        if (st != SF_OK)
            return scan_fail(s, st, "%s", m[0] ? m : sf_status_str(st));
    }
    if (!idx)
        return scan_fail(s, SF_ERR_CORRUPT, "%s: the record index cannot be read", s->url);
    uint64_t n = sf__record_index_count(idx);
    sf__record_index_destroy(idx);
    if (n < s->sh->samples)
        return scan_fail(s, SF_ERR_CORRUPT,
                         "%s: the index lists %" PRIu64 " records, %" PRIu64 " were read already",
                         s->url, n, s->sh->samples);
    s->sh->fields_whole = n == s->sh->samples && !s->too_many;
    s->sh->samples = n;
    s->sh->by_index = 1;
    return SF_OK;
}

/* Parses as far as the hashed bytes go. */
static sf_status pump_reader(struct scan *s)
{
    struct indexer *ix = s->ix;
    struct worker *w = s->w;
    const uint64_t R = ix->window;
    while (!s->reader_end && !s->sh->by_index) {
        uint64_t keep = sf__shard_reader_keep_from(s->r);
        uint64_t want = sf_shard_reader_wanted(s->r);
        uint64_t lap = keep - keep % R;
        uint64_t direct_end = min64(s->hashed, lap + R);
        uint64_t target = s->fed > want ? s->fed : want;
        const unsigned char *base;
        uint64_t avail;
        if (target <= direct_end) {
            base = shifted(w->ring, lap);
            avail = direct_end;
        } else if (target <= s->hashed) {
            /* [keep, target) wraps around the ring's end: copy it out. Pieces
             * are never requested over bytes from keep on, so both parts are
             * still there. */
            uint64_t span = target - keep;
            if (span > R)
                return scan_fail(s, SF_ERR_INTERNAL,
                                 "%s: offset %" PRIu64 ": span %" PRIu64 " over the window", s->url,
                                 keep, span);
            if (span > w->bounce_cap) {
                unsigned char *b = realloc(w->bounce, (size_t)span);
                if (!b)
                    return scan_fail(s, SF_ERR_NO_MEMORY, "%s: out of memory", s->url);
                w->bounce = b;
                w->bounce_cap = (size_t)span;
            }
            uint64_t first = lap + R - keep;
            memcpy(w->bounce, w->ring + (keep - lap), (size_t)first);
            memcpy(w->bounce + first, w->ring, (size_t)(span - first));
            base = shifted(w->bounce, keep);
            avail = target;
        } else {
            /* Not hashed yet. Pieces reach up to the last piece boundary
             * within one window of keep: beyond that, never. */
            uint64_t reach = min64(s->size, (keep + R) / ix->piece * ix->piece);
            if (target <= reach)
                return SF_OK;
            if (sf_shard_reader_format(s->r) == SF_SHARD_FORMAT_RECORD)
                return count_by_record_index(s);
            return scan_fail(s, SF_ERR_LIMIT,
                             "%s: offset %" PRIu64 ": the tar reader needs %" PRIu64
                             " contiguous bytes here (long names or pax headers), more than "
                             "a window of %" PRIu64 " bytes holds; raise window_bytes",
                             s->url, keep, target - keep, R);
        }
        if (!base)
            return scan_fail(s, SF_ERR_INTERNAL, "%s: no address for the window", s->url);
        sf_status st = sf_shard_reader_feed(s->r, base, avail, s->size);
        if (st != SF_OK)
            return scan_fail(s, st, "%s", sf_shard_reader_errmsg(s->r));
        s->fed = avail;
        for (;;) {
            struct sf_sample smp;
            enum sf_shard_event ev;
            st = sf_shard_reader_next(s->r, &smp, &ev);
            if (st != SF_OK)
                return scan_fail(s, st, "%s", sf_shard_reader_errmsg(s->r));
            if (ev == SF_SHARD_NEED_MORE)
                break;
            if (ev == SF_SHARD_END) {
                s->reader_end = 1;
                break;
            }
            s->sh->samples++;
            if ((st = count_fields(s, &smp)) != SF_OK)
                return st;
        }
    }
    return SF_OK;
}

/* ------------------------------------------------------------ one shard */

static void add_progress(struct indexer *ix, uint64_t bytes, uint64_t total)
{
    pthread_mutex_lock(&ix->mu);
    ix->bytes_done += bytes;
    ix->bytes_total += total;
    pthread_mutex_unlock(&ix->mu);
}

static sf_status scan_run(struct scan *s)
{
    struct indexer *ix = s->ix;
    struct worker *w = s->w;
    const uint64_t R = ix->window;
    sf_status st = start_piece(s);
    while (st == SF_OK) {
        if (s->size != SF_SIZE_UNKNOWN && s->hashed == s->size)
            break;
        struct sf_fetch *f = w->slot[slot_of(s, s->hashed)];
        if (!f)
            return scan_fail(s, SF_ERR_INTERNAL,
                             "%s: offset %" PRIu64 ": no request covers the next bytes", s->url,
                             s->hashed);
        uint64_t len = s->size == SF_SIZE_UNKNOWN ? 1 : piece_len(s, s->hashed);
        struct sf_fetch_progress p;
        st = sf_fetch_wait(f, len, WAIT_SLICE_MS, &p);
        if (st == SF_ERR_TIMEOUT) {
            st = stopped(ix) ? SF_ERR_CANCELLED : SF_OK;
            continue;
        }
        if (st != SF_OK)
            return scan_fail(s, st, "%s", sf_fetch_errmsg(f));
        if (s->size == SF_SIZE_UNKNOWN) {
            /* The first reply tells the size (and the ETag later pieces ask for). */
            if (p.object_size == SF_SIZE_UNKNOWN)
                return scan_fail(s, SF_ERR_INTERNAL, "%s: the reply did not say the size", s->url);
            s->size = p.object_size;
            snprintf(s->etag, sizeof(s->etag), "%s", sf_fetch_etag(f));
            add_progress(ix, 0, s->size);
            st = start_pieces(s);
            continue;
        }
        if (p.contiguous < len)
            continue;
        XXH3_64bits_update(w->xxh, w->ring + s->hashed % R, (size_t)len);
        s->hashed += len;
        sf_fetch_destroy(f);
        w->slot[slot_of(s, s->hashed - len)] = NULL;
        add_progress(ix, len, 0);
        st = pump_reader(s);
        if (st == SF_OK)
            st = start_pieces(s);
        if (st == SF_OK && stopped(ix))
            st = SF_ERR_CANCELLED;
    }
    if (st != SF_OK)
        return st;
    if (!s->reader_end && !s->sh->by_index) {
        /* An empty shard has had no piece to hash: parse it here. */
        if ((st = pump_reader(s)) != SF_OK)
            return st;
        if (!s->reader_end && !s->sh->by_index)
            return scan_fail(s, SF_ERR_INTERNAL,
                             "%s: offset %" PRIu64 ": the reader wants bytes past the end", s->url,
                             s->hashed);
    }
    return SF_OK;
}

static sf_status scan_shard(struct worker *w, struct shard *sh, char *err, size_t err_len)
{
    struct scan s;
    memset(&s, 0, sizeof(s));
    s.w = w;
    s.ix = w->ix;
    s.sh = sh;
    s.url = sh->obj->url;
    s.size = sh->obj->size;
    snprintf(s.etag, sizeof(s.etag), "%s", sh->obj->etag);
    sh->fields_whole = 1;
    struct sf_shard_reader_options ro;
    sf_shard_reader_options_init_default(&ro);
    ro.name = s.url;
    sf_status st = sf_shard_reader_new(&ro, &s.r, s.err, sizeof(s.err));
    if (st == SF_OK && XXH3_64bits_reset(w->xxh) != XXH_OK)
        st = scan_fail(&s, SF_ERR_INTERNAL, "%s: cannot start the hash", s.url);
    if (st == SF_OK)
        st = scan_run(&s);
    for (size_t i = 0; i < w->ix->slots; i++) {
        sf_fetch_destroy(w->slot[i]);
        w->slot[i] = NULL;
    }
    if (st == SF_OK) {
        sh->bytes = s.size;
        sh->xxh3 = XXH3_64bits_digest(w->xxh);
        sh->format = sf_shard_reader_format(s.r);
        struct sf_shard_stats ss;
        sf_shard_reader_stats(s.r, &ss);
        sh->zstd = ss.decompressed_bytes > 0;
        if (s.too_many)
            sh->fields_whole = 0;
    } else {
        snprintf(err, err_len, "%s", s.err[0] ? s.err : sf_status_str(st));
    }
    sf_shard_reader_destroy(s.r);
    return st;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct indexer *ix = w->ix;
    char err[ERR_LEN];
    for (;;) {
        pthread_mutex_lock(&ix->mu);
        if (ix->stop || ix->next >= ix->n) {
            ix->running--;
            pthread_cond_broadcast(&ix->cond);
            pthread_mutex_unlock(&ix->mu);
            break;
        }
        struct shard *sh = &ix->shards[ix->next++];
        pthread_mutex_unlock(&ix->mu);
        err[0] = '\0';
        sf_status st = scan_shard(w, sh, err, sizeof(err));
        if (st != SF_OK)
            sh->err = strdup(err);
        pthread_mutex_lock(&ix->mu);
        sh->st = st;
        if (st == SF_OK)
            ix->shards_done++;
        else
            ix->stop = 1;
        pthread_cond_broadcast(&ix->cond);
        pthread_mutex_unlock(&ix->mu);
    }
    return NULL;
}

/* ------------------------------------------------------------ names */

static const char *base_name(const char *url)
{
    const char *s = strrchr(url, '/');
    return s ? s + 1 : url;
}

static int cmp_base(const void *a, const void *b)
{
    const struct shard *const *x = a, *const *y = b;
    return strcmp(base_name((*x)->obj->url), base_name((*y)->obj->url));
}

static int cmp_field(const void *a, const void *b)
{
    const struct field_count *x = a, *y = b;
    return strcmp(x->name, y->name);
}

/* ------------------------------------------------------------ index.json */

static char *build_json(const struct indexer *ix, struct sf_index_result *res)
{
    int zstd = 0, whole = 1;
    for (size_t i = 0; i < ix->n; i++) {
        const struct shard *sh = &ix->shards[i];
        res->samples += sh->samples;
        res->bytes += sh->bytes;
        if (sh->format == SF_SHARD_FORMAT_RECORD)
            res->record_shards++;
        else
            res->tar_shards++;
        res->counted_by_index += (unsigned long long)sh->by_index;
        zstd |= sh->zstd;
        whole &= sh->fields_whole;
    }
    res->shards = ix->n;
    const char *format = res->record_shards == 0 ? "tar"
                         : res->tar_shards == 0  ? "record"
                                                 : "mixed";
    struct sf__index_json_shard *shards = calloc(ix->n ? ix->n : 1, sizeof(*shards));
    if (!shards)
        return NULL;
    for (size_t i = 0; i < ix->n; i++) {
        const struct shard *sh = &ix->shards[i];
        shards[i] = (struct sf__index_json_shard){sh->name, sh->bytes, sh->samples, sh->xxh3};
    }
    /* field name -> samples that have it, over all shards, by name */
    size_t total = 0;
    for (size_t i = 0; whole && i < ix->n; i++)
        total += ix->shards[i].n_fields;
    struct field_count *all = calloc(total ? total : 1, sizeof(*all));
    struct sf__index_json_field *fields = calloc(total ? total : 1, sizeof(*fields));
    size_t nf = 0;
    if (all && fields && whole) {
        size_t k = 0;
        for (size_t i = 0; i < ix->n; i++)
            for (size_t f = 0; f < ix->shards[i].n_fields; f++)
                all[k++] = ix->shards[i].fields[f];
        qsort(all, k, sizeof(*all), cmp_field);
        for (size_t i = 0; i < k;) {
            uint64_t n = 0;
            size_t m = i;
            while (m < k && !strcmp(all[m].name, all[i].name))
                n += all[m++].n;
            fields[nf++] = (struct sf__index_json_field){all[i].name, n};
            i = m;
        }
    }
    char *out = NULL;
    if (all && fields) {
        struct sf__index_json j = {
            .format = format,
            .zstd = zstd,
            .shards = shards,
            .n_shards = ix->n,
            .sample_count = res->samples,
            .bytes = res->bytes,
            .fields = fields,
            .n_fields = nf,
            .has_fields = whole,
        };
        out = sf__index_json_write(&j, &res->json_len);
    }
    free(fields);
    free(all);
    free(shards);
    return out;
}

/* ------------------------------------------------------------ public */

void sf_index_options_init_default(struct sf_index_options *o)
{
    memset(o, 0, sizeof(*o));
    o->parallel = DEFAULT_PARALLEL;
    o->window_bytes = DEFAULT_WINDOW;
}

void sf_index_result_clear(struct sf_index_result *r)
{
    if (!r)
        return;
    free(r->json);
    free(r->index_url);
    memset(r, 0, sizeof(*r));
}

/* The objects the sources name: listings keep *.tar and *.sfr. */
static sf_status expand(struct sf_s3 *s3, const char *const *sources, size_t n_sources, size_t max,
                        struct sf_object_list **lists, struct indexer *ix, char *err,
                        size_t err_len)
{
    size_t total = 0;
    for (size_t i = 0; i < n_sources; i++) {
        if (!sources[i])
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "source %zu is NULL", i);
        sf_status st = sf_s3_expand_stat(s3, sources[i], max, &lists[i]);
        if (st != SF_OK) {
            char m[ERR_LEN];
            sf_s3_errmsg(s3, m, sizeof(m));
            return sf__fail(err, err_len, st, "source '%s': %s", sources[i],
                           m[0] ? m : sf_status_str(st));
        }
        total += sf_object_list_count(lists[i]);
    }
    if (total > max)
        return sf__fail(err, err_len, SF_ERR_LIMIT, "the sources name %zu shards, more than %zu",
                       total, max);
    ix->shards = calloc(total ? total : 1, sizeof(*ix->shards));
    if (!ix->shards)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory for %zu shards", total);
    for (size_t i = 0; i < n_sources; i++) {
        size_t sl = strlen(sources[i]);
        int listing = sl && sources[i][sl - 1] == '/';
        for (size_t k = 0; k < sf_object_list_count(lists[i]); k++) {
            const struct sf_object_info *obj = sf_object_list_get(lists[i], k);
            if (obj->is_prefix || (listing && !sf__shard_file_name(obj->key)))
                continue; /* index.json and other files beside the shards */
            ix->shards[ix->n++].obj = obj;
        }
    }
    if (ix->n == 0)
        return sf__fail(err, err_len, SF_ERR_NOT_FOUND,
                       "no shards in the sources (a listing keeps *.tar and *.sfr)");
    return SF_OK;
}

/* A local path (or file:// URL) without its scheme; NULL for other URLs. */
static const char *local_path(const char *url)
{
    if (!strncmp(url, "file://", 7))
        return url + 7;
    return strstr(url, "://") ? NULL : url;
}

/* Whether the index would be written over this shard: the same URL, or two
 * spellings of one local file. */
static int is_same_object(const char *shard_url, const char *index_url)
{
    if (!strcmp(shard_url, index_url))
        return 1;
    const char *a = local_path(shard_url), *b = local_path(index_url);
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* index_url and each shard's name relative to its folder (the whole URL
 * when the shard is not below it). */
static sf_status name_shards(struct indexer *ix, const char *index_url, struct sf_index_result *res,
                             char *err, size_t err_len)
{
    if (index_url) {
        res->index_url = strdup(index_url);
    } else {
        const char *first = ix->shards[0].obj->url;
        const char *slash = strrchr(first, '/');
        size_t dl = slash ? (size_t)(slash - first + 1) : 0;
        res->index_url = malloc(dl + sizeof(SF__INDEX_JSON_NAME));
        if (res->index_url) {
            memcpy(res->index_url, first, dl);
            memcpy(res->index_url + dl, SF__INDEX_JSON_NAME, sizeof(SF__INDEX_JSON_NAME));
        }
    }
    if (!res->index_url)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    const char *slash = strrchr(res->index_url, '/');
    size_t dl = slash ? (size_t)(slash - res->index_url + 1) : 0;
    for (size_t i = 0; i < ix->n; i++) {
        const char *url = ix->shards[i].obj->url;
        if (is_same_object(url, res->index_url))
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                            "%s: the index would be written over this shard; name another "
                            "output",
                            url);
        const char *name = dl && !strncmp(url, res->index_url, dl) && url[dl] ? url + dl : url;
        if (!(ix->shards[i].name = strdup(name)))
            return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    }
    /* The loader finds a shard's entry by base name: two alike would mix. */
    struct shard **by = malloc(ix->n * sizeof(*by));
    if (!by)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    for (size_t i = 0; i < ix->n; i++)
        by[i] = &ix->shards[i];
    qsort(by, ix->n, sizeof(*by), cmp_base);
    sf_status st = SF_OK;
    for (size_t i = 1; i < ix->n && st == SF_OK; i++)
        if (!strcmp(base_name(by[i - 1]->obj->url), base_name(by[i]->obj->url)))
            st = sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                         "%s and %s have the same name: index.json entries are matched by "
                         "name, so one index cannot list both",
                         by[i - 1]->obj->url, by[i]->obj->url);
    free(by);
    return st;
}

static void free_workers(struct worker *w, size_t n)
{
    for (size_t i = 0; w && i < n; i++) {
        free(w[i].ring);
        free(w[i].bounce);
        free(w[i].slot);
        if (w[i].xxh)
            XXH3_freeState(w[i].xxh);
    }
    free(w);
}

static int report(struct indexer *ix, const struct sf_index_options *o)
{
    struct sf_index_progress p;
    p.shards_done = ix->shards_done;
    p.shards_total = ix->n;
    p.bytes_done = ix->bytes_done;
    p.bytes_total = ix->bytes_total;
    pthread_mutex_unlock(&ix->mu);
    int rc = o->progress(o->progress_user, &p);
    pthread_mutex_lock(&ix->mu);
    return rc;
}

/* Runs the workers; returns the status of the first failed shard in
 * source order (SF_ERR_CANCELLED when the caller cancelled). */
static sf_status run_workers(struct indexer *ix, const struct sf_index_options *o, char *err,
                             size_t err_len)
{
    size_t nw = o->parallel < ix->n ? o->parallel : ix->n;
    struct worker *w = calloc(nw, sizeof(*w));
    if (!w)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    for (size_t i = 0; i < nw; i++) {
        w[i].ix = ix;
        w[i].ring = malloc((size_t)ix->window);
        w[i].slot = calloc(ix->slots, sizeof(*w[i].slot));
        w[i].xxh = XXH3_createState();
        if (!w[i].ring || !w[i].slot || !w[i].xxh) {
            free_workers(w, nw);
            return sf__fail(err, err_len, SF_ERR_NO_MEMORY,
                           "out of memory for %zu windows of %llu bytes", nw,
                           (unsigned long long)ix->window);
        }
    }
    size_t started = 0;
    pthread_mutex_lock(&ix->mu);
    ix->running = nw;
    pthread_mutex_unlock(&ix->mu);
    for (; started < nw; started++)
        if (pthread_create(&w[started].th, NULL, worker_main, &w[started]) != 0)
            break;
    pthread_mutex_lock(&ix->mu);
    ix->running -= nw - started;
    int cancelled = 0;
    if (started == 0)
        ix->stop = 1;
    while (ix->running > 0) {
        if (o->progress && !ix->stop && report(ix, o) != 0) {
            ix->stop = 1;
            cancelled = 1;
        }
        if (!o->progress) {
            pthread_cond_wait(&ix->cond, &ix->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += PROGRESS_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&ix->cond, &ix->mu, &ts);
    }
    pthread_mutex_unlock(&ix->mu);
    for (size_t i = 0; i < started; i++)
        pthread_join(w[i].th, NULL);
    free_workers(w, nw);
    if (started == 0)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "cannot start a worker thread");
    for (size_t i = 0; i < ix->n; i++) {
        const struct shard *sh = &ix->shards[i];
        if (sh->st != SF_OK && sh->st != SF_ERR_CANCELLED)
            return sf__fail(err, err_len, sh->st, "%s", sh->err ? sh->err : sf_status_str(sh->st));
    }
    if (cancelled || ix->shards_done < ix->n)
        return sf__fail(err, err_len, SF_ERR_CANCELLED, "index cancelled after %llu of %zu shards",
                       (unsigned long long)ix->shards_done, ix->n);
    if (o->progress) {
        pthread_mutex_lock(&ix->mu);
        int rc = report(ix, o);
        pthread_mutex_unlock(&ix->mu);
        if (rc != 0)
            return sf__fail(err, err_len, SF_ERR_CANCELLED, "index cancelled at the end");
    }
    return SF_OK;
}

sf_status sf_index_shards(struct sf_s3 *s3, const char *const *sources, size_t n_sources,
                          const struct sf_index_options *o, struct sf_index_result *result,
                          char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!result)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "sf_index_shards: result is NULL");
    memset(result, 0, sizeof(*result));
    if (!s3 || (!sources && n_sources))
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "sf_index_shards: %s is NULL",
                       s3 ? "sources" : "s3");
    struct sf_index_options d;
    sf_index_options_init_default(&d);
    if (o) {
        d = *o;
        if (!d.parallel)
            d.parallel = DEFAULT_PARALLEL;
        if (!d.window_bytes)
            d.window_bytes = DEFAULT_WINDOW;
    }
    if (d.parallel > SF_INDEX_PARALLEL_MAX)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "parallel %u: at most %u",
                        d.parallel, SF_INDEX_PARALLEL_MAX);
    if (d.window_bytes < SF_INDEX_WINDOW_BYTES_MIN || d.window_bytes > SF_INDEX_WINDOW_BYTES_MAX ||
        d.window_bytes > ((uint64_t)SIZE_MAX >> 2))
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "window_bytes %llu: expected %llu to %llu bytes", d.window_bytes,
                        (unsigned long long)SF_INDEX_WINDOW_BYTES_MIN,
                        (unsigned long long)SF_INDEX_WINDOW_BYTES_MAX);
    struct indexer ix;
    memset(&ix, 0, sizeof(ix));
    ix.s3 = s3;
    /* Pieces divide the window exactly, so none wraps around its end. */
    ix.piece = d.window_bytes / PIECES_PER_WINDOW;
    ix.slots = PIECES_PER_WINDOW;
    ix.window = ix.piece * PIECES_PER_WINDOW;
    pthread_mutex_init(&ix.mu, NULL);
    pthread_cond_init(&ix.cond, NULL);
    struct sf_object_list **lists = calloc(n_sources ? n_sources : 1, sizeof(*lists));
    sf_status st = lists ? SF_OK : sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory");
    if (st == SF_OK)
        st = expand(s3, sources, n_sources, d.max_shards ? d.max_shards : DEFAULT_MAX, lists, &ix,
                    err, err_len);
    if (st == SF_OK)
        st = name_shards(&ix, d.index_url, result, err, err_len);
    if (st == SF_OK) {
        for (size_t i = 0; i < ix.n; i++)
            if (ix.shards[i].obj->size != SF_SIZE_UNKNOWN)
                ix.bytes_total += ix.shards[i].obj->size;
        st = run_workers(&ix, &d, err, err_len);
    }
    if (st == SF_OK && !(result->json = build_json(&ix, result)))
        st = sf__fail(err, err_len, SF_ERR_NO_MEMORY, "out of memory for " SF__INDEX_JSON_NAME);
    for (size_t i = 0; ix.shards && i < ix.n; i++) {
        struct shard *sh = &ix.shards[i];
        for (size_t f = 0; f < sh->n_fields; f++)
            free(sh->fields[f].name);
        free(sh->fields);
        free(sh->name);
        free(sh->err);
    }
    free(ix.shards);
    for (size_t i = 0; lists && i < n_sources; i++)
        sf_object_list_destroy(lists[i]);
    free(lists);
    pthread_cond_destroy(&ix.cond);
    pthread_mutex_destroy(&ix.mu);
    if (st != SF_OK)
        sf_index_result_clear(result);
    return st;
}
