#include <criterion/criterion.h>

#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* An empty temporary file open read-write; its name into path (len bytes). */
static int temp_file(char *path, size_t len)
{
    snprintf(path, len, "/tmp/sf-test-common-io-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    return fd;
}

Test(common_io, pwrite_then_pread_a_range_at_an_offset_without_moving_the_position)
{
    char path[64];
    int fd = temp_file(path, sizeof(path));
    size_t done = 99;
    cr_assert_eq(sf__pwrite_full(fd, "0123456789", 10, 0, &done), 0);
    cr_expect_eq(done, 10);
    cr_assert_eq(sf__pwrite_full(fd, "abc", 3, 4, NULL), 0);
    cr_expect_eq(lseek(fd, 0, SEEK_CUR), 0, "pread/pwrite leave the position alone");
    char buf[8] = "";
    cr_assert_eq(sf__pread_full(fd, buf, 5, 3, &done), 0);
    cr_expect_eq(done, 5);
    cr_expect_str_eq(buf, "3abc7");
    close(fd);
    unlink(path);
}

Test(common_io, pread_past_the_end_stops_with_1_and_what_it_got)
{
    char path[64];
    int fd = temp_file(path, sizeof(path));
    cr_assert_eq(sf__write_full(fd, "hello", 5, NULL), 0);
    char buf[16];
    size_t done = 99;
    cr_expect_eq(sf__pread_full(fd, buf, sizeof(buf), 2, &done), 1);
    cr_expect_eq(done, 3);
    cr_expect_eq(memcmp(buf, "llo", 3), 0);
    cr_expect_eq(sf__pread_full(fd, buf, 1, 5, &done), 1);
    cr_expect_eq(done, 0);
    cr_expect_eq(sf__pread_full(fd, buf, 0, 99, &done), 0, "nothing to read is success");
    cr_expect_eq(done, 0);
    close(fd);
    unlink(path);
}

Test(common_io, write_and_read_follow_the_position)
{
    char path[64];
    int fd = temp_file(path, sizeof(path));
    size_t done;
    cr_assert_eq(sf__write_full(fd, "abc", 3, &done), 0);
    cr_assert_eq(sf__write_full(fd, "def", 3, &done), 0);
    cr_expect_eq(done, 3);
    cr_expect_eq(lseek(fd, 0, SEEK_CUR), 6);
    cr_assert_eq(lseek(fd, 1, SEEK_SET), 1);
    char buf[8] = "";
    cr_assert_eq(sf__read_full(fd, buf, 4, &done), 0);
    cr_expect_str_eq(buf, "bcde");
    cr_expect_eq(sf__read_full(fd, buf, 4, &done), 1, "one byte left");
    cr_expect_eq(done, 1);
    close(fd);
    unlink(path);
}

Test(common_io, a_failed_call_returns_minus_1_with_errno)
{
    char path[64];
    int fd = temp_file(path, sizeof(path));
    int ro = open(path, O_RDONLY);
    cr_assert_geq(ro, 0);
    size_t done = 99;
    errno = 0;
    cr_expect_eq(sf__pwrite_full(ro, "x", 1, 0, &done), -1);
    cr_expect_eq(errno, EBADF);
    cr_expect_eq(done, 0);
    errno = 0;
    cr_expect_eq(sf__write_full(ro, "x", 1, NULL), -1);
    cr_expect_eq(errno, EBADF);
    char c;
    errno = 0;
    cr_expect_eq(sf__read_full(-1, &c, 1, &done), -1);
    cr_expect_eq(errno, EBADF);
    close(ro);
    close(fd);
    unlink(path);
}

/* Each read of a SOCK_SEQPACKET socket returns one message: short counts
 * the loop has to take up. */
Test(common_io, short_counts_are_taken_up_until_the_end)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    cr_assert_eq(write(sv[1], "abc", 3), 3);
    cr_assert_eq(write(sv[1], "defg", 4), 4);
    char buf[16] = "";
    size_t done = 0;
    cr_assert_eq(sf__read_full(sv[0], buf, 7, &done), 0);
    cr_expect_eq(done, 7);
    cr_expect_str_eq(buf, "abcdefg");
    cr_assert_eq(write(sv[1], "hi", 2), 2);
    close(sv[1]);
    memset(buf, 0, sizeof(buf));
    cr_expect_eq(sf__read_full(sv[0], buf, 8, &done), 1, "the peer closed after 2 bytes");
    cr_expect_eq(done, 2);
    cr_expect_str_eq(buf, "hi");
    close(sv[0]);
}
