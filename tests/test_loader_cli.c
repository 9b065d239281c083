/* The loader through the CLI: `load`, its JSON and exit codes, a killed
 * warm-cache, doctor and tune. Suite `loader` (test_loader.c). */
#include "loader_fixture.h"
#include "src/loader.h"
#include "src/loader_internal.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The CLI run with args (argv, NULL-terminated) exits 2: bad usage. */
static void expect_usage_error(const char *const *args)
{
    char out[8192];
    cr_expect_eq(run_cli(args, out, sizeof(out)), 2, "%s %s: %s", args[1], args[2], out);
}

/* Issue 17's kill -9 loop: warm-cache killed at random moments (a seeded
 * generator, 10 rounds, over a slow link so that most kills land mid-way),
 * then `cache verify` passes and a load through that cache gives the batches
 * of a fresh RAM-only run: no entry half written is ever taken as whole. */
Test(loader, warm_cache_killed_at_random_moments_leaves_a_cache_that_verifies, .timeout = 240)
{
    const char *slow[] = {"--fault", "prefix=bucket/data,bandwidth=64K", NULL};
    struct sf_loader_options o;
    bucket_options(&o, 120, 48 << 10, slow, NULL);
    struct sf_loader *l = open_loader(&o);
    struct epoch_log fresh;
    cr_assert_eq(run_epoch(l, &fresh, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    sf_loader_close(l);

    char cache_dir[800];
    snprintf(cache_dir, sizeof(cache_dir), "%s/cache", tmp);
    uint64_t rng = 0x5eedULL;
    int killed = 0;
    for (int round = 0; round < 10; round++) {
        pid_t pid = fork();
        cr_assert(pid >= 0);
        if (pid == 0) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execl(SF_CLI_BIN, SF_CLI_BIN, "warm-cache", "s3://bucket/data/", "--endpoint-url",
                  srv.url, "--cache-dir", cache_dir, "--chunk-size", "16K", (char *)NULL);
            _exit(127);
        }
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        usleep((useconds_t)(20000 + (rng >> 33) % 600000));
        kill(pid, SIGKILL);
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        killed += WIFSIGNALED(status);
        cr_assert(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0),
                  "warm-cache round %d ended with status %d", round, status);
    }
    cr_expect_gt(killed, 0, "no round was killed mid-way: the test checked nothing");
    char out[16384];
    const char *verify[] = {SF_CLI_BIN, "cache", "verify", "--cache-dir", cache_dir, NULL};
    cr_assert_eq(run_cli(verify, out, sizeof(out)), 0, "cache verify: %s", out);

    s3_options(&o, bucket_src, cache_dir);
    l = open_loader(&o);
    struct epoch_log after;
    cr_assert_eq(run_epoch(l, &after, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_expect_eq(after.images, 120u);
    cr_expect_eq(after.digest, fresh.digest, "the cache left by the kills gave other batches");
    free(after.seen);
    free(fresh.seen);
    sf_loader_close(l);
}

Test(loader, cli_load_json_and_errors)
{
    local_dataset(50, 64 << 10, -1);
    char out[8192];
    const char *ok[] = {SF_CLI_BIN, "load", shards,     "--batch-size", "8",      "--size",   "32",
                        "--epochs", "2",    "--device", "host",         "--json", "--digest", NULL};
    cr_assert_eq(run_cli(ok, out, sizeof(out)), 0, "%s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_assert_eq(cJSON_GetObjectItem(j, "images")->valuedouble, 100.0);
    cr_assert_eq(cJSON_GetObjectItem(j, "batches")->valuedouble, 14.0);
    cr_assert(cJSON_GetObjectItem(j, "images_per_s")->valuedouble > 0);
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(j, "consumer_wait_share")));
    char d1[32];
    snprintf(d1, sizeof(d1), "%s", cJSON_GetObjectItem(j, "digest")->valuestring);
    cJSON_Delete(j);
    /* same flags, same digest */
    cr_assert_eq(run_cli(ok, out, sizeof(out)), 0);
    j = cJSON_Parse(out);
    cr_assert_str_eq(cJSON_GetObjectItem(j, "digest")->valuestring, d1);
    cJSON_Delete(j);

    /* --config FILE, with flags winning over it */
    char cfg[800];
    snprintf(cfg, sizeof(cfg), "%s/load.json", tmp);
    FILE *cf = fopen(cfg, "w");
    cr_assert(cf);
    fputs("{\"batch_size\": 5, \"size\": 16, \"device\": \"host\", \"drop_last\": true}", cf);
    fclose(cf);
    const char *with_cfg[] = {SF_CLI_BIN, "load", shards, "--config", cfg, "--json", NULL};
    cr_assert_eq(run_cli(with_cfg, out, sizeof(out)), 0, "%s", out);
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_assert_eq(cJSON_GetObjectItem(j, "batches")->valuedouble, 10.0); /* 50 / 5 */
    cJSON_Delete(j);
    const char *cfg_flag[] = {SF_CLI_BIN,     "load", shards,           "--config", cfg,
                              "--batch-size", "8",    "--no-drop-last", "--json",   NULL};
    cr_assert_eq(run_cli(cfg_flag, out, sizeof(out)), 0, "%s", out);
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_assert_eq(cJSON_GetObjectItem(j, "batches")->valuedouble, 7.0); /* 6 x 8 + 2 */
    cr_assert_eq(cJSON_GetObjectItem(j, "images")->valuedouble, 50.0);
    cJSON_Delete(j);
    snprintf(cfg, sizeof(cfg), "%s/bad.json", tmp);
    cf = fopen(cfg, "w");
    cr_assert(cf);
    fputs("{\"batch_size\": \"many\"}", cf);
    fclose(cf);
    expect_usage_error((const char *[]){SF_CLI_BIN, "load", shards, "--config", cfg, NULL});

    expect_usage_error((const char *[]){SF_CLI_BIN, "load", shards, "--batch-size", "x", NULL});
    expect_usage_error((const char *[]){SF_CLI_BIN, "load", shards, "--crop", "diagonal", NULL});
    char missing[800];
    snprintf(missing, sizeof(missing), "%sno-such-shard.tar", shards);
    const char *gone[] = {SF_CLI_BIN, "load", missing, "--json", NULL};
    cr_assert_eq(run_cli(gone, out, sizeof(out)), 1);
}

Test(loader, missing_objects_and_missing_fields_exit_1_with_json)
{
    /* A sample without its image under on_error fail: exit 1, not a short
     * epoch. */
    loader_tmpdir();
    char src[700];
    snprintf(src, sizeof(src), "%s/src", tmp);
    make_flat(src, 60, -1);
    char jpg[800];
    snprintf(jpg, sizeof(jpg), "%s/s00031.jpg", src);
    cr_assert(unlink(jpg) == 0);
    snprintf(shards, sizeof(shards), "%s/shards/", tmp);
    pack(src, shards, 16 << 10, NULL);
    n_samples = 60;
    char out[8192];
    const char *bad[] = {SF_CLI_BIN, "load", shards,   "--batch-size", "8",      "--size",
                         "32",       "--device", "host", "--json", NULL};
    cr_assert_eq(run_cli(bad, out, sizeof(out)), 1, "%s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "one JSON object: %s", out);
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")), "%s", out);
    cr_assert(strstr(cJSON_GetObjectItem(j, "error")->valuestring, "s00031"), "%s", out);
    cr_assert(strstr(cJSON_GetObjectItem(j, "error")->valuestring, "no image field"), "%s", out);
    cJSON_Delete(j);
    /* A list of URLs of which one is missing: exit 1 naming it, before any
     * batch. */
    char one[900], two[900];
    snprintf(one, sizeof(one), "%sshard-000000.tar", shards);
    snprintf(two, sizeof(two), "%sshard-000077.tar", shards);
    const char *missing[] = {SF_CLI_BIN, "load", one, two, "--device", "host", "--json", NULL};
    cr_assert_eq(run_cli(missing, out, sizeof(out)), 1, "%s", out);
    j = cJSON_Parse(out);
    cr_assert(j, "one JSON object: %s", out);
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")), "%s", out);
    cr_assert(strstr(cJSON_GetObjectItem(j, "error")->valuestring, "shard-000077.tar"), "%s", out);
    cJSON_Delete(j);
}

/* ------------------------------------------------------------ doctor */

Test(loader, doctor_names_decode_when_one_thread_feeds_a_step_that_takes_no_time)
{
    struct sf_loader_options o;
    local_options(&o, 120, 16 << 10);
    o.decode_threads = 1;
    struct sf_doctor_result r;
    char err[1024] = "";
    cr_assert_eq(sf_doctor_measure(&o, 0.4, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect(r.stage_per_s[SF_STAGE_READ] > 0 && r.stage_per_s[SF_STAGE_DECODE] > 0 &&
              r.stage_per_s[SF_STAGE_ASSEMBLY] > 0);
    cr_expect_eq(r.stage_per_s[SF_STAGE_FETCH], 0.0, "local files are not fetched");
    cr_expect_eq(r.stage_per_s[SF_STAGE_DEVICE], 0.0, "host batches");
    cr_expect(strstr(r.stage_note[SF_STAGE_DEVICE], "host batches") != NULL);
    cr_expect_eq(r.decode_threads, 1u);
    cr_expect_eq(r.samples_measured, 120u, "every raw sample of the small shards is kept");
    cr_expect(r.bytes_per_sample > 0);
    sf_doctor_conclude(&r, 0, 0, NULL, 1);
    cr_expect_eq(r.bound, SF_STAGE_DECODE, "%s (read %.0f, decode %.0f, assembly %.0f)",
                 r.verdict, r.stage_per_s[SF_STAGE_READ], r.stage_per_s[SF_STAGE_DECODE],
                 r.stage_per_s[SF_STAGE_ASSEMBLY]);
    cr_expect(strstr(r.verdict, "decode-bound: 1 threads") != NULL, "%s", r.verdict);

    /* A step slower than every stage bounds the pipeline itself. */
    sf_doctor_conclude(&r, 1.0, 1.0, NULL, 1);
    cr_expect_eq(r.bound, SF_STAGE_NONE, "%s", r.verdict);
    cr_expect(strstr(r.verdict, "step-bound") != NULL, "%s", r.verdict);
    /* A step that needs more threads than the cores: more cores; these
     * images are all under --max-side 320, so pack would not help. */
    cr_expect(r.max_side_speedup == 1.0 && r.max_side_bytes == 1.0, "%g %g", r.max_side_speedup,
              r.max_side_bytes);
    sf_doctor_conclude(&r, r.decode_per_thread_per_s * (r.cores + 2), 0, NULL, 1);
    cr_expect_eq(r.bound, SF_STAGE_DECODE);
    cr_expect(strstr(r.verdict, "more cores") != NULL, "%s", r.verdict);
    cr_expect(strstr(r.verdict, "would not help: the images are no larger") != NULL, "%s",
              r.verdict);
}

/* Large photos: doctor re-encodes some at --max-side 320 in memory and
 * measures the decode of both; the verdict quotes what it measured. */
Test(loader, doctor_measures_what_pack_max_side_would_give)
{
    local_dataset_large(24);
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    o.decode_threads = 1;
    o.extra_fields = NULL;
    struct sf_doctor_result r;
    char err[1024] = "";
    cr_assert_eq(sf_doctor_measure(&o, 0.4, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect(r.max_side_bytes > 0 && r.max_side_bytes < 0.6,
              "640x480 -> 320x240 leaves %g of the bytes", r.max_side_bytes);
    cr_expect(r.max_side_speedup > 0, "measured: %g", r.max_side_speedup);
    r.max_side_speedup = 2.5; /* the wording, whatever this machine measured */
    sf_doctor_conclude(&r, r.decode_per_thread_per_s * (r.cores + 2), 0, NULL, 1);
    cr_expect_eq(r.bound, SF_STAGE_DECODE, "%s", r.verdict);
    cr_expect(strstr(r.verdict, "or pack at --max-side 320 (measured on these images: 2.5x "
                                "faster decode") != NULL,
              "%s", r.verdict);
}

/* A step rate far beyond what threads can give (--step-ms 1e-300 is
 * accepted: 8e303 samples/s for batches of 8): the threads it would need
 * do not fit an unsigned, and the cast made "set decode_threads to 0". */
Test(loader, doctor_verdict_for_a_step_beyond_any_thread_count)
{
    struct sf_doctor_result r;
    memset(&r, 0, sizeof(r));
    r.stage_per_s[SF_STAGE_READ] = 1e6;
    r.stage_per_s[SF_STAGE_DECODE] = 2000;
    r.stage_per_s[SF_STAGE_ASSEMBLY] = 1e6;
    r.decode_per_thread_per_s = 1000;
    r.decode_threads = 2;
    r.cores = 4;
    const double steps[] = {1e10, 1e300};
    for (int i = 0; i < 2; i++) {
        sf_doctor_conclude(&r, steps[i], 0, NULL, 1);
        cr_expect_eq(r.bound, SF_STAGE_DECODE, "%s", r.verdict);
        cr_expect(strstr(r.verdict, "more cores") != NULL, "%s", r.verdict);
        cr_expect_null(strstr(r.verdict, "decode_threads to 0"), "%s", r.verdict);
    }
    sf_doctor_conclude(&r, 1e10, 0, NULL, 1); /* 1e7 threads: 9999996 more than the cores */
    cr_expect(strstr(r.verdict, "use 9999996 more cores") != NULL, "%s", r.verdict);
}

/* A 0-byte shard before the real one: doctor holds no bytes for it, and
 * judged whether each held shard was whole by the size of the shard at the
 * same position in the listing, so the real one was taken as cut short. A
 * tar without its end-of-archive blocks then lost its last sample. */
Test(loader, doctor_reads_every_sample_after_an_empty_shard)
{
    local_dataset(20, 1 << 20, -1);
    char a[900], b[900];
    snprintf(a, sizeof(a), "%sshard-000000.tar", shards);
    snprintf(b, sizeof(b), "%sshard-000001.tar", shards);
    static unsigned char tar[1 << 20];
    FILE *f = fopen(a, "rb");
    cr_assert(f);
    size_t n = fread(tar, 1, sizeof(tar), f);
    fclose(f);
    cr_assert(n > 1024 && n < sizeof(tar));
    static const unsigned char zero[512];
    while (n >= 512 && !memcmp(tar + n - 512, zero, 512))
        n -= 512; /* no end-of-archive blocks */
    f = fopen(b, "wb");
    cr_assert(f && fwrite(tar, 1, n, f) == n && fclose(f) == 0);
    f = fopen(a, "wb");
    cr_assert(f && fclose(f) == 0);
    remove_index(shards);
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    o.decode_threads = 1;
    struct sf_doctor_result r;
    char err[1024] = "";
    cr_assert_eq(sf_doctor_measure(&o, 0.1, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_eq(r.samples_measured, 20ull, "%s", r.stage_note[SF_STAGE_DECODE]);
}

/* A JPEG cut short in a later shard: doctor's decode stage fails naming
 * that shard and the sample (it named the first shard, whatever sample
 * failed); with on_error skip it is left out, as the loader would. */
Test(loader, doctor_names_the_shard_and_sample_that_fail_to_decode)
{
    local_dataset(40, 16 << 10, 33);
    const char *src[] = {shards};
    struct sf_loader_options o;
    base_options(&o, src, 1);
    o.decode_threads = 1;
    struct sf_doctor_result r;
    char err[1024] = "";
    cr_assert_eq(sf_doctor_measure(&o, 0.1, &r, err, sizeof(err)), SF_ERR_CORRUPT, "%s", err);
    cr_expect(strstr(err, "sample 's00033'") != NULL, "%s", err);
    cr_expect_null(strstr(err, "shard-000000.tar"), "%s", err);

    /* with on_error skip the loader leaves it out, and so does doctor (it
     * failed: no doctor on data the loader reads) */
    o.on_error = SF_ON_ERROR_SKIP;
    cr_assert_eq(sf_doctor_measure(&o, 0.1, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_gt(r.stage_per_s[SF_STAGE_DECODE], 0, "%s", r.stage_note[SF_STAGE_DECODE]);
    cr_expect_gt(r.decode_per_thread_per_s, 0);
    cr_expect(strstr(r.stage_note[SF_STAGE_DECODE], "1 skipped") != NULL, "%s",
              r.stage_note[SF_STAGE_DECODE]);
}

/* on_error skip and no sample that decodes: nothing to measure, an error
 * naming one of them, not a decode thread looking for a good one forever. */
Test(loader, doctor_with_skip_fails_when_no_sample_decodes)
{
    local_dataset(1, 16 << 10, 0);
    const char *src[] = {shards};
    struct sf_loader_options o;
    base_options(&o, src, 1);
    o.on_error = SF_ON_ERROR_SKIP;
    struct sf_doctor_result r;
    char err[1024] = "";
    cr_assert_eq(sf_doctor_measure(&o, 0.1, &r, err, sizeof(err)), SF_ERR_CORRUPT, "%s", err);
    cr_expect(strstr(err, "none of the 1 images held decodes") && strstr(err, "sample 's00000'"),
              "%s", err);
}

/* Only a 0-byte shard: doctor holds nothing, and its message named the
 * first shard held, of which there is none ("(null)"). */
Test(loader, doctor_on_only_empty_shards_names_one)
{
    loader_tmpdir();
    char dir[800], out[4096], err[4096];
    snprintf(dir, sizeof(dir), "%s/empty/", tmp);
    cr_assert(test_write_file(tmp, "empty/shard-000000.tar", "", 0) == 0);
    const char *run[] = {SF_CLI_BIN, "doctor", dir, "--seconds", "0.1", NULL};
    cr_expect_eq(run_cli_err(run, out, sizeof(out), err, sizeof(err)), 1, "%s", err);
    cr_expect(strstr(err, "shard-000000.tar") && !strstr(err, "(null)"), "%s", err);
}

Test(loader, doctor_names_fetch_behind_a_slow_link_unless_the_data_is_cached)
{
    const char *slow[] = {"--fault", "prefix=bucket/data,bandwidth=32K", NULL};
    struct sf_loader_options o;
    bucket_options(&o, 60, 24 << 10, slow, NULL);
    o.decode_threads = 1;
    struct sf_doctor_result r;
    char err[1024] = "";
    cr_assert_eq(sf_doctor_measure(&o, 1.0, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect(r.fetch_mib_per_s > 0 && r.stage_per_s[SF_STAGE_FETCH] > 0, "%s",
              r.stage_note[SF_STAGE_FETCH]);
    cr_expect_eq(r.concurrency_more, 4 * r.concurrency);
    sf_doctor_conclude(&r, 0, 0, NULL, 0);
    cr_expect_eq(r.bound, SF_STAGE_FETCH, "%s (fetch %.0f, decode %.0f)", r.verdict,
                 r.stage_per_s[SF_STAGE_FETCH], r.stage_per_s[SF_STAGE_DECODE]);
    cr_expect(strstr(r.verdict, "fetch-bound: concurrency") != NULL, "%s", r.verdict);
    /* Data already in the cache: the store no longer bounds anything. */
    sf_doctor_conclude(&r, 0, 0, NULL, 1);
    cr_expect_eq(r.bound, SF_STAGE_DECODE, "%s", r.verdict);
}

Test(loader, doctor_fails_naming_a_missing_source)
{
    local_dataset(10, 16 << 10, -1);
    char missing[800];
    snprintf(missing, sizeof(missing), "%sno-such-shard.tar", shards);
    const char *src[] = {missing};
    struct sf_loader_options o;
    base_options(&o, src, 1);
    struct sf_doctor_result r;
    char err[1024] = "";
    cr_expect_neq(sf_doctor_measure(&o, 0.2, &r, err, sizeof(err)), SF_OK);
    cr_expect(strstr(err, "no-such-shard.tar") != NULL, "%s", err);
    cr_expect_eq(sf_doctor_measure(NULL, 0.2, &r, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);

    /* The CLI: a table and a verdict, JSON, exit 1 on the missing shard. */
    char out[8192];
    const char *ok[] = {SF_CLI_BIN, "doctor", shards, "--size", "32", "--batch-size", "4",
                        "--seconds", "0.2", "--step-ms", "5", "--device", "host", "--json", NULL};
    cr_assert_eq(run_cli(ok, out, sizeof(out)), 0, "%s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
    cr_expect(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "stages"), "decode"),
                                  "samples_per_s")
                  ->valuedouble > 0);
    cr_expect_eq(cJSON_GetObjectItem(j, "step_per_s")->valuedouble, 800.0); /* 4 per 5 ms */
    cr_expect(cJSON_GetObjectItem(j, "pipeline_per_s")->valuedouble > 0);
    cr_expect(cJSON_IsString(cJSON_GetObjectItem(j, "verdict")));
    cJSON_Delete(j);
    const char *gone[] = {SF_CLI_BIN, "doctor", missing, "--seconds", "0.2", "--json", NULL};
    cr_expect_eq(run_cli(gone, out, sizeof(out)), 1, "%s", out);
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")));
    cJSON_Delete(j);
    expect_usage_error((const char *[]){SF_CLI_BIN, "doctor", shards, "--seconds", "zero", NULL});
}

/* Three samples in the bucket and batches of 8: with drop_last no batch
 * ever comes, without it every batch is a part of one. Either way there is
 * no batch to time, and doctor says the data is too small instead of
 * naming a stage (it said "decode-bound"); exit 1 as for a failed stage. A
 * batch of exactly the dataset's size still gets a verdict. */
Test(loader, doctor_on_data_smaller_than_one_batch_says_it_is_too_small)
{
    mock_dataset(3, 24 << 10);
    char out[16384], err[8192];
    for (int drop = 0; drop < 2; drop++) {
        const char *run[] = {SF_CLI_BIN, "doctor",       "s3://bucket/data/",
                             "--endpoint-url", srv.url,  "--ram-only",
                             "--size",   "16",           "--batch-size",
                             "8",        "--seconds",    "0.1",
                             "--device", "host",         drop ? "--drop-last" : "--no-drop-last",
                             NULL};
        cr_expect_eq(run_cli_err(run, out, sizeof(out), err, sizeof(err)), 1, "%s%s", out, err);
        cr_expect(strstr(err, "too small to measure") && strstr(err, "batch_size 8"), "%s", err);
        cr_expect_null(strstr(out, "bound:"), "%s", out);
    }
    const char *json[] = {SF_CLI_BIN, "doctor", "s3://bucket/data/", "--endpoint-url", srv.url,
                          "--ram-only", "--size", "16", "--batch-size", "8", "--seconds", "0.1",
                          "--device", "host", "--json", NULL};
    cr_expect_eq(run_cli_err(json, out, sizeof(out), err, sizeof(err)), 1, "%s", err);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")), "%s", out);
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    cr_expect(cJSON_IsString(e) && strstr(e->valuestring, "too small to measure"), "%s", out);
    cJSON_Delete(j);
    const char *whole[] = {SF_CLI_BIN, "doctor", "s3://bucket/data/", "--endpoint-url", srv.url,
                           "--ram-only", "--size", "16", "--batch-size", "3", "--seconds", "0.1",
                           "--device", "host", "--drop-last", NULL};
    cr_expect_eq(run_cli_err(whole, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
    cr_expect(strstr(out, "bound:") != NULL, "%s", out);
}

/* ------------------------------------------------------------ tune */

/* A local dataset of n samples in 16 KiB shards, read without the txt field. */
static void tune_options(struct sf_loader_options *o, unsigned n)
{
    local_options(o, n, 16 << 10);
    o->extra_fields = NULL;
}

Test(loader, tune_writes_a_config_the_loader_takes)
{
    struct sf_loader_options o;
    tune_options(&o, 80);
    struct sf_tune_result r;
    char err[1024] = "";
    cr_assert_eq(sf_tune(&o, 1.5, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect(r.points >= 2, "%u points: %s", r.points, r.trace);
    cr_expect(strstr(r.trace, "decode_threads=1:") != NULL, "%s", r.trace);
    cr_expect(strstr(r.trace, "concurrency=") == NULL, "local files: no fetch search: %s",
              r.trace);
    cr_expect(r.tuned_per_s > 0 && r.given_per_s > 0);
    cr_expect(r.decode_threads >= 1 && r.prefetch_shards >= 2 && r.prefetch_batches >= 3);
    /* The config is what the loader reads back. */
    struct sf_loader_options back;
    sf_loader_options_init_default(&back);
    void *keep = NULL;
    cr_assert_eq(sf_loader_options_from_json(&back, r.config_json, &keep, err, sizeof(err)),
                 SF_OK, "%s: %s", r.config_json, err);
    cr_expect_eq(back.decode_threads, r.decode_threads);
    cr_expect_eq(back.s3.concurrency, r.concurrency);
    cr_expect_eq(back.s3.chunk_bytes, r.chunk_bytes);
    cr_expect_eq(back.prefetch_shards, r.prefetch_shards);
    cr_expect_eq(back.prefetch_batches, r.prefetch_batches);
    sf_loader_options_free_json(keep);

    char out[8192], cfg[800];
    snprintf(cfg, sizeof(cfg), "%s/tuned.json", tmp);
    const char *cli[] = {SF_CLI_BIN, "tune", shards, "--size", "32", "--budget-s", "1", "-o",
                         cfg, NULL};
    cr_assert_eq(run_cli(cli, out, sizeof(out)), 0, "%s", out);
    const char *use[] = {SF_CLI_BIN, "load", shards, "--size", "32", "--config", cfg, "--json",
                         NULL};
    cr_assert_eq(run_cli(use, out, sizeof(out)), 0, "%s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect_eq(cJSON_GetObjectItem(j, "images")->valuedouble, 80.0);
    cJSON_Delete(j);
    expect_usage_error((const char *[]){SF_CLI_BIN, "tune", shards, "--budget-s", "0", NULL});
    /* -o where nothing can be written: said before the budget is spent (a
     * usage error, nothing measured); -o - is stdout, as without -o. */
    char missing[900], err_text[2048];
    snprintf(missing, sizeof(missing), "%s/no-such-folder/tuned.json", tmp);
    const char *unwritable[] = {SF_CLI_BIN, "tune", shards, "--budget-s", "60", "-o", missing,
                                NULL};
    cr_expect_eq(run_cli_err(unwritable, out, sizeof(out), err_text, sizeof(err_text)), 2);
    cr_expect(strstr(err_text, missing) && strstr(err_text, "No such file"), "%s", err_text);
    cr_expect_null(strstr(err_text, "measurements"), "%s", err_text);
    const char *to_stdout[] = {SF_CLI_BIN, "tune", shards, "--size", "32", "--budget-s", "1",
                               "-o",       "-",    NULL};
    cr_assert_eq(run_cli_err(to_stdout, out, sizeof(out), err_text, sizeof(err_text)), 0, "%s",
                 err_text);
    cJSON *printed = cJSON_Parse(out);
    cr_expect(printed && cJSON_GetObjectItem(printed, "decode_threads"), "stdout: %s", out);
    cJSON_Delete(printed);
    cr_expect_null(strstr(err_text, "written to"), "%s", err_text);

    /* load --autotune: tunes, then runs; a flag given still wins (5 decode
     * threads: the search tries 1, cores / 2, cores and 1.5 x cores). */
    const char *tuned[] = {SF_CLI_BIN, "load", shards, "--size", "32", "--autotune", "1",
                           "--decode-threads", "5", "--json", NULL};
    cr_assert_eq(run_cli(tuned, out, sizeof(out)), 0, "%s", out);
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect_eq(cJSON_GetObjectItem(j, "images")->valuedouble, 80.0);
    cr_expect_eq(cJSON_GetObjectItem(j, "decode_threads")->valuedouble, 5.0, "%s", out);
    cJSON_Delete(j);
    expect_usage_error((const char *[]){SF_CLI_BIN, "load", shards, "--autotune", "0", NULL});
}

/* A dataset smaller than one batch with drop_last: no batch comes, both
 * pipeline runs measure 0 samples/s. The tuned point is not faster, so the
 * options given stay (kept_given), not an unmeasured prefetch_shards. */
Test(loader, tune_keeps_the_given_options_when_no_batch_is_delivered)
{
    struct sf_loader_options o;
    tune_options(&o, 3);
    o.batch_size = 8;
    o.drop_last = 1;
    o.prefetch_shards = 3;
    struct sf_tune_result r;
    char err[1024] = "";
    cr_assert_eq(sf_tune(&o, 1.0, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect_eq(r.tuned_per_s, 0.0, "%s", r.trace);
    cr_expect_eq(r.given_per_s, 0.0, "%s", r.trace);
    cr_expect(r.kept_given, "%s", r.trace);
    cr_expect_eq(r.prefetch_shards, 3u, "%s", r.config_json);
    cr_expect_eq(r.prefetch_batches, o.prefetch_batches, "%s", r.config_json);
}

/* tune -o: the probe before the budget is only an early warning; the write
 * itself can still fail (here: no file may grow, RLIMIT_FSIZE 0, SIGXFSZ
 * ignored, so write() says EFBIG). The failure names the file and exits 1,
 * and the config that was there stays whole: no truncated file, no
 * temporary left beside it. A pipe carries the CLI's output and its exit
 * status past the limit. */
Test(loader, tune_o_write_failure_keeps_the_old_file_and_leaves_no_temporary)
{
    local_dataset(20, 16 << 10, -1);
    char dir[800], cfg[900], out[8192];
    snprintf(dir, sizeof(dir), "%s/cfg", tmp);
    cr_assert(mkdir(dir, 0755) == 0);
    snprintf(cfg, sizeof(cfg), "%s/tuned.json", dir);
    const char *old = "{\"decode_threads\": 3}\n";
    cr_assert(test_write_file(dir, "tuned.json", old, strlen(old)) == 0);
    const char *script = "{ (trap '' XFSZ; ulimit -f 0; exec \"$0\" \"$@\") 2>&1; "
                         "echo \"rc=$?\"; } | cat";
    const char *run[] = {"/bin/sh",  "-c",  script,       SF_CLI_BIN, "tune", shards, "--size",
                         "32",       "--budget-s", "1",   "-o",       cfg,    NULL};
    cr_assert_eq(run_cli(run, out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "rc=1\n") != NULL, "%s", out);
    cr_expect(strstr(out, cfg) && strstr(out, strerror(EFBIG)), "%s", out);
    char kept[256] = "";
    FILE *f = fopen(cfg, "r");
    cr_assert(f, "%s is gone", cfg);
    size_t n = fread(kept, 1, sizeof(kept) - 1, f);
    fclose(f);
    kept[n] = 0;
    cr_expect_str_eq(kept, old, "the config -o names was replaced by a partial one");
    DIR *d = opendir(dir);
    cr_assert(d);
    unsigned entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    cr_expect_eq(entries, 1u, "a temporary file was left in %s", dir);

    /* -o a folder: access() lets it pass, the probe must not */
    const char *folder[] = {SF_CLI_BIN, "tune", shards, "--budget-s", "60", "-o", dir, NULL};
    char err[2048];
    cr_expect_eq(run_cli_err(folder, out, sizeof(out), err, sizeof(err)), 2, "%s", err);
    cr_expect(strstr(err, dir) && strstr(err, strerror(EISDIR)), "%s", err);
    cr_expect_null(strstr(err, "measurements"), "%s", err);
}

/* 60 samples behind a link capped at 64 KiB/s per connection, 2 of them;
 * RAM only, no extra field. */
static void slow_link_options(struct sf_loader_options *o)
{
    static const char *const slow[] = {"--fault", "prefix=bucket/data,bandwidth=64K", NULL};
    bucket_options(o, 60, 24 << 10, slow, NULL);
    o->extra_fields = NULL;
    o->s3.concurrency = 2;
}

Test(loader, tune_searches_concurrency_against_a_capped_link)
{
    struct sf_loader_options o;
    slow_link_options(&o);
    struct sf_tune_result r;
    char err[1024] = "";
    cr_assert_eq(sf_tune(&o, 9.0, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect(strstr(r.trace, "start c=2 ") != NULL && strstr(r.trace, "concurrency=4:"),
              "%s", r.trace);
    /* Each connection is capped: more connections fetch more. */
    cr_expect(r.concurrency > 2 || r.kept_given, "%s", r.trace);
    cr_expect(r.fetch_mib_per_s > 0, "%s", r.trace);
}

/* A budget too small for the fetch search: tune stops searching (and says
 * so) instead of overrunning it; the given concurrency and chunk stay. The
 * decode points alone take at least 3 spans of 0.25 s, so no fetch point
 * fits in 1 s whatever the machine's speed. */
Test(loader, tune_stops_its_search_at_the_budget)
{
    struct sf_loader_options o;
    slow_link_options(&o);
    o.s3.chunk_bytes = 4ull << 20;
    struct sf_tune_result r;
    char err[1024] = "";
    cr_assert_eq(sf_tune(&o, 1.0, &r, err, sizeof(err)), SF_OK, "%s", err);
    cr_expect(strstr(r.trace, "budget: search stopped") != NULL, "%s", r.trace);
    cr_expect(strstr(r.trace, "concurrency=") == NULL && strstr(r.trace, "chunk=") == NULL, "%s",
              r.trace);
    cr_expect_eq(r.concurrency, 2u, "%s", r.trace);
    cr_expect_eq(r.chunk_bytes, 4ull << 20, "%s", r.trace);
}

/* ------------------------------------------------------------ CLI exit codes */

/* 2 is bad usage only; a server's 400 and a 0-byte shard are failures (1),
 * and their messages keep what the server said and name the object. */
Test(loader, cli_exit_codes_usage_server_400_and_an_empty_shard)
{
    mock_dataset(40, 24 << 10);
    char out[16384], err[8192], cache_dir[800];
    snprintf(cache_dir, sizeof(cache_dir), "%s/cache", tmp);
    const char *zero[] = {
        SF_CLI_BIN, "load", "s3://bucket/data/", "--endpoint-url", srv.url, "--epochs", "0", NULL};
    cr_expect_eq(run_cli_err(zero, out, sizeof(out), err, sizeof(err)), 2, "%s", err);
    cr_expect(strstr(err, "--epochs"), "%s", err);

    /* with index.json: the 400 comes mid-epoch, through the disk cache */
    cr_assert_eq(
        admin("POST", "/_mock/fault?prefix=bucket/data/shard-000001&fault=400&count=1", NULL), 200);
    const char *disk[] = {SF_CLI_BIN,
                          "load",
                          "s3://bucket/data/",
                          "--endpoint-url",
                          srv.url,
                          "--cache-dir",
                          cache_dir,
                          "--size",
                          "16",
                          "--device",
                          "host",
                          "--json",
                          NULL};
    cr_expect_eq(run_cli_err(disk, out, sizeof(out), err, sizeof(err)), 1, "%s", err);
    cJSON *j = cJSON_Parse(out);
    cr_assert(cJSON_IsObject(j), "not one JSON object: %s", out);
    const cJSON *e = cJSON_GetObjectItem(j, "error");
    cr_expect(cJSON_IsString(e) && strstr(e->valuestring, "shard-000001.tar") &&
                  strstr(e->valuestring, "HTTP 400 InvalidRequest"),
              "%s", out);
    cJSON_Delete(j);

    /* without it: the 400 comes at open, reading the head shard */
    remove_bucket_index();
    cr_assert_eq(
        admin("POST", "/_mock/fault?prefix=bucket/data/shard-000000&fault=400&count=1", NULL), 200);
    const char *head[] = {
        SF_CLI_BIN, "load", "s3://bucket/data/", "--endpoint-url", srv.url,  "--ram-only",
        "--size",   "16",   "--device",          "host",           "--json", NULL};
    cr_expect_eq(run_cli_err(head, out, sizeof(out), err, sizeof(err)), 1, "%s", err);
    cr_expect(strstr(out, "\"ok\":false") && strstr(out, "InvalidRequest"), "%s", out);

    /* a 0-byte shard, alone: an error naming it; among others: an empty shard */
    char empty[900];
    snprintf(empty, sizeof(empty), "%s/bucket/empty/shard-000000.tar", root);
    cr_assert(test_write_file(root, "bucket/empty/shard-000000.tar", "", 0) == 0);
    const char *one[] = {SF_CLI_BIN,       "load",  "s3://bucket/empty/shard-000000.tar",
                         "--endpoint-url", srv.url, "--ram-only",
                         "--size",         "16",    "--device",
                         "host",           NULL};
    cr_expect_eq(run_cli_err(one, out, sizeof(out), err, sizeof(err)), 1, "%s", err);
    cr_expect(strstr(err, "s3://bucket/empty/shard-000000.tar") && strstr(err, "0 bytes"), "%s",
              err);
    cr_assert(test_write_file(root, "bucket/data/shard-999999.tar", "", 0) == 0);
    const char *among[] = {
        SF_CLI_BIN, "load", "s3://bucket/data/", "--endpoint-url", srv.url,  "--ram-only",
        "--size",   "16",   "--device",          "host",           "--json", NULL};
    cr_expect_eq(run_cli_err(among, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect_eq(cJSON_GetObjectItem(j, "images")->valuedouble, 40.0, "%s", out);
    cJSON_Delete(j);
}

/* `load --json` has one wait share: `consumer_wait_share` is the report's
 * `wait_share` (time blocked in next() over the time from the first next()
 * on), not a second figure over a span that also counts the open. The
 * index.json answers 300 ms late, so the open is long next to the run. */
Test(loader, cli_load_json_has_one_wait_share)
{
    const char *slow_index[] = {"--fault", "prefix=bucket/data/index.json,latency_ms=300", NULL};
    mock_dataset_with(40, 24 << 10, slow_index);
    char out[16384], err[8192];
    const char *run[] = {SF_CLI_BIN, "load",     "s3://bucket/data/", "--endpoint-url",
                         srv.url,    "--ram-only", "--size",          "16",
                         "--device", "host",     "--epochs",          "2",
                         "--json",   NULL};
    cr_assert_eq(run_cli_err(run, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    const cJSON *share = cJSON_GetObjectItem(j, "consumer_wait_share");
    const cJSON *r = cJSON_GetObjectItem(j, "report");
    cr_assert(cJSON_IsNumber(share) && cJSON_IsObject(r), "%s", out);
    const double rep = cJSON_GetObjectItem(r, "wait_share")->valuedouble;
    cr_expect(rep > 0, "%s", out);
    cr_expect_eq(share->valuedouble, rep, "consumer_wait_share %.17g, report.wait_share %.17g: %s",
                 share->valuedouble, rep, out);
    cJSON_Delete(j);
}

/* --config and the S3 flags every command takes (--endpoint-url,
 * --concurrency, ...): the flag given wins over the file, as for the
 * loader's own flags. The file's endpoint refuses connections. */
Test(loader, cli_s3_flags_win_over_the_config_file)
{
    mock_dataset(20, 24 << 10);
    char out[16384], err[8192], cfg[800];
    snprintf(cfg, sizeof(cfg), "%s/s3.json", tmp);
    const char *text = "{\"endpoint_url\": \"http://127.0.0.1:1\", \"max_attempts\": 1}";
    cr_assert(test_write_file(tmp, "s3.json", text, strlen(text)) == 0);
    const char *run[] = {SF_CLI_BIN, "load",       "s3://bucket/data/", "--config", cfg,
                         "--endpoint-url", srv.url, "--ram-only", "--size", "16",
                         "--device", "host", "--json", NULL};
    cr_assert_eq(run_cli_err(run, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect_eq(cJSON_GetObjectItem(j, "images")->valuedouble, 20.0, "%s", out);
    cJSON_Delete(j);
}

/* `load --config tmp/s3.json` (a file holding config) with the flags
 * (NULL-terminated, may be NULL) after the usual ones (RAM only, 16 x 16,
 * host, --json). Returns the exit status. */
static int load_with_config(const char *config, const char *const *flags, char *out, size_t out_len,
                            char *err, size_t err_len)
{
    char cfg[800];
    snprintf(cfg, sizeof(cfg), "%s/s3.json", tmp);
    cr_assert(test_write_file(tmp, "s3.json", config, strlen(config)) == 0);
    const char *args[24] = {
        SF_CLI_BIN, "load", "s3://bucket/data/", "--config", cfg,     "--ram-only",
        "--size",   "16",   "--device",          "host",     "--json"};
    size_t n = 11;
    for (; flags && *flags; flags++) {
        cr_assert_lt(n, 23);
        args[n++] = *flags;
    }
    args[n] = NULL;
    return run_cli_err(args, out, out_len, err, err_len);
}

/* One run of load_with_config: its flags, its exit status and, on 0, the
 * images it must deliver; else a text its error must hold. */
struct config_case {
    const char *config;
    const char *flags[6];
    int rc;
    const char *error_has;
};

static void expect_config_cases(const struct config_case *k, size_t n, unsigned images)
{
    char out[16384], err[8192];
    for (size_t i = 0; i < n; i++) {
        int rc = load_with_config(k[i].config, k[i].flags, out, sizeof(out), err, sizeof(err));
        cr_expect_eq(rc, k[i].rc, "case %zu (%s): exit %d: %s", i, k[i].config, rc, err);
        cJSON *j = cJSON_Parse(out);
        cr_assert(j, "case %zu: not JSON: %s", i, out);
        if (k[i].rc == 0) {
            const cJSON *got = cJSON_GetObjectItem(j, "images");
            cr_expect(cJSON_IsNumber(got) && got->valuedouble == images, "case %zu: %s", i, out);
        } else {
            const cJSON *e = cJSON_GetObjectItem(j, "error");
            cr_expect(cJSON_IsString(e) && strstr(e->valuestring, k[i].error_has),
                      "case %zu: wanted '%s' in the error: %s", i, k[i].error_has, out);
        }
        cJSON_Delete(j);
    }
}

/* --addressing over the config's "addressing" (an endpoint at localhost:
 * virtual-hosted, the listing goes to bucket.localhost/, which the mock
 * answers with its list of buckets), and an abbreviated flag (--endpoint
 * for --endpoint-url, as getopt takes it) wins too. */
Test(loader, cli_addressing_and_an_abbreviated_flag_win_over_the_config_file)
{
    mock_dataset(20, 24 << 10);
    char local[64], eq[80];
    snprintf(local, sizeof(local), "http://localhost:%u", srv.port);
    snprintf(eq, sizeof(eq), "--endpoint=%s", srv.url);
    const char *virt = "{\"addressing\": \"virtual\", \"max_attempts\": 1}";
    const char *path = "{\"addressing\": \"path\", \"max_attempts\": 1}";
    const char *far = "{\"endpoint_url\": \"http://127.0.0.1:1\", \"max_attempts\": 1}";
    const struct config_case k[] = {
        {virt, {"--endpoint-url", local, "--addressing", "path"}, 0, NULL},
        {virt, {"--endpoint-url", local}, 1, "ListAllMyBucketsResult"},
        {path, {"--endpoint-url", local}, 0, NULL},
        {path, {"--endpoint-url", local, "--addressing=virtual"}, 1, "ListAllMyBucketsResult"},
        {far, {eq}, 0, NULL},
    };
    expect_config_cases(k, sizeof(k) / sizeof(k[0]), 20);
}

/* A self-signed certificate for localhost and 127.0.0.1 (P-256, valid to
 * 2126) and its key, for a mock over TLS that nothing trusts. */
static const char test_cert_pem[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBqzCCAVGgAwIBAgIUF/Cit9XDGWoncV1A2qPE+RmFCnEwCgYIKoZIzj0EAwIw\n"
    "FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEyNzE0MjIzOVoYDzIxMjYxMTAz\n"
    "MTQyMjM5WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO\n"
    "PQMBBwNCAAQ7fo8RwcDWb/kTgpNJJwA5ANmU1b6MI54EEve9oszXwp/B4IHbQIlR\n"
    "UdKfGam/lEAQEmjULQ4GrJv0y9zwKwAbo38wfTAdBgNVHQ4EFgQURYwgHzdvR3x0\n"
    "nHjmAiT8lEiLsyQwHwYDVR0jBBgwFoAURYwgHzdvR3x0nHjmAiT8lEiLsyQwDwYD\n"
    "VR0TAQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAoQwGgYDVR0RBBMwEYIJbG9jYWxo\n"
    "b3N0hwR/AAABMAoGCCqGSM49BAMCA0gAMEUCIFoC6BugDBkJuXK0+Tds/zktfRU6\n"
    "sD+Q+YATfUam/u7gAiEAlJ+ca/z0Kjc0lLdJsT3xteu3ogxafUpUCJsDjKsxXfk=\n"
    "-----END CERTIFICATE-----\n";
static const char test_key_pem[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgRLkmPIYjDVyUaoeO\n"
    "A/ouwY7P5HQ911YR8hyeFx8p/ZehRANCAAQ7fo8RwcDWb/kTgpNJJwA5ANmU1b6M\n"
    "I54EEve9oszXwp/B4IHbQIlRUdKfGam/lEAQEmjULQ4GrJv0y9zwKwAb\n"
    "-----END PRIVATE KEY-----\n";

/* --insecure over the config's "insecure": false, against a mock over TLS
 * whose certificate no CA bundle holds; and the file's true without it. */
Test(loader, cli_insecure_wins_over_the_config_file)
{
    char *dir = test_tmpdir(), cert[800], key[800];
    cr_assert(dir);
    snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
    snprintf(key, sizeof(key), "%s/key.pem", dir);
    cr_assert(test_write_file(dir, "cert.pem", test_cert_pem, strlen(test_cert_pem)) == 0);
    cr_assert(test_write_file(dir, "key.pem", test_key_pem, strlen(test_key_pem)) == 0);
    const char *tls[] = {"--tls-cert", cert, "--tls-key", key, NULL};
    mock_dataset_with(20, 24 << 10, tls);
    cr_assert(!strncmp(srv.url, "https://", 8), "%s", srv.url);
    const char *no = "{\"insecure\": false, \"max_attempts\": 1}";
    const char *yes = "{\"insecure\": true, \"max_attempts\": 1}";
    const struct config_case k[] = {
        {no, {"--endpoint-url", srv.url, "--insecure"}, 0, NULL},
        {no, {"--endpoint-url", srv.url}, 1, "self-signed certificate"},
        {yes, {"--endpoint-url", srv.url}, 0, NULL},
    };
    expect_config_cases(k, sizeof(k) / sizeof(k[0]), 20);
    test_rmtree(dir);
    free(dir);
}

/* A TLS listener that only reads each ClientHello and hangs up: whether
 * curl offered HTTP/2 (ALPN "h2") or only HTTP/1.1. */
struct hello_catcher {
    int fd;
    unsigned port;
    pthread_t thread;
    _Atomic int stop;
    int hellos, h2, http11; /* read after the join */
};

static void *catch_hellos(void *arg)
{
    struct hello_catcher *h = arg;
    static const char h2[] = "\x02h2\x08http/1.1", h11[] = "\x08http/1.1";
    while (!h->stop) {
        struct pollfd p = {h->fd, POLLIN, 0};
        if (poll(&p, 1, 50) != 1)
            continue;
        int c = accept(h->fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[16384];
        size_t n = 0;
        struct pollfd pc = {c, POLLIN, 0};
        /* the record header's length says when the hello is whole */
        while (n < sizeof(buf) && poll(&pc, 1, 2000) == 1) {
            ssize_t r = read(c, buf + n, sizeof(buf) - n);
            if (r <= 0)
                break;
            n += (size_t)r;
            if (n >= 5 && n >= 5 + ((size_t)(unsigned char)buf[3] << 8 | (unsigned char)buf[4]))
                break;
        }
        close(c);
        h->hellos++;
        h->h2 |= memmem(buf, n, h2, sizeof(h2) - 1) != NULL;
        h->http11 |= memmem(buf, n, h11, sizeof(h11) - 1) != NULL;
    }
    return NULL;
}

static void hello_catcher_start(struct hello_catcher *h)
{
    memset(h, 0, sizeof(*h));
    h->fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(h->fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    cr_assert_eq(bind(h->fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(h->fd, 16), 0);
    cr_assert_eq(getsockname(h->fd, (struct sockaddr *)&a, &len), 0);
    h->port = ntohs(a.sin_port);
    cr_assert_eq(pthread_create(&h->thread, NULL, catch_hellos, h), 0);
}

static void hello_catcher_stop(struct hello_catcher *h)
{
    h->stop = 1;
    pthread_join(h->thread, NULL);
    close(h->fd);
}

/* --http2 over the config's "http2": false (seen in the ClientHello's ALPN),
 * the file's true without it, and --ca-bundle over the config's
 * "ca_bundle" (the error names the file that was used; neither exists). */
Test(loader, cli_http2_and_ca_bundle_win_over_the_config_file)
{
    loader_tmpdir();
    const char *off = "{\"http2\": false, \"max_attempts\": 1}";
    const char *on = "{\"http2\": true, \"max_attempts\": 1}";
    const struct {
        const char *config;
        int flag, h2;
    } k[] = {{off, 1, 1}, {on, 0, 1}, {off, 0, 0}};
    char out[16384], err[8192], url[64];
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        struct hello_catcher h;
        hello_catcher_start(&h);
        snprintf(url, sizeof(url), "https://127.0.0.1:%u", h.port);
        const char *flags[] = {"--endpoint-url", url, "--no-sign-request",
                               k[i].flag ? "--http2" : NULL, NULL};
        int rc = load_with_config(k[i].config, flags, out, sizeof(out), err, sizeof(err));
        hello_catcher_stop(&h);
        cr_expect_eq(rc, 1, "case %zu: %s", i, err);
        cr_assert_gt(h.hellos, 0, "case %zu: no ClientHello came: %s", i, err);
        cr_expect(h.http11, "case %zu: no ALPN seen in the ClientHello", i);
        cr_expect_eq(h.h2, k[i].h2, "case %zu: h2 offered: %d, wanted %d", i, h.h2, k[i].h2);
    }

    char cfg_ca[900], flag_ca[900], cfg_text[1100];
    snprintf(cfg_ca, sizeof(cfg_ca), "%s/config-ca.pem", tmp);
    snprintf(flag_ca, sizeof(flag_ca), "%s/flag-ca.pem", tmp);
    snprintf(cfg_text, sizeof(cfg_text),
             "{\"ca_bundle\": \"%s\", \"endpoint_url\": \"http://127.0.0.1:1\"}", cfg_ca);
    const struct config_case ca[] = {
        {cfg_text, {"--ca-bundle", flag_ca}, 1, flag_ca},
        {cfg_text, {NULL}, 1, cfg_ca},
    };
    expect_config_cases(ca, sizeof(ca) / sizeof(ca[0]), 0);
}

/* --json: a failure at open, or in the options, is one object with the error
 * too, as one mid-epoch is. */
Test(loader, cli_json_failure_at_open_is_one_object_with_the_error)
{
    local_dataset(20, 64 << 10, -1);
    char out[16384], err[8192], cfg[800], missing[800];
    snprintf(cfg, sizeof(cfg), "%s/bad.json", tmp);
    cr_assert(test_write_file(tmp, "bad.json", "{\"batch_size\": \"many\"}", 22) == 0);
    snprintf(missing, sizeof(missing), "%sno-such-shard.tar", shards);
    const char *bad_cfg[] = {SF_CLI_BIN, "load", shards, "--config", cfg, "--json", NULL};
    const char *gone[] = {SF_CLI_BIN, "load", missing, "--device", "host", "--json", NULL};
    const char *tune[] = {SF_CLI_BIN, "load", missing, "--autotune", "1", "--json", NULL};
    const char *const *runs[] = {bad_cfg, gone, tune};
    const char *want[] = {"batch_size", "no-such-shard.tar", "no-such-shard.tar"};
    const int rc[] = {2, 1, 1};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(run_cli_err(runs[i], out, sizeof(out), err, sizeof(err)), rc[i], "%d: %s", i,
                     err);
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithOpts(out, &end, 0);
        cr_expect(cJSON_IsObject(j) && end && strspn(end, " \n") == strlen(end),
                  "%d: not one JSON object: '%s'", i, out);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "ok")) && cJSON_IsString(e) &&
                      strstr(e->valuestring, want[i]),
                  "%d: %s", i, out);
        cJSON_Delete(j);
    }
}
