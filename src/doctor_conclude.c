/*
 * shardfeed doctor, the verdict: from the stage rates sf_doctor_measure()
 * found and the caller's own step and whole-pipeline rates, name the stage
 * that bounds the run and say what to change (docs/doctor.md). Pure
 * arithmetic and text on the result struct.
 */
#include "shardfeed_loader.h"

#include <math.h>
#include <stdio.h>

/* The verdict of a stage whose remedy does not depend on the numbers: its
 * rate, what the step takes (need) and the remedy. */
static void rate_verdict(struct sf_doctor_result *r, enum sf_stage stage, const char *need)
{
    static const struct {
        enum sf_stage stage;
        const char *what, *where, *remedy;
    } verdicts[] = {
        {SF_STAGE_READ, "read-bound: parsing gives", " on the reader thread",
         "larger samples per shard, or record shards (pack --format record)"},
        {SF_STAGE_ASSEMBLY, "assembly-bound: copying into batches gives", "",
         "smaller output images or uint8 batches"},
        {SF_STAGE_DEVICE, "device-bound: host-to-device copies give", "",
         "uint8 batches normalised on the device, pinned memory, smaller images"},
    };
    for (size_t i = 0; i < sizeof(verdicts) / sizeof(verdicts[0]); i++)
        if (verdicts[i].stage == stage)
            snprintf(r->verdict, sizeof(r->verdict),
                     "%s %.0f samples/s%s; the step takes %s: %s", verdicts[i].what,
                     r->stage_per_s[stage], verdicts[i].where, need, verdicts[i].remedy);
}

void sf_doctor_conclude(struct sf_doctor_result *r, double step_per_s, double pipeline_per_s,
                        const struct sf_loader_report *pipeline, int data_in_cache)
{
    if (!r)
        return;
    r->step_per_s = step_per_s > 0 ? step_per_s : 0;
    r->pipeline_per_s = pipeline_per_s;
    r->wait_share = pipeline ? pipeline->wait_share : 0;
    r->fetch_counts = !data_in_cache && r->stage_per_s[SF_STAGE_FETCH] > 0;
    /* The bound: the slowest of the stages that run every epoch, the step
     * included (infinitely fast when there is none). */
    static const enum sf_stage order[] = {SF_STAGE_FETCH, SF_STAGE_READ, SF_STAGE_DECODE,
                                          SF_STAGE_ASSEMBLY, SF_STAGE_DEVICE};
    double best = r->step_per_s > 0 ? r->step_per_s : INFINITY, slowest = INFINITY;
    enum sf_stage bound = SF_STAGE_NONE, slowest_stage = SF_STAGE_NONE;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        const enum sf_stage s = order[i];
        if (r->stage_per_s[s] <= 0 || (s == SF_STAGE_FETCH && !r->fetch_counts))
            continue;
        if (r->stage_per_s[s] < slowest) {
            slowest = r->stage_per_s[s];
            slowest_stage = s;
        }
        if (r->stage_per_s[s] < best) {
            best = r->stage_per_s[s];
            bound = s;
        }
    }
    r->bound = bound;
    char need[64];
    if (r->step_per_s > 0)
        snprintf(need, sizeof(need), r->step_per_s < 1e12 ? "%.0f samples/s" : "%.3g samples/s",
                 r->step_per_s);
    else
        snprintf(need, sizeof(need), "as many as it gets (no step)");
    const char *waits = r->wait_share > 0.05 ? "waits" : "waited only";
    switch (bound) {
    case SF_STAGE_NONE:
        snprintf(r->verdict, sizeof(r->verdict),
                 "step-bound: the step takes %.0f samples/s and every stage is faster (the "
                 "slowest, %s: %.0f samples/s); the step %s %.1f %% of the time for data",
                 r->step_per_s, sf_stage_name(slowest_stage), isfinite(slowest) ? slowest : 0.0,
                 waits, 100.0 * r->wait_share);
        break;
    case SF_STAGE_DECODE: {
        const double per = r->decode_per_thread_per_s > 0 ? r->decode_per_thread_per_s : 1;
        char pack[160];
        if (r->max_side_speedup > 1.05)
            snprintf(pack, sizeof(pack),
                     ", or pack at --max-side %u (measured on these images: %.1fx faster decode, "
                     "%.0f %% of the bytes)",
                     SF_DOCTOR_MAX_SIDE, r->max_side_speedup, 100.0 * r->max_side_bytes);
        else if (r->max_side_speedup > 0)
            snprintf(pack, sizeof(pack), " (pack --max-side %u would not help: %s)",
                     SF_DOCTOR_MAX_SIDE,
                     r->max_side_bytes >= 1 ? "the images are no larger"
                                            : "measured no faster decode");
        else
            pack[0] = 0;
        if (r->step_per_s > 0) {
            /* In double: a step of --step-ms 1e-300 needs more threads than
             * an unsigned holds (the cast is undefined; it gave 0). */
            const double want = ceil(r->step_per_s / per);
            if (want <= r->cores)
                snprintf(r->verdict, sizeof(r->verdict),
                         "decode-bound: %u threads at %.0f img/s each (%.0f together); the step "
                         "takes %s: set decode_threads to %u (cores here: %u)",
                         r->decode_threads, per, r->stage_per_s[SF_STAGE_DECODE], need,
                         (unsigned)want, r->cores);
            else
                snprintf(r->verdict, sizeof(r->verdict),
                         want < 1e12 ? "decode-bound: %u threads at %.0f img/s each (%.0f "
                                       "together); the step takes %s: use %.0f more cores%s"
                                     : "decode-bound: %u threads at %.0f img/s each (%.0f "
                                       "together); the step takes %s: use %.3g more cores%s",
                         r->decode_threads, per, r->stage_per_s[SF_STAGE_DECODE], need,
                         want - r->cores, pack);
        } else {
            snprintf(r->verdict, sizeof(r->verdict),
                     "decode-bound: %u threads at %.0f img/s each (%.0f together); each core added "
                     "gives about %.0f img/s%s",
                     r->decode_threads, per, r->stage_per_s[SF_STAGE_DECODE], per, pack);
        }
        break;
    }
    case SF_STAGE_FETCH:
        snprintf(r->verdict, sizeof(r->verdict),
                 "fetch-bound: concurrency %u gives %.1f MiB/s, %u gives %.1f MiB/s (%.0f KiB per "
                 "sample); the step takes %s: %s, or warm the cache first (shardfeed warm-cache)",
                 r->concurrency, r->fetch_mib_per_s, r->concurrency_more, r->fetch_mib_per_s_more,
                 r->bytes_per_sample / 1024.0, need,
                 r->fetch_mib_per_s_more > 1.2 * r->fetch_mib_per_s
                     ? "raise concurrency"
                     : "more concurrency does not help: the store or the link is the limit");
        break;
    case SF_STAGE_READ:
    case SF_STAGE_ASSEMBLY:
    case SF_STAGE_DEVICE:
        rate_verdict(r, bound, need);
        break;
    default:
        snprintf(r->verdict, sizeof(r->verdict), "unknown");
    }
}
