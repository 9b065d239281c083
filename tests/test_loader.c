/* The loader end to end: shards packed by sf_pack from generated JPEGs, read
 * from local paths and from the mock S3 server (cold cache, warm cache, RAM
 * only, with faults), decoded into batches. Checks order determinism,
 * exactly-once delivery, labels against pixels, distributed splits, error
 * policies, state save/restore and the CLI.
 *
 * One suite, `loader`, in one executable built from this file (local epochs,
 * held batches, the starvation report), test_loader_s3.c (the mock, faults,
 * the listing), test_loader_unindexed.c (no index.json: estimated counts),
 * test_loader_state.c (state save/restore), test_loader_cli.c (CLI),
 * test_loader_doctor.c (doctor, tune), test_loader_gpu.c (GPU delivery) and
 * the fixture loader_fixture.c. */
#include "loader_fixture.h"
#include "src/loader.h"
#include "src/loader_internal.h"
#include "support/mock_proc.h"
#include "support/rss.h"
#include "support/s3_client.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(loader, .fini = loader_teardown, .timeout = 240);

/* ------------------------------------------------------------ tests */

Test(loader, one_epoch_delivers_every_sample_once_with_its_label)
{
    struct sf_loader_options o;
    local_options(&o, 150, 64 << 10);
    struct sf_loader *l = open_loader(&o);
    cr_assert_gt(sf_loader_shard_count(l), 2u, "the dataset should span several shards");
    struct epoch_log e;
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH);
    cr_assert_eq(e.images, 150u);
    cr_assert_eq(e.batches, 10u); /* 9 x 16 + 6 */
    for (unsigned i = 0; i < n_samples; i++)
        cr_assert_eq(e.seen[i], 1, "sample %u delivered %d times", i, e.seen[i]);
    cr_assert(e.labels_ok, "a label does not match its image's class");
    struct sf_loader_stats s;
    sf_loader_get_stats(l, &s);
    cr_assert_eq(s.samples_delivered, 150u);
    cr_assert_eq(s.samples_decoded, 150u);
    cr_assert_eq(s.samples_read, 150u);
    cr_assert_eq(s.samples_skipped, 0u);
    free(e.seen);
    /* The next epoch: a different order, same set. */
    cr_assert_eq(sf_loader_set_epoch(l, 1), SF_OK);
    struct epoch_log e2;
    cr_assert_eq(run_epoch(l, &e2, 0), SF_END_OF_EPOCH);
    cr_assert_eq(e2.images, 150u);
    for (unsigned i = 0; i < n_samples; i++)
        cr_assert_eq(e2.seen[i], 1);
    cr_assert_neq(e.digest, e2.digest, "epoch 1 repeated epoch 0's batches");
    free(e2.seen);
    sf_loader_close(l);
}


/* The label field's whole name picks its syntax: "label.json" (longer than a
 * short name buffer once was) is JSON, its object's "label" the label. */
Test(loader, a_long_label_field_name_keeps_its_json_syntax)
{
    loader_tmpdir();
    char src[700], path[800], cls[32];
    snprintf(src, sizeof(src), "%s/src", tmp);
    make_flat(src, 20, -1);
    for (unsigned i = 0; i < 20; i++) {
        snprintf(path, sizeof(path), "%s/s%05u.cls", src, i);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f);
        cr_assert_not_null(fgets(cls, sizeof(cls), f));
        fclose(f);
        snprintf(path, sizeof(path), "%s/s%05u.cls", src, i);
        cr_assert_eq(unlink(path), 0);
        snprintf(path, sizeof(path), "%s/s%05u.label.json", src, i);
        f = fopen(path, "w");
        cr_assert_not_null(f);
        fprintf(f, "{\"label\": %d, \"source\": \"test\"}\n", atoi(cls));
        fclose(f);
    }
    snprintf(shards, sizeof(shards), "%s/shards/", tmp);
    pack(src, shards, 64 << 10, NULL);
    n_samples = 20;
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    o.label_fields = "label.json";
    struct epoch_log e;
    struct sf_loader *l = open_and_run_epoch(&o, &e);
    cr_assert_eq(e.images, 20u);
    cr_assert(e.labels_ok, "labels differ from the classes");
    free(e.seen);
    sf_loader_close(l);
}
Test(loader, same_seed_same_batches_different_seed_different)
{
    local_dataset(120, 48 << 10, -1);
    uint64_t d[3];
    for (int run = 0; run < 3; run++) {
        struct sf_loader_options o;
        base_options(&o, shards_src, 1);
        o.decode_threads = run == 1 ? 1 : 3; /* thread count must not matter */
        o.sampler.seed = run == 2 ? 8 : 7;
        struct epoch_log e;
        struct sf_loader *l = open_and_run_epoch(&o, &e);
        cr_assert_eq(e.images, 120u);
        cr_assert(e.labels_ok);
        d[run] = e.digest;
        free(e.seen);
        sf_loader_close(l);
    }
    cr_assert_eq(d[0], d[1], "same seed, different batches");
    cr_assert_neq(d[0], d[2], "a different seed gave the same batches");
}

Test(loader, drop_last_and_layouts)
{
    struct sf_loader_options o;
    local_options(&o, 70, 64 << 10);
    o.drop_last = 1;
    o.image.layout = SF_LAYOUT_HWC;
    struct sf_loader *l = open_loader(&o);
    cr_assert_eq(sf_loader_epoch_batches(l), 4u);
    struct epoch_log e;
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH);
    cr_assert_eq(e.images, 64u);
    cr_assert_eq(e.batches, 4u);
    cr_assert(e.labels_ok);
    free(e.seen);
    sf_loader_close(l);
}

Test(loader, ranks_split_the_epoch_without_overlap)
{
    local_dataset(101, 24 << 10, -1);
    unsigned char *all = calloc(n_samples, 1);
    unsigned sizes[3];
    for (int r = 0; r < 3; r++) {
        struct sf_loader_options o;
        rank_options(&o, shards_src, 1, r, 3);
        struct epoch_log e;
        struct sf_loader *l = open_and_run_epoch(&o, &e);
        cr_assert(e.labels_ok);
        sizes[r] = e.images;
        for (unsigned i = 0; i < n_samples; i++)
            all[i] += e.seen[i];
        free(e.seen);
        sf_loader_close(l);
    }
    cr_assert(sizes[0] == sizes[1] && sizes[1] == sizes[2], "PAD: equal sizes %u %u %u", sizes[0],
              sizes[1], sizes[2]);
    for (unsigned i = 0; i < n_samples; i++)
        cr_assert_eq(all[i], 1, "sample %u delivered %d times over the ranks", i, all[i]);
    free(all);
}

Test(loader, corrupt_jpeg_fails_naming_the_sample_or_is_skipped)
{
    local_dataset(60, 1 << 20, 37);
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    struct sf_loader *l = open_loader(&o);
    struct epoch_log e;
    sf_status st = run_epoch(l, &e, 0);
    cr_assert(st != SF_OK && st != SF_END_OF_EPOCH, "a corrupt JPEG went through: %s",
              sf_status_name(st));
    const char *m = sf_loader_errmsg(l);
    cr_assert(strstr(m, "s00037") && strstr(m, "shard-000000.tar") && strstr(m, "offset"),
              "message: %s", m);
    /* sticky */
    struct sf_batch b;
    cr_assert_eq(sf_loader_next(l, &b), st);
    free(e.seen);
    sf_loader_close(l);

    o.on_error = SF_ON_ERROR_SKIP;
    l = open_loader(&o);
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH);
    cr_assert_eq(e.images, 59u);
    cr_assert_eq(e.seen[37], 0);
    cr_assert(e.labels_ok);
    struct sf_loader_stats s;
    sf_loader_get_stats(l, &s);
    cr_assert_eq(s.samples_skipped, 1u);
    free(e.seen);
    sf_loader_close(l);
}

Test(loader, bad_options_are_refused_naming_them)
{
    const char *src[] = {"/nonexistent/shards/"};
    struct sf_loader_options o;
    base_options(&o, src, 1);
    char err[512];
    struct sf_loader *l = (struct sf_loader *)1;
    o.batch_size = 0;
    cr_assert_eq(sf_loader_open(&o, &l, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_assert_null(l);
    cr_assert(strstr(err, "batch_size"), "%s", err);
    base_options(&o, src, 1);
    o.prefetch_batches = 1;
    cr_assert_eq(sf_loader_open(&o, &l, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(err, "prefetch_batches"), "%s", err);
    base_options(&o, src, 1);
    o.image.scale_min = 2;
    cr_assert_eq(sf_loader_open(&o, &l, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(err, "scale"), "%s", err);
    base_options(&o, src, 1);
    cr_assert_neq(sf_loader_open(&o, &l, err, sizeof(err)), SF_OK);
    cr_assert(strstr(err, "/nonexistent/shards/"), "%s", err);
    base_options(&o, src, 1);
    o.device = SF_DEVICE_CUDA;
    if (sf_cuda_device_count() == 0) {
        cr_assert_eq(sf_loader_open(&o, &l, err, sizeof(err)), SF_ERR_UNSUPPORTED);
        cr_assert(strstr(err, "cuda"), "%s", err);
    }
    /* JSON configuration: names and errors. */
    void *keep = NULL;
    sf_loader_options_init_default(&o);
    cr_assert_eq(sf_loader_options_from_json(
                     &o,
                     "{\"batch_size\": 64, \"chunk_size\": \"4M\", \"crop\": \"center\", "
                     "\"sources\": [\"s3://b/x.tar\"], \"mean\": [0.5, 0.5, 0.5]}",
                     &keep, err, sizeof(err)),
                 SF_OK, "%s", err);
    cr_assert_eq(o.batch_size, 64u);
    cr_assert_eq(o.s3.chunk_bytes, 4ull << 20);
    cr_assert_eq(o.image.crop, SF_CROP_CENTER);
    cr_assert_eq(o.source_count, 1u);
    cr_assert_str_eq(o.sources[0], "s3://b/x.tar");
    cr_assert_float_eq(o.image.mean[1], 0.5f, 1e-6);
    sf_loader_options_free_json(keep);
    cr_assert_eq(sf_loader_options_from_json(&o, "{\"batch_sise\": 64}", &keep, err, sizeof(err)),
                 SF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(err, "batch_sise"), "%s", err);
    cr_assert_eq(
        sf_loader_options_from_json(&o, "{\"crop\": \"diagonal\"}", &keep, err, sizeof(err)),
        SF_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(err, "crop"), "%s", err);
    cr_assert_eq(sf_loader_options_from_json(&o, "[1,2]", &keep, err, sizeof(err)),
                 SF_ERR_INVALID_ARGUMENT);
    /* A key given twice: the last one counts (docs/loader.md), sources too. */
    sf_loader_options_init_default(&o);
    cr_assert_eq(sf_loader_options_from_json(&o,
                                             "{\"batch_size\": 3, \"sources\": [\"a\", \"b\"], "
                                             "\"batch_size\": 7, \"sources\": [\"c\"]}",
                                             &keep, err, sizeof(err)),
                 SF_OK, "%s", err);
    cr_assert_eq(o.batch_size, 7u);
    cr_assert_eq(o.source_count, 1u);
    cr_assert_str_eq(o.sources[0], "c");
    sf_loader_options_free_json(keep);
}

/* json is refused as a loader configuration (SF_ERR_INVALID_ARGUMENT, its
 * message in err), nothing kept and the options as they were. */
static void expect_json_refused(const char *json, char *err, size_t err_len)
{
    struct sf_loader_options o;
    sf_loader_options_init_default(&o);
    void *keep = NULL;
    cr_expect_eq(sf_loader_options_from_json(&o, json, &keep, err, err_len),
                 SF_ERR_INVALID_ARGUMENT, "%s was taken", json);
    cr_expect_null(keep);
    cr_expect_null(o.cache.dir, "a refused configuration changed the options");
}

/* cJSON keeps C strings: "\u0000" in a JSON string would end it there, so
 * "bucket\u0000/x" would be read as another path. Such a string is refused
 * naming its field; an escaped backslash before "u0000" is no NUL. */
Test(loader, json_options_holding_a_nul_are_refused_naming_the_field)
{
    static const struct {
        const char *json, *named;
    } bad[] = {
        {"{\"cache_dir\": \"/tmp/c\\u0000/x\"}", "option 'cache_dir'"},
        {"{\"sources\": [\"s3://b/a.tar\", \"s3://b\\u0000/x.tar\"]}", "sources[1]"},
        {"{\"endpoint_url\": \"http://h\\u0000.evil\"}", "option 'endpoint_url'"},
        {"{\"cache_dir\\u0000x\": \"/tmp/c\"}", "option 'cache_dir': its name"},
        {"{\"batch_size\": 4, \"image_fields\": \"jpg\\u0000;png\"}", "option 'image_fields'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[512] = "";
        expect_json_refused(bad[i].json, err, sizeof(err));
        cr_expect(strstr(err, bad[i].named) && strstr(err, "NUL"), "%s: %s", bad[i].json, err);
    }
    struct sf_loader_options o;
    sf_loader_options_init_default(&o);
    void *keep = NULL;
    char err[512] = "";
    cr_assert_eq(sf_loader_options_from_json(&o, "{\"cache_dir\": \"/tmp/a\\\\u0000\"}", &keep, err,
                                             sizeof(err)),
                 SF_OK, "%s", err);
    cr_assert_str_eq(o.cache.dir, "/tmp/a\\u0000");
    sf_loader_options_free_json(keep);
}

/* A value of the wrong kind in a configuration said only "option 'x': bad
 * value". Now the message says what the option takes and what it got. */
Test(loader, a_bad_option_value_says_what_was_expected_and_what_came)
{
    static const struct {
        const char *json, *words[3];
    } bad[] = {
        {"{\"batch_size\": \"x\"}", {"'batch_size'", "a whole number in 0..1048576", "got \"x\""}},
        {"{\"decode_threads\": 1.5}", {"'decode_threads'", "a whole number", "got 1.5"}},
        {"{\"crop\": \"diagonal\"}",
         {"one of random_resized, center or none", "got \"diagonal\"", NULL}},
        {"{\"learned_counts\": 3}", {"one of auto, never or always", "got 3", NULL}},
        {"{\"mean\": [1, 2]}", {"an array of 3 finite numbers", "got [1,2]", NULL}},
        {"{\"cache_limit\": \"lots\"}", {"a byte count", "got \"lots\"", NULL}},
        {"{\"concurrency\": 0}", {"a whole number in 1..", "got 0", NULL}},
        {"{\"drop_last\": 1}", {"true or false", "got 1", NULL}},
        {"{\"rank\": -2}", {"-1..", "got -2", NULL}},
        {"{\"endpoint_url\": {\"a\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}",
         {"a string", "got {\"a\":\"xxx", "..."}},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[512] = "";
        expect_json_refused(bad[i].json, err, sizeof(err));
        for (int k = 0; k < 3 && bad[i].words[k]; k++)
            cr_expect(strstr(err, bad[i].words[k]), "%s: '%s' missing from: %s", bad[i].json,
                      bad[i].words[k], err);
    }
}

/* A rank not below the world size, a shuffle buffer over its limit or an
 * unknown policy are bad options like the others: sf_loader_options_check
 * refuses them naming them, so `load` exits 2 before anything is listed.
 * Only the sampler found them, at open, after the listing (exit 1). */
Test(loader, sampling_options_are_checked_with_the_others)
{
    const char *src[] = {"/nonexistent/shards/"};
    struct sf_loader_options o;
    char err[512];
    base_options(&o, src, 1);
    o.sampler.rank = 1;
    o.sampler.world_size = 1;
    cr_expect_eq(sf_loader_options_check(&o, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "rank 1") && strstr(err, "world size 1"), "%s", err);
    base_options(&o, src, 1);
    o.sampler.shuffle_buffer = SF_SAMPLER_MAX_SHUFFLE_BUFFER + 1;
    cr_expect_eq(sf_loader_options_check(&o, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "shuffle_buffer"), "%s", err);
    base_options(&o, src, 1);
    o.sampler.policy = (enum sf_epoch_policy)7;
    cr_expect_eq(sf_loader_options_check(&o, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "policy"), "%s", err);
    /* from the launcher's environment */
    base_options(&o, src, 1);
    o.sampler.rank = o.sampler.world_size = -1;
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "2", 1);
    cr_expect_eq(sf_loader_options_check(&o, err, sizeof(err)), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "RANK"), "%s", err);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    /* the loader caps initial_fill at a smaller shuffle buffer: not refused */
    base_options(&o, src, 1);
    o.sampler.shuffle_buffer = 10;
    o.sampler.initial_fill = 100;
    cr_expect_eq(sf_loader_options_check(&o, err, sizeof(err)), SF_OK, "%s", err);

    loader_tmpdir();
    char dir[800], out[4096], cerr[4096];
    snprintf(dir, sizeof(dir), "%s/none/", tmp);
    const char *cli[] = {SF_CLI_BIN, "load", dir, "--device", "host", "--rank", "1",
                         "--world-size", "1", NULL};
    cr_expect_eq(run_cli_err(cli, out, sizeof(out), cerr, sizeof(cerr)), 2, "%s", cerr);
    cr_expect(strstr(cerr, "rank 1"), "%s", cerr);
}

/* ------------------------------------------------------------ holding batches */

Test(loader, a_held_batch_never_blocks_the_ring)
{
    struct sf_loader_options o;
    local_options(&o, 300, 64 << 10);
    o.prefetch_batches = 3;
    struct sf_loader *l = open_loader(&o);
    /* Keep batch 0 for the whole epoch, release every later one. */
    struct sf_batch first, b;
    cr_assert_eq(sf_loader_next(l, &first), SF_OK);
    unsigned n = (unsigned)first.size, batches = 1;
    sf_status st;
    while ((st = sf_loader_next(l, &b)) == SF_OK) {
        n += (unsigned)b.size;
        batches++;
        sf_loader_release(l, &b);
    }
    cr_assert_eq(st, SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(n, 300u);
    cr_assert_eq(batches, 19u);
    sf_loader_release(l, &first);
    /* Get the next, then release the previous (double buffering), across an
     * epoch boundary: the last batch of epoch 1 is still held when epoch 2
     * starts. */
    struct sf_batch prev;
    int have_prev = 0;
    for (uint64_t epoch = 1; epoch <= 2; epoch++) {
        cr_assert_eq(sf_loader_set_epoch(l, epoch), SF_OK);
        n = 0;
        while ((st = sf_loader_next(l, &b)) == SF_OK) {
            n += (unsigned)b.size;
            if (have_prev)
                sf_loader_release(l, &prev);
            prev = b;
            have_prev = 1;
        }
        cr_assert_eq(st, SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
        cr_assert_eq(n, 300u);
        if (epoch == 2)
            sf_loader_release(l, &prev);
    }
    /* Holding prefetch_batches - 1 is the limit. */
    cr_assert_eq(sf_loader_set_epoch(l, 3), SF_OK);
    struct sf_batch h[2];
    cr_assert_eq(sf_loader_next(l, &h[0]), SF_OK);
    cr_assert_eq(sf_loader_next(l, &h[1]), SF_OK);
    cr_assert_eq(sf_loader_next(l, &b), SF_ERR_LIMIT);
    sf_loader_release(l, &h[0]);
    cr_assert_eq(sf_loader_next(l, &b), SF_OK);
    sf_loader_close(l); /* with batches still held */
}

Test(loader, set_epoch_to_the_fresh_current_epoch_keeps_the_read_ahead)
{
    struct sf_loader_options o;
    local_options(&o, 200, 32 << 10);
    struct sf_loader *l = open_loader(&o);
    struct sf_loader_stats s;
    do { /* until the read-ahead has a batch ready */
        sf_loader_get_stats(l, &s);
        sched_yield();
    } while (s.ready_batches == 0 && s.samples_decoded < 200);
    cr_assert_eq(sf_loader_set_epoch(l, 0), SF_OK);
    struct epoch_log e;
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(e.images, 200u);
    sf_loader_get_stats(l, &s);
    cr_assert_eq(s.samples_decoded, 200u, "the epoch was restarted: %llu samples decoded",
                 (unsigned long long)s.samples_decoded);
    free(e.seen);
    /* Once a batch was delivered, set_epoch of the same epoch restarts it. */
    cr_assert_eq(sf_loader_set_epoch(l, 1), SF_OK);
    struct sf_batch b;
    cr_assert_eq(sf_loader_next(l, &b), SF_OK);
    sf_loader_release(l, &b);
    cr_assert_eq(sf_loader_set_epoch(l, 1), SF_OK);
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(e.images, 200u, "a restarted epoch delivers all of it");
    free(e.seen);
    sf_loader_close(l);
}

/* Waits until the loader has decoded `n` samples in all (read-ahead work). */
static void wait_decoded(struct sf_loader *l, uint64_t n)
{
    struct sf_loader_stats s;
    for (int i = 0; i < 20000; i++) {
        sf_loader_get_stats(l, &s);
        if (s.samples_decoded >= n)
            return;
        usleep(500);
    }
    cr_assert_fail("%llu of %llu samples decoded after 10 s", (unsigned long long)s.samples_decoded,
                   (unsigned long long)n);
}

Test(loader, the_next_epoch_is_read_ahead_from_the_second_epoch_on)
{
    struct sf_loader_options o;
    local_options(&o, 160, 32 << 10);
    o.sampler.shuffle_buffer = 64;
    o.sampler.seed = 7;
    struct epoch_log want[4];
    { /* the reference: each epoch started afresh by its own loader */
        for (unsigned e = 0; e < 4; e++) {
            struct sf_loader_options oe = o;
            oe.sampler.epoch = e;
            struct sf_loader *r = open_loader(&oe);
            cr_assert_eq(run_epoch(r, &want[e], 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(r));
            sf_loader_close(r);
        }
    }
    struct sf_loader *l = open_loader(&o);
    struct epoch_log got;
    struct sf_loader_stats s;
    /* Epoch 0 of a loader never moved: nothing of epoch 1 is read ahead (a
     * single-epoch run fetches no shard it does not read). */
    cr_assert_eq(run_epoch(l, &got, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(got.digest, want[0].digest);
    free(got.seen);
    usleep(100 * 1000);
    sf_loader_get_stats(l, &s);
    cr_assert_eq(s.samples_decoded, 160u, "epoch 1 read ahead before any set_epoch");
    /* From epoch 1 on, the reader reads the next epoch while this one ends:
     * its first batches are decoded before set_epoch asks for it, and they
     * are the same samples, pixels and labels as a fresh start of it. */
    cr_assert_eq(sf_loader_set_epoch(l, 1), SF_OK);
    cr_assert_eq(run_epoch(l, &got, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(got.digest, want[1].digest);
    free(got.seen);
    wait_decoded(l, 2 * 160 + 16);
    cr_assert_eq(sf_loader_next(l, &(struct sf_batch){0}), SF_END_OF_EPOCH,
                 "epoch 1 stays ended while epoch 2 is read ahead");
    cr_assert_eq(sf_loader_set_epoch(l, 2), SF_OK);
    cr_assert_eq(run_epoch(l, &got, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(got.digest, want[2].digest, "the adopted read-ahead is epoch 2 as it should be");
    cr_assert_eq(got.images, 160u);
    free(got.seen);
    sf_loader_get_stats(l, &s);
    cr_assert_eq(s.epoch, 2u);
    /* Epoch 3 is read ahead now; going to another epoch throws it away. */
    wait_decoded(l, 3 * 160 + 16);
    cr_assert_eq(sf_loader_set_epoch(l, 0), SF_OK);
    cr_assert_eq(run_epoch(l, &got, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(got.digest, want[0].digest, "a different epoch restarts cleanly");
    free(got.seen);
    /* And a set_epoch half-way through an epoch does not adopt a read-ahead. */
    cr_assert_eq(sf_loader_set_epoch(l, 3), SF_OK);
    cr_assert_eq(run_epoch(l, &got, 2), SF_OK);
    free(got.seen);
    cr_assert_eq(sf_loader_set_epoch(l, 3), SF_OK);
    cr_assert_eq(run_epoch(l, &got, 0), SF_END_OF_EPOCH, "%s", sf_loader_errmsg(l));
    cr_assert_eq(got.digest, want[3].digest);
    free(got.seen);
    for (unsigned e = 0; e < 4; e++)
        free(want[e].seen);
    sf_loader_close(l);
}

Test(loader, state_saved_at_the_end_of_an_epoch_restores_to_its_end)
{
    local_dataset(40, 64 << 10, 37); /* the last sample is corrupt: 40 = 2 x 16 + 8 */
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    o.on_error = SF_ON_ERROR_SKIP;
    struct epoch_log e;
    struct sf_loader *l = open_and_run_epoch(&o, &e);
    cr_assert_eq(e.images, 39u);
    free(e.seen);
    unsigned char state[SF_LOADER_STATE_BYTES];
    cr_assert_eq(sf_loader_state_save(l, state, sizeof(state)), SF_OK, "%s", sf_loader_errmsg(l));
    l = reopen_from_state(l, &o, state);
    struct sf_batch b;
    cr_assert_eq(sf_loader_next(l, &b), SF_END_OF_EPOCH, "the restored epoch should be over");
    sf_loader_close(l);
}

/* ------------------------------------------------------------ starvation report */

Test(loader, wait_percentiles_come_from_a_bounded_log_histogram)
{
    struct sf__wait_log w;
    memset(&w, 0, sizeof(w));
    cr_expect_eq(sf__wait_log_percentile_s(&w, 0.5), 0.0);
    for (int i = 0; i < 98; i++)
        sf__wait_log_add(&w, 1e-3);
    sf__wait_log_add(&w, 0.0);
    sf__wait_log_add(&w, 0.1);
    cr_expect_eq(w.count, 100u);
    cr_expect_eq(w.max_s, 0.1);
    cr_expect_eq(w.first_s, 1e-3);
    /* Buckets are a quarter octave wide: the top of 1 ms's is within 19 %. */
    double p50 = sf__wait_log_percentile_s(&w, 0.50), p99 = sf__wait_log_percentile_s(&w, 0.99);
    cr_expect(p50 >= 1e-3 && p50 <= 1.19e-3, "p50 %g", p50);
    cr_expect(p99 >= 1e-3 && p99 <= 1.19e-3, "p99 %g", p99);
    cr_expect_eq(sf__wait_log_percentile_s(&w, 1.0), 0.1, "the largest wait is exact");
    cr_expect(sf__wait_log_percentile_s(&w, 0.01) <= 1e-6, "a batch that did not wait");
    /* Waits far beyond the histogram's range land in its last bucket. */
    sf__wait_log_add(&w, 1e7);
    cr_expect_eq(w.hist[SF__WAIT_BUCKETS - 1], 1u);
    cr_expect_eq(sf__wait_log_percentile_s(&w, 1.0), 1e7);
}

static void report_of_epoch(struct sf_loader *l, unsigned step_ms, struct sf_loader_report *r)
{
    for (;;) {
        struct sf_batch b;
        sf_status st = sf_loader_next(l, &b);
        if (st == SF_END_OF_EPOCH)
            break;
        cr_assert_eq(st, SF_OK, "%s", sf_loader_errmsg(l));
        if (step_ms)
            usleep(step_ms * 1000u);
        sf_loader_release(l, &b);
    }
    sf_loader_report(l, r);
}

/* Decode is the bound by construction, whatever else runs on the machine:
 * one thread decoding 224x224 crops of 640x480 JPEGs (milliseconds each),
 * a ring deep enough that it never waits for the reader (microseconds a
 * sample), a step that takes no time. The verdict must not depend on how
 * busy the machine is (CI runs other tests beside this one). */
Test(loader, report_names_decode_when_one_thread_cannot_keep_up)
{
    local_dataset_large(96);
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    o.decode_threads = 1;
    o.prefetch_batches = 8;
    o.prefetch_shards = 4;
    o.image.width = o.image.height = 224;
    o.extra_fields = NULL;
    struct sf_loader *l = open_loader(&o);
    struct sf_loader_report r;
    report_of_epoch(l, 0, &r);
    cr_expect_eq(r.batches, 6u);
    cr_expect_eq(r.samples, 96u);
    cr_expect(r.starving, "wait share %.3f", r.wait_share);
    cr_expect_eq(r.bound, SF_STAGE_DECODE, "bound %s (decode busy %.2f): %s",
                 sf_stage_name(r.bound), r.decode_busy, r.verdict);
    cr_expect(strstr(r.verdict, "decode-bound: 1 thread at") != NULL, "%s", r.verdict);
    cr_expect(r.wait_p50_ms <= r.wait_p99_ms && r.wait_p99_ms <= r.wait_max_ms, "%g %g %g",
              r.wait_p50_ms, r.wait_p99_ms, r.wait_max_ms);
    cr_expect(r.decode_per_thread_per_s > 0);
    cr_expect(r.wait_s <= r.span_s && r.wait_share > 0 && r.wait_share <= 1);

    /* A new window: nothing delivered in it yet. */
    sf_loader_report_reset(l);
    sf_loader_report(l, &r);
    cr_expect_eq(r.batches, 0u);
    cr_expect_eq(r.bound, SF_STAGE_NONE);
    cr_expect_str_eq(r.verdict, "no batch delivered yet");
    sf_loader_close(l);
}

Test(loader, report_is_quiet_when_the_step_is_the_slower_part)
{
    struct sf_loader_options o;
    local_options(&o, 160, 64 << 10);
    o.extra_fields = NULL;
    struct sf_loader *l = open_loader(&o);
    /* The ring fills while the "model is built"; the window starts at the
     * first next(). 10 batches of 16 tiny images, 80 ms of step each. */
    usleep(300 * 1000);
    struct sf_loader_report r;
    report_of_epoch(l, 80, &r);
    cr_expect_eq(r.batches, 10u);
    cr_expect(!r.starving, "wait share %.3f: %s", r.wait_share, r.verdict);
    cr_expect_eq(r.bound, SF_STAGE_NONE, "%s", r.verdict);
    cr_expect(strstr(r.verdict, "not starving") != NULL, "%s", r.verdict);
    sf_loader_close(l);
    sf_loader_report(NULL, &r);
    cr_expect_eq(r.batches, 0u);
    cr_expect_str_eq(sf_stage_name((enum sf_stage)99), "unknown");
}

Test(loader, a_folder_named_without_its_slash_reads_only_its_shards)
{
    local_dataset(60, 16 << 10, -1);
    char folder[700];
    snprintf(folder, sizeof(folder), "%.*s", (int)strlen(shards) - 1, shards);
    const char *src[] = {folder};
    struct sf_loader_options o;
    base_options(&o, src, 1);
    struct sf_loader *l = open_loader(&o);
    cr_expect_eq(sf_loader_epoch_size_known(l), 1, "counts from the index.json beside them");
    for (size_t i = 0; i < sf_loader_shard_count(l); i++)
        cr_expect(strstr(sf_loader_shard_url(l, i), "index.json") == NULL, "%s",
                  sf_loader_shard_url(l, i));
    struct epoch_log e;
    cr_assert_eq(run_epoch(l, &e, 0), SF_END_OF_EPOCH);
    cr_expect_eq(e.images, 60u);
    for (unsigned i = 0; i < 60; i++)
        cr_expect_eq(e.seen[i], 1, "sample %u seen %u times", i, e.seen[i]);
    free(e.seen);
    sf_loader_close(l);
}

/* Rewrites the first shard's "samples" in shards' index.json (its bytes stay
 * right) to literal, or when literal is NULL to its value plus delta; returns
 * that shard's name in shard. */
static void index_json_rewrite_count(const char *literal, long delta, char shard[128])
{
    char path[800];
    snprintf(path, sizeof(path), "%sindex.json", shards);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, "\"samples\":");
    cr_assert_not_null(at, "no samples in %s", text);
    char *name = NULL;
    for (char *p = at; p > text && !name; p--)
        if (!strncmp(p, "\"name\":", 7))
            name = p;
    cr_assert_not_null(name);
    cr_assert_eq(sscanf(name, "\"name\": \"%127[^\"]\"", shard), 1);
    at += strlen("\"samples\":");
    while (*at == ' ' || *at == '\t')
        at++;
    size_t digits = strspn(at, "0123456789");
    cr_assert_gt(digits, 0u);
    char value[32];
    if (literal) {
        snprintf(value, sizeof(value), "%s", literal);
    } else {
        long count = strtol(at, NULL, 10);
        cr_assert_gt(count + delta, 0);
        snprintf(value, sizeof(value), "%ld", count + delta);
    }
    static char out[sizeof(text) + 32];
    snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - text), text, value, at + digits);
    f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fputs(out, f) >= 0, 1);
    fclose(f);
}

/* An index.json whose count for one of the shards is not a whole number in
 * range fails the open naming it (issue 17: 1e300 converted out of range). */
Test(loader, an_index_json_count_out_of_range_fails_the_open_naming_it)
{
    local_dataset(60, 16 << 10, -1);
    char shard[128];
    index_json_rewrite_count("1e300", 0, shard);

    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    struct sf_loader *l = NULL;
    char err[1024] = "";
    cr_expect_eq(sf_loader_open(&o, &l, err, sizeof(err)), SF_ERR_CORRUPT, "%s", err);
    cr_expect_null(l);
    cr_expect(strstr(err, "index.json") && strstr(err, shard) && strstr(err, "\"samples\""),
              "the message does not name the index, %s and the field: %s", shard, err);
    sf_loader_close(l);
}

/* An index.json whose count disagrees with its shard (the sizes agree: a
 * hand-made or stale index) fails the epoch naming the shard, whichever way
 * it errs: a shard holding more samples than listed lost the extra ones
 * without a word, while one holding fewer was an error. */
Test(loader, an_index_json_count_that_disagrees_with_its_shard_fails_naming_it)
{
    for (int more = 0; more < 2; more++) {
        local_dataset(60, 16 << 10, -1);
        char shard[128];
        index_json_rewrite_count(NULL, more ? -1 : 1, shard);
        struct sf_loader_options o;
        base_options(&o, shards_src, 1);
        struct sf_loader *l = open_loader(&o);
        struct epoch_log e;
        sf_status st = run_epoch(l, &e, 0);
        cr_expect_eq(st, SF_ERR_CORRUPT, "%s: %s (%u images)", more ? "more" : "fewer",
                     sf_status_name(st), e.images);
        const char *m = sf_loader_errmsg(l);
        cr_expect(strstr(m, shard) && strstr(m, "index.json") && strstr(m, "offset"),
                  "the message does not name %s, the index and an offset: %s", shard, m);
        free(e.seen);
        sf_loader_close(l);
        loader_teardown();
    }
}

/* Reading a header maps the page cache around it (64 KiB, or whole large
 * folios since Linux 6.18), mostly the images that follow, and the shuffle
 * buffer keeps every shard here open: unless the parse gives those pages
 * back and each decode gives back what its faults mapped, the shards' pages
 * pile up while their samples wait (96 samples of 62 KB: 4.2 MiB before the
 * fix). At any moment only the decodes in flight (each within its own shard)
 * and the parse of one shard may hold pages. */
Test(loader, mapped_shards_hold_no_pages_for_samples_that_wait)
{
    local_dataset_sized(96, 512 << 10, -1, 800);
    long img_min = LONG_MAX;
    for (unsigned i = 0; i < n_samples; i++) {
        char img[800];
        struct stat sb;
        snprintf(img, sizeof(img), "%s/src/s%05u.jpg", tmp, i);
        cr_assert_eq(stat(img, &sb), 0, "%s", img);
        img_min = sb.st_size < img_min ? sb.st_size : img_min;
    }
    cr_assert_geq(img_min, SF__DROP_MIN_BYTES, "every image gives its pages back once decoded");
    struct sf_loader_options o;
    base_options(&o, shards_src, 1);
    o.batch_size = 2;
    o.prefetch_batches = 2;
    o.prefetch_shards = 16; /* every shard parsed early; the buffer keeps them open */
    o.image.crop = SF_CROP_CENTER;
    struct sf_loader *l = open_loader(&o);
    long bound = ((long)o.decode_threads + 1) * 512; /* KiB: shards of at most 512 KiB */
    long peak = 0;
    unsigned images = 0, batches = 0;
    int labels_ok = 1;
    for (;;) {
        struct epoch_log e;
        sf_status st = run_epoch(l, &e, 1);
        free(e.seen);
        long kib = test_mapped_rss_kib(NULL, shards);
        peak = kib > peak ? kib : peak;
        if (st == SF_END_OF_EPOCH)
            break;
        cr_assert_eq(st, SF_OK);
        images += e.images;
        labels_ok &= e.labels_ok;
        batches++;
    }
    cr_expect_eq(images, 96u);
    cr_expect(labels_ok, "every image read back has its class");
    cr_log_info("mapped shard pages peaked at %ld KiB (bound %ld)", peak, bound);
    cr_expect_leq(peak, bound, "mapped shard pages peaked at %ld KiB over %u batches (bound %ld)",
                  peak, batches, bound);
    sf_loader_close(l);
}

/* Local shards are file mappings whose decoded images' pages the workers
 * drop (src/loader_workers.c drop_pages); a pad decodes such an image again
 * and must read it back whole (run_epoch checks every image's class against
 * its label, pads included). */
Test(loader, pads_of_mapped_shards_read_images_back_after_their_pages_were_dropped)
{
    local_dataset_sized(40, 256 << 10, -1, 640); /* local_dataset_large's images, 7 shards */
    char img[800];
    snprintf(img, sizeof(img), "%s/src/s00000.jpg", tmp);
    struct stat sb;
    cr_assert_eq(stat(img, &sb), 0, "%s", img);
    cr_assert_gt(sb.st_size, SF__DROP_MIN_BYTES, "images large enough to drop pages of (%lld bytes)",
                 (long long)sb.st_size);
    unsigned pads = 0, images = 0;
    for (int r = 0; r < 3; r++) {
        struct sf_loader_options o;
        rank_options(&o, shards_src, 1, r, 3);
        o.image.crop = SF_CROP_CENTER;
        struct epoch_log e;
        struct sf_loader *l = open_and_run_epoch(&o, &e);
        cr_expect(e.labels_ok, "rank %d: every image (pads too) has its class", r);
        pads += e.pads;
        images += e.images - e.pads;
        free(e.seen);
        sf_loader_close(l);
    }
    cr_expect_eq(images, 40u);
    cr_expect_gt(pads, 0u, "40 samples over 3 ranks: some are padded");
}
