/* The GPU ring's suite (test_gpu.c), its tests that need the emulated
 * device's hooks: inaccessible device memory, consumer streams behind a
 * gate, releases on several streams, injected failures, the kernel checks
 * and the emulator's own options. They skip on SF_TEST_GPU_BACKEND=cuda. */
#include <criterion/criterion.h>

#include "gpu_fixture.h"
#include "shardfeed.h"
#include "src/decode.h"
#include "src/gpu.h"
#include "src/gpu_dev.h"
#include "support/emu_gate.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ emulated device only */

static struct sf__emu_options emu_defaults(void)
{
    struct sf__emu_options eo;
    sf__emu_options_default(&eo);
    return eo;
}

/* An emulated ring of slots u8-byte slots (no float32 buffers) whose
 * operations run up to delay_us after they are queued; fails the test when
 * it does not open. */
static struct sf_gpu *open_delayed_ring(unsigned delay_us, unsigned slots, size_t u8)
{
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = delay_us;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_emulated(&eo, slots, u8, 0, &g, err, sizeof err), SF_OK, "%s", err);
    return g;
}

Test(gpu, host_dereference_of_device_memory_crashes)
{
    need_emulator();
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    volatile unsigned char *dev = sf__gpu_u8(g, 0);
    cr_assert(sf__emu_is_device_ptr(sf__gpu_emu(g), (const void *)dev));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not the sanitizer's report: the plain crash */
        signal(SIGBUS, SIG_DFL);
        unsigned char v = dev[17];
        _exit(v == 0 ? 3 : 4); /* reaching here is the failure */
    }
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_expect(WIFSIGNALED(ws) && (WTERMSIG(ws) == SIGSEGV || WTERMSIG(ws) == SIGBUS),
              "a host read of device memory did not crash (status 0x%x)", ws);
    sf__gpu_close(g);
}

/* The copy reads the host buffer when it runs, not when it is queued: a
 * buffer changed before the wait shows in the device copy. */
Test(gpu, copy_reads_the_host_buffer_when_it_runs)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 20000; /* the copy runs 0..20 ms after it is queued */
    eo.seed = 7;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_emulated(&eo, 1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    struct sf__emu *emu = sf__gpu_emu(g);
    void *blocker = NULL;
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    cr_assert_eq(ops->stream_create(emu, &blocker), 0);
    unsigned char host[4096], back[4096];
    memset(host, 1, sizeof host);
    struct sf__gpu_job job = {.host = host, .bytes = sizeof host};
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    memset(host, 2, sizeof host); /* before the copy ran (delay) or while: not after */
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_read(g, 0, 0, back, sizeof back, NULL, 0), SF_OK);
    size_t twos = 0;
    for (size_t i = 0; i < sizeof back; i++)
        twos += back[i] == 2;
    cr_expect_gt(twos, 0u, "the copy took the bytes at submit time, not when it ran");
    cr_assert_eq(ops->stream_destroy(emu, blocker), 0);
    sf__gpu_close(g);
}

/* rc must be the emulator's refusal of a handle, an invalid argument whose
 * text names what was missing. */
static void expect_refused(const struct sf__gpu_ops *ops, struct sf__emu *e, int rc,
                           const char *call, const char *what)
{
    cr_expect_neq(rc, 0, "%s succeeded", call);
    cr_expect_eq(ops->status_of(rc), SF_ERR_INVALID_ARGUMENT, "%s", call);
    char t[256] = "";
    ops->error_text(e, rc, t, sizeof t);
    cr_expect(strstr(t, what), "%s: '%s' does not say '%s'", call, t, what);
}

/* Streams and events that were destroyed, or never existed, are refused by
 * every call that names them (as CUDA's invalid handle), and the refusal is
 * not sticky: the live handles work on. */
Test(gpu, emulator_refuses_destroyed_and_unknown_handles)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 0;
    struct sf__emu *e = NULL;
    cr_assert_eq(sf__emu_new(&eo, &e), 0);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *s = NULL, *v = NULL, *dead_s = NULL, *dead_v = NULL;
    int unknown = 0;
    cr_assert_eq(ops->stream_create(e, &s), 0);
    cr_assert_eq(ops->event_create(e, &v, 0), 0);
    cr_assert_eq(ops->stream_create(e, &dead_s), 0);
    cr_assert_eq(ops->event_create(e, &dead_v, 0), 0);
    cr_assert_eq(ops->stream_destroy(e, dead_s), 0);
    cr_assert_eq(ops->event_destroy(e, dead_v), 0);
    void *streams[] = {dead_s, &unknown}, *events[] = {dead_v, &unknown};
    for (int i = 0; i < 2; i++) {
        expect_refused(ops, e, ops->stream_sync(e, streams[i]), "stream sync", "no stream");
        expect_refused(ops, e, ops->event_record(e, v, streams[i]), "record on", "no stream");
        expect_refused(ops, e, ops->stream_wait_event(e, streams[i], v), "wait on", "no stream");
        expect_refused(ops, e, ops->event_sync(e, events[i]), "event sync", "no event");
        expect_refused(ops, e, ops->event_query(e, events[i]), "event query", "no event");
        expect_refused(ops, e, ops->event_record(e, events[i], s), "record of", "no event");
        expect_refused(ops, e, ops->stream_wait_event(e, s, events[i]), "wait for", "no event");
    }
    cr_expect_eq(ops->event_record(e, v, s), 0, "the live handles work on");
    cr_expect_eq(ops->stream_sync(e, s), 0);
    cr_expect_eq(ops->event_query(e, v), 0, "recorded and synced: done");
    cr_expect_eq(ops->event_destroy(e, v), 0);
    cr_expect_eq(ops->stream_destroy(e, s), 0);
    sf__emu_destroy(e);
}

/* A consumer stream's read of slot 0 (4 KiB) behind a gate the test opens
 * (emu_gated_read_open). */
struct consumer_read {
    struct emu_gated_read r;
    unsigned char got[4096];
};

/* c's stream waits for slot 0's copy and queues a read of it behind c's
 * gate (shut until emu_gated_read_open). */
static void queue_gated_read(struct sf_gpu *g, void *consumer, struct consumer_read *c)
{
    cr_assert_eq(sf__gpu_stream_wait(g, sf__gpu_event(g, 0), consumer), SF_OK);
    emu_gated_read_queue(&c->r, sf__gpu_emu(g), consumer, sf__gpu_u8(g, 0), sizeof c->got, c->got,
                         0);
}

/* Batch a (4 KiB) copied into slot 0 of g; the consumer stream waits for
 * it, queues a read of the slot behind c's gate (shut until
 * emu_gated_read_open) and releases the slot with sf__gpu_release_after. */
static void read_behind_a_gate(struct sf_gpu *g, void *consumer, const unsigned char *a,
                               struct consumer_read *c)
{
    char err[256] = "";
    struct sf__gpu_job job = {.host = a, .bytes = sizeof c->got};
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    queue_gated_read(g, consumer, c);
    cr_assert_eq(sf__gpu_release_after(g, 0, consumer), SF_OK);
}

/*
 * The consumer queues a read of batch A on its stream, releases the slot
 * with sf__gpu_release_after, and the ring copies batch B into the same
 * slot. The consumer's read must see A. With `ignore` (the ring before
 * release events existed), the emulated device shows B overwriting A.
 */
static void reuse_after_release(int ignore)
{
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    sf__gpu_test_ignore_release(g, ignore);
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *consumer = NULL;
    cr_assert_eq(ops->stream_create(emu, &consumer), 0);

    unsigned char a[4096], b[4096];
    memset(a, 0xA1, sizeof a);
    memset(b, 0xB2, sizeof b);
    struct consumer_read c = {0};
    read_behind_a_gate(g, consumer, a, &c);

    struct sf__gpu_job job = {.host = b, .bytes = sizeof b};
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    if (ignore) /* nothing orders B after the read: B lands first */
        cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    else /* B waits for the release: B must not complete while the gate is shut */
        cr_expect_eq(sf__gpu_query(g, 0), 0, "the copy into a released slot did not wait");
    emu_gated_read_open(&c.r);
    cr_assert_eq(ops->stream_sync(emu, consumer), 0);
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(c.r.rc, 0);
    if (ignore)
        cr_expect(memcmp(c.got, b, sizeof b) == 0, "expected the hazard: B overwrote A");
    else
        cr_expect(memcmp(c.got, a, sizeof a) == 0,
                  "the consumer's read of batch A saw other bytes (first byte 0x%02x)", c.got[0]);
    unsigned char back[4096];
    cr_assert_eq(sf__gpu_read(g, 0, 0, back, sizeof back, NULL, 0), SF_OK);
    cr_expect(memcmp(back, b, sizeof b) == 0, "the slot does not hold batch B at the end");
    cr_assert_eq(ops->stream_destroy(emu, consumer), 0);
    emu_gated_read_destroy(&c.r);
    sf__gpu_close(g);
}

Test(gpu, released_slot_is_not_overwritten_while_the_consumer_reads_it)
{
    need_emulator();
    reuse_after_release(0);
}

Test(gpu, emulator_catches_a_slot_reused_without_the_release_event)
{
    need_emulator();
    reuse_after_release(1);
}

/* The last batch is released with sf__gpu_release_after and the ring closes
 * at once (Python: the last tensor freed closes the loader): the consumer's
 * read, still queued behind its gate, must find the slot's buffer alive. */
Test(gpu, close_waits_for_work_the_consumer_queued_before_its_release)
{
    need_emulator();
    struct sf_gpu *g = NULL;
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &g, err, sizeof err), SF_OK, "%s", err);
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *consumer = NULL; /* goes with the ring's device */
    cr_assert_eq(ops->stream_create(emu, &consumer), 0);
    unsigned char a[4096];
    memset(a, 0xA1, sizeof a);
    struct consumer_read c = {0};
    read_behind_a_gate(g, consumer, a, &c);
    pthread_t opener;
    cr_assert_eq(pthread_create(&opener, NULL, emu_gated_read_open_later, &c.r), 0);
    sf__gpu_close(g);
    pthread_join(opener, NULL);
    cr_expect_eq(c.r.rc, 0, "the consumer's read ran after close freed the slot");
    cr_expect(memcmp(c.got, a, sizeof a) == 0, "the consumer's read saw other bytes");
    emu_gated_read_destroy(&c.r);
}

/* A release on a stream the device does not know (destroyed, or never one)
 * is the caller's mistake, reported as such: not SF_ERR_INTERNAL ("a bug:
 * an invariant did not hold"), the status the other calls map it to. */
Test(gpu, release_on_an_unknown_stream_is_an_invalid_argument)
{
    need_emulator();
    struct sf_gpu *g = open_delayed_ring(0, 1, 64);
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *gone = NULL;
    cr_assert_eq(ops->stream_create(emu, &gone), 0);
    cr_assert_eq(ops->stream_destroy(emu, gone), 0);
    int unknown = 0;
    void *const streams[] = {gone, &unknown};
    for (size_t i = 0; i < N_OF(streams); i++) {
        cr_expect_eq(sf__gpu_release_after(g, 0, streams[i]), SF_ERR_INVALID_ARGUMENT, "stream %zu",
                     i);
        cr_expect_eq(sf__gpu_stream_wait(g, sf__gpu_event(g, 0), streams[i]),
                     SF_ERR_INVALID_ARGUMENT, "stream %zu", i);
    }
    /* Refused, it left nothing to wait for: the slot takes a job at once. */
    unsigned char host[64] = {7};
    struct sf__gpu_job job = {.host = host, .bytes = sizeof host};
    char err[256] = "";
    cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_wait(g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    sf__gpu_close(g);
}

/* The per-thread default stream is the releasing thread's: a release event
 * goes on the legacy default stream, which waits for every blocking stream. */
Test(gpu, release_after_the_per_thread_stream_records_on_the_legacy_one)
{
    int x = 0;
    cr_expect_eq(sf__gpu_stream_for_release((void *)2), (void *)1);
    cr_expect_eq(sf__gpu_stream_for_release((void *)1), (void *)1);
    cr_expect_null(sf__gpu_stream_for_release(NULL));
    cr_expect_eq(sf__gpu_stream_for_release(&x), (void *)&x);
}

/* A one-slot emulated ring of 4 KiB whose slot 0 was given batch A (0xA1
 * bytes) with job; b is batch B (0xB2 bytes), for a later copy. */
struct batch_a_ring {
    struct sf_gpu *g;
    struct sf__emu *emu;
    const struct sf__gpu_ops *ops;
    unsigned char a[4096], b[4096];
    struct sf__gpu_job job;
};

static void open_with_batch_a(struct batch_a_ring *r)
{
    char err[256] = "";
    cr_assert_eq(open_ring(1, 4096, 0, &r->g, err, sizeof err), SF_OK, "%s", err);
    r->emu = sf__gpu_emu(r->g);
    r->ops = sf__gpu_emu_ops();
    memset(r->a, 0xA1, sizeof r->a);
    memset(r->b, 0xB2, sizeof r->b);
    r->job = (struct sf__gpu_job){.host = r->a, .bytes = sizeof r->a};
    cr_assert_eq(sf__gpu_submit(r->g, 0, &r->job, err, sizeof err), SF_OK, "%s", err);
}

#define N_READERS 3

/*
 * Batch A in slot 0 is read on three consumer streams, each behind its own
 * gate, and released after all three; batch B is then copied into the slot.
 * The last stream's read is let through at once; the first two must still
 * see A when their gates open: B's copy waits for every stream, not only
 * the last. (Their gates open when B's copy is seen complete, which only
 * the defect allows, or after 100 ms, so a correct ring never waits long.)
 */
Test(gpu, released_slot_waits_for_every_stream_it_was_released_after)
{
    need_emulator();
    static struct batch_a_ring r;
    open_with_batch_a(&r);
    char err[256] = "";
    void *consumer[N_READERS];
    static struct consumer_read c[N_READERS];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N_READERS; i++) {
        cr_assert_eq(r.ops->stream_create(r.emu, &consumer[i]), 0);
        queue_gated_read(r.g, consumer[i], &c[i]);
    }
    cr_assert_eq(sf__gpu_release_after_streams(r.g, 0, consumer, N_READERS), SF_OK);
    r.job.host = r.b;
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    emu_gated_read_open(&c[N_READERS - 1].r);
    cr_assert_eq(r.ops->stream_sync(r.emu, consumer[N_READERS - 1]), 0);
    cr_expect_eq(sf__gpu_query(r.g, 0), 0,
                 "the copy into the slot waited for the last stream only");
    pthread_t opener[N_READERS - 1];
    for (int i = 0; i < N_READERS - 1; i++)
        cr_assert_eq(pthread_create(&opener[i], NULL, emu_gated_read_open_later, &c[i].r), 0);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    for (int i = 0; i < N_READERS - 1; i++)
        emu_gated_read_open(&c[i].r);
    for (int i = 0; i < N_READERS; i++) {
        if (i < N_READERS - 1)
            pthread_join(opener[i], NULL);
        cr_assert_eq(r.ops->stream_sync(r.emu, consumer[i]), 0);
        cr_expect_eq(c[i].r.rc, 0);
        cr_expect(memcmp(c[i].got, r.a, sizeof r.a) == 0,
                  "stream %d's read of batch A saw other bytes (first byte 0x%02x)", i,
                  c[i].got[0]);
        cr_assert_eq(r.ops->stream_destroy(r.emu, consumer[i]), 0);
        emu_gated_read_destroy(&c[i].r);
    }
    sf__gpu_close(r.g);
}

/* Duplicates count once (so the bound holds for distinct streams); more
 * distinct streams than SF_LOADER_RELEASE_STREAMS_MAX are refused with
 * nothing recorded: the next copy does not wait for the shut gate of the
 * first stream (with an event recorded there, the wait would never end). */
Test(gpu, release_after_too_many_streams_is_refused_whole, .timeout = 60)
{
    need_emulator();
    static struct batch_a_ring r;
    open_with_batch_a(&r);
    char err[256] = "";
    enum { N = SF_LOADER_RELEASE_STREAMS_MAX + 1 };
    void *s[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(r.ops->stream_create(r.emu, &s[i]), 0);
    static struct consumer_read c;
    memset(&c, 0, sizeof c);
    queue_gated_read(r.g, s[0], &c);
    cr_expect_eq(sf__gpu_release_after_streams(r.g, 0, s, N), SF_ERR_LIMIT);
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    /* the bound's worth of distinct streams, each twice: accepted, and the
     * next copy waits for the first one's gate */
    void *twice[2 * SF_LOADER_RELEASE_STREAMS_MAX];
    for (int i = 0; i < 2 * SF_LOADER_RELEASE_STREAMS_MAX; i++)
        twice[i] = s[i % SF_LOADER_RELEASE_STREAMS_MAX];
    cr_expect_eq(sf__gpu_release_after_streams(r.g, 0, twice, N_OF(twice)), SF_OK);
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(sf__gpu_query(r.g, 0), 0, "the copy did not wait for the first stream");
    emu_gated_read_open(&c.r);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(r.ops->stream_sync(r.emu, s[i]), 0);
        cr_assert_eq(r.ops->stream_destroy(r.emu, s[i]), 0);
    }
    emu_gated_read_destroy(&c.r);
    sf__gpu_close(r.g);
}

/* A stream the device refuses among good ones: its status comes back, and
 * the copy still waits for the good stream's read. */
Test(gpu, release_after_streams_with_a_refused_one_still_waits_for_the_others)
{
    need_emulator();
    static struct batch_a_ring r;
    open_with_batch_a(&r);
    char err[256] = "";
    void *good = NULL;
    cr_assert_eq(r.ops->stream_create(r.emu, &good), 0);
    static struct consumer_read c;
    memset(&c, 0, sizeof c);
    queue_gated_read(r.g, good, &c);
    int unknown = 0;
    void *const streams[] = {&unknown, good};
    cr_expect_eq(sf__gpu_release_after_streams(r.g, 0, streams, N_OF(streams)),
                 SF_ERR_INVALID_ARGUMENT);
    r.job.host = r.b;
    cr_assert_eq(sf__gpu_submit(r.g, 0, &r.job, err, sizeof err), SF_OK, "%s", err);
    cr_expect_eq(sf__gpu_query(r.g, 0), 0, "the copy did not wait for the good stream");
    emu_gated_read_open(&c.r);
    cr_assert_eq(sf__gpu_wait(r.g, 0, NULL, err, sizeof err), SF_OK, "%s", err);
    cr_assert_eq(r.ops->stream_sync(r.emu, good), 0);
    cr_expect(memcmp(c.got, r.a, sizeof r.a) == 0, "the good stream's read saw other bytes");
    cr_assert_eq(r.ops->stream_destroy(r.emu, good), 0);
    emu_gated_read_destroy(&c.r);
    sf__gpu_close(r.g);
}

/* The consumer's stream waits for the done event: its read sees the copy
 * complete although the copy is slow. */
Test(gpu, consumer_stream_waits_for_the_copy_without_the_host)
{
    need_emulator();
    struct sf_gpu *g = open_delayed_ring(5000, 2, 4096);
    char err[256] = "";
    struct sf__emu *emu = sf__gpu_emu(g);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    void *consumer = NULL;
    cr_assert_eq(ops->stream_create(emu, &consumer), 0);
    for (int round = 0; round < 8; round++) {
        unsigned char host[4096];
        memset(host, 0x40 + round, sizeof host);
        unsigned slot = (unsigned)round % 2;
        struct sf__gpu_job job = {.host = host, .bytes = sizeof host};
        cr_assert_eq(sf__gpu_submit(g, slot, &job, err, sizeof err), SF_OK, "%s", err);
        struct consumer_read c = {0};
        cr_assert_eq(sf__gpu_stream_wait(g, sf__gpu_event(g, slot), consumer), SF_OK);
        /* its gate open: the read runs as soon as the stream reaches it */
        emu_gated_read_queue(&c.r, emu, consumer, sf__gpu_u8(g, slot), sizeof c.got, c.got, 1);
        cr_assert_eq(ops->stream_sync(emu, consumer), 0);
        cr_expect(memcmp(c.got, host, sizeof host) == 0, "round %d: read before the copy", round);
        emu_gated_read_destroy(&c.r);
        cr_assert_eq(sf__gpu_wait(g, slot, NULL, err, sizeof err), SF_OK, "%s", err);
    }
    cr_assert_eq(ops->stream_destroy(emu, consumer), 0);
    sf__gpu_close(g);
}

/* One job through a ring of 2 slots with normalisation; returns the first
 * failing status (and its message in err). */
static sf_status ring_cycle(const struct sf__emu_options *eo, char *err, size_t err_len)
{
    const unsigned w = 5, h = 3;
    const size_t bytes = 2 * w * h * 3;
    struct sf_gpu *g = NULL;
    sf_status st = open_emulated(eo, 2, bytes, bytes * sizeof(float), &g, err, err_len);
    if (st != SF_OK)
        return st;
    unsigned char host[2 * 5 * 3 * 3];
    fill_random(host, sizeof host, 3);
    struct sf__gpu_job job = normalize_job(host, 2, w, h, SF_LAYOUT_CHW, half_mean, quarter_std);
    for (unsigned slot = 0; slot < 2 && st == SF_OK; slot++) {
        st = sf__gpu_submit(g, slot, &job, err, err_len);
        double t = 0;
        if (st == SF_OK)
            st = sf__gpu_wait(g, slot, &t, err, err_len);
    }
    float f[2 * 5 * 3 * 3], want[2 * 5 * 3 * 3];
    if (st == SF_OK) {
        st = sf__gpu_read(g, 1, 1, f, sizeof f, err, err_len);
        sf__normalize_u8(host, want, 2, w, h, SF_LAYOUT_CHW, job.mean, job.std);
        if (st == SF_OK && memcmp(f, want, sizeof f) != 0) {
            snprintf(err, err_len, "wrong result without an error");
            st = SF_ERR_INTERNAL;
        }
    }
    sf__gpu_close(g);
    return st;
}

/* Every operation of open, submit, wait, read fails once in turn: each
 * failure is reported (status and a message naming the operation and the
 * injected failure), and nothing leaks or hangs (ASan and the ctest
 * timeout watch). */
Test(gpu, every_failing_operation_is_reported_and_cleaned_up, .timeout = 120)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 0;
    char err[512] = "";
    cr_assert_eq(ring_cycle(&eo, err, sizeof err), SF_OK, "%s", err);
    /* How many operations a clean cycle calls. */
    struct sf_gpu *probe = NULL;
    cr_assert_eq(open_emulated(&eo, 2, 90, 360, &probe, err, sizeof err), SF_OK);
    unsigned long at_open = sf__emu_op_count(sf__gpu_emu(probe));
    sf__gpu_close(probe);
    unsigned long total = at_open + 2 * 8 + 8; /* generous: extra calls only pass */
    unsigned failed = 0;
    for (int async = 0; async <= 1; async++) {
        for (unsigned long n = 1; n <= total; n++) {
            eo.fail_at = n;
            eo.fail_async = async;
            err[0] = '\0';
            sf_status st = ring_cycle(&eo, err, sizeof err);
            if (st == SF_OK)
                continue; /* n is past the cycle's last operation */
            failed++;
            cr_expect_neq(st, SF_ERR_INTERNAL, "fail_at %lu async %d: %s", n, async, err);
            cr_expect_not_null(strstr(err, "injected failure of operation"),
                               "fail_at %lu async %d: %s", n, async, err);
            cr_expect_not_null(strstr(err, "emulated "), "fail_at %lu: no operation named: %s", n,
                               err);
        }
    }
    cr_expect_geq(failed, at_open + 10, "only %u injected failures surfaced", failed);
}

Test(gpu, kernel_checks_catch_a_missing_and_a_double_write)
{
    need_emulator();
    for (int fault = 1; fault <= 2; fault++) {
        struct sf__emu_options eo = emu_defaults();
        eo.kernel_fault = fault;
        char err[512] = "";
        sf_status st = ring_cycle(&eo, err, sizeof err);
        cr_expect_eq(st, SF_ERR_IO, "fault %d: status %d: %s", fault, (int)st, err);
        cr_expect_not_null(strstr(err, fault == 1 ? "written 0 times" : "written 2 times"),
                           "fault %d: %s", fault, err);
    }
}

/* The wait for a job whose kernel faults must report the fault, whether
 * the stream has gone past the job's done event by then or not (a faulted
 * device skips the rest of its queue at once). A wait without timing (as
 * doctor's device check) returned SF_OK over the poisoned floats, and the
 * fault surfaced only at the next call (in the loader: the elapsed-time
 * query, then named as the failing operation). */
Test(gpu, wait_for_a_faulting_kernel_reports_the_fault)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.delay_us = 0;
    eo.kernel_fault = 1;
    unsigned char host[90];
    fill_random(host, sizeof host, 5);
    struct sf__gpu_job job = normalize_job(host, 2, 5, 3, SF_LAYOUT_HWC, half_mean, quarter_std);
    for (int round = 0; round < 10; round++) {
        struct sf_gpu *g = NULL;
        char err[512] = "";
        cr_assert_eq(open_emulated(&eo, 1, 90, 360, &g, err, sizeof err), SF_OK, "%s", err);
        cr_assert_eq(sf__gpu_submit(g, 0, &job, err, sizeof err), SF_OK, "%s", err);
        sf_status st = sf__gpu_wait(g, 0, NULL, err, sizeof err);
        cr_expect_eq(st, SF_ERR_IO, "round %d: status %d: %s", round, (int)st, err);
        cr_expect_not_null(strstr(err, "written 0 times"), "round %d: %s", round, err);
        sf__gpu_close(g);
    }
}

Test(gpu, close_with_work_still_queued)
{
    need_emulator();
    struct sf_gpu *g = open_delayed_ring(3000, 3, 1 << 16);
    char err[256] = "";
    unsigned char *host = malloc(1 << 16);
    cr_assert_not_null(host);
    memset(host, 9, 1 << 16);
    for (unsigned s = 0; s < 3; s++) {
        struct sf__gpu_job job = {.host = host, .bytes = 1 << 16};
        cr_assert_eq(sf__gpu_submit(g, s, &job, err, sizeof err), SF_OK, "%s", err);
    }
    sf__gpu_close(g); /* waits for the copies: host must outlive it */
    free(host);
}

Test(gpu, emulator_options_from_the_environment)
{
    struct sf__emu_options eo = emu_defaults();
    char err[256] = "";
    setenv("SF_GPU_EMULATOR",
           "seed=9,delay_us=0,fail_at=12,fail_async=1,units=3,mem_mib=64,kernel_fault=2", 1);
    cr_assert_eq(sf__emu_options_from_env(&eo, err, sizeof err), 0, "%s", err);
    cr_expect_eq(eo.seed, 9u);
    cr_expect_eq(eo.delay_us, 0u);
    cr_expect_eq(eo.fail_at, 12u);
    cr_expect_eq(eo.fail_async, 1);
    cr_expect_eq(eo.units, 3);
    cr_expect_eq(eo.mem_bytes, (uint64_t)64 << 20);
    cr_expect_eq(eo.kernel_fault, 2); /* so a kernel fault can be shown through the loader */
    /* strtoull alone would take "-1" as 2^64 - 1 and skip leading blanks. */
    const char *bad[] = {"seed",           "units=0",    "delay_us=x", "colour=3",
                         "fail_at=-1",     "seed=-3",    "mem_mib= 8", "units=+2",
                         "kernel_fault=3", "fail_async=2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("SF_GPU_EMULATOR", bad[i], 1);
        err[0] = '\0';
        cr_expect_eq(sf__emu_options_from_env(&eo, err, sizeof err), -1, "%s accepted", bad[i]);
        cr_expect_not_null(strstr(err, "SF_GPU_EMULATOR"), "%s: %s", bad[i], err);
    }
    /* A ring opened with a bad variable fails naming it. */
    struct sf_gpu *g = NULL;
    struct sf__gpu_config c = {SF__GPU_EMULATED, 0, 1, 64, 0, NULL};
    cr_expect_eq(sf__gpu_open(&c, &g, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect_null(g);
    unsetenv("SF_GPU_EMULATOR");
}

Test(gpu, emulated_device_memory_is_bounded)
{
    need_emulator();
    struct sf__emu_options eo = emu_defaults();
    eo.mem_bytes = 1 << 20;
    struct sf_gpu *g = NULL;
    char err[256] = "";
    sf_status st = open_emulated(&eo, 4, 300 << 10, 0, &g, err, sizeof err);
    cr_expect_eq(st, SF_ERR_NO_MEMORY, "%s", err);
    cr_expect_not_null(strstr(err, "slot 3 u8"), "%s", err);
    cr_expect_null(g);
}
