/* Lock descriptors are closed in a forked child (cache/fdlock.c). */
#include "cache/fdlock.h"
#include "support/mock_proc.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

/* The child: waits for the parent to drop its lock, then takes the lock
 * without waiting. Exit 0: it could; 1: the lock was still held (by the
 * child's inherited copy); 2: setup failed. */
static int child_takes_lock_after_parent(const char *path, int go_fd)
{
    char c;
    if (read(go_fd, &c, 1) != 1)
        return 2;
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return 2;
    int rc = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno == EWOULDBLOCK ? 1 : 2;
    close(fd);
    return rc;
}

static int fork_and_check(const char *path, int use_registry)
{
    int fd = use_registry ? sf__fdlock_open(path, O_RDWR | O_CREAT, 0600)
                          : open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(flock(fd, LOCK_EX), 0);
    int go[2];
    cr_assert_eq(pipe(go), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(go[1]);
        _exit(child_takes_lock_after_parent(path, go[0]));
    }
    close(go[0]);
    if (use_registry)
        sf__fdlock_close(fd);
    else
        close(fd);
    cr_assert_eq(write(go[1], "x", 1), 1);
    close(go[1]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

Test(fdlock, a_forked_child_holds_none_of_the_parents_locks)
{
    char *dir = test_tmpdir();
    cr_assert(dir);
    char path[512];
    snprintf(path, sizeof(path), "%s/x.lock", dir);
    /* The hazard itself: a plain descriptor's copy keeps the lock. */
    cr_assert_eq(fork_and_check(path, 0), 1, "a plain fd's lock should survive in the child");
    /* Through the registry, the child's copy is closed at fork. */
    cr_assert_eq(fork_and_check(path, 1), 0, "the child still held the parent's lock");
    test_rmtree(dir);
    free(dir);
}
