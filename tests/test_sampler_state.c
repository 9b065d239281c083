/* The sampler's state (save, restore, refusals) and the distributed
 * environment (RANK, WORLD_SIZE). Suite `sampler` (test_sampler.c). */
#include "sampler_fixture.h"

#include <criterion/criterion.h>

#include "shardfeed_sampling.h"
#include "src/sampler.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ state */

static void check_resume(const struct sf_sampler_options *o, const uint64_t *counts, size_t n)
{
    struct run full = run_of(o, counts, n);
    for (size_t k = 0; k <= full.n; k += 1 + full.n / 37) {
        struct sf_sampler *a = make(o, counts, n);
        struct sf_sample_ref it;
        for (size_t i = 0; i < k; i++)
            cr_assert(sf_sampler_next(a, &it));
        unsigned char state[SF_SAMPLER_STATE_BYTES];
        cr_assert_eq(sf_sampler_state_save(a, state, sizeof state), SF_OK);
        sf_sampler_destroy(a);

        /* A new sampler, started in another epoch and moved a little. */
        struct sf_sampler_options other = *o;
        other.epoch = o->epoch + 17;
        struct sf_sampler *b = make(&other, counts, n);
        sf_sampler_next(b, &it);
        sf_status st = sf_sampler_state_restore(b, state, sizeof state);
        cr_assert_eq(st, SF_OK, "restore at %zu: %s", k, sf_sampler_errmsg(b));
        struct sf_sampler_info info;
        sf_sampler_get_info(b, &info);
        cr_expect_eq(info.epoch, o->epoch);
        cr_expect_eq(info.position, k);
        struct run rest = drain(b);
        cr_assert_eq(k + rest.n, full.n, "cut %zu: %zu + %zu items, want %zu", k, k, rest.n,
                     full.n);
        for (size_t i = 0; i < rest.n; i++)
            cr_assert(same_item(&rest.items[i], &full.items[k + i]), "cut %zu: item %zu differs", k,
                      k + i);
        free(rest.items);
        sf_sampler_destroy(b);
    }
    free(full.items);
}

Test(sampler, resume_yields_exactly_the_rest_at_many_cut_points)
{
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    struct sf_sampler_options o =
        opts((struct cfg){.rank = 1, .world = 3, .seed = 404, .epoch = 6, .buffer = 25});
    check_resume(&o, counts, N_UNEVEN); /* pad */
    o.policy = SF_EPOCH_DROP;
    o.rank = 0;
    check_resume(&o, counts, N_UNEVEN);
    o.policy = SF_EPOCH_PAD;
    o.initial_fill = 3;
    o.worker = 1;
    o.num_workers = 2;
    check_resume(&o, counts, N_UNEVEN);
    static const uint64_t few[] = {20, 3};
    o = opts((struct cfg){.rank = 4, .world = 5, .partition = SF_PARTITION_SAMPLES, .buffer = 4});
    check_resume(&o, few, 2);
}

Test(sampler, resume_every_single_cut_point_small)
{
    static const uint64_t counts[] = {4, 7, 1, 5};
    struct sf_sampler_options o = opts((struct cfg){.world = 2, .seed = 9, .buffer = 6, .fill = 2});
    struct run full = run_of(&o, counts, 4);
    for (size_t k = 0; k <= full.n; k++) {
        struct sf_sampler *a = make(&o, counts, 4);
        unsigned char state[SF_SAMPLER_STATE_BYTES];
        /* save_at: a loader that ran ahead saves its user's position. */
        free(drain(a).items);
        cr_assert_eq(sf_sampler_state_save_at(a, k, state, sizeof state), SF_OK);
        cr_assert_eq(sf_sampler_state_restore(a, state, sizeof state), SF_OK, "%s",
                     sf_sampler_errmsg(a));
        struct run rest = drain(a);
        cr_assert_eq(k + rest.n, full.n);
        for (size_t i = 0; i < rest.n; i++)
            cr_assert(same_item(&rest.items[i], &full.items[k + i]));
        free(rest.items);
        sf_sampler_destroy(a);
    }
    struct sf_sampler *a = make(&o, counts, 4);
    unsigned char state[SF_SAMPLER_STATE_BYTES];
    cr_expect_eq(sf_sampler_state_save_at(a, full.n + 1, state, sizeof state),
                 SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_sampler_state_save(a, state, sizeof state - 1), SF_ERR_INVALID_ARGUMENT);
    sf_sampler_destroy(a);
    free(full.items);
}

Test(sampler, state_layout_is_the_documented_little_endian_one)
{
    static const uint64_t counts[] = {4, 7, 1, 5};
    struct sf_sampler_options o = opts((struct cfg){
        .rank = 1, .world = 2, .seed = 0x0102030405060708ULL, .epoch = 3, .buffer = 6});
    struct sf_sampler *s = make(&o, counts, 4);
    struct sf_sample_ref it;
    cr_assert(sf_sampler_next(s, &it));
    cr_assert(sf_sampler_next(s, &it));
    unsigned char b[SF_SAMPLER_STATE_BYTES];
    cr_assert_eq(sf_sampler_state_save(s, b, sizeof b), SF_OK);
    cr_expect_eq(memcmp(b, "SFSAMPLR", 8), 0);
    cr_expect(b[8] == 1 && b[9] == 0 && b[12] == 128 && b[13] == 0);
    cr_expect(b[16] == 0x08 && b[23] == 0x01, "seed little-endian");
    cr_expect(b[24] == 3 && b[32] == 2, "epoch 3, position 2");
    cr_expect(b[56] == 4 && b[64] == 1 && b[68] == 2 && b[76] == 1 && b[80] == 6 && b[88] == 6);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--)
        h = (h << 8) | b[48 + i];
    cr_expect_eq(h, sf__counts_hash(counts, 4));
    sf_sampler_destroy(s);
}

/* Saves a state of configuration o (after 3 items) and restores it into a
 * sampler of configuration p: expects a refusal naming `field`. */
static void expect_refused(const struct sf_sampler_options *o, const uint64_t *c1,
                           const struct sf_sampler_options *p, const uint64_t *c2, size_t n2,
                           const char *field)
{
    struct sf_sampler *a = make(o, c1, 4);
    struct sf_sample_ref it;
    for (int i = 0; i < 3; i++)
        cr_assert(sf_sampler_next(a, &it));
    unsigned char state[SF_SAMPLER_STATE_BYTES];
    cr_assert_eq(sf_sampler_state_save(a, state, sizeof state), SF_OK);
    sf_sampler_destroy(a);

    struct sf_sampler *b = make(p, c2, n2);
    struct sf_sample_ref first;
    cr_assert(sf_sampler_next(b, &first));
    cr_expect_eq(sf_sampler_state_restore(b, state, sizeof state), SF_ERR_INVALID_ARGUMENT,
                 "restore across a different %s", field);
    const char *msg = sf_sampler_errmsg(b);
    cr_expect(strstr(msg, "different configuration") && strstr(msg, field), "message: %s", msg);
    /* Unchanged: it carries on from where it was. */
    struct sf_sampler_info info;
    sf_sampler_get_info(b, &info);
    cr_expect_eq(info.position, 1);
    cr_expect_eq(info.epoch, p->epoch);
    sf_sampler_destroy(b);
}

Test(sampler, restore_refuses_another_configuration)
{
    static const uint64_t c[] = {4, 7, 3, 5};
    static const uint64_t c_other[] = {4, 7, 3, 6};
    static const uint64_t c_more[] = {4, 7, 3, 5, 1};
    struct sf_sampler_options o = opts((struct cfg){.world = 2, .seed = 1, .buffer = 5});
    expect_refused(&o, c, &o, c_other, 4, "counts hash");
    expect_refused(&o, c, &o, c_more, 5, "shard count");
    /* o with one field changed, refused naming it */
    static const char *const what[] = {"seed",           "world_size",   "rank",   "num_workers",
                                       "shuffle_buffer", "initial_fill", "policy", "partition"};
    struct sf_sampler_options p[8];
    for (size_t i = 0; i < 8; i++)
        p[i] = o;
    p[0].seed = 2;
    p[1].world_size = 3;
    p[2].rank = 1;
    p[3].num_workers = 2;
    p[4].shuffle_buffer = 6;
    p[5].initial_fill = 2;
    p[6].policy = SF_EPOCH_DROP;
    p[7].partition = SF_PARTITION_SAMPLES;
    for (size_t i = 0; i < 8; i++)
        expect_refused(&o, c, &p[i], c, 4, what[i]);
    struct sf_sampler_options w = opts((struct cfg){.workers = 2});
    struct sf_sampler_options w1 = w;
    w1.worker = 1;
    expect_refused(&w, c, &w1, c, 4, "worker");
}

Test(sampler, restore_refuses_damaged_or_foreign_blobs)
{
    static const uint64_t c[] = {4, 7, 3, 5};
    struct sf_sampler_options o = opts((struct cfg){0});
    struct sf_sampler *s = make(&o, c, 4);
    unsigned char good[SF_SAMPLER_STATE_BYTES], b[SF_SAMPLER_STATE_BYTES];
    struct sf_sample_ref it;
    cr_assert(sf_sampler_next(s, &it));
    cr_assert_eq(sf_sampler_state_save(s, good, sizeof good), SF_OK);

    cr_expect_eq(sf_sampler_state_restore(s, good, sizeof good - 1), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_sampler_state_restore(s, NULL, sizeof good), SF_ERR_INVALID_ARGUMENT);
    memcpy(b, good, sizeof b);
    b[0] ^= 1;
    cr_expect_eq(sf_sampler_state_restore(s, b, sizeof b), SF_ERR_CORRUPT);
    cr_expect(strstr(sf_sampler_errmsg(s), "magic"), "%s", sf_sampler_errmsg(s));
    memcpy(b, good, sizeof b);
    b[8] = 3;
    cr_expect_eq(sf_sampler_state_restore(s, b, sizeof b), SF_ERR_UNSUPPORTED);
    cr_expect(strstr(sf_sampler_errmsg(s), "version 3"), "%s", sf_sampler_errmsg(s));
    /* Every single-bit flip of the payload is caught by the checksum. */
    for (size_t i = 16; i < SF_SAMPLER_STATE_BYTES; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(b, good, sizeof b);
            b[i] ^= (unsigned char)(1u << bit);
            cr_assert_eq(sf_sampler_state_restore(s, b, sizeof b), SF_ERR_CORRUPT,
                         "flip of byte %zu bit %d accepted", i, bit);
        }
    }
    /* And the sampler is still where it was. */
    struct sf_sampler_info info;
    sf_sampler_get_info(s, &info);
    cr_expect_eq(info.position, 1);
    cr_expect_eq(sf_sampler_state_restore(s, good, sizeof good), SF_OK);
    sf_sampler_destroy(s);
}

Test(sampler, restore_at_end_of_epoch_delivers_nothing)
{
    static const uint64_t c[] = {4, 7, 3, 5};
    struct sf_sampler_options o = opts((struct cfg){0});
    struct sf_sampler *s = make(&o, c, 4);
    free(drain(s).items);
    unsigned char state[SF_SAMPLER_STATE_BYTES];
    cr_assert_eq(sf_sampler_state_save(s, state, sizeof state), SF_OK);
    sf_sampler_set_epoch(s, 0);
    cr_assert_eq(sf_sampler_state_restore(s, state, sizeof state), SF_OK);
    struct sf_sample_ref it;
    cr_expect_eq(sf_sampler_next(s, &it), 0);
    sf_sampler_destroy(s);
}

/* ------------------------------------------------------------------ environment */

/* Only RANK, WORLD_SIZE and LOCAL_RANK (NULL: unset) in the environment. */
static void set_dist_env(const char *rank, const char *world, const char *local_rank)
{
    clear_dist_env();
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", world, 1);
    if (local_rank)
        setenv("LOCAL_RANK", local_rank, 1);
}

Test(sampler, env_unset_gives_single_process_defaults)
{
    clear_dist_env();
    struct sf_dist d = {-1, -1, -1};
    cr_assert_eq(sf_dist_from_env(&d, NULL, 0), SF_OK);
    cr_expect(d.rank == 0 && d.world_size == 1 && d.local_rank == 0);
}

Test(sampler, env_values_are_read)
{
    set_dist_env("5", "16", "1");
    struct sf_dist d = {-1, -1, -1};
    cr_assert_eq(sf_dist_from_env(&d, NULL, 0), SF_OK);
    cr_expect(d.rank == 5 && d.world_size == 16 && d.local_rank == 1);
}

Test(sampler, options_win_over_env)
{
    set_dist_env("5", "16", "garbage"); /* not read: the option is set */
    struct sf_dist d = {2, 4, 0};
    cr_assert_eq(sf_dist_from_env(&d, NULL, 0), SF_OK);
    cr_expect(d.rank == 2 && d.world_size == 4 && d.local_rank == 0);
    /* Only the unset field comes from the environment. */
    struct sf_dist e = {3, -1, 0};
    cr_assert_eq(sf_dist_from_env(&e, NULL, 0), SF_OK);
    cr_expect(e.rank == 3 && e.world_size == 16);
}

Test(sampler, bad_env_values_name_the_variable)
{
    static const char *const bad[] = {"",   "-1",   "+1",  " 1",         "1 ",
                                      "1x", "0x10", "1e3", "2147483648", "99999999999999999999"};
    static const char *const vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
    for (size_t v = 0; v < 3; v++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            set_dist_env("0", "4", "0");
            setenv(vars[v], bad[i], 1);
            struct sf_dist d = {-1, -1, -1};
            char err[256] = "";
            cr_expect_eq(sf_dist_from_env(&d, err, sizeof err), SF_ERR_INVALID_ARGUMENT,
                         "%s=\"%s\" accepted", vars[v], bad[i]);
            cr_expect(strstr(err, vars[v]) != NULL, "%s=\"%s\": message \"%s\"", vars[v], bad[i],
                      err);
            cr_expect(d.rank == -1 && d.world_size == -1 && d.local_rank == -1,
                      "d changed on failure");
        }
    }
}

Test(sampler, env_rank_must_be_below_world_size)
{
    set_dist_env("4", "4", NULL);
    struct sf_dist d = {-1, -1, -1};
    char err[256] = "";
    cr_expect_eq(sf_dist_from_env(&d, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "RANK") && strstr(err, "WORLD_SIZE"), "%s", err);
    setenv("WORLD_SIZE", "0", 1);
    cr_expect_eq(sf_dist_from_env(&d, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "WORLD_SIZE") && strstr(err, "at least 1"), "%s", err);
    /* RANK without WORLD_SIZE: the default world of 1 has no rank 4. */
    unsetenv("WORLD_SIZE");
    cr_expect_eq(sf_dist_from_env(&d, err, sizeof err), SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "WORLD_SIZE unset"), "%s", err);
}

Test(sampler, sampler_takes_rank_and_world_from_env)
{
    set_dist_env("2", "3", "not read by the sampler");
    uint64_t counts[N_UNEVEN];
    uneven_counts(counts);
    struct sf_sampler_options o;
    sf_sampler_options_init_default(&o);
    struct sf_sampler *s = make(&o, counts, N_UNEVEN);
    struct sf_sampler_info info;
    sf_sampler_get_info(s, &info);
    cr_expect(info.rank == 2 && info.world_size == 3);
    struct run from_env = drain(s);
    sf_sampler_destroy(s);

    struct sf_sampler_options explicit_ = opts((struct cfg){.rank = 2, .world = 3});
    struct run from_opts = run_of(&explicit_, counts, N_UNEVEN);
    cr_assert_eq(from_env.n, from_opts.n);
    cr_expect_eq(hash_run(&from_env), hash_run(&from_opts));
    free(from_env.items);
    free(from_opts.items);

    setenv("WORLD_SIZE", "three", 1);
    char err[256] = "";
    cr_expect_eq(sf_sampler_new(&o, counts, N_UNEVEN, &s, err, sizeof err),
                 SF_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "WORLD_SIZE=\"three\""), "%s", err);
}

Test(sampler, null_arguments_are_harmless)
{
    sf_sampler_destroy(NULL);
    sf_sampler_set_epoch(NULL, 1);
    struct sf_sample_ref it;
    cr_expect_eq(sf_sampler_next(NULL, &it), 0);
    cr_expect_eq(sf_dist_from_env(NULL, NULL, 0), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_sampler_state_save(NULL, &it, sizeof it), SF_ERR_INVALID_ARGUMENT);
    cr_expect_eq(sf_sampler_state_restore(NULL, &it, sizeof it), SF_ERR_INVALID_ARGUMENT);
}
