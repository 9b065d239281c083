/* The pack and inspect commands, run as the built program, and pack's
 * --max-side re-encoding. Suite `pack` (test_pack.c). */
#include "pack_fixture.h"

#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "shardfeed_shard.h"
#include "support/mock_env.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/spawn.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

Test(pack, cli_pack_then_inspect)
{
    make_imagefolder();
    char args[4096], dest[800];
    dest_path(dest, sizeof(dest), "out");
    snprintf(args, sizeof(args), "pack '%s' '%s' --shard-size 64K --json", src, dest);
    cli_ok(args);
    cJSON *j = test_load_json(out_path);
    cr_expect_str_eq(test_jstr(j, "format"), "tar");
    cr_expect_str_eq(test_jstr(j, "layout"), "imagefolder");
    cr_expect_eq(test_jnum(j, "files"), n_files);
    cr_expect_eq(test_jnum(j, "classes"), 3);
    cr_expect_gt(test_jnum(j, "shards"), 2);
    cr_expect_geq(test_jnum(j, "mib_per_s"), 0);
    cJSON_Delete(j);
    size_t shards = check_pack(dest, "tar", 1, 64 * 1024, NULL);

    /* record + zstd through the flags, plain text summary */
    char rdest[800];
    dest_path(rdest, sizeof(rdest), "rec");
    snprintf(args, sizeof(args),
             "pack '%s' '%s' --format record --zstd=5 --shard-size 64K --no-progress", src, rdest);
    cr_assert_eq(cli(args), 0);
    char *out = test_slurp(out_path);
    cr_expect(strstr(out, "packed 36 files") && strstr(out, "3 classes"), "stdout: %s", out);
    free(out);
    check_pack(rdest, "record", 1, 64 * 1024, NULL);

    /* inspect a shard: every sample with its fields */
    snprintf(args, sizeof(args), "inspect --json '%s/shard-000000.tar'", dest);
    cr_assert_eq(cli(args), 0);
    j = test_load_json(out_path);
    cr_expect_str_eq(test_jstr(j, "format"), "tar");
    const cJSON *samples = cJSON_GetObjectItemCaseSensitive(j, "samples");
    cr_assert(cJSON_IsArray(samples));
    int n = cJSON_GetArraySize(samples);
    cr_expect_gt(n, 0);
    cr_expect_eq(test_jnum(j, "sample_count"), n);
    const cJSON *s0 = cJSON_GetArrayItem(samples, 0);
    cr_expect_str_eq(test_jstr(s0, "key"), "Ant/img000", "sorted: class Ant first");
    const cJSON *f0 = cJSON_GetObjectItemCaseSensitive(s0, "fields");
    cr_assert_eq(cJSON_GetArraySize(f0), 2);
    cr_expect_str_eq(test_jstr(cJSON_GetArrayItem(f0, 0), "name"), "jpg");
    cr_expect_eq(test_jnum(cJSON_GetArrayItem(f0, 0), "size"), 0);
    cr_expect_str_eq(test_jstr(cJSON_GetArrayItem(f0, 1), "name"), "cls");
    cr_expect_str_eq(test_jstr(cJSON_GetArrayItem(f0, 1), "value"), "0");
    cJSON_Delete(j);

    snprintf(args, sizeof(args), "inspect '%s/shard-000000.sfr'", rdest);
    cr_assert_eq(cli(args), 0);
    out = test_slurp(out_path);
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
        char *err = test_slurp(err_path);
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
    char *err = test_slurp(err_path);
    cr_expect(strstr(err, "missing") && strstr(err, "SF_ERR_NOT_FOUND"), "stderr: %s", err);
    free(err);
}

/* The flat tree packed into dest ("out"); shard gets its first shard. */
static void pack_flat(char dest[800], char shard[900])
{
    make_flat();
    char args[2048];
    dest_path(dest, 800, "out");
    snprintf(args, sizeof(args), "pack '%s' '%s' --no-progress", src, dest);
    cr_assert_eq(cli(args), 0);
    path_in(shard, 900, dest, "shard-000000.tar");
}

Test(pack, cli_inspect_names_shard_and_offset_of_corruption)
{
    char dest[800], shard[900], args[2048];
    pack_flat(dest, shard);
    /* flip a byte in the second member's header: its checksum fails */
    size_t n;
    unsigned char *b = test_load(shard, &n);
    size_t second = 512 + (3000 + 511) / 512 * 512; /* 000000.jpg is 3000 bytes */
    cr_assert_lt(second + 10, n);
    b[second + 10] ^= 0x55;
    cr_assert_eq(test_write_file(dest, "shard-000000.tar", b, n), 0);
    free(b);
    snprintf(args, sizeof(args), "inspect '%s'", shard);
    cr_expect_eq(cli(args), 1);
    char *err = test_slurp(err_path);
    char off[64];
    snprintf(off, sizeof(off), "%zu", second);
    cr_expect(strstr(err, "shard-000000.tar") && strstr(err, off) && strstr(err, "SF_ERR_CORRUPT"),
              "stderr: %s", err);
    free(err);
    snprintf(args, sizeof(args), "inspect --json '%s'", shard);
    cr_expect_eq(cli(args), 1);
    cJSON *j = test_load_json(out_path);
    cr_expect_eq(test_jnum(j, "error_offset"), second);
    cr_expect_str_eq(test_jstr(j, "status"), "SF_ERR_CORRUPT");
    /* the failure object every command prints with --json (README.md) */
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "ok")), "\"ok\": false");
    cr_expect_eq(test_jnum(j, "exit"), 1);
    cJSON_Delete(j);
    /* a missing shard */
    snprintf(args, sizeof(args), "inspect '%s/nope.tar'", dest);
    cr_expect_eq(cli(args), 1);
}

Test(pack, cli_inspect_says_when_a_tar_has_no_end_of_archive_blocks)
{
    char dest[800], shard[900], args[2048];
    pack_flat(dest, shard);
    snprintf(args, sizeof(args), "inspect --json '%s'", shard);
    cr_assert_eq(cli(args), 0);
    cJSON *j = test_load_json(out_path);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "missing_end_marker")));
    cJSON_Delete(j);
    /* cut right after the first member (000000.jpg, 3000 bytes): the readers
     * accept it (docs/FORMAT.md), and inspect is where a user can see it */
    size_t n, cut = 512 + (3000 + 511) / 512 * 512;
    unsigned char *b = test_load(shard, &n);
    cr_assert_lt(cut, n);
    cr_assert_eq(test_write_file(dest, "cut.tar", b, cut), 0);
    free(b);
    path_in(shard, sizeof(shard), dest, "cut.tar");
    snprintf(args, sizeof(args), "inspect '%s'", shard);
    cr_expect_eq(cli(args), 0);
    char *out = test_slurp(out_path);
    cr_expect(strstr(out, "end-of-archive"), "stdout: %s", out);
    free(out);
    snprintf(args, sizeof(args), "inspect --json '%s'", shard);
    cr_expect_eq(cli(args), 0);
    j = test_load_json(out_path);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "missing_end_marker")));
    cr_expect_eq(test_jnum(j, "sample_count"), 1);
    cJSON_Delete(j);
}

/* `pack src s3://bucket/<to> <flags>` to the mock, which must exit 0. */
static void pack_to_mock(const char *to, const char *flags)
{
    char args[4096];
    snprintf(args, sizeof(args), "pack '%s' s3://bucket/%s --endpoint-url %s --tmp-dir '%s' %s",
             src, to, srv.url, tmp, flags);
    cli_ok(args);
}

Test(pack, cli_pack_to_s3)
{
    make_flat();
    start_mock();
    pack_to_mock("cli", "--format record --shard-size 16K --json");
    char args[4096];
    cJSON *j = test_load_json(out_path);
    double shards = test_jnum(j, "shards");
    cJSON_Delete(j);
    cr_expect_gt(shards, 2);
    cr_expect_eq(mock_count("PutObject", NULL), shards + 1);
    snprintf(args, sizeof(args),
             "inspect s3://bucket/cli/shard-000001.sfr --endpoint-url %s --json", srv.url);
    cr_assert_eq(cli(args), 0);
    j = test_load_json(out_path);
    cr_expect_str_eq(test_jstr(j, "format"), "record");
    cr_expect_gt(test_jnum(j, "sample_count"), 0);
    cJSON_Delete(j);
}

Test(pack, cli_pack_to_s3_in_parts_and_a_failed_part_names_the_object)
{
    make_large();
    start_mock();
    pack_to_mock("cli", "--shard-size 13M --part-size 5M --json --no-progress");
    cr_expect_eq(mock_count("CompleteMultipartUpload", NULL), 2);
    char etag[128] = "";
    cr_expect_eq(signed_call("HEAD", "/bucket/cli/shard-000001.tar", NULL, etag, sizeof(etag)),
                 200);
    cr_expect(strstr(etag, "-3\""), "ETag %s", etag);

    /* a part refused for good: non-zero exit, the object named, nothing left */
    cr_assert_eq(
        admin("POST", "/_mock/fault?prefix=bucket/cli2/shard-000001&fault=400&count=1", NULL), 200);
    char args[4096];
    snprintf(args, sizeof(args),
             "pack '%s' s3://bucket/cli2 --endpoint-url %s --shard-size 13M --part-size 5M "
             "--tmp-dir '%s' --no-progress",
             src, srv.url, tmp);
    int rc = cli(args);
    char *err = test_slurp(err_path);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(err, "s3://bucket/cli2/shard-000001.tar") && strstr(err, "part "),
              "stderr: %s", err);
    free(err);
    cr_expect_eq(uploads_in_progress(), 0);
    cr_expect_eq(cli("pack a b --part-size 1M"), 2, "a part size under 5M is a usage error");
}

/* ============================================================ interrupted */

/* Ctrl-C while a pack to S3 waits on an upload: before the fix the program
 * died at once and left the staged shards (up to two of --shard-size each,
 * 256M by default) in --tmp-dir, which is TMPDIR unless given, every time.
 * Now the signal cancels the pack, which removes them as on any failure and
 * writes no index.json, and the program still dies of the signal. */
Test(pack, cli_pack_to_s3_interrupted_leaves_no_staged_shard)
{
    make_large(); /* two shards with --shard-size 13M */
    start_mock();
    cr_assert_eq(mock_env_admin(&srv, "POST", "/_mock/faults",
                                "prefix=bucket/int/shard-,latency_ms=400", NULL),
                 200);
    char stage[800];
    snprintf(stage, sizeof(stage), "%s/stage", tmp);
    cr_assert_eq(mkdir(stage, 0755), 0);
    const char *argv[] = {SF_CLI_BIN,
                          "pack",
                          src,
                          "s3://bucket/int/",
                          "--endpoint-url",
                          srv.url,
                          "--shard-size",
                          "13M",
                          "--tmp-dir",
                          stage,
                          "--no-progress",
                          NULL};
    pid_t pid = test_spawn(argv, "/dev/null", "/dev/null");
    cr_assert_gt(pid, 0);
    /* the first shard is staged and its upload waits on the latency */
    for (;;) {
        DIR *d = opendir(stage);
        cr_assert(d);
        struct dirent *e;
        int staged = 0;
        while ((e = readdir(d)))
            staged |= e->d_name[0] != '.';
        closedir(d);
        if (staged)
            break;
        usleep(2000);
    }
    cr_assert_eq(kill(pid, SIGINT), 0);
    cr_expect_eq(test_wait(pid), 128 + SIGINT, "it did not die of the signal");
    DIR *d = opendir(stage);
    cr_assert(d);
    struct dirent *e;
    while ((e = readdir(d)))
        cr_expect(e->d_name[0] == '.', "%s/%s was left behind", stage, e->d_name);
    closedir(d);
    char index[900];
    snprintf(index, sizeof(index), "%s/root/bucket/int/index.json", tmp);
    struct stat sb;
    cr_expect_neq(stat(index, &sb), 0, "an index.json was written");
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
    unsigned char *b = test_load(path, &n);
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
    char dest[800];
    struct sf_pack_result res;
    pack_out(&o, dest, &res);
    cr_expect_eq(res.reencoded, 2u, "big.jpg and tall.JPEG");
    cr_expect(res.reencoded_bytes > 0 && res.reencoded_bytes < res.reencoded_source_bytes,
              "%llu -> %llu bytes", res.reencoded_source_bytes, res.reencoded_bytes);
    cr_expect_lt(res.shard_bytes, res.source_bytes);

    /* GNU tar gives the files back: the small JPEG, the text and the png
     * byte for byte, the big ones shrunk to a longer side of 256. */
    char x[900], path[1000];
    dest_path(x, sizeof(x), "x");
    cr_assert_eq(test_sh("mkdir -p '%s' && tar -xf '%s/shard-000000.tar' -C '%s'", x, dest, x), 0);
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
        unsigned char *b = test_load(path, &n);
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
    cJSON *idx = test_load_json(path);
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(idx, "reencode");
    cr_expect(re && test_jnum(re, "max_side") == 256 && test_jnum(re, "quality") == 85);
    cJSON_Delete(idx);

    /* One thread writes the same bytes as three. */
    char dest1[800];
    dest_path(dest1, sizeof(dest1), "out1");
    o.threads = 1;
    char err[1024] = "";
    sf_status st = do_pack(dest1, &o, &res, err, sizeof(err));
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
    unsigned char *b = test_load(p, &n);
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
    cr_expect_eq(test_sh("'%s' pack '%s' '%s' --quality 80 --no-progress 2>/dev/null", SF_CLI_BIN,
                         src, dest),
                 2);
    cr_expect_eq(test_sh("'%s' pack '%s' '%s' --max-side 4 --no-progress 2>/dev/null", SF_CLI_BIN,
                         src, dest),
                 2);
    cr_expect_eq(test_sh("'%s' pack '%s' '%s' --max-side 320 --no-progress 2>/dev/null", SF_CLI_BIN,
                    src, dest),
                 1);
}
