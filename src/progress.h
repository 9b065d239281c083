/*
 * Progress display for long CLI commands (warm-cache, pack): a redrawn bar on
 * a terminal, plain periodic lines otherwise. Written to stderr so stdout
 * stays machine-readable. Not thread-safe: call from one thread.
 */
#ifndef SF_CLI_PROGRESS_H
#define SF_CLI_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

struct cli_progress;

enum cli_progress_mode {
    CLI_PROGRESS_AUTO = -1, /* bar if the stream is a terminal, else lines */
    CLI_PROGRESS_OFF = 0,
    CLI_PROGRESS_LINES = 1,
    CLI_PROGRESS_BAR = 2,
};

/*
 * label: a word shown first ("warm-cache"); items: what items are called
 * ("shards"). interval_s: seconds between plain lines (the bar redraws every
 * 0.1 s). Returns NULL only when out of memory.
 */
struct cli_progress *cli_progress_new(FILE *out, enum cli_progress_mode mode, const char *label,
                                      const char *items, double interval_s);

/* Reports the totals so far; draws when due. Totals may grow. */
void cli_progress_update(struct cli_progress *p, uint64_t bytes_done, uint64_t bytes_total,
                         uint64_t items_done, uint64_t items_total);

/* Ends the bar's line (the caller prints its own summary). Accepts NULL. */
void cli_progress_finish(struct cli_progress *p);

/* "1.50 GiB" style, into out. */
void cli_format_bytes(double bytes, char *out, size_t n);

#endif
