/*
 * The fetch engine's retry and throttling policy, apart from the HTTP
 * plumbing: how many requests may be in flight, how fast new ones may start,
 * whether and when a failed attempt is tried again, and the retry quota.
 * docs/transport.md explains the design; tests/test_fetch_policy.c drives it
 * with synthetic outcome sequences and a synthetic clock.
 *
 * It tells a rate limit from noise. Outcomes of requests started since the
 * last change of rate form a window; a throttling share over the cut
 * threshold means "slow down" (halve the window, pace at 0.7x the accepted
 * rate, then additive recovery). A moderate share is tested once: the rate
 * is cut, and if the share does not fall at the lower rate it is noise: the
 * old rate comes back, the share is remembered as the noise floor and later
 * throttling at that level is only retried, with short jittered back-off.
 * Once a limit is confirmed and the rate still capped, two throttled answers
 * at the current rate cut again whatever the share (congestion avoidance:
 * every rank sharing the limit decreases, so AIMD converges to fair shares).
 *
 * Slow start (start_rps > 0): a new policy caps its request rate at
 * start_rps (half the window may start at once) and adds a few requests/s
 * per success, doubling in a fraction of a second, until the cap would no
 * longer bind. Its first 2 throttled answers start a descent: the rate and
 * window halve, and halve again on every throttled answer among the first
 * 4 after a halving (over a limit by k, about log2 k halvings of a few
 * answers each, not the share rule's dozen per rank). The answers during
 * descents are the evidence: at least 3 throttled, a third of the answers,
 * confirm a limit (congestion avoidance, below); otherwise the descent was
 * noise, the rate before it comes back and slow start goes on (6 descents
 * at most, then only the rules below). A descent never goes under 1/10 of
 * the lowest rate a descent of this policy began at, and two descents in a
 * row that each began soon after the rate came back (16 answers at the
 * restored rates in all) confirm a limit: throttling that falls with the
 * rate and returns with it. A limit confirmed during slow start lands the
 * rate at that floor at once, wherever the descent had got to.
 * Capped, the rate grows back faster the lower it is (75/rate requests/s
 * per second, within 1-20), so ranks sharing a limit converge.
 *
 * Threads: every function locks the policy, so several I/O threads may share
 * one; times are CLOCK_MONOTONIC nanoseconds given by the caller.
 */
#ifndef SF_S3_FETCH_POLICY_H
#define SF_S3_FETCH_POLICY_H

#include <pthread.h>
#include <stdint.h>

struct sf__policy_config {
    unsigned concurrency;      /* the in-flight window's ceiling */
    unsigned max_attempts;     /* per request, first try included */
    unsigned retry_base_ms;    /* back-off base: errors and throttling judged noise */
    unsigned throttle_base_ms; /* back-off base: throttling while the rate is cut */
    unsigned retry_cap_ms;
    unsigned retry_quota; /* client-wide retry tokens */
    /* Slow start: the request rate a new policy starts at, growing with
     * every success until the first throttling (0: no slow start, no cap). */
    double start_rps;
};

enum sf__outcome {
    SF__OUTCOME_OK = 0,
    SF__OUTCOME_ERROR,     /* transient: reset, 500, short body */
    SF__OUTCOME_TIMEOUT,   /* no answer in time (costs more quota) */
    SF__OUTCOME_THROTTLED, /* 503 SlowDown, 429 */
};

/* What an outcome changed. */
enum sf__verdict {
    SF__VERDICT_NONE = 0, /* nothing (a success, an error, an old request's answer) */
    SF__VERDICT_NOISE,    /* throttled, judged noise: the rate stays */
    SF__VERDICT_CUT,      /* rate limit: window halved, request rate capped */
    SF__VERDICT_PROBE,    /* moderate share: rate cut to see if the share falls */
    SF__VERDICT_CONFIRM,  /* the probe's share fell: the cut stays */
    SF__VERDICT_RESTORE,  /* the probe's share did not fall: noise, old rate back */
};

/* Why a failed attempt is not tried again (0: it is). */
enum sf__retry_refusal {
    SF__RETRY_OK = 0,
    SF__RETRY_MAX_ATTEMPTS,
    SF__RETRY_QUOTA,
};

#define SF__POLICY_SUCCESS_RING 4096

struct sf__policy {
    pthread_mutex_t lock;
    struct sf__policy_config cfg;
    /* everything below under lock */
    double cwnd;                  /* in-flight window */
    double send_rps;              /* request-rate cap, 0 = none */
    double bucket;                /* token bucket of send_rps */
    uint64_t bucket_ns;
    uint64_t first_ns;            /* start of the first attempt answered */
    uint64_t changed_ns;          /* last change of rate: older requests' answers do not count */
    /* the last SF__POLICY_WINDOW outcomes since changed_ns (1 = throttled),
     * and the totals since changed_ns */
    unsigned char win[100];
    unsigned win_n, win_pos, win_throttled;
    unsigned long long tot_n, tot_throttled;
    double noise_floor;           /* throttled share known not to fall with the rate */
    int limited;                  /* a limit was confirmed and the rate is still capped */
    /* slow start (ss): the cap grows with successes; its first throttled
     * answers start a descent (desc) that halves the rate while throttling
     * stays dense; desc_cuts counts its halvings, ss_tries the descents */
    int ss, desc;
    unsigned desc_cuts, ss_tries, desc_n, desc_thr;
    double desc_rps, desc_cwnd; /* the rate and window before the descent */
    double desc_low_rps;        /* the lowest rate a descent began at */
    /* slow start went on after a descent judged noise (restores counts
     * them); answers at the restored rate until the next descent, for the
     * last and the one before */
    unsigned restores_ss, ss_answers, ss_answers_prev;
    /* a probe in progress (probing), or when the last one ended */
    int probing;
    double probe_share, probe_cwnd, probe_rps;
    uint64_t probe_end_ns;
    unsigned tokens;
    uint64_t *successes; /* ring of success times, for the trailing-second rate */
    size_t succ_head, succ_count;
    uint64_t rng;
    /* counters, for tests and stats */
    unsigned long long cuts, probes, restores, noise;
};

/* Returns 0, or -1 when out of memory. seed 0 picks a fixed one. */
int sf__policy_init(struct sf__policy *p, const struct sf__policy_config *c, uint64_t seed);
void sf__policy_free(struct sf__policy *p);

/* The in-flight limit now (>= 1). */
unsigned sf__policy_window(struct sf__policy *p);
/* The request-rate cap now, requests/s; 0 = none. */
double sf__policy_rate(struct sf__policy *p);
unsigned sf__policy_tokens(struct sf__policy *p);
/* Times the rate was cut as a rate limit (probes that confirmed one included). */
unsigned long long sf__policy_cuts(struct sf__policy *p);

/* May one more request start now? Takes a token of the rate cap if so. */
int sf__policy_may_start(struct sf__policy *p, uint64_t now_ns);
/* Milliseconds until sf__policy_may_start() can say yes (0 = now), at most cap_ms. */
int sf__policy_wait_ms(struct sf__policy *p, uint64_t now_ns, int cap_ms);

/*
 * Records the outcome of an attempt started at start_ns. A success gives
 * back *tokens_held (the quota its retries took, or 1) and zeroes it. Returns
 * what the policy concluded.
 */
enum sf__verdict sf__policy_record(struct sf__policy *p, uint64_t now_ns, uint64_t start_ns,
                                   enum sf__outcome o, unsigned *tokens_held);

/*
 * Decides whether a request whose attempt number `attempts` failed with o is
 * tried again. If so takes the quota (adding it to *tokens_held) and sets
 * *delay_ms to a full-jitter back-off: uniform in [0, min(cap, base x 2^(attempts-1))]
 * with the throttling base while the rate is cut (verdict CUT/PROBE/CONFIRM or
 * a cap in force; not a slow start's cap, nor a descent before it confirms a
 * limit) and the short base otherwise.
 */
enum sf__retry_refusal sf__policy_retry(struct sf__policy *p, unsigned attempts,
                                        enum sf__outcome o, enum sf__verdict v,
                                        unsigned *tokens_held, uint64_t *delay_ms);

#endif
