/*
 * The starvation report (sf_loader_report): the consumer's wait per batch,
 * its percentiles, the stage that bounds the pipeline and the knob to turn,
 * from the counters the loader keeps anyway. The rules are in docs/loader.md
 * ("Starvation report"); `shardfeed doctor` measures the stages one by one
 * where this report can only infer.
 */
#include "src/loader_internal.h"
#include "common/cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The busiest stage bounds the pipeline when it is at least this busy (share
 * of its threads' time). Not higher: a decode thread that waits now and then
 * for the reader, on a machine whose cores the reader and the step share,
 * measures 0.75-0.85 while it alone sets the pace. */
#define BUSY 0.6
/* A consumer waiting more than this share of its time is starving. */
#define STARVING 0.05

static unsigned bucket_of(double wait_s)
{
    const double us = wait_s * 1e6;
    if (!(us >= 1.0))
        return 0;
    if (us >= 4294967296.0)
        return SF__WAIT_BUCKETS - 1;
    const uint64_t v = (uint64_t)us;
    const unsigned octave = 63u - (unsigned)__builtin_clzll(v);
    const unsigned quarter = octave >= 2 ? (unsigned)(v >> (octave - 2)) & 3u
                                         : (unsigned)((v << (2 - octave)) & 3u);
    const unsigned k = 1u + 4u * octave + quarter;
    return k < SF__WAIT_BUCKETS ? k : SF__WAIT_BUCKETS - 1;
}

/* The upper end of bucket k, in seconds. */
static double bucket_top_s(unsigned k)
{
    if (k == 0)
        return 1e-6;
    const unsigned octave = (k - 1) / 4, quarter = (k - 1) % 4;
    return ldexp((double)(5 + quarter) / 4.0, (int)octave) * 1e-6;
}

void sf__wait_log_add(struct sf__wait_log *w, double wait_s)
{
    if (wait_s < 0)
        wait_s = 0;
    if (w->count == 0)
        w->first_s = wait_s;
    w->count++;
    w->total_s += wait_s;
    if (wait_s > w->max_s)
        w->max_s = wait_s;
    w->hist[bucket_of(wait_s)]++;
}

/* The wait below which a share q of the batches stayed: the top of its
 * bucket, never above the largest wait seen. */
double sf__wait_log_percentile_s(const struct sf__wait_log *w, double q)
{
    if (w->count == 0)
        return 0;
    uint64_t rank = (uint64_t)ceil(q * (double)w->count);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned k = 0; k < SF__WAIT_BUCKETS; k++) {
        seen += w->hist[k];
        if (seen >= rank) {
            if (k == SF__WAIT_BUCKETS - 1)
                return w->max_s; /* open above */
            const double top = bucket_top_s(k);
            return top < w->max_s ? top : w->max_s;
        }
    }
    return w->max_s;
}

const char *sf_stage_name(enum sf_stage s)
{
    switch (s) {
    case SF_STAGE_NONE: return "none";
    case SF_STAGE_STARTUP: return "startup";
    case SF_STAGE_FETCH: return "fetch";
    case SF_STAGE_READ: return "read";
    case SF_STAGE_DECODE: return "decode";
    case SF_STAGE_ASSEMBLY: return "assembly";
    case SF_STAGE_DEVICE: return "device";
    }
    return "unknown";
}

void sf_loader_report_reset(struct sf_loader *l)
{
    if (!l)
        return;
    struct sf_loader_stats now;
    sf_loader_get_stats(l, &now);
    pthread_mutex_lock(&l->mu);
    memset(&l->waits, 0, sizeof(l->waits));
    l->waits.base = now;
    pthread_mutex_unlock(&l->mu);
}

static double share(double busy, double span)
{
    if (span <= 0)
        return 0;
    double s = busy / span;
    return s < 0 ? 0 : s > 1 ? 1 : s;
}

/* The verdict line: the stage, the figures behind it, the knob. */
static void verdict(const struct sf_loader *l, const struct sf_loader_report *r,
                    const struct sf_loader_stats *d, char *out, size_t len)
{
    const unsigned threads = l->n_workers ? l->n_workers : 1;
    const unsigned cores = sf__cores_available();
    switch (r->bound) {
    case SF_STAGE_NONE:
        snprintf(out, len,
                 "not starving: the step waited %.1f %% of the time; the step takes %.0f "
                 "samples/s and the loader keeps up",
                 100.0 * r->wait_share, r->step_per_s);
        return;
    case SF_STAGE_STARTUP:
        snprintf(out, len,
                 "startup-bound: the first batch took %.1f ms of the %.1f ms waited; later "
                 "batches waited %.1f %% of the time: warm the cache first (shardfeed "
                 "warm-cache) or start the loader before building the model",
                 1e3 * r->first_wait_s, 1e3 * r->wait_s,
                 100.0 * share(r->wait_s - r->first_wait_s, r->span_s - r->first_wait_s));
        return;
    case SF_STAGE_DECODE: {
        const double per = r->decode_per_thread_per_s;
        const double got = r->span_s > 0 ? (double)r->samples / r->span_s : 0;
        unsigned need = per > 0 ? (unsigned)ceil(r->step_per_s / per) : threads + 1;
        if (need <= threads)
            need = threads + 1; /* busy threads and a waiting step: one more helps */
        char step[64];
        if (r->step_per_s > 20.0 * got)
            snprintf(step, sizeof(step), "far more (it barely runs)");
        else
            snprintf(step, sizeof(step), "%.0f img/s", r->step_per_s);
        if (threads < cores && need > cores)
            snprintf(out, len,
                     "decode-bound: %u thread%s at %.0f img/s each (busy %.0f %%), %.0f img/s "
                     "delivered; the step takes %s: set decode_threads to %u (the cores here), "
                     "then each core added gives about %.0f img/s, or pack at --max-side 320",
                     threads, threads == 1 ? "" : "s", per, 100.0 * r->decode_busy, got, step,
                     cores, per);
        else if (need <= cores)
            snprintf(out, len,
                     "decode-bound: %u thread%s at %.0f img/s each (busy %.0f %%), %.0f img/s "
                     "delivered; the step takes %s: set decode_threads to %u (cores: %u)",
                     threads, threads == 1 ? "" : "s", per, 100.0 * r->decode_busy, got, step,
                     need, cores);
        else
            snprintf(out, len,
                     "decode-bound: %u thread%s at %.0f img/s each (busy %.0f %%), %.0f img/s "
                     "delivered; the step takes %s: each core added gives about %.0f img/s "
                     "(cores here: %u), or pack at --max-side 320 (smaller JPEGs decode faster)",
                     threads, threads == 1 ? "" : "s", per, 100.0 * r->decode_busy, got, step, per,
                     cores);
        return;
    }
    case SF_STAGE_DEVICE:
        snprintf(out, len,
                 "device-bound: the host-to-device copies are busy %.0f %% of the time: keep "
                 "batches uint8 on the device (normalise there), or smaller images",
                 100.0 * r->device_busy);
        return;
    case SF_STAGE_READ:
        snprintf(out, len,
                 "read-bound: the reader thread is busy %.0f %% of the time parsing shards: "
                 "larger samples per shard, or record shards (shardfeed pack --format record)",
                 100.0 * r->read_busy);
        return;
    case SF_STAGE_FETCH: {
        const double per_sample =
            d->samples_read ? (double)d->bytes_read / (double)d->samples_read : 0;
        const double need = r->step_per_s * per_sample / (1024.0 * 1024.0);
        snprintf(out, len,
                 "fetch-bound: %.1f MiB/s from the store with concurrency %u; the step takes "
                 "%.0f samples/s of %.0f KiB, %.1f MiB/s: raise concurrency (e.g. %u) and "
                 "prefetch_shards (now %u), or warm the cache first (shardfeed warm-cache)",
                 r->fetch_mib_per_s, l->o.s3.concurrency, r->step_per_s, per_sample / 1024.0, need,
                 l->o.s3.concurrency * 2, l->o.prefetch_shards);
        return;
    }
    case SF_STAGE_ASSEMBLY:
        snprintf(out, len,
                 "no stage is saturated (decode %.0f %%, read %.0f %%, device %.0f %% busy) yet the "
                 "step waited %.1f %% of the time: raise prefetch_batches (now %u) and "
                 "prefetch_shards (now %u)",
                 100.0 * r->decode_busy, 100.0 * r->read_busy, 100.0 * r->device_busy,
                 100.0 * r->wait_share, l->ring, l->o.prefetch_shards);
        return;
    }
    snprintf(out, len, "unknown");
}

void sf_loader_report(struct sf_loader *l, struct sf_loader_report *out)
{
    memset(out, 0, sizeof(*out));
    if (!l)
        return;
    struct sf_loader_stats now;
    sf_loader_get_stats(l, &now);
    struct sf__wait_log w;
    pthread_mutex_lock(&l->mu);
    w = l->waits;
    pthread_mutex_unlock(&l->mu);
    const struct sf_loader_stats *b = &w.base;
    struct sf_loader_stats d = now;
    d.samples_delivered -= b->samples_delivered;
    d.samples_read -= b->samples_read;
    d.samples_decoded -= b->samples_decoded;
    d.bytes_read -= b->bytes_read;
    d.bytes_fetched -= b->bytes_fetched;
    d.cache_misses -= b->cache_misses;
    d.decode_busy_s -= b->decode_busy_s;
    d.read_busy_s -= b->read_busy_s;
    d.gpu_copy_s -= b->gpu_copy_s;

    struct sf_loader_report *r = out;
    r->span_s = w.t_first > 0 ? sf__now_s() - w.t_first : 0;
    r->batches = w.count;
    r->samples = d.samples_delivered;
    r->wait_s = w.total_s + w.pending_s;
    r->wait_share = share(r->wait_s, r->span_s);
    r->first_wait_s = w.first_s;
    r->wait_p50_ms = 1e3 * sf__wait_log_percentile_s(&w, 0.50);
    r->wait_p99_ms = 1e3 * sf__wait_log_percentile_s(&w, 0.99);
    r->wait_max_ms = 1e3 * w.max_s;
    const double working = r->span_s - r->wait_s;
    r->step_per_s = working > 0 ? (double)r->samples / working : 0;
    r->decode_per_thread_per_s =
        d.decode_busy_s > 0 ? (double)d.samples_decoded / d.decode_busy_s : 0;
    const unsigned threads = l->n_workers ? l->n_workers : 1;
    r->decode_busy = share(d.decode_busy_s, r->span_s * threads);
    r->read_busy = share(d.read_busy_s, r->span_s);
    r->device_busy = share(d.gpu_copy_s, r->span_s);
    r->fetch_mib_per_s = r->span_s > 0 ? (double)d.bytes_fetched / (1024.0 * 1024.0) / r->span_s : 0;
    r->starving = r->wait_share > STARVING;

    if (r->batches == 0)
        r->bound = SF_STAGE_NONE;
    else if (!r->starving)
        r->bound = SF_STAGE_NONE;
    else if (r->first_wait_s >= 0.5 * r->wait_s)
        r->bound = SF_STAGE_STARTUP;
    else if (r->decode_busy >= BUSY && r->decode_busy >= r->device_busy &&
             r->decode_busy >= r->read_busy)
        r->bound = SF_STAGE_DECODE;
    else if (r->device_busy >= BUSY && r->device_busy >= r->read_busy)
        r->bound = SF_STAGE_DEVICE;
    else if (r->read_busy >= BUSY)
        r->bound = SF_STAGE_READ;
    else if (d.cache_misses > 0 && d.bytes_fetched > 0)
        r->bound = SF_STAGE_FETCH;
    else
        r->bound = SF_STAGE_ASSEMBLY;
    if (r->batches == 0)
        snprintf(r->verdict, sizeof(r->verdict), "no batch delivered yet");
    else
        verdict(l, r, &d, r->verdict, sizeof(r->verdict));
}
