/* sf_index_shards() and `shardfeed index`: shards made by pack (with their
 * index.json deleted) and by the system tar are read back over the mock
 * server, and the index must list the counts, sizes and checksums pack
 * wrote, or that the files have; broken, missing and changing shards fail
 * naming the shard (and the byte offset); a shard far larger than the window
 * is read through it. The fixture (mock, datasets, checks) is index_fixture.c. */
#include "index_fixture.h"
#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "src/index_json.h"
#include "support/files.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

TestSuite(index, .init = index_setup, .fini = index_teardown, .timeout = 240);

static char out_path[900], err_path[900];

/* Runs the built shardfeed with args; stdout and stderr go to files. */
static int cli(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int cli(const char *fmt, ...)
{
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(out_path, sizeof(out_path), "%s/cli.out", tmp);
    snprintf(err_path, sizeof(err_path), "%s/cli.err", tmp);
    return test_sh("'%s' %s > '%s' 2> '%s'", SF_CLI_BIN, args, out_path, err_path);
}

/* Packs src into bucket/rel with pack, returns pack's index.json (parsed)
 * and deletes it. */
static cJSON *pack_then_drop_index(const char *src, const char *rel, enum sf_pack_format format,
                                   int zstd, unsigned long long shard_bytes)
{
    char dest[900], idx[1000], err[1024];
    in_bucket(dest, sizeof(dest), rel);
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.format = format;
    o.zstd_level = zstd;
    o.shard_bytes = shard_bytes;
    struct sf_pack_result pr;
    sf_status st = sf_pack(src, dest, &o, &pr, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "pack: %s", err);
    snprintf(idx, sizeof(idx), "%s/index.json", dest);
    char *text = test_slurp(idx);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert(j);
    cr_assert_eq(unlink(idx), 0);
    return j;
}

/* A shard name with an escaped NUL would match another shard once cJSON
 * cut it ("a.tar\u0000x" read as "a.tar"): the index is refused, naming
 * the index and the field. */
Test(index, an_index_naming_a_shard_with_a_nul_is_refused)
{
    struct sf_object_info a = {.url = "s3://b/ds/a.tar", .size = 10},
                          b = {.url = "s3://b/ds/b.tar", .size = 10};
    const struct sf_object_info *objs[] = {&a, &b};
    const char *json = "{\"shards\": [{\"name\": \"a.tar\", \"bytes\": 10, \"samples\": 3},"
                       " {\"name\": \"b.tar\\u0000.old\", \"bytes\": 10, \"samples\": 9}]}";
    char err[512] = "";
    cr_expect_eq(
        sf__index_json_check(json, "s3://b/ds/index.json", 10, objs, 2, 1, err, sizeof err),
        SF_ERR_CORRUPT);
    cr_expect(strstr(err, "s3://b/ds/index.json") && strstr(err, "shards[1].name") &&
                  strstr(err, "NUL"),
              "%s", err);
    uint64_t counts[2] = {0, 0};
    int all = -1;
    err[0] = 0;
    cr_expect_eq(
        sf__index_json_counts(json, "s3://b/ds/index.json", objs, 2, counts, &all, err, sizeof err),
        SF_ERR_CORRUPT);
    cr_expect_eq(all, 0);
    cr_expect_eq(counts[1], 0u, "the count of another name was taken");
    cr_expect(strstr(err, "shards[1].name"), "%s", err);
    /* A name that is only a NUL is named by its place (it was "the name of
     * " and nothing: found by fuzz_index). */
    const char *key = "{\"\\u0000\": 1, \"shards\": [{\"name\": \"a.tar\", \"samples\": 3}]}";
    err[0] = 0;
    cr_expect_eq(sf__index_json_counts(key, "index.json", objs, 2, counts, &all, err, sizeof err),
                 SF_ERR_CORRUPT);
    cr_expect(strstr(err, "index.json: the name of (member 0) holds a NUL"), "%s", err);
}

/* Whoever controls the bucket controls index.json: a count the loader reads
 * is a finite whole number in range, or the open fails naming the index,
 * the shard and the field (issue 17: 1e300 and 1e999 converted out of
 * range under UBSan, 12.5 was cut to 12). */
Test(index, loader_counts_are_whole_numbers_in_range)
{
    struct sf_object_info a = {.url = "s3://b/ds/a.tar"}, b = {.url = "s3://b/ds/b.tar"};
    const struct sf_object_info *objs[] = {&a, &b};
    static const char *const bad[] = {"1e300", "1e999", "-1e999", "18446744073709551616",
                                      "1e20",  "12.5",  "-1",     "\"12\"",
                                      "null",  "true"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"shards\": [{\"name\": \"a.tar\", \"samples\": 3},"
                 " {\"name\": \"b.tar\", \"samples\": %s}]}",
                 bad[k]);
        uint64_t counts[2] = {0, 0};
        int all = -1;
        char err[256] = "";
        sf_status st = sf__index_json_counts(json, "s3://b/ds/index.json", objs, 2, counts, &all,
                                             err, sizeof err);
        cr_expect_eq(st, SF_ERR_CORRUPT, "samples %s: status %d", bad[k], (int)st);
        cr_expect_eq(all, 0, "samples %s taken", bad[k]);
        cr_expect(strstr(err, "s3://b/ds/index.json") && strstr(err, "'b.tar'") &&
                      strstr(err, "\"samples\""),
                  "samples %s: message does not name the index, shard and field: %s", bad[k], err);
    }
    /* A long path in the entry does not push the field out of the message:
     * the shard is named by its own file name (fuzz_index). */
    {
        char json[2048], dirs[1601];
        for (int i = 0; i < 400; i++)
            memcpy(dirs + 4 * i, "dir/", 4);
        dirs[1600] = '\0';
        snprintf(json, sizeof json,
                 "{\"shards\": [{\"name\": \"a.tar\", \"samples\": 3},"
                 " {\"name\": \"%sb.tar\", \"samples\": 1.5}]}",
                 dirs);
        uint64_t counts[2];
        int all = -1;
        char err[256] = "";
        cr_expect_eq(
            sf__index_json_counts(json, "index.json", objs, 2, counts, &all, err, sizeof err),
            SF_ERR_CORRUPT);
        cr_expect(strstr(err, "'b.tar'") && strstr(err, "\"samples\" is 1.5"), "%s", err);
    }
    /* The largest whole doubles in range, zero, and an entry without a
     * count for a shard the loader does not read are fine. */
    const char *good = "{\"shards\": [{\"name\": \"a.tar\", \"samples\": 0},"
                       " {\"name\": \"c.tar\", \"samples\": 1e999},"
                       " {\"name\": \"b.tar\", \"samples\": 18446744073709549568}]}";
    uint64_t counts[2] = {7, 7};
    int all = 0;
    char err[256] = "";
    cr_expect_eq(sf__index_json_counts(good, NULL, objs, 2, counts, &all, err, sizeof err), SF_OK,
                 "%s", err);
    cr_expect_eq(all, 1);
    cr_expect_eq(counts[0], 0u);
    cr_expect_eq(counts[1], 18446744073709549568ull);
    /* Not JSON, or a shard not listed: no counts, no error (estimates). */
    cr_expect_eq(sf__index_json_counts("{", NULL, objs, 2, counts, &all, err, sizeof err), SF_OK);
    cr_expect_eq(all, 0);
    cr_expect_eq(sf__index_json_counts("{\"shards\": [{\"name\": \"a.tar\", "
                                       "\"samples\": 1}]}",
                                       NULL, objs, 2, counts, &all, err, sizeof err),
                 SF_OK);
    cr_expect_eq(all, 0);
}

/* Size of a tar member's header plus data, padded. */
static size_t tar_member(size_t size)
{
    return 512 + (size + 511) / 512 * 512;
}

/* ============================================================ agreement with pack */

Test(index, matches_the_index_pack_wrote)
{
    char src[800];
    snprintf(src, sizeof(src), "%s/src", tmp);
    make_flat(src, 40, 2000);
    cJSON *ptar = pack_then_drop_index(src, "ds", SF_PACK_FORMAT_TAR, 0, 64 * 1024);
    /* record shards larger than the 64 KiB window used below: records cross its end */
    cJSON *prec = pack_then_drop_index(src, "rec", SF_PACK_FORMAT_RECORD, 3, 256 * 1024);
    cr_assert_gt(test_jnum(ptar, "shard_count"), 3);
    start_mock(NULL);

    struct sf_index_result res;
    cJSON *mine = NULL;
    char err[1024];
    sf_status st = run_index("s3://bucket/ds/", NULL, &res, &mine, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    expect_same_as_pack(mine, ptar);
    cr_expect_str_eq(res.index_url, "s3://bucket/ds/index.json");
    cr_expect_eq(res.shards, test_jnum(ptar, "shard_count"));
    cr_expect_eq(res.tar_shards, res.shards);
    cr_expect_eq(res.samples, 40);
    expect_loader_counts(res.json, "s3://bucket/ds/", jget(mine, "shards"));
    double shard_bytes = test_jnum(ptar, "bytes");
    cJSON_Delete(mine);
    sf_index_result_clear(&res);
    cr_expect_null(res.json);

    /* record shards with zstd records, through a small window */
    struct sf_index_options o;
    sf_index_options_init_default(&o);
    o.window_bytes = 64 * 1024;
    o.parallel = 3;
    st = run_index("s3://bucket/rec/", &o, &res, &mine, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    expect_same_as_pack(mine, prec);
    cr_expect_eq(res.record_shards, res.shards);
    cr_expect_eq(res.counted_by_index, 0);
    shard_bytes += test_jnum(prec, "bytes");
    cJSON_Delete(mine);
    sf_index_result_clear(&res);

    /* every shard was read once: the bytes sent are the shards' plus the listings */
    double sent = mock_stat(NULL, "bytes_sent");
    cr_expect_geq(sent, shard_bytes);
    cr_expect_lt(sent, shard_bytes + 64 * 1024, "sent %.0f for %.0f bytes of shards", sent,
                 shard_bytes);
    cJSON_Delete(ptar);
    cJSON_Delete(prec);
}

/* ============================================================ shards made by tar */

Test(index, counts_gnu_and_pax_tar_shards_made_by_tar)
{
    char files[800];
    snprintf(files, sizeof(files), "%s/files", tmp);
    /* 12 samples of three files each */
    for (int i = 0; i < 12; i++) {
        char stem[64];
        snprintf(stem, sizeof(stem), "k%02d", i);
        put_sample(files, stem, 500 + (size_t)i * 431, (unsigned)i + 7, "cls", "3", "json", "{}");
    }
    /* a name longer than ustar holds (GNU 'L' header; pax 'x' header) */
    char lng[200];
    memset(lng, 'n', 150);
    lng[150] = '\0';
    put_sample(files, lng, 3000, 99, "cls", "1", NULL, NULL);
    cr_assert_eq(test_write_file(files, "README", "not a sample", 12), 0);
    char gnu[900];
    in_bucket(gnu, sizeof(gnu), "gnu");
    cr_assert_eq(mkdir(gnu, 0755), 0);
    cr_assert_eq(test_sh("cd '%s' && tar --format=gnu -cf '%s/shard-0.tar' k00.* k01.* k02.* k03.* "
                    "k04.*",
                    files, gnu),
                 0);
    cr_assert_eq(
        test_sh("cd '%s' && tar --format=gnu -cf '%s/shard-1.tar' README k05.* k06.* k07.* "
                "k08.* %s.*",
                files, gnu, lng),
        0);
    cr_assert_eq(
        test_sh("cd '%s' && tar --format=posix -cf '%s/shard-2.tar' k09.* k10.* k11.* %s.*", files,
                gnu, lng),
        0);
    /* 40 samples whose every member has a long name: GNU 'L' and pax 'x'
     * headers, larger than the small window below (so names and headers
     * cross its end) */
    char sub[900];
    snprintf(sub, sizeof(sub), "%s/long", files);
    for (int i = 0; i < 40; i++) {
        char stem[256];
        snprintf(stem, sizeof(stem), "%s%02d", lng, i);
        put_sample(sub, stem, 3000 + (size_t)i * 37, (unsigned)i + 200, "cls", "2", NULL, NULL);
    }
    cr_assert_eq(
        test_sh("cd '%s' && tar --format=gnu --sort=name -cf '%s/shard-3.tar' long", files, gnu),
        0);
    cr_assert_eq(
        test_sh("cd '%s' && tar --format=posix --sort=name -cf '%s/shard-4.tar' long", files, gnu),
        0);
    const int want[5] = {5, 5, 4, 40, 40};
    start_mock(NULL);

    /* the CLI writes s3://bucket/gnu/index.json beside the shards */
    int rc = cli("index 's3://bucket/gnu/shard-{0..4}.tar' --endpoint-url %s", srv.url);
    char *e = test_slurp(err_path);
    cr_assert_eq(rc, 0, "stderr: %s", e);
    free(e);
    char *out = test_slurp(out_path);
    cr_expect(strstr(out, "indexed 5 shards") && strstr(out, "94 samples") &&
                  strstr(out, "s3://bucket/gnu/index.json"),
              "stdout: %s", out);
    free(out);
    char *text = get_text("s3://bucket/gnu/index.json");
    cJSON *j = cJSON_Parse(text);
    cr_assert(j, "%s", text);
    cr_expect_str_eq(test_jstr(j, "format"), "tar");
    cr_expect_eq(test_jnum(j, "sample_count"), 94);
    const cJSON *shards = jget(j, "shards");
    cr_assert_eq(cJSON_GetArraySize(shards), 5);
    for (int i = 0; i < 5; i++) {
        const cJSON *s = cJSON_GetArrayItem(shards, i);
        char name[32], path[1000];
        snprintf(name, sizeof(name), "shard-%d.tar", i);
        snprintf(path, sizeof(path), "%s/%s", gnu, name);
        size_t size;
        uint64_t h = file_xxh3(path, &size);
        char hex[17];
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
        cr_expect_str_eq(test_jstr(s, "name"), name);
        cr_expect_eq(test_jnum(s, "samples"), want[i], "%s", name);
        cr_expect_eq(test_jnum(s, "bytes"), size, "%s", name);
        cr_expect_str_eq(test_jstr(s, "xxh3_64"), hex, "%s", name);
    }
    const cJSON *fields = jget(j, "fields");
    cr_expect_eq(test_jnum(fields, "jpg"), 94);
    cr_expect_eq(test_jnum(fields, "cls"), 94);
    cr_expect_eq(test_jnum(fields, "json"), 12);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "classes"), "classes are pack's only");
    expect_loader_counts(text, "s3://bucket/gnu/", shards);
    cJSON_Delete(j);

    /* the smallest window, one shard at a time: the same index, byte for byte */
    struct sf_index_options o;
    sf_index_options_init_default(&o);
    o.window_bytes = 64 * 1024;
    o.parallel = 1;
    struct sf_index_result res;
    char err[1024];
    sf_status st = run_index("s3://bucket/gnu/shard-{0..4}.tar", &o, &res, NULL, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_expect_str_eq(res.json, text);
    sf_index_result_clear(&res);
    free(text);
}

/* ============================================================ --dry-run, -o */

/* Three GNU tar shards of 4 samples in dir (made by tar). */
static void make_tar_shards(const char *dir)
{
    char files[800];
    snprintf(files, sizeof(files), "%s/tarfiles", tmp);
    for (int i = 0; i < 12; i++) {
        char stem[64];
        snprintf(stem, sizeof(stem), "s%02d", i);
        put_sample(files, stem, 1000 + (size_t)i * 100, (unsigned)i + 40, "txt", "t", NULL, NULL);
    }
    cr_assert_eq(test_sh("mkdir -p '%s'", dir), 0);
    for (int s = 0; s < 3; s++)
        cr_assert_eq(
            test_sh("cd '%s' && tar --format=gnu -cf '%s/part-%d.tar' s%02d.* s%02d.* s%02d.* "
                    "s%02d.*",
                    files, dir, s, 4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3),
            0);
}

Test(index, dry_run_prints_and_writes_nothing)
{
    char local[800], idx[900];
    snprintf(local, sizeof(local), "%s/local", tmp);
    make_tar_shards(local);
    snprintf(idx, sizeof(idx), "%s/index.json", local);

    cr_assert_eq(cli("index '%s/' --dry-run", local), 0);
    cr_expect_neq(access(idx, F_OK), 0, "--dry-run wrote %s", idx);
    char *dry = test_slurp(out_path);
    cJSON *j = cJSON_Parse(dry);
    cr_assert(j, "stdout: %s", dry);
    cr_expect_eq(test_jnum(j, "shard_count"), 3);
    cr_expect_eq(test_jnum(j, "sample_count"), 12);
    cJSON_Delete(j);
    char *e = test_slurp(err_path);
    cr_expect_str_empty(e, "no progress without a terminal: %s", e);
    free(e);

    /* the same run without --dry-run writes exactly that, atomically (no
     * temporary file left) */
    cr_assert_eq(cli("index '%s/'", local), 0);
    char *written = test_slurp(idx);
    cr_expect_str_eq(written, dry);
    free(written);
    cr_expect_eq(test_sh("ls -a '%s' | grep -q '\\.tmp-'", local), 1, "a temporary file was left");

    /* -o elsewhere: names are relative to the index's folder */
    char other[900];
    snprintf(other, sizeof(other), "%s/elsewhere.json", tmp);
    cr_assert_eq(cli("index '%s/part-{0..2}.tar' -o '%s' --json", local, other), 0);
    char *stext = test_slurp(out_path);
    cJSON *summary = cJSON_Parse(stext);
    free(stext);
    cr_assert(summary);
    cr_expect_str_eq(test_jstr(summary, "index"), other);
    cr_expect_eq(test_jnum(summary, "samples"), 12);
    cJSON_Delete(summary);
    char *otext = test_slurp(other);
    j = cJSON_Parse(otext);
    cr_assert(j);
    cr_expect_str_eq(test_jstr(cJSON_GetArrayItem(jget(j, "shards"), 0), "name"),
                     "local/part-0.tar");
    cJSON_Delete(j);
    free(otext);
    free(dry);

    /* on the mock: no PUT, no index.json */
    char s3dir[900];
    in_bucket(s3dir, sizeof(s3dir), "ds");
    cr_assert_eq(test_sh("cp -r '%s' '%s'", local, s3dir), 0);
    cr_assert_eq(test_sh("rm -f '%s/index.json'", s3dir), 0);
    start_mock(NULL);
    cr_assert_eq(cli("index s3://bucket/ds/ --dry-run --endpoint-url %s", srv.url), 0);
    stext = test_slurp(out_path);
    j = cJSON_Parse(stext);
    free(stext);
    cr_assert(j);
    cr_expect_eq(test_jnum(j, "sample_count"), 12);
    cJSON_Delete(j);
    cr_expect_eq(mock_stat("operations", "PutObject"), 0);
    struct sf_object_info info;
    cr_expect_eq(sf_s3_stat(s3, "s3://bucket/ds/index.json", &info), SF_ERR_NOT_FOUND);
    sf_object_info_clear(&info);
}

/* ============================================================ failures */

Test(index, a_corrupt_shard_fails_naming_the_shard_and_the_offset)
{
    char dir[900];
    in_bucket(dir, sizeof(dir), "bad");
    make_tar_shards(dir);
    /* members of part-1.tar: s04.jpg (1400 bytes), s04.txt, s05.jpg (1500), s05.txt, ... */
    size_t n;
    char path[1000];
    snprintf(path, sizeof(path), "%s/part-1.tar", dir);
    unsigned char *b = test_load(path, &n);
    size_t third = tar_member(1400) + tar_member(1);
    cr_assert_lt(third + 512 + 700, n);
    /* truncated in the middle of s05.jpg's data */
    cr_assert_eq(test_write_file(dir, "part-1.tar", b, third + 512 + 700), 0);
    /* garbage over the second header of part-2.tar */
    size_t n2;
    char path2[1000];
    snprintf(path2, sizeof(path2), "%s/part-2.tar", dir);
    unsigned char *b2 = test_load(path2, &n2);
    size_t second = tar_member(1800);
    memset(b2 + second, 0xab, 512);
    cr_assert_eq(test_write_file(dir, "part-2.tar", b2, n2), 0);
    free(b2);
    start_mock(NULL);

    int rc = cli("index 's3://bucket/bad/part-{0..1}.tar' --endpoint-url %s", srv.url);
    cr_expect_eq(rc, 1);
    char *e = test_slurp(err_path);
    char off[64];
    snprintf(off, sizeof(off), "offset %zu", third);
    cr_expect(strstr(e, "s3://bucket/bad/part-1.tar") && strstr(e, off) && strstr(e, "truncated") &&
                  strstr(e, "SF_ERR_CORRUPT"),
              "stderr: %s", e);
    free(e);

    struct sf_index_result res;
    char err[1024];
    sf_status st = run_index("s3://bucket/bad/part-2.tar", NULL, &res, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CORRUPT);
    snprintf(off, sizeof(off), "offset %zu", second);
    cr_expect(strstr(err, "s3://bucket/bad/part-2.tar") && strstr(err, off), "err: %s", err);
    cr_expect_null(res.json);

    /* the first failed shard in source order is the one reported */
    cr_expect_eq(cli("index s3://bucket/bad/ --parallel 3 --endpoint-url %s", srv.url), 1);
    e = test_slurp(err_path);
    cr_expect(strstr(e, "part-1.tar") && !strstr(e, "part-2.tar"), "stderr: %s", e);
    free(e);
    cr_expect_eq(mock_stat("operations", "PutObject"), 0, "nothing is written on failure");

    /* a record whose body was changed: its checksum fails at its offset */
    char src[800];
    snprintf(src, sizeof(src), "%s/src", tmp);
    make_flat(src, 6, 1000);
    cJSON *p = pack_then_drop_index(src, "rec", SF_PACK_FORMAT_RECORD, 0, 1 << 20);
    cJSON_Delete(p);
    char rdir[900];
    in_bucket(rdir, sizeof(rdir), "rec");
    snprintf(path, sizeof(path), "%s/shard-000000.sfr", rdir);
    free(b);
    b = test_load(path, &n);
    b[16 + 40 + 30] ^= 0x01;
    cr_assert_eq(test_write_file(rdir, "shard-000000.sfr", b, n), 0);
    st = run_index("s3://bucket/rec/", NULL, &res, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CORRUPT);
    cr_expect(strstr(err, "shard-000000.sfr: offset 16:") && strstr(err, "checksum"), "err: %s",
              err);
    free(b);
}

Test(index, a_missing_object_in_a_pattern_fails)
{
    char dir[900];
    in_bucket(dir, sizeof(dir), "ds");
    make_tar_shards(dir);
    start_mock(NULL);
    int rc = cli("index 's3://bucket/ds/part-{0..3}.tar' --endpoint-url %s", srv.url);
    cr_expect_eq(rc, 1);
    char *e = test_slurp(err_path);
    cr_expect(strstr(e, "s3://bucket/ds/part-3.tar") && strstr(e, "SF_ERR_NOT_FOUND"), "stderr: %s",
              e);
    free(e);
    cr_expect_eq(mock_stat("operations", "PutObject"), 0);
    struct sf_index_result res;
    char err[1024];
    cr_expect_eq(run_index("s3://bucket/ds/nope.tar", NULL, &res, NULL, err, sizeof(err)),
                 SF_ERR_NOT_FOUND);
    cr_expect(strstr(err, "nope.tar"), "err: %s", err);
    /* a prefix without shards */
    cr_expect_eq(run_index("s3://bucket/empty/", NULL, &res, NULL, err, sizeof(err)),
                 SF_ERR_NOT_FOUND);
}

Test(index, a_shard_that_changes_while_read_fails)
{
    char dir[900];
    in_bucket(dir, sizeof(dir), "big");
    put_random(dir, "x.jpg", 3 << 20, 5);
    cr_assert_eq(test_sh("cd '%s' && tar --format=gnu -cf one.tar x.jpg && rm x.jpg", dir), 0);
    const char *extra[] = {"--fault", "prefix=bucket/big/,etag_change_after=2", NULL};
    start_mock(extra);
    struct sf_index_options o;
    sf_index_options_init_default(&o);
    o.window_bytes = 1 << 20; /* 256 KiB ranges: the ETag changes under the third */
    struct sf_index_result res;
    char err[1024];
    sf_status st = run_index("s3://bucket/big/one.tar", &o, &res, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CHANGED, "%s: %s", sf_status_name(st), err);
    cr_expect(strstr(err, "one.tar"), "err: %s", err);
}

/* ============================================================ memory bound */

Test(index, a_shard_much_larger_than_the_window)
{
    /* 64 MiB of samples and one 9 MiB member in one tar, read through 1 MiB */
    char files[800];
    snprintf(files, sizeof(files), "%s/bigfiles", tmp);
    size_t expect_fields = 0;
    for (int i = 0; i < 56; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "b%03d.jpg", i);
        put_random(files, rel, (size_t)(1 << 20) + (size_t)i * 4099, (unsigned)i + 1000);
        snprintf(rel, sizeof(rel), "b%03d.cls", i);
        cr_assert_eq(test_write_file(files, rel, "0", 1), 0);
        expect_fields += 2;
    }
    put_random(files, "b028.bin", 9 << 20, 77); /* joins sample b028 */
    char dir[900];
    in_bucket(dir, sizeof(dir), "big");
    cr_assert_eq(mkdir(dir, 0755), 0);
    cr_assert_eq(test_sh("cd '%s' && tar --format=gnu -cf '%s/huge.tar' b*", files, dir), 0);
    char path[1000];
    snprintf(path, sizeof(path), "%s/huge.tar", dir);
    size_t size;
    uint64_t h = file_xxh3(path, &size);
    cr_assert_gt(size, 64u << 20);

    /* a record shard with a record larger than the window: counted by its index */
    char src[800];
    snprintf(src, sizeof(src), "%s/recsrc", tmp);
    for (int i = 0; i < 9; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "r%d.jpg", i);
        put_random(src, rel, i == 4 ? (3u << 20) : 100000, (unsigned)i + 3000);
    }
    cJSON *prec = pack_then_drop_index(src, "rec", SF_PACK_FORMAT_RECORD, 0, 1ull << 30);
    start_mock(NULL);

    struct sf_index_options o;
    sf_index_options_init_default(&o);
    o.window_bytes = 1 << 20;
    o.parallel = 2;
    struct sf_index_result res;
    cJSON *j = NULL;
    char err[1024];
    sf_status st = run_index("s3://bucket/big/huge.tar", &o, &res, &j, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    const cJSON *s = cJSON_GetArrayItem(jget(j, "shards"), 0);
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
    cr_expect_eq(test_jnum(s, "samples"), 56);
    cr_expect_eq(test_jnum(s, "bytes"), size);
    cr_expect_str_eq(test_jstr(s, "xxh3_64"), hex);
    cr_expect_eq(test_jnum(jget(j, "fields"), "bin"), 1);
    cr_expect_eq(test_jnum(jget(j, "fields"), "jpg"), 56);
    cr_expect_lt(mock_stat(NULL, "bytes_sent"), (double)size + 64 * 1024, "read once");
    cJSON_Delete(j);
    sf_index_result_clear(&res);

    st = run_index("s3://bucket/rec/", &o, &res, &j, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    cr_expect_eq(res.counted_by_index, 1);
    const cJSON *a = cJSON_GetArrayItem(jget(j, "shards"), 0);
    const cJSON *b = cJSON_GetArrayItem(jget(prec, "shards"), 0);
    cr_expect_eq(test_jnum(a, "samples"), 9);
    cr_expect_eq(test_jnum(a, "bytes"), test_jnum(b, "bytes"));
    cr_expect_str_eq(test_jstr(a, "xxh3_64"), test_jstr(b, "xxh3_64"));
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "fields"),
                   "fields are left out when not every record was read");
    cJSON_Delete(j);
    cJSON_Delete(prec);
    sf_index_result_clear(&res);
}

/* ============================================================ faults, progress */

struct prog {
    struct sf_index_progress last;
    int calls;
    int cancel_after;
};

static int on_progress(void *user, const struct sf_index_progress *p)
{
    struct prog *g = user;
    cr_assert_geq(p->bytes_total, p->bytes_done);
    cr_assert_geq(p->bytes_done, g->last.bytes_done, "progress went back");
    g->last = *p;
    g->calls++;
    return g->cancel_after && g->calls >= g->cancel_after;
}

Test(index, works_with_faults_and_reports_progress)
{
    char src[800];
    snprintf(src, sizeof(src), "%s/src", tmp);
    make_flat(src, 60, 20000);
    cJSON *ptar = pack_then_drop_index(src, "ds", SF_PACK_FORMAT_TAR, 0, 256 * 1024);
    const char *extra[] = {"--fault", "prefix=bucket/ds/,p500=0.1,reset=0.1", NULL};
    start_mock(extra);
    struct prog g;
    memset(&g, 0, sizeof(g));
    struct sf_index_options o;
    sf_index_options_init_default(&o);
    o.window_bytes = 128 * 1024;
    o.parallel = 3;
    o.progress = on_progress;
    o.progress_user = &g;
    struct sf_index_result res;
    cJSON *j = NULL;
    char err[1024];
    sf_status st = run_index("s3://bucket/ds/", &o, &res, &j, err, sizeof(err));
    cr_assert_eq(st, SF_OK, "%s: %s", sf_status_name(st), err);
    expect_same_as_pack(j, ptar);
    cr_expect_gt(mock_stat(NULL, "requests"), 0);
    cr_expect_gt(g.calls, 0);
    cr_expect_eq(g.last.shards_done, res.shards);
    cr_expect_eq(g.last.shards_total, res.shards);
    cr_expect_eq(g.last.bytes_done, res.bytes);
    cr_expect_eq(g.last.bytes_total, res.bytes);
    cJSON_Delete(j);
    sf_index_result_clear(&res);

    /* a callback that says stop */
    memset(&g, 0, sizeof(g));
    g.cancel_after = 1;
    st = run_index("s3://bucket/ds/", &o, &res, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CANCELLED, "%s: %s", sf_status_name(st), err);
    cr_expect_null(res.json);
    cJSON_Delete(ptar);
}

/* ============================================================ usage */

Test(index, an_output_that_is_one_of_the_shards_is_refused)
{
    char a[800], src[900];
    snprintf(a, sizeof(a), "%s/a", tmp);
    make_tar_shards(a);
    start_mock(NULL);
    snprintf(src, sizeof(src), "%s/", a);
    char shard[900], other_spelling[900];
    snprintf(shard, sizeof(shard), "%s/part-0.tar", a);
    snprintf(other_spelling, sizeof(other_spelling), "%s/./part-0.tar", a);
    size_t before;
    free(test_load(shard, &before));
    const char *outs[] = {shard, other_spelling};
    for (size_t i = 0; i < 2; i++) {
        struct sf_index_options o;
        sf_index_options_init_default(&o);
        o.index_url = outs[i];
        struct sf_index_result res;
        char err[1024] = "";
        sf_status st = run_index(src, &o, &res, NULL, err, sizeof(err));
        cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s: %s", outs[i], sf_status_name(st));
        cr_expect(strstr(err, "part-0.tar"), "err: %s", err);
        if (st == SF_OK) {
            cr_expect_eq(sf_index_result_save(NULL, &res, err, sizeof(err)), SF_OK);
            sf_index_result_clear(&res);
        }
        size_t after;
        free(test_load(shard, &after));
        cr_expect_eq(after, before, "the shard was replaced by the index");
    }
    /* the CLI: `-o` followed by a glob's first match */
    cr_expect_eq(cli("index '%s' -o '%s' --no-progress", src, shard), 1);
    size_t after;
    free(test_load(shard, &after));
    cr_expect_eq(after, before);
}

Test(index, bad_options_and_usage)
{
    char a[800], b[800];
    snprintf(a, sizeof(a), "%s/a", tmp);
    snprintf(b, sizeof(b), "%s/b", tmp);
    make_tar_shards(a);
    make_tar_shards(b);
    start_mock(NULL);
    struct sf_index_options o;
    sf_index_options_init_default(&o);
    o.window_bytes = 1000;
    struct sf_index_result res;
    char err[1024], src[900];
    snprintf(src, sizeof(src), "%s/", a);
    cr_expect_eq(run_index(src, &o, &res, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "window_bytes"), "err: %s", err);
    sf_index_options_init_default(&o);
    o.parallel = 5000;
    cr_expect_eq(run_index(src, &o, &res, NULL, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    /* two shards named alike: the loader could not tell their entries apart */
    const char *two[] = {src, NULL};
    char srcb[900];
    snprintf(srcb, sizeof(srcb), "%s/part-0.tar", b);
    two[1] = srcb;
    cr_expect_eq(sf_index_shards(s3, two, 2, NULL, &res, err, sizeof(err)),
                 SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "part-0.tar"), "err: %s", err);
    cr_expect_eq(sf_index_shards(s3, NULL, 1, NULL, &res, err, sizeof(err)),
                 SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_index_shards(NULL, two, 1, NULL, &res, err, sizeof(err)),
                 SF_ERR_INVALID_ARGUMENT);

    const char *bad[] = {"",
                         "--window 1K",
                         "--window lots",
                         "--parallel 0",
                         "--parallel 2000",
                         "-o https://example.com/index.json",
                         "--no-such-flag"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = i == 0 ? cli("index") : cli("index '%s/' %s", a, bad[i]);
        cr_expect_eq(rc, 2, "'%s'", bad[i]);
        char *e = test_slurp(err_path);
        cr_expect(strstr(e, "shardfeed: "), "%s: stderr: %s", bad[i], e);
        free(e);
    }
    char idx[900];
    snprintf(idx, sizeof(idx), "%s/index.json", a);
    cr_expect_neq(access(idx, F_OK), 0, "nothing was written");
    cr_expect_eq(cli("index '%s/nothing/'", tmp), 1);
    cr_expect_eq(cli("help"), 0);
    char *help = test_slurp(out_path);
    cr_expect(strstr(help, "index URL...") && strstr(help, "--dry-run"), "help: %s", help);
    free(help);
}
