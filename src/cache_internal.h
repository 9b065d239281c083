/*
 * Internal to the cache glue (src/cache.c, src/cache_warm.c): the handle,
 * the per-object state machine, and the calls that make and drive one.
 */
#ifndef SF_SRC_CACHE_INTERNAL_H
#define SF_SRC_CACHE_INTERNAL_H

#include "cache/disk_cache.h"
#include "cache/ram_cache.h"
#include "shardfeed_cache.h"

#include <limits.h>
#include <stdint.h>

struct sf_cache {
    struct sf_cache_options o;
    char dir[PATH_MAX];
    struct sf__disk_cache *dc;
    struct sf__ram_cache *ram;
    struct sf_cache_stats n; /* the per-handle counters */
    char errmsg[1024];
};

enum obj_state {
    ST_LOOKUP = 0, /* look in the tiers */
    ST_BEGIN,      /* try to become the downloader */
    ST_FETCH,      /* our download runs */
    ST_FOLLOW,     /* another process downloads */
    ST_READY,      /* complete and verified */
    ST_FAILED,
};

struct sf_cache_object {
    struct sf_cache *c;
    struct sf_s3 *s3;
    struct sf_object_info info; /* url points at url_copy; key unused (NULL) */
    char *url_copy;
    char endpoint[512], bucket[256], key[1100];
    struct sf__cache_id id;
    enum obj_state state;
    enum sf_cache_source source;
    int want_data; /* map the bytes for the caller (warm does not) */
    int verify;    /* hash disk entries before use */
    int looked_up;
    /* Data: a mapping of the entry or the download, or a RAM tier entry. */
    const unsigned char *data;
    size_t map_len; /* our own mapping, 0 when none */
    struct sf__ram_entry *ram;
    int fd; /* the file mapped or followed */
    uint64_t contiguous;
    struct sf__dc_writer *w;
    struct sf_fetch *f;
    int priority;        /* sf_cache_object_set_priority() */
    uint64_t fetch_base; /* object offset the fetch starts at (resume point) */
    double last_progress;
    int peer_wait_counted;
    int stale_published; /* looked again after a "published" record under a live lock */
    sf_status status;
    char errmsg[1024];
};

/* Makes an object for obj; want_data maps its bytes for the caller (warm does
 * not), verify hashes disk entries before use. */
sf_status sf__cache_obj_new(struct sf_cache *c, struct sf_s3 *s3, const struct sf_object_info *obj,
                            int want_data, int verify, struct sf_cache_object **out);
/* First step of the state machine: look in the tiers. */
sf_status sf__cache_step_lookup(struct sf_cache_object *o);
/* Advances o until want bytes are there, it is done, or timeout_ms passes. */
sf_status sf__cache_drive(struct sf_cache_object *o, uint64_t want, int timeout_ms);

#endif
