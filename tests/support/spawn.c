#include "support/spawn.h"

#include <fcntl.h>
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
