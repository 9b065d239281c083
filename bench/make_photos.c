/*
 * Cuts ImageNet-like JPEGs out of a few real photographs: the sample dataset
 * of the demo and the loader benchmarks (scripts/make-sample-dataset.sh,
 * docs/sample-dataset.md).
 *
 *   sf_make_photos --out DIR --per-photo N [--seed S] [--quality Q] [--grain G]
 *                  [--jobs J] PHOTO.jpg...
 *
 * Each PHOTO is one class, named after its file name without the extension,
 * lower-cased (Storm.jpg -> storm). For each photo, N images: an output size
 * drawn from ImageNet's common ones (500x375 most often, 500x333, 375x500,
 * 500x500, ...), a window of that aspect ratio covering a random share of the
 * largest such window in the photo at a random position, a horizontal flip one
 * time in two, resized with a box filter (bilinear where the window is smaller
 * than the output), mild luma grain, encoded 4:2:0 at quality Q, written as
 * DIR/<class>/<class>_<nnnnn>.jpg. Image k of a class depends only on the seed,
 * the class name, k, the photo, Q and G: the same command gives the same bytes
 * (libjpeg-turbo's default accurate integer DCT is exact, SIMD or not),
 * whatever --jobs is. DIR is created and must be empty. Sources are checked
 * (readable JPEGs within the limits below) before anything is written.
 *
 * Prints one summary line on stdout (images, bytes, mean bytes, seconds).
 * Exit status: 0 done, 1 failed (the file is named on stderr), 2 bad usage.
 *
 * TurboJPEG 2 API (Debian 12 ships libjpeg-turbo 2.1.5, without tj3*).
 */
#include "common/random.h"

#include <turbojpeg.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

/* Untrusted-input limits for the source photos. */
#define MAX_SOURCE_BYTES  (256ull << 20)
#define MAX_SOURCE_SIDE   32768
#define MAX_SOURCE_PIXELS (128ull << 20)
#define MAX_PER_PHOTO     99999 /* five digits in the file names */
#define MAX_CLASS_NAME    128
#define MAX_JOBS          256
#define MAX_GRAIN         64

/* Tuned so the mean file is about ImageNet's (~110 KB) on the twelve
 * photographs of mate-backgrounds/nature (docs/sample-dataset.md). */
#define DEFAULT_QUALITY 97
#define DEFAULT_GRAIN   6

/* Output sizes and how often each is drawn (per 100), roughly ImageNet's
 * train set: most images have 500 pixels on the longer side. */
static const struct {
    unsigned w, h, weight;
} sizes[] = {
    {500, 375, 45}, {500, 333, 20}, {375, 500, 12}, {333, 500, 6},
    {500, 500, 6},  {500, 400, 4},  {500, 281, 4},  {400, 500, 3},
};

/* Smallest share of the largest window's area a window may have. */
#define MIN_AREA_SHARE 0.1

static const char *prog = "sf_make_photos";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------ random numbers */

/* The target sf_make_photos does not link libm: small helpers for the
 * non-negative values used here. */
static double dmin(double a, double b)
{
    return a < b ? a : b;
}

static double dmax(double a, double b)
{
    return a > b ? a : b;
}

static unsigned floor_u(double x)
{
    return (unsigned)x;
}

static unsigned ceil_u(double x)
{
    unsigned f = (unsigned)x;
    return (double)f < x ? f + 1 : f;
}

static unsigned round_u(double x)
{
    return (unsigned)(x + 0.5);
}

/* Newton's method from above; x in [0, 1]. */
static double sqrt_unit(double x)
{
    if (x <= 0)
        return 0;
    double r = 1.0;
    for (int i = 0; i < 60; i++) {
        double n = 0.5 * (r + x / r);
        if (n >= r)
            break;
        r = n;
    }
    return r;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001B3ull;
    return h;
}

/* ------------------------------------------------------------------ resize */

/* Source taps of one output coordinate along one axis. */
struct taps {
    unsigned first, count; /* source indices first .. first + count - 1 */
    unsigned weight_at;    /* index of the first weight in the axis' weight array */
};

struct axis {
    struct taps *taps; /* out entries */
    float *weights;
    unsigned out;
};

static void axis_free(struct axis *a)
{
    free(a->taps);
    free(a->weights);
    a->taps = NULL;
    a->weights = NULL;
}

/*
 * Weights that map the source span [start, start + len) onto out pixels:
 * a box filter (each output pixel averages the source area it covers, by
 * overlap) when shrinking, bilinear when enlarging. flip reverses the output.
 */
static int axis_init(struct axis *a, unsigned start, unsigned len, unsigned out, int flip)
{
    double r = (double)len / out;
    unsigned max_taps = r > 1.0 ? ceil_u(r) + 1 : 2;
    a->out = out;
    a->taps = calloc(out, sizeof(*a->taps));
    a->weights = calloc((size_t)out * max_taps, sizeof(*a->weights));
    if (!a->taps || !a->weights) {
        axis_free(a);
        return -1;
    }
    for (unsigned i = 0; i < out; i++) {
        struct taps *t = &a->taps[flip ? out - 1 - i : i];
        float *w = a->weights + (size_t)i * max_taps;
        t->weight_at = i * max_taps;
        if (r > 1.0) {
            double lo = i * r, hi = (i + 1) * r;
            unsigned j0 = floor_u(lo), j1 = ceil_u(hi);
            if (j1 > len)
                j1 = len;
            t->first = start + j0;
            t->count = 0;
            for (unsigned j = j0; j < j1; j++) {
                double ov = dmin(j + 1.0, hi) - dmax((double)j, lo);
                w[t->count++] = (float)(ov / r);
            }
        } else {
            double c = (i + 0.5) * r - 0.5;
            if (c < 0)
                c = 0;
            unsigned j0 = floor_u(c);
            if (j0 >= len - 1) {
                t->first = start + len - 1;
                t->count = 1;
                w[0] = 1.0f;
            } else {
                float f = (float)(c - j0);
                t->first = start + j0;
                t->count = 2;
                w[0] = 1.0f - f;
                w[1] = f;
            }
        }
    }
    return 0;
}

/*
 * Resizes the window (x0, y0, ww, wh) of the RGB image src (sw pixels wide)
 * to ow x oh RGB pixels in dst, flipped horizontally when flip. tmp holds
 * wh * ow * 3 floats.
 */
static int resize_window(const unsigned char *src, unsigned sw, unsigned x0, unsigned y0,
                         unsigned ww, unsigned wh, int flip, unsigned char *dst, unsigned ow,
                         unsigned oh, float *tmp)
{
    struct axis ax = {0}, ay = {0};
    if (axis_init(&ax, x0, ww, ow, flip) != 0 || axis_init(&ay, 0, wh, oh, 0) != 0) {
        axis_free(&ax);
        return -1;
    }
    for (unsigned y = 0; y < wh; y++) {
        const unsigned char *row = src + ((size_t)(y0 + y) * sw) * 3;
        float *out = tmp + (size_t)y * ow * 3;
        for (unsigned x = 0; x < ow; x++) {
            const struct taps *t = &ax.taps[x];
            const float *w = ax.weights + t->weight_at;
            const unsigned char *p = row + (size_t)t->first * 3;
            float r = 0, g = 0, b = 0;
            for (unsigned k = 0; k < t->count; k++, p += 3) {
                r += w[k] * p[0];
                g += w[k] * p[1];
                b += w[k] * p[2];
            }
            out[3 * x] = r;
            out[3 * x + 1] = g;
            out[3 * x + 2] = b;
        }
    }
    size_t row_len = (size_t)ow * 3;
    for (unsigned y = 0; y < oh; y++) {
        const struct taps *t = &ay.taps[y];
        const float *w = ay.weights + t->weight_at;
        unsigned char *out = dst + (size_t)y * row_len;
        for (size_t i = 0; i < row_len; i++) {
            float v = 0;
            for (unsigned k = 0; k < t->count; k++)
                v += w[k] * tmp[(size_t)(t->first + k) * row_len + i];
            v += 0.5f;
            out[i] = v <= 0 ? 0 : v >= 255 ? 255 : (unsigned char)v;
        }
    }
    axis_free(&ax);
    axis_free(&ay);
    return 0;
}

/* ------------------------------------------------------------------ files */

static int read_file(const char *path, unsigned char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: %s: not a regular file\n", prog, path);
        fclose(f);
        return -1;
    }
    if (st.st_size <= 0 || (unsigned long long)st.st_size > MAX_SOURCE_BYTES) {
        fprintf(stderr, "%s: %s: size %lld bytes is outside 1 .. %llu\n", prog, path,
                (long long)st.st_size, MAX_SOURCE_BYTES);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n);
    if (!buf || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, buf ? "short read" : "out of memory");
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    *out = buf;
    *len = n;
    return 0;
}

static int write_file(const char *path, const unsigned char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return -1;
    }
    int bad = fwrite(data, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad) {
        fprintf(stderr, "%s: %s: write failed: %s\n", prog, path, strerror(errno));
        return -1;
    }
    return 0;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) {
        fprintf(stderr, "%s: bad directory name '%s'\n", prog, path);
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "%s: mkdir %s: %s\n", prog, buf, strerror(errno));
            return -1;
        }
        buf[i] = c;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s is not a directory\n", prog, path);
        return -1;
    }
    return 0;
}

/* 1 when DIR holds nothing (but . and ..), 0 when it holds something, -1 on error. */
static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return -1;
    }
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            empty = 0;
            break;
        }
    }
    closedir(d);
    return empty;
}

/* The class of a photo: its base name up to the last '.', lower-cased. Only
 * letters, digits, '-' and '_' (it becomes a folder and a tar member name). */
static int class_name(const char *path, char *out, size_t out_len)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t n = dot ? (size_t)(dot - base) : strlen(base);
    if (n == 0 || n >= out_len) {
        fprintf(stderr, "%s: %s: cannot make a class name from this file name\n", prog, path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char c = base[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_')) {
            fprintf(stderr,
                    "%s: %s: the class name (file name without extension) may only hold "
                    "letters, digits, '-' and '_'\n",
                    prog, path);
            return -1;
        }
        out[i] = c;
    }
    out[n] = '\0';
    return 0;
}

/* ------------------------------------------------------------------ work */

struct photo {
    const char *path;
    char cls[MAX_CLASS_NAME];
    unsigned char *rgb; /* width x height x 3 */
    unsigned width, height;
};

struct job {
    const struct photo *photo;
    const char *out_dir;
    uint64_t seed;
    unsigned per_photo, quality;
    double grain;     /* standard deviation of the luma noise, in 8-bit levels */
    atomic_uint next; /* the next image index to take */
    atomic_int failed;
};

struct worker {
    pthread_t thread;
    struct job *job;
    unsigned long long bytes, images;
    int ok;
};

/* The random stream of image k of a photo. */
static uint64_t image_stream(const struct job *j, unsigned k)
{
    uint64_t s = j->seed ^ fnv1a(j->photo->cls);
    s ^= sf__splitmix64(&s) + (uint64_t)k * 0xD1B54A32D192ED03ull;
    (void)sf__splitmix64(&s);
    return s;
}

/*
 * Sensor-like grain: the same zero-mean noise on R, G and B of a pixel (luma
 * only, so 4:2:0 chroma is untouched), roughly Gaussian (a sum of four
 * uniforms), standard deviation sigma levels. The wallpapers are smooth, shot
 * with shallow depth of field and already compressed, so without it the
 * crops compress to a fifth of what camera photos of this size take
 * (docs/sample-dataset.md).
 */
static void add_grain(unsigned char *px, size_t pixels, double sigma, uint64_t *s)
{
    /* Sum of 4 U(0, 65536) has variance 4 * 65536^2 / 12. */
    const double scale = sigma * 1.7320508075688772 / 65536.0;
    for (size_t i = 0; i < pixels; i++, px += 3) {
        uint64_t r = sf__splitmix64(s);
        double u = (double)(r & 0xFFFF) + (double)((r >> 16) & 0xFFFF) +
                   (double)((r >> 32) & 0xFFFF) + (double)(r >> 48) - 131070.0;
        double n = u * scale;
        int d = n < 0 ? -(int)(0.5 - n) : (int)(n + 0.5);
        for (int c = 0; c < 3; c++) {
            int v = px[c] + d;
            px[c] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

/* Draws image k of a photo: output size, window, flip. s is its stream. */
static void plan_image(const struct job *j, uint64_t *stream, unsigned *ow, unsigned *oh,
                       unsigned *x0, unsigned *y0, unsigned *ww, unsigned *wh, int *flip)
{
    const struct photo *p = j->photo;
    uint64_t s = *stream;

    unsigned pick = (unsigned)(sf__uniform01(&s) * 100.0), acc = 0, n = 0;
    size_t count = sizeof(sizes) / sizeof(sizes[0]);
    for (n = 0; n + 1 < count; n++) {
        acc += sizes[n].weight;
        if (pick < acc)
            break;
    }
    *ow = sizes[n].w;
    *oh = sizes[n].h;

    /* The largest window of the output's aspect ratio that fits the photo. */
    double aspect = (double)*ow / *oh;
    double mw = dmin((double)p->width, p->height * aspect), mh = mw / aspect;
    /* Its area share: uniform in [lo, 1], where lo keeps the window at least
     * the output's size when the photo allows (so images are shrunk, sharp). */
    double lo = dmax(MIN_AREA_SHARE, ((double)*ow / mw) * ((double)*ow / mw));
    double share = lo >= 1.0 ? 1.0 : lo + (1.0 - lo) * sf__uniform01(&s);
    double f = sqrt_unit(share);
    unsigned w = round_u(mw * f), h = round_u(mh * f);
    if (w < 1)
        w = 1;
    if (h < 1)
        h = 1;
    if (w > p->width)
        w = p->width;
    if (h > p->height)
        h = p->height;
    *ww = w;
    *wh = h;
    *x0 = (unsigned)(sf__uniform01(&s) * (p->width - w + 1));
    *y0 = (unsigned)(sf__uniform01(&s) * (p->height - h + 1));
    if (*x0 > p->width - w)
        *x0 = p->width - w;
    if (*y0 > p->height - h)
        *y0 = p->height - h;
    *flip = sf__uniform01(&s) < 0.5;
    *stream = s;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct job *j = w->job;
    const struct photo *p = j->photo;
    tjhandle tj = tjInitCompress();
    unsigned char *pixels = NULL, *jpeg = NULL;
    float *tmp = NULL;
    size_t tmp_cap = 0;
    w->ok = 0;
    if (!tj) {
        fprintf(stderr, "%s: tjInitCompress: %s\n", prog, tjGetErrorStr2(NULL));
        goto out;
    }
    /* The largest output is 500 x 500; tjBufSize() is the worst case of any
     * JPEG of that size, so the buffer is never too small. */
    unsigned long jpeg_cap = tjBufSize(500, 500, TJSAMP_420);
    pixels = malloc(500 * 500 * 3);
    jpeg = tjAlloc((int)jpeg_cap);
    if (!pixels || !jpeg) {
        fprintf(stderr, "%s: out of memory\n", prog);
        goto out;
    }
    for (;;) {
        if (atomic_load(&j->failed))
            goto out;
        unsigned k = atomic_fetch_add(&j->next, 1);
        if (k >= j->per_photo)
            break;
        unsigned ow, oh, x0, y0, ww, wh;
        int flip;
        uint64_t stream = image_stream(j, k);
        plan_image(j, &stream, &ow, &oh, &x0, &y0, &ww, &wh, &flip);
        size_t need = (size_t)wh * ow * 3;
        if (need > tmp_cap) {
            free(tmp);
            tmp = malloc(need * sizeof(*tmp));
            tmp_cap = tmp ? need : 0;
            if (!tmp) {
                fprintf(stderr, "%s: out of memory\n", prog);
                goto out;
            }
        }
        if (resize_window(p->rgb, p->width, x0, y0, ww, wh, flip, pixels, ow, oh, tmp) != 0) {
            fprintf(stderr, "%s: out of memory\n", prog);
            goto out;
        }
        if (j->grain > 0)
            add_grain(pixels, (size_t)ow * oh, j->grain, &stream);
        unsigned long jpeg_len = jpeg_cap;
        if (tjCompress2(tj, pixels, (int)ow, 0, (int)oh, TJPF_RGB, &jpeg, &jpeg_len, TJSAMP_420,
                        (int)j->quality, TJFLAG_NOREALLOC) != 0) {
            fprintf(stderr, "%s: %s image %u: tjCompress2: %s\n", prog, p->cls, k,
                    tjGetErrorStr2(tj));
            goto out;
        }
        char path[PATH_MAX];
        int n = snprintf(path, sizeof(path), "%s/%s/%s_%05u.jpg", j->out_dir, p->cls, p->cls, k);
        if (n < 0 || (size_t)n >= sizeof(path)) {
            fprintf(stderr, "%s: output path too long under %s\n", prog, j->out_dir);
            goto out;
        }
        if (write_file(path, jpeg, jpeg_len) != 0)
            goto out;
        w->bytes += jpeg_len;
        w->images++;
    }
    w->ok = 1;
out:
    if (!w->ok)
        atomic_store(&j->failed, 1);
    tjFree(jpeg);
    free(tmp);
    free(pixels);
    if (tj)
        tjDestroy(tj);
    return NULL;
}

/* Reads the photo's header (header_only: checks it is a JPEG within the
 * limits) or decodes it into p->rgb. */
static int decode_photo(struct photo *p, int header_only)
{
    unsigned char *data;
    size_t len;
    if (read_file(p->path, &data, &len) != 0)
        return -1;
    int rc = -1;
    tjhandle tj = tjInitDecompress();
    if (!tj) {
        fprintf(stderr, "%s: tjInitDecompress: %s\n", prog, tjGetErrorStr2(NULL));
        goto out;
    }
    int w, h, subsamp, colorspace;
    if (len > ULONG_MAX ||
        tjDecompressHeader3(tj, data, (unsigned long)len, &w, &h, &subsamp, &colorspace) != 0) {
        fprintf(stderr, "%s: %s: not a JPEG we can read: %s\n", prog, p->path, tjGetErrorStr2(tj));
        goto out;
    }
    if (w < 1 || h < 1 || w > MAX_SOURCE_SIDE || h > MAX_SOURCE_SIDE ||
        (unsigned long long)w * (unsigned long long)h > MAX_SOURCE_PIXELS) {
        fprintf(stderr, "%s: %s: %d x %d pixels is over the limits (%d per side, %llu in all)\n",
                prog, p->path, w, h, MAX_SOURCE_SIDE, MAX_SOURCE_PIXELS);
        goto out;
    }
    if (header_only) {
        rc = 0;
        goto out;
    }
    p->rgb = malloc((size_t)w * (size_t)h * 3);
    if (!p->rgb) {
        fprintf(stderr, "%s: %s: out of memory for %d x %d pixels\n", prog, p->path, w, h);
        goto out;
    }
    if (tjDecompress2(tj, data, (unsigned long)len, p->rgb, w, 0, h, TJPF_RGB, 0) != 0) {
        /* A warning (a truncated but usable file) still gives pixels; refuse
         * it anyway so the dataset is made of sound photographs. */
        fprintf(stderr, "%s: %s: decoding failed: %s\n", prog, p->path, tjGetErrorStr2(tj));
        free(p->rgb);
        p->rgb = NULL;
        goto out;
    }
    p->width = (unsigned)w;
    p->height = (unsigned)h;
    rc = 0;
out:
    if (tj)
        tjDestroy(tj);
    free(data);
    return rc;
}

/* ------------------------------------------------------------------ main */

static void usage(void)
{
    fprintf(stderr,
            "usage: %s --out DIR --per-photo N [--seed S] [--quality Q] [--grain G]\n"
            "                      [--jobs J] PHOTO.jpg...\n"
            "  --out DIR       output folder (created; must be empty): "
            "DIR/<class>/<class>_nnnnn.jpg\n"
            "  --per-photo N   images cut from each photo, 1..%d\n"
            "  --seed S        seed of sizes, windows, flips and grain (default 1)\n"
            "  --quality Q     JPEG quality 1..100, 4:2:0 (default %d)\n"
            "  --grain G       luma noise, standard deviation in levels, 0..%d (default %d)\n"
            "  --jobs J        threads (default: online CPUs); the output does not depend on it\n"
            "Each PHOTO is one class, named after its file name without extension, "
            "lower-cased.\n",
            prog, MAX_PER_PHOTO, DEFAULT_QUALITY, MAX_GRAIN, DEFAULT_GRAIN);
}

static int parse_uint(const char *flag, const char *s, unsigned long long lo, unsigned long long hi,
                      unsigned long long *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-' || *s == '+') {
        fprintf(stderr, "%s: %s needs a number from %llu to %llu\n", prog, flag, lo, hi);
        return -1;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s '%s': expected a number from %llu to %llu\n", prog, flag, s, lo,
                hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_grain(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = s && *s ? strtod(s, &end) : -1;
    if (!s || !*s || errno || *end || !(v >= 0 && v <= MAX_GRAIN)) {
        fprintf(stderr, "%s: --grain '%s': expected a number from 0 to %d\n", prog, s ? s : "",
                MAX_GRAIN);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *out_dir = NULL;
    unsigned long long per_photo = 0, seed = 1, quality = DEFAULT_QUALITY, jobs = 0;
    double grain = DEFAULT_GRAIN;
    int have_per_photo = 0;
    const char **photos = calloc((size_t)argc, sizeof(*photos));
    size_t photo_count = 0;
    if (!photos)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            free(photos);
            return 0;
        } else if (!strcmp(a, "--out")) {
            if (!v || !*v) {
                fprintf(stderr, "%s: --out needs a directory\n", prog);
                r = -1;
            }
            out_dir = v;
            i++;
        } else if (!strcmp(a, "--per-photo")) {
            r = parse_uint(a, v, 1, MAX_PER_PHOTO, &per_photo);
            have_per_photo = 1;
            i++;
        } else if (!strcmp(a, "--seed")) {
            r = parse_uint(a, v, 0, UINT64_MAX, &seed);
            i++;
        } else if (!strcmp(a, "--quality")) {
            r = parse_uint(a, v, 1, 100, &quality);
            i++;
        } else if (!strcmp(a, "--grain")) {
            r = parse_grain(v, &grain);
            i++;
        } else if (!strcmp(a, "--jobs")) {
            r = parse_uint(a, v, 1, MAX_JOBS, &jobs);
            i++;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "%s: unknown option '%s'\n", prog, a);
            r = -1;
        } else {
            photos[photo_count++] = a;
        }
        if (r != 0) {
            usage();
            free(photos);
            return 2;
        }
    }
    if (!out_dir || !have_per_photo || photo_count == 0) {
        fprintf(stderr, "%s: %s\n", prog,
                !out_dir          ? "--out DIR is required"
                : !have_per_photo ? "--per-photo N is required"
                                  : "no PHOTO.jpg given");
        usage();
        free(photos);
        return 2;
    }
    if (jobs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = n < 1 ? 1 : n > MAX_JOBS ? MAX_JOBS : (unsigned long long)n;
    }

    struct photo *ph = calloc(photo_count, sizeof(*ph));
    if (!ph) {
        free(photos);
        return 1;
    }
    int rc = 1;
    for (size_t i = 0; i < photo_count; i++) {
        ph[i].path = photos[i];
        if (class_name(photos[i], ph[i].cls, sizeof(ph[i].cls)) != 0) {
            rc = 2;
            goto done;
        }
        for (size_t k = 0; k < i; k++) {
            if (!strcmp(ph[k].cls, ph[i].cls)) {
                fprintf(stderr, "%s: %s and %s give the same class '%s'\n", prog, ph[k].path,
                        ph[i].path, ph[i].cls);
                rc = 2;
                goto done;
            }
        }
    }
    /* Bad sources are found before anything is written. */
    for (size_t i = 0; i < photo_count; i++) {
        if (decode_photo(&ph[i], 1) != 0)
            goto done;
    }
    if (make_dirs(out_dir) != 0)
        goto done;
    int empty = dir_is_empty(out_dir);
    if (empty < 0)
        goto done;
    if (!empty) {
        fprintf(stderr, "%s: %s is not empty (remove it or pick another --out)\n", prog, out_dir);
        goto done;
    }

    double t0 = now_s();
    unsigned long long total_bytes = 0, total_images = 0;
    struct worker *workers = calloc(jobs, sizeof(*workers));
    if (!workers)
        goto done;
    for (size_t i = 0; i < photo_count; i++) {
        struct photo *p = &ph[i];
        char dir[PATH_MAX];
        int n = snprintf(dir, sizeof(dir), "%s/%s", out_dir, p->cls);
        if (n < 0 || (size_t)n >= sizeof(dir)) {
            fprintf(stderr, "%s: output path too long under %s\n", prog, out_dir);
            break;
        }
        if (decode_photo(p, 0) != 0 || make_dirs(dir) != 0)
            break;
        struct job j = {.photo = p,
                        .out_dir = out_dir,
                        .seed = seed,
                        .per_photo = (unsigned)per_photo,
                        .quality = (unsigned)quality,
                        .grain = grain};
        atomic_init(&j.next, 0);
        atomic_init(&j.failed, 0);
        unsigned started = 0;
        for (; started < jobs; started++) {
            workers[started] = (struct worker){.job = &j};
            if (pthread_create(&workers[started].thread, NULL, worker_main, &workers[started]) !=
                0) {
                fprintf(stderr, "%s: cannot start a thread\n", prog);
                atomic_store(&j.failed, 1);
                break;
            }
        }
        for (unsigned t = 0; t < started; t++) {
            pthread_join(workers[t].thread, NULL);
            total_bytes += workers[t].bytes;
            total_images += workers[t].images;
        }
        free(p->rgb);
        p->rgb = NULL;
        if (atomic_load(&j.failed))
            break;
        if (i + 1 == photo_count)
            rc = 0;
    }
    free(workers);
    if (rc != 0)
        fprintf(stderr, "%s: stopped; %s holds a partial output\n", prog, out_dir);
    if (rc == 0) {
        double secs = now_s() - t0;
        printf("%llu images in %zu classes, %llu bytes, mean %.0f bytes, %.2f s\n", total_images,
               photo_count, total_bytes, total_images ? (double)total_bytes / total_images : 0.0,
               secs);
    }
done:
    for (size_t i = 0; i < photo_count; i++)
        free(ph[i].rgb);
    free(ph);
    free(photos);
    return rc;
}
