/*
 * The cache glue: ties the fetch engine (s3/) to the RAM and disk tiers
 * (cache/). Opening an object is a small state machine driven by
 * sf_cache_object_wait(); sf_cache_warm() (src/cache_warm.c) drives many
 * of them at once.
 */
#include "src/cache_internal.h"
#include "cache/disk_cache.h"
#include "cache/ram_cache.h"
#include "s3/s3_client.h"
#include "shardfeed.h"
#include "shardfeed_cache.h"
#include "common/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FOLLOW_POLL_MS   10
#define PROGRESS_EVERY_S 0.05

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

__attribute__((format(printf, 3, 4))) static void logf_(struct sf_cache *c, enum sf_log_level lv,
                                                        const char *fmt, ...)
{
    if (!c->o.log || lv > c->o.log_level)
        return;
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    c->o.log(c->o.log_user, lv, msg);
}

__attribute__((format(printf, 3, 4))) static sf_status obj_fail(struct sf_cache_object *o,
                                                                sf_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->errmsg, sizeof(o->errmsg), fmt, ap);
    va_end(ap);
    o->status = st;
    o->state = ST_FAILED;
    return st;
}

/* ------------------------------------------------------------ handle */

void sf_cache_options_init_default(struct sf_cache_options *o)
{
    memset(o, 0, sizeof(*o));
    o->revalidate = SF_REVALIDATE_TRUST;
    o->verify_on_open = 1;
    o->log_level = SF_LOG_WARN;
}

sf_status sf_cache_new(const struct sf_cache_options *o, struct sf_cache **out, char *err,
                       size_t err_len)
{
    *out = NULL;
    if (err && err_len)
        err[0] = 0;
    struct sf_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return SF_ERR_NO_MEMORY;
    if (o)
        c->o = *o;
    else
        sf_cache_options_init_default(&c->o);
    sf_status st = SF_OK;
    if (c->o.dir && c->o.dir[0]) {
        if (snprintf(c->dir, sizeof(c->dir), "%s", c->o.dir) >= (int)sizeof(c->dir))
            st = SF_ERR_LIMIT;
    } else {
        st = sf__dc_default_dir(c->dir, sizeof(c->dir));
        if (st != SF_OK && err)
            snprintf(err, err_len, "no cache_dir given and neither XDG_CACHE_HOME nor HOME is set");
    }
    c->o.dir = c->dir;
    if (st == SF_OK) {
        struct sf__disk_cache_options dco = {
            .dir = c->dir, .limit_bytes = c->o.limit_bytes, .fsync = c->o.fsync};
        st = sf__disk_cache_open(&dco, &c->dc, err, err_len);
    }
    if (st == SF_OK)
        st = sf__ram_cache_new(c->o.ram_limit_bytes, &c->ram);
    if (st != SF_OK) {
        sf_cache_destroy(c);
        return st;
    }
    c->n.limit_bytes = c->o.limit_bytes;
    c->n.ram_limit_bytes = c->o.ram_limit_bytes;
    *out = c;
    return SF_OK;
}

void sf_cache_destroy(struct sf_cache *c)
{
    if (!c)
        return;
    sf__ram_cache_destroy(c->ram);
    sf__disk_cache_close(c->dc);
    free(c);
}

const char *sf_cache_dir(const struct sf_cache *c)
{
    return c->dir;
}

const char *sf_cache_errmsg(const struct sf_cache *c, char *buf, size_t len)
{
    if (buf && len)
        snprintf(buf, len, "%s", c ? c->errmsg : "");
    return buf;
}

/* ------------------------------------------------------------ objects */

static void unmap_release(void *user, void *data, size_t size)
{
    (void)user;
    if (data && size)
        munmap(data, size);
}

static void drop_data(struct sf_cache_object *o)
{
    if (o->ram) {
        sf__ram_cache_release(o->c->ram, o->ram);
        o->ram = NULL;
    } else if (o->map_len) {
        munmap((void *)o->data, o->map_len);
    }
    o->data = NULL;
    o->map_len = 0;
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
}

/* Not populated: a reader maps what it reads (the loader gives the pages
 * back as it goes); a hit is verified by sf__dc_verify_fd, which gives each
 * block back once hashed. */
static int map_fd(struct sf_cache_object *o, int fd, uint64_t size)
{
    if (size == 0)
        return 0;
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -1;
    o->data = p;
    o->map_len = (size_t)size;
    return 0;
}

/* The RAM tier's key of an entry file: its name and the file itself
 * (device, inode). An entry replaced by a new file of the same name (found
 * bad, deleted and fetched again) has another key, so the mapping of the
 * old file, which may end before its data does when the file was cut short
 * (SIGBUS on reading), is never served for it; it ages out unused. An
 * inode is not reused while the old mapping keeps it. */
static int ram_key(int fd, const char *name, char *key, size_t n)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return -1;
    snprintf(key, n, "%s@%llx:%llx", name, (unsigned long long)sb.st_dev,
             (unsigned long long)sb.st_ino);
    return 0;
}

/* A verified disk hit: map it (through the RAM tier when enabled). */
static sf_status open_hit(struct sf_cache_object *o, int fd, struct sf__dc_meta *m)
{
    struct sf_cache *c = o->c;
    o->info.size = m->size;
    if (!o->info.etag[0])
        snprintf(o->info.etag, sizeof(o->info.etag), "%s", m->etag);
    if (!o->want_data) {
        close(fd);
        o->contiguous = m->size;
        o->state = ST_READY;
        o->source = SF_CACHE_FROM_DISK;
        c->n.disk_hits++;
        return SF_OK;
    }
    o->fd = fd;
    if (map_fd(o, fd, m->size) != 0) {
        drop_data(o);
        return obj_fail(o, SF_ERR_IO, "%s: cannot map cache entry %s: %s", o->info.url, m->name,
                        strerror(errno));
    }
    if (o->verify && m->size) {
        char why[256];
        if (sf__dc_verify_fd(fd, m, why, sizeof(why)) != SF_OK) {
            struct stat checked;
            const int have = fstat(fd, &checked) == 0;
            drop_data(o);
            sf__dc_remove(c->dc, m->name, have ? &checked : NULL);
            c->n.corrupt++;
            logf_(c, SF_LOG_WARN,
                  "%s: cache entry %s failed verification (%s); deleted, fetching again",
                  o->info.url, m->name, why);
            return SF_ERR_CORRUPT; /* the caller goes on as for a miss */
        }
    }
    char key[SF__DC_NAME_MAX + 40];
    if (c->o.ram_limit_bytes && o->map_len && ram_key(fd, m->name, key, sizeof(key)) == 0) {
        struct sf__ram_entry *e;
        if (sf__ram_cache_insert(c->ram, key, (void *)o->data, o->map_len, unmap_release, NULL,
                                 &e) == SF_OK) {
            o->ram = e;
            o->data = sf__ram_entry_data(e); /* another open may have won the insert */
            o->map_len = 0;
        }
    }
    o->contiguous = m->size;
    o->state = ST_READY;
    o->source = SF_CACHE_FROM_DISK;
    c->n.disk_hits++;
    return SF_OK;
}

sf_status sf__cache_step_lookup(struct sf_cache_object *o)
{
    struct sf_cache *c = o->c;
    char err[1024];
    if (!o->info.etag[0] && c->o.revalidate == SF_REVALIDATE_HEAD && !o->looked_up) {
        struct sf_object_info fresh;
        sf_status st = sf_s3_stat(o->s3, o->info.url, &fresh);
        if (st != SF_OK) {
            char m[1024];
            sf_s3_errmsg(o->s3, m, sizeof(m));
            return obj_fail(o, st, "%s", m);
        }
        o->info.size = fresh.size;
        snprintf(o->info.etag, sizeof(o->info.etag), "%s", fresh.etag);
        sf_object_info_clear(&fresh);
    }
    o->looked_up = 1;
    int fd = -1;
    struct sf__dc_meta m;
    unsigned flags = (!o->want_data && o->verify) ? SF__DC_VERIFY_DATA : 0;
    sf_status st = sf__dc_lookup(c->dc, &o->id, o->info.etag, flags, &fd, &m, err, sizeof(err));
    if (st == SF_OK) {
        /* RAM tier: its entries were verified when they came in. */
        char key[SF__DC_NAME_MAX + 40];
        if (c->o.ram_limit_bytes && o->want_data && ram_key(fd, m.name, key, sizeof(key)) == 0) {
            struct sf__ram_entry *e = sf__ram_cache_get(c->ram, key);
            if (e) {
                close(fd);
                o->ram = e;
                o->data = sf__ram_entry_data(e);
                o->contiguous = o->info.size = m.size;
                if (!o->info.etag[0])
                    snprintf(o->info.etag, sizeof(o->info.etag), "%s", m.etag);
                o->state = ST_READY;
                o->source = SF_CACHE_FROM_RAM;
                c->n.ram_hits++;
                sf__dc_meta_clear(&m);
                return SF_OK;
            }
        }
        st = open_hit(o, fd, &m);
        sf__dc_meta_clear(&m);
        if (st == SF_OK || o->state == ST_FAILED)
            return st;
    } else if (st == SF_ERR_CORRUPT) {
        c->n.corrupt++;
        logf_(c, SF_LOG_WARN, "%s", err);
    } else if (st != SF_ERR_NOT_FOUND) {
        return obj_fail(o, st, "%s: %s", o->info.url, err);
    }
    c->n.misses++;
    /* A miss: the download needs the size and the ETag. */
    if (!o->info.etag[0] || o->info.size == SF_SIZE_UNKNOWN) {
        struct sf_object_info fresh;
        st = sf_s3_stat(o->s3, o->info.url, &fresh);
        if (st != SF_OK) {
            char m2[1024];
            sf_s3_errmsg(o->s3, m2, sizeof(m2));
            return obj_fail(o, st, "%s", m2);
        }
        if (o->info.etag[0] && strcmp(o->info.etag, fresh.etag) != 0) {
            st = obj_fail(o, SF_ERR_CHANGED, "%s: object changed: listed with ETag %s, now %s",
                          o->info.url, o->info.etag, fresh.etag);
            sf_object_info_clear(&fresh);
            return st;
        }
        o->info.size = fresh.size;
        snprintf(o->info.etag, sizeof(o->info.etag), "%s", fresh.etag);
        sf_object_info_clear(&fresh);
        if (!o->info.etag[0])
            return obj_fail(o, SF_ERR_UNSUPPORTED,
                            strcmp(o->endpoint, "file") == 0
                                ? "%s: a local file is read where it is and never cached (the "
                                  "cache holds s3:// and http(s):// objects)"
                                : "%s: the server sent no ETag, so the object cannot be cached",
                            o->info.url);
    }
    o->state = ST_BEGIN;
    return SF_OK;
}

/* The fetch engine's observer (an I/O thread, one call at a time per fetch):
 * bytes just written to the download, hashed into the entry's block checksums as they arrive. */
static void feed_writer(void *user, unsigned long long offset, const void *data, size_t len)
{
    sf__dc_writer_feed(user, offset, data, len);
}

static sf_status step_begin(struct sf_cache_object *o)
{
    struct sf_cache *c = o->c;
    char err[1024];
    enum sf__dc_begin_result r;
    sf_status st =
        sf__dc_begin(c->dc, &o->id, o->info.etag, o->info.size, &r, &o->w, err, sizeof(err));
    if (st != SF_OK)
        return obj_fail(o, st, "%s: %s", o->info.url, err);
    if (r == SF__DC_PUBLISHED) {
        o->state = ST_LOOKUP;
        return SF_OK;
    }
    if (r == SF__DC_BUSY) {
        if (!o->peer_wait_counted) {
            c->n.peer_waits++;
            o->peer_wait_counted = 1;
        }
        o->state = ST_FOLLOW;
        o->source = SF_CACHE_FROM_PEER;
        return SF_OK;
    }
    /* We download. Map the file so the caller reads bytes as they land. */
    o->fetch_base = sf__dc_writer_resume(o->w);
    if (o->fetch_base)
        c->n.resumed++;
    o->source = SF_CACHE_FROM_FETCH;
    o->contiguous = o->fetch_base;
    if (o->want_data && map_fd(o, sf__dc_writer_fd(o->w), o->info.size) != 0) {
        sf__dc_writer_abort(o->w, 1);
        o->w = NULL;
        return obj_fail(o, SF_ERR_IO, "%s: cannot map the download: %s", o->info.url,
                        strerror(errno));
    }
    if (o->fetch_base < o->info.size) {
        struct sf_fetch_options fo;
        sf_fetch_options_init_default(&fo);
        fo.fd = sf__dc_writer_fd(o->w);
        fo.file_offset = o->fetch_base;
        fo.offset = o->fetch_base;
        fo.length = o->info.size - o->fetch_base;
        fo.size = o->info.size;
        fo.etag = o->info.etag;
        fo.priority = o->priority;
        fo.on_data = feed_writer;
        fo.on_data_user = o->w;
        st = sf_fetch_start(o->s3, o->info.url, &fo, &o->f);
        if (st != SF_OK) {
            char m[1024];
            sf_s3_errmsg(o->s3, m, sizeof(m));
            sf__dc_writer_abort(o->w, 1);
            o->w = NULL;
            return obj_fail(o, st, "%s", m);
        }
    }
    o->state = ST_FETCH;
    o->last_progress = sf__now_s();
    return SF_OK;
}

static sf_status publish(struct sf_cache_object *o)
{
    struct sf_cache *c = o->c;
    char err[1024];
    struct sf__dc_meta m;
    /* The download's file outlives a failed publish for as long as we look
     * at it: whether it still holds every byte decides what the reader gets. */
    int keep = o->want_data ? fcntl(sf__dc_writer_fd(o->w), F_DUPFD_CLOEXEC, 0) : -1;
    sf_status st = sf__dc_writer_publish(o->w, o->info.url, &m, err, sizeof(err));
    o->w = NULL;
    struct stat sb;
    int intact = st != SF_OK && keep >= 0 && (o->data || !o->info.size) && fstat(keep, &sb) == 0 &&
                 (uint64_t)sb.st_size >= o->info.size;
    if (keep >= 0)
        close(keep);
    if (intact) {
        /* Every byte arrived and is mapped (a mapping keeps its file even
         * once unlinked), and the file was not cut short: the reader gets
         * the object as a stream would give it, and only the caching failed
         * (the directory was removed, no room for the metadata). A later
         * open fetches it again. */
        logf_(c, SF_LOG_WARN, "%s; read without caching it", err);
        o->contiguous = o->info.size;
        o->state = ST_READY;
        return SF_OK;
    }
    if (st != SF_OK)
        return obj_fail(o, st, "%s", err);
    sf__dc_meta_clear(&m);
    c->n.fetched_objects++;
    o->contiguous = o->info.size;
    o->state = ST_READY;
    return SF_OK;
}

/* Our download: wait on the engine for up to timeout_ms. */
static sf_status step_fetch(struct sf_cache_object *o, uint64_t want, int timeout_ms)
{
    struct sf_cache *c = o->c;
    if (!o->f)
        return publish(o); /* nothing left to fetch: resumed at the end */
    struct sf_fetch_progress p;
    uint64_t rel = want > o->fetch_base ? want - o->fetch_base : 0;
    /* Everything asked for: sleep until the fetch is done rather than
     * return at once each time its last bytes are already in. */
    if (o->info.size != SF_SIZE_UNKNOWN && want >= o->info.size)
        rel = UINT64_MAX;
    sf_status st = sf_fetch_wait(o->f, rel, timeout_ms, &p);
    uint64_t before = o->contiguous;
    o->contiguous = o->fetch_base + p.contiguous;
    if (o->contiguous > before)
        c->n.fetched_bytes += o->contiguous - before;
    double now = sf__now_s();
    if (now - o->last_progress >= PROGRESS_EVERY_S || p.done) {
        sf__dc_writer_progress(o->w, o->contiguous);
        o->last_progress = now;
    }
    if (!p.done)
        return st == SF_ERR_TIMEOUT ? SF_ERR_TIMEOUT : SF_OK;
    if (p.status != SF_OK) {
        char m[1024];
        snprintf(m, sizeof(m), "%s", sf_fetch_errmsg(o->f));
        sf_fetch_destroy(o->f);
        o->f = NULL;
        /* Keep what arrived: a later run resumes from it. */
        sf__dc_writer_progress(o->w, o->contiguous);
        sf__dc_writer_abort(o->w, 1);
        o->w = NULL;
        return obj_fail(o, p.status, "%s", m[0] ? m : sf_status_str(p.status));
    }
    sf_fetch_destroy(o->f);
    o->f = NULL;
    return publish(o);
}

/* Another process downloads: read its progress record. */
static sf_status step_follow(struct sf_cache_object *o, uint64_t want, int timeout_ms)
{
    struct sf_cache *c = o->c;
    double deadline = timeout_ms < 0 ? 1e300 : sf__now_s() + timeout_ms / 1000.0;
    for (;;) {
        struct sf__dc_record rec;
        int alive = 0;
        sf_status st = sf__dc_peek(c->dc, &o->id, &rec, &alive);
        int published = st == SF_OK && rec.state == SF__DC_ST_PUBLISHED;
        /* "Published" under a live lock is the owner between its rename and
         * its unlock, or the record of an earlier download whose entry has
         * gone since (evicted, cleared) under a new owner that has not
         * written its own yet (it is reserving space, which can mean a scan
         * and evictions): one more lookup tells them apart, and then we
         * wait for the record to change instead of looping through lookups. */
        if (!alive || (published && !o->stale_published)) {
            /* Finished or died: look again; we may take over. */
            o->stale_published = alive;
            drop_data(o);
            o->state = ST_LOOKUP;
            return SF_OK;
        }
        if (!published)
            o->stale_published = 0;
        if (st == SF_OK && rec.state == SF__DC_ST_DOWNLOADING && !strcmp(rec.etag, o->info.etag) &&
            rec.size == o->info.size) {
            if (o->want_data && o->fd < 0) {
                int fd = sf__dc_open_part(c->dc, &o->id);
                struct stat sb;
                if (fd >= 0 && fstat(fd, &sb) == 0 && (uint64_t)sb.st_size >= o->info.size) {
                    o->fd = fd;
                    if (map_fd(o, fd, o->info.size) != 0)
                        drop_data(o);
                } else if (fd >= 0) {
                    close(fd);
                }
            }
            if (o->fd >= 0 || !o->want_data)
                o->contiguous = rec.contiguous;
            if (o->want_data && o->contiguous >= want && o->fd >= 0 && want < o->info.size)
                return SF_OK;
        }
        if (sf__now_s() >= deadline)
            return SF_ERR_TIMEOUT;
        sleep_ms(timeout_ms < 0 || timeout_ms > FOLLOW_POLL_MS ? FOLLOW_POLL_MS : timeout_ms);
    }
}

static void fill_progress(const struct sf_cache_object *o, struct sf_cache_object_progress *p)
{
    if (!p)
        return;
    p->size = o->info.size;
    p->contiguous = o->contiguous;
    p->done = o->state == ST_READY || o->state == ST_FAILED;
    p->source = o->source;
    p->status = o->status;
}

/* Advances o until want bytes are there, it is done, or timeout_ms passes. */
sf_status sf__cache_drive(struct sf_cache_object *o, uint64_t want, int timeout_ms)
{
    double deadline = timeout_ms < 0 ? 1e300 : sf__now_s() + timeout_ms / 1000.0;
    for (int guard = 0;; guard++) {
        sf_status st = SF_OK;
        double left_s = deadline - sf__now_s();
        int left = timeout_ms < 0 ? -1 : left_s <= 0 ? 0 : (int)(left_s * 1000.0 + 0.5);
        switch (o->state) {
        case ST_READY: return SF_OK;
        case ST_FAILED: return o->status;
        case ST_LOOKUP:
            if (guard > 1000)
                return obj_fail(o, SF_ERR_INTERNAL, "%s: cache lookups do not settle", o->info.url);
            st = sf__cache_step_lookup(o);
            break;
        case ST_BEGIN: st = step_begin(o); break;
        case ST_FETCH: {
            /* Wake up now and then to publish progress for followers. */
            int slice = left < 0 || left > 50 ? 50 : left;
            st = step_fetch(o, want, slice);
            if (st == SF_ERR_TIMEOUT) {
                if (timeout_ms >= 0 && sf__now_s() >= deadline)
                    return st;
                st = SF_OK;
                continue;
            }
            /* All of it was asked for: also wait for the publish. */
            if (o->state == ST_FETCH && o->contiguous >= want && o->want_data &&
                want < o->info.size)
                return SF_OK;
            break;
        }
        case ST_FOLLOW:
            st = step_follow(o, want, left);
            if (st == SF_ERR_TIMEOUT)
                return st;
            if (o->state == ST_FOLLOW)
                return SF_OK;
            break;
        }
        if (o->state == ST_FAILED)
            return o->status;
        if (st != SF_OK && st != SF_ERR_CORRUPT)
            return st;
        if (timeout_ms >= 0 && sf__now_s() >= deadline && o->state != ST_READY)
            return SF_ERR_TIMEOUT;
    }
}

sf_status sf__cache_obj_new(struct sf_cache *c, struct sf_s3 *s3, const struct sf_object_info *obj,
                            int want_data, int verify, struct sf_cache_object **out)
{
    *out = NULL;
    if (!obj || !obj->url[0] || obj->is_prefix)
        return SF_ERR_INVALID_ARGUMENT;
    struct sf_cache_object *o = calloc(1, sizeof(*o));
    if (!o)
        return SF_ERR_NO_MEMORY;
    o->c = c;
    o->s3 = s3;
    o->info = *obj;
    o->url_copy = strdup(obj->url);
    o->info.url = o->url_copy;
    o->info.key = NULL;
    o->fd = -1;
    if (!o->url_copy) {
        free(o);
        return SF_ERR_NO_MEMORY;
    }
    o->want_data = want_data;
    o->verify = verify;
    sf_status st = sf__s3_identity(s3, obj->url, o->endpoint, sizeof(o->endpoint), o->bucket,
                                   sizeof(o->bucket), o->key, sizeof(o->key));
    if (st != SF_OK) {
        sf_s3_errmsg(s3, c->errmsg, sizeof(c->errmsg));
        free(o->url_copy);
        free(o);
        return st;
    }
    o->id.endpoint = o->endpoint;
    o->id.bucket = o->bucket;
    o->id.key = o->key;
    *out = o;
    return SF_OK;
}

sf_status sf_cache_open(struct sf_cache *c, struct sf_s3 *s3, const struct sf_object_info *obj,
                        struct sf_cache_object **out)
{
    sf_status st = sf__cache_obj_new(c, s3, obj, 1, c->o.verify_on_open, out);
    if (st != SF_OK)
        return st;
    struct sf_cache_object *o = *out;
    st = sf__cache_drive(o, 0, 0);
    if (st == SF_ERR_TIMEOUT)
        st = SF_OK;
    if (st != SF_OK) {
        snprintf(c->errmsg, sizeof(c->errmsg), "%s", o->errmsg);
        sf_cache_object_close(o);
        *out = NULL;
    }
    return st;
}

sf_status sf_cache_object_wait(struct sf_cache_object *o, unsigned long long min_contiguous,
                               int timeout_ms, struct sf_cache_object_progress *p)
{
    uint64_t want = min_contiguous;
    if (o->info.size != SF_SIZE_UNKNOWN && want > o->info.size)
        want = o->info.size;
    sf_status st = sf__cache_drive(o, want, timeout_ms);
    fill_progress(o, p);
    return st;
}

void sf_cache_object_set_priority(struct sf_cache_object *o, int priority)
{
    o->priority = priority != 0;
    if (o->f)
        sf_fetch_set_priority(o->f, o->priority);
}

const void *sf_cache_object_data(const struct sf_cache_object *o)
{
    return o->data;
}

unsigned long long sf_cache_object_size(const struct sf_cache_object *o)
{
    return o->info.size;
}

const char *sf_cache_object_errmsg(const struct sf_cache_object *o)
{
    return o->errmsg;
}

void sf_cache_object_close(struct sf_cache_object *o)
{
    if (!o)
        return;
    if (o->f) {
        struct sf_fetch_progress p;
        sf_fetch_progress(o->f, &p);
        sf_fetch_destroy(o->f);
        o->contiguous = o->fetch_base + p.contiguous;
    }
    if (o->w) {
        sf__dc_writer_progress(o->w, o->contiguous);
        sf__dc_writer_abort(o->w, 1);
    }
    drop_data(o);
    free(o->url_copy);
    free(o);
}

/* ------------------------------------------------------------ inspection */

sf_status sf_cache_stats(struct sf_cache *c, struct sf_cache_stats *out)
{
    *out = c->n;
    struct sf__ram_stats rs;
    sf__ram_cache_stats(c->ram, &rs);
    out->ram_bytes = rs.bytes;
    out->ram_limit_bytes = rs.limit_bytes;
    struct sf__dc_counters dn;
    sf__dc_counters(c->dc, &dn);
    out->evictions = dn.evictions;
    out->evicted_bytes = dn.evicted_bytes;
    out->stream_hashed_blocks = dn.stream_hashed_blocks;
    out->file_hashed_blocks = dn.file_hashed_blocks;
    out->catch_up_bytes = dn.catch_up_bytes;
    struct sf__dc_usage u;
    sf_status st = sf__dc_usage(c->dc, 0, &u, c->errmsg, sizeof(c->errmsg));
    if (st != SF_OK)
        return st;
    out->entries = u.entries;
    out->entry_bytes = u.entry_bytes;
    out->downloads = u.parts;
    out->download_bytes = u.part_bytes;
    out->abandoned_downloads = u.abandoned_parts;
    out->limit_bytes = c->o.limit_bytes;
    return SF_OK;
}

struct list_ctx {
    struct sf_cache *c;
    int verify;
    int (*fn)(void *user, const struct sf_cache_entry_info *e);
    void *user;
    unsigned long long bad;
};

static int list_one(void *user, const char *path, const struct sf__dc_meta *m, sf_status st,
                    const char *why)
{
    struct list_ctx *x = user;
    char problem[512];
    snprintf(problem, sizeof(problem), "%s", st == SF_OK ? "" : why);
    struct stat checked;
    int have = 0;
    if (st == SF_OK && x->verify) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            st = SF_ERR_IO;
            snprintf(problem, sizeof(problem), "cannot open: %s", strerror(errno));
        } else {
            st = sf__dc_verify_fd(fd, m, problem, sizeof(problem));
            have = fstat(fd, &checked) == 0;
            close(fd);
        }
    }
    if (st == SF_ERR_CORRUPT && x->verify) {
        sf__dc_remove(x->c->dc, m->name, have ? &checked : NULL);
        x->c->n.corrupt++;
    }
    if (st != SF_OK)
        x->bad++;
    struct sf_cache_entry_info e = {
        .name = m->name,
        .url = m->url,
        .etag = m->etag,
        .size = m->size,
        .created = m->created,
        .last_used = m->last_used,
        .status = st,
        .problem = problem,
    };
    return x->fn ? x->fn(x->user, &e) : 0;
}

sf_status sf_cache_list(struct sf_cache *c, int verify,
                        int (*fn)(void *user, const struct sf_cache_entry_info *e), void *user,
                        unsigned long long *bad)
{
    struct list_ctx x = {c, verify, fn, user, 0};
    sf_status st = sf__dc_foreach(c->dc, list_one, &x, c->errmsg, sizeof(c->errmsg));
    if (bad)
        *bad = x.bad;
    return st;
}

sf_status sf_cache_clear(struct sf_cache *c, unsigned long long *removed)
{
    uint64_t r = 0;
    sf_status st = sf__dc_clear(c->dc, &r, c->errmsg, sizeof(c->errmsg));
    if (removed)
        *removed = r;
    return st;
}
