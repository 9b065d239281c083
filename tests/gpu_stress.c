/* The GPU ring as the loader and a consumer use it, for the ThreadSanitizer
 * build (Criterion's runner does not start under TSan): a producer thread
 * fills host slots, submits and waits for each copy; a consumer thread makes
 * its stream wait for each batch, reads the batch on that stream (u8 and the
 * normalised floats, bit for bit against the host normalisation) and
 * releases the slot with sf__gpu_release_after. Random delays on the
 * emulated device vary the interleavings. Exit 0 when every batch read
 * right and TSan stayed silent (ctest fails on any TSan report). */
#include "src/decode.h"
#include "src/gpu.h"
#include "src/gpu_dev.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS   3
#define BATCHES 60
#define W       7
#define H       5
#define N_IMG   3
#define BYTES   (N_IMG * W * H * 3)

static const float mean[3] = {0.485f, 0.456f, 0.406f};
static const float stdv[3] = {0.229f, 0.224f, 0.225f};

struct check {
    struct sf__emu *emu;
    const void *u8, *f32;
    unsigned char want[BYTES];
    _Atomic int *bad;
};

struct shared {
    struct sf_gpu *g;
    unsigned char host[SLOTS][BYTES];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready[BATCHES]; /* under mu: copied */
    int freed[BATCHES]; /* under mu: released by the consumer */
    struct check checks[BATCHES];
    _Atomic int bad;
    int failed;
};

static void fill(unsigned char *p, int batch)
{
    for (int i = 0; i < BYTES; i++)
        p[i] = (unsigned char)(batch * 31 + i * 7);
}

static void check_on_stream(void *arg)
{
    struct check *c = arg;
    unsigned char got[BYTES];
    float f[BYTES], want[BYTES];
    if (sf__emu_peek(c->emu, got, c->u8, sizeof got) != 0 || memcmp(got, c->want, BYTES) != 0) {
        atomic_fetch_add(c->bad, 1);
        return;
    }
    sf__normalize_u8(c->want, want, N_IMG, W, H, SF_LAYOUT_HWC, mean, stdv);
    if (sf__emu_peek(c->emu, f, c->f32, sizeof f) != 0 || memcmp(f, want, sizeof f) != 0)
        atomic_fetch_add(c->bad, 1);
}

static void *producer(void *arg)
{
    struct shared *x = arg;
    char err[256];
    for (int b = 0; b < BATCHES; b++) {
        unsigned slot = (unsigned)b % SLOTS;
        pthread_mutex_lock(&x->mu);
        while (b >= SLOTS && !x->freed[b - SLOTS])
            pthread_cond_wait(&x->cv, &x->mu);
        pthread_mutex_unlock(&x->mu);
        fill(x->host[slot], b);
        struct sf__gpu_job job = {.host = x->host[slot],
                                  .bytes = BYTES,
                                  .normalize = 1,
                                  .n_images = N_IMG,
                                  .width = W,
                                  .height = H,
                                  .layout = SF_LAYOUT_HWC};
        memcpy(job.mean, mean, sizeof mean);
        memcpy(job.std, stdv, sizeof stdv);
        if (sf__gpu_submit(x->g, slot, &job, err, sizeof err) != SF_OK ||
            sf__gpu_wait(x->g, slot, NULL, err, sizeof err) != SF_OK) {
            fprintf(stderr, "gpu_stress: batch %d: %s\n", b, err);
            pthread_mutex_lock(&x->mu);
            x->failed = 1;
            pthread_cond_broadcast(&x->cv);
            pthread_mutex_unlock(&x->mu);
            return NULL;
        }
        pthread_mutex_lock(&x->mu);
        x->ready[b] = 1;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    struct shared *x = arg;
    struct sf__emu *emu = sf__gpu_emu(x->g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *stream = NULL;
    if (ops->stream_create(emu, &stream) != 0) {
        x->failed = 1;
        return NULL;
    }
    for (int b = 0; b < BATCHES; b++) {
        unsigned slot = (unsigned)b % SLOTS;
        pthread_mutex_lock(&x->mu);
        while (!x->ready[b] && !x->failed)
            pthread_cond_wait(&x->cv, &x->mu);
        int failed = x->failed;
        pthread_mutex_unlock(&x->mu);
        if (failed)
            break;
        struct check *c = &x->checks[b];
        c->emu = emu;
        c->u8 = sf__gpu_u8(x->g, slot);
        c->f32 = sf__gpu_f32(x->g, slot);
        c->bad = &x->bad;
        fill(c->want, b);
        if (sf__gpu_stream_wait(x->g, sf__gpu_event(x->g, slot), stream) != SF_OK ||
            sf__emu_enqueue_fn(emu, stream, check_on_stream, c) != 0 ||
            sf__gpu_release_after(x->g, slot, stream) != SF_OK) {
            atomic_fetch_add(&x->bad, 1);
        }
        pthread_mutex_lock(&x->mu);
        x->freed[b] = 1;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
    }
    if (ops->stream_sync(emu, stream) != 0)
        atomic_fetch_add(&x->bad, 1);
    ops->stream_destroy(emu, stream);
    return NULL;
}

int main(void)
{
    static struct shared x;
    struct sf__emu_options eo;
    sf__emu_options_default(&eo);
    eo.delay_us = 500;
    struct sf__gpu_config c = {SF__GPU_EMULATED, 0, SLOTS, BYTES, BYTES * sizeof(float), &eo};
    char err[256] = "";
    if (sf__gpu_open(&c, &x.g, err, sizeof err) != SF_OK) {
        fprintf(stderr, "gpu_stress: %s\n", err);
        return 2;
    }
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    pthread_t p, q;
    pthread_create(&p, NULL, producer, &x);
    pthread_create(&q, NULL, consumer, &x);
    pthread_join(p, NULL);
    pthread_join(q, NULL);
    sf__gpu_close(x.g);
    int bad = atomic_load(&x.bad);
    printf("gpu_stress: %d batches, %d wrong%s\n", BATCHES, bad, x.failed ? ", failed" : "");
    return bad || x.failed ? 1 : 0;
}
