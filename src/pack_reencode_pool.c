/*
 * pack --max-side: the pool of threads that re-encodes the JPEG fields of
 * the samples a few ahead of the shard writer (the re-encoding itself is
 * src/pack_reencode.c).
 */
#include "src/pack_internal.h"

#include "src/pack_reencode.h"
#include "common/file.h"
#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Samples re-encoded ahead of the writer per thread: bounds the memory held. */
#define REENCODE_AHEAD 4

static int is_jpeg_field(const struct entry *e)
{
    const char *f = sf__pack_field_of(e);
    return !strcasecmp(f, "jpg") || !strcasecmp(f, "jpeg");
}

/* Reads a whole file (it must still have its scanned size). */
static sf_status slurp(const char *src, const struct entry *e, unsigned char **out, char *err,
                       size_t len)
{
    char *abs = sf__pack_path_join(src, e->rel);
    if (!abs)
        return SF_ERR_NO_MEMORY;
    sf_status st = SF_OK;
    unsigned char *buf = NULL;
    struct stat sb;
    int fd = sf__open_stat(abs, &sb);
    if (fd < 0) {
        int er = errno;
        snprintf(err, len, "%s: cannot read: %s", abs, strerror(er));
        st = sf__pack_errno_status(er);
    } else if ((uint64_t)sb.st_size != e->size) {
        snprintf(err, len, "%s: changed while packing (%" PRIu64 " bytes when scanned, %lld now)",
                 abs, e->size, (long long)sb.st_size);
        st = SF_ERR_CHANGED;
    } else if (!(buf = malloc(e->size ? (size_t)e->size : 1))) {
        st = SF_ERR_NO_MEMORY;
        snprintf(err, len, "%s: no memory for %" PRIu64 " bytes", abs, e->size);
    } else {
        size_t got;
        int rc = sf__read_full(fd, buf, (size_t)e->size, &got);
        if (rc) {
            snprintf(err, len, "%s: read at offset %zu: %s", abs, got,
                     rc < 0 ? strerror(errno) : "the file shrank");
            st = rc < 0 ? SF_ERR_IO : SF_ERR_CHANGED;
        }
    }
    if (fd >= 0)
        close(fd);
    if (st != SF_OK) {
        free(buf);
        buf = NULL;
    }
    free(abs);
    *out = buf;
    return st;
}

/* Re-encodes the JPEG fields of sample i. */
static sf_status reencode_sample(struct reencoder *q, size_t i, char *err, size_t len,
                                 unsigned long long counts[3])
{
    struct packer *p = q->p;
    const struct sample *smp = &p->samples[i];
    for (size_t a = smp->first; a < smp->first + smp->n; a++) {
        struct entry *e = &p->entries[a];
        if (!is_jpeg_field(e))
            continue;
        unsigned char *src = NULL, *out = NULL;
        size_t out_n = 0;
        char why[512] = "";
        sf_status st = slurp(p->src, e, &src, err, len);
        if (st != SF_OK)
            return st;
        st = sf__reencode_jpeg(&q->r, src, (size_t)e->size, &out, &out_n, why, sizeof(why));
        free(src);
        if (st != SF_OK) {
            snprintf(err, len, "%s/%s: cannot re-encode (--max-side %u): %s", p->src, e->rel,
                     q->r.max_side, why);
            return st;
        }
        if (out) {
            e->re = out;
            e->re_size = out_n;
            counts[0]++;
            counts[1] += e->size;
            counts[2] += out_n;
        }
    }
    return SF_OK;
}

static void *reencode_main(void *arg)
{
    struct reencoder *q = arg;
    char err[1024];
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->quit && q->st == SF_OK && q->next >= q->limit)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->quit || q->st != SF_OK)
            break;
        size_t i = q->next++;
        pthread_mutex_unlock(&q->mu);
        unsigned long long counts[3] = {0, 0, 0};
        err[0] = '\0';
        sf_status st = reencode_sample(q, i, err, sizeof(err), counts);
        pthread_mutex_lock(&q->mu);
        if (st != SF_OK && q->st == SF_OK) {
            q->st = st;
            snprintf(q->err, sizeof(q->err), "%s", err[0] ? err : sf_status_str(st));
        }
        q->images += counts[0];
        q->source_bytes += counts[1];
        q->bytes += counts[2];
        q->done[i] = 1;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

sf_status sf__pack_reencoder_start(struct packer *p)
{
    struct reencoder *q = calloc(1, sizeof(*q));
    if (!q)
        return SF_ERR_NO_MEMORY;
    p->re = q;
    q->p = p;
    q->r.max_side = p->o->max_side;
    q->r.quality = p->o->jpeg_quality ? p->o->jpeg_quality : DEFAULT_QUALITY;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    q->n_threads = p->o->threads ? p->o->threads : cores > 0 ? (unsigned)cores : 1;
    if (q->n_threads > SF_PACK_THREADS_MAX)
        q->n_threads = SF_PACK_THREADS_MAX;
    q->done = calloc(p->n_samples ? p->n_samples : 1, 1);
    q->threads = calloc(q->n_threads, sizeof(*q->threads));
    if (!q->done || !q->threads)
        return SF_ERR_NO_MEMORY;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    for (unsigned t = 0; t < q->n_threads; t++) {
        if (pthread_create(&q->threads[t], NULL, reencode_main, q) != 0)
            return sf__pack_fail(p, SF_ERR_INTERNAL, "pack: cannot start a re-encoding thread");
        q->started++;
    }
    return SF_OK;
}

/* Waits until sample i is re-encoded, letting the pool run ahead of it. */
sf_status sf__pack_reencoder_wait(struct packer *p, size_t i)
{
    struct reencoder *q = p->re;
    pthread_mutex_lock(&q->mu);
    size_t ahead = (size_t)REENCODE_AHEAD * q->n_threads;
    q->limit = i + ahead < p->n_samples ? i + ahead : p->n_samples;
    pthread_cond_broadcast(&q->cv);
    while (!q->done[i] && q->st == SF_OK)
        pthread_cond_wait(&q->cv, &q->mu);
    sf_status st = q->st;
    pthread_mutex_unlock(&q->mu);
    if (st != SF_OK)
        return sf__pack_fail(p, st, "%s", q->err);
    return SF_OK;
}

void sf__pack_reencoder_stop(struct packer *p)
{
    struct reencoder *q = p->re;
    if (!q)
        return;
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->quit = 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        for (unsigned t = 0; t < q->started; t++)
            pthread_join(q->threads[t], NULL);
    }
    if (q->threads) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
    }
    free(q->threads);
    free(q->done);
    free(q);
    p->re = NULL;
}

void sf__pack_free_reencoded(struct packer *p, const struct sample *smp)
{
    for (size_t a = smp->first; a < smp->first + smp->n; a++) {
        free(p->entries[a].re);
        p->entries[a].re = NULL;
    }
}
