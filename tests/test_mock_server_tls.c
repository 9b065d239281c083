/* The mock S3 server over TLS, and its command line's credential and TLS
 * flags. Suites `mock_server_tls` and `mock_server_cli`. */
#include "mock_server_fixture.h"
#include "s3/sigv4.h"
#include "support/mock_proc.h"
#include "support/s3_client.h"
#include "support/test_cert.h"

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* -------------------------------------------------------------------- TLS */

static char cert_file[700], key_file[700];
static char tls_url[64]; /* "https://127.0.0.1:PORT" */

/* Starts the server over TLS with a fresh certificate (in tmp, outside the root). */
static void start_tls(void)
{
    make_root();
    cr_assert(test_make_cert(tmp, cert_file, sizeof(cert_file), key_file, sizeof(key_file)) == 0);
    const char *extra[] = {"--access-key", "test-ak",   "--secret-key", "test-secret", "--tls-cert",
                           cert_file,      "--tls-key", key_file,       NULL};
    cr_assert(mock_proc_start(&srv, root, extra) == 0, "the TLS mock server did not start");
    snprintf(tls_url, sizeof(tls_url), "%s", srv.url);
}

TestSuite(mock_server_tls, .init = start_tls, .fini = mock_server_teardown, .timeout = 60);

static void tls_get(const char *target, const char *const *headers, const char *ca,
                    struct s3_resp *r)
{
    struct s3_call c = {
        .method = "GET", .target = target, .headers = headers, .creds = &creds, .ca_file = ca};
    s3_call(tls_url, &c, r);
}

Test(mock_server_tls, https_get_with_the_test_ca_is_byte_identical)
{
    size_t n = 3u << 20;
    unsigned char *data = test_put_object(root, "bucket1", "big.bin", n, 11);
    cr_assert(data);
    struct s3_resp r;
    tls_get("/bucket1/big.bin", NULL, cert_file, &r);
    cr_assert_eq(r.curl_code, CURLE_OK, "curl: %s", curl_easy_strerror(r.curl_code));
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body.len, n);
    cr_expect(memcmp(r.body.data, data, n) == 0, "the body differs");
    s3_resp_free(&r);

    const char *range[] = {"Range: bytes=1000000-1999999", NULL};
    tls_get("/bucket1/big.bin", range, cert_file, &r);
    cr_assert_eq(r.status, 206);
    cr_assert_eq(r.body.len, 1000000);
    cr_expect(memcmp(r.body.data, data + 1000000, 1000000) == 0);
    s3_resp_free(&r);

    /* An upload over TLS lands intact. */
    struct s3_call put = {.method = "PUT",
                          .target = "/bucket1/up.bin",
                          .body = data,
                          .body_len = 300 * 1024,
                          .creds = &creds,
                          .ca_file = cert_file};
    s3_call(tls_url, &put, &r);
    cr_expect_eq(r.status, 200, "%s", sf__strbuf_str(&r.body));
    s3_resp_free(&r);
    tls_get("/bucket1/up.bin", NULL, cert_file, &r);
    cr_assert_eq(r.body.len, 300 * 1024);
    cr_expect(memcmp(r.body.data, data, 300 * 1024) == 0);
    s3_resp_free(&r);
    free(data);
}

Test(mock_server_tls, https_without_the_test_ca_fails_verification)
{
    cr_assert(test_write_file(root, "bucket1/k", "v", 1) == 0);
    struct s3_resp r;
    tls_get("/bucket1/k", NULL, NULL, &r);
    cr_expect_eq(r.curl_code, CURLE_PEER_FAILED_VERIFICATION, "curl: %d %s", r.curl_code,
                 curl_easy_strerror(r.curl_code));
    cr_expect_eq(r.status, 0);
    s3_resp_free(&r);
    /* Plain HTTP on the TLS port gets no HTTP answer. */
    char http_url[64];
    snprintf(http_url, sizeof(http_url), "http://127.0.0.1:%u", srv.port);
    struct s3_call c = {.method = "GET", .target = "/bucket1/k", .creds = &creds};
    s3_call(http_url, &c, &r);
    cr_expect_eq(r.status, 0);
    s3_resp_free(&r);
    /* and the server still serves verified clients */
    tls_get("/bucket1/k", NULL, cert_file, &r);
    cr_expect_eq(r.status, 200);
    s3_resp_free(&r);
}

Test(mock_server_tls, reset_fault_cuts_a_tls_body)
{
    size_t n = 1u << 20;
    unsigned char *data = test_put_object(root, "bucket1", "r.bin", n, 5);
    cr_assert(data);
    const char *h[] = {"x-sfmock-fault: reset=100000", NULL};
    struct s3_resp r;
    tls_get("/bucket1/r.bin", h, cert_file, &r);
    cr_expect_eq(r.status, 200);
    cr_expect_neq(r.curl_code, CURLE_OK, "the transfer must fail");
    /* Exactly 100000 in practice; TLS framing makes only the bound certain
     * (docs/mock-server.md). */
    cr_expect(r.body.len > 0 && r.body.len <= 100000, "%zu bytes", r.body.len);
    cr_expect(memcmp(r.body.data, data, r.body.len) == 0);
    s3_resp_free(&r);
    free(data);
}

/* Runs the server binary with args (stdout discarded); returns its exit
 * status, or -1 when it did not exit within 10 s (killed). stderr into err. */
static int run_mock(const char *const *args, char *err, size_t err_len)
{
    const char *argv[24] = {SF_MOCK_S3_BIN};
    size_t n = 1;
    for (size_t i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int fds[2];
    cr_assert(pipe2(fds, O_CLOEXEC) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int null_fd = open("/dev/null", O_WRONLY);
        dup2(null_fd, STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    struct pollfd pfd = {fds[0], POLLIN, 0};
    ssize_t got = 1;
    while (got > 0 && poll(&pfd, 1, 10000) > 0) {
        char buf[512];
        got = read(fds[0], buf, sizeof(buf));
        for (ssize_t i = 0; i < got && len + 1 < err_len; i++)
            err[len++] = buf[i];
    }
    err[len] = '\0';
    close(fds[0]);
    if (got > 0) /* still running */
        kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    return got <= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(mock_server_cli, bad_credential_and_tls_flags_exit_with_a_reason, .timeout = 60)
{
    char *dir = test_tmpdir();
    cr_assert(dir);
    char cert[600], key[600];
    cr_assert(test_make_cert(dir, cert, sizeof(cert), key, sizeof(key)) == 0);
    struct stat sb;
    cr_assert(stat(key, &sb) == 0);
    cr_expect_eq(sb.st_mode & 0777, 0600, "the key file is private");
    struct {
        const char *args[8];
        int status;
        const char *says;
    } cases[] = {
        {{"--issue-ttl-s", "0"}, 2, "--issue-ttl-s"},
        {{"--issue-ttl-s", "1h"}, 2, "--issue-ttl-s"},
        {{"--imds-role", "a/b"}, 2, "--imds-role"},
        {{"--container-path", "relative"}, 2, "--container-path"},
        {{"--tls-cert", cert}, 2, "go together"},
        {{"--tls-cert", "/nonexistent/cert.pem", "--tls-key", key}, 1, "/nonexistent/cert.pem"},
        {{"--tls-cert", key, "--tls-key", key}, 1, "TLS"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *args[12] = {"--root", dir, "--port", "0", "--quiet"};
        size_t n = 5;
        for (size_t j = 0; cases[i].args[j]; j++)
            args[n++] = cases[i].args[j];
        args[n] = NULL;
        char err[2048];
        cr_expect_eq(run_mock(args, err, sizeof(err)), cases[i].status, "case %zu: %s", i, err);
        cr_expect(strstr(err, cases[i].says) != NULL, "case %zu says: %s", i, err);
    }
    test_rmtree(dir);
    free(dir);
}
