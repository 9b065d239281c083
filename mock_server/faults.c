#include "mock_server/faults.h"
#include "common/clock.h"
#include "common/random.h"
#include "common/strbuf.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RULES  64
#define MAX_QUEUED 256
#define PREFIX_MAX 512

struct rule {
    char prefix[PREFIX_MAX];
    int latency_ms;
    uint64_t bandwidth;
    double p500, p503, reset, stall, no206, no_content_range;
    int stall_ms;
    long etag_change_after; /* -1 = off */
    double rate_limit;      /* requests/s, 0 = off */
    /* token bucket of the rate limit */
    double tokens;
    double last_refill;
};

struct queued {
    char prefix[PREFIX_MAX];
    char fault[64];
    unsigned remaining;
};

/* Open-addressing map from a 64-bit hash to a request counter. */
struct counter_map {
    uint64_t *keys; /* 0 = empty slot */
    uint32_t *counts;
    size_t cap, n;
};

struct mock_faults {
    uint64_t seed;
    pthread_mutex_t lock; /* guards everything below */
    struct rule rules[MAX_RULES];
    size_t n_rules;
    struct queued queue[MAX_QUEUED];
    size_t n_queued;
    struct counter_map attempts;  /* (key, range) -> requests so far */
    struct counter_map key_reads; /* key -> GET/HEAD count, for etag_change_after */
};

static uint64_t fnv1a(const char *s, uint64_t h)
{
    for (; s && *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint32_t counter_bump(struct counter_map *m, uint64_t key)
{
    if (key == 0)
        key = 1;
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        uint64_t *keys = calloc(cap, sizeof(*keys));
        uint32_t *counts = calloc(cap, sizeof(*counts));
        if (!keys || !counts) {
            free(keys);
            free(counts);
            return 0; /* counting is best effort under memory pressure */
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i])
                continue;
            size_t j = (size_t)(m->keys[i] % cap);
            while (keys[j])
                j = (j + 1) % cap;
            keys[j] = m->keys[i];
            counts[j] = m->counts[i];
        }
        free(m->keys);
        free(m->counts);
        m->keys = keys;
        m->counts = counts;
        m->cap = cap;
    }
    size_t j = (size_t)(key % m->cap);
    while (m->keys[j] && m->keys[j] != key)
        j = (j + 1) % m->cap;
    if (!m->keys[j]) {
        m->keys[j] = key;
        m->n++;
    }
    return m->counts[j]++;
}

static void counter_free(struct counter_map *m)
{
    free(m->keys);
    free(m->counts);
    memset(m, 0, sizeof(*m));
}

sf_status mock_faults_new(uint64_t seed, struct mock_faults **out)
{
    struct mock_faults *f = calloc(1, sizeof(*f));
    if (!f)
        return SF_ERR_NO_MEMORY;
    f->seed = seed;
    pthread_mutex_init(&f->lock, NULL);
    *out = f;
    return SF_OK;
}

void mock_faults_destroy(struct mock_faults *f)
{
    if (!f)
        return;
    counter_free(&f->attempts);
    counter_free(&f->key_reads);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

sf_status mock_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return SF_ERR_PARSE;
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        end++;
        break;
    default: break;
    }
    if (*end == 'i' && mult > 1)
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v * mult > 1e18)
        return SF_ERR_PARSE;
    *out = (uint64_t)(v * mult);
    return SF_OK;
}

static int parse_prob(const char *v, double *out)
{
    char *end;
    double p = strtod(v, &end);
    if (end == v || *end != '\0' || !(p >= 0.0 && p <= 1.0))
        return -1;
    *out = p;
    return 0;
}

static int parse_long(const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno || x < lo || x > hi)
        return -1;
    *out = x;
    return 0;
}

/* A burst below one request would refuse everything forever. */
static double rule_burst(const struct rule *r)
{
    return r->rate_limit > 1.0 ? r->rate_limit : 1.0;
}

static sf_status parse_rule(const char *spec, struct rule *r, char *err, size_t err_len)
{
    memset(r, 0, sizeof(*r));
    r->stall_ms = 60000;
    r->etag_change_after = -1;
    char *copy = strdup(spec);
    if (!copy)
        return SF_ERR_NO_MEMORY;
    sf_status rc = SF_OK;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        if (!*item)
            continue;
        char *eq = strchr(item, '=');
        if (!eq) {
            rc = sf__fail(err, err_len, SF_ERR_PARSE, "fault rule item '%s' is not name=value",
                          item);
            break;
        }
        *eq = '\0';
        const char *name = item, *v = eq + 1;
        long l = 0;
        int bad = 0;
        if (strcmp(name, "prefix") == 0) {
            if (strlen(v) >= PREFIX_MAX)
                bad = 1;
            else
                memcpy(r->prefix, v, strlen(v) + 1);
        } else if (strcmp(name, "latency_ms") == 0) {
            bad = parse_long(v, 0, 600000, &l);
            r->latency_ms = (int)l;
        } else if (strcmp(name, "bandwidth") == 0) {
            bad = mock_parse_size(v, &r->bandwidth) != SF_OK || r->bandwidth == 0;
        } else if (strcmp(name, "p500") == 0) {
            bad = parse_prob(v, &r->p500);
        } else if (strcmp(name, "p503") == 0) {
            bad = parse_prob(v, &r->p503);
        } else if (strcmp(name, "reset") == 0) {
            bad = parse_prob(v, &r->reset);
        } else if (strcmp(name, "stall") == 0) {
            bad = parse_prob(v, &r->stall);
        } else if (strcmp(name, "stall_ms") == 0) {
            bad = parse_long(v, 0, 3600000, &l);
            r->stall_ms = (int)l;
        } else if (strcmp(name, "no206") == 0) {
            bad = parse_prob(v, &r->no206);
        } else if (strcmp(name, "no_content_range") == 0) {
            bad = parse_prob(v, &r->no_content_range);
        } else if (strcmp(name, "etag_change_after") == 0) {
            bad = parse_long(v, 0, 1000000000L, &l);
            r->etag_change_after = l;
        } else if (strcmp(name, "rate_limit") == 0) {
            char *end;
            r->rate_limit = strtod(v, &end);
            bad = end == v || *end != '\0' || !isfinite(r->rate_limit) || !(r->rate_limit > 0);
            r->tokens = rule_burst(r);
        } else {
            rc = sf__fail(err, err_len, SF_ERR_PARSE, "unknown fault rule field '%s'", name);
            break;
        }
        if (bad) {
            rc = sf__fail(err, err_len, SF_ERR_PARSE, "bad value '%s' for fault rule field '%s'", v,
                          name);
            break;
        }
    }
    free(copy);
    r->last_refill = sf__now_s();
    return rc;
}

sf_status mock_faults_add_rule(struct mock_faults *f, const char *spec, char *err, size_t err_len)
{
    struct rule r;
    sf_status rc = parse_rule(spec, &r, err, err_len);
    if (rc != SF_OK)
        return rc;
    pthread_mutex_lock(&f->lock);
    if (f->n_rules == MAX_RULES) {
        pthread_mutex_unlock(&f->lock);
        return sf__fail(err, err_len, SF_ERR_LIMIT, "too many fault rules (max %d)", MAX_RULES);
    }
    f->rules[f->n_rules++] = r;
    pthread_mutex_unlock(&f->lock);
    return SF_OK;
}

sf_status mock_faults_set_rules(struct mock_faults *f, const char *text, char *err, size_t err_len)
{
    struct rule *rules = calloc(MAX_RULES, sizeof(*rules));
    char *copy = strdup(text);
    sf_status rc = SF_OK;
    size_t n = 0;
    if (!rules || !copy) {
        rc = SF_ERR_NO_MEMORY;
        goto out;
    }
    char *save = NULL;
    for (char *line = strtok_r(copy, "\r\n", &save); line; line = strtok_r(NULL, "\r\n", &save)) {
        while (*line == ' ' || *line == '\t')
            line++;
        if (!*line || *line == '#')
            continue;
        if (n == MAX_RULES) {
            rc = sf__fail(err, err_len, SF_ERR_LIMIT, "too many fault rules (max %d)", MAX_RULES);
            goto out;
        }
        rc = parse_rule(line, &rules[n], err, err_len);
        if (rc != SF_OK)
            goto out;
        n++;
    }
    pthread_mutex_lock(&f->lock);
    memcpy(f->rules, rules, n * sizeof(*rules));
    f->n_rules = n;
    pthread_mutex_unlock(&f->lock);
out:
    free(copy);
    free(rules);
    return rc;
}

char *mock_faults_describe(struct mock_faults *f)
{
    size_t cap = 256 + MAX_RULES * (PREFIX_MAX + 320);
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t len = 0;
    out[0] = '\0';
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->n_rules; i++) {
        const struct rule *r = &f->rules[i];
        int n = snprintf(out + len, cap - len,
                         "prefix=%s,latency_ms=%d,bandwidth=%llu,p500=%g,p503=%g,reset=%g,"
                         "stall=%g,stall_ms=%d,no206=%g,no_content_range=%g,"
                         "etag_change_after=%ld,rate_limit=%g\n",
                         r->prefix, r->latency_ms, (unsigned long long)r->bandwidth, r->p500,
                         r->p503, r->reset, r->stall, r->stall_ms, r->no206, r->no_content_range,
                         r->etag_change_after, r->rate_limit);
        if (n < 0 || (size_t)n >= cap - len)
            break;
        len += (size_t)n;
    }
    pthread_mutex_unlock(&f->lock);
    return out;
}

sf_status mock_fault_apply_forced(struct mock_fault_plan *plan, const char *fault,
                                  uint64_t body_len)
{
    long v = 0;
    if (strcmp(fault, "500") == 0) {
        plan->status = 500;
    } else if (strcmp(fault, "503") == 0) {
        plan->status = 503;
    } else if (strcmp(fault, "400") == 0) {
        plan->status = 400;
    } else if (strcmp(fault, "no206") == 0) {
        plan->no206 = 1;
    } else if (strcmp(fault, "no_content_range") == 0) {
        plan->no_content_range = 1;
    } else if (strcmp(fault, "etag_changed") == 0) {
        plan->etag_changed = 1;
    } else if (strncmp(fault, "reset=", 6) == 0) {
        if (parse_long(fault + 6, 0, 0x7fffffffL, &v))
            return SF_ERR_PARSE;
        plan->reset_at = v;
    } else if (strncmp(fault, "stall=", 6) == 0) {
        if (parse_long(fault + 6, 0, 3600000, &v))
            return SF_ERR_PARSE;
        plan->stall_ms = (int)v;
        plan->stall_at = (int64_t)(body_len / 2);
    } else if (strncmp(fault, "latency=", 8) == 0) {
        if (parse_long(fault + 8, 0, 600000, &v))
            return SF_ERR_PARSE;
        plan->latency_ms = (int)v;
    } else {
        return SF_ERR_PARSE;
    }
    return SF_OK;
}

static sf_status apply_forced_list(struct mock_fault_plan *plan, const char *list,
                                   uint64_t body_len, char *err, size_t err_len)
{
    char buf[512];
    size_t n = strlen(list);
    if (n >= sizeof(buf))
        return sf__fail(err, err_len, SF_ERR_PARSE, "x-sfmock-fault header too long");
    memcpy(buf, list, n + 1);
    char *save = NULL;
    for (char *item = strtok_r(buf, ";, ", &save); item; item = strtok_r(NULL, ";, ", &save)) {
        if (mock_fault_apply_forced(plan, item, body_len) != SF_OK)
            return sf__fail(err, err_len, SF_ERR_PARSE, "unknown forced fault '%s'", item);
    }
    return SF_OK;
}

sf_status mock_faults_queue(struct mock_faults *f, const char *prefix, const char *fault,
                            unsigned count, char *err, size_t err_len)
{
    struct mock_fault_plan probe = {.reset_at = -1, .stall_at = -1};
    if (strlen(prefix) >= PREFIX_MAX || strlen(fault) >= sizeof(f->queue[0].fault) ||
        mock_fault_apply_forced(&probe, fault, 0) != SF_OK) {
        return sf__fail(err, err_len, SF_ERR_PARSE, "bad queued fault '%s' for prefix '%s'", fault,
                        prefix);
    }
    pthread_mutex_lock(&f->lock);
    if (f->n_queued == MAX_QUEUED) {
        pthread_mutex_unlock(&f->lock);
        return sf__fail(err, err_len, SF_ERR_LIMIT, "too many queued faults (max %d)", MAX_QUEUED);
    }
    struct queued *q = &f->queue[f->n_queued++];
    memcpy(q->prefix, prefix, strlen(prefix) + 1);
    memcpy(q->fault, fault, strlen(fault) + 1);
    q->remaining = count;
    pthread_mutex_unlock(&f->lock);
    return SF_OK;
}

/* Faults only a GET may use up: body faults, and a 400 (which a PUT may
 * use too), whose S3 error code a HEAD's answer cannot carry. */
static int is_body_fault(const char *fault)
{
    return strcmp(fault, "400") == 0 || strncmp(fault, "reset=", 6) == 0 ||
           strncmp(fault, "stall=", 6) == 0 || strcmp(fault, "no206") == 0 ||
           strcmp(fault, "no_content_range") == 0;
}

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

sf_status mock_faults_plan(struct mock_faults *f, const char *target, const char *range,
                           const char *forced, enum mock_op_kind op, uint64_t body_len,
                           struct mock_fault_plan *plan, char *err, size_t err_len)
{
    memset(plan, 0, sizeof(*plan));
    plan->reset_at = -1;
    plan->stall_at = -1;

    char queued_fault[64] = "";
    pthread_mutex_lock(&f->lock);
    /* Queued faults: first match wins, each use counts down. */
    int is_get = op == MOCK_OP_GET;
    for (size_t i = 0; i < f->n_queued; i++) {
        struct queued *q = &f->queue[i];
        /* A body fault waits for a GET: a HEAD must not use it up. A 400
         * may fail a PUT too (a part of a multipart upload). */
        if (!is_get && is_body_fault(q->fault) &&
            !(op == MOCK_OP_PUT && strcmp(q->fault, "400") == 0))
            continue;
        if (q->remaining && has_prefix(target, q->prefix)) {
            memcpy(queued_fault, q->fault, sizeof(queued_fault));
            if (--q->remaining == 0) {
                memmove(q, q + 1, (f->n_queued - i - 1) * sizeof(*q));
                f->n_queued--;
            }
            break;
        }
    }
    /* The longest matching prefix picks the rule. */
    struct rule *r = NULL;
    size_t best = 0;
    for (size_t i = 0; i < f->n_rules; i++) {
        size_t len = strlen(f->rules[i].prefix);
        if (has_prefix(target, f->rules[i].prefix) && (!r || len > best)) {
            r = &f->rules[i];
            best = len;
        }
    }
    if (r) {
        /* Decisions depend on (seed, key, range, attempt index) only. */
        /* Each operation has its own sequence, so PUTs and DELETEs do not
         * shift the faults that GETs of the same key see. */
        uint64_t h = fnv1a(target, 0xcbf29ce484222325ull);
        uint64_t hr = fnv1a(range ? range : "", h ^ (0x5bd1e995u * (uint64_t)(op + 1)));
        uint32_t attempt = counter_bump(&f->attempts, hr);
        uint64_t state = f->seed ^ hr ^ ((uint64_t)attempt * 0xD6E8FEB86659FD93ull);
        double u500 = sf__uniform01(&state), u503 = sf__uniform01(&state);
        double ureset = sf__uniform01(&state), ureset_at = sf__uniform01(&state);
        double ustall = sf__uniform01(&state), u206 = sf__uniform01(&state), ucr = sf__uniform01(&state);

        plan->latency_ms = r->latency_ms;
        if (u500 < r->p500)
            plan->status = 500;
        else if (u503 < r->p503)
            plan->status = 503;
        if (is_get) {
            plan->bandwidth = r->bandwidth;
            if (ureset < r->reset && body_len > 0)
                plan->reset_at = (int64_t)(ureset_at * (double)body_len);
            if (ustall < r->stall) {
                plan->stall_at = (int64_t)(body_len / 2);
                plan->stall_ms = r->stall_ms;
            }
            plan->no206 = u206 < r->no206;
            plan->no_content_range = ucr < r->no_content_range;
            if (r->rate_limit > 0 && plan->status == 0) {
                double now = sf__now_s();
                r->tokens += (now - r->last_refill) * r->rate_limit;
                if (r->tokens > rule_burst(r))
                    r->tokens = rule_burst(r);
                r->last_refill = now;
                if (r->tokens >= 1.0) {
                    r->tokens -= 1.0;
                } else {
                    plan->status = 503;
                    plan->throttled = 1;
                }
            }
        }
        if (r->etag_change_after >= 0 && (op == MOCK_OP_GET || op == MOCK_OP_HEAD)) {
            uint32_t reads = counter_bump(&f->key_reads, h);
            if ((long)reads >= r->etag_change_after)
                plan->etag_changed = 1;
        }
    }
    pthread_mutex_unlock(&f->lock);

    if (queued_fault[0] && mock_fault_apply_forced(plan, queued_fault, body_len) != SF_OK)
        return sf__fail(err, err_len, SF_ERR_PARSE, "bad queued fault '%s'", queued_fault);
    if (forced && *forced)
        return apply_forced_list(plan, forced, body_len, err, err_len);
    return SF_OK;
}
