/*
 * Autotune (sf_tune): coordinate search over the knobs that matter, each
 * measured on its own stage with doctor's measurements (doctor.h), then one
 * check of the whole pipeline. The search, and why it is small:
 *
 *  - decode_threads: the decode stage on 1, cores/2, cores and 1.5 x cores
 *    threads; the fewest within 3 % of the best (threads beyond the cores
 *    only add switching).
 *  - concurrency (remote data only): doubled from the loader's value while
 *    a doubling gains 5 %; halved once when the first doubling gains
 *    nothing (the fewest connections within 5 % win).
 *  - chunk size: halved while the rate holds within 5 % (down to 1 MiB:
 *    fewer shards in flight for the same ranges), then doubled once for a
 *    5 % gain.
 *  - prefetch_shards: enough shards in flight for `concurrency` ranges of
 *    `chunk` bytes (concurrency x chunk / mean shard size), at least the
 *    loader's; prefetch_batches: at least the loader's, and 2 + threads / 2
 *    so every decode thread has a batch to work on. Both are memory knobs
 *    that only need to be large enough, so they are computed, not searched.
 *  - check: the whole pipeline (no step, RAM only so the user's cache stays
 *    untouched) with the given options and with the tuned ones; the given
 *    ones stay when the tuned point is not faster.
 *
 * A fetch point starts only while it and the check still fit in the budget
 * (room_for); the search stops there rather than overrun it.
 */
#include "shardfeed.h"
#include "shardfeed_loader.h"

#include "src/doctor.h"
#include "src/pipeline_rate.h"
#include "common/clock.h"
#include "common/cpu.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void trace(struct sf_tune_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(struct sf_tune_result *r, const char *fmt, ...)
{
    size_t n = strlen(r->trace);
    if (n + 2 >= sizeof(r->trace))
        return;
    if (n)
        r->trace[n++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->trace + n, sizeof(r->trace) - n, fmt, ap);
    va_end(ap);
}

/* The whole pipeline without a step for span_s, RAM only: samples/s. */
static sf_status pipeline_rate(const struct sf_loader_options *given, unsigned threads,
                               unsigned concurrency, unsigned long long chunk, unsigned shards,
                               unsigned batches, double span_s, double *per_s, char *err,
                               size_t len)
{
    struct sf_loader_options o = *given;
    o.decode_threads = threads;
    o.s3.concurrency = concurrency;
    o.s3.chunk_bytes = chunk;
    o.prefetch_shards = shards;
    o.prefetch_batches = batches;
    o.ram_only = 1;
    o.cache.dir = NULL;
    struct sf_loader *l = NULL;
    sf_status st = sf_loader_open(&o, &l, err, len);
    if (st != SF_OK)
        return st;
    st = sf__pipeline_rate(l, o.sampler.epoch, span_s, NULL, NULL, per_s, err, len);
    sf_loader_close(l);
    return st;
}

/* Room for one more search point of span seconds, keeping what the final
 * check needs (two pipeline runs of two spans each, plus their opens):
 * the search stops early rather than overrun the budget. */
static int room_for(double t_start, double budget, double span, struct sf_tune_result *r)
{
    const double reserve = 4.0 * span + 0.5;
    if (sf__now_s() - t_start + span + reserve <= budget)
        return 1;
    if (!strstr(r->trace, "budget:"))
        trace(r, "budget: search stopped at %.1f s of %.1f", sf__now_s() - t_start, budget);
    return 0;
}

sf_status sf_tune(const struct sf_loader_options *o, double budget_s, struct sf_tune_result *r,
                  char *err, size_t err_len)
{
    if (!o || !r) {
        if (err && err_len)
            snprintf(err, err_len, "tune: no options or result");
        return SF_ERR_INVALID_ARGUMENT;
    }
    memset(r, 0, sizeof(*r));
    const double t_start = sf__now_s();
    const double budget = budget_s > 0 ? budget_s : 20.0;
    struct sf__doctor *d = NULL;
    sf_status st = sf__doctor_open(o, &d, err, err_len);
    if (st != SF_OK)
        return st;
    const int remote = sf__doctor_remote(d);
    /* 4 decode points, up to 6 fetch points, 2 pipeline runs of 2 spans. */
    const double span = fmax(0.25, budget / (remote ? 18.0 : 8.0));

    /* decode_threads */
    const unsigned cores = sf__cores_available();
    unsigned cand[4] = {1, cores / 2, cores, cores + cores / 2};
    double best = 0, rate[4] = {0};
    for (int i = 0; i < 4 && st == SF_OK; i++) {
        int dup = cand[i] == 0;
        for (int k = 0; k < i; k++)
            dup |= cand[k] == cand[i];
        if (dup)
            continue;
        rate[i] = sf__doctor_decode_rate(d, cand[i], span, &st, err, err_len);
        r->points++;
        trace(r, "decode_threads=%u:%.0f/s", cand[i], rate[i]);
        best = fmax(best, rate[i]);
    }
    r->decode_threads = o->decode_threads ? o->decode_threads : cores;
    for (int i = 0; i < 4 && best > 0; i++)
        if (rate[i] >= 0.97 * best && (r->decode_per_s == 0 || cand[i] < r->decode_threads)) {
            r->decode_threads = cand[i];
            r->decode_per_s = rate[i];
        }

    /* chunk size, then concurrency: with one range per object (a chunk as
     * large as the shards) the object read first crawls at one
     * connection's rate whatever the concurrency, so the concurrency can
     * only be judged once the chunk lets objects be read in parallel. */
    r->concurrency = o->s3.concurrency ? o->s3.concurrency : 32;
    r->chunk_bytes = o->s3.chunk_bytes ? o->s3.chunk_bytes : 8ull << 20;
    if (st == SF_OK && remote && room_for(t_start, budget, span, r)) {
        /* The chunk on the in-order rate (what the reader can parse). */
        double cur = 0;
        st = sf__doctor_fetch_rate(d, r->concurrency, r->chunk_bytes, span, &cur, NULL, err,
                                   err_len);
        r->points++;
        trace(r, "start c=%u chunk=%lluK:%.1fMiB/s", r->concurrency, r->chunk_bytes >> 10, cur);
        while (st == SF_OK && r->chunk_bytes / 2 >= (1ull << 20) &&
               room_for(t_start, budget, span, r)) {
            double c = 0;
            st = sf__doctor_fetch_rate(d, r->concurrency, r->chunk_bytes / 2, span, &c, NULL, err,
                                       err_len);
            r->points++;
            trace(r, "chunk=%lluK:%.1fMiB/s", (r->chunk_bytes / 2) >> 10, c);
            if (c < 0.95 * cur)
                break;
            r->chunk_bytes /= 2;
            cur = fmax(cur, c);
        }
        if (st == SF_OK && r->chunk_bytes * 2 <= (64ull << 20) &&
            room_for(t_start, budget, span, r)) {
            double c = 0;
            st = sf__doctor_fetch_rate(d, r->concurrency, r->chunk_bytes * 2, span, &c, NULL, err,
                                       err_len);
            r->points++;
            trace(r, "chunk=%lluK:%.1fMiB/s", (r->chunk_bytes * 2) >> 10, c);
            if (c >= 1.05 * cur)
                r->chunk_bytes *= 2;
        }
        /* The concurrency on the rate received in any order: in steady
         * state (prefetch_shards computed below keeps that many ranges in
         * flight) the reader parses what arrived, and a span too short to
         * finish the head object would not tell more connections apart. */
        double agg = 0, ignored = 0;
        int measured = st == SF_OK && room_for(t_start, budget, span, r);
        if (measured) {
            st = sf__doctor_fetch_rate(d, r->concurrency, r->chunk_bytes, span, &ignored, &agg,
                                       err, err_len);
            r->points++;
            trace(r, "concurrency=%u:%.1fMiB/s", r->concurrency, agg);
        }
        int raised = 0;
        while (st == SF_OK && measured && r->concurrency * 2 <= 256 &&
               room_for(t_start, budget, span, r)) {
            double more = 0;
            st = sf__doctor_fetch_rate(d, r->concurrency * 2, r->chunk_bytes, span, &ignored,
                                       &more, err, err_len);
            r->points++;
            trace(r, "concurrency=%u:%.1fMiB/s", r->concurrency * 2, more);
            if (more < 1.05 * agg)
                break;
            r->concurrency *= 2;
            agg = more;
            raised = 1;
        }
        if (st == SF_OK && measured && !raised && r->concurrency >= 4 &&
            room_for(t_start, budget, span, r)) {
            double less = 0;
            st = sf__doctor_fetch_rate(d, r->concurrency / 2, r->chunk_bytes, span, &ignored,
                                       &less, err, err_len);
            r->points++;
            trace(r, "concurrency=%u:%.1fMiB/s", r->concurrency / 2, less);
            if (less >= 0.95 * agg) {
                r->concurrency /= 2;
                agg = less;
            }
        }
        r->fetch_mib_per_s = agg;
    }

    /* the memory knobs, computed */
    const unsigned long long shard = sf__doctor_mean_shard_bytes(d);
    unsigned want_shards = shard ? (unsigned)((r->concurrency * r->chunk_bytes + shard - 1) / shard)
                                 : 0;
    if (want_shards > 64)
        want_shards = 64;
    r->prefetch_shards = o->prefetch_shards > want_shards ? o->prefetch_shards : want_shards;
    if (r->prefetch_shards < 2)
        r->prefetch_shards = 2;
    r->prefetch_batches = 2 + r->decode_threads / 2;
    if (r->prefetch_batches < o->prefetch_batches)
        r->prefetch_batches = o->prefetch_batches;
    sf__doctor_close(d);

    /* the check */
    if (st == SF_OK)
        st = pipeline_rate(o, o->decode_threads ? o->decode_threads : cores,
                           o->s3.concurrency ? o->s3.concurrency : 32,
                           o->s3.chunk_bytes ? o->s3.chunk_bytes : 8ull << 20, o->prefetch_shards,
                           o->prefetch_batches, 2 * span, &r->given_per_s, err, err_len);
    if (st == SF_OK)
        st = pipeline_rate(o, r->decode_threads, r->concurrency, r->chunk_bytes,
                           r->prefetch_shards, r->prefetch_batches, 2 * span, &r->tuned_per_s, err,
                           err_len);
    if (st != SF_OK)
        return st;
    trace(r, "pipeline given:%.0f/s tuned:%.0f/s", r->given_per_s, r->tuned_per_s);
    /* Not faster (a tie too: 0 and 0 when no batch comes) keeps the given. */
    if (!(r->tuned_per_s > r->given_per_s)) {
        r->kept_given = 1;
        r->decode_threads = o->decode_threads ? o->decode_threads : cores;
        r->concurrency = o->s3.concurrency ? o->s3.concurrency : 32;
        r->chunk_bytes = o->s3.chunk_bytes ? o->s3.chunk_bytes : 8ull << 20;
        r->prefetch_shards = o->prefetch_shards;
        r->prefetch_batches = o->prefetch_batches;
    }
    snprintf(r->config_json, sizeof(r->config_json),
             "{\"decode_threads\": %u, \"concurrency\": %u, \"chunk_size\": \"%lluK\", "
             "\"prefetch_shards\": %u, \"prefetch_batches\": %u}",
             r->decode_threads, r->concurrency, r->chunk_bytes >> 10, r->prefetch_shards,
             r->prefetch_batches);
    r->seconds = sf__now_s() - t_start;
    return SF_OK;
}
