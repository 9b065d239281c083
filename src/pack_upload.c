/*
 * pack to s3://: a second thread uploads one staged shard at a time
 * (sf_s3_upload_file) while the next is written.
 */
#include "src/pack_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *upload_main(void *arg)
{
    struct uploader *u = arg;
    pthread_mutex_lock(&u->lock);
    for (;;) {
        while (!u->path && !u->quit)
            pthread_cond_wait(&u->cond, &u->lock);
        if (!u->path)
            break;
        char *path = u->path, *url = u->url;
        pthread_mutex_unlock(&u->lock);
        char etag[128];
        sf_status st = sf_s3_upload_file(u->s3, url, path, &u->upload, etag, sizeof(etag));
        char msg[1024] = "";
        if (st != SF_OK)
            sf_s3_errmsg(u->s3, msg, sizeof(msg));
        unlink(path);
        pthread_mutex_lock(&u->lock);
        if (st != SF_OK && u->status == SF_OK) {
            u->status = st;
            snprintf(u->err, sizeof(u->err), "%s", msg[0] ? msg : sf_status_str(st));
        }
        if (st == SF_OK)
            u->done++;
        free(u->path);
        free(u->url);
        u->path = u->url = NULL;
        pthread_cond_broadcast(&u->cond);
    }
    pthread_mutex_unlock(&u->lock);
    return NULL;
}

sf_status sf__pack_uploader_start(struct packer *p)
{
    struct uploader *u = &p->up;
    u->s3 = p->o->s3;
    sf_s3_upload_options_init_default(&u->upload);
    if (p->o->part_bytes)
        u->upload.part_bytes = p->o->part_bytes;
    pthread_mutex_init(&u->lock, NULL);
    pthread_cond_init(&u->cond, NULL);
    if (pthread_create(&u->thread, NULL, upload_main, u) != 0) {
        pthread_cond_destroy(&u->cond);
        pthread_mutex_destroy(&u->lock);
        return sf__pack_fail(p, SF_ERR_NO_MEMORY, "cannot start the upload thread");
    }
    u->started = 1;
    return SF_OK;
}

/* Waits until the uploader is idle; returns its first failure. */
static sf_status uploader_wait(struct packer *p)
{
    struct uploader *u = &p->up;
    pthread_mutex_lock(&u->lock);
    while (u->path)
        pthread_cond_wait(&u->cond, &u->lock);
    sf_status st = u->status;
    if (st != SF_OK)
        sf__pack_fail(p, st, "%s", u->err);
    pthread_mutex_unlock(&u->lock);
    return st;
}

/* Hands path (taken) over for upload to url (taken) once the previous one is done. */
sf_status sf__pack_uploader_submit(struct packer *p, char *path, char *url)
{
    sf_status st = uploader_wait(p);
    if (st != SF_OK) {
        unlink(path);
        free(path);
        free(url);
        return st;
    }
    struct uploader *u = &p->up;
    pthread_mutex_lock(&u->lock);
    u->path = path;
    u->url = url;
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->lock);
    return SF_OK;
}

void sf__pack_uploader_stop(struct packer *p)
{
    struct uploader *u = &p->up;
    if (!u->started)
        return;
    pthread_mutex_lock(&u->lock);
    while (u->path)
        pthread_cond_wait(&u->cond, &u->lock);
    u->quit = 1;
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->lock);
    pthread_join(u->thread, NULL);
    pthread_cond_destroy(&u->cond);
    pthread_mutex_destroy(&u->lock);
    u->started = 0;
}
