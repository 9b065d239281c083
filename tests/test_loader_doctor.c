/* The loader's measuring commands: doctor (which stage limits the step)
 * and tune (a config the loader takes, searched within a budget), from C
 * and through the CLI. Suite `loader` (test_loader.c). */
#include "loader_fixture.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ doctor */

/* o: the one source in src (base_options), decoded by one thread. */
static void one_thread_options(struct sf_loader_options *o, const char *const *src)
{
    base_options(o, src, 1);
    o->decode_threads = 1;
}

/* Doctor measures o for seconds; fails the test unless it returns want
 * (showing its message). The result in r, the message in err. */
static void measure_expect(const struct sf_loader_options *o, double seconds, sf_status want,
                           struct sf_doctor_result *r, char *err, size_t err_len)
{
    cr_assert_eq(sf_doctor_measure(o, seconds, r, err, err_len), want, "%s", err);
}

Test(loader, doctor_names_decode_when_one_thread_feeds_a_step_that_takes_no_time)
{
    struct sf_loader_options o;
    local_options(&o, 120, 16 << 10);
    o.decode_threads = 1;
    struct sf_doctor_result r;
    char err[1024] = "";
    measure_expect(&o, 0.4, SF_OK, &r, err, sizeof(err));
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
    one_thread_options(&o, shards_src);
    o.extra_fields = NULL;
    struct sf_doctor_result r;
    char err[1024] = "";
    measure_expect(&o, 0.4, SF_OK, &r, err, sizeof(err));
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
    one_thread_options(&o, shards_src);
    struct sf_doctor_result r;
    char err[1024] = "";
    measure_expect(&o, 0.1, SF_OK, &r, err, sizeof(err));
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
    one_thread_options(&o, src);
    struct sf_doctor_result r;
    char err[1024] = "";
    measure_expect(&o, 0.1, SF_ERR_CORRUPT, &r, err, sizeof(err));
    cr_expect(strstr(err, "sample 's00033'") != NULL, "%s", err);
    cr_expect_null(strstr(err, "shard-000000.tar"), "%s", err);

    /* with on_error skip the loader leaves it out, and so does doctor (it
     * failed: no doctor on data the loader reads) */
    o.on_error = SF_ON_ERROR_SKIP;
    measure_expect(&o, 0.1, SF_OK, &r, err, sizeof(err));
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
    measure_expect(&o, 0.1, SF_ERR_CORRUPT, &r, err, sizeof(err));
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
    measure_expect(&o, 1.0, SF_OK, &r, err, sizeof(err));
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

/* A shard doctor cannot start to read for want of credentials: the message
 * said only "access denied", where every other command gives the chain's
 * account of what it tried. */
Test(loader, doctor_says_why_a_shard_cannot_be_read)
{
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_PROFILE");
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
    setenv("AWS_CONFIG_FILE", "/nonexistent/config", 1);
    const char *src[] = {"s3://bucket/x.tar"};
    struct sf_loader_options o;
    base_options(&o, src, 1);
    o.s3.endpoint_url = "http://127.0.0.1:1";
    struct sf_doctor_result r;
    char err[2048] = "";
    cr_expect_eq(sf_doctor_measure(&o, 0.2, &r, err, sizeof(err)), SF_ERR_ACCESS_DENIED, "%s",
                 err);
    cr_expect(strstr(err, "s3://bucket/x.tar"), "%s", err);
    cr_expect(strstr(err, "no credentials"), "%s", err);
    cr_expect(strstr(err, "AWS_ACCESS_KEY_ID not set"), "%s", err);
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
