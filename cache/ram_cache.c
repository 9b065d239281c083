/* RAM tier: byte-bounded, reference-counted LRU of shard buffers. */
#include "cache/ram_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct sf__ram_entry {
    char *key;
    void *data;
    size_t size;
    sf__ram_release_fn release;
    void *user;
    uint64_t refs;
    int doomed; /* removed from the index; freed on last release */
    /* LRU of unused entries only (refs == 0): head = least recently used. */
    struct sf__ram_entry *lru_prev, *lru_next;
    struct sf__ram_entry *hash_next;
};

struct sf__ram_cache {
    pthread_mutex_t mu;
    /* Everything below is under mu. */
    struct sf__ram_entry **buckets;
    size_t n_buckets;
    struct sf__ram_entry *lru_head, *lru_tail;
    struct sf__ram_stats st;
};

static uint64_t hash_key(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

sf_status sf__ram_cache_new(uint64_t limit_bytes, struct sf__ram_cache **out)
{
    *out = NULL;
    struct sf__ram_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return SF_ERR_NO_MEMORY;
    c->n_buckets = 1024;
    c->buckets = calloc(c->n_buckets, sizeof(*c->buckets));
    if (!c->buckets) {
        free(c);
        return SF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->st.limit_bytes = limit_bytes;
    *out = c;
    return SF_OK;
}

static void entry_free(struct sf__ram_entry *e)
{
    if (e->release)
        e->release(e->user, e->data, e->size);
    free(e->key);
    free(e);
}

static void lru_unlink(struct sf__ram_cache *c, struct sf__ram_entry *e)
{
    if (e->lru_prev)
        e->lru_prev->lru_next = e->lru_next;
    else if (c->lru_head == e)
        c->lru_head = e->lru_next;
    if (e->lru_next)
        e->lru_next->lru_prev = e->lru_prev;
    else if (c->lru_tail == e)
        c->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

static void lru_push_tail(struct sf__ram_cache *c, struct sf__ram_entry *e)
{
    e->lru_prev = c->lru_tail;
    e->lru_next = NULL;
    if (c->lru_tail)
        c->lru_tail->lru_next = e;
    else
        c->lru_head = e;
    c->lru_tail = e;
}

static struct sf__ram_entry **find_slot(struct sf__ram_cache *c, const char *key)
{
    struct sf__ram_entry **p = &c->buckets[hash_key(key) % c->n_buckets];
    while (*p && strcmp((*p)->key, key) != 0)
        p = &(*p)->hash_next;
    return p;
}

/* Takes e out of the index and the LRU; the caller frees it (outside mu). */
static void unindex(struct sf__ram_cache *c, struct sf__ram_entry *e)
{
    struct sf__ram_entry **p = find_slot(c, e->key);
    if (*p == e)
        *p = e->hash_next;
    e->hash_next = NULL;
    if (e->refs == 0)
        lru_unlink(c, e);
    c->st.entries--;
}

void sf__ram_cache_destroy(struct sf__ram_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_buckets; i++) {
        struct sf__ram_entry *e = c->buckets[i];
        while (e) {
            struct sf__ram_entry *next = e->hash_next;
            entry_free(e);
            e = next;
        }
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

struct sf__ram_entry *sf__ram_cache_get(struct sf__ram_cache *c, const char *key)
{
    pthread_mutex_lock(&c->mu);
    struct sf__ram_entry *e = *find_slot(c, key);
    if (e) {
        if (e->refs++ == 0) {
            lru_unlink(c, e);
            c->st.bytes_in_use += e->size;
        }
        c->st.hits++;
    } else {
        c->st.misses++;
    }
    pthread_mutex_unlock(&c->mu);
    return e;
}

sf_status sf__ram_cache_insert(struct sf__ram_cache *c, const char *key, void *data, size_t size,
                               sf__ram_release_fn release, void *user, struct sf__ram_entry **out)
{
    *out = NULL;
    struct sf__ram_entry *e = calloc(1, sizeof(*e));
    char *k = strdup(key);
    if (!e || !k) {
        free(e);
        free(k);
        return SF_ERR_NO_MEMORY;
    }
    e->key = k;
    e->data = data;
    e->size = size;
    e->release = release;
    e->user = user;
    e->refs = 1;

    struct sf__ram_entry *victims = NULL;
    pthread_mutex_lock(&c->mu);
    struct sf__ram_entry **slot = find_slot(c, key);
    if (*slot) {
        struct sf__ram_entry *old = *slot;
        if (old->refs++ == 0) {
            lru_unlink(c, old);
            c->st.bytes_in_use += old->size;
        }
        c->st.hits++;
        pthread_mutex_unlock(&c->mu);
        entry_free(e); /* releases the caller's duplicate buffer */
        *out = old;
        return SF_OK;
    }
    /* Room: evict unused entries from the LRU head, but only if that suffices. */
    uint64_t evictable = c->st.bytes - c->st.bytes_in_use;
    if (size > c->st.limit_bytes || c->st.bytes - evictable + size > c->st.limit_bytes) {
        c->st.refused++;
        pthread_mutex_unlock(&c->mu);
        e->release = NULL; /* the buffer stays the caller's */
        entry_free(e);
        return SF_ERR_LIMIT;
    }
    while (c->st.bytes + size > c->st.limit_bytes && c->lru_head) {
        struct sf__ram_entry *v = c->lru_head;
        unindex(c, v);
        c->st.bytes -= v->size;
        c->st.evictions++;
        c->st.evicted_bytes += v->size;
        v->hash_next = victims;
        victims = v;
    }
    slot = find_slot(c, key); /* unindex may have changed the chain */
    *slot = e;
    c->st.entries++;
    c->st.bytes += size;
    c->st.bytes_in_use += size;
    c->st.insertions++;
    pthread_mutex_unlock(&c->mu);
    while (victims) {
        struct sf__ram_entry *next = victims->hash_next;
        entry_free(victims);
        victims = next;
    }
    *out = e;
    return SF_OK;
}

void sf__ram_cache_release(struct sf__ram_cache *c, struct sf__ram_entry *e)
{
    if (!e)
        return;
    int free_it = 0;
    pthread_mutex_lock(&c->mu);
    if (--e->refs == 0) {
        c->st.bytes_in_use -= e->size;
        if (e->doomed) {
            c->st.bytes -= e->size;
            free_it = 1;
        } else {
            lru_push_tail(c, e);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (free_it)
        entry_free(e);
}

int sf__ram_cache_remove(struct sf__ram_cache *c, const char *key)
{
    pthread_mutex_lock(&c->mu);
    struct sf__ram_entry *e = *find_slot(c, key);
    int freed = 0;
    if (e) {
        unindex(c, e);
        if (e->refs == 0) {
            c->st.bytes -= e->size;
            freed = 1;
        } else {
            e->doomed = 1;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (freed)
        entry_free(e);
    return freed;
}

const void *sf__ram_entry_data(const struct sf__ram_entry *e)
{
    return e->data;
}

size_t sf__ram_entry_size(const struct sf__ram_entry *e)
{
    return e->size;
}

void sf__ram_cache_stats(struct sf__ram_cache *c, struct sf__ram_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
