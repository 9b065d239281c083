/* The tar reader on archives GNU tar and Python's tarfile write, in every
 * format, fed at once and in increments. Suite `tar` (test_tar.c). */
#include "tar_fixture.h"

#include <criterion/criterion.h>

#include "shardfeed_shard.h"
#include "src/shard_reader.h"
#include "src/tar_reader.h"
#include "support/bytes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ real tools */

struct tfile {
    const char *path;
    size_t size;
    const char *content; /* NULL: random bytes */
    int long_base;       /* base name > 100 bytes: GNU and pax only */
    int long_path;       /* path > 100 bytes that ustar can split */
};

static char g_longdir_path[200];
static char g_longbase_path[200];
static char g_split_path[200];

static void init_names(void)
{
    /* 130-char directory, then a short name: GNU 'L' or pax path */
    memset(g_longdir_path, 'd', 130);
    strcpy(g_longdir_path + 130, "/s002.jpg");
    /* base name of 110 chars */
    memset(g_longbase_path, 'k', 110);
    strcpy(g_longbase_path + 110, ".Txt");
    /* 70 + 1 + 40 + 9 = 120 chars, splittable into prefix and name */
    memset(g_split_path, 'p', 70);
    g_split_path[70] = '/';
    memset(g_split_path + 71, 'q', 40);
    strcpy(g_split_path + 111, "/s003.npy");
}

static const struct tfile *tool_files(size_t *n)
{
    static struct tfile files[16];
    init_names();
    size_t i = 0;
    files[i++] = (struct tfile){"s000.jpg", 3000, NULL, 0, 0};
    files[i++] = (struct tfile){"s000.cls", 1, "3", 0, 0};
    files[i++] = (struct tfile){"s000.JSON", 13, "{\"a\": [1, 2]}", 0, 0};
    files[i++] = (struct tfile){"s001.seg.png", 700, NULL, 0, 0};
    files[i++] = (struct tfile){"s001.jpg", 513, NULL, 0, 0};
    files[i++] = (struct tfile){g_longdir_path, 1024, NULL, 0, 1};
    files[i++] = (struct tfile){g_longbase_path, 5, "hello", 1, 0};
    files[i++] = (struct tfile){g_split_path, 2049, NULL, 0, 1};
    files[i++] = (struct tfile){"s004.txt", 0, "", 0, 0};
    files[i++] = (struct tfile){"README", 4, "read", 0, 0};
    files[i++] = (struct tfile){"caf\xc3\xa9-\xc3\xbc.jpg", 77, NULL, 0, 0};
    files[i++] = (struct tfile){"s006.jpg", 10000, NULL, 0, 0};
    *n = i;
    return files;
}

static void file_bytes(const struct tfile *f, size_t i, unsigned char *out)
{
    if (f->content)
        memcpy(out, f->content, f->size);
    else
        fill_random(out, f->size, 1000 + i);
}

static void run(const char *cmd)
{
    int rc = system(cmd);
    cr_assert_eq(rc, 0, "command failed (%d): %s", rc, cmd);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    struct bytes b = {0};
    unsigned char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        bytes_put(&b, tmp, n);
    fclose(f);
    *len = b.len;
    return b.p ? b.p : calloc(1, 1);
}

/* Writes the files into a fresh directory; returns it. */
static char *make_tree(void)
{
    char tmpl[] = "/tmp/sf-test-tar-XXXXXX";
    char *dir = mkdtemp(tmpl);
    cr_assert_not_null(dir);
    dir = strdup(dir);
    size_t n;
    const struct tfile *files = tool_files(&n);
    char path[1024];
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i].path);
        char *slash = strrchr(path, '/');
        *slash = '\0';
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
        run(cmd);
        *slash = '/';
        unsigned char *data = malloc(files[i].size + 1);
        file_bytes(&files[i], i, data);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f, "%s", path);
        cr_assert_eq(fwrite(data, 1, files[i].size, f), files[i].size);
        fclose(f);
        free(data);
    }
    snprintf(path, sizeof path, "%s/subdir", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/link.jpg", dir);
    cr_assert_eq(symlink("s000.jpg", path), 0);
    return dir;
}

static void remove_tree(char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    run(cmd);
    free(dir);
}

enum tool { GNU_TAR, PYTHON };

/* Creates dir/out.tar with the tool in the format; returns the member
 * order used (the file list filtered for the format). */
static void make_tar(const char *dir, enum tool tool, const char *format, int allow_long_base,
                     int allow_long_path)
{
    size_t n;
    const struct tfile *files = tool_files(&n);
    char cmd[8192];
    size_t at = 0;
    if (tool == GNU_TAR)
        at +=
            (size_t)snprintf(cmd + at, sizeof cmd - at,
                             "cd '%s' && tar --format=%s --no-recursion -cf out.tar", dir, format);
    else
        at += (size_t)snprintf(cmd + at, sizeof cmd - at, "cd '%s' && python3 mk.py %s out.tar .",
                               dir, format);
    for (size_t i = 0; i < n; i++) {
        if ((files[i].long_base && !allow_long_base) || (files[i].long_path && !allow_long_path))
            continue;
        at += (size_t)snprintf(cmd + at, sizeof cmd - at, " '%s'", files[i].path);
        if (i == 4) /* a directory and a symlink between samples */
            at += (size_t)snprintf(cmd + at, sizeof cmd - at, " subdir link.jpg");
    }
    cr_assert(at < sizeof cmd);
    if (tool == PYTHON) {
        char py[512];
        snprintf(py, sizeof py, "%s/mk.py", dir);
        FILE *f = fopen(py, "w");
        cr_assert_not_null(f);
        fputs("import sys, tarfile\n"
              "fmt = {'gnu': tarfile.GNU_FORMAT, 'pax': tarfile.PAX_FORMAT,\n"
              "       'ustar': tarfile.USTAR_FORMAT}[sys.argv[1]]\n"
              "kw = {}\n"
              "if sys.argv[1] == 'pax':\n"
              "    kw['pax_headers'] = {'comment': 'test', 'path': 'global-ignored.jpg'}\n"
              "with tarfile.open(sys.argv[2], 'w', format=fmt, **kw) as t:\n"
              "    for n in sys.argv[4:]:\n"
              "        t.add(sys.argv[3] + '/' + n, arcname=n, recursive=False)\n",
              f);
        fclose(f);
    }
    run(cmd);
}

/* The samples the tool's archive must give. */
static void expected_for(int allow_long_base, int allow_long_path, struct bytes *out)
{
    size_t n;
    const struct tfile *files = tool_files(&n);
    unsigned char *data[16];
    for (size_t i = 0; i < n; i++) {
        data[i] = malloc(files[i].size + 1);
        file_bytes(&files[i], i, data[i]);
    }
    static char longbase_key[200];
    memcpy(longbase_key, g_longbase_path, 110);
    longbase_key[110] = '\0';
    static char longdir_key[200], split_key[200];
    snprintf(longdir_key, sizeof longdir_key, "%.*s", 135, g_longdir_path);
    snprintf(split_key, sizeof split_key, "%.*s", 116, g_split_path);
    struct want_sample w[16];
    size_t k = 0;
    w[k++] = (struct want_sample){"s000",
                                  3,
                                  {{"jpg", data[0], files[0].size},
                                   {"cls", data[1], files[1].size},
                                   {"json", data[2], files[2].size}}};
    w[k++] = (struct want_sample){
        "s001", 2, {{"seg.png", data[3], files[3].size}, {"jpg", data[4], files[4].size}}};
    if (allow_long_path)
        w[k++] = (struct want_sample){longdir_key, 1, {{"jpg", data[5], files[5].size}}};
    if (allow_long_base)
        w[k++] = (struct want_sample){longbase_key, 1, {{"txt", data[6], files[6].size}}};
    if (allow_long_path)
        w[k++] = (struct want_sample){split_key, 1, {{"npy", data[7], files[7].size}}};
    w[k++] = (struct want_sample){"s004", 1, {{"txt", data[8], 0}}};
    w[k++] = (struct want_sample){"caf\xc3\xa9-\xc3\xbc", 1, {{"jpg", data[10], files[10].size}}};
    w[k++] = (struct want_sample){"s006", 1, {{"jpg", data[11], files[11].size}}};
    serialize_want(out, w, k);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
}

static void check_tool_archive(enum tool tool, const char *format, int allow_long_base,
                               int allow_long_path)
{
    char *dir = make_tree();
    make_tar(dir, tool, format, allow_long_base, allow_long_path);
    char path[512];
    snprintf(path, sizeof path, "%s/out.tar", dir);
    size_t len;
    unsigned char *buf = slurp(path, &len);
    struct parse_result r;
    parse(buf, len, &r);
    cr_assert_eq(r.st, SF_OK, "%s %s: %s", tool == GNU_TAR ? "tar" : "python", format, r.err);
    struct bytes want = {0};
    expected_for(allow_long_base, allow_long_path, &want);
    cr_expect(bytes_eq(&r.ser, &want), "%s %s: samples differ (%zu samples)",
              tool == GNU_TAR ? "tar" : "python", format, r.samples);
    cr_expect_eq(r.stats.skipped_dirs, 1);
    cr_expect_eq(r.stats.skipped_links, 1);
    cr_expect_eq(r.stats.skipped_unnamed, 1); /* README */
    cr_expect_eq(r.stats.missing_end_marker, 0);
    parse_result_free(&r);
    bytes_free(&want);
    expect_same_in_all_feed_modes(buf, len);
    free(buf);
    remove_tree(dir);
}

/* One test per tool and format: (name, tool, format, allow_long_base,
 * allow_long_path). */
#define TOOL_TEST(name, tool, format, long_base, long_path)                                        \
    Test(tar, name)                                                                                \
    {                                                                                              \
        check_tool_archive(tool, format, long_base, long_path);                                    \
    }

TOOL_TEST(gnu_tar_gnu_format, GNU_TAR, "gnu", 1, 1)
TOOL_TEST(gnu_tar_pax_format, GNU_TAR, "pax", 1, 1)
TOOL_TEST(gnu_tar_ustar_format, GNU_TAR, "ustar", 0, 1)
TOOL_TEST(gnu_tar_v7_format, GNU_TAR, "v7", 0, 0)
TOOL_TEST(python_tarfile_gnu_format, PYTHON, "gnu", 1, 1)
TOOL_TEST(python_tarfile_pax_format_with_global_header, PYTHON, "pax", 1, 1)
TOOL_TEST(python_tarfile_ustar_format, PYTHON, "ustar", 0, 1)
