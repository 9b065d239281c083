/* sf_pack() and the pack / inspect commands: folders packed into tar and
 * record shards are read back with the shard readers (and GNU tar) and must
 * give every file byte for byte, with the right keys, fields and labels, and
 * an index.json that matches the shards. S3 destinations use the mock
 * server; the CLI is run as the built program.
 *
 * One suite, `pack`, in one executable: this file (round trips, GNU tar,
 * determinism, names, progress, errors), test_pack_s3.c (uploads, multipart)
 * and test_pack_cli.c (pack and inspect commands, --max-side), over
 * pack_fixture.c. */
#include "pack_fixture.h"

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

TestSuite(pack, .init = pack_setup, .fini = pack_teardown, .timeout = 120);

/* ============================================================ round trips */

/* The ImageFolder tree packed to tar shards of 32 KiB into dest (o: the
 * options it took). */
static void pack_imagefolder(struct sf_pack_options *o, char dest[800], struct sf_pack_result *res)
{
    make_imagefolder();
    sf_pack_options_init_default(o);
    o->shard_bytes = 32 * 1024;
    pack_out(o, dest, res);
}

Test(pack, imagefolder_to_tar_round_trip)
{
    struct sf_pack_options o;
    char dest[800];
    struct sf_pack_result res;
    pack_imagefolder(&o, dest, &res);
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
    cJSON *idx = test_load_json(path);
    const cJSON *cc = cJSON_GetObjectItemCaseSensitive(idx, "class_counts");
    cr_assert(cJSON_IsArray(cc));
    for (int i = 0; i < 3; i++)
        cr_expect_eq(cJSON_GetArrayItem(cc, i)->valuedouble, 12);
    cJSON_Delete(idx);
}

Test(pack, hidden_names_at_the_top_of_an_imagefolder_are_counted_as_ignored)
{
    make_imagefolder(); /* cat/.DS_Store */
    add_hidden(".DS_Store");
    add_hidden(".git/HEAD"); /* a hidden folder counts once, as below the top */
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    char dest[800];
    struct sf_pack_result res;
    pack_out(&o, dest, &res);
    cr_expect_eq(res.layout, SF_PACK_LAYOUT_IMAGEFOLDER);
    cr_expect_eq(res.classes, 3, "hidden folders are no classes");
    cr_expect_eq(res.ignored, 3, "cat/.DS_Store, .DS_Store and .git: got %llu", res.ignored);
    cr_expect_eq(res.files, n_files);
}

Test(pack, imagefolder_to_record_round_trip)
{
    make_imagefolder();
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.format = SF_PACK_FORMAT_RECORD;
    o.shard_bytes = 32 * 1024;
    char dest[800];
    struct sf_pack_result res;
    pack_out(&o, dest, &res);
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
    char dest[800];
    struct sf_pack_result res;
    pack_out(&o, dest, &res);
    unsigned long long dec = 0;
    size_t shards = check_pack(dest, "record", 0, o.shard_bytes, &dec);
    cr_expect_gt(shards, 2);
    cr_expect_gt(dec, 0, "the text records were stored compressed");
    cr_expect_lt(res.shard_bytes, res.source_bytes, "compression shrank the data");
    char path[900];
    path_in(path, sizeof(path), dest, "index.json");
    cJSON *idx = test_load_json(path);
    cr_expect_str_eq(test_jstr(idx, "compression"), "zstd");
    cr_expect_eq(test_jnum(idx, "zstd_level"), 3);
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
        cJSON *idx = test_load_json(path);
        const cJSON *fields = cJSON_GetObjectItemCaseSensitive(idx, "fields");
        cr_expect_eq(test_jnum(fields, "jpg"), 21);
        cr_expect_eq(test_jnum(fields, "txt"), 20);
        cr_expect_eq(test_jnum(fields, "seg.png"), 7);
        cr_expect_eq(test_jnum(fields, "json"), 1, "upper-case extensions are lower-cased");
        cJSON_Delete(idx);
    }
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
        cr_assert_eq(test_sh("tar -tvf '%s/%s' > '%s/list.txt' 2>&1", dest, names[i], tmp), 0,
                     "GNU tar refuses %s", names[i]);
        cr_assert_eq(test_sh("tar -xf '%s/%s' -C '%s' 2>'%s/tar-err.txt'", dest, names[i], ex, tmp),
                     0, "GNU tar cannot extract %s", names[i]);
        char errpath[900];
        path_in(errpath, sizeof(errpath), tmp, "tar-err.txt");
        size_t elen;
        free(test_load(errpath, &elen));
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
    unsigned char *b = test_load(cls, &len);
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
    cr_assert_eq(test_sh("tar -xf '%s/shard-000000.tar' -C '%s'", dest, ex), 0);
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
        cr_assert_eq(test_sh("find '%s' -type f -exec touch -d '2001-02-03 04:05:06' {} +", src),
                     0);
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
    char dest[800];
    pack_out(&o, dest, NULL);
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
    char err[1024];
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
    char dest[800];
    struct sf_pack_result res;
    pack_out(&o, dest, &res);
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
    char err[1024] = "";
    sf_status st = do_pack(dest, &o, &res, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CANCELLED, "%s", sf_status_name(st));
    cr_expect_gt(c2.last.shards_done, 0, "some shards were done before the cancel");
    static char names[256][256];
    cr_expect_eq(list_shards(dest, names, 256), 0, "shards removed");
    char path[900];
    path_in(path, sizeof(path), dest, "index.json");
    cr_expect_neq(access(path, F_OK), 0, "no index.json");
}

/* A callback that cancels on its n-th call (counting from 1). */
struct cancel_at_call {
    int calls, at;
};

static int cancel_on_call(void *user, const struct sf_pack_progress *p)
{
    (void)p;
    struct cancel_at_call *c = user;
    return ++c->calls == c->at;
}

Test(pack, a_cancel_on_the_last_progress_call_leaves_no_index_json)
{
    make_imagefolder();
    struct cancel_at_call count = {0, 0};
    struct sf_pack_options o;
    sf_pack_options_init_default(&o);
    o.shard_bytes = 32 * 1024;
    o.progress = cancel_on_call;
    o.progress_user = &count;
    char dest[800], err[1024] = "";
    dest_path(dest, sizeof(dest), "counted");
    cr_assert_eq(do_pack(dest, &o, NULL, err, sizeof(err)), SF_OK, "%s", err);
    cr_assert_gt(count.calls, 1);

    /* the same pack, cancelled by the call "when everything is written" */
    struct cancel_at_call last = {0, count.calls};
    o.progress_user = &last;
    dest_path(dest, sizeof(dest), "cancelled");
    sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_CANCELLED, "%s", sf_status_name(st));
    cr_expect_eq(last.calls, count.calls);
    static char names[256][256];
    cr_expect_eq(list_shards(dest, names, 256), 0, "shards removed");
    char path[900];
    path_in(path, sizeof(path), dest, "index.json");
    cr_expect_neq(access(path, F_OK), 0, "no index.json naming the removed shards");
}

Test(pack, a_failed_pack_over_an_old_one_leaves_no_index_naming_removed_shards)
{
    struct sf_pack_options o;
    char dest[800];
    struct sf_pack_result res;
    pack_imagefolder(&o, dest, &res);
    cr_assert_gt(res.shards, 2);

    /* the same pack again into the same folder, cancelled after some shards
     * replaced the old ones of the same names (and were removed again) */
    struct progress_calls c = {0, {0, 0, 0, 0, 0}, 20, 1};
    o.progress = on_progress;
    o.progress_user = &c;
    char err[1024] = "";
    sf_status st = do_pack(dest, &o, NULL, err, sizeof(err));
    cr_assert_eq(st, SF_ERR_CANCELLED, "%s", sf_status_name(st));
    cr_assert_gt(c.last.shards_done, 0, "some shards were replaced before the cancel");
    char path[900];
    path_in(path, sizeof(path), dest, "index.json");
    if (access(path, F_OK) != 0)
        return; /* no index: a reader lists the folder */
    cJSON *idx = test_load_json(path);
    const cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItemCaseSensitive(idx, "shards"))
    {
        const char *name = cJSON_GetObjectItemCaseSensitive(sh, "name")->valuestring;
        char shard[900];
        path_in(shard, sizeof(shard), dest, name);
        cr_expect_eq(access(shard, F_OK), 0, "index.json names %s, which is gone", name);
    }
    cJSON_Delete(idx);
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
    cr_assert_eq(test_sh("mkdir -p '%s/c1' && mv '%s/s1.jpg' '%s/c1/' && : > '%s/c1/s1.cls'", src,
                         src, src, src),
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

Test(pack, a_refused_destination_inside_the_source_leaves_no_folder_there)
{
    make_imagefolder();
    char inside[900], err[1024] = "";
    path_in(inside, sizeof(inside), src, "shards/train");
    sf_status st = do_pack(inside, NULL, NULL, err, sizeof(err));
    cr_expect_eq(st, SF_ERR_INVALID_ARGUMENT, "%s", sf_status_name(st));
    cr_expect(strstr(err, "inside"), "message: %s", err);
    char made[900];
    path_in(made, sizeof(made), src, "shards");
    cr_expect_neq(access(made, F_OK), 0, "%s was created and left in the source", made);
    /* else the next pack of the tree finds a fourth, empty class */
    char dest[800];
    struct sf_pack_result res;
    pack_out(NULL, dest, &res);
    cr_expect_eq(res.classes, 3, "got %llu classes", res.classes);
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
