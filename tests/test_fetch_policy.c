/* The fetch engine's retry and throttling policy (s3/fetch_policy.c): its
 * decisions on synthetic outcome sequences with a synthetic clock, then the
 * engine against the mock with random SlowDown and resets, and against a
 * server that accepts connections and never answers. */
#include "bench/policy_model.h"
#include "s3/fetch_policy.h"
#include "shardfeed.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/spawn.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MS  1000000ull
#define KiB 1024ull
#define MiB (1024ull * 1024)

/* ============================================================ synthetic */

static struct sf__policy pol;

static void policy_ss(unsigned concurrency, double start_rps, uint64_t seed)
{
    struct sf__policy_config c = {
        .concurrency = concurrency,
        .max_attempts = 10,
        .retry_base_ms = 50,
        .throttle_base_ms = 500,
        .retry_cap_ms = 20000,
        .retry_quota = 500,
        .start_rps = start_rps,
    };
    cr_assert_eq(sf__policy_init(&pol, &c, seed), 0);
}

/* A policy without slow start. */
static void policy(unsigned concurrency)
{
    policy_ss(concurrency, 0, 42);
}

static void policy_fini(void)
{
    sf__policy_free(&pol);
}

TestSuite(fetch_policy, .fini = policy_fini, .timeout = 30);

static uint64_t lcg = 12345;
static double uniform(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 11) / 9007199254740992.0;
}

/* What a synthetic server throttles at a window of w in flight: nothing at
 * w <= over (over 0: no threshold), then share of the answers at random, or,
 * with excess, what is over `over` ((w - over) / w). */
struct throttling {
    double share;
    unsigned over;
    int excess;
};

static double throttled_share(const struct throttling *t, unsigned w)
{
    if (t->over && w <= t->over)
        return 0.0;
    return t->excess ? (double)(w - t->over) / w : t->share;
}

/* 5 % SlowDown whatever the rate */
static const struct throttling noise_5 = {.share = 0.05};
/* a server that serves 8 at a time and throttles what is over */
static const struct throttling above_8_in_flight = {.over = 8, .excess = 1};
static const struct throttling over_12_ten_percent = {.share = 0.12, .over = 12};
static const struct throttling ten_percent = {.share = 0.10};
static const struct throttling all = {.share = 1.0};
static const struct throttling none = {.share = 0.0};

/*
 * Runs n outcomes, one every step_ns, each of a request started half a step
 * before; the throttling probability comes from t at the window. Returns the
 * mean window over the run; *verdicts counts each verdict.
 */
static double run(uint64_t *now, unsigned n, uint64_t step_ns, const struct throttling *t,
                  unsigned verdicts[6])
{
    double sum = 0;
    for (unsigned i = 0; i < n; i++) {
        *now += step_ns;
        unsigned w = sf__policy_window(&pol);
        sum += w;
        enum sf__outcome o =
            uniform() < throttled_share(t, w) ? SF__OUTCOME_THROTTLED : SF__OUTCOME_OK;
        unsigned held = 0;
        enum sf__verdict v = sf__policy_record(&pol, *now, *now - step_ns / 2, o, &held);
        if (verdicts)
            verdicts[v]++;
    }
    return sum / n;
}

Test(fetch_policy, steady_five_percent_noise_does_not_cut_the_rate)
{
    policy(16);
    uint64_t now = 1000 * MS;
    unsigned v[6] = {0};
    /* 5,000 answers over 50 s, 5 % of them SlowDown whatever the rate */
    double mean = run(&now, 5000, 10 * MS, &noise_5, v);
    cr_expect_gt(v[SF__VERDICT_NOISE], 150, "%u throttled answers judged noise", v[SF__VERDICT_NOISE]);
    cr_expect_eq(sf__policy_cuts(&pol), 0, "%llu rate cuts on noise", sf__policy_cuts(&pol));
    cr_expect_eq(v[SF__VERDICT_CUT], 0);
    cr_expect_eq(sf__policy_window(&pol), 16, "window %u at the end", sf__policy_window(&pol));
    cr_expect_eq(sf__policy_rate(&pol), 0, "a rate cap of %.1f/s on noise", sf__policy_rate(&pol));
    cr_expect_gt(mean, 15.5, "mean window %.2f of 16: the rate sagged", mean);
}

Test(fetch_policy, throttling_that_rises_with_the_rate_cuts_it)
{
    policy(32);
    uint64_t now = 1000 * MS;
    unsigned v[6] = {0};
    run(&now, 200, 5 * MS, &above_8_in_flight, v);
    cr_expect_geq(v[SF__VERDICT_CUT], 1, "no cut at a 75 %% throttled share");
    cr_expect_leq(sf__policy_window(&pol), 16, "window %u", sf__policy_window(&pol));
    /* then it hovers near what the server takes */
    double mean = run(&now, 2000, 5 * MS, &above_8_in_flight, NULL);
    cr_expect_lt(mean, 14, "mean window %.2f with a server that takes 8", mean);
    cr_expect_geq(mean, 4, "mean window %.2f: fell into a crawl", mean);
}

/* 16 in flight, an answer every 10 ms for n answers, what t says of them
 * throttled: a probe must test the share; it is judged a limit (confirmed,
 * the rate cut) or noise (the rate restored, no cut). */
static void expect_probe_judges(unsigned n, const struct throttling *t, int limit, const char *why,
                                unsigned v[6])
{
    policy(16);
    uint64_t now = 1000 * MS;
    run(&now, n, 10 * MS, t, v);
    cr_expect_geq(v[SF__VERDICT_PROBE], 1, "10 %% never tested");
    enum sf__verdict judged = limit ? SF__VERDICT_CONFIRM : SF__VERDICT_RESTORE;
    enum sf__verdict other = limit ? SF__VERDICT_RESTORE : SF__VERDICT_CONFIRM;
    cr_expect_geq(v[judged], 1, "%s", why);
    cr_expect_eq(v[other], 0);
    if (limit)
        cr_expect_geq(sf__policy_cuts(&pol), 1);
    else
        cr_expect_eq(sf__policy_cuts(&pol), 0);
}

Test(fetch_policy, a_moderate_share_that_falls_with_the_rate_is_a_limit)
{
    unsigned v[6] = {0};
    expect_probe_judges(1000, &over_12_ten_percent, 1, "the share fell to 0 at the lower rate", v);
}

Test(fetch_policy, a_moderate_share_that_does_not_fall_is_noise_and_the_rate_comes_back)
{
    unsigned v[6] = {0};
    expect_probe_judges(3000, &ten_percent, 0, "the share did not fall, the rate was not restored",
                        v);
    cr_expect_leq(v[SF__VERDICT_PROBE], 2, "%u probes in 30 s: the noise floor was not learned",
                  v[SF__VERDICT_PROBE]);
    cr_expect_eq(sf__policy_window(&pol), 16);
    cr_expect_eq(sf__policy_rate(&pol), 0);
}

Test(fetch_policy, recovers_after_a_limit_ends)
{
    policy(16);
    uint64_t now = 1000 * MS;
    run(&now, 300, 2 * MS, &none, NULL); /* 500/s accepted */
    run(&now, 40, 2 * MS, &all, NULL);
    cr_assert_lt(sf__policy_window(&pol), 16);
    double capped = sf__policy_rate(&pol);
    cr_assert_gt(capped, 0, "no rate cap after a burst of SlowDown");
    /* the limit is gone: requests start as fast as the cap allows */
    unsigned started = 0;
    for (unsigned i = 0; i < 120000 && sf__policy_rate(&pol) > 0; i++) {
        now += 1 * MS;
        if (sf__policy_may_start(&pol, now)) {
            started++;
            unsigned held = 0;
            sf__policy_record(&pol, now, now - MS / 2, SF__OUTCOME_OK, &held);
        }
    }
    cr_expect_eq(sf__policy_rate(&pol), 0, "still capped at %.1f/s after 120 s",
                 sf__policy_rate(&pol));
    cr_expect_eq(sf__policy_window(&pol), 16);
    cr_expect_gt(started, 1000);
}

/* One answer of a request started half a millisecond before now. */
static enum sf__verdict answer(uint64_t now, enum sf__outcome o)
{
    unsigned held = 0;
    return sf__policy_record(&pol, now, now - MS / 2, o, &held);
}

Test(fetch_policy, once_capped_a_few_throttled_answers_at_the_capped_rate_cut_again)
{
    policy(16);
    uint64_t now = 1000 * MS;
    run(&now, 300, 2 * MS, &none, NULL); /* 500/s accepted */
    /* the limit: throttled until the first cut */
    for (unsigned i = 0; i < 40 && sf__policy_cuts(&pol) == 0; i++) {
        now += 2 * MS;
        answer(now, SF__OUTCOME_THROTTLED);
    }
    cr_assert_eq(sf__policy_cuts(&pol), 1);
    double capped = sf__policy_rate(&pol);
    cr_assert_gt(capped, 0);
    /* at the capped rate, 2 throttled among 60 answers (3 %): in an engine
     * that never met a limit that is noise; here the shared limit is
     * exceeded again and every sender must decrease */
    unsigned cuts = 0;
    for (unsigned i = 0; i < 60; i++) {
        now += 20 * MS;
        int thr = i == 30 || i == 50;
        if (answer(now, thr ? SF__OUTCOME_THROTTLED : SF__OUTCOME_OK) == SF__VERDICT_CUT)
            cuts++;
    }
    cr_expect_eq(cuts, 1, "%u cuts on the second throttled answer at the capped rate", cuts);
    cr_expect_lt(sf__policy_rate(&pol), capped, "rate %.1f/s, was %.1f/s", sf__policy_rate(&pol),
                 capped);
    /* one throttled answer alone does not */
    double r = sf__policy_rate(&pol);
    now += 20 * MS;
    cr_expect_eq(answer(now, SF__OUTCOME_THROTTLED), SF__VERDICT_NOISE);
    cr_expect_geq(sf__policy_rate(&pol), r);
}

Test(fetch_policy, the_same_few_throttled_answers_without_a_confirmed_limit_are_noise)
{
    policy(16);
    uint64_t now = 1000 * MS;
    run(&now, 300, 2 * MS, &none, NULL);
    unsigned v[6] = {0};
    for (unsigned i = 0; i < 60; i++) {
        now += 20 * MS;
        int thr = i == 30 || i == 50;
        v[answer(now, thr ? SF__OUTCOME_THROTTLED : SF__OUTCOME_OK)]++;
    }
    cr_expect_eq(v[SF__VERDICT_NOISE], 2);
    cr_expect_eq(sf__policy_cuts(&pol), 0);
    cr_expect_eq(sf__policy_rate(&pol), 0);
}

Test(fetch_policy, a_young_engine_is_capped_from_its_rate_not_its_count)
{
    policy(16);
    /* 30 answers in its first 100 ms (300/s), then the prefix's bucket is
     * empty: the cap comes from 300/s, not from the 30 answers counted in
     * "the last second" (a late starter would otherwise be capped at the
     * floor and finish last) */
    uint64_t now = 1000 * MS;
    for (unsigned i = 0; i < 30; i++) {
        now += 10 * MS / 3;
        answer(now, SF__OUTCOME_OK);
    }
    for (unsigned i = 0; i < 40 && sf__policy_cuts(&pol) == 0; i++) {
        now += MS;
        answer(now, SF__OUTCOME_THROTTLED);
    }
    cr_assert_eq(sf__policy_cuts(&pol), 1);
    double r = sf__policy_rate(&pol);
    cr_expect_gt(r, 0.7 * 200, "capped at %.1f/s, 0.7 x a rate of about 250-300/s expected", r);
    cr_expect_lt(r, 0.7 * 310, "capped at %.1f/s", r);
}

Test(fetch_policy, never_falls_below_the_floor)
{
    policy(16);
    uint64_t now = 1000 * MS;
    run(&now, 100, 2 * MS, &none, NULL);
    /* a minute of nothing but SlowDown */
    unsigned started = 0;
    for (unsigned i = 0; i < 60000; i++) {
        now += 1 * MS;
        if (sf__policy_may_start(&pol, now)) {
            started++;
            unsigned held = 0;
            sf__policy_record(&pol, now + 20 * MS, now, SF__OUTCOME_THROTTLED, &held);
        }
    }
    cr_expect_geq(sf__policy_window(&pol), 2, "window %u under 16/8", sf__policy_window(&pol));
    double r = sf__policy_rate(&pol);
    cr_expect(r == 0 || r >= 5.0, "rate cap %.2f/s under the 5/s floor", r);
    cr_expect_geq(started, 5 * 60, "%u starts in 60 s: a crawl", started);
}

/* ---- slow start (start_rps > 0), in a model of one engine: at most the
 * window in flight, starts gated by the rate cap, every answer rtt after
 * its start, on a synthetic clock in 0.1 ms ticks. */

struct server {
    double noise;     /* share throttled at random */
    double limit_rps; /* token bucket, 0 = none */
    double tokens, burst;
    uint64_t tokens_ns;
};

/* Is a request arriving at now throttled? */
static int server_throttles(struct server *s, uint64_t now)
{
    if (s->limit_rps > 0) {
        s->tokens += (double)(now - s->tokens_ns) / 1e9 * s->limit_rps;
        s->tokens_ns = now;
        if (s->tokens > s->burst)
            s->tokens = s->burst;
        if (s->tokens < 1)
            return 1;
        s->tokens -= 1;
    }
    return uniform() < s->noise;
}

struct model_result {
    unsigned ok, throttled;
    uint64_t end_ns;
};

/* Runs until `want` successes (or 120 s); a throttled request counts as done
 * (the engine would retry it later, as a new request). */
static struct model_result model(uint64_t *now, struct server *srv, unsigned want, uint64_t rtt_ns,
                                 unsigned verdicts[6])
{
    struct model_result r = {0};
    uint64_t started[64];
    unsigned n = 0;
    uint64_t stop = *now + 120000 * MS;
    while (r.ok < want && *now < stop) {
        while (n < 64 && n < sf__policy_window(&pol) && sf__policy_may_start(&pol, *now))
            started[n++] = *now;
        *now += MS / 10;
        for (unsigned i = 0; i < n;) {
            if (*now - started[i] < rtt_ns) {
                i++;
                continue;
            }
            int thr = server_throttles(srv, started[i]);
            unsigned held = 0;
            enum sf__verdict v = sf__policy_record(
                &pol, *now, started[i], thr ? SF__OUTCOME_THROTTLED : SF__OUTCOME_OK, &held);
            if (verdicts)
                verdicts[v]++;
            if (thr)
                r.throttled++;
            else
                r.ok++;
            started[i] = started[--n];
        }
    }
    r.end_ns = *now;
    return r;
}

Test(fetch_policy, slow_start_caps_a_new_engine_and_lifts_the_cap_as_answers_succeed)
{
    policy_ss(16, 100, 42);
    cr_expect_eq(sf__policy_rate(&pol), 100);
    /* half the window at once, then paced */
    uint64_t now = 1000 * MS;
    unsigned burst = 0;
    while (sf__policy_may_start(&pol, now))
        burst++;
    cr_expect_eq(burst, 8, "%u requests at once", burst);
    struct server clean = {0};
    struct model_result r = model(&now, &clean, 20, 5 * MS, NULL);
    cr_expect_gt(sf__policy_rate(&pol), 100, "the cap did not grow with successes");
    r = model(&now, &clean, 2000, 5 * MS, NULL);
    cr_expect_eq(r.throttled, 0);
    cr_expect_eq(sf__policy_rate(&pol), 0, "still capped at %.1f/s after 2,000 successes",
                 sf__policy_rate(&pol));
    cr_expect_eq(sf__policy_window(&pol), 16);
    cr_expect_eq(sf__policy_cuts(&pol), 0);
}

Test(fetch_policy, slow_start_meets_a_limit_with_fewer_throttled_answers)
{
    /* one engine against a prefix that takes 25/s (burst 25), 3,000 answers
     * in all, with and without slow start; the same server and seed */
    unsigned thr[2];
    for (int ss = 0; ss < 2; ss++) {
        lcg = 12345;
        policy_ss(16, ss ? 100 : 0, 42);
        uint64_t now = 1000 * MS;
        struct server srv = {.limit_rps = 25, .burst = 25, .tokens = 25, .tokens_ns = now};
        unsigned v[6] = {0};
        struct model_result r = model(&now, &srv, 250, 20 * MS, v);
        thr[ss] = r.throttled;
        cr_expect_geq(sf__policy_cuts(&pol), 1, "ss %d: the limit was not judged one", ss);
        cr_expect(pol.limited, "ss %d: not in congestion avoidance at the end", ss);
        cr_expect_gt(sf__policy_rate(&pol), 0, "ss %d: uncapped over a limit", ss);
        cr_expect_lt(sf__policy_rate(&pol), 60, "ss %d: capped at %.1f/s over 25/s", ss,
                     sf__policy_rate(&pol));
        if (ss) {
            cr_expect_geq(v[SF__VERDICT_PROBE], 1, "no descent");
            cr_expect_geq(v[SF__VERDICT_CONFIRM], 1, "the descent did not confirm a limit");
        }
        sf__policy_free(&pol);
        memset(&pol, 0, sizeof(pol));
    }
    cr_expect_lt(thr[1], thr[0], "%u throttled answers with slow start, %u without", thr[1],
                 thr[0]);
}

Test(fetch_policy, slow_start_under_five_percent_noise_is_not_a_limit)
{
    /* 100 engines (seeds) each fetching 4,000 requests from a server with
     * 5 % random SlowDown and no limit: almost all end uncapped, and the
     * noise costs them little of the clean run's rate (mean of the engines'
     * rates: the few judged limited crawl, as they do without slow start) */
    unsigned capped = 0, limited = 0;
    double noisy_rps = 0, clean_rps = 0;
    for (uint64_t seed = 1; seed <= 100; seed++) {
        for (int noisy = 0; noisy < 2; noisy++) {
            lcg = seed * 7919;
            policy_ss(16, 100, seed);
            uint64_t now = 1000 * MS, t0 = now;
            struct server srv = {.noise = noisy ? 0.05 : 0};
            model(&now, &srv, 4000, 5 * MS, NULL);
            double rps = 4000 / ((double)(now - t0) / 1e9);
            if (noisy) {
                noisy_rps += rps / 100;
                capped += sf__policy_rate(&pol) > 0;
                limited += pol.limited;
            } else {
                clean_rps += rps / 100;
            }
            sf__policy_free(&pol);
            memset(&pol, 0, sizeof(pol));
        }
    }
    cr_expect_leq(limited, 5, "%u of 100 noisy engines judged a limit", limited);
    cr_expect_leq(capped, 10, "%u of 100 noisy engines capped at the end", capped);
    cr_expect_gt(noisy_rps, 0.75 * clean_rps, "noise: %.0f requests/s (model time), clean %.0f",
                 noisy_rps, clean_rps);
}

Test(fetch_policy, a_limit_confirmed_in_slow_start_lands_at_the_first_descents_floor)
{
    /* a descent judged noise (no throttling at its halved rate: the other
     * ranks had slowed meanwhile), the rate back and growing, then dense
     * throttling: the limit is confirmed at 1/10 of the rate the first
     * descent began at, not at a floor of the later, higher one */
    policy_ss(16, 100, 42);
    uint64_t now = 1000 * MS;
    for (unsigned i = 0; i < 20; i++)
        answer(now += 5 * MS, SF__OUTCOME_OK);
    cr_assert_eq(sf__policy_rate(&pol), 200);
    cr_expect_eq(answer(now += 5 * MS, SF__OUTCOME_THROTTLED), SF__VERDICT_NOISE);
    cr_assert_eq(answer(now += 5 * MS, SF__OUTCOME_THROTTLED), SF__VERDICT_PROBE);
    cr_expect_eq(sf__policy_rate(&pol), 100, "the first descent halves 200/s");
    unsigned v[6] = {0};
    for (unsigned i = 0; i < 4; i++)
        v[answer(now += 5 * MS, SF__OUTCOME_OK)]++;
    cr_assert_eq(v[SF__VERDICT_RESTORE], 1, "a quiet descent gives the rate back");
    cr_expect_eq(sf__policy_rate(&pol), 200);
    for (unsigned i = 0; i < 40; i++)
        answer(now += 5 * MS, SF__OUTCOME_OK);
    cr_assert_eq(sf__policy_rate(&pol), 400, "slow start goes on");
    for (unsigned i = 0; i < 8 && !pol.limited; i++)
        answer(now += 5 * MS, SF__OUTCOME_THROTTLED);
    cr_assert(pol.limited, "dense throttling in the second descent confirmed no limit");
    cr_expect_geq(sf__policy_cuts(&pol), 1);
    /* the second descent began at 400/s: its own floor would be 40/s, and
     * its halvings had reached 50/s */
    cr_expect_eq(sf__policy_rate(&pol), 20, "landed at %.1f/s, not 200/10", sf__policy_rate(&pol));
    /* the landing is the floor: more throttling in the descent keeps it */
    answer(now += 5 * MS, SF__OUTCOME_THROTTLED);
    cr_expect_eq(sf__policy_rate(&pol), 20, "%.1f/s under the floor", sf__policy_rate(&pol));
}

/* ---- several engines sharing one limit (bench/policy_model.h, which
 * bench_scale_model prints): 8 ranks start together, each with 32 in flight
 * and 256 requests to complete, against one token bucket of 200/s (burst
 * 200), as bench/scale_sim.sh; answers 1.5-4.5 ms after their start; a
 * throttled request is started again after the policy's retry delay. */

/* The model of 8 ranks over seeds 1-4: the means and the worst runs. */
struct ranks_summary {
    double share, fair, agg; /* means of the 4 runs */
    double worst_share, worst_fair;
};

static struct ranks_summary ranks_sharing_a_limit(void)
{
    struct ranks_summary s = {0};
    const struct policy_model m = {
        .ranks = 8, .requests = 256, .limit = 200, .rtt_ms = 3, .max_s = 120};
    for (uint64_t seed = 1; seed <= 4; seed++) {
        struct policy_model_result r;
        cr_assert_eq(policy_model_run(&m, seed, &r), 0);
        cr_assert_eq(r.finished, m.ranks, "seed %llu: %u of %u engines finished",
                     (unsigned long long)seed, r.finished, m.ranks);
        s.share += r.share / 4;
        s.fair += r.fairness / 4;
        s.agg += r.aggregate / 4;
        s.worst_share = r.share > s.worst_share ? r.share : s.worst_share;
        s.worst_fair = r.fairness > s.worst_fair ? r.fairness : s.worst_fair;
    }
    return s;
}

Test(fetch_policy, ranks_sharing_a_limit_finish_together_with_few_throttled_answers)
{
    /* the means of 4 runs (seeds): 4.2 % throttled, slowest/fastest 1.36
     * (1.47 at worst), aggregate 0.99 of the limit (5.6 %, 1.37 (1.57),
     * 0.98 before the landing at the floor, below); before the descent
     * floor, the restore rule and the rate-dependent recovery: 6.8 %, 2.72
     * (4.05), 1.01 */
    struct ranks_summary s = ranks_sharing_a_limit();
    cr_expect_leq(s.share, 0.06, "%.1f %% of the answers throttled", 100 * s.share);
    cr_expect_leq(s.fair, 1.6, "slowest/fastest %.2f (mean of 4 runs)", s.fair);
    cr_expect_leq(s.worst_fair, 2.0, "slowest/fastest %.2f in one run", s.worst_fair);
    cr_expect_geq(s.agg, 0.9, "aggregate %.2f of the limit", s.agg);
}

Test(fetch_policy, ranks_that_start_together_land_together_under_the_limit)
{
    /* the same model, seeds 1-4: 4.2 % throttled (worst 4.4), slowest/
     * fastest 1.36 (worst 1.47), aggregate 0.99 of the limit. Before a
     * limit confirmed in slow start landed at the floor of the engine's
     * first descent: 5.6 % (5.9), 1.37 (1.57), 0.98; the ranks whose
     * descents came late were confirmed at 2-3x the others' rate */
    struct ranks_summary s = ranks_sharing_a_limit();
    cr_expect_leq(s.worst_share, 0.045, "%.1f %% of the answers throttled in one run",
                  100 * s.worst_share);
    cr_expect_leq(s.fair, 1.4, "slowest/fastest %.2f (mean of 4 runs)", s.fair);
    cr_expect_leq(s.worst_fair, 1.5, "slowest/fastest %.2f in one run", s.worst_fair);
    cr_expect_geq(s.agg, 0.92, "aggregate %.2f of the limit", s.agg);
}

Test(fetch_policy, retries_are_bounded_jittered_and_paid_for)
{
    policy(16);
    unsigned held = 0;
    uint64_t d = 0;
    /* noise: the short base */
    for (unsigned a = 1; a < 10; a++) {
        cr_assert_eq(sf__policy_retry(&pol, a, SF__OUTCOME_THROTTLED, SF__VERDICT_NOISE, &held, &d),
                     SF__RETRY_OK);
        uint64_t ceil = 50ull << (a - 1);
        cr_expect_leq(d, ceil > 20000 ? 20000 : ceil, "attempt %u: %llu ms", a,
                      (unsigned long long)d);
    }
    cr_expect_eq(held, 45);
    cr_expect_eq(sf__policy_retry(&pol, 10, SF__OUTCOME_ERROR, SF__VERDICT_NONE, &held, &d),
                 SF__RETRY_MAX_ATTEMPTS);
    /* a limit: the throttling base, jittered (not always the same delay) */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (unsigned i = 0; i < 50; i++) {
        cr_assert_eq(sf__policy_retry(&pol, 3, SF__OUTCOME_THROTTLED, SF__VERDICT_CUT, &held, &d),
                     SF__RETRY_OK);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
        if (sf__policy_tokens(&pol) < 5)
            break;
    }
    cr_expect_gt(hi, 200, "max %llu ms: not the 500 ms throttling base (ceiling 2000)",
                 (unsigned long long)hi);
    cr_expect_leq(hi, 2000);
    cr_expect_lt(lo, hi, "no jitter");
    /* the quota runs out: no more retries until successes pay it back */
    while (sf__policy_retry(&pol, 1, SF__OUTCOME_ERROR, SF__VERDICT_NONE, &held, &d) ==
           SF__RETRY_OK)
        ;
    cr_expect_eq(sf__policy_retry(&pol, 1, SF__OUTCOME_ERROR, SF__VERDICT_NONE, &held, &d),
                 SF__RETRY_QUOTA);
    sf__policy_record(&pol, 1000 * MS, 999 * MS, SF__OUTCOME_OK, &held);
    cr_expect_eq(held, 0);
    cr_expect_eq(sf__policy_retry(&pol, 1, SF__OUTCOME_ERROR, SF__VERDICT_NONE, &held, &d),
                 SF__RETRY_OK, "a success did not give the quota back");
}

/* ============================================================ against servers */

static struct mock_proc srv;
static char *tmp;
static char root[600];
static struct sf_s3 *s3;
static int silent_fd = -1;

static void net_fini(void)
{
    if (silent_fd >= 0)
        close(silent_fd);
    silent_fd = -1;
    mock_env_stop(&srv, &tmp, &s3);
}

TestSuite(fetch_policy_net, .fini = net_fini, .timeout = 60);

static void make_root(void)
{
    tmp = mock_env_root(root, sizeof(root));
}

static cJSON *mock_stats(void)
{
    return mock_env_stats(&srv);
}

static double jnum(const cJSON *j, const char *a, const char *b)
{
    return mock_env_jnum(j, a, b, NULL, NULL);
}

Test(fetch_policy_net, random_slowdown_and_resets_every_byte_right_and_the_rate_not_cut)
{
    make_root();
    const char *extra[] = {"--fault", "prefix=bucket/noise/,p503=0.05,reset=0.01", NULL};
    mock_env_start(&srv, root, extra);
    struct sf_s3_options o;
    mock_env_s3_options(&o, srv.url);
    o.concurrency = 8;
    o.chunk_bytes = 64 * KiB;
    o.retry_base_ms = 5;
    o.throttle_base_ms = 200;
    char err[512] = "";
    cr_assert_eq(sf_s3_new(&o, &s3, err, sizeof(err)), SF_OK, "%s", err);
    enum { N = 8 };
    size_t n = 2 * MiB; /* 8 x 32 ranges (the first of 256 KiB is split in 4) */
    unsigned char *want[N];
    struct sf_fetch *f[N];
    for (int i = 0; i < N; i++) {
        want[i] = malloc(n);
        cr_assert(want[i]);
        test_fill(want[i], n, 100 + (unsigned)i);
        char rel[64], url[64];
        snprintf(rel, sizeof(rel), "bucket/noise/o%d.bin", i);
        cr_assert(test_write_file(root, rel, want[i], n) == 0);
        snprintf(url, sizeof(url), "s3://bucket/noise/o%d.bin", i);
        cr_assert_eq(sf_fetch_start(s3, url, NULL, &f[i]), SF_OK);
    }
    for (int i = 0; i < N; i++) {
        struct sf_fetch_progress p;
        sf_status st = sf_fetch_wait(f[i], ~0ull, -1, &p);
        cr_assert_eq(st, SF_OK, "%d: %s: %s", i, sf_status_name(st), sf_fetch_errmsg(f[i]));
        cr_expect_eq(p.total, n);
        cr_expect(memcmp(sf_fetch_data(f[i]), want[i], n) == 0, "object %d differs", i);
        sf_fetch_destroy(f[i]);
        free(want[i]);
    }
    struct sf_s3_stats s;
    sf_s3_get_stats(s3, &s);
    cJSON *j = mock_stats();
    double slowdowns = jnum(j, "faults", "503");
    double resets = jnum(j, "faults", "reset");
    cJSON_Delete(j);
    cr_expect_gt(slowdowns, 0, "no SlowDown injected: the test proves nothing");
    cr_expect_eq((double)s.throttled, slowdowns, "every SlowDown seen once");
    cr_expect_geq(s.retries, (unsigned long long)(slowdowns + resets));
    /* noise is retried, not obeyed: no cut, the window is whole at the end */
    cr_expect_eq(s.rate_cuts, 0, "%llu rate cuts on 5 %% random SlowDown (%g of %llu requests)",
                 s.rate_cuts, slowdowns, s.requests);
    /* The last answers may have opened a descent whose evidence is not all
     * in yet: it halves the window once until it is judged (noise: back to
     * whole). Noise obeyed would cut again and again, towards the floor. */
    cr_expect_geq(s.concurrency_limit, 4, "window %u of 8 at the end", s.concurrency_limit);
}

/* A TCP listener on a free port that completes handshakes (the kernel does)
 * and never reads or answers. Returns the port. */
static unsigned silent_listener(void)
{
    silent_fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(silent_fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(bind(silent_fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    cr_assert(listen(silent_fd, 64) == 0);
    socklen_t len = sizeof(a);
    cr_assert(getsockname(silent_fd, (struct sockaddr *)&a, &len) == 0);
    return ntohs(a.sin_port);
}

Test(fetch_policy_net, a_silent_server_fails_the_request_naming_the_endpoint)
{
    make_root();
    unsigned port = silent_listener();
    char endpoint[64], host[64];
    snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%u", port);
    snprintf(host, sizeof(host), "127.0.0.1:%u", port);
    struct sf_s3_options o;
    mock_env_s3_options(&o, endpoint);
    /* on_progress looks once a second while nothing moves */
    o.first_byte_timeout_ms = 1000;
    o.request_timeout_ms = 3500;
    o.retry_base_ms = 5;
    char err[512] = "";
    cr_assert_eq(sf_s3_new(&o, &s3, err, sizeof(err)), SF_OK, "%s", err);
    struct sf_fetch *f = NULL;
    cr_assert_eq(sf_fetch_start(s3, "s3://bucket/quiet/k.bin", NULL, &f), SF_OK);
    struct sf_fetch_progress p;
    sf_status st = sf_fetch_wait(f, ~0ull, -1, &p);
    const char *m = sf_fetch_errmsg(f);
    cr_expect_eq(st, SF_ERR_TIMEOUT, "%s: %s", sf_status_name(st), m);
    cr_expect(strstr(m, host), "the endpoint is not named: %s", m);
    cr_expect(strstr(m, "s3://bucket/quiet/k.bin"), "the object is not named: %s", m);
    cr_expect(strstr(m, "no answer"), "message: %s", m);
    cr_expect(strstr(m, "request_timeout_ms"), "the budget, not another limit, ended it: %s", m);
    /* the first-byte timeout retried within the budget */
    cr_expect_geq(p.requests, 2, "%u attempts", p.requests);
    cr_expect_leq(p.requests, 4, "%u attempts", p.requests);
    sf_fetch_destroy(f);
}

Test(fetch_policy_net, cli_get_from_a_silent_server_exits_1_naming_the_endpoint)
{
    make_root();
    unsigned port = silent_listener();
    char endpoint[64], host[64], errpath[700], out[700];
    snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%u", port);
    snprintf(host, sizeof(host), "127.0.0.1:%u", port);
    snprintf(errpath, sizeof(errpath), "%s/get.err", tmp);
    snprintf(out, sizeof(out), "%s/k.bin", tmp);
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    const char *argv[] = {SF_CLI_BIN, "get", "--endpoint-url", endpoint, "--first-byte-timeout-ms",
                          "1000", "--request-timeout-ms", "2500", "s3://bucket/k.bin", "-o", out,
                          NULL};
    int rc = test_run(argv, NULL, errpath);
    cr_assert(rc >= 0 && rc < 128, "status %d", rc);
    cr_expect_eq(rc, 1);
    char msg[4096] = "";
    FILE *fp = fopen(errpath, "rb");
    cr_assert(fp);
    size_t k = fread(msg, 1, sizeof(msg) - 1, fp);
    msg[k] = '\0';
    fclose(fp);
    cr_expect(strstr(msg, host), "stderr does not name the endpoint: %s", msg);
    cr_expect(strstr(msg, "s3://bucket/k.bin"), "stderr does not name the object: %s", msg);
    cr_expect(strstr(msg, "SF_ERR_TIMEOUT"), "stderr: %s", msg);
}
