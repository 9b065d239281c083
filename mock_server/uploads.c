#include "mock_server/uploads.h"

#include "s3/sigv4.h"
#include "common/grow.h"

#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct upload {
    char id[MOCK_UPLOAD_ID_LEN + 1];
    char *bucket;
    char *key;
    time_t initiated;
    unsigned long long seq; /* creation order, for listings */
    int completing;
    struct mock_part *parts; /* sorted by number */
    size_t n_parts, cap_parts;
};

struct mock_uploads {
    pthread_mutex_t lock; /* guards everything below */
    struct upload **uploads;
    size_t n, cap;
    size_t parts_total;
    unsigned long long seq;
};

sf_status mock_uploads_new(struct mock_uploads **out)
{
    struct mock_uploads *u = calloc(1, sizeof(*u));
    if (!u)
        return SF_ERR_NO_MEMORY;
    pthread_mutex_init(&u->lock, NULL);
    *out = u;
    return SF_OK;
}

static void upload_free(struct upload *up, int unlink_parts)
{
    for (size_t i = 0; i < up->n_parts; i++) {
        if (unlink_parts)
            unlink(up->parts[i].path);
        free(up->parts[i].path);
    }
    free(up->parts);
    free(up->bucket);
    free(up->key);
    free(up);
}

void mock_uploads_destroy(struct mock_uploads *u)
{
    if (!u)
        return;
    for (size_t i = 0; i < u->n; i++)
        upload_free(u->uploads[i], 1);
    free(u->uploads);
    pthread_mutex_destroy(&u->lock);
    free(u);
}

/* The upload id of bucket/key, or NULL. Under the lock. */
static struct upload *find(struct mock_uploads *u, const char *bucket, const char *key,
                           const char *id, size_t *index)
{
    for (size_t i = 0; i < u->n; i++) {
        struct upload *up = u->uploads[i];
        if (strcmp(up->id, id) == 0) {
            if (strcmp(up->bucket, bucket) != 0 || strcmp(up->key, key) != 0)
                return NULL;
            if (index)
                *index = i;
            return up;
        }
    }
    return NULL;
}

static void remove_at(struct mock_uploads *u, size_t i)
{
    u->parts_total -= u->uploads[i]->n_parts;
    u->uploads[i] = u->uploads[--u->n];
}

sf_status mock_uploads_create(struct mock_uploads *u, const char *bucket, const char *key,
                              char id[MOCK_UPLOAD_ID_LEN + 1])
{
    unsigned char raw[12];
    if (RAND_bytes(raw, (int)sizeof(raw)) != 1)
        return SF_ERR_INTERNAL;
    struct upload *up = calloc(1, sizeof(*up));
    if (!up)
        return SF_ERR_NO_MEMORY;
    up->bucket = strdup(bucket);
    up->key = strdup(key);
    up->initiated = time(NULL);
    if (!up->bucket || !up->key) {
        upload_free(up, 0);
        return SF_ERR_NO_MEMORY;
    }
    char hex[2 * sizeof(raw) + 1];
    sf__hex_encode(raw, sizeof(raw), hex);
    pthread_mutex_lock(&u->lock);
    if (u->n == MOCK_MAX_UPLOADS) {
        pthread_mutex_unlock(&u->lock);
        upload_free(up, 0);
        return SF_ERR_LIMIT;
    }
    struct upload **v = sf__grow(u->uploads, u->n, &u->cap, sizeof(*v), 16);
    if (!v) {
        pthread_mutex_unlock(&u->lock);
        upload_free(up, 0);
        return SF_ERR_NO_MEMORY;
    }
    u->uploads = v;
    up->seq = ++u->seq;
    /* The sequence number first: ids are unique whatever the random bytes,
     * and sort in creation order (ListMultipartUploads). */
    snprintf(up->id, sizeof(up->id), "%08llx%s", up->seq, hex);
    u->uploads[u->n++] = up;
    pthread_mutex_unlock(&u->lock);
    memcpy(id, up->id, sizeof(up->id));
    return SF_OK;
}

sf_status mock_uploads_check(struct mock_uploads *u, const char *bucket, const char *key,
                             const char *id)
{
    pthread_mutex_lock(&u->lock);
    struct upload *up = find(u, bucket, key, id, NULL);
    sf_status st = up && !up->completing ? SF_OK : SF_ERR_NOT_FOUND;
    pthread_mutex_unlock(&u->lock);
    return st;
}

sf_status mock_uploads_add_part(struct mock_uploads *u, const char *bucket, const char *key,
                                const char *id, const struct mock_part *p)
{
    pthread_mutex_lock(&u->lock);
    struct upload *up = find(u, bucket, key, id, NULL);
    if (!up || up->completing) {
        pthread_mutex_unlock(&u->lock);
        return SF_ERR_NOT_FOUND;
    }
    size_t i = 0;
    while (i < up->n_parts && up->parts[i].number < p->number)
        i++;
    if (i < up->n_parts && up->parts[i].number == p->number) {
        unlink(up->parts[i].path);
        free(up->parts[i].path);
        up->parts[i] = *p;
        pthread_mutex_unlock(&u->lock);
        return SF_OK;
    }
    if (u->parts_total >= MOCK_MAX_PARTS_TOTAL) {
        pthread_mutex_unlock(&u->lock);
        return SF_ERR_LIMIT;
    }
    struct mock_part *v = sf__grow(up->parts, up->n_parts, &up->cap_parts, sizeof(*v), 16);
    if (!v) {
        pthread_mutex_unlock(&u->lock);
        return SF_ERR_NO_MEMORY;
    }
    up->parts = v;
    memmove(up->parts + i + 1, up->parts + i, (up->n_parts - i) * sizeof(*up->parts));
    up->parts[i] = *p;
    up->n_parts++;
    u->parts_total++;
    pthread_mutex_unlock(&u->lock);
    return SF_OK;
}

sf_status mock_uploads_abort(struct mock_uploads *u, const char *bucket, const char *key,
                             const char *id)
{
    pthread_mutex_lock(&u->lock);
    size_t i;
    struct upload *up = find(u, bucket, key, id, &i);
    if (!up || up->completing) {
        pthread_mutex_unlock(&u->lock);
        return SF_ERR_NOT_FOUND;
    }
    remove_at(u, i);
    pthread_mutex_unlock(&u->lock);
    upload_free(up, 1);
    return SF_OK;
}

void mock_parts_free(struct mock_part *parts, size_t n)
{
    for (size_t i = 0; parts && i < n; i++)
        free(parts[i].path);
    free(parts);
}

sf_status mock_uploads_parts(struct mock_uploads *u, const char *bucket, const char *key,
                             const char *id, int completing, struct mock_part **parts, size_t *n)
{
    *parts = NULL;
    *n = 0;
    pthread_mutex_lock(&u->lock);
    struct upload *up = find(u, bucket, key, id, NULL);
    if (!up || up->completing) {
        pthread_mutex_unlock(&u->lock);
        return SF_ERR_NOT_FOUND;
    }
    struct mock_part *copy = calloc(up->n_parts ? up->n_parts : 1, sizeof(*copy));
    sf_status st = copy ? SF_OK : SF_ERR_NO_MEMORY;
    for (size_t i = 0; st == SF_OK && i < up->n_parts; i++) {
        copy[i] = up->parts[i];
        copy[i].path = strdup(up->parts[i].path);
        if (!copy[i].path)
            st = SF_ERR_NO_MEMORY;
    }
    if (st == SF_OK && completing)
        up->completing = 1;
    size_t count = up->n_parts;
    pthread_mutex_unlock(&u->lock);
    if (st != SF_OK) {
        mock_parts_free(copy, count);
        return st;
    }
    *parts = copy;
    *n = count;
    return SF_OK;
}

void mock_uploads_end_complete(struct mock_uploads *u, const char *id, int done)
{
    pthread_mutex_lock(&u->lock);
    struct upload *up = NULL;
    size_t i;
    for (i = 0; i < u->n; i++) {
        if (strcmp(u->uploads[i]->id, id) == 0) {
            up = u->uploads[i];
            break;
        }
    }
    if (up) {
        up->completing = 0;
        if (done)
            remove_at(u, i);
    }
    pthread_mutex_unlock(&u->lock);
    if (up && done)
        upload_free(up, 1);
}

static int info_cmp(const void *a, const void *b)
{
    const struct mock_upload_info *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    return strcmp(x->id, y->id) < 0 ? -1 : 1;
}

void mock_upload_infos_free(struct mock_upload_info *infos, size_t n)
{
    for (size_t i = 0; infos && i < n; i++)
        free(infos[i].key);
    free(infos);
}

sf_status mock_uploads_list(struct mock_uploads *u, const char *bucket, const char *prefix,
                            struct mock_upload_info **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t plen = strlen(prefix);
    pthread_mutex_lock(&u->lock);
    struct mock_upload_info *v = calloc(u->n ? u->n : 1, sizeof(*v));
    size_t count = 0;
    sf_status st = v ? SF_OK : SF_ERR_NO_MEMORY;
    for (size_t i = 0; st == SF_OK && i < u->n; i++) {
        const struct upload *up = u->uploads[i];
        if (strcmp(up->bucket, bucket) != 0 || strncmp(up->key, prefix, plen) != 0)
            continue;
        v[count].key = strdup(up->key);
        snprintf(v[count].id, sizeof(v[count].id), "%s", up->id);
        v[count].initiated = up->initiated;
        if (!v[count].key)
            st = SF_ERR_NO_MEMORY;
        count++;
    }
    pthread_mutex_unlock(&u->lock);
    if (st != SF_OK) {
        mock_upload_infos_free(v, count);
        return st;
    }
    if (count > 1)
        qsort(v, count, sizeof(*v), info_cmp);
    *out = v;
    *n = count;
    return SF_OK;
}
