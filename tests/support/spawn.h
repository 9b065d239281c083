/* Test support: a program run as a child with its output in files. */
#ifndef SF_TEST_SPAWN_H
#define SF_TEST_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

/* Starts argv[0] with argv (NULL-terminated) in a child whose stdout goes to
 * out_path and stderr to err_path (NULL: the parent's); a path that cannot
 * be opened makes the child exit 126. Returns the pid, -1 when fork failed. */
pid_t test_spawn(const char *const *argv, const char *out_path, const char *err_path);
/* Waits for pid: its exit status, 128 + the signal that ended it, or -1. */
int test_wait(pid_t pid);
/* test_spawn, then test_wait; -1 when either failed. */
int test_run(const char *const *argv, const char *out_path, const char *err_path);
/* fork() with a pipe from the child to the parent: in the child, 0 with
 * *fd the end it writes to; in the parent, the child's pid with *fd the end
 * it reads from (each side's other end closed); -1 when pipe or fork
 * failed. */
pid_t test_fork_piped(int *fd);
/* In the parent of test_fork_piped: what the child wrote to the pipe until
 * it closed it, into msg (NUL-terminated, at most len - 1 bytes kept);
 * closes fd and waits for pid. Its status as waitpid gives it, -1 when the
 * wait failed. */
int test_wait_piped(pid_t pid, int fd, char *msg, size_t len);
/* Lowers this process's descriptor limit (the soft RLIMIT_NOFILE) to limit
 * and takes every descriptor left under it, so that the next open() or
 * socket() fails with EMFILE. 0, or -1 when the limit cannot be set. For a
 * child: what it took stays open until it exits. */
int test_use_up_descriptors(unsigned limit);

#endif
