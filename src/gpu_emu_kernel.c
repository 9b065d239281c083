/* The emulated device's normalise kernel: gpu_kernel.h run block by block
 * and thread by thread, with the output poisoned first and every store
 * counted, so an element not written exactly once or a store outside the
 * output is a sticky error. */

#include "src/gpu_emu_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Emulated stores: counted, bounds-checked (see sf__emu_run_kernel). */
static void emu_store(float *dst, uint32_t i, float v);
#define SF_K_STORE(dst, i, v) emu_store((dst), (i), (v))
#include "src/gpu_kernel.h"

/* ------------------------------------------------------------------ kernel */

struct store_ctx {
    float *out;
    uint64_t total;
    uint8_t *count;
    uint64_t outside;
    uint64_t first_outside;
};

static _Thread_local struct store_ctx *store_tls;

static void emu_store(float *dst, uint32_t i, float v)
{
    struct store_ctx *c = store_tls;
    float *p = dst + i;
    if (p < c->out || (uint64_t)(p - c->out) >= c->total) {
        if (c->outside++ == 0)
            c->first_outside = (uint64_t)(p - c->out);
        return;
    }
    uint64_t k = (uint64_t)(p - c->out);
    if (c->count[k] < 255)
        c->count[k]++;
    *p = v;
}

/* Runs one launch; 0 or a sticky error (under no lock: the worker owns the
 * buffers while the op runs). */
int sf__emu_run_kernel(struct sf__emu *e, const struct sf__norm_launch *l)
{
    uint64_t total = l->n_images * (uint64_t)l->elems;
    pthread_mutex_lock(&e->amu);
    const unsigned char *in = sf__emu_shadow_of(e, l->in, total);
    float *out = (float *)sf__emu_shadow_of(e, l->out, total * sizeof(float));
    pthread_mutex_unlock(&e->amu);
    int rc = 0;
    if (!in || !out) {
        pthread_mutex_lock(&e->mu);
        rc = sf__emu_fail_locked(e, EMU_ILLEGAL_ADDRESS,
                         "normalize kernel: %s of %" PRIu64 " elements outside device memory",
                         !in ? "input" : "output", total);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    if (l->gx == 0 || l->gy == 0 || l->elems != 3u * l->plane) {
        pthread_mutex_lock(&e->mu);
        rc = sf__emu_fail_locked(e, EMU_KERNEL_CHECK,
                                 "normalize kernel: grid %ux%u, elems %u, plane %u", l->gx, l->gy,
                                 l->elems, l->plane);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    /* Poison: a NaN no computation produces. */
    const uint32_t poison = 0x7FA5A5A5u;
    for (uint64_t i = 0; i < total; i++)
        memcpy(out + i, &poison, sizeof poison);
    struct store_ctx c = {out, total, calloc(total ? total : 1, 1), 0, 0};
    if (!c.count) {
        pthread_mutex_lock(&e->mu);
        rc = sf__emu_fail_locked(e, EMU_KERNEL_CHECK,
                                 "normalize kernel: no host memory for the checks");
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    store_tls = &c;
    struct sf_k_params p = {l->mean[0], l->mean[1], l->mean[2], l->std[0], l->std[1], l->std[2]};
    float lut[SF_K_LUT];
    for (uint32_t by = 0; by < l->gy; by++) {
        for (uint32_t bx = 0; bx < l->gx; bx++) {
            /* Shared memory starts undefined: poisoned, then every thread
             * fills its share before the barrier. */
            for (uint32_t i = 0; i < SF_K_LUT; i++)
                memcpy(lut + i, &poison, sizeof poison);
            for (uint32_t t = 0; t < SF_K_THREADS; t++)
                sf_k_fill_lut(lut, t, SF_K_THREADS, p);
            int first = bx == 0 && by == 0;
            int runs = first && e->o.kernel_fault == 2 ? 2 : 1;
            for (int r = 0; r < runs; r++) {
                for (uint32_t t = 0; t < SF_K_THREADS; t++) {
                    if (first && t == 0 && e->o.kernel_fault == 1)
                        continue;
                    sf_k_thread(in, out, lut, l->n_images, l->elems, l->plane, l->hwc,
                                bx * SF_K_THREADS + t, l->gx * SF_K_THREADS, by, l->gy);
                }
            }
        }
    }
    store_tls = NULL;
    uint64_t bad = total;
    for (uint64_t i = 0; i < total; i++) {
        if (c.count[i] != 1) {
            bad = i;
            break;
        }
    }
    pthread_mutex_lock(&e->mu);
    if (c.outside)
        rc = sf__emu_fail_locked(e, EMU_KERNEL_CHECK,
                         "normalize kernel: %" PRIu64 " stores outside the output, first at "
                         "element %" PRId64,
                         c.outside, (int64_t)c.first_outside);
    else if (bad < total)
        rc = sf__emu_fail_locked(e, EMU_KERNEL_CHECK,
                         "normalize kernel: element %" PRIu64 " of %" PRIu64
                         " written %u times (image %" PRIu64 ", grid %ux%u)",
                         bad, total, (unsigned)c.count[bad], bad / l->elems, l->gx, l->gy);
    pthread_mutex_unlock(&e->mu);
    free(c.count);
    return rc;
}
