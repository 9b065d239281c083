/* The measuring parts of shardfeed doctor (doctor.c), shared with the
 * autotuner (tune.c). Internal (sf__). */
#ifndef SF_DOCTOR_H
#define SF_DOCTOR_H

#include "shardfeed.h"
#include "shardfeed_loader.h"

/* The sources listed, up to 64 MiB of the first shards held in memory and
 * parsed once (raw samples kept for decoding). o must outlive it. */
struct sf__doctor;
sf_status sf__doctor_open(const struct sf_loader_options *o, struct sf__doctor **out, char *err,
                          size_t err_len);
void sf__doctor_close(struct sf__doctor *d); /* NULL ok */

int sf__doctor_remote(const struct sf__doctor *d); /* 1: the shards are fetched over HTTP */
double sf__doctor_bytes_per_sample(const struct sf__doctor *d);
unsigned long long sf__doctor_mean_shard_bytes(const struct sf__doctor *d); /* 0: unknown */
/* Samples/s of `threads` decode threads for span_s (0 without raw samples). */
double sf__doctor_decode_rate(struct sf__doctor *d, unsigned threads, double span_s, sf_status *st,
                              char *err, size_t len);
/* MiB/s of ranged GETs into memory at this concurrency and chunk size (0:
 * the loader's) for span_s, read as the loader's reader would (in order:
 * mib_s) and received in any order (agg_mib_s, may be NULL); 0 for local
 * files. */
sf_status sf__doctor_fetch_rate(struct sf__doctor *d, unsigned concurrency,
                                unsigned long long chunk_bytes, double span_s, double *mib_s,
                                double *agg_mib_s, char *err, size_t len);

#endif
