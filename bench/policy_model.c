/* The multi-engine policy model (policy_model.h). */
#include "bench/policy_model.h"

#include "s3/fetch.h" /* SF__START_RPS: the engine's slow start */
#include "s3/fetch_policy.h"

#include <stdlib.h>
#include <string.h>

#define MS   1000000ull
#define STEP (MS / 10)

struct req {
    uint64_t t;   /* waiting: ready at t; in flight: started at t */
    uint64_t due; /* in flight: when the answer comes */
    unsigned attempts;
    int state; /* 0 waiting, 1 in flight, 2 done */
    int thr;   /* the answer will be throttled */
};

static double uniform(uint64_t *rng)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*rng >> 11) / 9007199254740992.0;
}

static int state_of(const struct sf__policy *p)
{
    return p->ss ? 0 : p->desc ? 1 : p->limited ? 2 : 3;
}

int policy_model_run(const struct policy_model *m, uint64_t seed, struct policy_model_result *out)
{
    memset(out, 0, sizeof(*out));
    const unsigned P = m->ranks, W = m->requests;
    struct sf__policy *pol = calloc(P, sizeof(*pol));
    struct req *rq = calloc((size_t)P * W, sizeof(*rq));
    unsigned *done = calloc(P, sizeof(*done)), *inflight = calloc(P, sizeof(*inflight));
    uint64_t *end = calloc(P, sizeof(*end));
    uint64_t *begin = calloc(P, sizeof(*begin));
    unsigned inited = 0;
    int rc = -1;
    if (!pol || !rq || !done || !inflight || !end || !begin)
        goto out;
    for (; inited < P; inited++) {
        struct sf__policy_config c = {
            .concurrency = 32,
            .max_attempts = 1000,
            .retry_base_ms = 50,
            .throttle_base_ms = 500,
            .retry_cap_ms = 20000,
            .retry_quota = 1000000,
            .start_rps = SF__START_RPS,
        };
        if (sf__policy_init(&pol[inited], &c, seed * 100 + inited) != 0)
            goto out;
    }
    uint64_t rng = seed * 7919, now = 0, tok_ns = 0;
    for (unsigned p = 0; p < P && m->stagger_ms > 0; p++)
        begin[p] = (uint64_t)(m->stagger_ms * (double)MS * uniform(&rng));
    double tokens = m->limit;
    unsigned long long thr = 0, all = 0;
    unsigned left = P;
    const uint64_t stop = (uint64_t)(m->max_s * 1e9);
    while (left && now < stop) {
        for (unsigned p = 0; p < P; p++) {
            struct req *r = rq + (size_t)p * W;
            for (unsigned i = 0; i < W && done[p] < W && now >= begin[p]; i++) {
                if (r[i].state != 0 || r[i].t > now)
                    continue;
                if (inflight[p] >= sf__policy_window(&pol[p]) ||
                    !sf__policy_may_start(&pol[p], now))
                    break;
                r[i].state = 1;
                r[i].t = now;
                inflight[p]++;
                tokens += (double)(now - tok_ns) / 1e9 * m->limit;
                tok_ns = now;
                if (tokens > m->limit)
                    tokens = m->limit;
                if (tokens < 1) {
                    r[i].thr = 1;
                } else {
                    tokens -= 1;
                    r[i].thr = uniform(&rng) < m->noise;
                }
                r[i].due = now + (uint64_t)(m->rtt_ms * (double)MS * (0.5 + uniform(&rng)));
            }
        }
        now += STEP;
        if (m->trace && now % (250 * MS) == 0) {
            fprintf(m->trace, "t=%5.2f", (double)now / 1e9);
            for (unsigned p = 0; p < P; p++)
                fprintf(m->trace, " %4u:%5.0f%c", done[p], pol[p].send_rps,
                        "sdL "[state_of(&pol[p])]);
            fprintf(m->trace, "\n");
        }
        for (unsigned p = 0; p < P; p++) {
            struct req *r = rq + (size_t)p * W;
            for (unsigned i = 0; i < W; i++) {
                if (r[i].state != 1 || now < r[i].due)
                    continue;
                inflight[p]--;
                all++;
                if (r[i].thr) {
                    thr++;
                    out->by_state[state_of(&pol[p])]++;
                    out->first_second += now < 1000 * MS;
                }
                unsigned held = 0;
                enum sf__verdict v = sf__policy_record(
                    &pol[p], now, r[i].t, r[i].thr ? SF__OUTCOME_THROTTLED : SF__OUTCOME_OK, &held);
                if (r[i].thr) {
                    uint64_t delay = 0;
                    sf__policy_retry(&pol[p], ++r[i].attempts, SF__OUTCOME_THROTTLED, v, &held,
                                     &delay);
                    r[i].state = 0;
                    r[i].t = now + delay * MS;
                } else {
                    r[i].state = 2;
                    if (++done[p] == W) {
                        end[p] = now;
                        left--;
                    }
                }
            }
        }
    }
    uint64_t slowest = 0, fastest = UINT64_MAX;
    for (unsigned p = 0; p < P; p++) {
        uint64_t e = end[p] ? end[p] : now;
        slowest = e > slowest ? e : slowest;
        fastest = e < fastest ? e : fastest;
    }
    out->finished = P - left;
    out->share = all ? (double)thr / (double)all : 0;
    out->fairness = (double)slowest / (double)fastest;
    out->aggregate = (double)P * W / ((double)slowest / 1e9) / m->limit;
    rc = 0;
out:
    for (unsigned p = 0; p < inited; p++)
        sf__policy_free(&pol[p]);
    free(pol);
    free(rq);
    free(done);
    free(inflight);
    free(end);
    free(begin);
    return rc;
}
