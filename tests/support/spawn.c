#include "support/spawn.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static int redirect(const char *path, int fd)
{
    if (!path)
        return 0;
    int f = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    return f >= 0 && dup2(f, fd) >= 0 ? 0 : -1;
}

pid_t test_spawn(const char *const *argv, const char *out_path, const char *err_path)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (redirect(out_path, STDOUT_FILENO) != 0 || redirect(err_path, STDERR_FILENO) != 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int test_wait(pid_t pid)
{
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int test_run(const char *const *argv, const char *out_path, const char *err_path)
{
    return test_wait(test_spawn(argv, out_path, err_path));
}

pid_t test_fork_piped(int *fd)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    close(pid == 0 ? p[0] : p[1]);
    *fd = pid == 0 ? p[1] : p[0];
    return pid;
}

int test_wait_piped(pid_t pid, int fd, char *msg, size_t len)
{
    size_t n = 0;
    ssize_t r;
    while (n + 1 < len && (r = read(fd, msg + n, len - 1 - n)) > 0)
        n += (size_t)r;
    if (len > 0)
        msg[n] = 0;
    close(fd);
    int status;
    return waitpid(pid, &status, 0) == pid ? status : -1;
}

int test_use_up_descriptors(unsigned limit)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    rl.rlim_cur = limit;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    while (dup(2) >= 0)
        ;
    return 0;
}
