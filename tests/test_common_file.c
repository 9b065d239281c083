#include <criterion/criterion.h>

#include "common/dirnames.h"
#include "common/file.h"
#include "support/rss.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A temporary file holding text; its name into path (len bytes). */
static void make_file(char *path, size_t len, const char *text)
{
    snprintf(path, len, "/tmp/sf-test-common-file-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

Test(common_file, opens_a_file_with_its_stat_and_close_on_exec)
{
    char path[64];
    make_file(path, sizeof(path), "hello");
    struct stat sb;
    int fd = sf__open_stat(path, &sb);
    cr_assert_geq(fd, 0);
    cr_expect(S_ISREG(sb.st_mode));
    cr_expect_eq(sb.st_size, 5);
    cr_expect(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    char buf[8] = "";
    cr_expect_eq(read(fd, buf, sizeof(buf)), 5);
    cr_expect_str_eq(buf, "hello");
    cr_expect_eq(write(fd, "x", 1), -1); /* read-only */
    close(fd);
    unlink(path);
}

Test(common_file, a_missing_file_is_not_found)
{
    struct stat sb;
    errno = 0;
    cr_expect_eq(sf__open_stat("/tmp/sf-test-common-file-no-such/x", &sb), -1);
    cr_expect_eq(errno, ENOENT);
    cr_expect_eq(sf__errno_status(errno), SF_ERR_NOT_FOUND);
}

Test(common_file, other_failures_are_io_errors)
{
    char path[64], below[80];
    make_file(path, sizeof(path), "x");
    snprintf(below, sizeof(below), "%s/x", path); /* a file is not a folder */
    struct stat sb;
    errno = 0;
    cr_expect_eq(sf__open_stat(below, &sb), -1);
    cr_expect_eq(errno, ENOTDIR);
    cr_expect_eq(sf__errno_status(errno), SF_ERR_IO);
    cr_expect_eq(sf__errno_status(EACCES), SF_ERR_IO);
    unlink(path);
}

Test(common_file, temp_discard_closes_removes_and_forgets)
{
    char path[64];
    make_file(path, sizeof(path), "partial");
    char *name = strdup(path);
    cr_assert_not_null(name);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    sf__temp_discard(&fd, &name);
    cr_expect_eq(fd, -1);
    cr_expect_null(name);
    cr_expect_eq(access(path, F_OK), -1); /* removed */
    sf__temp_discard(&fd, &name);         /* nothing left: a no-op */
    cr_expect_eq(fd, -1);
}

/* Blocks of a new file in dir after sf__preallocate of 1 MiB; the file
 * system's type into *type. -1 where dir cannot hold a test file. */
static long long preallocated_blocks(const char *dir, long *type)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/sf-test-prealloc-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    unlink(path);
    struct statfs fs;
    cr_assert_eq(fstatfs(fd, &fs), 0);
    *type = (long)fs.f_type;
    cr_assert_eq(sf__preallocate(fd, 1 << 20), 0);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_expect_eq(sb.st_size, 0, "preallocation does not change the size");
    close(fd);
    return (long long)sb.st_blocks * 512;
}

Test(common_file, preallocates_on_a_disk_but_not_on_tmpfs)
{
    long type = 0;
    long long bytes = preallocated_blocks("/dev/shm", &type);
    if (bytes >= 0 && type == TMPFS_MAGIC)
        cr_expect_eq(bytes, 0, "tmpfs: no page is zeroed ahead of the writes");
    bytes = preallocated_blocks(".", &type);
    cr_assert_geq(bytes, 0);
    if (type == TMPFS_MAGIC) {
        cr_expect_eq(bytes, 0);
        return;
    }
    /* a disk, where the file system has fallocate at all */
    char probe[64];
    make_file(probe, sizeof(probe), "");
    int fd = open(probe, O_RDWR);
    cr_assert_geq(fd, 0);
    int has_fallocate = fallocate(fd, 0, 0, 4096) == 0;
    close(fd);
    unlink(probe);
    if (has_fallocate)
        cr_expect_geq(bytes, 1 << 20, "a disk: the blocks are reserved up front");
}

Test(common_file, preallocating_nothing_does_nothing)
{
    char path[64];
    make_file(path, sizeof(path), "");
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    cr_expect_eq(sf__preallocate(fd, 0), 0);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_expect_eq(sb.st_blocks, 0);
    close(fd);
    unlink(path);
}

/* The resident kilobytes of the mapping that starts at p. */
static long resident_kib(const void *p)
{
    return test_mapped_rss_kib(p, NULL);
}

Test(common_file, dropped_pages_leave_the_process_and_read_back_unchanged)
{
    char path[64];
    make_file(path, sizeof(path), "");
    enum { SIZE = 1 << 20 };
    unsigned char *want = malloc(SIZE);
    for (size_t i = 0; i < SIZE; i++)
        want[i] = (unsigned char)(i * 131 + (i >> 12));
    int fd = open(path, O_RDWR);
    cr_assert_eq(write(fd, want, SIZE), SIZE);
    const unsigned char *m = mmap(NULL, SIZE, PROT_READ, MAP_PRIVATE, fd, 0);
    cr_assert(m != MAP_FAILED);
    close(fd);
    unsigned long sum = 0;
    for (size_t i = 0; i < SIZE; i += 4096)
        sum += m[i];
    cr_assert_geq(resident_kib(m), SIZE / 1024, "every page touched (sum %lu)", sum);
    /* an unaligned range: the pages wholly inside it go, its two ends stay */
    sf__drop_mapped(m + 100, SIZE - 200);
    cr_expect_eq(resident_kib(m), 8, "the first and the last page stay");
    cr_expect(memcmp(m, want, SIZE) == 0, "the bytes read back unchanged");
    cr_expect_geq(resident_kib(m), SIZE / 1024);
    /* a range inside one page drops nothing */
    sf__drop_mapped(m + 4096 + 10, 4000);
    cr_expect_geq(resident_kib(m), SIZE / 1024);
    munmap((void *)m, SIZE);
    free(want);
    unlink(path);
}

/* A fault may map up to the page table around it: the span to give back
 * covers the page tables the bytes touch and never leaves the mapping. */
Test(common_file, fault_span_covers_the_page_tables_touched_inside_the_mapping)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), w = sf__fault_map_bytes();
    cr_assert_eq(w, page * (page / sizeof(void *)));
    /* a mapping that starts 3 pages after a page table's start and is 5
     * tables and 7 bytes long (addresses only: nothing is read) */
    const unsigned char *base = (const unsigned char *)(uintptr_t)(64 * w + 3 * page);
    size_t len = 5 * w + 7;
    const void *p;
    size_t n;
    sf__fault_span(base, len, 10, 20, &p, &n);
    cr_expect_eq((uintptr_t)p, (uintptr_t)base, "not below the mapping");
    cr_expect_eq((uintptr_t)p + n, 65 * w, "to the end of the first table");
    sf__fault_span(base, len, w, w + 1, &p, &n);
    cr_expect_eq((uintptr_t)p, 65 * w);
    cr_expect_eq(n, w, "one table, around the byte");
    sf__fault_span(base, len, w - 4 * page, 2 * w - 3 * page + 1, &p, &n);
    cr_expect_eq((uintptr_t)p, (uintptr_t)base, "the first table from the mapping's start");
    cr_expect_eq((uintptr_t)p + n, 67 * w, "to the end of the third table touched");
    sf__fault_span(base, len, len - 1, len, &p, &n);
    cr_expect_eq((uintptr_t)p, 69 * w);
    cr_expect_eq((uintptr_t)p + n, (uintptr_t)base + ((len + page - 1) & ~(page - 1)),
                 "not past the mapping's last page");
}

static int not_c(const char *dir, const char *name, void *user)
{
    cr_expect_str_eq(dir, (const char *)user, "the filter is told the folder");
    return strcmp(name, "c") != 0;
}

Test(common_file, dirnames_are_filtered_and_sorted_without_dot_entries)
{
    char dir[] = "/tmp/sf-test-dirnames-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const char *files[] = {"b", "c", ".hidden", "a10", "a2"};
    char path[128];
    for (size_t i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        int fd = open(path, O_WRONLY | O_CREAT, 0600);
        cr_assert_geq(fd, 0);
        close(fd);
    }
    char **names;
    size_t n;
    cr_assert_eq(sf__dirnames(dir, not_c, dir, &names, &n), 0);
    const char *want[] = {".hidden", "a10", "a2", "b"};
    cr_assert_eq(n, 4u);
    for (size_t i = 0; i < n; i++)
        cr_expect_str_eq(names[i], want[i]);
    sf__strv_free(names, n);
    cr_assert_eq(sf__dirnames(dir, NULL, NULL, &names, &n), 0);
    cr_expect_eq(n, 5u, "no filter: every name but . and ..");
    sf__strv_free(names, n);
    for (size_t i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    errno = 0;
    cr_expect_eq(sf__dirnames(dir, NULL, NULL, &names, &n), -1, "a missing folder");
    cr_expect_eq(errno, ENOENT);
    cr_expect_null(names);
    cr_expect_eq(n, 0u);
}
