/* Test support: a read of emulated device memory queued on a consumer
 * stream behind a gate the test opens, so that the stream's work waits
 * until the test lets it run. */
#ifndef SF_TEST_EMU_GATE_H
#define SF_TEST_EMU_GATE_H

#include <pthread.h>
#include <stddef.h>

struct sf__emu;

struct emu_gated_read {
    struct sf__emu *emu;
    const void *dev;
    size_t bytes;
    unsigned char *got; /* the caller's, bytes long */
    int rc;             /* sf__emu_peek's; -1 until the read ran */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
};

/* Sets r up to read bytes at dev on emu into got (its gate open at once
 * when open is non-zero) and queues on stream the gate, then the read.
 * Fails the test (cr_assert) when either cannot be queued. */
void emu_gated_read_queue(struct emu_gated_read *r, struct sf__emu *emu, void *stream,
                          const void *dev, size_t bytes, unsigned char *got, int open);
/* Opens r's gate: the read, and what the stream queued after it, runs. */
void emu_gated_read_open(struct emu_gated_read *r);
/* For pthread_create: sleeps 100 ms, then opens the gate of r (an
 * emu_gated_read). */
void *emu_gated_read_open_later(void *r);
/* Frees r's mutex and condition variable (got stays the caller's). */
void emu_gated_read_destroy(struct emu_gated_read *r);

#endif
