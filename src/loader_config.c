/* Loader options: defaults, checks, and the JSON configuration file
 * (include/shardfeed_loader.h, docs/loader.md). */
#include "src/decode.h"
#include "src/index_json.h"
#include "src/loader.h"
#include "src/sampler.h"
#include "common/strbuf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sf_loader_options_init_default(struct sf_loader_options *o)
{
    memset(o, 0, sizeof(*o));
    sf_s3_options_init_default(&o->s3);
    sf_cache_options_init_default(&o->cache);
    sf_sampler_options_init_default(&o->sampler);
    /* As WebDataset's shuffle(1000, initial=100): the first batch does not
     * wait for a full buffer (a whole shard or two over the network); the
     * buffer then grows to shuffle_buffer (docs/sampling.md). */
    o->sampler.initial_fill = 100;
    o->prefetch_shards = 4;
    o->max_shard_bytes = 4ULL << 30;
    o->learned_counts = -1;
    o->batch_size = 256;
    o->prefetch_batches = 4;
    sf__image_options_default(&o->image);
    o->max_extra_bytes = 16ULL << 20;
    o->on_error = SF_ON_ERROR_FAIL;
    o->device = SF_DEVICE_AUTO;
    o->cuda_device = -1;
    o->normalize_on_device = 1;
    o->log_level = SF_LOG_WARN;
}

sf_status sf__loader_options_check(const struct sf_loader_options *o, char *err, size_t err_len)
{
    if (!o->sources || o->source_count == 0)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "sources: at least one shard URL, pattern or prefix is needed");
    for (size_t i = 0; i < o->source_count; i++)
        if (!o->sources[i] || !o->sources[i][0])
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "sources[%zu] is empty", i);
    if (o->batch_size < 1 || o->batch_size > (1u << 20))
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "batch_size %u: must be 1..1048576",
                        o->batch_size);
    if (o->prefetch_batches < 2 || o->prefetch_batches > 1024)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "prefetch_batches %u: must be 2..1024", o->prefetch_batches);
    if (o->prefetch_shards < 1 || o->prefetch_shards > 4096)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "prefetch_shards %u: must be 1..4096", o->prefetch_shards);
    if (o->decode_threads > 1024)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "decode_threads %u: must be 0 (the cores) ..1024", o->decode_threads);
    if (o->max_shard_bytes < 1024)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "max_shard_bytes %llu: at least 1K",
                        o->max_shard_bytes);
    if (o->learned_counts < -1 || o->learned_counts > 1)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "learned_counts %d: -1 (auto), 0 (never) or 1 (always)", o->learned_counts);
    if (o->max_extra_bytes < 1)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "max_extra_bytes: at least 1");
    if (o->on_error != SF_ON_ERROR_FAIL && o->on_error != SF_ON_ERROR_SKIP)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "on_error %d: fail or skip",
                        (int)o->on_error);
    if (o->device != SF_DEVICE_AUTO && o->device != SF_DEVICE_HOST && o->device != SF_DEVICE_CUDA &&
        o->device != SF_DEVICE_EMULATED)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "device %d: auto, host or cuda",
                        (int)o->device);
    if (o->image_fields && !o->image_fields[0])
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "image_fields is empty");
    sf_status st = sf__image_options_check(&o->image, err, err_len);
    if (st != SF_OK)
        return st;
    if (o->image.width == 0 || o->image.height == 0)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "width and height: the loader needs an output size (1..65535)");
    size_t bytes = sf__image_bytes(&o->image);
    if ((double)bytes * o->batch_size * o->prefetch_batches > 64.0 * (1ULL << 30))
        return sf__fail(
            err, err_len, SF_ERR_INVALID_ARGUMENT,
            "batch_size x prefetch_batches x image bytes is over 64 GiB of batch memory");
    /* The order's options, as the sampler will check them at open (after
     * the listing): initial_fill is capped at shuffle_buffer by the loader,
     * and whether counts are estimated is not known yet. */
    struct sf_sampler_options so = o->sampler;
    so.initial_fill = 0;
    so.estimated_counts = 0;
    if ((st = sf__sampler_options_check(&so, err, err_len)) != SF_OK)
        return st;
    struct sf_dist d = {o->sampler.rank, o->sampler.world_size, 0}; /* LOCAL_RANK: not read */
    return sf_dist_from_env(&d, err, err_len);
}

/* ------------------------------------------------------------ JSON */

struct keep {
    cJSON *root;
    const char **sources;
};

sf_status sf_loader_options_check(const struct sf_loader_options *o, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!o)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "loader options are NULL");
    return sf__loader_options_check(o, err, err_len);
}

void sf_loader_options_free_json(void *k)
{
    struct keep *kp = k;
    if (!kp)
        return;
    cJSON_Delete(kp->root);
    free(kp->sources);
    free(kp);
}

/* The names of the enum options (sf__loader_parse_enum). */
static const struct {
    const char *what, *name;
    int value;
} enum_table[] = {
    {"crop", "random_resized", SF_CROP_RANDOM_RESIZED},
    {"crop", "center", SF_CROP_CENTER},
    {"crop", "none", SF_CROP_NONE},
    {"layout", "chw", SF_LAYOUT_CHW},
    {"layout", "hwc", SF_LAYOUT_HWC},
    {"dtype", "uint8", SF_DTYPE_UINT8},
    {"dtype", "float32", SF_DTYPE_FLOAT32},
    {"on_error", "fail", SF_ON_ERROR_FAIL},
    {"on_error", "skip", SF_ON_ERROR_SKIP},
    {"device", "auto", SF_DEVICE_AUTO},
    {"device", "host", SF_DEVICE_HOST},
    {"device", "cuda", SF_DEVICE_CUDA},
    {"device", "emulated", SF_DEVICE_EMULATED},
    {"epoch_policy", "pad", SF_EPOCH_PAD},
    {"epoch_policy", "drop", SF_EPOCH_DROP},
    {"epoch_policy", "uneven", SF_EPOCH_UNEVEN},
    {"partition", "shards", SF_PARTITION_SHARDS},
    {"partition", "samples", SF_PARTITION_SAMPLES},
    {"learned_counts", "auto", -1},
    {"learned_counts", "never", 0},
    {"learned_counts", "always", 1},
    {"addressing", "path", SF_ADDRESSING_PATH},
    {"addressing", "virtual", SF_ADDRESSING_VIRTUAL},
    {"addressing", "auto", SF_ADDRESSING_AUTO},
};

/* The names an enum option takes, in the table's order: "a, b or c". */
static void enum_names(const char *what, char *out, size_t len)
{
    size_t n = 0, k = 0, total = 0;
    for (size_t i = 0; i < sizeof(enum_table) / sizeof(enum_table[0]); i++)
        total += !strcmp(enum_table[i].what, what);
    out[0] = '\0';
    for (size_t i = 0; i < sizeof(enum_table) / sizeof(enum_table[0]) && n < len; i++) {
        if (strcmp(enum_table[i].what, what) != 0)
            continue;
        k++;
        int w = snprintf(out + n, len - n, "%s%s",
                         k == 1       ? ""
                         : k == total ? " or "
                                      : ", ",
                         enum_table[i].name);
        n += w > 0 ? (size_t)w : 0;
    }
}

/* What a value of an option must be, for the message when it is not: the
 * readers below fill it as they refuse a value. */
struct want {
    char text[160];
};

static int refuse(struct want *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(struct want *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->text, sizeof(w->text), fmt, ap);
    va_end(ap);
    return -1;
}

static int get_uint(const cJSON *v, unsigned long long max, unsigned long long *out, struct want *w)
{
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (!(d < 0 || d != floor(d) || d > (double)max)) {
            *out = (unsigned long long)d;
            return 0;
        }
    }
    return refuse(w, "a whole number in 0..%llu", max);
}

static int get_size(const cJSON *v, unsigned long long *out, struct want *w)
{
    if (cJSON_IsString(v) ? sf_parse_bytes(v->valuestring, out) == SF_OK
                          : get_uint(v, 1ULL << 53, out, w) == 0)
        return 0;
    return refuse(w, "a byte count: a whole number, or a string such as \"64M\" or \"1GiB\"");
}

static int get_float(const cJSON *v, float *out, struct want *w)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return refuse(w, "a finite number");
    *out = (float)v->valuedouble;
    return 0;
}

/* An int from -1 (automatic) to max. */
static int get_int(const cJSON *v, int max, int *out, struct want *w)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < -1 || v->valuedouble > max ||
        v->valuedouble != floor(v->valuedouble))
        return refuse(w, "a whole number in -1..%d (-1: automatic)", max);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *v, int *out, struct want *w)
{
    if (!cJSON_IsBool(v))
        return refuse(w, "true or false");
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_str(const cJSON *v, const char **out, struct want *w)
{
    if (!cJSON_IsString(v))
        return refuse(w, "a string");
    *out = v->valuestring;
    return 0;
}

static int get_float3(const cJSON *v, float out[3], struct want *w)
{
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 3)
        return refuse(w, "an array of 3 finite numbers");
    for (int i = 0; i < 3; i++)
        if (get_float(cJSON_GetArrayItem(v, i), &out[i], w))
            return refuse(w, "an array of 3 finite numbers");
    return 0;
}

static int get_enum(const cJSON *v, const char *name, int *out, struct want *w)
{
    if (cJSON_IsString(v) && sf__loader_parse_enum(name, v->valuestring, out) == 0)
        return 0;
    char names[120];
    enum_names(name, names, sizeof(names));
    return refuse(w, "one of %s", names);
}

/* Applies one option by name (shared by the JSON reader and the CLI's
 * --set style parsing). */
static int apply(struct sf_loader_options *o, const char *k, const cJSON *v, struct want *w)
{
    unsigned long long u = 0;
    int b = 0, i = 0;
/* name: read the value into tmp (read fails: -1), then field = tmp. */
#define SET(name, field, read, tmp)                                                                \
    if (!strcmp(k, name)) {                                                                        \
        if (read)                                                                                  \
            return -1;                                                                             \
        field = tmp;                                                                               \
        return 0;                                                                                  \
    }
#define U(name, field, max) SET(name, field, get_uint(v, max, &u, w), u)
#define SZ(name, field)     SET(name, field, get_size(v, &u, w), u)
#define B(name, field)      SET(name, field, get_bool(v, &b, w), b)
#define I(name, field, max) SET(name, field, get_int(v, max, &i, w), i)
#define F(name, field)                                                                             \
    if (!strcmp(k, name))                                                                          \
        return get_float(v, &field, w);
#define S(name, field)                                                                             \
    if (!strcmp(k, name))                                                                          \
        return get_str(v, &field, w);
/* a name of sf__loader_parse_enum's */
#define E(name, field)                                                                             \
    if (!strcmp(k, name))                                                                          \
        return get_enum(v, name, (int *)&(field), w);
    U("batch_size", o->batch_size, 1u << 20)
    U("prefetch_batches", o->prefetch_batches, 1024)
    U("prefetch_shards", o->prefetch_shards, 4096)
    U("decode_threads", o->decode_threads, 1024)
    B("drop_last", o->drop_last)
    B("ram_only", o->ram_only)
    B("require_end_marker", o->require_end_marker)
    SZ("max_shard_bytes", o->max_shard_bytes)
    SZ("max_extra_bytes", o->max_extra_bytes)
    S("image_fields", o->image_fields)
    S("label_fields", o->label_fields)
    S("extra_fields", o->extra_fields)
    B("normalize_on_device", o->normalize_on_device)
    B("sync_device", o->sync_device)
    I("cuda_device", o->cuda_device, 1024)
    /* sampler */
    U("seed", o->sampler.seed, 1ULL << 53)
    U("epoch", o->sampler.epoch, 1ULL << 53)
    U("shuffle_buffer", o->sampler.shuffle_buffer, SF_SAMPLER_MAX_SHUFFLE_BUFFER)
    U("initial_fill", o->sampler.initial_fill, SF_SAMPLER_MAX_SHUFFLE_BUFFER)
    I("rank", o->sampler.rank, 1000000)
    I("world_size", o->sampler.world_size, 1000000)
    E("epoch_policy", o->sampler.policy)
    E("partition", o->sampler.partition)
    E("learned_counts", o->learned_counts)
    /* image */
    U("width", o->image.width, 65535)
    U("height", o->image.height, 65535)
    if (!strcmp(k, "size")) {
        if (get_uint(v, 65535, &u, w))
            return -1;
        o->image.width = o->image.height = (unsigned)u;
        return 0;
    }
    F("scale_min", o->image.scale_min)
    F("scale_max", o->image.scale_max)
    F("ratio_min", o->image.ratio_min)
    F("ratio_max", o->image.ratio_max)
    F("center_fraction", o->image.center_fraction)
    F("hflip", o->image.hflip)
    U("max_side", o->image.max_side, 1u << 20)
    U("max_pixels", o->image.max_pixels, 1ULL << 40)
    U("max_scans", o->image.max_scans, 100000)
    if (!strcmp(k, "mean"))
        return get_float3(v, o->image.mean, w);
    if (!strcmp(k, "std"))
        return get_float3(v, o->image.std, w);
    E("crop", o->image.crop)
    E("layout", o->image.layout)
    E("dtype", o->image.dtype)
    E("on_error", o->on_error)
    E("device", o->device)
    E("addressing", o->s3.addressing)
    /* cache and S3 */
    S("cache_dir", o->cache.dir)
    SZ("cache_limit", o->cache.limit_bytes)
    SZ("ram_cache_limit", o->cache.ram_limit_bytes)
    S("endpoint_url", o->s3.endpoint_url)
    S("region", o->s3.region)
    S("profile", o->s3.profile)
    B("no_sign_request", o->s3.no_sign_request)
    S("ca_bundle", o->s3.ca_bundle)
    B("insecure", o->s3.insecure)
    B("http2", o->s3.http2)
    if (!strcmp(k, "concurrency")) {
        if (get_uint(v, SF_S3_CONCURRENCY_MAX, &u, w) || u < 1)
            return refuse(w, "a whole number in 1..%u", (unsigned)SF_S3_CONCURRENCY_MAX);
        o->s3.concurrency = (unsigned)u;
        return 0;
    }
    U("io_threads", o->s3.io_threads, SF_S3_IO_THREADS_MAX) /* 0: automatic */
    SZ("chunk_size", o->s3.chunk_bytes)
    U("max_attempts", o->s3.max_attempts, SF_S3_MAX_ATTEMPTS_MAX)
    U("stall_timeout_ms", o->s3.stall_timeout_ms, SF_S3_TIMEOUT_MS_MAX)
    U("connect_timeout_ms", o->s3.connect_timeout_ms, SF_S3_TIMEOUT_MS_MAX)
    U("first_byte_timeout_ms", o->s3.first_byte_timeout_ms, SF_S3_TIMEOUT_MS_MAX)
    U("request_timeout_ms", o->s3.request_timeout_ms, SF_S3_TIMEOUT_MS_MAX)
#undef SET
#undef U
#undef SZ
#undef F
#undef B
#undef I
#undef S
#undef E
    return 1; /* unknown */
}

int sf__loader_parse_enum(const char *what, const char *s, int *out)
{
    for (size_t i = 0; i < sizeof(enum_table) / sizeof(enum_table[0]); i++)
        if (!strcmp(enum_table[i].what, what) && !strcmp(enum_table[i].name, s)) {
            *out = enum_table[i].value;
            return 0;
        }
    return -1;
}

/* The JSON text of v for a message, cut to fit len ("..." at the end). */
static void shown_value(const cJSON *v, char *out, size_t len)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        snprintf(out, len, "(a value)");
        return;
    }
    if (strlen(t) < len)
        snprintf(out, len, "%s", t);
    else
        snprintf(out, len, "%.*s...", (int)(len - 4), t);
    cJSON_free(t);
}

sf_status sf_loader_options_from_json(struct sf_loader_options *o, const char *json, void **keep,
                                      char *err, size_t err_len)
{
    if (!o || !json || !keep)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "NULL argument");
    *keep = NULL;
    struct keep *k = calloc(1, sizeof(*k));
    if (!k)
        return SF_ERR_NO_MEMORY;
    k->root = cJSON_Parse(json);
    if (!k->root || !cJSON_IsObject(k->root)) {
        const char *at = cJSON_GetErrorPtr();
        sf_status st = sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                                "configuration is not a JSON object%s%.*s%s",
                                at && k->root == NULL ? " (near '" : "", at && !k->root ? 20 : 0,
                                at ? at : "", at && !k->root ? "')" : "");
        sf_loader_options_free_json(k);
        return st;
    }
    /* Paths, URLs and names are C strings: a NUL would end them early and
     * name another file ("bucket\u0000/x" read as "bucket"). */
    char where[300];
    if (sf__json_nul_where(json, k->root, where, sizeof(where))) {
        int name = !strncmp(where, "the name of ", 12), src = !strncmp(where, "sources", 7);
        sf_status st = sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                                "%s%s%s: %sholds a NUL character (\\u0000)", src ? "" : "option '",
                                where + (name ? 12 : 0), src ? "" : "'", name ? "its name " : "");
        sf_loader_options_free_json(k);
        return st;
    }
    struct sf_loader_options tmp = *o;
    const cJSON *v;
    cJSON_ArrayForEach(v, k->root)
    {
        const char *name = v->string;
        if (!strcmp(name, "sources")) {
            if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1) {
                sf_loader_options_free_json(k);
                return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                                "sources: an array of URL strings");
            }
            size_t n = (size_t)cJSON_GetArraySize(v);
            free(k->sources);
            k->sources = calloc(n, sizeof(*k->sources));
            if (!k->sources) {
                sf_loader_options_free_json(k);
                return SF_ERR_NO_MEMORY;
            }
            size_t i = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, v)
            {
                if (!cJSON_IsString(e)) {
                    sf_loader_options_free_json(k);
                    return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                                    "sources[%zu]: not a string", i);
                }
                k->sources[i++] = e->valuestring;
            }
            tmp.sources = k->sources;
            tmp.source_count = n;
            continue;
        }
        struct want w = {""};
        int r = apply(&tmp, name, v, &w);
        if (r != 0) {
            char got[64];
            shown_value(v, got, sizeof(got));
            sf_status st =
                r > 0 ? sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "unknown option '%s'", name)
                      : sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                                 "option '%s': expected %s, got %s", name,
                                 w.text[0] ? w.text : "another value", got);
            sf_loader_options_free_json(k);
            return st;
        }
    }
    *o = tmp;
    *keep = k;
    return SF_OK;
}
