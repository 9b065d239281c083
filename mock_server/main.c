/* shardfeed-mock-s3: a local S3-compatible server for tests and benchmarks.
 * See docs/mock-server.md. */
#include "mock_server/mock_s3.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAULTS 64

static void usage(FILE *f)
{
    fputs("usage: shardfeed-mock-s3 --root DIR [options]\n"
          "\n"
          "Serves DIR as an S3 endpoint: each top-level folder is a bucket.\n"
          "\n"
          "  --root DIR           directory to serve (required)\n"
          "  --port N             TCP port, 0 picks a free one (default 0)\n"
          "  --host ADDR          IPv4 address to bind (default 127.0.0.1)\n"
          "  --access-key K       accepted access key id (default mock-access-key)\n"
          "  --secret-key S       its secret (default mock-secret-key)\n"
          "  --session-token T    signed requests must carry this x-amz-security-token\n"
          "                       (or one issued by the credential endpoints)\n"
          "  --region R           region of the credential scope (default us-east-1)\n"
          "  --anonymous          also accept unsigned requests\n"
          "  --seed N             seed of random faults (default 1)\n"
          "  --fault SPEC         fault rule, repeatable, e.g. prefix=b/x/,p503=0.1\n"
          "  --imds-role NAME     role served by the IMDS endpoints (default mock-role)\n"
          "  --container-path P   also serve container credentials at P\n"
          "                       (always at /_mock/container-credentials)\n"
          "  --container-auth-token T\n"
          "                       container credentials require 'Authorization: T'\n"
          "  --issue-ttl-s N      lifetime of issued credentials (default 3600)\n"
          "  --tls-cert FILE      PEM certificate (chain): serve HTTPS\n"
          "  --tls-key FILE       PEM private key of --tls-cert\n"
          "  --quiet              no per-request log on stderr\n"
          "  --help               this text\n"
          "\n"
          "The first line on stdout is 'listening on http://HOST:PORT'\n"
          "(https:// with --tls-cert).\n"
          "SIGTERM or SIGINT stops the server. Faults, forced faults and\n"
          "/_mock/stats are described in docs/mock-server.md.\n",
          f);
}

static int parse_u64(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || v > max || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

/* Says which option value was refused and why; the exit status of a bad command line. */
static int bad_value(const char *option, const char *value, const char *why)
{
    fprintf(stderr, "shardfeed-mock-s3: --%s '%s' %s\n", option, value, why);
    return 2;
}

int main(int argc, char **argv)
{
    struct mock_config cfg = {
        .host = "127.0.0.1",
        .access_key = "mock-access-key",
        .secret_key = "mock-secret-key",
        .region = "us-east-1",
        .seed = 1,
    };
    const char *faults[MAX_FAULTS];
    size_t n_faults = 0;
    enum {
        O_ROOT = 1,
        O_PORT,
        O_HOST,
        O_AK,
        O_SK,
        O_TOKEN,
        O_REGION,
        O_ANON,
        O_SEED,
        O_FAULT,
        O_IMDS_ROLE,
        O_CONTAINER_PATH,
        O_CONTAINER_AUTH,
        O_ISSUE_TTL,
        O_TLS_CERT,
        O_TLS_KEY,
        O_QUIET,
        O_HELP
    };
    static const struct option opts[] = {
        {"root", required_argument, NULL, O_ROOT},
        {"port", required_argument, NULL, O_PORT},
        {"host", required_argument, NULL, O_HOST},
        {"access-key", required_argument, NULL, O_AK},
        {"secret-key", required_argument, NULL, O_SK},
        {"session-token", required_argument, NULL, O_TOKEN},
        {"region", required_argument, NULL, O_REGION},
        {"anonymous", no_argument, NULL, O_ANON},
        {"seed", required_argument, NULL, O_SEED},
        {"fault", required_argument, NULL, O_FAULT},
        {"imds-role", required_argument, NULL, O_IMDS_ROLE},
        {"container-path", required_argument, NULL, O_CONTAINER_PATH},
        {"container-auth-token", required_argument, NULL, O_CONTAINER_AUTH},
        {"issue-ttl-s", required_argument, NULL, O_ISSUE_TTL},
        {"tls-cert", required_argument, NULL, O_TLS_CERT},
        {"tls-key", required_argument, NULL, O_TLS_KEY},
        {"quiet", no_argument, NULL, O_QUIET},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int c;
    unsigned long long v;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_ROOT: cfg.root = optarg; break;
        case O_PORT:
            if (parse_u64(optarg, 65535, &v) != 0)
                return bad_value("port", optarg, "is not a port number");
            cfg.port = (unsigned)v;
            break;
        case O_HOST: cfg.host = optarg; break;
        case O_AK: cfg.access_key = optarg; break;
        case O_SK: cfg.secret_key = optarg; break;
        case O_TOKEN: cfg.session_token = optarg; break;
        case O_REGION: cfg.region = optarg; break;
        case O_ANON: cfg.anonymous = 1; break;
        case O_SEED:
            if (parse_u64(optarg, ~0ull, &v) != 0)
                return bad_value("seed", optarg, "is not a number");
            cfg.seed = v;
            break;
        case O_FAULT:
            if (n_faults == MAX_FAULTS) {
                fprintf(stderr, "shardfeed-mock-s3: at most %d --fault rules\n", MAX_FAULTS);
                return 2;
            }
            faults[n_faults++] = optarg;
            break;
        case O_IMDS_ROLE:
            /* The role is one path segment of the IMDS URL. */
            if (!*optarg || strlen(optarg) > 128 || strpbrk(optarg, "/?#%"))
                return bad_value("imds-role", optarg, "must be 1..128 characters without / ? # %");
            cfg.imds_role = optarg;
            break;
        case O_CONTAINER_PATH:
            if (optarg[0] != '/' || strpbrk(optarg, "?#"))
                return bad_value("container-path", optarg, "must start with / and have no query");
            cfg.container_path = optarg;
            break;
        case O_CONTAINER_AUTH: cfg.container_auth_token = optarg; break;
        case O_ISSUE_TTL:
            if (parse_u64(optarg, 7 * 86400, &v) != 0 || v == 0)
                return bad_value("issue-ttl-s", optarg, "is not 1..604800");
            cfg.issue_ttl_s = (unsigned)v;
            break;
        case O_TLS_CERT: cfg.tls_cert_file = optarg; break;
        case O_TLS_KEY: cfg.tls_key_file = optarg; break;
        case O_QUIET: cfg.quiet = 1; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "shardfeed-mock-s3: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!cfg.root) {
        fprintf(stderr, "shardfeed-mock-s3: --root DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (!*cfg.access_key || !*cfg.secret_key) {
        fprintf(stderr, "shardfeed-mock-s3: --access-key and --secret-key must not be empty\n");
        return 2;
    }
    if (!cfg.tls_cert_file != !cfg.tls_key_file) {
        fprintf(stderr, "shardfeed-mock-s3: --tls-cert and --tls-key go together\n");
        return 2;
    }
    cfg.fault_specs = faults;
    cfg.n_fault_specs = n_faults;

    /* Block the stop signals in every thread (the daemon's threads inherit
     * the mask) and take them synchronously here. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct mock_server *srv = NULL;
    char err[512];
    if (mock_server_start(&cfg, &srv, err, sizeof(err)) != SF_OK) {
        fprintf(stderr, "shardfeed-mock-s3: %s\n", err);
        return 1;
    }
    printf("listening on %s://%s:%u\n", mock_server_scheme(srv), cfg.host, mock_server_port(srv));
    fflush(stdout);

    int sig = 0;
    sigwait(&stop, &sig);
    if (!cfg.quiet)
        fprintf(stderr, "shardfeed-mock-s3: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    mock_server_stop(srv);
    return 0;
}
