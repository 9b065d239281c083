/* Test support: a program run as a child with its output in files. */
#ifndef SF_TEST_SPAWN_H
#define SF_TEST_SPAWN_H

#include <sys/types.h>

/* Starts argv[0] with argv (NULL-terminated) in a child whose stdout goes to
 * out_path and stderr to err_path (NULL: the parent's); a path that cannot
 * be opened makes the child exit 126. Returns the pid, -1 when fork failed. */
pid_t test_spawn(const char *const *argv, const char *out_path, const char *err_path);
/* Waits for pid: its exit status, 128 + the signal that ended it, or -1. */
int test_wait(pid_t pid);
/* test_spawn, then test_wait; -1 when either failed. */
int test_run(const char *const *argv, const char *out_path, const char *err_path);

#endif
