/*
 * A small training-style consumer of the shardfeed loader, the program the
 * README demo runs:
 *
 *   train_loop [--epochs N] [--batch-size N] [--step-ms MS] [--size N]
 *              [--cache-dir DIR] [--device auto|host] [--json] URL...
 *
 * It opens a loader on the shards (s3:// URLs with AWS_ENDPOINT_URL and the
 * usual AWS variables, brace patterns, prefixes or local paths), and for each
 * batch runs a "training step": the mean colour of every image (a CUDA
 * kernel on the device batch when the build has CUDA and a GPU is present,
 * a loop over the host batch otherwise) feeds a nearest-class-mean
 * classifier that predicts each label before learning from it. Its running
 * accuracy climbs above chance when labels and pixels line up. --step-ms
 * adds simulated compute per batch, to see whether the loader keeps up
 * (consumer wait share near 0) with a model of that speed.
 *
 * Only the public API (shardfeed.h) is used.
 */
#include <shardfeed.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef TRAIN_LOOP_CUDA
int train_step_gpu(const void *device_normalized, void *copy_event, int device, size_t n,
                   unsigned width, unsigned height, int chw, float *means);
#endif

#define MAX_CLASSES 1000

struct model {
    double sum[MAX_CLASSES][3];
    double count[MAX_CLASSES];
    unsigned long long seen, correct;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Host step: per-image channel means of uint8 pixels, scaled like the
 * device's normalised values so both paths learn the same thing. */
static void means_on_host(const struct sf_batch *b, const float mean[3], const float std[3],
                          float *out)
{
    size_t hw = (size_t)b->width * b->height;
    for (size_t i = 0; i < b->size; i++) {
        const unsigned char *px = (const unsigned char *)b->images + i * b->image_bytes;
        for (int c = 0; c < 3; c++) {
            unsigned long long s = 0;
            for (size_t k = 0; k < hw; k++)
                s += b->layout == SF_LAYOUT_CHW ? px[c * hw + k] : px[k * 3 + c];
            out[i * 3 + c] = (float)(((double)s / (double)hw / 255.0 - mean[c]) / std[c]);
        }
    }
}

static void learn(struct model *m, const struct sf_batch *b, const float *means)
{
    for (size_t i = 0; i < b->size; i++) {
        int64_t y = b->labels[i];
        if (y < 0 || y >= MAX_CLASSES || (b->flags[i] & SF_SAMPLE_PAD))
            continue;
        /* predict: the nearest class mean seen so far */
        int best = -1;
        double bd = 0;
        for (int k = 0; k < MAX_CLASSES; k++) {
            if (m->count[k] == 0)
                continue;
            double d = 0;
            for (int c = 0; c < 3; c++) {
                double x = means[i * 3 + c] - m->sum[k][c] / m->count[k];
                d += x * x;
            }
            if (best < 0 || d < bd) {
                best = k;
                bd = d;
            }
        }
        m->seen++;
        m->correct += best == y;
        for (int c = 0; c < 3; c++)
            m->sum[y][c] += means[i * 3 + c];
        m->count[y] += 1;
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: train_loop [--epochs N] [--batch-size N] [--step-ms MS] [--size N]\n"
                    "                  [--cache-dir DIR] [--device auto|host] [--json] URL...\n");
}

int main(int argc, char **argv)
{
    struct sf_loader_options o;
    sf_loader_options_init_default(&o);
    unsigned epochs = 2;
    double step_ms = 0;
    int json = 0;
    const char **sources = calloc((size_t)argc, sizeof(*sources));
    size_t n_sources = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--epochs") && v) {
            epochs = (unsigned)strtoul(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--batch-size") && v) {
            o.batch_size = (unsigned)strtoul(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--size") && v) {
            o.image.width = o.image.height = (unsigned)strtoul(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--step-ms") && v) {
            step_ms = strtod(v, NULL);
            i++;
        } else if (!strcmp(a, "--cache-dir") && v) {
            o.cache.dir = v;
            i++;
        } else if (!strcmp(a, "--device") && v) {
            o.device = !strcmp(v, "host") ? SF_DEVICE_HOST : SF_DEVICE_AUTO;
            i++;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (a[0] == '-') {
            usage();
            free(sources);
            return 2;
        } else {
            sources[n_sources++] = a;
        }
    }
    if (!n_sources || epochs == 0) {
        usage();
        free(sources);
        return 2;
    }
    o.sources = sources;
    o.source_count = n_sources;
    o.sync_device = 0; /* the step waits on the copy event on its own stream */

    struct sf_loader *l;
    char err[1024];
    sf_status st = sf_loader_open(&o, &l, err, sizeof(err));
    if (st != SF_OK) {
        fprintf(stderr, "train_loop: %s\n", err);
        free(sources);
        return 1;
    }
    struct model *m = calloc(1, sizeof(*m));
    float *means = malloc((size_t)o.batch_size * 3 * sizeof(float));
    double t0 = now_s(), step_s = 0;
    unsigned long long images = 0;
    int on_gpu = 0;
    for (unsigned e = 0; e < epochs && st == SF_OK; e++) {
        if (e > 0)
            st = sf_loader_set_epoch(l, e);
        struct sf_batch b;
        while (st == SF_OK && (st = sf_loader_next(l, &b)) == SF_OK) {
            double s0 = now_s();
            int done = 0;
#ifdef TRAIN_LOOP_CUDA
            if (b.device_normalized) {
                if (train_step_gpu(b.device_normalized, b.cuda_event, b.cuda_device, b.size,
                                   b.width, b.height, b.layout == SF_LAYOUT_CHW, means) != 0) {
                    sf_loader_release(l, &b);
                    st = SF_ERR_INTERNAL;
                    break;
                }
                on_gpu = done = 1;
            }
#endif
            if (!done)
                means_on_host(&b, o.image.mean, o.image.std, means);
            learn(m, &b, means);
            if (step_ms > 0) {
                struct timespec ts = {0, (long)(step_ms * 1e6)};
                while (ts.tv_nsec >= 1000000000L) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000L;
                }
                nanosleep(&ts, NULL);
            }
            step_s += now_s() - s0;
            images += b.size;
            sf_loader_release(l, &b);
        }
        if (st == SF_END_OF_EPOCH)
            st = SF_OK; /* the end of the epoch; any other status is an error */
        if (!json && st == SF_OK)
            printf("epoch %u: %llu images so far, running accuracy %.1f %%\n", e, images,
                   m->seen ? 100.0 * (double)m->correct / (double)m->seen : 0.0);
    }
    double secs = now_s() - t0;
    /* The consumer's wait share is the starvation report's: time blocked in
     * sf_loader_next() over the time from the first sf_loader_next() on,
     * the number `shardfeed load` and the Python package show. */
    struct sf_loader_report rep;
    sf_loader_report(l, &rep);
    int rc = 0;
    if (st != SF_OK) {
        fprintf(stderr, "train_loop: %s\n", sf_loader_errmsg(l));
        rc = 1;
    }
    double acc = m->seen ? 100.0 * (double)m->correct / (double)m->seen : 0.0;
    if (json)
        printf("{\"images\": %llu, \"seconds\": %.3f, \"images_per_s\": %.1f, "
               "\"consumer_wait_share\": %.4f, \"accuracy_pct\": %.2f, \"step\": \"%s\"}\n",
               images, secs, (double)images / secs, rep.wait_share, acc,
               on_gpu ? "cuda" : "cpu");
    else
        printf("train_loop: %llu images in %.2f s (%.1f images/s), step on the %s, consumer "
               "waited %.1f %% of the time from its first batch request, accuracy %.1f %%\n",
               images, secs, (double)images / secs, on_gpu ? "GPU" : "CPU",
               100.0 * rep.wait_share, acc);
    sf_loader_close(l);
    free(means);
    free(m);
    free(sources);
    return rc;
}
