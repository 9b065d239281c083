/*
 * sf_cache_warm(): fetches a list of objects into the cache, many at a time,
 * through the per-object state machine of src/cache.c.
 */
#include "src/cache_internal.h"
#include "s3/s3_client.h"
#include "shardfeed.h"
#include "common/clock.h"
#include "src/shard_reader.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sf_warm_options_init_default(struct sf_warm_options *o)
{
    memset(o, 0, sizeof(*o));
    o->max_objects = 8;
    o->progress_interval_ms = 200;
}

/* The loader's rule (src/loader.c, expand_sources): only a listing is
 * filtered, by the names sf__shard_file_name() accepts. */
int sf_warm_wants(const char *source, const struct sf_object_info *obj)
{
    if (!source || !obj || obj->is_prefix)
        return 0;
    const char *name = obj->key ? obj->key : obj->url ? obj->url : "";
    return !sf__source_is_listing(source) || sf__shard_file_name(name);
}

struct warm_item {
    struct sf_cache_object *o;
    size_t index;
    uint64_t counted; /* bytes of this object already added to bytes_fetched */
};

static void warm_report(const struct sf_warm_options *wo, const struct sf_object_info *obj,
                        enum sf_warm_outcome out, sf_status st, const char *msg)
{
    if (wo->on_object)
        wo->on_object(wo->user, obj, out, st, msg ? msg : "");
}

/* The last report of a run: elapsed time, a final progress call, *out. */
static void warm_finish(const struct sf_warm_options *wo, struct sf_warm_stats *s, double t0,
                        struct sf_warm_stats *out)
{
    s->elapsed_s = sf__now_s() - t0;
    if (wo->progress)
        wo->progress(wo->user, s);
    if (out)
        *out = *s;
}

static sf_status warm_cancelled(struct sf_cache *c, const struct sf_warm_options *wo,
                                struct sf_warm_stats *s, double t0, struct sf_warm_stats *out)
{
    snprintf(c->errmsg, sizeof(c->errmsg),
             "warm-cache cancelled after %llu of %llu objects (%llu bytes fetched)",
             s->objects_done, s->objects_total, s->bytes_fetched);
    warm_finish(wo, s, t0, out);
    return SF_ERR_CANCELLED;
}

sf_status sf_cache_warm(struct sf_cache *c, struct sf_s3 *s3, const struct sf_object_info *list,
                        size_t n, const struct sf_warm_options *opts,
                        struct sf_warm_stats *stats_out)
{
    struct sf_warm_options wo;
    if (opts)
        wo = *opts;
    else
        sf_warm_options_init_default(&wo);
    if (!wo.max_objects)
        wo.max_objects = 8;
    if (wo.max_objects > SF_WARM_MAX_OBJECTS_MAX) {
        snprintf(c->errmsg, sizeof(c->errmsg), "max_objects %u: at most %u", wo.max_objects,
                 SF_WARM_MAX_OBJECTS_MAX);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (!wo.progress_interval_ms)
        wo.progress_interval_ms = 200;
    struct sf_warm_stats s;
    memset(&s, 0, sizeof(s));
    double t0 = sf__now_s();
    s.objects_total = n;
    sf_status first = SF_OK;
    uint64_t need = 0; /* what the objects take under the limit, checksums included */
    c->errmsg[0] = 0;

    /* Pass 1: what is cached, and the sizes of the rest (HEAD when unknown). */
    struct sf_object_info *objs = calloc(n ? n : 1, sizeof(*objs));
    unsigned char *todo = calloc(n ? n : 1, 1);
    if (!objs || !todo) {
        free(objs);
        free(todo);
        return SF_ERR_NO_MEMORY;
    }
    int cancelled = 0;
    for (size_t i = 0; i < n; i++) {
        if (wo.cancel && wo.cancel(wo.user)) {
            cancelled = 1;
            break;
        }
        objs[i] = list[i];
        if (objs[i].is_prefix) {
            todo[i] = 2; /* not an object */
            s.objects_total--;
            continue;
        }
        struct sf_cache_object *o;
        sf_status st = sf__cache_obj_new(c, s3, &objs[i], 0, wo.verify, &o);
        if (st == SF_OK) {
            st = sf__cache_step_lookup(o);
            objs[i].size = o->info.size;
            snprintf(objs[i].etag, sizeof(objs[i].etag), "%s", o->info.etag);
        }
        if (st != SF_OK || (o && o->state == ST_FAILED)) {
            char msg[1024];
            snprintf(msg, sizeof(msg), "%s", o ? o->errmsg : c->errmsg);
            sf_status fst = o ? o->status : st;
            warm_report(&wo, &objs[i], SF_WARM_FAILED, fst, msg);
            s.failed++;
            s.objects_done++;
            if (first == SF_OK) {
                first = fst;
                snprintf(c->errmsg, sizeof(c->errmsg), "%s", msg);
            }
            todo[i] = 2;
        } else if (o->state == ST_READY) {
            s.bytes_total += o->info.size;
            need += sf__dc_entry_reserve(o->info.size);
            s.cached++;
            s.objects_done++;
            warm_report(&wo, &objs[i], SF_WARM_CACHED, SF_OK, "");
        } else {
            s.bytes_total += o->info.size;
            s.bytes_to_fetch += o->info.size;
            need += sf__dc_entry_reserve(o->info.size);
            todo[i] = 1;
        }
        sf_cache_object_close(o);
    }
    if (cancelled) {
        free(objs);
        free(todo);
        return warm_cancelled(c, &wo, &s, t0, stats_out);
    }
    /* Everything must fit at once, or warming evicts what it just fetched:
     * each entry with its metadata and trailer, as a download reserves it. */
    if (c->o.limit_bytes && need > c->o.limit_bytes) {
        snprintf(c->errmsg, sizeof(c->errmsg),
                 "the %llu objects need %llu bytes (%llu of data and their checksums) but "
                 "cache_limit is %llu bytes: raise --cache-limit or warm fewer shards",
                 s.objects_total, (unsigned long long)need, s.bytes_total, c->o.limit_bytes);
        free(objs);
        free(todo);
        s.elapsed_s = sf__now_s() - t0;
        if (stats_out)
            *stats_out = s;
        return SF_ERR_LIMIT;
    }
    if (wo.dry_run) {
        for (size_t i = 0; i < n; i++)
            if (todo[i] == 1)
                warm_report(&wo, &objs[i], SF_WARM_WOULD_FETCH, SF_OK, "");
        free(objs);
        free(todo);
        warm_finish(&wo, &s, t0, stats_out);
        return first;
    }

    /* Pass 2: download, max_objects at a time. */
    struct warm_item *act = calloc(wo.max_objects, sizeof(*act));
    if (!act) {
        free(objs);
        free(todo);
        return SF_ERR_NO_MEMORY;
    }
    size_t next = 0, n_act = 0;
    double last_report = 0;
    for (;;) {
        if (wo.cancel && wo.cancel(wo.user)) {
            /* Unfinished downloads keep their bytes for the next call. */
            for (size_t k = 0; k < n_act; k++)
                sf_cache_object_close(act[k].o);
            free(act);
            free(objs);
            free(todo);
            return warm_cancelled(c, &wo, &s, t0, stats_out);
        }
        while (n_act < wo.max_objects && next < n) {
            size_t i = next++;
            if (todo[i] != 1)
                continue;
            struct sf_cache_object *o;
            sf_status st = sf__cache_obj_new(c, s3, &objs[i], 0, wo.verify, &o);
            if (st != SF_OK) {
                warm_report(&wo, &objs[i], SF_WARM_FAILED, st, c->errmsg);
                s.failed++;
                s.objects_done++;
                if (first == SF_OK)
                    first = st;
                continue;
            }
            act[n_act].o = o;
            act[n_act].index = i;
            act[n_act].counted = 0;
            n_act++;
        }
        if (n_act == 0)
            break;
        /* Block on the oldest for a moment; poll the others. */
        for (size_t k = 0; k < n_act; k++) {
            struct sf_cache_object *o = act[k].o;
            sf__cache_drive(o, o->info.size == SF_SIZE_UNKNOWN ? 0 : o->info.size, k == 0 ? 20 : 0);
            if (o->source == SF_CACHE_FROM_FETCH && o->contiguous > act[k].counted) {
                uint64_t base = act[k].counted ? act[k].counted : o->fetch_base;
                if (o->contiguous > base)
                    s.bytes_fetched += o->contiguous - base;
                act[k].counted = o->contiguous;
            }
        }
        for (size_t k = 0; k < n_act;) {
            struct sf_cache_object *o = act[k].o;
            if (o->state != ST_READY && o->state != ST_FAILED) {
                k++;
                continue;
            }
            struct sf_object_info *info = &objs[act[k].index];
            if (o->state == ST_READY) {
                enum sf_warm_outcome out =
                    o->source == SF_CACHE_FROM_FETCH ? SF_WARM_FETCHED : SF_WARM_PEER;
                if (out == SF_WARM_FETCHED)
                    s.fetched++;
                else
                    s.peer++;
                warm_report(&wo, info, out, SF_OK, "");
            } else {
                s.failed++;
                warm_report(&wo, info, SF_WARM_FAILED, o->status, o->errmsg);
                if (first == SF_OK) {
                    first = o->status;
                    snprintf(c->errmsg, sizeof(c->errmsg), "%s", o->errmsg);
                }
            }
            s.objects_done++;
            sf_cache_object_close(o);
            act[k] = act[--n_act];
        }
        double now = sf__now_s();
        if (wo.progress && (now - last_report) * 1000.0 >= wo.progress_interval_ms) {
            s.elapsed_s = now - t0;
            wo.progress(wo.user, &s);
            last_report = now;
        }
    }
    free(act);
    free(objs);
    free(todo);
    warm_finish(&wo, &s, t0, stats_out);
    return first;
}
