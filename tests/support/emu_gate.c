/* Test support: a gated read on an emulated consumer stream (emu_gate.h). */
#include "support/emu_gate.h"

#include "src/gpu_dev.h"

#include <criterion/criterion.h>
#include <time.h>

/* Runs on the emulated stream's thread: no criterion asserts. */
static void gate(void *arg)
{
    struct emu_gated_read *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->open)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static void read_dev(void *arg)
{
    struct emu_gated_read *r = arg;
    r->rc = sf__emu_peek(r->emu, r->got, r->dev, r->bytes);
}

void emu_gated_read_queue(struct emu_gated_read *r, struct sf__emu *emu, void *stream,
                          const void *dev, size_t bytes, unsigned char *got, int open)
{
    r->emu = emu;
    r->dev = dev;
    r->bytes = bytes;
    r->got = got;
    r->rc = -1;
    r->open = open;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    cr_assert_eq(sf__emu_enqueue_fn(emu, stream, gate, r), 0);
    cr_assert_eq(sf__emu_enqueue_fn(emu, stream, read_dev, r), 0);
}

void emu_gated_read_open(struct emu_gated_read *r)
{
    pthread_mutex_lock(&r->mu);
    r->open = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void *emu_gated_read_open_later(void *r)
{
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    emu_gated_read_open(r);
    return NULL;
}

void emu_gated_read_destroy(struct emu_gated_read *r)
{
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
}
