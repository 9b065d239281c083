/*
 * Loader shard slots: opening a shard (mmap, cache or direct fetch), pumping
 * its download, parsing it as bytes arrive and recording where each sample's
 * fields are. Run by the reader thread (and by sf_loader_open's counting
 * pass, before any thread starts).
 */
#include "src/loader_internal.h"
#include "src/sampler.h"
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct sf_sample_field *find_field(const struct sf_sample *s, const char *name)
{
    for (size_t i = 0; i < s->field_count; i++)
        if (!strcmp(s->fields[i].name, name))
            return &s->fields[i];
    return NULL;
}

static const char *local_path(const struct sf_object_info *obj)
{
    return !strncmp(obj->url, "file://", 7) ? obj->url + 7 : obj->url;
}

/* ------------------------------------------------------------ shards */

void sf__loader_shard_close(struct sf_loader *l, struct shard_slot *sh)
{
    if (!sh)
        return;
    if (l->slot_of && l->slot_of[sh->shard] == sh)
        l->slot_of[sh->shard] = NULL;
    if (sh->opened)
        atomic_fetch_sub(&l->shards_open, 1);
    sf_shard_reader_destroy(sh->r);
    if (sh->co)
        sf_cache_object_close(sh->co);
    sf_fetch_destroy(sh->f); /* frees the engine-owned buffer; NULL is a no-op */
    if (sh->map && sh->map_len)
        munmap(sh->map, sh->map_len);
    for (size_t c = 0; c < sh->n_chunks; c++) {
        for (size_t i = 0; sh->chunks[c] && i < SF__LOC_CHUNK; i++) {
            free(sh->chunks[c][i].owned);
            free(sh->chunks[c][i].extra);
            free(sh->chunks[c][i].key);
        }
        free(sh->chunks[c]);
    }
    free(sh->chunks);
    free(sh);
}

/* A step of opening sh failed: closes it and fails the loader with msg
 * (st's text when msg is empty). Returns st. */
static sf_status open_failed(struct sf_loader *l, struct shard_slot *sh, sf_status st,
                             const char *msg)
{
    sf__loader_shard_close(l, sh);
    sf__loader_fail(l, st, "%s", msg[0] ? msg : sf_status_str(st));
    return st;
}

/* Opens shard `shard` for its plan range. Reader thread. */
sf_status sf__loader_shard_open(struct sf_loader *l, uint64_t shard, uint64_t begin, uint64_t end,
                                struct shard_slot **out)
{
    const struct sf_object_info *obj = l->objs[shard];
    struct shard_slot *sh = calloc(1, sizeof(*sh));
    if (!sh)
        return SF_ERR_NO_MEMORY;
    sh->shard = shard;
    sh->begin = begin;
    sh->end = end;
    sh->size = obj->size;
    sh->stream = end == UINT64_MAX;
    sh->to_end = !sh->stream && end == sf__sampler_shard_count(l->sampler, shard);
    struct sf_shard_reader_options ro;
    sf_shard_reader_options_init_default(&ro);
    ro.name = obj->url;
    ro.require_end_marker = l->o.require_end_marker;
    char err[ERR_LEN] = "";
    sf_status st = sf_shard_reader_new(&ro, &sh->r, err, sizeof(err));
    if (st != SF_OK)
        return open_failed(l, sh, st, err);
    if (sf__loader_is_local(obj->url)) {
        const char *path = local_path(obj);
        struct stat sb;
        int fd = sf__open_stat(path, &sb);
        if (fd < 0) {
            int e = errno;
            st = sf__errno_status(e);
            sf__loader_shard_close(l, sh);
            sf__loader_fail(l, st, "%s: %s", path, strerror(e));
            return st;
        }
        sh->size = (unsigned long long)sb.st_size;
        if (sh->size > l->o.max_shard_bytes) {
            close(fd);
            sf__loader_shard_close(l, sh);
            sf__loader_fail(l, SF_ERR_LIMIT, "%s: %llu bytes is over max_shard_bytes (%llu)", path,
                            sh->size, l->o.max_shard_bytes);
            return SF_ERR_LIMIT;
        }
        if (sh->size) {
            sh->map = mmap(NULL, (size_t)sh->size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (sh->map == MAP_FAILED) {
                int e = errno;
                sh->map = NULL;
                close(fd);
                sf__loader_shard_close(l, sh);
                sf__loader_fail(l, SF_ERR_IO, "%s: mmap: %s", path, strerror(e));
                return SF_ERR_IO;
            }
            sh->map_len = (size_t)sh->size;
            /* two calls: the advice values are numbers, not flags (2 | 3 is
             * WILLNEED alone) */
            madvise(sh->map, sh->map_len, MADV_SEQUENTIAL);
            madvise(sh->map, sh->map_len, MADV_WILLNEED);
        }
        close(fd);
        sh->base = sh->map;
        sh->contiguous = sh->size;
        sh->done_fetch = 1;
        atomic_fetch_add(&l->cache_hits, 1);
        sh->hit_counted = 1;
    } else if (l->cache) {
        st = sf_cache_open(l->cache, l->s3, obj, &sh->co);
        if (st != SF_OK) {
            char m[ERR_LEN];
            return open_failed(l, sh, st, sf_cache_errmsg(l->cache, m, sizeof(m)));
        }
    } else {
        struct sf_fetch_options fo;
        sf_fetch_options_init_default(&fo);
        fo.size = obj->size;
        if (obj->etag[0])
            fo.etag = obj->etag;
        st = sf_fetch_start(l->s3, obj->url, &fo, &sh->f);
        if (st != SF_OK) {
            char m[ERR_LEN];
            return open_failed(l, sh, st, sf_s3_errmsg(l->s3, m, sizeof(m)));
        }
        atomic_fetch_add(&l->cache_misses, 1);
        sh->hit_counted = 1;
    }
    if (sh->stream) {
        atomic_store(&sh->refs, 1); /* the parse token: dropped once parsed */
    } else {
        atomic_store(&sh->refs, l->deliveries[shard]);
        l->slot_of[shard] = sh;
    }
    sh->opened = 1;
    atomic_fetch_add(&l->shards_open, 1);
    atomic_fetch_add(&l->n_shards_opened, 1);
    *out = sh;
    return SF_OK;
}

/* Advances the shard's download without blocking longer than timeout_ms.
 * Returns SF_OK (maybe with new bytes) or an error (already recorded). */
sf_status sf__loader_shard_pump(struct sf_loader *l, struct shard_slot *sh, unsigned long long want,
                                int timeout_ms)
{
    if (sh->done_fetch)
        return SF_OK;
    if (sh->co) {
        struct sf_cache_object_progress p;
        sf_status st = sf_cache_object_wait(sh->co, want, timeout_ms, &p);
        if (st != SF_OK && st != SF_ERR_TIMEOUT) {
            const char *m = sf_cache_object_errmsg(sh->co);
            sf__loader_fail(l, st, "%s", m && m[0] ? m : sf_status_str(st));
            return st;
        }
        if (!sh->hit_counted && p.size != SF_SIZE_UNKNOWN) {
            int hit = p.source == SF_CACHE_FROM_RAM || p.source == SF_CACHE_FROM_DISK;
            atomic_fetch_add(hit ? &l->cache_hits : &l->cache_misses, 1);
            sh->hit_counted = 1;
        }
        sh->size = p.size;
        /* A peer's download is read only once published: its mapping may be
         * replaced when it finishes, and decode workers hold pointers. */
        if (p.source == SF_CACHE_FROM_PEER && !p.done)
            return SF_OK;
        if (p.size != SF_SIZE_UNKNOWN && p.size > l->o.max_shard_bytes) {
            sf__loader_fail(l, SF_ERR_LIMIT, "%s: %llu bytes is over max_shard_bytes (%llu)",
                            l->objs[sh->shard]->url, p.size, l->o.max_shard_bytes);
            return SF_ERR_LIMIT;
        }
        sh->base = sf_cache_object_data(sh->co);
        sh->contiguous = p.contiguous;
        if (p.done)
            sh->done_fetch = 1;
        return SF_OK;
    }
    struct sf_fetch_progress p;
    sf_status st = sf_fetch_wait(sh->f, want, timeout_ms, &p);
    if (p.done && p.status != SF_OK) {
        const char *m = sf_fetch_errmsg(sh->f);
        sf__loader_fail(l, p.status, "%s", m && m[0] ? m : sf_status_str(p.status));
        return p.status;
    }
    (void)st;
    if (p.object_size != SF_SIZE_UNKNOWN && p.object_size > l->o.max_shard_bytes) {
        sf__loader_fail(l, SF_ERR_LIMIT, "%s: %llu bytes is over max_shard_bytes (%llu)",
                        l->objs[sh->shard]->url, p.object_size, l->o.max_shard_bytes);
        return SF_ERR_LIMIT;
    }
    sh->size = p.total;
    sh->base = sf_fetch_data(sh->f);
    sh->contiguous = sh->base ? p.contiguous : 0;
    if (p.done)
        sh->done_fetch = 1;
    return SF_OK;
}

/* Copies what a sample needs into its loc. Reader thread. */
static sf_status record_sample(struct sf_loader *l, struct shard_slot *sh,
                               const struct sf_sample *s)
{
    uint64_t at_i = s->index - sh->begin;
    size_t c = (size_t)(at_i / SF__LOC_CHUNK);
    if (c >= sh->n_chunks) {
        size_t n = sh->n_chunks ? sh->n_chunks * 2 : 4;
        while (n <= c)
            n *= 2;
        struct sample_loc **v = realloc(sh->chunks, n * sizeof(*v));
        if (!v)
            return SF_ERR_NO_MEMORY;
        memset(v + sh->n_chunks, 0, (n - sh->n_chunks) * sizeof(*v));
        sh->chunks = v;
        sh->n_chunks = n;
    }
    if (!sh->chunks[c] && !(sh->chunks[c] = calloc(SF__LOC_CHUNK, sizeof(**sh->chunks))))
        return SF_ERR_NO_MEMORY;
    struct sample_loc *loc = &sh->chunks[c][at_i % SF__LOC_CHUNK];
    const struct sf_sample_field *img = NULL, *lbl = NULL;
    const char *lbl_name = NULL;
    for (size_t i = 0; i < l->n_img && !img; i++)
        img = find_field(s, l->img_names[i]);
    for (size_t i = 0; i < l->n_lbl && !lbl; i++)
        if ((lbl = find_field(s, l->lbl_names[i])))
            lbl_name = l->lbl_names[i];
    loc->key = strndup(s->key, s->key_len);
    if (!loc->key)
        return SF_ERR_NO_MEMORY;
    loc->offset = s->offset;
    if ((sh->map || sh->co) && !s->reader_owned) {
        size_t len = sh->map ? sh->map_len
                     : sh->size != SF_SIZE_UNKNOWN ? (size_t)sh->size
                                                   : (size_t)sh->contiguous;
        if (!sh->sweep) {
            sh->sweep = sh->base;
            sh->sweep_len = len;
        }
        if (img && img->size >= SF__DROP_MIN_BYTES)
            sf__fault_span(sh->base, len, s->offset, s->end, &loc->span, &loc->span_len);
    }
    loc->present = 1; /* a missing image stays NULL: the worker reports it (on_error) */
    if (l->n_extra) {
        loc->extra = calloc(l->n_extra, sizeof(*loc->extra));
        if (!loc->extra)
            return SF_ERR_NO_MEMORY;
    }
    /* Reader-owned bytes (zstd records) are copied out. */
    size_t own = 0;
    if (s->reader_owned) {
        own += img ? img->size : 0;
        own += lbl ? lbl->size : 0;
        for (size_t e = 0; e < l->n_extra; e++) {
            const struct sf_sample_field *f = find_field(s, l->extra_names[e]);
            own += f ? f->size : 0;
        }
        loc->owned = malloc(own ? own : 1);
        if (!loc->owned)
            return SF_ERR_NO_MEMORY;
    }
    size_t at = 0;
#define TAKE(dst, f)                                                                               \
    do {                                                                                           \
        if (s->reader_owned) {                                                                     \
            memcpy(loc->owned + at, (f)->data, (f)->size);                                         \
            (dst) = loc->owned + at;                                                               \
            at += (f)->size;                                                                       \
        } else {                                                                                   \
            (dst) = (const unsigned char *)(f)->data;                                              \
        }                                                                                          \
    } while (0)
    if (img) {
        TAKE(loc->img, img);
        loc->img_size = img->size;
        loc->img_off = img->offset;
    }
    if (lbl) {
        TAKE(loc->lbl, lbl);
        loc->lbl_size = lbl->size;
        loc->lbl_name = lbl_name; /* whole: its last part picks the syntax */
    }
    for (size_t e = 0; e < l->n_extra; e++) {
        const struct sf_sample_field *f = find_field(s, l->extra_names[e]);
        if (f) {
            TAKE(loc->extra[e].p, f);
            loc->extra[e].n = f->size;
        }
    }
#undef TAKE
    return SF_OK;
}

void sf__loader_shard_priority(struct shard_slot *sh, int priority)
{
    if (sh->priority == priority || sh->done_fetch)
        return;
    sh->priority = priority;
    if (sh->co)
        sf_cache_object_set_priority(sh->co, priority);
    else if (sh->f)
        sf_fetch_set_priority(sh->f, priority);
}

/* Marks a slot parsed; a streamed slot gives back its parse token. */
/* A tar shard read to its end without its end-of-archive blocks (cut at a
 * member boundary looks the same): counted and warned about, the first few
 * times (require_end_marker makes it an error in the reader instead). */
static void note_end_marker(struct sf_loader *l, const struct shard_slot *sh)
{
    struct sf_shard_stats ss;
    sf_shard_reader_stats(sh->r, &ss);
    if (!ss.missing_end_marker && !ss.lone_zero_block)
        return;
    unsigned long long n = atomic_fetch_add(&l->n_no_end_marker, 1);
    if (n < 8)
        sf__loader_log(l, SF_LOG_WARN,
                       "%s: ends at offset %llu %s, where a shard cut short would end too; read "
                       "as complete (require_end_marker makes it an error)%s",
                       l->objs[sh->shard]->url, (unsigned long long)sh->size,
                       ss.lone_zero_block ? "after one of its two end-of-archive blocks"
                                          : "right after a member, without its end-of-archive "
                                            "blocks",
                       n == 7 ? "; further ones are only counted (shards_without_end_marker)" : "");
}

static void slot_parsed(struct shard_slot *sh)
{
    if (sh->parsed)
        return;
    sh->parsed = 1;
    if (sh->stream)
        atomic_fetch_sub(&sh->refs, 1);
}

/* Whether read index k was delivered before the restore point: it entered
 * the shuffle buffer and left it (docs/sampling.md, "Without counts"). */
static int delivered_before(const struct sf_loader *l, uint64_t k)
{
    if (k >= l->rs_read)
        return 0;
    uint64_t a = 0, b = l->rs_n;
    while (a < b) {
        uint64_t m = a + (b - a) / 2;
        if (l->rs_window[m] < k)
            a = m + 1;
        else
            b = m;
    }
    return !(a < l->rs_n && l->rs_window[a] == k);
}

/* Reading a header maps the page cache around it (fault-around, or whole
 * large folios up to 2 MiB), mostly image bytes that wait in the shuffle
 * buffer (with 1,000 samples of 110 KB, some 60 MiB of RSS): the parse gives
 * back the pages of what it has read of a file-mapped shard, and each
 * decode faults its sample's pages in again (a few minor faults) and gives
 * them back (drop_pages). */
#define SF__PARSE_DROP_BYTES (4u << 20) /* given back every so many bytes parsed */

static void drop_parsed(struct shard_slot *sh, unsigned long long parsed_to)
{
    if ((sh->map || sh->co) && sh->base && parsed_to > sh->parse_dropped) {
        sf__drop_mapped(sh->base + sh->parse_dropped, parsed_to - sh->parse_dropped);
        sh->parse_dropped = parsed_to;
    }
}

/* Where the exact counts came from, for a shard that disagrees with its. */
static const char *count_source(const struct sf_loader *l)
{
    return l->from_index ? "index.json" : "the sample count learned in an earlier epoch or run";
}

/* Parses what arrived of the shard at the head of the read order. Returns
 * the number of samples newly read, or -1 on error. Reader thread. */
long sf__loader_shard_parse(struct sf_loader *l, struct shard_slot *sh)
{
    if (sh->parsed)
        return 0;
    long got = 0;
    if (sh->contiguous == 0 && !sh->done_fetch)
        return 0;
    unsigned long long parsed_to = sh->parse_dropped;
    sf_status st = sf_shard_reader_feed(sh->r, sh->base, sh->contiguous,
                                        sh->done_fetch ? sh->size : SF_SIZE_UNKNOWN);
    if (st != SF_OK) {
        sf__loader_fail(l, st, "%s", sf_shard_reader_errmsg(sh->r));
        return -1;
    }
    if (sh->contiguous > sh->bytes_counted) {
        atomic_fetch_add(&l->bytes_read, sh->contiguous - sh->bytes_counted);
        sh->bytes_counted = sh->contiguous;
    }
    for (;;) {
        struct sf_sample s;
        enum sf_shard_event ev;
        st = sf_shard_reader_next(sh->r, &s, &ev);
        if (st != SF_OK) {
            sf__loader_fail(l, st, "%s", sf_shard_reader_errmsg(sh->r));
            return -1;
        }
        if (ev == SF_SHARD_NEED_MORE)
            break;
        if (ev == SF_SHARD_END) {
            if (!sh->stream && sh->next_sample < sh->end) {
                sf__loader_fail(l, SF_ERR_CORRUPT,
                                "%s: ends at offset %llu after %llu samples, but %s says it "
                                "holds %s%llu",
                                l->objs[sh->shard]->url, sh->size,
                                (unsigned long long)sh->next_sample, count_source(l),
                                sh->to_end ? "" : "at least ", (unsigned long long)sh->end);
                return -1;
            }
            note_end_marker(l, sh);
            slot_parsed(sh);
            parsed_to = sh->contiguous; /* the end marker and padding were read too */
            break;
        }
        sh->next_sample = s.index + 1;
        parsed_to = s.end;
        if (parsed_to - sh->parse_dropped >= SF__PARSE_DROP_BYTES)
            drop_parsed(sh, parsed_to);
        if (sh->stream) {
            uint64_t k = sh->first_read + s.index;
            if (k >= sh->read_limit) {
                sh->beyond++; /* dropped: counted, not recorded */
                if (sh->pad) {
                    slot_parsed(sh); /* the pads needed are read */
                    break;
                }
                continue;
            }
            st = record_sample(l, sh, &s);
            if (st != SF_OK) {
                sf__loader_fail(l, st, "%s: out of memory", l->objs[sh->shard]->url);
                return -1;
            }
            sh->recorded = s.index + 1;
            if (delivered_before(l, k))
                sf__loader_loc(sh, s.index)->done = 1;
            else
                atomic_fetch_add(&sh->refs, 1);
            got++;
            continue;
        }
        if (s.index < sh->begin)
            continue; /* before this stream's part of a split shard */
        if (s.index >= sh->end) {
            /* to_end only: the count that planned the epoch is short. */
            sf__loader_fail(l, SF_ERR_CORRUPT,
                            "%s: sample %llu ('%.*s') at offset %llu is past the %llu samples %s "
                            "says it holds",
                            l->objs[sh->shard]->url, (unsigned long long)s.index,
                            (int)s.key_len, s.key, s.offset, (unsigned long long)sh->end,
                            count_source(l));
            return -1;
        }
        st = record_sample(l, sh, &s);
        if (st != SF_OK) {
            sf__loader_fail(l, st, "%s: out of memory", l->objs[sh->shard]->url);
            return -1;
        }
        got++;
        if (sh->next_sample >= sh->end && !sh->to_end) {
            slot_parsed(sh); /* the rest belongs to another stream, or nobody */
            break;
        }
    }
    drop_parsed(sh, parsed_to);
    return got;
}
