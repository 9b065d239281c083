/* Terminal progress bar and plain progress lines for the CLI. */
#include "progress.h"
#include "common/clock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cli_progress {
    FILE *out;
    enum cli_progress_mode mode;
    char label[32];
    char items[16];
    double interval_s;
    double start, last_draw, last_sample;
    uint64_t last_bytes;
    double rate; /* bytes/s, smoothed */
    int drawn;   /* the bar line is on screen */
};

void cli_format_bytes(double b, char *out, size_t n)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t u = 0;
    while (b >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
        b /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(out, n, "%.0f B", b);
    else
        snprintf(out, n, "%.*f %s", b < 10 ? 2 : b < 100 ? 1 : 0, b, units[u]);
}

static void format_eta(double s, char *out, size_t n)
{
    if (s < 0 || s > 99 * 3600.0) {
        snprintf(out, n, "--:--");
        return;
    }
    unsigned long t = (unsigned long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, n, "%lu:%02lu", t / 60, t % 60);
}

struct cli_progress *cli_progress_new(FILE *out, enum cli_progress_mode mode, const char *label,
                                      const char *items, double interval_s)
{
    struct cli_progress *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->out = out;
    if (mode == CLI_PROGRESS_AUTO)
        mode = isatty(fileno(out)) ? CLI_PROGRESS_BAR : CLI_PROGRESS_LINES;
    p->mode = mode;
    snprintf(p->label, sizeof(p->label), "%s", label);
    snprintf(p->items, sizeof(p->items), "%s", items);
    p->interval_s = interval_s > 0 ? interval_s : 5.0;
    p->start = p->last_sample = sf__now_s();
    p->last_draw = p->start;
    return p;
}

static void draw(struct cli_progress *p, uint64_t bd, uint64_t bt, uint64_t id, uint64_t it,
                 double now)
{
    char done[32], total[32], rate[32], eta[48];
    cli_format_bytes((double)bd, done, sizeof(done));
    cli_format_bytes((double)bt, total, sizeof(total));
    cli_format_bytes(p->rate, rate, sizeof(rate));
    double left = bt > bd && p->rate > 0 ? (double)(bt - bd) / p->rate : (bt <= bd ? 0 : -1);
    format_eta(left, eta, sizeof(eta));
    double frac = bt ? (double)bd / (double)bt : (it ? (double)id / (double)it : 0);
    if (frac > 1)
        frac = 1;
    if (p->mode == CLI_PROGRESS_BAR) {
        char bar[31];
        size_t fill = (size_t)(frac * 30.0);
        memset(bar, '#', fill);
        memset(bar + fill, '.', 30 - fill);
        bar[30] = 0;
        fprintf(p->out, "\r%s [%s] %3.0f%% %s/%s %s/s ETA %s %s %llu/%llu\x1b[K", p->label, bar,
                frac * 100, done, total, rate, eta, p->items, (unsigned long long)id,
                (unsigned long long)it);
        p->drawn = 1;
    } else {
        fprintf(p->out, "%s: %llu/%llu %s, %s of %s (%.0f%%), %s/s, ETA %s, %.0fs elapsed\n",
                p->label, (unsigned long long)id, (unsigned long long)it, p->items, done, total,
                frac * 100, rate, eta, now - p->start);
    }
    fflush(p->out);
}

void cli_progress_update(struct cli_progress *p, uint64_t bd, uint64_t bt, uint64_t id, uint64_t it)
{
    if (!p || p->mode == CLI_PROGRESS_OFF)
        return;
    double now = sf__now_s();
    double dt = now - p->last_sample;
    if (dt >= 0.25) {
        double inst = bd >= p->last_bytes ? (double)(bd - p->last_bytes) / dt : 0;
        /* Smooth over about two seconds so the ETA does not jump. */
        double a = dt / (dt + 2.0);
        p->rate = p->rate == 0 ? inst : p->rate + a * (inst - p->rate);
        p->last_sample = now;
        p->last_bytes = bd;
    }
    double every = p->mode == CLI_PROGRESS_BAR ? 0.1 : p->interval_s;
    if (now - p->last_draw < every)
        return;
    p->last_draw = now;
    draw(p, bd, bt, id, it, now);
}

void cli_progress_finish(struct cli_progress *p)
{
    if (!p)
        return;
    if (p->drawn) {
        fputc('\n', p->out);
        fflush(p->out);
    }
    free(p);
}
