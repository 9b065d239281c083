/* The disk cache as the processes of a node share it (docs/cache.md,
 * "Publishing and sharing between processes", "Eviction and the limit"):
 * crashes in the middle of a download or a publish, a cache directory that
 * disappears, writes that fail for want of room, entries evicted while
 * another process reads them. Part of the `cache` suite (test_cache.c). */
#include "cache_fixture.h"

#include "cache/disk_cache.h"
#include "shardfeed.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* rm -rf path (test support: the tree is ours). */
static void remove_tree(const char *path)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execlp("rm", "rm", "-rf", path, (char *)NULL);
        _exit(127);
    }
    int status;
    cr_assert(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* `rm -rf` of the whole cache directory while a process has it open (a
 * user freeing the disk, a cleaner of $XDG_CACHE_HOME): the next miss makes
 * the directory again and fetches, rather than failing every later shard. */
Test(cache, a_cache_dir_removed_while_open_is_made_again)
{
    start_mock(NULL);
    size_t n = 300 * 1024;
    unsigned char *a = put_object("gone-a.tar", n, 71);
    unsigned char *b = put_object("gone-b.tar", n, 72);
    client(256 * 1024);
    open_cache(0, SF_REVALIDATE_TRUST);
    cr_assert_eq(read_through("gone-a.tar", a, n), SF_CACHE_FROM_FETCH);
    remove_tree(cdir);
    struct sf_cache_stats cs;
    cr_assert_eq(sf_cache_stats(cache, &cs), SF_OK);
    cr_assert_eq(cs.entries, 0);
    cr_assert_eq(read_through("gone-b.tar", b, n), SF_CACHE_FROM_FETCH);
    cr_assert_eq(read_through("gone-a.tar", a, n), SF_CACHE_FROM_FETCH);
    cr_assert_eq(read_through("gone-a.tar", a, n), SF_CACHE_FROM_DISK);
    struct tally t = tally_cache();
    cr_assert_eq(t.entries, 2);
    cr_assert_eq(t.parts, 0);
    free(a);
    free(b);
}
