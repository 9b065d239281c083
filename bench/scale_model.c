/*
 * bench_scale_model: bench/scale_sim.sh in model time, for tuning the fetch
 * policy (s3/fetch_policy.c) without a mock server or a noisy machine.
 *
 *   bench_scale_model [--ranks P] [--requests W] [--limit R] [--noise F]
 *                     [--seeds S] [--rtt-ms MS] [--stagger-ms MS] [--trace]
 *
 * The model (bench/policy_model.h, shared with tests/test_fetch_policy.c):
 * P engines, each running the real policy with 32 requests in flight at most
 * and W requests to complete (the ranged GETs of one rank), share one token
 * bucket of R requests/s (burst R, full at the start: the mock's rate_limit);
 * on top of it a share F of answers is throttled at random (noise). Every
 * answer comes 0.5-1.5 x MS after its request starts (0.1 ms steps on a
 * synthetic clock); a throttled request is tried again after the delay
 * sf__policy_retry() gives; --stagger-ms spreads the engines' starts
 * uniformly over that many ms (8 processes started at once on a loaded
 * machine begin over some 100 ms). Per seed (the RTT and noise draws and the
 * policies' jitter), and as mean and worst over S seeds, prints what
 * scale_sim.sh prints: throttled share of all answers (target <= 5 %),
 * slowest / fastest completion (<= 1.5) and the aggregate rate of useful
 * answers against R (>= 0.9), plus where the throttled answers fell (the
 * engine's state when it got them, and how many in the first second).
 * --trace prints each engine's completed requests and rate cap every 250 ms
 * (s slow start, d descent, L limit confirmed).
 *
 * Deterministic: the same arguments give the same figures on any machine.
 */
#include "bench/policy_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr, "usage: bench_scale_model [--ranks P] [--requests W] [--limit R] "
                    "[--noise F] [--seeds S] [--rtt-ms MS] [--stagger-ms MS] [--trace]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct policy_model m = {
        .ranks = 8, .requests = 256, .limit = 200, .noise = 0, .rtt_ms = 3, .max_s = 600};
    unsigned seeds = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--trace") == 0) {
            m.trace = stdout;
            continue;
        }
        if (!v)
            usage();
        i++;
        if (strcmp(a, "--ranks") == 0)
            m.ranks = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--requests") == 0)
            m.requests = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--limit") == 0)
            m.limit = strtod(v, NULL);
        else if (strcmp(a, "--noise") == 0)
            m.noise = strtod(v, NULL);
        else if (strcmp(a, "--seeds") == 0)
            seeds = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--rtt-ms") == 0)
            m.rtt_ms = strtod(v, NULL);
        else if (strcmp(a, "--stagger-ms") == 0)
            m.stagger_ms = strtod(v, NULL);
        else
            usage();
    }
    if (m.ranks < 1 || m.ranks > 4096 || m.requests < 1 || seeds < 1 || !(m.limit >= 1) ||
        !(m.noise >= 0 && m.noise < 1) || !(m.rtt_ms > 0) || !(m.stagger_ms >= 0))
        usage();
    double share = 0, fair = 0, agg = 0, worst_share = 0, worst_fair = 0;
    for (unsigned s = 1; s <= seeds; s++) {
        struct policy_model_result o;
        if (policy_model_run(&m, s, &o) != 0) {
            fprintf(stderr, "bench_scale_model: out of memory\n");
            return 1;
        }
        if (o.finished < m.ranks)
            printf("seed %u: %u engines did not finish in %.0f s of model time\n", s,
                   m.ranks - o.finished, m.max_s);
        printf("seed %u: throttled %.1f %%, slowest/fastest %.2f, aggregate %.2f of the limit; "
               "throttled answers in slow start %llu, descent %llu, limit confirmed %llu, "
               "other %llu; in the first second %llu\n",
               s, 100 * o.share, o.fairness, o.aggregate, o.by_state[0], o.by_state[1],
               o.by_state[2], o.by_state[3], o.first_second);
        share += o.share / seeds;
        fair += o.fairness / seeds;
        agg += o.aggregate / seeds;
        worst_share = o.share > worst_share ? o.share : worst_share;
        worst_fair = o.fairness > worst_fair ? o.fairness : worst_fair;
    }
    printf("%u ranks x %u requests, limit %.0f/s, noise %.1f %%, %u seeds: throttled %.1f %% "
           "(worst %.1f %%; target <= 5 %%), slowest/fastest %.2f (worst %.2f; <= 1.5), "
           "aggregate %.2f of the limit (>= 0.9)\n",
           m.ranks, m.requests, m.limit, 100 * m.noise, seeds, 100 * share, 100 * worst_share,
           fair, worst_fair, agg);
    return 0;
}
