/* The loader's GPU delivery, on the emulated device (on CUDA with
 * SF_TEST_GPU_BACKEND=cuda). Suite `loader` (test_loader.c). */
#include "loader_fixture.h"
#include "src/loader.h"
#include "src/loader_internal.h"
#include "support/emu_gate.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ GPU delivery */

#ifdef SF_TEST_CUDA
#include <cuda_runtime_api.h>
#endif
#include "src/decode.h"
#include "src/gpu.h"
#include "src/gpu_dev.h"

/* GPU delivery runs on the emulated device in every build;
 * SF_TEST_GPU_BACKEND=cuda (scripts/gpu-acceptance.sh) runs it on CUDA. */
static int on_cuda(void)
{
    const char *b = getenv("SF_TEST_GPU_BACKEND");
    return b && !strcmp(b, "cuda");
}

/* 0, or -1 when dev cannot be read. No criterion asserts: it also runs on
 * an emulated stream's thread. */
static int device_read(const struct sf_batch *b, void *dst, const void *dev, size_t bytes)
{
    if (b->device == SF_DEVICE_EMULATED)
        return sf__emu_peek(sf__gpu_emu(b->device_ring), dst, dev, bytes) == 0 ? 0 : -1;
#ifdef SF_TEST_CUDA
    return cudaMemcpy(dst, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#else
    return -1;
#endif
}

/* The device batch against the host one: u8 bytes equal, floats bit for
 * bit equal to the host normalisation. Returns NULL or what differs. */
static const char *device_batch_differs(const struct sf_batch *b,
                                        const struct sf_loader_options *o,
                                        const unsigned char *host)
{
    size_t bytes = b->size * b->image_bytes;
    unsigned char *u8 = malloc(bytes);
    float *f = malloc(bytes * sizeof(float)), *want = malloc(bytes * sizeof(float));
    const char *why = NULL;
    if (!u8 || !f || !want)
        why = "out of memory";
    else if (device_read(b, u8, b->device_images, bytes) != 0)
        why = "device uint8 batch unreadable";
    else if (memcmp(u8, host, bytes) != 0)
        why = "device uint8 batch differs from the host one";
    else if (device_read(b, f, b->device_normalized, bytes * sizeof(float)) != 0)
        why = "device float batch unreadable";
    if (!why) {
        sf__normalize_u8(host, want, b->size, b->width, b->height, b->layout, o->image.mean,
                         o->image.std);
        if (memcmp(f, want, bytes * sizeof(float)) != 0)
            why = "device floats differ from the host normalisation";
    }
    free(u8);
    free(f);
    free(want);
    return why;
}

static struct sf_loader *open_device_loader(struct sf_loader_options *o, const char **src,
                                            int sync)
{
    if (on_cuda() && sf_cuda_device_count() == 0)
        cr_assert_fail("SF_TEST_GPU_BACKEND=cuda but no CUDA device");
    local_dataset(80, 64 << 10, -1);
    src[0] = shards;
    base_options(o, src, 1);
    o->device = on_cuda() ? SF_DEVICE_CUDA : SF_DEVICE_EMULATED;
    o->prefetch_batches = 3;
    o->sync_device = sync;
    return open_loader(o);
}

/* The tests that hook the consumer's emulated streams: skipped on CUDA
 * (why says what they need of the emulator), else open_device_loader
 * unsynchronised, on a source list that lives as long as the test. */
static struct sf_loader *open_emulated_consumer_loader(struct sf_loader_options *o, const char *why)
{
    if (on_cuda())
        cr_skip_test("%s", why);
    static const char *src[1];
    return open_device_loader(o, src, 0);
}

static const char consumer_hooks[] = "the consumer's reads are emulated-device hooks";

Test(loader, gpu_batches_match_the_host_batches)
{
    const char *src[1];
    struct sf_loader_options o;
    struct sf_loader *l = open_device_loader(&o, src, 1);
    struct sf_batch b;
    unsigned n = 0;
    sf_status st;
    while ((st = sf_loader_next(l, &b)) == SF_OK) {
        cr_assert_not_null(b.device_images);
        cr_assert_not_null(b.device_normalized);
        cr_assert_not_null(b.cuda_event);
        cr_assert_eq(b.device, on_cuda() ? SF_DEVICE_CUDA : SF_DEVICE_EMULATED);
        const char *why = device_batch_differs(&b, &o, b.images);
        cr_assert_null(why, "batch %llu: %s", (unsigned long long)b.index, why);
        n += (unsigned)b.size;
        sf_loader_release(l, &b);
    }
    cr_assert_eq(st, SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(n, 80u);
    struct sf_loader_stats s;
    sf_loader_get_stats(l, &s);
    cr_assert_eq(s.on_device, 1);
    cr_expect_gt(s.gpu_copy_s, 0.0, "no device time measured");
    sf_loader_close(l);
}

struct stream_check {
    struct sf_batch b; /* a copy: the caller's array is reused */
    const struct sf_loader_options *o;
    unsigned char *host; /* a copy: the host slot may be refilled after release */
    const char *why;
};

static void check_on_stream(void *arg)
{
    struct stream_check *c = arg;
    c->why = device_batch_differs(&c->b, c->o, c->host);
}

/* No host synchronisation: the consumer's stream waits for each batch's
 * copy (sf_batch_wait_stream), reads it there, and releases it with
 * sf_loader_release_after, so the slot is refilled only after the read. */
Test(loader, gpu_batches_read_on_the_consumer_stream)
{
    struct sf_loader_options o;
    struct sf_loader *l = open_emulated_consumer_loader(&o, consumer_hooks);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    struct sf__emu *emu = NULL;
    void *stream = NULL;
    struct sf_batch b[8];
    struct stream_check c[8];
    unsigned n = 0, k = 0;
    sf_status st;
    while ((st = sf_loader_next(l, &b[k % 8])) == SF_OK) {
        struct sf_batch *x = &b[k % 8];
        if (!emu) {
            emu = sf__gpu_emu(x->device_ring);
            cr_assert_eq(ops->stream_create(emu, &stream), 0);
        }
        struct stream_check *y = &c[k % 8];
        y->b = *x;
        y->o = &o;
        y->host = malloc(x->size * x->image_bytes);
        cr_assert_not_null(y->host);
        memcpy(y->host, x->images, x->size * x->image_bytes);
        cr_assert_eq(sf_batch_wait_stream(x, stream), SF_OK);
        cr_assert_eq(sf__emu_enqueue_fn(emu, stream, check_on_stream, y), 0);
        cr_assert_eq(sf_loader_release_after(l, x, stream), SF_OK);
        n += (unsigned)x->size;
        k++;
        if (k % 8 == 0) { /* the checks of the last 8 have run: their copies can go */
            cr_assert_eq(ops->stream_sync(emu, stream), 0);
            for (int i = 0; i < 8; i++) {
                cr_assert_null(c[i].why, "batch %llu: %s", (unsigned long long)c[i].b.index,
                               c[i].why);
                free(c[i].host);
            }
        }
    }
    cr_assert_eq(st, SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_not_null(emu);
    cr_assert_eq(ops->stream_sync(emu, stream), 0);
    for (unsigned i = 0; i < k % 8; i++) {
        cr_assert_null(c[i].why, "batch %llu: %s", (unsigned long long)c[i].b.index, c[i].why);
        free(c[i].host);
    }
    cr_assert_eq(n, 80u);
    cr_assert_eq(ops->stream_destroy(emu, stream), 0);
    sf_loader_close(l);
}

/*
 * A batch read on two streams (the first behind a shut gate, the second at
 * once) and released after both: the batch the loader later copies into
 * the same device slot waits for the first stream's read too, which sees
 * the released batch. (The gate opens once that later copy is seen
 * complete, which only a release after the last stream alone allows, or
 * after 100 ms, so a correct loader never waits long.)
 */
Test(loader, gpu_batch_released_after_several_streams_waits_for_each)
{
    struct sf_loader_options o;
    struct sf_loader *l = open_emulated_consumer_loader(&o, consumer_hooks);
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    struct sf_batch x, y;
    cr_assert_eq(sf_loader_next(l, &x), SF_OK, "%s", sf_loader_errmsg(l));
    struct sf__emu *emu = sf__gpu_emu(x.device_ring);
    size_t bytes = x.size * x.image_bytes;
    unsigned char *want = malloc(bytes);
    struct emu_gated_read r[2];
    void *streams[2];
    cr_assert_not_null(want);
    memcpy(want, x.images, bytes);
    for (int i = 0; i < 2; i++) {
        unsigned char *got = malloc(bytes);
        cr_assert_not_null(got);
        cr_assert_eq(ops->stream_create(emu, &streams[i]), 0);
        cr_assert_eq(sf_batch_wait_stream(&x, streams[i]), SF_OK);
        emu_gated_read_queue(&r[i], emu, streams[i], x.device_images, bytes, got, i == 1);
    }
    cr_assert_eq(sf_loader_release_after_streams(l, &x, streams, 2), SF_OK);
    sf_status st;
    while ((st = sf_loader_next(l, &y)) == SF_OK && y.device_images != x.device_images)
        sf_loader_release(l, &y);
    cr_assert_eq(st, SF_OK, "no later batch in the released slot: %s", sf_loader_errmsg(l));
    pthread_t opener;
    cr_assert_eq(pthread_create(&opener, NULL, emu_gated_read_open_later, &r[0]), 0);
    cr_assert_eq(ops->event_sync(emu, y.cuda_event), 0);
    emu_gated_read_open(&r[0]);
    pthread_join(opener, NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ops->stream_sync(emu, streams[i]), 0);
        cr_expect_eq(r[i].rc, 0);
        cr_expect(memcmp(r[i].got, want, bytes) == 0,
                  "stream %d's read saw another batch's bytes in the released slot", i);
        cr_assert_eq(ops->stream_destroy(emu, streams[i]), 0);
        free(r[i].got);
        emu_gated_read_destroy(&r[i]);
    }
    free(want);
    sf_loader_release(l, &y);
    sf_loader_close(l);
}

/* A release the loader refuses (more distinct streams than the bound, no
 * stream array) leaves the batch held: the caller may still release it. */
Test(loader, gpu_release_after_too_many_streams_keeps_the_batch)
{
    struct sf_loader_options o;
    struct sf_loader *l = open_emulated_consumer_loader(&o, "emulated-device streams");
    const struct sf__gpu_ops *ops = sf__gpu_emu_ops();
    struct sf_batch x;
    cr_assert_eq(sf_loader_next(l, &x), SF_OK, "%s", sf_loader_errmsg(l));
    struct sf__emu *emu = sf__gpu_emu(x.device_ring);
    enum { N = SF_LOADER_RELEASE_STREAMS_MAX + 1 };
    void *s[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(ops->stream_create(emu, &s[i]), 0);
    cr_expect_eq(sf_loader_release_after_streams(l, &x, s, N), SF_ERR_LIMIT);
    cr_expect_eq(sf_loader_release_after_streams(l, &x, NULL, 1), SF_ERR_INVALID_ARGUMENT);
    pthread_mutex_lock(&l->mu);
    unsigned held = l->held;
    pthread_mutex_unlock(&l->mu);
    cr_expect_eq(held, 1u, "a refused release let the batch go");
    cr_expect_eq(sf_loader_release_after_streams(l, &x, s, N - 1), SF_OK);
    pthread_mutex_lock(&l->mu);
    held = l->held;
    pthread_mutex_unlock(&l->mu);
    cr_expect_eq(held, 0u);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(ops->stream_sync(emu, s[i]), 0);
        cr_assert_eq(ops->stream_destroy(emu, s[i]), 0);
    }
    sf_loader_close(l);
}

/* A device failure half-way through an epoch is the loader's error, with
 * the operation named; no hang. */
Test(loader, gpu_failure_is_a_loader_error)
{
    if (on_cuda())
        cr_skip_test("failure injection is an emulated-device hook");
    setenv("SF_GPU_EMULATOR", "delay_us=0,fail_at=40", 1);
    const char *src[1];
    struct sf_loader_options o;
    struct sf_loader *l = open_device_loader(&o, src, 0);
    unsetenv("SF_GPU_EMULATOR");
    struct sf_batch b;
    sf_status st;
    unsigned n = 0;
    while ((st = sf_loader_next(l, &b)) == SF_OK) {
        n++;
        sf_loader_release(l, &b);
    }
    cr_expect_neq(st, SF_END_OF_EPOCH, "an injected device failure went unnoticed (%u batches)", n);
    cr_expect_not_null(strstr(sf_loader_errmsg(l), "injected failure of operation 40"), "%s",
                       sf_loader_errmsg(l));
    sf_loader_close(l);
}
