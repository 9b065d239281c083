/* Lock descriptors that a forked child must not inherit (cache/fdlock.h). */
#include "cache/fdlock.h"

#include "common/grow.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* The library's only process-wide state: fork() is process-wide too. The
 * mutex is held across open/close and the list change, and by the fork
 * (prepare handler), so a child never sees a descriptor that is open but
 * not listed, or listed but already closed (its number reused). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int *fds;
static size_t n_fds, cap_fds;

static void before_fork(void)
{
    pthread_mutex_lock(&mu);
}

static void in_parent(void)
{
    pthread_mutex_unlock(&mu);
}

static void in_child(void)
{
    for (size_t i = 0; i < n_fds; i++)
        close(fds[i]);
    n_fds = 0;
    pthread_mutex_unlock(&mu);
}

static void install(void)
{
    (void)pthread_atfork(before_fork, in_parent, in_child);
}

int sf__fdlock_open(const char *path, int flags, mode_t mode)
{
    pthread_once(&once, install);
    pthread_mutex_lock(&mu);
    int *p = sf__grow(fds, n_fds, &cap_fds, sizeof(*fds), 16);
    if (!p) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    fds = p;
    int fd = open(path, flags | O_CLOEXEC, mode);
    if (fd >= 0)
        fds[n_fds++] = fd;
    pthread_mutex_unlock(&mu);
    return fd;
}

void sf__fdlock_close(int fd)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_fds; i++) {
        if (fds[i] == fd) {
            fds[i] = fds[--n_fds];
            break;
        }
    }
    close(fd);
    pthread_mutex_unlock(&mu);
}
