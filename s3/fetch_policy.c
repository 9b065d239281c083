/*
 * Retry, back-off and throttling policy of the fetch engine (see
 * fetch_policy.h and docs/transport.md). No I/O: the engine reports outcomes
 * and asks for decisions.
 */
#include "s3/fetch_policy.h"

#include <stdlib.h>
#include <string.h>

#define NS_PER_S 1000000000ull
#define WIN ((unsigned)sizeof(((struct sf__policy *)0)->win))
/* Over the last WIN outcomes, at least CUT_MIN throttled and a share over
 * CUT_SHARE (or twice the noise floor + 5 points) is a rate limit: cut at
 * once. A limit throttling half the requests is seen in about 15 answers;
 * random 5 % noise crosses it in well under 1 run in 1,000 (binomial
 * simulation, docs/transport.md). */
#define CUT_SHARE 0.20
#define CUT_MIN   8u
/* A share over PROBE_SHARE (and PROBE_MARGIN over the noise floor) over at
 * least PROBE_MIN_N answers at this rate is tested: the rate is cut, and
 * PROBE_SAMPLES answers later the share must have fallen to PROBE_FALL of
 * what it was to confirm a limit. At most one probe per interval. */
#define PROBE_SHARE       0.08
#define PROBE_MARGIN      0.03
#define PROBE_MIN_N       200u
#define PROBE_SAMPLES     100u
#define PROBE_FALL        0.4
#define PROBE_INTERVAL_NS (10ull * NS_PER_S)
#define RATE_BETA  0.7 /* new rate cap = beta x the rate accepted in the last second */
/* Never slower than this while capped. The cap grows back each second by
 * RECOVER_RPS2 / its rate requests/s, kept within [RECOVER_MIN_RPS_PER_S,
 * RECOVER_MAX_RPS_PER_S] (or 5 % a second when that is more): a slow rank
 * grows faster than a fast one, so ranks sharing a limit converge to equal
 * rates between cuts, not only through them (an equal step for every rank,
 * 10/s per second before, kept start-up differences for the whole run of
 * bench/scale_sim.sh; docs/scale.md). At 25/s, the fair share of that bench,
 * the step is 3/s per second; 1/s per second from 75/s up, 5 % a second from
 * 200/s up. */
#define RATE_FLOOR_RPS        5.0
#define RECOVER_RPS2          75.0
#define RECOVER_MIN_RPS_PER_S 1.0
#define RECOVER_MAX_RPS_PER_S 20.0
#define RATE_UNLIMITED_RPS    5000.0
/* Slow start: the cap grows by SS_GAIN_RPS per success (e-folding in
 * 1/SS_GAIN_RPS s of successes) and is lifted at RATE_UNLIMITED_RPS.
 * SS_CUT_MIN throttled answers at the current rate start a descent, which
 * halves on a throttled answer among the first DESC_N after a halving;
 * DESC_EVIDENCE throttled answers, a third of those seen in descents,
 * confirm a limit. A descent of 5 % noise rarely sees 3 of 9 (and the
 * evidence adds up over at most SS_TRIES descents); over the limit of
 * bench/scale_sim.sh the share is 1/3-1/2, since answers to requests sent
 * before a halving count too (docs/transport.md, "Slow start"). */
#define SS_GAIN_RPS   5.0
#define SS_CUT_MIN    2u
#define DESC_N        4u
#define DESC_EVIDENCE 3u
#define SS_TRIES      6u
/* A descent never takes the rate under 1/DESC_FLOOR_DIV of the lowest rate
 * a descent of this engine started from (3-4 halvings), and a limit
 * confirmed during slow start lands the rate there at once (land()). Ranks
 * that start together all halve at once, each on its own throttled answers:
 * without a floor they landed at 1/8 to 1/32 of that rate, far under their
 * fair share and at different depths. */
#define DESC_FLOOR_DIV 10.0
/* After descents judged noise gave the rate back, two descents in a row
 * that started within RETRIGGER_N answers at the restored rate (both
 * together) confirm a limit: the throttling fell with the rate and came back
 * with it, twice. With 5 % noise the 4 throttled answers of two descents
 * fall within 16 answers with a probability of 0.7 % (binomial); a rank
 * sharing a limit whose own descents came late, when the others had already
 * slowed, sees them within 5-7 answers each, and without this rule went on
 * in slow start to several times its share (docs/scale.md). */
#define RETRIGGER_N 16u
/* Once a limit is confirmed and the rate capped, CAPPED_MIN throttled answers
 * at the current rate cut again whatever their share (see record()). */
#define CAPPED_MIN 2u

int sf__policy_init(struct sf__policy *p, const struct sf__policy_config *c, uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    p->cfg = *c;
    if (p->cfg.concurrency < 1)
        p->cfg.concurrency = 1;
    if (p->cfg.max_attempts < 1)
        p->cfg.max_attempts = 1;
    p->cwnd = p->cfg.concurrency;
    p->tokens = p->cfg.retry_quota;
    if (p->cfg.start_rps > 0) {
        p->ss = 1;
        p->send_rps = p->cfg.start_rps;
        /* half the window at once (a fetch's first ranges in parallel),
         * not a whole window into a prefix already at its limit */
        p->bucket = p->cfg.concurrency / 2.0 < 1 ? 1 : p->cfg.concurrency / 2.0;
    }
    p->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    p->successes = calloc(SF__POLICY_SUCCESS_RING, sizeof(*p->successes));
    if (!p->successes)
        return -1;
    pthread_mutex_init(&p->lock, NULL);
    return 0;
}

void sf__policy_free(struct sf__policy *p)
{
    if (!p->successes)
        return;
    free(p->successes);
    p->successes = NULL;
    pthread_mutex_destroy(&p->lock);
}

static uint64_t rng_next(struct sf__policy *p)
{
    /* xorshift64*: jitter only, not security */
    uint64_t x = p->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    p->rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static double window_floor(const struct sf__policy *p)
{
    double f = p->cfg.concurrency / 8.0;
    return f < 1 ? 1 : f;
}

unsigned sf__policy_window(struct sf__policy *p)
{
    pthread_mutex_lock(&p->lock);
    unsigned w = p->cwnd < 1 ? 1 : (unsigned)p->cwnd;
    pthread_mutex_unlock(&p->lock);
    return w;
}

double sf__policy_rate(struct sf__policy *p)
{
    pthread_mutex_lock(&p->lock);
    double r = p->send_rps;
    pthread_mutex_unlock(&p->lock);
    return r;
}

unsigned sf__policy_tokens(struct sf__policy *p)
{
    pthread_mutex_lock(&p->lock);
    unsigned t = p->tokens;
    pthread_mutex_unlock(&p->lock);
    return t;
}

unsigned long long sf__policy_cuts(struct sf__policy *p)
{
    pthread_mutex_lock(&p->lock);
    unsigned long long c = p->cuts;
    pthread_mutex_unlock(&p->lock);
    return c;
}

/* Successful answers in the last second (at most the ring). Under lock. */
static size_t successes_last_second(struct sf__policy *p, uint64_t now)
{
    while (p->succ_count > 0) {
        size_t oldest =
            (p->succ_head + SF__POLICY_SUCCESS_RING - p->succ_count) % SF__POLICY_SUCCESS_RING;
        if (now - p->successes[oldest] <= NS_PER_S)
            break;
        p->succ_count--;
    }
    return p->succ_count;
}

/* Refills the rate cap's bucket and lets the cap recover. Under lock. */
static void refill(struct sf__policy *p, uint64_t now)
{
    if (p->send_rps <= 0 || now <= p->bucket_ns)
        return;
    if (!p->bucket_ns) {
        p->bucket_ns = now; /* the first requests of a slow start */
        return;
    }
    double dt = (double)(now - p->bucket_ns) / 1e9;
    p->bucket_ns = now;
    double had = p->bucket;
    p->bucket += dt * p->send_rps;
    /* bursts of 100 ms of the rate; 20 ms while finding it */
    double cap = p->send_rps / (p->ss || p->desc ? 50 : 10);
    if (cap < 1)
        cap = 1;
    if (p->bucket > cap)
        p->bucket = had > cap ? had : cap; /* a slow start's first burst stays */
    if (p->ss || p->desc)
        return; /* the cap moves with answers, not time */
    double step = RECOVER_RPS2 / p->send_rps;
    if (step < RECOVER_MIN_RPS_PER_S)
        step = RECOVER_MIN_RPS_PER_S;
    if (step > RECOVER_MAX_RPS_PER_S)
        step = RECOVER_MAX_RPS_PER_S;
    if (p->send_rps * 0.05 > step)
        step = p->send_rps * 0.05;
    p->send_rps += dt * step;
    if (p->send_rps > RATE_UNLIMITED_RPS) {
        p->send_rps = 0;
        p->limited = 0;
    }
}

int sf__policy_may_start(struct sf__policy *p, uint64_t now_ns)
{
    pthread_mutex_lock(&p->lock);
    int ok = 1;
    if (p->send_rps > 0) {
        refill(p, now_ns);
        if (p->send_rps > 0) {
            ok = p->bucket >= 1;
            if (ok)
                p->bucket -= 1;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return ok;
}

int sf__policy_wait_ms(struct sf__policy *p, uint64_t now_ns, int cap_ms)
{
    pthread_mutex_lock(&p->lock);
    int t = cap_ms;
    if (p->send_rps > 0) {
        refill(p, now_ns);
        if (p->send_rps > 0 && p->bucket < 1) {
            int ms = (int)((1 - p->bucket) / p->send_rps * 1000) + 1;
            t = ms < t ? ms : t;
        } else if (p->send_rps > 0) {
            t = 0;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return t;
}

/* A new rate: what was in flight before it no longer counts. Under lock. */
static void window_reset(struct sf__policy *p, uint64_t now)
{
    p->changed_ns = now;
    p->win_n = p->win_pos = p->win_throttled = 0;
    p->tot_n = p->tot_throttled = 0;
}

/* Halves the window and the rate cap (a descent's step). Under lock. */
static void halve(struct sf__policy *p, uint64_t now)
{
    double fl = window_floor(p);
    p->cwnd = p->cwnd / 2 < fl ? fl : p->cwnd / 2;
    p->send_rps = p->send_rps / 2 < RATE_FLOOR_RPS ? RATE_FLOOR_RPS : p->send_rps / 2;
    if (p->send_rps < p->desc_low_rps / DESC_FLOOR_DIV)
        p->send_rps = p->desc_low_rps / DESC_FLOOR_DIV;
    p->bucket = 0;
    p->bucket_ns = now;
    window_reset(p, now);
}

/*
 * A limit confirmed during slow start: the rate goes to the descents' floor
 * at once. Where a descent stops depends on when the other ranks sharing the
 * limit slowed: one whose descents came late saw little throttling, was
 * given its rate back, and was confirmed at 2-3x the others' rate (60/s
 * against 20-25 in bench_scale_model), a lead the capped recovery took the
 * whole run to undo. The floor depends only on the rate the engine's first
 * descent began at, which ranks that start together share. Under lock.
 */
static void land(struct sf__policy *p)
{
    double r = p->desc_low_rps / DESC_FLOOR_DIV;
    if (r < RATE_FLOOR_RPS)
        r = RATE_FLOOR_RPS;
    if (p->send_rps > r)
        p->send_rps = r;
}

/* Multiplicative decrease of the window and of the rate. Under lock. */
static void cut(struct sf__policy *p, uint64_t now)
{
    p->ss = p->desc = 0;
    double fl = window_floor(p);
    p->cwnd = p->cwnd / 2 < fl ? fl : p->cwnd / 2;
    /* The rank's own rate: successes per second over the last second, or
     * over its life when younger (ranks that start together but get their
     * first answers at different times then compare alike). */
    double measured = (double)successes_last_second(p, now);
    if (p->first_ns && now > p->first_ns && now - p->first_ns < NS_PER_S)
        measured = measured * 1e9 / (double)(now - p->first_ns);
    if (p->send_rps > 0 && p->send_rps < measured)
        measured = p->send_rps;
    /* With no success in the last second there is no rate to cap at: the
     * halved window and the back-off do the work. */
    if (measured > 0 || p->send_rps > 0) {
        double rps = RATE_BETA * measured;
        p->send_rps = rps < RATE_FLOOR_RPS ? RATE_FLOOR_RPS : rps;
        p->bucket = 0;
        p->bucket_ns = now;
    }
    window_reset(p, now);
}

enum sf__verdict sf__policy_record(struct sf__policy *p, uint64_t now_ns, uint64_t start_ns,
                                   enum sf__outcome o, unsigned *tokens_held)
{
    pthread_mutex_lock(&p->lock);
    if (!p->first_ns)
        p->first_ns = start_ns ? start_ns : 1;
    if (o == SF__OUTCOME_OK) {
        unsigned refund = tokens_held && *tokens_held ? *tokens_held : 1;
        p->tokens =
            p->tokens + refund > p->cfg.retry_quota ? p->cfg.retry_quota : p->tokens + refund;
        if (tokens_held)
            *tokens_held = 0;
        p->successes[p->succ_head] = now_ns;
        p->succ_head = (p->succ_head + 1) % SF__POLICY_SUCCESS_RING;
        if (p->succ_count < SF__POLICY_SUCCESS_RING)
            p->succ_count++;
        if (p->ss) {
            p->send_rps += SS_GAIN_RPS;
            if (p->send_rps >= RATE_UNLIMITED_RPS) {
                p->ss = 0;
                p->send_rps = 0;
            }
        }
        /* additive recovery of the window: one per window of successes */
        if (p->cwnd < p->cfg.concurrency) {
            p->cwnd += 1.0 / p->cwnd;
            if (p->cwnd > p->cfg.concurrency)
                p->cwnd = p->cfg.concurrency;
        }
    }
    enum sf__verdict v = SF__VERDICT_NONE;
    unsigned thr = o == SF__OUTCOME_THROTTLED;
    if (p->desc) {
        /* Every answer since the descent began is evidence, those of
         * requests sent before it included: over a limit they are mostly
         * throttled, with 5 % noise 4 of about 8 almost never are. */
        p->desc_n++;
        p->desc_thr += thr;
        if (!p->limited && p->desc_thr >= DESC_EVIDENCE && 3 * p->desc_thr >= p->desc_n) {
            p->limited = 1;
            p->cuts++;
            v = SF__VERDICT_CONFIRM;
            land(p);
        }
    }
    if (start_ns < p->changed_ns) {
        /* sent at the old rate: says nothing about this one */
        pthread_mutex_unlock(&p->lock);
        return v;
    }
    if (p->win_n == WIN)
        p->win_throttled -= p->win[p->win_pos];
    else
        p->win_n++;
    p->win[p->win_pos] = (unsigned char)thr;
    p->win_pos = (p->win_pos + 1) % WIN;
    p->win_throttled += thr;
    p->tot_n++;
    p->tot_throttled += thr;
    double cut_share = p->noise_floor * 2 + 0.05;
    if (cut_share < CUT_SHARE)
        cut_share = CUT_SHARE;
    int limit = thr && p->win_throttled >= CUT_MIN &&
                (double)p->win_throttled > cut_share * (p->win_n > 60 ? p->win_n : 60);
    /* Capped after a confirmed limit, the rank is in congestion avoidance:
     * throttling at the current rate means the shared limit is exceeded
     * again, whatever the share. Every sender must decrease on it for AIMD
     * to converge to fair shares; at a few per cent over a limit the share
     * alone looks like noise. */
    if (thr && !limit && p->limited && p->send_rps > 0 && !p->probing &&
        p->tot_throttled >= CAPPED_MIN)
        limit = 1;
    double tot_share = (double)p->tot_throttled / (double)p->tot_n;

    if (p->desc) {
        if (thr && p->tot_n <= DESC_N) {
            /* still dense after a halving: still over the limit */
            halve(p, now_ns);
            p->desc_cuts++;
            if (p->limited)
                p->cuts++;
            v = SF__VERDICT_CUT;
        } else if (p->tot_n >= DESC_N) {
            p->desc = 0;
            if (!p->limited) {
                /* too little evidence of a limit: noise as likely; slow
                 * start resumes from here (and meets a limit again soon if
                 * there is one) */
                p->ss = 1;
                p->restores_ss++;
                p->ss_answers = 0;
                p->send_rps = p->desc_rps;
                p->cwnd = p->desc_cwnd;
                p->bucket = 0;
                p->bucket_ns = now_ns;
                window_reset(p, now_ns);
                v = SF__VERDICT_RESTORE;
            }
        }
        pthread_mutex_unlock(&p->lock);
        return v;
    }
    if (p->ss)
        p->ss_answers++;
    if (p->ss && !limit && p->ss_tries < SS_TRIES && !p->probing) {
        if (thr && p->tot_throttled >= SS_CUT_MIN) {
            v = SF__VERDICT_PROBE;
            if (p->restores_ss >= 2 && p->ss_answers + p->ss_answers_prev <= RETRIGGER_N &&
                !p->limited) {
                /* back as soon as the rate was: a limit; this descent
                 * only finds the rate under it */
                p->limited = 1;
                p->cuts++;
                v = SF__VERDICT_CONFIRM;
            }
            p->ss_answers_prev = p->ss_answers;
            p->ss = 0;
            p->desc = 1;
            p->desc_cuts = 1;
            p->desc_rps = p->send_rps;
            if (p->desc_low_rps <= 0 || p->send_rps < p->desc_low_rps)
                p->desc_low_rps = p->send_rps;
            p->desc_cwnd = p->cwnd;
            p->ss_tries++;
            p->probes++;
            halve(p, now_ns);
            if (v == SF__VERDICT_CONFIRM)
                land(p);
        } else if (thr) {
            p->noise++;
            v = SF__VERDICT_NOISE;
        }
        pthread_mutex_unlock(&p->lock);
        return v;
    }

    if (limit) {
        /* clearly limited, at this rate or at a probe's lower one */
        if (p->probing) {
            p->probing = 0;
            p->probe_end_ns = now_ns;
        }
        p->cuts++;
        p->limited = 1;
        cut(p, now_ns);
        v = SF__VERDICT_CUT;
    } else if (p->probing) {
        if (p->tot_n >= PROBE_SAMPLES) {
            p->probing = 0;
            p->probe_end_ns = now_ns;
            if (tot_share <= p->probe_share * PROBE_FALL) {
                p->cuts++;
                p->limited = 1;
                v = SF__VERDICT_CONFIRM;
            } else {
                /* the share did not fall with the rate: noise */
                /* two estimates of the same noise, at two rates */
                double floor = (tot_share + p->probe_share) / 2;
                if (floor > p->noise_floor)
                    p->noise_floor = floor;
                p->cwnd = p->probe_cwnd;
                p->send_rps = p->probe_rps;
                p->bucket = 0;
                p->bucket_ns = now_ns;
                p->restores++;
                window_reset(p, now_ns);
                v = SF__VERDICT_RESTORE;
            }
        } else if (thr) {
            p->noise++;
            v = SF__VERDICT_NOISE;
        }
    } else if (thr) {
        double probe_at = p->noise_floor + PROBE_MARGIN;
        if (probe_at < PROBE_SHARE)
            probe_at = PROBE_SHARE;
        if (p->tot_n >= PROBE_MIN_N && tot_share > probe_at &&
            (p->probe_end_ns == 0 || now_ns - p->probe_end_ns >= PROBE_INTERVAL_NS)) {
            p->probe_share = tot_share;
            p->probe_cwnd = p->cwnd;
            p->probe_rps = p->send_rps;
            p->probing = 1;
            p->probes++;
            cut(p, now_ns);
            v = SF__VERDICT_PROBE;
        } else {
            p->noise++;
            v = SF__VERDICT_NOISE;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return v;
}

enum sf__retry_refusal sf__policy_retry(struct sf__policy *p, unsigned attempts,
                                        enum sf__outcome o, enum sf__verdict v,
                                        unsigned *tokens_held, uint64_t *delay_ms)
{
    *delay_ms = 0;
    if (attempts >= p->cfg.max_attempts)
        return SF__RETRY_MAX_ATTEMPTS;
    unsigned cost = o == SF__OUTCOME_TIMEOUT ? 10 : 5;
    pthread_mutex_lock(&p->lock);
    if (p->tokens < cost) {
        pthread_mutex_unlock(&p->lock);
        return SF__RETRY_QUOTA;
    }
    p->tokens -= cost;
    *tokens_held += cost;
    /* The long throttling back-off only while the server is judged to be
     * limiting us; noise is retried as soon as any transient error. A slow
     * start's cap and a descent not yet judged are no such judgement: with
     * them, 5 % noise on 2,000 small GETs took 3-4x as long (the retries'
     * back-off was the tail); docs/transport.md. */
    int judging = (p->ss || p->desc) && !p->limited;
    int limited = o == SF__OUTCOME_THROTTLED && !judging &&
                  (v == SF__VERDICT_CUT || v == SF__VERDICT_CONFIRM ||
                   (p->send_rps > 0 && !p->probing));
    unsigned base = limited ? p->cfg.throttle_base_ms : p->cfg.retry_base_ms;
    unsigned shift = attempts - 1 < 30 ? attempts - 1 : 30;
    uint64_t ceiling = (uint64_t)base << shift;
    if (ceiling > p->cfg.retry_cap_ms)
        ceiling = p->cfg.retry_cap_ms;
    *delay_ms = ceiling ? rng_next(p) % (ceiling + 1) : 0;
    pthread_mutex_unlock(&p->lock);
    return SF__RETRY_OK;
}
