/* The multi-engine policy model (policy_model.h). */
#include "bench/policy_model.h"

#include "s3/fetch.h" /* SF__START_RPS: the engine's slow start */
#include "s3/fetch_policy.h"
#include "shardfeed_s3.h"

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

/* One engine: its policy and how far it got. */
struct engine {
    struct sf__policy pol;
    unsigned done, inflight;
    uint64_t begin, end; /* model time of its first start and its last answer */
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
    struct engine *eng = calloc(P, sizeof(*eng));
    struct req *rq = calloc((size_t)P * W, sizeof(*rq));
    unsigned inited = 0;
    int rc = -1;
    if (!eng || !rq)
        goto out;
    /* What a fetch engine gets from sf_s3_options_init_default(), but no
     * request ever gives up: the model measures how fast they all finish. */
    struct sf_s3_options d;
    sf_s3_options_init_default(&d);
    const struct sf__policy_config c = {
        .concurrency = d.concurrency,
        .max_attempts = 1000,
        .retry_base_ms = d.retry_base_ms,
        .throttle_base_ms = d.throttle_base_ms,
        .retry_cap_ms = d.retry_cap_ms,
        .retry_quota = 1000000,
        .start_rps = SF__START_RPS,
    };
    for (; inited < P; inited++)
        if (sf__policy_init(&eng[inited].pol, &c, seed * 100 + inited) != 0)
            goto out;
    uint64_t rng = seed * 7919, now = 0, tok_ns = 0;
    for (unsigned p = 0; p < P && m->stagger_ms > 0; p++)
        eng[p].begin = (uint64_t)(m->stagger_ms * (double)MS * uniform(&rng));
    double tokens = m->limit;
    unsigned long long thr = 0, all = 0;
    unsigned left = P;
    const uint64_t stop = (uint64_t)(m->max_s * 1e9);
    while (left && now < stop) {
        for (unsigned p = 0; p < P; p++) {
            struct req *r = rq + (size_t)p * W;
            for (unsigned i = 0; i < W && eng[p].done < W && now >= eng[p].begin; i++) {
                if (r[i].state != 0 || r[i].t > now)
                    continue;
                if (eng[p].inflight >= sf__policy_window(&eng[p].pol) ||
                    !sf__policy_may_start(&eng[p].pol, now))
                    break;
                r[i].state = 1;
                r[i].t = now;
                eng[p].inflight++;
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
                fprintf(m->trace, " %4u:%5.0f%c", eng[p].done, eng[p].pol.send_rps,
                        "sdL "[state_of(&eng[p].pol)]);
            fprintf(m->trace, "\n");
        }
        for (unsigned p = 0; p < P; p++) {
            struct req *r = rq + (size_t)p * W;
            for (unsigned i = 0; i < W; i++) {
                if (r[i].state != 1 || now < r[i].due)
                    continue;
                eng[p].inflight--;
                all++;
                if (r[i].thr) {
                    thr++;
                    out->by_state[state_of(&eng[p].pol)]++;
                    out->first_second += now < 1000 * MS;
                }
                unsigned held = 0;
                enum sf__verdict v =
                    sf__policy_record(&eng[p].pol, now, r[i].t,
                                      r[i].thr ? SF__OUTCOME_THROTTLED : SF__OUTCOME_OK, &held);
                if (r[i].thr) {
                    uint64_t delay = 0;
                    sf__policy_retry(&eng[p].pol, ++r[i].attempts, SF__OUTCOME_THROTTLED, v, &held,
                                     &delay);
                    r[i].state = 0;
                    r[i].t = now + delay * MS;
                } else {
                    r[i].state = 2;
                    if (++eng[p].done == W) {
                        eng[p].end = now;
                        left--;
                    }
                }
            }
        }
    }
    uint64_t slowest = 0, fastest = UINT64_MAX;
    for (unsigned p = 0; p < P; p++) {
        uint64_t e = eng[p].end ? eng[p].end : now;
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
        sf__policy_free(&eng[p].pol);
    free(eng);
    free(rq);
    return rc;
}
