#include <criterion/criterion.h>

#include "common/file.h"

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
