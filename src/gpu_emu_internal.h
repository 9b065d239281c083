/* What the emulated device's files share (gpu_emu.c: the device, its
 * streams, events and operation table; gpu_emu_mem.c: device memory;
 * gpu_emu_kernel.c: the normalise kernel and its write checks;
 * gpu_emu_config.c: the options and SF_GPU_EMULATOR). Internal to them. */
#ifndef SF_GPU_EMU_INTERNAL_H
#define SF_GPU_EMU_INTERNAL_H

#include "src/gpu_dev.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum {
    EMU_OK = 0,
    EMU_NOT_READY = 1,
    EMU_NO_MEMORY = 2,
    EMU_INVALID_VALUE = 3,
    EMU_INVALID_HANDLE = 4,
    EMU_ILLEGAL_ADDRESS = 5, /* sticky */
    EMU_INJECTED = 6,
    EMU_KERNEL_CHECK = 7, /* sticky */
    EMU_INVALID_DEVICE = 8,
};

enum op_kind { OP_COPY, OP_KERNEL, OP_RECORD, OP_WAIT, OP_FN };

struct emu_stream;

struct emu_event {
    /* Stream of the last record (NULL: never recorded) and its sequence
     * number there: written under e->mu, read by the stream's worker. */
    _Atomic(struct emu_stream *) s;
    _Atomic uint64_t seq;
    int timing;
    int dead; /* destroyed by the user; freed with the device */
    /* Written by the worker that runs the record: when, and which record. */
    _Atomic uint64_t t_ns, t_seq;
    struct emu_event *next;
};

struct emu_op {
    enum op_kind kind;
    uint64_t seq;
    int fail; /* injected: fails when it runs (sticky) */
    unsigned long op_number;
    /* OP_COPY */
    void *dst;
    const void *src;
    size_t bytes;
    int to_device;
    /* OP_KERNEL */
    struct sf__norm_launch launch;
    /* OP_RECORD */
    struct emu_event *ev;
    /* OP_WAIT */
    struct emu_stream *ws;
    uint64_t wseq;
    /* OP_FN */
    void (*fn)(void *);
    void *arg;
    struct emu_op *next;
};

/* Synchronisation as a GPU gives it, and no more, so that ThreadSanitizer
 * reports a host buffer touched before the wait for the copy that reads it:
 * the worker takes only its queue's lock (qmu: what the host queued before,
 * happens before) and device memory's (amu: the host touches it only at
 * alloc and free). It publishes completion with a release store and a futex
 * wake; waiters acquire it. It never takes a lock the host releases while
 * it waits (the device's mu), which would order the host's later accesses
 * before the copy. */
struct emu_stream {
    struct sf__emu *e;
    pthread_t th;
    int started;
    int dead; /* under e->mu */
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    int stop;                   /* under qmu */
    struct emu_op *head, *tail; /* under qmu */
    uint64_t enqueued;          /* under qmu and e->mu (written with both held) */
    _Atomic uint64_t completed; /* release by the worker, acquire by waiters */
    uint64_t rng;               /* worker thread only */
    struct emu_stream *next;
};

struct emu_alloc {
    unsigned char *dev;    /* PROT_NONE: what the host is given */
    unsigned char *shadow; /* the same pages, readable and writable */
    size_t bytes, map_bytes;
    struct emu_alloc *next;
};

struct sf__emu {
    struct sf__emu_options o;
    pthread_mutex_t amu; /* device memory */
    struct emu_alloc *allocs;
    uint64_t mem_used;
    pthread_mutex_t mu;
    /* under mu */
    struct emu_stream *streams;
    struct emu_event *events;
    unsigned long ops;
    unsigned n_streams;
    _Atomic int sticky;   /* written under mu; workers read it without */
    _Atomic uint32_t gen; /* futex word: bumped on every completion */
    char msg[256]; /* detail of the last error (the sticky one once set) */
};

/* Under e->mu: the error detail, and the code. */
int sf__emu_fail_locked(struct sf__emu *e, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Counts an operation call; returns non-zero when it is the one to fail
 * now, and sets *async when it should fail when it runs instead. */
int sf__emu_count_op(struct sf__emu *e, int queued, int *async, unsigned long *number);

/* Under e->amu: the shadow address of [p, p + bytes) in one allocation. */
unsigned char *sf__emu_shadow_of(struct sf__emu *e, const void *p, size_t bytes);

/* Runs one launch; 0 or a sticky error (under no lock: the worker owns the
 * buffers while the op runs). */
int sf__emu_run_kernel(struct sf__emu *e, const struct sf__norm_launch *l);

/* Host and device memory entries of the operation table (gpu_emu_mem.c). */
int sf__emu_host_alloc(void *ctx, void **p, size_t bytes);
int sf__emu_host_free(void *ctx, void *p);
int sf__emu_dev_alloc(void *ctx, void **p, size_t bytes);
int sf__emu_dev_free(void *ctx, void *p);

#endif /* SF_GPU_EMU_INTERNAL_H */
