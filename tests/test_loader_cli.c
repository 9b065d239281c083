/* The loader through the CLI: `load`, its JSON and exit codes, a killed
 * warm-cache, flags against the config file. Suite `loader` (test_loader.c);
 * doctor and tune are in test_loader_doctor.c. */
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

/* One sample, corrupt: the run fails before any batch, and the report says
 * no batch came (first_batch_s null; it was -1, read as a time). */
Test(loader, a_run_that_fails_before_any_batch_reports_none)
{
    local_dataset(1, 16 << 10, 0);
    char out[8192];
    const char *corrupt[] = {SF_CLI_BIN, "load", shards, "--device", "host", "--json", NULL};
    cr_assert_eq(run_cli(corrupt, out, sizeof(out)), 1, "%s", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "one JSON object: %s", out);
    cr_expect(cJSON_IsNull(cJSON_GetObjectItem(j, "first_batch_s")), "%s", out);
    cJSON_Delete(j);
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
