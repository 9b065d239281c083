/* The pack suite's fixture (pack_fixture.h). */
#include "pack_fixture.h"
#include "support/files.h"

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

char *tmp;
char src[700];
struct tfile files[MAX_FILES];
size_t n_files;
struct mock_proc srv;
struct sf_s3 *s3;

void pack_setup(void)
{
    tmp = test_tmpdir();
    cr_assert(tmp);
    test_isolate_aws_env(tmp);
    snprintf(src, sizeof(src), "%s/src", tmp);
    cr_assert(mkdir(src, 0755) == 0);
    n_files = 0;
}

void pack_teardown(void)
{
    for (size_t i = 0; i < n_files; i++)
        free(files[i].data);
    n_files = 0;
    mock_env_stop(&srv, &tmp, &s3);
}

/* ------------------------------------------------------------ source trees */

void add_bytes(const char *rel, const void *data, size_t size)
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

void add_random(const char *rel, size_t size, unsigned seed)
{
    unsigned char *b = malloc(size ? size : 1);
    cr_assert(b);
    test_fill(b, size, seed);
    add_bytes(rel, b, size);
    free(b);
}

void add_text(const char *rel, size_t size)
{
    char *b = malloc(size + 1);
    cr_assert(b);
    for (size_t i = 0; i < size; i++)
        b[i] = "the quick brown fox jumps over the lazy dog\n"[i % 44];
    add_bytes(rel, b, size);
    free(b);
}

void add_hidden(const char *rel)
{
    cr_assert(test_write_file(src, rel, "x", 1) == 0);
}

const char *const classes[3] = {"Ant", "cat", "dog"}; /* byte order: 'A' < 'c' */

void make_imagefolder(void)
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

void make_flat(void)
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

void path_in(char *out, size_t n, const char *dir, const char *name)
{
    int r = snprintf(out, n, "%s/%s", dir, name);
    cr_assert(r > 0 && (size_t)r < n, "path too long: %s/%s", dir, name);
}

struct read_stats {
    size_t samples;
    unsigned long long decompressed;
};

/* Reads one shard (bytes in memory) with the public reader and checks every
 * field against the source files; with labels, every sample carries a cls
 * field equal to its class's index in classes[]. */
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

size_t list_shards(const char *dir, char names[][256], size_t max)
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

size_t check_pack(const char *dest, const char *format, int labels, unsigned long long shard_bytes,
                  unsigned long long *decompressed)
{
    for (size_t i = 0; i < n_files; i++)
        files[i].seen = 0;
    char path[1200];
    path_in(path, sizeof(path), dest, "index.json");
    cJSON *idx = test_load_json(path);
    cr_expect_str_eq(test_jstr(idx, "format"), format);
    cr_expect_eq(test_jnum(idx, "version"), 1);
    cr_expect_str_eq(test_jstr(idx, "layout"), labels ? "imagefolder" : "flat");
    static char names[256][256];
    size_t n = list_shards(dest, names, 256);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(idx, "shards");
    cr_assert(cJSON_IsArray(shards));
    cr_assert_eq((size_t)cJSON_GetArraySize(shards), n, "index lists every shard file");
    cr_expect_eq(test_jnum(idx, "shard_count"), n);
    size_t samples = 0;
    unsigned long long bytes = 0, dec = 0;
    for (size_t i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetArrayItem(shards, (int)i);
        cr_assert_str_eq(test_jstr(s, "name"), names[i], "shards in order");
        path_in(path, sizeof(path), dest, names[i]);
        size_t len;
        unsigned char *b = test_load(path, &len);
        cr_expect_eq(test_jnum(s, "bytes"), len, "%s", names[i]);
        char hex[17];
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)XXH3_64bits(b, len));
        cr_expect_str_eq(test_jstr(s, "xxh3_64"), hex, "%s checksum", names[i]);
        struct read_stats rs =
            check_shard(names[i], b, len, labels,
                        !strcmp(format, "tar") ? SF_SHARD_FORMAT_TAR : SF_SHARD_FORMAT_RECORD);
        cr_expect_eq(test_jnum(s, "samples"), rs.samples, "%s sample count", names[i]);
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
    cr_expect_eq(test_jnum(idx, "sample_count"), samples);
    cr_expect_eq(test_jnum(idx, "file_count"), n_files);
    cr_expect_eq(test_jnum(idx, "bytes"), bytes);
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(idx, "classes");
    if (labels) {
        cr_assert(cJSON_IsArray(cl));
        cr_assert_eq(cJSON_GetArraySize(cl), 3);
        for (int i = 0; i < 3; i++)
            cr_expect_str_eq(cJSON_GetArrayItem(cl, i)->valuestring, classes[i]);
        const cJSON *fields = cJSON_GetObjectItemCaseSensitive(idx, "fields");
        cr_expect_eq(test_jnum(fields, "cls"), samples);
    } else {
        cr_expect_null(cl);
    }
    cJSON_Delete(idx);
    if (decompressed)
        *decompressed = dec;
    return n;
}

sf_status do_pack(const char *dest, const struct sf_pack_options *o, struct sf_pack_result *res,
                  char *err, size_t err_len)
{
    return sf_pack(src, dest, o, res, err, err_len);
}

void dest_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmp, name);
}

void pack_out(const struct sf_pack_options *o, char *dest, struct sf_pack_result *res)
{
    char err[1024] = "";
    dest_path(dest, 800, "out");
    sf_status st = do_pack(dest, o, res, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
}

void expect_same_file(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *x = test_load(a, &na), *y = test_load(b, &nb);
    cr_expect(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x);
    free(y);
}

void start_mock(void)
{
    char root[800];
    snprintf(root, sizeof(root), "%s/root", tmp);
    cr_assert(mkdir(root, 0755) == 0);
    char b[900];
    snprintf(b, sizeof(b), "%s/bucket", root);
    cr_assert(mkdir(b, 0755) == 0);
    mock_env_start(&srv, root, NULL);
    /* for the CLI, a child that reads them */
    setenv("AWS_ACCESS_KEY_ID", "mock-access-key", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "mock-secret-key", 1);
    struct sf_s3_options so;
    mock_env_s3_fast(&so, srv.url, 4, 64 * 1024);
    so.retry_cap_ms = 100;
    s3 = mock_env_s3_new(&so);
}

long admin(const char *method, const char *path_query, char **out)
{
    return mock_env_admin(&srv, method, path_query, NULL, out);
}

double mock_count(const char *op, const char *status)
{
    cJSON *j = mock_env_stats(&srv);
    double n = mock_env_jnum(j, op ? "operations" : "status", op ? op : status, NULL, NULL);
    cJSON_Delete(j);
    return n;
}

unsigned char *get_object(const char *url, size_t *size)
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

const struct s3_creds mock_creds = {"mock-access-key", "mock-secret-key", NULL, NULL};

long signed_call(const char *method, const char *target, char **out, char *etag, size_t etag_len)
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

int uploads_in_progress(void)
{
    char *body = NULL;
    cr_assert_eq(signed_call("GET", "/bucket?uploads", &body, NULL, 0), 200);
    int n = 0;
    for (const char *p = body; (p = strstr(p, "<Upload>")); p += 8)
        n++;
    free(body);
    return n;
}

double mock_key_count(const char *key, const char *op)
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

void multipart_etag_of(const unsigned char *data, size_t n, size_t part, char *out, size_t out_len)
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

void s3_options(struct sf_pack_options *o, unsigned long long shard_bytes)
{
    sf_pack_options_init_default(o);
    if (shard_bytes)
        o->shard_bytes = shard_bytes;
    o->s3 = s3;
    o->tmp_dir = tmp;
}

void large_options(struct sf_pack_options *o)
{
    s3_options(o, 13ull << 20);
    o->part_bytes = 5ull << 20;
}

void make_large(void)
{
    for (int i = 0; i < 24; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "%06d.bin", i);
        add_random(rel, 1024 * 1024 - 700, 500 + (unsigned)i);
    }
}

char out_path[900], err_path[900];

int cli(const char *args)
{
    snprintf(out_path, sizeof(out_path), "%s/cli.out", tmp);
    snprintf(err_path, sizeof(err_path), "%s/cli.err", tmp);
    return test_sh("'%s' %s > '%s' 2> '%s'", SF_CLI_BIN, args, out_path, err_path);
}

void cli_ok(const char *args)
{
    int rc = cli(args);
    char *err = test_slurp(err_path);
    cr_assert_eq(rc, 0, "stderr: %s", err);
    free(err);
}
