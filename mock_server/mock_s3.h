/* The mock S3 server: libmicrohttpd daemon, request routing, SigV4 checks,
 * S3 operations and fault injection. */
#ifndef SF_MOCK_S3_H
#define SF_MOCK_S3_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>

struct mock_config {
    const char *root;
    const char *host; /* IPv4 address to bind, "127.0.0.1" */
    unsigned port;    /* 0 = any free port */
    const char *access_key;
    const char *secret_key;
    const char *session_token; /* NULL = none required; issued tokens also pass */
    const char *region;
    int anonymous; /* accept unsigned requests */
    uint64_t seed;
    int quiet;
    const char *const *fault_specs;
    size_t n_fault_specs;
    /* Credential endpoints (docs/mock-server.md, "Credential endpoints"). */
    const char *imds_role;            /* role listed by IMDS, "mock-role" when NULL */
    const char *container_path;       /* extra container-credentials path, or NULL */
    const char *container_auth_token; /* required Authorization value, or NULL */
    unsigned issue_ttl_s;             /* lifetime of issued credentials, 0 = 3600 */
    /* TLS: both PEM files or neither; read once by mock_server_start(). */
    const char *tls_cert_file;
    const char *tls_key_file;
};

struct mock_server;

/* Starts the daemon; on failure writes the reason into err. Strings in cfg
 * are borrowed until mock_server_stop(). */
sf_status mock_server_start(const struct mock_config *cfg, struct mock_server **out, char *err,
                            size_t err_len);
unsigned mock_server_port(const struct mock_server *srv);
/* "https" when the daemon runs TLS, else "http". */
const char *mock_server_scheme(const struct mock_server *srv);
/* Cuts open transfers, stops the daemon and frees everything. NULL is a no-op. */
void mock_server_stop(struct mock_server *srv);

#endif
