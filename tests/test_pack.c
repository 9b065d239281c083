/* sf_pack() and the pack / inspect commands: folders packed into tar and
 * record shards are read back with the shard readers (and GNU tar) and must
 * give every file byte for byte, with the right keys, fields and labels, and
 * an index.json that matches the shards. S3 destinations use the mock
 * server; the CLI is run as the built program. */
#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "shardfeed_shard.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_FILES 512

/* A file the test wrote into the source folder. */
struct tfile {
    char rel[1024];
    unsigned char *data;
    size_t size;
    int seen;
};

static char *tmp;
static char src[700];
static struct tfile files[MAX_FILES];
static size_t n_files;
static struct mock_proc srv;
static struct sf_s3 *s3;

static void setup(void)
{
    tmp = test_tmpdir();
    cr_assert(tmp);
    test_isolate_aws_env(tmp);
    snprintf(src, sizeof(src), "%s/src", tmp);
    cr_assert(mkdir(src, 0755) == 0);
    n_files = 0;
}

static void teardown(void)
{
    sf_s3_destroy(s3);
    s3 = NULL;
    for (size_t i = 0; i < n_files; i++)
        free(files[i].data);
    n_files = 0;
    mock_env_stop(&srv, &tmp);
}

TestSuite(pack, .init = setup, .fini = teardown, .timeout = 120);

/* ------------------------------------------------------------ source trees */

static void add_bytes(const char *rel, const void *data, size_t size)
{
    cr_assert(n_files < MAX_FILES);
    struct tfile *f = &files[n_files++];
    snprintf(f->rel, sizeof(f->rel), "%s", rel);
    f->data = malloc(size ? size : 1);
    cr_assert(f->data);
    if (size)
        memcpy(f->data, data, size);
    f->size = size;
    f->seen = 0;
    cr_assert(test_write_file(src, rel, data, size) == 0, "%s", rel);
}

static void add_random(const char *rel, size_t size, unsigned seed)
{
    unsigned char *b = malloc(size ? size : 1);
    cr_assert(b);
    test_fill(b, size, seed);
    add_bytes(rel, b, size);
    free(b);
}

/* Compressible: the same line over and over. */
static void add_text(const char *rel, size_t size)
{
    char *b = malloc(size + 1);
    cr_assert(b);
    for (size_t i = 0; i < size; i++)
        b[i] = "the quick brown fox jumps over the lazy dog\n"[i % 44];
    add_bytes(rel, b, size);
    free(b);
}

/* Hidden: written but not packed, so not in files[]. */
static void add_hidden(const char *rel)
{
    cr_assert(test_write_file(src, rel, "x", 1) == 0);
}

static const char *const classes[] = {"Ant", "cat", "dog"}; /* byte order: 'A' < 'c' */

/* Three classes, 36 files of 0..12 KB, one nested folder, one hidden file. */
static void make_imagefolder(void)
{
    unsigned seed = 1;
    for (size_t c = 0; c < 3; c++) {
        for (int i = 0; i < 12; i++) {
            char rel[256];
            size_t size = (size_t)((seed * 2654435761u) % 12000);
            if (i == 0)
                size = 0; /* an empty file is a sample too */
            snprintf(rel, sizeof(rel), "%s/%simg%03d.%s", classes[c], i == 5 ? "sub/" : "", i,
                     i % 4 == 3 ? "png" : "jpg");
            add_random(rel, size, seed++);
        }
    }
    add_hidden("cat/.DS_Store");
}

/* WebDataset-style: multi-field samples, a field with a dot, upper-case
 * extensions, a sample in a subfolder. */
static void make_flat(void)
{
    unsigned seed = 100;
    for (int i = 0; i < 20; i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "%06d.jpg", i);
        add_random(rel, 3000 + (size_t)i * 997, seed++);
        snprintf(rel, sizeof(rel), "%06d.txt", i);
        add_text(rel, 10 + (size_t)i);
        if (i % 3 == 0) {
            snprintf(rel, sizeof(rel), "%06d.seg.png", i);
            add_random(rel, 2000, seed++);
        }
    }
    add_random("000007.JSON", 77, seed++);
    add_random("part/000100.jpg", 5000, seed++);
    add_random("part/000100.cls", 1, seed++);
}

/* ------------------------------------------------------------ expectations */

static void split_rel(const char *rel, char *key, size_t key_n, char *field, size_t field_n)
{
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    const char *dot = strchr(base, '.');
    cr_assert(dot, "%s", rel);
    snprintf(key, key_n, "%.*s", (int)(dot - rel), rel);
    snprintf(field, field_n, "%s", dot + 1);
    for (char *c = field; *c; c++)
        if (*c >= 'A' && *c <= 'Z')
            *c = (char)(*c - 'A' + 'a');
}

static struct tfile *find_file(const char *key, const char *field)
{
    for (size_t i = 0; i < n_files; i++) {
        char k[1024], f[256];
        split_rel(files[i].rel, k, sizeof(k), f, sizeof(f));
        if (!strcmp(k, key) && !strcmp(f, field))
            return &files[i];
    }
    return NULL;
}

static size_t expected_samples(void)
{
    size_t n = 0;
    for (size_t i = 0; i < n_files; i++) {
        char k[1024], f[256];
        split_rel(files[i].rel, k, sizeof(k), f, sizeof(f));
        int first = 1;
        for (size_t j = 0; j < i; j++) {
            char k2[1024], f2[256];
            split_rel(files[j].rel, k2, sizeof(k2), f2, sizeof(f2));
            if (!strcmp(k, k2))
                first = 0;
        }
        n += (size_t)first;
    }
    return n;
}

static unsigned char *load(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    cr_assert(b);
    cr_assert(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return b;
}

static void path_in(char *out, size_t n, const char *dir, const char *name)
{
    int r = snprintf(out, n, "%s/%s", dir, name);
    cr_assert(r > 0 && (size_t)r < n, "path too long: %s/%s", dir, name);
}

struct read_stats {
    size_t samples;
    unsigned long long decompressed;
};

/*
 * Reads one shard (bytes in memory) with the public reader and checks every
 * field against the source files; with labels, every sample carries a cls
 * field equal to its class's index in classes[].
 */
static struct read_stats check_shard(const char *name, const unsigned char *b, size_t n, int labels,
                                     enum sf_shard_format want_format)
{
    struct sf_shard_reader_options ro;
    sf_shard_reader_options_init_default(&ro);
    ro.name = name;
    ro.require_end_marker = 1;
    struct sf_shard_reader *r = NULL;
    char err[256];
    cr_assert_eq(sf_shard_reader_new(&ro, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_eq(sf_shard_reader_feed(r, b, n, n), SF_OK);
    struct read_stats rs = {0, 0};
    for (;;) {
        struct sf_sample smp;
        enum sf_shard_event ev;
        sf_status st = sf_shard_reader_next(r, &smp, &ev);
        cr_assert_eq(st, SF_OK, "%s: %s", name, sf_shard_reader_errmsg(r));
        if (ev == SF_SHARD_END)
            break;
        cr_assert_eq(ev, SF_SHARD_SAMPLE, "%s: the whole shard was fed", name);
        rs.samples++;
        int cls_fields = 0;
        for (size_t i = 0; i < smp.field_count; i++) {
            const struct sf_sample_field *fl = &smp.fields[i];
            if (labels && !strcmp(fl->name, "cls")) {
                cls_fields++;
                char text[32];
                cr_assert(fl->size > 0 && fl->size < sizeof(text));
                snprintf(text, sizeof(text), "%.*s", (int)fl->size, (const char *)fl->data);
                long want = -1;
                for (size_t c = 0; c < sizeof(classes) / sizeof(classes[0]); c++)
                    if (!strncmp(smp.key, classes[c], strlen(classes[c])) &&
                        smp.key[strlen(classes[c])] == '/')
                        want = (long)c;
                cr_assert_geq(want, 0, "sample %s has no class", smp.key);
                char wtext[32];
                snprintf(wtext, sizeof(wtext), "%ld", want);
                cr_expect_str_eq(text, wtext, "label of %s", smp.key);
                continue;
            }
            struct tfile *f = find_file(smp.key, fl->name);
            cr_assert(f, "%s: sample %s field %s is not a source file", name, smp.key, fl->name);
            cr_assert_eq(f->seen, 0, "%s/%s read twice", smp.key, fl->name);
            f->seen = 1;
            cr_assert_eq(fl->size, f->size, "%s: size", f->rel);
            cr_assert(f->size == 0 || memcmp(fl->data, f->data, f->size) == 0, "%s: bytes differ",
                      f->rel);
        }
        if (labels)
            cr_expect_eq(cls_fields, 1, "sample %s: %d cls fields", smp.key, cls_fields);
    }
    cr_expect_eq(sf_shard_reader_format(r), want_format, "%s", name);
    struct sf_shard_stats ss;
    sf_shard_reader_stats(r, &ss);
    rs.decompressed = ss.decompressed_bytes;
    cr_expect_eq(ss.skipped_dirs + ss.skipped_links + ss.skipped_other + ss.skipped_unnamed, 0,
                 "%s: members skipped", name);
    sf_shard_reader_destroy(r);
    return rs;
}

static cJSON *load_json(const char *path)
{
    size_t n;
    unsigned char *b = load(path, &n);
    cJSON *j = cJSON_ParseWithLength((const char *)b, n);
    free(b);
    cr_assert(j, "%s: not JSON", path);
    return j;
}

static double jnum(const cJSON *j, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    cr_assert(cJSON_IsNumber(x), "no number '%s'", name);
    return x->valuedouble;
}

static const char *jstr(const cJSON *j, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    cr_assert(cJSON_IsString(x), "no string '%s'", name);
    return x->valuestring;
}

/* Names in dir (index.json excluded), sorted; fails on leftover temporary files. */
static size_t list_shards(const char *dir, char names[][256], size_t max)
{
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        cr_assert(de->d_name[0] != '.', "%s: temporary file %s left", dir, de->d_name);
        if (!strcmp(de->d_name, "index.json"))
            continue;
        cr_assert(n < max);
        snprintf(names[n++], 256, "%s", de->d_name);
    }
    closedir(d);
    qsort(names, n, 256, (int (*)(const void *, const void *))strcmp);
    return n;
}

/*
 * Checks a local pack: index.json against the shard files (names, sizes,
 * checksums, sample counts), every source file read back exactly once,
 * labels and classes, and the shard size bound. Returns the shard count.
 */
static size_t check_pack(const char *dest, const char *format, int labels,
                         unsigned long long shard_bytes, unsigned long long *decompressed)
{
    for (size_t i = 0; i < n_files; i++)
        files[i].seen = 0;
    char path[1200];
    path_in(path, sizeof(path), dest, "index.json");
    cJSON *idx = load_json(path);
    cr_expect_str_eq(jstr(idx, "format"), format);
    cr_expect_eq(jnum(idx, "version"), 1);
    cr_expect_str_eq(jstr(idx, "layout"), labels ? "imagefolder" : "flat");
    static char names[256][256];
    size_t n = list_shards(dest, names, 256);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(idx, "shards");
    cr_assert(cJSON_IsArray(shards));
    cr_assert_eq((size_t)cJSON_GetArraySize(shards), n, "index lists every shard file");
    cr_expect_eq(jnum(idx, "shard_count"), n);
    size_t samples = 0;
    unsigned long long bytes = 0, dec = 0;
    for (size_t i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetArrayItem(shards, (int)i);
        cr_assert_str_eq(jstr(s, "name"), names[i], "shards in order");
        path_in(path, sizeof(path), dest, names[i]);
        size_t len;
        unsigned char *b = load(path, &len);
        cr_expect_eq(jnum(s, "bytes"), len, "%s", names[i]);
        char hex[17];
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)XXH3_64bits(b, len));
        cr_expect_str_eq(jstr(s, "xxh3_64"), hex, "%s checksum", names[i]);
        struct read_stats rs =
            check_shard(names[i], b, len, labels,
                        !strcmp(format, "tar") ? SF_SHARD_FORMAT_TAR : SF_SHARD_FORMAT_RECORD);
        cr_expect_eq(jnum(s, "samples"), rs.samples, "%s sample count", names[i]);
        if (rs.samples > 1)
            cr_expect_leq(len, shard_bytes, "%s: %zu bytes over the %llu limit", names[i], len,
                          shard_bytes);
        samples += rs.samples;
        bytes += len;
        dec += rs.decompressed;
        free(b);
    }
    for (size_t i = 0; i < n_files; i++)
        cr_expect(files[i].seen, "%s was not read back", files[i].rel);
    cr_expect_eq(samples, expected_samples());
    cr_expect_eq(jnum(idx, "sample_count"), samples);
    cr_expect_eq(jnum(idx, "file_count"), n_files);
    cr_expect_eq(jnum(idx, "bytes"), bytes);
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(idx, "classes");
    if (labels) {
        cr_assert(cJSON_IsArray(cl));
        cr_assert_eq(cJSON_GetArraySize(cl), 3);
        for (int i = 0; i < 3; i++)
            cr_expect_str_eq(cJSON_GetArrayItem(cl, i)->valuestring, classes[i]);
        const cJSON *fields = cJSON_GetObjectItemCaseSensitive(idx, "fields");
        cr_expect_eq(jnum(fields, "cls"), samples);
    } else {
        cr_expect_null(cl);
    }
    cJSON_Delete(idx);
    if (decompressed)
        *decompressed = dec;
    return n;
}

static sf_status do_pack(const char *dest, const struct sf_pack_options *o,
                         struct sf_pack_result *res, char *err, size_t err_len)
{
    return sf_pack(src, dest, o, res, err, err_len);
}

static void dest_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmp, name);
}

/* ============================================================ round trips */

Test(pack, imagefolder_to_tar_round_trip)
{
    make_imagefolder();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 32 * 1024;
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_result res;
    sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_expect_eq(res.layout, SF_PACK_LAYOUT_IMAGEFOLDER);
    cr_expect_eq(res.format, SF_PACK_FORMAT_TAR);
    cr_expect_eq(res.files, n_files);
    cr_expect_eq(res.samples, n_files);
    cr_expect_eq(res.classes, 3);
    cr_expect_eq(res.ignored, 1, "the hidden .DS_Store");
    size_t shards = check_pack(dest, "tar", 1, o.shard_bytes, NULL);
    cr_expect_gt(shards, 3, "a 32 KiB limit gives several shards, got %zu", shards);
    cr_expect_eq(res.shards, shards);
    /* class counts in the index */
    char path[900];
    path_in(path, sizeof(path), dest, "index.json");
    cJSON *idx = load_json(path);
    const cJSON *cc = cJSON_GetObjectItemCaseSensitive(idx, "class_counts");
    cr_assert(cJSON_IsArray(cc));
    for (int i = 0; i < 3; i++)
        cr_expect_eq(cJSON_GetArrayItem(cc, i)->valuedouble, 12);
    cJSON_Delete(idx);
}

Test(pack, imagefolder_to_record_round_trip)
{
    make_imagefolder();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.format = SF_PACK_FORMAT_RECORD;
    o.shard_bytes = 32 * 1024;
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_result res;
    sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    size_t shards = check_pack(dest, "record", 1, o.shard_bytes, NULL);
    cr_expect_gt(shards, 3);
    char first[256];
    cr_assert_eq(sf_pack_shard_name(NULL, SF_PACK_FORMAT_RECORD, 0, first, sizeof(first)), SF_OK);
    cr_expect_str_eq(first, "shard-000000.sfr");
}

Test(pack, record_with_zstd_round_trip)
{
    make_flat();
    for (int i = 0; i < 10; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "doc%02d.txt", i);
        add_text(rel, 20000);
    }
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.format = SF_PACK_FORMAT_RECORD;
    o.zstd_level = 3;
    o.shard_bytes = 32 * 1024;
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_result res;
    sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    unsigned long long dec = 0;
    size_t shards = check_pack(dest, "record", 0, o.shard_bytes, &dec);
    cr_expect_gt(shards, 2);
    cr_expect_gt(dec, 0, "the text records were stored compressed");
    cr_expect_lt(res.shard_bytes, res.source_bytes, "compression shrank the data");
    char path[900];
    path_in(path, sizeof(path), dest, "index.json");
    cJSON *idx = load_json(path);
    cr_expect_str_eq(jstr(idx, "compression"), "zstd");
    cr_expect_eq(jnum(idx, "zstd_level"), 3);
    cJSON_Delete(idx);
}

Test(pack, flat_folder_round_trip_in_both_formats)
{
    make_flat();
    enum sf_pack_format formats[] = {SF_PACK_FORMAT_TAR, SF_PACK_FORMAT_RECORD};
    for (int f = 0; f < 2; f++) {
        struct sf_pack_options o;
        sf_pack_options_init_default(&o);
        o.format = formats[f];
        o.shard_bytes = 16 * 1024;
        char dest[800], err[1024];
        dest_path(dest, sizeof(dest), f ? "rec" : "tar");
        struct sf_pack_result res;
        sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
        cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
        cr_expect_eq(res.layout, SF_PACK_LAYOUT_FLAT);
        cr_expect_eq(res.classes, 0);
        cr_expect_eq(res.samples, 21, "20 numbered samples and part/000100");
        size_t shards = check_pack(dest, f ? "record" : "tar", 0, o.shard_bytes, NULL);
        cr_expect_gt(shards, 2);
        char path[900];
        path_in(path, sizeof(path), dest, "index.json");
        cJSON *idx = load_json(path);
        const cJSON *fields = cJSON_GetObjectItemCaseSensitive(idx, "fields");
        cr_expect_eq(jnum(fields, "jpg"), 21);
        cr_expect_eq(jnum(fields, "txt"), 20);
        cr_expect_eq(jnum(fields, "seg.png"), 7);
        cr_expect_eq(jnum(fields, "json"), 1, "upper-case extensions are lower-cased");
        cJSON_Delete(idx);
    }
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void expect_same_file(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *x = load(a, &na), *y = load(b, &nb);
    cr_expect(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x);
    free(y);
}

Test(pack, gnu_tar_lists_and_extracts_identical_files)
{
    make_imagefolder();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 64 * 1024;
    char dest[800], err[1024], ex[800];
    dest_path(dest, sizeof(dest), "out");
    dest_path(ex, sizeof(ex), "extracted");
    cr_assert(mkdir(ex, 0755) == 0);
    cr_assert_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    static char names[256][256];
    size_t n = list_shards(dest, names, 256);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(sh("tar -tvf '%s/%s' > '%s/list.txt' 2>&1", dest, names[i], tmp), 0,
                     "GNU tar refuses %s", names[i]);
        cr_assert_eq(sh("tar -xf '%s/%s' -C '%s' 2>'%s/tar-err.txt'", dest, names[i], ex, tmp), 0,
                     "GNU tar cannot extract %s", names[i]);
        char errpath[900];
        path_in(errpath, sizeof(errpath), tmp, "tar-err.txt");
        size_t elen;
        free(load(errpath, &elen));
        cr_expect_eq(elen, 0, "GNU tar warned about %s", names[i]);
    }
    for (size_t i = 0; i < n_files; i++) {
        char a[1300], b[1300];
        path_in(a, sizeof(a), src, files[i].rel);
        path_in(b, sizeof(b), ex, files[i].rel);
        expect_same_file(a, b);
    }
    /* and the labels as .cls files */
    char cls[1300];
    snprintf(cls, sizeof(cls), "%s/dog/img004.cls", ex);
    size_t len;
    unsigned char *b = load(cls, &len);
    cr_expect(len == 1 && b[0] == '2', "dog is class 2");
    free(b);
}

Test(pack, long_names_get_pax_headers_and_read_back)
{
    char rel[1024], dir1[200], dir2[200], base[240];
    memset(dir1, 'd', 150);
    dir1[150] = '\0';
    memset(dir2, 'e', 150);
    dir2[150] = '\0';
    memset(base, 'k', 200);
    base[200] = '\0';
    /* a 200-byte base name: no ustar split fits */
    snprintf(rel, sizeof(rel), "%s.jpg", base);
    add_random(rel, 1000, 1);
    /* a 306-byte path made of short-enough parts: prefix + name do not fit either */
    snprintf(rel, sizeof(rel), "%s/%s/x.jpg", dir1, dir2);
    add_random(rel, 2000, 2);
    /* 120 bytes: fits as ustar prefix + name */
    snprintf(rel, sizeof(rel), "%.100s/short.jpg", dir1);
    add_random(rel, 3000, 3);
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.layout = SF_PACK_LAYOUT_FLAT;
    char dest[800], err[1024], ex[800];
    dest_path(dest, sizeof(dest), "out");
    dest_path(ex, sizeof(ex), "extracted");
    cr_assert(mkdir(ex, 0755) == 0);
    cr_assert_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_eq(check_pack(dest, "tar", 0, o.shard_bytes, NULL), 1);
    cr_assert_eq(sh("tar -xf '%s/shard-000000.tar' -C '%s'", dest, ex), 0);
    for (size_t i = 0; i < n_files; i++) {
        char a[1300], b[1300];
        path_in(a, sizeof(a), src, files[i].rel);
        path_in(b, sizeof(b), ex, files[i].rel);
        expect_same_file(a, b);
    }
}

static void expect_same_tree(const char *a, const char *b)
{
    static char na[256][256], nb[256][256];
    size_t n = list_shards(a, na, 256);
    cr_assert_eq(list_shards(b, nb, 256), n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(na[i], nb[i]);
        char pa[1200], pb[1200];
        path_in(pa, sizeof(pa), a, na[i]);
        path_in(pb, sizeof(pb), b, nb[i]);
        expect_same_file(pa, pb);
    }
    char pa[1200], pb[1200];
    path_in(pa, sizeof(pa), a, "index.json");
    path_in(pb, sizeof(pb), b, "index.json");
    expect_same_file(pa, pb);
}

Test(pack, the_same_input_gives_identical_output)
{
    make_imagefolder();
    for (int f = 0; f < 2; f++) {
        struct sf_pack_options o;
        sf_pack_options_init_default(&o);
        o.format = f ? SF_PACK_FORMAT_RECORD : SF_PACK_FORMAT_TAR;
        o.zstd_level = f ? 5 : 0;
        o.shard_bytes = 50000;
        char d1[800], d2[800], err[1024];
        snprintf(d1, sizeof(d1), "%s/one-%d", tmp, f);
        snprintf(d2, sizeof(d2), "%s/two-%d", tmp, f);
        cr_assert_eq(do_pack(d1, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
        /* touch every file: mtimes must not matter */
        cr_assert_eq(sh("find '%s' -type f -exec touch -d '2001-02-03 04:05:06' {} +", src), 0);
        cr_assert_eq(do_pack(d2, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
        expect_same_tree(d1, d2);
    }
}

Test(pack, the_layout_can_be_forced)
{
    make_imagefolder();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.layout = SF_PACK_LAYOUT_FLAT;
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "flat");
    struct sf_pack_result res;
    cr_assert_eq(do_pack(dest, &o, &res, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_eq(res.layout, SF_PACK_LAYOUT_FLAT);
    check_pack(dest, "tar", 0, o.shard_bytes, NULL); /* keys "cat/img001", no cls */

    /* a folder with files at the top cannot be an ImageFolder tree */
    add_random("top.jpg", 10, 9);
    o.layout = SF_PACK_LAYOUT_IMAGEFOLDER;
    dest_path(dest, sizeof(dest), "if");
    sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "top.jpg") && strstr(err, "class folder"), "message: %s", err);
    /* and auto now says flat */
    o.layout = SF_PACK_LAYOUT_AUTO;
    dest_path(dest, sizeof(dest), "auto");
    cr_assert_eq(do_pack(dest, &o, &res, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_eq(res.layout, SF_PACK_LAYOUT_FLAT);
}

Test(pack, name_pattern_names_the_shards)
{
    make_flat();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 16 * 1024;
    o.name_pattern = "train-%04u-of-%%.tar";
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    cr_assert_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    static char names[256][256];
    size_t n = list_shards(dest, names, 256);
    cr_assert_gt(n, 2);
    cr_expect_str_eq(names[0], "train-0000-of-%.tar");
    cr_expect_str_eq(names[1], "train-0001-of-%.tar");
    check_pack(dest, "tar", 0, o.shard_bytes, NULL);

    char name[64];
    cr_expect_eq(sf_pack_shard_name("x-%u.tar", SF_PACK_FORMAT_TAR, 12, name, sizeof(name)), SF_OK);
    cr_expect_str_eq(name, "x-12.tar");
    const char *bad[] = {"x.tar", "%u-%u.tar", "a/%u.tar", "%s.tar", ".%u.tar", "%x", "%"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(sf_pack_shard_name(bad[i], SF_PACK_FORMAT_TAR, 0, name, sizeof(name)),
                     SF_ERR_INVALID_ARGUMENT, "%s", bad[i]);
        o.name_pattern = bad[i];
        err[0] = '\0';
        cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT, "%s",
                     bad[i]);
        cr_expect(strstr(err, "name pattern"), "message: %s", err);
    }
    cr_expect_eq(sf_pack_shard_name("%020u.tar", SF_PACK_FORMAT_TAR, 1, name, 8), SF_ERR_LIMIT);
}

struct progress_calls {
    int n;
    struct sf_pack_progress last;
    unsigned long long cancel_at_files; /* 0 = never */
    int monotonic;
};

static int on_progress(void *user, const struct sf_pack_progress *p)
{
    struct progress_calls *c = user;
    if (c->n > 0 && (p->files_done < c->last.files_done || p->bytes_done < c->last.bytes_done))
        c->monotonic = 0;
    c->n++;
    c->last = *p;
    return c->cancel_at_files && p->files_done >= c->cancel_at_files;
}

Test(pack, progress_counts_every_file_and_can_cancel)
{
    make_imagefolder();
    struct progress_calls c = {0, {0, 0, 0, 0, 0}, 0, 1};
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 32 * 1024;
    o.progress = on_progress;
    o.progress_user = &c;
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_result res;
    cr_assert_eq(do_pack(dest, &o, &res, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_geq(c.n, (int)n_files + 1);
    cr_expect(c.monotonic);
    cr_expect_eq(c.last.files_done, n_files);
    cr_expect_eq(c.last.files_total, n_files);
    cr_expect_eq(c.last.bytes_done, res.source_bytes);
    cr_expect_eq(c.last.bytes_total, res.source_bytes);
    cr_expect_eq(c.last.shards_done, res.shards);

    /* cancelled half-way: an error, and nothing of this call is left */
    struct progress_calls c2 = {0, {0, 0, 0, 0, 0}, 20, 1};
    o.progress_user = &c2;
    dest_path(dest, sizeof(dest), "cancelled");
    sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CANCELLED, "%s", sf_status_name(st));
    cr_expect_gt(c2.last.shards_done, 0, "some shards were done before the cancel");
    static char names[256][256];
    cr_expect_eq(list_shards(dest, names, 256), 0, "shards removed");
    char path[900];
    path_in(path, sizeof(path), dest, "index.json");
    cr_expect_neq(access(path, F_OK), 0, "no index.json");
}

/* ============================================================ errors */

Test(pack, a_missing_source_is_not_found)
{
    char missing[800], dest[800], err[1024];
    dest_path(missing, sizeof(missing), "no-such-folder");
    dest_path(dest, sizeof(dest), "out");
    sf_status st = sf_pack(missing, dest, NULL, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    cr_expect(strstr(err, "no-such-folder"), "message: %s", err);
    cr_expect_neq(access(dest, F_OK), 0, "the destination was not created");
    /* an empty source has nothing to pack */
    st = sf_pack(src, dest, NULL, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    cr_expect(strstr(err, "no files"), "message: %s", err);
    /* a file is not a folder */
    add_random("x.jpg", 10, 1);
    char file[900];
    path_in(file, sizeof(file), src, "x.jpg");
    cr_expect_eq(sf_pack(file, dest, NULL, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
}

Test(pack, an_unreadable_file_is_an_error_naming_it)
{
    if (geteuid() == 0)
        cr_skip_test("running as root: chmod 000 does not deny root, so nothing would fail");
    make_imagefolder();
    char path[900];
    path_in(path, sizeof(path), src, "dog/img007.png");
    cr_assert_eq(chmod(path, 0), 0);
    for (int f = 0; f < 2; f++) {
        struct sf_pack_options o;
        sf_pack_options_init_default(&o);
        o.format = f ? SF_PACK_FORMAT_RECORD : SF_PACK_FORMAT_TAR;
        o.shard_bytes = 32 * 1024;
        char dest[800], err[1024];
        dest_path(dest, sizeof(dest), f ? "rec" : "tar");
        sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
        cr_expect_eq(st, SF_ERR_IO, "%s", sf_status_name(st));
        cr_expect(strstr(err, "dog/img007.png") && strstr(err, "ermission"), "message: %s", err);
        static char names[256][256];
        cr_expect_eq(list_shards(dest, names, 256), 0, "no shards left after the failure");
    }
    chmod(path, 0644);
}

Test(pack, a_symbolic_link_is_an_error_unless_followed)
{
    make_flat();
    char target[900], link[900];
    path_in(target, sizeof(target), src, "000001.jpg");
    path_in(link, sizeof(link), src, "000050.jpg");
    cr_assert_eq(symlink(target, link), 0);
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "000050.jpg") && strstr(err, "symbolic link"), "message: %s", err);
    o.follow_symlinks = 1;
    struct sf_pack_result res;
    cr_assert_eq(do_pack(dest, &o, &res, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_eq(res.files, n_files + 1);
    /* a dangling link names itself */
    path_in(link, sizeof(link), src, "000051.jpg");
    cr_assert_eq(symlink("/nonexistent/target", link), 0);
    st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s", sf_status_name(st));
    cr_expect(strstr(err, "000051.jpg"), "message: %s", err);
}

/* Removes the last file added from the source. */
static void remove_last_file(void)
{
    cr_assert(n_files > 0);
    struct tfile *f = &files[--n_files];
    char p[1800];
    path_in(p, sizeof(p), src, f->rel);
    cr_assert_eq(unlink(p), 0, "%s", p);
    free(f->data);
    f->data = NULL;
}

Test(pack, names_that_cannot_be_samples_are_errors)
{
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.layout = SF_PACK_LAYOUT_FLAT;

    add_random("README", 10, 1);
    sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "README") && strstr(err, "no extension"), "message: %s", err);
    remove_last_file();

    add_random("a.", 10, 1);
    st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "a.") && strstr(err, "empty"), "message: %s", err);
    remove_last_file();

    /* the same field twice, told apart only by case */
    add_random("s1.jpg", 10, 1);
    add_random("s1.JPG", 10, 2);
    st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "s1.jpg") && strstr(err, "s1.JPG"), "message: %s", err);
    remove_last_file();

    /* an ImageFolder file may not be called .cls */
    cr_assert_eq(
        sh("mkdir -p '%s/c1' && mv '%s/s1.jpg' '%s/c1/' && : > '%s/c1/s1.cls'", src, src, src, src),
        0);
    o.layout = SF_PACK_LAYOUT_AUTO;
    st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "c1/s1.cls") && strstr(err, "label"), "message: %s", err);
    static char names[256][256];
    cr_expect_eq(list_shards(dest, names, 256), 0);
}

Test(pack, bad_options_are_refused_before_anything_is_written)
{
    make_flat();
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_options o;

    sf_pack_options_init_default(&o);
    o.zstd_level = 3; /* with tar */
    sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_UNSUPPORTED, "%s", sf_status_name(st));
    cr_expect(strstr(err, "record"), "message: %s", err);

    sf_pack_options_init_default(&o);
    o.format = SF_PACK_FORMAT_RECORD;
    o.zstd_level = 23;
    cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);

    sf_pack_options_init_default(&o);
    o.shard_bytes = 0;
    cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);

    sf_pack_options_init_default(&o);
    o.format = (enum sf_pack_format)7;
    cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect_neq(access(dest, F_OK), 0, "nothing was created");

    /* s3:// without a client */
    sf_pack_options_init_default(&o);
    st = do_pack("s3://bucket/x", &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "client"), "message: %s", err);
    st = do_pack("https://example.com/x", &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_UNSUPPORTED, "%s", sf_status_name(st));

    /* a destination inside the source */
    char inside[900];
    path_in(inside, sizeof(inside), src, "shards");
    st = do_pack(inside, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "inside"), "message: %s", err);
    st = do_pack(src, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));

    /* and with good options the same call works */
    cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
}

/* After the scan (the first progress call), a later file grows. */
static int grow_a_file(void *user, const struct sf_pack_progress *p)
{
    const char *path = user;
    if (p->files_done == 0) {
        FILE *f = fopen(path, "ab");
        cr_assert(f);
        fputs("more", f);
        fclose(f);
    }
    return 0;
}

Test(pack, a_file_that_changes_while_packing_is_an_error)
{
    make_flat();
    char path[900], dest[800], err[1024];
    path_in(path, sizeof(path), src, "000015.jpg");
    dest_path(dest, sizeof(dest), "out");
    for (int f = 0; f < 2; f++) {
        struct sf_pack_options o;
        sf_pack_options_init_default(&o);
        o.format = f ? SF_PACK_FORMAT_RECORD : SF_PACK_FORMAT_TAR;
        o.progress = grow_a_file;
        o.progress_user = path;
        sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
        cr_expect_eq(st, SF_ERR_CHANGED, "%s", sf_status_name(st));
        cr_expect(strstr(err, "000015.jpg") && strstr(err, "changed"), "message: %s", err);
    }
}

/* ============================================================ S3 */

static void start_mock(void)
{
    char root[800];
    snprintf(root, sizeof(root), "%s/root", tmp);
    cr_assert(mkdir(root, 0755) == 0);
    char b[900];
    snprintf(b, sizeof(b), "%s/bucket", root);
    cr_assert(mkdir(b, 0755) == 0);
    mock_env_start(&srv, root, NULL);
    struct sf_s3_options so;
    mock_env_s3_options(&so, srv.url);
    so.concurrency = 4;
    so.chunk_bytes = 64 * 1024;
    so.retry_base_ms = 5;
    so.throttle_base_ms = 5;
    so.retry_cap_ms = 100;
    s3 = mock_env_s3_new(&so);
}

static long admin(const char *method, const char *path_query, char **out)
{
    return mock_env_admin(&srv, method, path_query, NULL, out);
}

static double mock_count(const char *op, const char *status)
{
    cJSON *j = mock_env_stats(&srv);
    double n = mock_env_jnum(j, op ? "operations" : "status", op ? op : status, NULL, NULL);
    cJSON_Delete(j);
    return n;
}

/* GETs url with the engine into memory (free it). */
static unsigned char *get_object(const char *url, size_t *size)
{
    struct sf_fetch *f = NULL;
    sf_status st = sf_fetch_start(s3, url, NULL, &f);
    cr_assert_eq(st, SF_OK, "%s", url);
    struct sf_fetch_progress p;
    st = sf_fetch_wait(f, ~0ull, -1, &p);
    cr_assert_eq(st, SF_OK, "%s: %s", url, sf_fetch_errmsg(f));
    unsigned char *b = malloc(p.total ? p.total : 1);
    cr_assert(b);
    if (p.total)
        memcpy(b, sf_fetch_data(f), p.total);
    *size = p.total;
    sf_fetch_destroy(f);
    return b;
}

Test(pack, upload_to_s3_then_get_back_identical)
{
    make_imagefolder();
    start_mock();
    /* the second shard's first PUT fails: it is retried with the whole body */
    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/ds/train-0001&fault=500&count=1", NULL),
                 200);
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 64 * 1024;
    o.name_pattern = "train-%04u.tar";
    o.s3 = s3;
    o.tmp_dir = tmp;
    char err[1024];
    struct sf_pack_result res;
    sf_status st = do_pack("s3://bucket/ds/", &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_assert_gt(res.shards, 2);
    cr_expect_eq(mock_count("PutObject", NULL), res.shards + 2, "shards + index + one retry");
    cr_expect_eq(mock_count(NULL, "500"), 1);

    /* the same pack to a local folder: the objects must be byte-identical */
    o.s3 = NULL;
    char local[800];
    dest_path(local, sizeof(local), "local");
    cr_assert_eq(do_pack(local, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    check_pack(local, "tar", 1, o.shard_bytes, NULL);
    static char names[256][256];
    size_t n = list_shards(local, names, 256);
    cr_assert_eq(n, res.shards);
    for (size_t i = 0; i <= n; i++) {
        const char *name = i < n ? names[i] : "index.json";
        char url[600], path[1200];
        snprintf(url, sizeof(url), "s3://bucket/ds/%s", name);
        path_in(path, sizeof(path), local, name);
        size_t got_n, want_n;
        unsigned char *got = get_object(url, &got_n);
        unsigned char *want = load(path, &want_n);
        cr_expect(got_n == want_n && memcmp(got, want, want_n) == 0, "%s differs", url);
        free(got);
        free(want);
    }
    /* no staged shard is left behind */
    DIR *d = opendir(tmp);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_expect(strncmp(de->d_name, "sfpack-", 7) != 0, "staged %s left", de->d_name);
    closedir(d);
}

Test(pack, a_failed_upload_fails_the_pack)
{
    make_flat();
    start_mock();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 16 * 1024;
    o.s3 = s3;
    o.tmp_dir = tmp;
    char err[1024];
    /* a bucket that does not exist: 404 NoSuchBucket, not retried */
    sf_status st = do_pack("s3://nobucket/ds", &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_NOT_FOUND, "%s: %s", sf_status_name(st), err);
    cr_expect(strstr(err, "s3://nobucket/ds/shard-000000.tar") && strstr(err, "404"), "message: %s",
              err);
    cr_expect_eq(mock_count("PutObject", NULL), 1, "stopped at the first failure");
}

Test(pack, s3_put_from_memory_and_from_a_file)
{
    start_mock();
    size_t n = 3 * 1024 * 1024 + 17; /* several reads of the body */
    unsigned char *data = malloc(n);
    cr_assert(data);
    test_fill(data, n, 42);
    char path[800], etag[128];
    dest_path(path, sizeof(path), "body.bin");
    cr_assert_eq(test_write_file(tmp, "body.bin", data, n), 0);

    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/mem.bin", NULL, data, n, etag, sizeof(etag)), SF_OK);
    cr_expect_eq(etag[0], '"', "ETag: %s", etag);
    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/file.bin", path, NULL, 0, NULL, 0), SF_OK);
    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/empty", NULL, NULL, 0, NULL, 0), SF_OK);
    const char *urls[] = {"s3://bucket/a/mem.bin", "s3://bucket/a/file.bin"};
    for (int i = 0; i < 2; i++) {
        size_t got_n;
        unsigned char *got = get_object(urls[i], &got_n);
        cr_expect(got_n == n && memcmp(got, data, n) == 0, "%s differs", urls[i]);
        free(got);
    }
    size_t got_n;
    free(get_object("s3://bucket/a/empty", &got_n));
    cr_expect_eq(got_n, 0);

    /* a 503 and a 500, then success: the whole body is sent again each time */
    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/a/retry&fault=503&count=1", NULL), 200);
    cr_assert_eq(admin("POST", "/_mock/fault?prefix=bucket/a/retry&fault=500&count=1", NULL), 200);
    cr_assert_eq(sf_s3_put(s3, "s3://bucket/a/retry.bin", path, NULL, 0, NULL, 0), SF_OK);
    unsigned char *got = get_object("s3://bucket/a/retry.bin", &got_n);
    cr_expect(got_n == n && memcmp(got, data, n) == 0, "retried upload differs");
    free(got);
    struct sf_s3_stats ss;
    sf_s3_get_stats(s3, &ss);
    cr_expect_geq(ss.retries, 2);

    /* errors */
    char msg[1024];
    dest_path(path, sizeof(path), "missing.bin");
    cr_expect_eq(sf_s3_put(s3, "s3://bucket/a/x", path, NULL, 0, NULL, 0), SF_ERR_NOT_FOUND);
    cr_expect(strstr(sf_s3_errmsg(s3, msg, sizeof(msg)), "missing.bin"), "message: %s", msg);
    cr_expect_eq(sf_s3_put(s3, "/tmp/local", NULL, data, 1, NULL, 0), SF_ERR_UNSUPPORTED);
    cr_expect_eq(sf_s3_put(s3, "s3://bucket/a/x", path, data, 1, NULL, 0), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_s3_put(s3, "s3://bucket/a/x", NULL, NULL, 5, NULL, 0), SF_ERR_INVALID_ARGUMENT);

    /* a wrong secret: the signature is refused, not retried */
    struct sf_s3_options so;
    sf_s3_options_init_default(&so);
    so.endpoint_url = srv.url;
    so.access_key_id = "mock-access-key";
    so.secret_access_key = "wrong-secret";
    struct sf_s3 *bad = NULL;
    cr_assert_eq(sf_s3_new(&so, &bad, NULL, 0), SF_OK);
    sf_status st = sf_s3_put(bad, "s3://bucket/a/denied", NULL, data, 100, NULL, 0);
    cr_expect(st == SF_ERR_SIGNATURE || st == SF_ERR_ACCESS_DENIED, "%s", sf_status_name(st));
    cr_expect(strstr(sf_s3_errmsg(bad, msg, sizeof(msg)), "SignatureDoesNotMatch"), "message: %s",
              msg);
    sf_s3_destroy(bad);
    free(data);
}

/* ------------------------------------------------------------ multipart */

static const struct s3_creds mock_creds = {"mock-access-key", "mock-secret-key", NULL, NULL};

/* A signed request to the mock; returns the status, the body in *out (free it). */
static long signed_call(const char *method, const char *target, char **out, char *etag,
                        size_t etag_len)
{
    struct s3_call c = {.method = method, .target = target, .creds = &mock_creds};
    struct s3_resp r;
    cr_assert(s3_call(srv.url, &c, &r) == 0, "%s %s: no answer", method, target);
    if (etag && s3_resp_header(&r, "ETag", etag, etag_len) != 0)
        etag[0] = '\0';
    if (out)
        *out = sf__strbuf_take(&r.body);
    s3_resp_free(&r);
    return r.status;
}

/* Multipart uploads in progress in the mock's bucket. */
static int uploads_in_progress(void)
{
    char *body = NULL;
    cr_assert_eq(signed_call("GET", "/bucket?uploads", &body, NULL, 0), 200);
    int n = 0;
    for (const char *p = body; (p = strstr(p, "<Upload>")); p += 8)
        n++;
    free(body);
    return n;
}

static double mock_key_count(const char *key, const char *op)
{
    char *body = NULL;
    cr_assert_eq(admin("GET", "/_mock/stats", &body), 200);
    cJSON *j = cJSON_Parse(body);
    free(body);
    cr_assert(j);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "keys");
    x = cJSON_GetObjectItemCaseSensitive(x, key);
    x = cJSON_GetObjectItemCaseSensitive(x, "operations");
    x = cJSON_GetObjectItemCaseSensitive(x, op);
    double n = cJSON_IsNumber(x) ? x->valuedouble : 0;
    cJSON_Delete(j);
    return n;
}

/* S3's ETag of a file sent in parts of part bytes: md5 of the parts' md5s, "-N". */
static void multipart_etag_of(const unsigned char *data, size_t n, size_t part, char *out,
                              size_t out_len)
{
    size_t parts = (n + part - 1) / part;
    unsigned char *cat = malloc(16 * parts), md[16];
    cr_assert(cat);
    unsigned int len;
    for (size_t i = 0; i < parts; i++) {
        size_t l = n - i * part < part ? n - i * part : part;
        EVP_Digest(data + i * part, l, cat + 16 * i, &len, EVP_md5(), NULL);
    }
    EVP_Digest(cat, 16 * parts, md, &len, EVP_md5(), NULL);
    free(cat);
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    snprintf(out, out_len, "\"%s-%zu\"", hex, parts);
}

/* 24 random files taking 1 MiB each in a tar: two shards of 12 MiB with --shard-size 13M. */
static void make_large(void)
{
    for (int i = 0; i < 24; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "%06d.bin", i);
        add_random(rel, 1024 * 1024 - 700, 500 + (unsigned)i);
    }
}

Test(pack, large_shards_go_up_in_parts_with_retries_and_match_a_local_pack)
{
    make_large();
    start_mock();
    /* half of the requests to the second shard fail with 500 (seeded): parts
     * are retried one by one */
    const char *rule = "prefix=bucket/mp/shard-000001,p500=0.5";
    char *body = NULL;
    struct s3_call c = {
        .method = "POST", .target = "/_mock/faults", .body = rule, .body_len = strlen(rule)};
    struct s3_resp r;
    cr_assert(s3_call(srv.url, &c, &r) == 0 && r.status == 200);
    s3_resp_free(&r);
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 13ull << 20;
    o.part_bytes = 5ull << 20;
    o.s3 = s3;
    o.tmp_dir = tmp;
    char err[1024] = "";
    struct sf_pack_result res;
    sf_status st = do_pack("s3://bucket/mp/", &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_assert_eq(res.shards, 2);
    cr_expect_geq(mock_count("CompleteMultipartUpload", NULL), 2, "one per shard, and retries");
    cr_expect_eq(mock_count("PutObject", NULL), 1, "index.json only: the shards went in parts");
    cr_expect_gt(mock_count(NULL, "500"), 0, "faults were injected");
    cr_expect_gt(mock_key_count("bucket/mp/shard-000001.tar", "UploadPart"), 3,
                 "a failed part was sent again");
    cr_expect_eq(uploads_in_progress(), 0);

    o.s3 = NULL;
    char local[800];
    dest_path(local, sizeof(local), "local");
    cr_assert_eq(do_pack(local, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    static char names[16][256];
    size_t n = list_shards(local, names, 16);
    cr_assert_eq(n, 2);
    for (size_t i = 0; i < n; i++) {
        char url[4400], path[4400], target[4400], etag[128] = "", want[128];
        snprintf(url, sizeof(url), "s3://bucket/mp/%s", names[i]);
        path_in(path, sizeof(path), local, names[i]);
        size_t got_n, want_n;
        unsigned char *got = get_object(url, &got_n);
        unsigned char *data = load(path, &want_n);
        cr_assert_gt(want_n, 10u << 20);
        cr_expect(got_n == want_n && memcmp(got, data, want_n) == 0, "%s differs", url);
        snprintf(target, sizeof(target), "/bucket/mp/%s", names[i]);
        cr_expect_eq(signed_call("HEAD", target, NULL, etag, sizeof(etag)), 200);
        multipart_etag_of(data, want_n, 5u << 20, want, sizeof(want));
        cr_expect_str_eq(etag, want, "%s: the ETag of 3 parts of 5 MiB", url);
        cr_expect(strstr(etag, "-3\""), "%s", etag);
        free(got);
        free(data);
    }
    free(body);
}

Test(pack, a_part_that_fails_for_good_aborts_the_upload)
{
    make_large();
    start_mock();
    /* the first PUT of the first shard is its first part: a 400 is not retried */
    cr_assert_eq(
        admin("POST", "/_mock/fault?prefix=bucket/mp/shard-000000&fault=400&count=1", NULL), 200);
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 13ull << 20;
    o.part_bytes = 5ull << 20;
    o.s3 = s3;
    o.tmp_dir = tmp;
    char err[1024] = "";
    sf_status st = do_pack("s3://bucket/mp/", &o, NULL, err, sizeof(err));
    cr_expect_neq(st, SF_OK);
    cr_expect(strstr(err, "s3://bucket/mp/shard-000000.tar") && strstr(err, "part ") &&
                  strstr(err, "400"),
              "message: %s", err);
    cr_expect_eq(mock_count("AbortMultipartUpload", NULL), 1);
    cr_expect_eq(mock_count("CompleteMultipartUpload", NULL), 0);
    cr_expect_eq(uploads_in_progress(), 0, "no upload left in progress");
    char *body = NULL;
    cr_expect_eq(signed_call("HEAD", "/bucket/mp/shard-000000.tar", &body, NULL, 0), 404);
    free(body);
    /* no part file is left in the mock's bucket either */
    char dir[900];
    snprintf(dir, sizeof(dir), "%s/root/bucket", tmp);
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)))
        cr_expect(strncmp(de->d_name, ".sfmock-", 8) != 0, "%s left in the bucket", de->d_name);
    closedir(d);
}

Test(pack, bad_part_sizes_are_refused)
{
    make_flat();
    start_mock();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.s3 = s3;
    o.tmp_dir = tmp;
    o.part_bytes = 1 << 20;
    char err[1024] = "";
    cr_expect_eq(do_pack("s3://bucket/x", &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "part size"), "%s", err);
    o.part_bytes = 0;
    o.shard_bytes = (5ull << 40) + 1;
    err[0] = '\0';
    cr_expect_eq(do_pack("s3://bucket/x", &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "5 TiB"), "%s", err);
    o.shard_bytes = 6ull << 30; /* over one PUT's 5 GiB: fine with parts */
    cr_expect_eq(do_pack("s3://bucket/x", &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    struct sf_s3_upload_options uo;
    sf_s3_upload_options_init_default(&uo);
    cr_expect_eq(uo.part_bytes, 64ull << 20);
    uo.part_bytes = 4ull << 20;
    cr_expect_eq(sf_s3_upload_file(s3, "s3://bucket/y", "/etc/hostname", &uo, NULL, 0),
                 SF_ERR_INVALID_ARGUMENT);
}

/* ============================================================ CLI */

static char out_path[900], err_path[900];

/* Runs the built shardfeed with args; stdout and stderr go to files. */
static int cli(const char *args)
{
    snprintf(out_path, sizeof(out_path), "%s/cli.out", tmp);
    snprintf(err_path, sizeof(err_path), "%s/cli.err", tmp);
    return sh("'%s' %s > '%s' 2> '%s'", SF_CLI_BIN, args, out_path, err_path);
}

static char *slurp(const char *path)
{
    size_t n;
    unsigned char *b = load(path, &n);
    char *s = realloc(b, n + 1);
    cr_assert(s);
    s[n] = '\0';
    return s;
}

Test(pack, cli_pack_then_inspect)
{
    make_imagefolder();
    char args[4096], dest[800];
    dest_path(dest, sizeof(dest), "out");
    snprintf(args, sizeof(args), "pack '%s' '%s' --shard-size 64K --json", src, dest);
    int rc = cli(args);
    char *err = slurp(err_path);
    cr_assert_eq(rc, 0, "stderr: %s", err);
    free(err);
    cJSON *j = load_json(out_path);
    cr_expect_str_eq(jstr(j, "format"), "tar");
    cr_expect_str_eq(jstr(j, "layout"), "imagefolder");
    cr_expect_eq(jnum(j, "files"), n_files);
    cr_expect_eq(jnum(j, "classes"), 3);
    cr_expect_gt(jnum(j, "shards"), 2);
    cr_expect_geq(jnum(j, "mib_per_s"), 0);
    cJSON_Delete(j);
    size_t shards = check_pack(dest, "tar", 1, 64 * 1024, NULL);

    /* record + zstd through the flags, plain text summary */
    char rdest[800];
    dest_path(rdest, sizeof(rdest), "rec");
    snprintf(args, sizeof(args),
             "pack '%s' '%s' --format record --zstd=5 --shard-size 64K --no-progress", src, rdest);
    cr_assert_eq(cli(args), 0);
    char *out = slurp(out_path);
    cr_expect(strstr(out, "packed 36 files") && strstr(out, "3 classes"), "stdout: %s", out);
    free(out);
    check_pack(rdest, "record", 1, 64 * 1024, NULL);

    /* inspect a shard: every sample with its fields */
    snprintf(args, sizeof(args), "inspect --json '%s/shard-000000.tar'", dest);
    cr_assert_eq(cli(args), 0);
    j = load_json(out_path);
    cr_expect_str_eq(jstr(j, "format"), "tar");
    const cJSON *samples = cJSON_GetObjectItemCaseSensitive(j, "samples");
    cr_assert(cJSON_IsArray(samples));
    int n = cJSON_GetArraySize(samples);
    cr_expect_gt(n, 0);
    cr_expect_eq(jnum(j, "sample_count"), n);
    const cJSON *s0 = cJSON_GetArrayItem(samples, 0);
    cr_expect_str_eq(jstr(s0, "key"), "Ant/img000", "sorted: class Ant first");
    const cJSON *f0 = cJSON_GetObjectItemCaseSensitive(s0, "fields");
    cr_assert_eq(cJSON_GetArraySize(f0), 2);
    cr_expect_str_eq(jstr(cJSON_GetArrayItem(f0, 0), "name"), "jpg");
    cr_expect_eq(jnum(cJSON_GetArrayItem(f0, 0), "size"), 0);
    cr_expect_str_eq(jstr(cJSON_GetArrayItem(f0, 1), "name"), "cls");
    cr_expect_str_eq(jstr(cJSON_GetArrayItem(f0, 1), "value"), "0");
    cJSON_Delete(j);

    snprintf(args, sizeof(args), "inspect '%s/shard-000000.sfr'", rdest);
    cr_assert_eq(cli(args), 0);
    out = slurp(out_path);
    cr_expect(strstr(out, "Ant/img000  jpg:0  cls=\"0\""), "stdout: %s", out);
    cr_expect(strstr(out, "record"), "stdout: %s", out);
    free(out);
    (void)shards;
}

Test(pack, cli_bad_flags_exit_2)
{
    make_flat();
    char dest[800];
    dest_path(dest, sizeof(dest), "out");
    const char *bad[] = {
        "--format zip",
        "--shard-size 12X",
        "--shard-size 100",
        "--zstd",
        "--format record --zstd=0",
        "--layout trees",
        "--name-pattern x.tar",
        "--no-such-flag",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char args[2048];
        snprintf(args, sizeof(args), "pack '%s' '%s' %s", src, dest, bad[i]);
        cr_expect_eq(cli(args), 2, "%s", bad[i]);
        char *err = slurp(err_path);
        cr_expect(strstr(err, "shardfeed: "), "%s: stderr: %s", bad[i], err);
        free(err);
    }
    cr_expect_eq(cli("pack onlyone"), 2);
    cr_expect_eq(cli("inspect"), 2);
    cr_expect_neq(access(dest, F_OK), 0, "nothing was written");
    /* a failure that is not about usage: exit 1 with the reason */
    char args[2048];
    snprintf(args, sizeof(args), "pack '%s/missing' '%s'", tmp, dest);
    cr_expect_eq(cli(args), 1);
    char *err = slurp(err_path);
    cr_expect(strstr(err, "missing") && strstr(err, "SF_ERR_NOT_FOUND"), "stderr: %s", err);
    free(err);
}

Test(pack, cli_inspect_names_shard_and_offset_of_corruption)
{
    make_flat();
    char dest[800], args[2048];
    dest_path(dest, sizeof(dest), "out");
    snprintf(args, sizeof(args), "pack '%s' '%s' --no-progress", src, dest);
    cr_assert_eq(cli(args), 0);
    /* flip a byte in the second member's header: its checksum fails */
    char shard[900];
    path_in(shard, sizeof(shard), dest, "shard-000000.tar");
    size_t n;
    unsigned char *b = load(shard, &n);
    size_t second = 512 + (3000 + 511) / 512 * 512; /* 000000.jpg is 3000 bytes */
    cr_assert_lt(second + 10, n);
    b[second + 10] ^= 0x55;
    cr_assert_eq(test_write_file(dest, "shard-000000.tar", b, n), 0);
    free(b);
    snprintf(args, sizeof(args), "inspect '%s'", shard);
    cr_expect_eq(cli(args), 1);
    char *err = slurp(err_path);
    char off[64];
    snprintf(off, sizeof(off), "%zu", second);
    cr_expect(strstr(err, "shard-000000.tar") && strstr(err, off) && strstr(err, "SF_ERR_CORRUPT"),
              "stderr: %s", err);
    free(err);
    snprintf(args, sizeof(args), "inspect --json '%s'", shard);
    cr_expect_eq(cli(args), 1);
    cJSON *j = load_json(out_path);
    cr_expect_eq(jnum(j, "error_offset"), second);
    cr_expect_str_eq(jstr(j, "status"), "SF_ERR_CORRUPT");
    cJSON_Delete(j);
    /* a missing shard */
    snprintf(args, sizeof(args), "inspect '%s/nope.tar'", dest);
    cr_expect_eq(cli(args), 1);
}

Test(pack, cli_pack_to_s3)
{
    make_flat();
    start_mock();
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    char args[4096];
    snprintf(args, sizeof(args),
             "pack '%s' s3://bucket/cli --endpoint-url %s --format record --shard-size 16K "
             "--tmp-dir '%s' --json",
             src, srv.url, tmp);
    int rc = cli(args);
    char *err = slurp(err_path);
    cr_assert_eq(rc, 0, "stderr: %s", err);
    free(err);
    cJSON *j = load_json(out_path);
    double shards = jnum(j, "shards");
    cJSON_Delete(j);
    cr_expect_gt(shards, 2);
    cr_expect_eq(mock_count("PutObject", NULL), shards + 1);
    snprintf(args, sizeof(args),
             "inspect s3://bucket/cli/shard-000001.sfr --endpoint-url %s --json", srv.url);
    cr_assert_eq(cli(args), 0);
    j = load_json(out_path);
    cr_expect_str_eq(jstr(j, "format"), "record");
    cr_expect_gt(jnum(j, "sample_count"), 0);
    cJSON_Delete(j);
}

Test(pack, cli_pack_to_s3_in_parts_and_a_failed_part_names_the_object)
{
    make_large();
    start_mock();
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    char args[4096];
    snprintf(args, sizeof(args),
             "pack '%s' s3://bucket/cli --endpoint-url %s --shard-size 13M --part-size 5M "
             "--tmp-dir '%s' --json --no-progress",
             src, srv.url, tmp);
    int rc = cli(args);
    char *err = slurp(err_path);
    cr_assert_eq(rc, 0, "stderr: %s", err);
    free(err);
    cr_expect_eq(mock_count("CompleteMultipartUpload", NULL), 2);
    char etag[128] = "";
    cr_expect_eq(signed_call("HEAD", "/bucket/cli/shard-000001.tar", NULL, etag, sizeof(etag)),
                 200);
    cr_expect(strstr(etag, "-3\""), "ETag %s", etag);

    /* a part refused for good: non-zero exit, the object named, nothing left */
    cr_assert_eq(
        admin("POST", "/_mock/fault?prefix=bucket/cli2/shard-000001&fault=400&count=1", NULL), 200);
    snprintf(args, sizeof(args),
             "pack '%s' s3://bucket/cli2 --endpoint-url %s --shard-size 13M --part-size 5M "
             "--tmp-dir '%s' --no-progress",
             src, srv.url, tmp);
    rc = cli(args);
    err = slurp(err_path);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(err, "s3://bucket/cli2/shard-000001.tar") && strstr(err, "part "),
              "stderr: %s", err);
    free(err);
    cr_expect_eq(uploads_in_progress(), 0);
    cr_expect_eq(cli("pack a b --part-size 1M"), 2, "a part size under 5M is a usage error");
}

/* ============================================================ --max-side */

#include <turbojpeg.h>

/* A smooth RGB (or gray) picture as a JPEG, for re-encoding tests. */
static void add_jpeg(const char *rel, int w, int h, int gray, int quality)
{
    const int ch = gray ? 1 : 3;
    unsigned char *px = malloc((size_t)w * h * ch);
    cr_assert(px);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++)
                px[((size_t)y * w + x) * ch + c] =
                    (unsigned char)((x * 255 / w + y * 128 / h + c * 60) % 256);
    tjhandle t = tjInitCompress();
    unsigned char *jpeg = NULL;
    unsigned long n = 0;
    cr_assert_eq(tjCompress2(t, px, w, 0, h, gray ? TJPF_GRAY : TJPF_RGB, &jpeg, &n,
                             gray ? TJSAMP_GRAY : TJSAMP_444, quality, 0),
                 0);
    add_bytes(rel, jpeg, n);
    tjFree(jpeg);
    tjDestroy(t);
    free(px);
}

struct jinfo {
    int w, h, colorspace;
};

static struct jinfo jpeg_info(const char *path)
{
    size_t n;
    unsigned char *b = load(path, &n);
    struct jinfo j = {0, 0, -1};
    int sub;
    tjhandle t = tjInitDecompress();
    cr_assert_eq(tjDecompressHeader3(t, b, (unsigned long)n, &j.w, &j.h, &sub, &j.colorspace), 0,
                 "%s is not a JPEG", path);
    tjDestroy(t);
    free(b);
    return j;
}

Test(pack, max_side_shrinks_large_jpegs_and_keeps_everything_else)
{
    add_jpeg("big.jpg", 800, 600, 0, 95);
    add_jpeg("small.jpg", 200, 150, 0, 95);
    add_jpeg("tall.JPEG", 300, 1000, 1, 95);
    add_text("big.txt", 3000);
    add_random("noise.png", 5000, 3);
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.layout = SF_PACK_LAYOUT_FLAT;
    o.max_side = 256;
    o.jpeg_quality = 85;
    o.threads = 3;
    char dest[800], err[1024];
    dest_path(dest, sizeof(dest), "out");
    struct sf_pack_result res;
    sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_expect_eq(res.reencoded, 2u, "big.jpg and tall.JPEG");
    cr_expect(res.reencoded_bytes > 0 && res.reencoded_bytes < res.reencoded_source_bytes,
              "%llu -> %llu bytes", res.reencoded_source_bytes, res.reencoded_bytes);
    cr_expect_lt(res.shard_bytes, res.source_bytes);

    /* GNU tar gives the files back: the small JPEG, the text and the png
     * byte for byte, the big ones shrunk to a longer side of 256. */
    char x[900], path[1000];
    dest_path(x, sizeof(x), "x");
    cr_assert_eq(sh("mkdir -p '%s' && tar -xf '%s/shard-000000.tar' -C '%s'", x, dest, x), 0);
    for (const char *same[] = {"small.jpg", "big.txt", "noise.png"}, **f = same; f < same + 3;
         f++) {
        char a[1000];
        snprintf(a, sizeof(a), "%s/%s", src, *f);
        snprintf(path, sizeof(path), "%s/%s", x, *f);
        expect_same_file(a, path);
    }
    snprintf(path, sizeof(path), "%s/big.jpg", x);
    struct jinfo j = jpeg_info(path);
    cr_expect(j.w == 256 && j.h == 192 && j.colorspace != TJCS_GRAY, "big.jpg: %dx%d", j.w, j.h);
    /* The pixels are the picture's, shrunk: close to the source sampled at
     * the same places (a smooth picture, so the filter barely matters). */
    {
        size_t n;
        unsigned char *b = load(path, &n);
        unsigned char *px = malloc(256 * 192 * 3);
        tjhandle t = tjInitDecompress();
        cr_assert_eq(tjDecompress2(t, b, (unsigned long)n, px, 256, 0, 192, TJPF_RGB, 0), 0);
        tjDestroy(t);
        double diff = 0;
        for (int y = 0; y < 192; y++)
            for (int xx = 0; xx < 256; xx++)
                for (int c = 0; c < 3; c++) {
                    int sx = (int)((xx + 0.5) * 800 / 256), sy = (int)((y + 0.5) * 600 / 192);
                    int want = (sx * 255 / 800 + sy * 128 / 600 + c * 60) % 256;
                    int d = px[((size_t)y * 256 + xx) * 3 + c] - want;
                    /* the picture wraps from 255 to 0: far from those edges only */
                    if (want > 20 && want < 235)
                        diff += d < 0 ? -d : d;
                }
        cr_expect_lt(diff / (256.0 * 192 * 3), 6.0, "mean difference %.2f",
                     diff / (256.0 * 192 * 3));
        free(px);
        free(b);
    }
    snprintf(path, sizeof(path), "%s/tall.JPEG", x);
    j = jpeg_info(path);
    cr_expect(j.w == 77 && j.h == 256 && j.colorspace == TJCS_GRAY, "tall.JPEG: %dx%d cs %d", j.w,
              j.h, j.colorspace);

    /* index.json says what was done. */
    path_in(path, sizeof(path), dest, "index.json");
    cJSON *idx = load_json(path);
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(idx, "reencode");
    cr_expect(re && jnum(re, "max_side") == 256 && jnum(re, "quality") == 85);
    cJSON_Delete(idx);

    /* One thread writes the same bytes as three. */
    char dest1[800];
    dest_path(dest1, sizeof(dest1), "out1");
    o.threads = 1;
    st = do_pack(dest1, &o, &res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    char a[1000];
    snprintf(a, sizeof(a), "%s/shard-000000.tar", dest);
    snprintf(path, sizeof(path), "%s/shard-000000.tar", dest1);
    expect_same_file(a, path);
}

Test(pack, max_side_fails_on_a_broken_jpeg_naming_it)
{
    add_jpeg("a.jpg", 640, 480, 0, 90);
    add_jpeg("b.jpg", 640, 480, 0, 90);
    /* b.jpg cut in half: a header that says 640x480 and half the data. */
    char p[1000];
    snprintf(p, sizeof(p), "%s/b.jpg", src);
    size_t n;
    unsigned char *b = load(p, &n);
    cr_assert_eq(test_write_file(src, "b.jpg", b, n / 2), 0);
    free(b);
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.layout = SF_PACK_LAYOUT_FLAT;
    o.max_side = 320;
    char dest[800], err[1024] = "";
    dest_path(dest, sizeof(dest), "out");
    sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CORRUPT, "%s: %s", sf_status_name(st), err);
    cr_expect(strstr(err, "b.jpg") && strstr(err, "cannot re-encode"), "%s", err);
    path_in(p, sizeof(p), dest, "index.json");
    cr_expect(access(p, F_OK) != 0, "no index.json after a failed pack");

    /* Bad option values are refused before anything is written. */
    o.max_side = 8;
    cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    o.max_side = 0;
    o.jpeg_quality = 80;
    err[0] = '\0';
    cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "max side") != NULL, "%s", err);
    o.max_side = 320;
    o.jpeg_quality = 101;
    cr_expect_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    /* The CLI: bad usage exits 2, a broken JPEG 1. */
    cr_expect_eq(sh("'%s' pack '%s' '%s' --quality 80 --no-progress 2>/dev/null", SF_CLI_BIN, src,
                    dest),
                 2);
    cr_expect_eq(sh("'%s' pack '%s' '%s' --max-side 4 --no-progress 2>/dev/null", SF_CLI_BIN, src,
                    dest),
                 2);
    cr_expect_eq(sh("'%s' pack '%s' '%s' --max-side 320 --no-progress 2>/dev/null", SF_CLI_BIN,
                    src, dest),
                 1);
}
