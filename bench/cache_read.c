/*
 * Reads cached shards through the public cache API, as a loader does: open
 * (a disk hit: map + verify every block's checksum), wait for all bytes,
 * sum one byte per 4 KiB page (so the data is really touched), close.
 * Prints MiB/s of the best of --rounds passes.
 *
 *   bench_cache_read --endpoint-url URL --cache-dir DIR [--rounds N] SOURCE
 *
 * SOURCE is what warm-cache was given (brace pattern, prefix, keys). Every
 * object must be cached: a miss is an error (the benchmark measures reads).
 */
#include "shardfeed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *dir = NULL, *source = NULL;
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--endpoint-url") && i + 1 < argc)
            endpoint = argv[++i];
        else if (!strcmp(argv[i], "--cache-dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else
            source = argv[i];
    }
    if (!endpoint || !dir || !source || rounds < 1) {
        fprintf(stderr, "usage: bench_cache_read --endpoint-url URL --cache-dir DIR "
                        "[--rounds N] SOURCE\n");
        return 2;
    }
    struct sf_s3_options so;
    sf_s3_options_init_default(&so);
    so.endpoint_url = endpoint;
    struct sf_s3 *s3;
    char err[1024];
    if (sf_s3_new(&so, &s3, err, sizeof(err)) != SF_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct sf_cache_options co;
    sf_cache_options_init_default(&co);
    co.dir = dir;
    struct sf_cache *c;
    if (sf_cache_new(&co, &c, err, sizeof(err)) != SF_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct sf_object_list *l;
    if (sf_s3_expand(s3, source, 0, &l) != SF_OK) {
        sf_s3_errmsg(s3, err, sizeof(err));
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double best = 1e300;
    unsigned long long bytes = 0, sum = 0;
    for (int r = 0; r < rounds; r++) {
        bytes = 0;
        double t0 = now_s();
        for (size_t i = 0; i < sf_object_list_count(l); i++) {
            struct sf_cache_object *o;
            if (sf_cache_open(c, s3, sf_object_list_get(l, i), &o) != SF_OK) {
                sf_cache_errmsg(c, err, sizeof(err));
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            struct sf_cache_object_progress p;
            if (sf_cache_object_wait(o, sf_cache_object_size(o), -1, &p) != SF_OK ||
                p.source == SF_CACHE_FROM_FETCH || p.source == SF_CACHE_FROM_PEER) {
                fprintf(stderr, "%s: not served from the cache\n", sf_object_list_get(l, i)->url);
                return 1;
            }
            const unsigned char *d = sf_cache_object_data(o);
            for (unsigned long long k = 0; k < p.size; k += 4096)
                sum += d[k];
            bytes += p.size;
            sf_cache_object_close(o);
        }
        double t = now_s() - t0;
        if (t < best)
            best = t;
    }
    printf("%.1f\n", (double)bytes / (1 << 20) / best);
    fprintf(stderr, "read %llu bytes per round, best %.4f s (checksum byte sum %llu)\n", bytes,
            best, sum);
    sf_object_list_destroy(l);
    sf_cache_destroy(c);
    sf_s3_destroy(s3);
    return 0;
}
