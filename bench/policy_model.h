/*
 * A model of P fetch engines sharing one rate-limited prefix, in model time:
 * each engine runs the real policy (s3/fetch_policy.c) with 32 requests in
 * flight at most and W requests to complete; one token bucket of `limit`
 * requests/s (burst `limit`, full at the start: the mock's rate_limit), and
 * on top of it a share `noise` of answers throttled at random; every answer
 * comes 0.5-1.5 x rtt_ms after its request starts (0.1 ms steps), engines
 * start together or spread over stagger_ms (processes that start on a busy
 * machine); a
 * throttled request starts again after sf__policy_retry()'s delay.
 * Deterministic for a seed. bench/scale_model.c prints it (bench_scale_model);
 * tests/test_fetch_policy.c asserts on it.
 */
#ifndef SF_BENCH_POLICY_MODEL_H
#define SF_BENCH_POLICY_MODEL_H

#include <stdint.h>
#include <stdio.h>

struct policy_model {
    unsigned ranks, requests;
    double limit, noise, rtt_ms;
    double stagger_ms; /* each engine starts at a uniform random time in [0, stagger_ms) */
    double max_s; /* model time after which unfinished engines count as failed */
    FILE *trace;  /* each engine's done count, rate cap and state every 250 ms */
};

struct policy_model_result {
    double share;     /* throttled answers / all answers */
    double fairness;  /* slowest / fastest completion */
    double aggregate; /* useful answers per second of the slowest, / limit */
    unsigned finished;
    /* throttled answers by the engine's state when they came: slow start,
     * descent, limit confirmed, other; and those in the first second */
    unsigned long long by_state[4], first_second;
};

/* Runs the model for seed. Returns 0, or -1 when out of memory. */
int policy_model_run(const struct policy_model *m, uint64_t seed, struct policy_model_result *out);

#endif
