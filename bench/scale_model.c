/*
 * bench_scale_model: bench/scale_sim.sh in model time, for tuning the fetch
 * policy (s3/fetch_policy.c) without a mock server or a noisy machine.
 *
 *   bench_scale_model [--ranks P] [--requests W] [--limit R] [--noise F]
 *                     [--seeds S] [--rtt-ms MS] [--trace]
 *
 * P engines, each running the real policy with 32 requests in flight at most
 * and W requests to complete (the ranged GETs of one rank), share one token
 * bucket of R requests/s (burst R, full at the start: the mock's rate_limit);
 * on top of it a share F of answers is throttled at random (noise). Every
 * answer comes 0.5-1.5 x MS after its request starts (0.1 ms steps on a
 * synthetic clock); a throttled request is tried again after the delay
 * sf__policy_retry() gives. Per seed (the RTT and noise draws and the
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
#include "s3/fetch.h" /* SF__START_RPS: the engine's slow start */
#include "s3/fetch_policy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS   1000000ull
#define STEP (MS / 10)

struct req {
    uint64_t t;   /* pending: ready at t; in flight: started at t */
    uint64_t due; /* in flight: when the answer comes */
    unsigned attempts;
    int state; /* 0 pending, 1 in flight, 2 done */
    int thr;   /* the answer will be throttled */
};

struct model {
    unsigned ranks, requests, seeds;
    double limit, noise, rtt_ms;
    int trace;
    uint64_t rng;
};

static double uniform(struct model *m)
{
    m->rng = m->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(m->rng >> 11) / 9007199254740992.0;
}

static char state_of(const struct sf__policy *p)
{
    return p->limited ? 'L' : p->ss ? 's' : p->desc ? 'd' : ' ';
}

struct outcome {
    double share, fairness, aggregate;
    unsigned long long by_state[4], first_second;
};

static struct outcome run_seed(struct model *m, unsigned seed)
{
    struct outcome out = {0};
    m->rng = seed * 7919ull;
    struct sf__policy *pol = calloc(m->ranks, sizeof(*pol));
    struct req *rq = calloc((size_t)m->ranks * m->requests, sizeof(*rq));
    unsigned *done = calloc(m->ranks, sizeof(*done));
    uint64_t *end = calloc(m->ranks, sizeof(*end));
    if (!pol || !rq || !done || !end) {
        fprintf(stderr, "bench_scale_model: out of memory\n");
        exit(1);
    }
    for (unsigned p = 0; p < m->ranks; p++) {
        struct sf__policy_config c = {
            .concurrency = 32,
            .max_attempts = 1000,
            .retry_base_ms = 50,
            .throttle_base_ms = 500,
            .retry_cap_ms = 20000,
            .retry_quota = 1000000,
            .start_rps = SF__START_RPS,
        };
        if (sf__policy_init(&pol[p], &c, seed * 100ull + p) != 0) {
            fprintf(stderr, "bench_scale_model: out of memory\n");
            exit(1);
        }
    }
    double tokens = m->limit;
    uint64_t tok_ns = 0, now = 0;
    unsigned long long thr = 0, all = 0;
    unsigned left = m->ranks;
    while (left && now < 600000 * MS) {
        for (unsigned p = 0; p < m->ranks; p++) {
            struct req *r = rq + (size_t)p * m->requests;
            unsigned inflight = 0;
            for (unsigned i = 0; i < m->requests; i++)
                inflight += r[i].state == 1;
            for (unsigned i = 0; i < m->requests && inflight < sf__policy_window(&pol[p]); i++) {
                if (r[i].state != 0 || r[i].t > now)
                    continue;
                if (!sf__policy_may_start(&pol[p], now))
                    break;
                r[i].state = 1;
                r[i].t = now;
                inflight++;
                tokens += (double)(now - tok_ns) / 1e9 * m->limit;
                tok_ns = now;
                if (tokens > m->limit)
                    tokens = m->limit;
                if (tokens < 1) {
                    r[i].thr = 1;
                } else {
                    tokens -= 1;
                    r[i].thr = uniform(m) < m->noise;
                }
                r[i].due = now + (uint64_t)(m->rtt_ms * (double)MS * (0.5 + uniform(m)));
            }
        }
        now += STEP;
        if (m->trace && now % (250 * MS) == 0) {
            printf("t=%5.2f", (double)now / 1e9);
            for (unsigned p = 0; p < m->ranks; p++)
                printf(" %4u:%5.0f%c", done[p], pol[p].send_rps, state_of(&pol[p]));
            printf("\n");
        }
        for (unsigned p = 0; p < m->ranks; p++) {
            struct req *r = rq + (size_t)p * m->requests;
            for (unsigned i = 0; i < m->requests; i++) {
                if (r[i].state != 1 || now < r[i].due)
                    continue;
                int t = r[i].thr;
                if (t) {
                    out.by_state[pol[p].ss ? 0 : pol[p].desc ? 1 : pol[p].limited ? 2 : 3]++;
                    out.first_second += now < 1000 * MS;
                }
                all++;
                thr += (unsigned)t;
                unsigned held = 0;
                enum sf__verdict v = sf__policy_record(
                    &pol[p], now, r[i].t, t ? SF__OUTCOME_THROTTLED : SF__OUTCOME_OK, &held);
                if (t) {
                    uint64_t delay = 0;
                    r[i].attempts++;
                    sf__policy_retry(&pol[p], r[i].attempts, SF__OUTCOME_THROTTLED, v, &held,
                                     &delay);
                    r[i].state = 0;
                    r[i].t = now + delay * MS;
                } else {
                    r[i].state = 2;
                    if (++done[p] == m->requests) {
                        end[p] = now;
                        left--;
                    }
                }
            }
        }
    }
    uint64_t slowest = 0, fastest = UINT64_MAX;
    for (unsigned p = 0; p < m->ranks; p++) {
        uint64_t e = end[p] ? end[p] : now;
        slowest = e > slowest ? e : slowest;
        fastest = e < fastest ? e : fastest;
        sf__policy_free(&pol[p]);
    }
    out.share = all ? (double)thr / (double)all : 0;
    out.fairness = (double)slowest / (double)fastest;
    out.aggregate = (double)m->ranks * m->requests / ((double)slowest / 1e9) / m->limit;
    if (left)
        printf("seed %u: %u engines did not finish in 600 s of model time\n", seed, left);
    free(pol);
    free(rq);
    free(done);
    free(end);
    return out;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_scale_model [--ranks P] [--requests W] [--limit R] "
                    "[--noise F] [--seeds S] [--rtt-ms MS] [--trace]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct model m = {
        .ranks = 8, .requests = 256, .seeds = 8, .limit = 200, .noise = 0, .rtt_ms = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--trace") == 0) {
            m.trace = 1;
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
            m.seeds = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--rtt-ms") == 0)
            m.rtt_ms = strtod(v, NULL);
        else
            usage();
    }
    if (m.ranks < 1 || m.ranks > 4096 || m.requests < 1 || m.seeds < 1 || !(m.limit >= 1) ||
        !(m.noise >= 0 && m.noise < 1) || !(m.rtt_ms > 0))
        usage();
    double share = 0, fair = 0, agg = 0, worst_share = 0, worst_fair = 0;
    for (unsigned s = 1; s <= m.seeds; s++) {
        struct outcome o = run_seed(&m, s);
        printf("seed %u: throttled %.1f %%, slowest/fastest %.2f, aggregate %.2f of the limit; "
               "throttled answers in slow start %llu, descent %llu, limit confirmed %llu, "
               "other %llu; in the first second %llu\n",
               s, 100 * o.share, o.fairness, o.aggregate, o.by_state[0], o.by_state[1],
               o.by_state[2], o.by_state[3], o.first_second);
        share += o.share / m.seeds;
        fair += o.fairness / m.seeds;
        agg += o.aggregate / m.seeds;
        worst_share = o.share > worst_share ? o.share : worst_share;
        worst_fair = o.fairness > worst_fair ? o.fairness : worst_fair;
    }
    printf("%u ranks x %u requests, limit %.0f/s, noise %.1f %%, %u seeds: throttled %.1f %% "
           "(worst %.1f %%; target <= 5 %%), slowest/fastest %.2f (worst %.2f; <= 1.5), "
           "aggregate %.2f of the limit (>= 0.9)\n",
           m.ranks, m.requests, m.limit, 100 * m.noise, m.seeds, 100 * share, 100 * worst_share,
           fair, worst_fair, agg);
    return 0;
}
