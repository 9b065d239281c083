/* Files opened to hold flock() locks, closed in a forked child. Internal. */
#ifndef SF_CACHE_FDLOCK_H
#define SF_CACHE_FDLOCK_H

#include <sys/types.h>

/*
 * A flock() lock belongs to an open file description, and fork() gives the
 * child a copy of every descriptor: a child that never closes its copy keeps
 * the parent's lock alive after the parent lets go, and deadlocks as soon as
 * it takes the same lock (a training script that forks while its loader
 * downloads into the cache). Every descriptor the cache opens to hold a lock
 * goes through these two calls; a forked child closes all of them first
 * thing (pthread_atfork), so it holds none of its parent's locks.
 */

/* open(2) and remember the descriptor; -1 with errno as open. */
int sf__fdlock_open(const char *path, int flags, mode_t mode);
/* Forgets and closes a descriptor of sf__fdlock_open() (drops its lock);
 * fd < 0 is a no-op. */
void sf__fdlock_close(int fd);

#endif
