#include "support/mock_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int mock_proc_start(struct mock_proc *p, const char *root, const char *const *extra_args)
{
    memset(p, 0, sizeof(*p));
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return -1;
    const char *argv[64];
    size_t n = 0;
    argv[n++] = SF_MOCK_S3_BIN;
    argv[n++] = "--root";
    argv[n++] = root;
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--quiet";
    for (size_t i = 0; extra_args && extra_args[i] && n < 63; i++)
        argv[n++] = extra_args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        /* a test that dies (ASan abort, crash) must not leave its server behind */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fds[1], STDOUT_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    p->pid = pid;
    char line[256];
    size_t len = 0;
    /* Read the first line, waiting at most 10 s. */
    while (len < sizeof(line) - 1) {
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, 10000) <= 0)
            break;
        ssize_t r = read(fds[0], line + len, 1);
        if (r <= 0)
            break;
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
    close(fds[0]);
    const char *colon = strrchr(line, ':');
    int tls = strncmp(line, "listening on https://", 21) == 0;
    if ((!tls && strncmp(line, "listening on http://", 20) != 0) || !colon) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        p->pid = 0;
        return -1;
    }
    p->port = (unsigned)atoi(colon + 1);
    snprintf(p->url, sizeof(p->url), "%s://127.0.0.1:%u", tls ? "https" : "http", p->port);
    snprintf(p->host, sizeof(p->host), "127.0.0.1:%u", p->port);
    return 0;
}

int mock_proc_stop(struct mock_proc *p)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        int st;
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            p->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
    return -1;
}

char *test_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof(tmpl), "%s/sf-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpl))
        return NULL;
    return strdup(tmpl);
}

char *test_tmpdir_with_root(char **root)
{
    char *tmp = test_tmpdir();
    if (!tmp)
        return NULL;
    size_t n = strlen(tmp) + sizeof("/root");
    *root = malloc(n);
    if (!*root || snprintf(*root, n, "%s/root", tmp) < 0 || mkdir(*root, 0755) != 0) {
        free(*root);
        *root = NULL;
        test_rmtree(tmp);
        free(tmp);
        return NULL;
    }
    return tmp;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void test_rmtree(const char *path)
{
    if (path)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int test_make_dir(const char *dir, const char *rel, char *path, size_t path_len)
{
    char buf[4096];
    if (!path) {
        path = buf;
        path_len = sizeof(buf);
    }
    int n = snprintf(path, path_len, "%s/%s", dir, rel);
    if (n < 0 || (size_t)n >= path_len)
        return -1;
    return mkdir(path, 0755);
}

int test_write_file(const char *root, const char *rel, const void *data, size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    for (char *s = strchr(path + strlen(root) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(path, 0755);
        *s = '/';
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

void test_fill(void *buf, size_t n, unsigned seed)
{
    unsigned char *b = buf;
    unsigned long long x = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (unsigned char)(x >> 24);
    }
}

void test_isolate_aws_env(const char *dir)
{
    static const char *const vars[] = {"AWS_PROFILE",
                                       "AWS_REGION",
                                       "AWS_DEFAULT_REGION",
                                       "AWS_ENDPOINT_URL",
                                       "AWS_ENDPOINT_URL_S3",
                                       "AWS_ACCESS_KEY_ID",
                                       "AWS_SECRET_ACCESS_KEY",
                                       "AWS_SESSION_TOKEN",
                                       "AWS_CA_BUNDLE",
                                       "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                                       "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                       "AWS_WEB_IDENTITY_TOKEN_FILE",
                                       "AWS_ROLE_ARN"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    char path[4096];
    snprintf(path, sizeof(path), "%s/no-aws-config", dir);
    setenv("AWS_CONFIG_FILE", path, 1);
    snprintf(path, sizeof(path), "%s/no-aws-credentials", dir);
    setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
}

unsigned char *test_put_object(const char *root, const char *bucket, const char *key, size_t n,
                               unsigned seed)
{
    unsigned char *data = malloc(n ? n : 1);
    if (!data)
        return NULL;
    test_fill(data, n, seed);
    char rel[1024];
    if (snprintf(rel, sizeof(rel), "%s/%s", bucket, key) >= (int)sizeof(rel) ||
        test_write_file(root, rel, data, n) != 0) {
        free(data);
        return NULL;
    }
    return data;
}
