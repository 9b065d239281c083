/*
 * The whole pipeline's rate over a span of time: the autotuner's check
 * (tune.c, no step) and shardfeed doctor's pipeline row (cli_load.c, with
 * the simulated training step) measure with this one loop. Header-only and
 * on the public API, so that the CLI, which links only the public library,
 * runs the same code as the library. Internal (sf__).
 */
#ifndef SF_PIPELINE_RATE_H
#define SF_PIPELINE_RATE_H

#include "common/clock.h"
#include "shardfeed_loader.h"

#include <stdio.h>

/*
 * Takes batches from the open loader l until span_s seconds have passed,
 * and at least one batch: a rate of 0 would say nothing (a loaded machine,
 * a short span). A wait never runs past the span once a batch came. Epochs
 * roll over from `epoch` on; one that delivers no batch ends the run (no
 * data to measure). on_batch (may be NULL) runs on each batch before it is
 * released: the training step being simulated. *per_s: samples delivered
 * per second of the run. Returns SF_OK, or the loader's failure with its
 * message in err. l stays open.
 */
static inline sf_status sf__pipeline_rate(struct sf_loader *l, uint64_t epoch, double span_s,
                                          void (*on_batch)(void *user), void *user, double *per_s,
                                          char *err, size_t err_len)
{
    sf_status st = SF_OK;
    unsigned long long n = 0, n_epoch = 0;
    double t0 = sf__now_s(), t = 0;
    while ((t = sf__now_s() - t0) < span_s || n == 0) {
        struct sf_batch b;
        double left = t < span_s ? span_s - t : 0;
        st = n == 0 && left <= 0 ? sf_loader_next(l, &b)
                                 : sf_loader_next_wait(l, &b, (unsigned)(left * 1000.0) + 1);
        if (st == SF_NOT_READY) {
            st = SF_OK;
            continue;
        }
        if (st == SF_END_OF_EPOCH) {
            st = SF_OK;
            if (n == n_epoch)
                break;
            n_epoch = n;
            st = sf_loader_set_epoch(l, ++epoch);
            if (st != SF_OK)
                break;
            continue;
        }
        if (st != SF_OK)
            break;
        n += b.size;
        if (on_batch)
            on_batch(user);
        sf_loader_release(l, &b);
    }
    if (st != SF_OK)
        snprintf(err, err_len, "%s", sf_loader_errmsg(l));
    *per_s = t > 0 ? (double)n / t : 0;
    return st;
}

#endif
