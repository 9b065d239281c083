/* What the credentials suite's files share (test_credentials.c: JSON, the
 * local providers, precedence; test_credentials_remote.c: the container and
 * IMDS providers, refresh): a temporary HOME, the mock server, a log sink
 * that keeps what the chain logs, and the chain helpers. */
#ifndef SF_TESTS_CREDENTIALS_FIXTURE_H
#define SF_TESTS_CREDENTIALS_FIXTURE_H

#include "s3/credentials.h"
#include "shardfeed.h"
#include "support/mock_proc.h"

#include <pthread.h>
#include <time.h>

/* Strings that must never show up in a message or a log line. */
#define FAKE_SECRET "FAKE-SECRET-never-print-me"
#define FAKE_TOKEN  "FAKE-TOKEN-never-print-me"
#define MOCK_AK     "mock-ak"
#define MOCK_SECRET "mock-secret-never-print-me"
#define AUTH_TOKEN  "container-auth-never-print-me"

/* the test's directory (HOME is tmp/home), the mock's root, the AWS files */
extern char *tmp;
extern char *root;
extern char cred_path[700], config_path[700];
extern struct mock_proc srv;

#define MAX_LOGS 64
struct cred_logs {
    pthread_mutex_t mu;
    int n;
    enum sf_log_level level[MAX_LOGS];
    char text[MAX_LOGS][2048];
};
/* what capture_log (the chain's log sink in opts()) received */
extern struct cred_logs logs;

/* Log capture, and the checks that no secret is printed or logged. */
void capture_log(void *user, enum sf_log_level level, const char *message);
int count_logs(enum sf_log_level level);
void expect_no_secret(const char *text, const char *where);
void expect_logs_clean(void);
/* The suite's init and fini: a fresh HOME, no AWS variable, IMDS off. */
void clean_env(void);
void setup(void);
void teardown(void);
/* The mock with its own key pair (MOCK_AK, MOCK_SECRET) and extra arguments. */
void start_mock(const char *const *extra);
void write_home_file(const char *rel, const char *text);
/* Chains, getting credentials, and what they must hold (see the .c). */
struct sf__cred_options opts(void);
struct sf__cred_chain *chain_with(const struct sf__cred_options *o);
struct sf__cred_chain *default_chain(void);
void get_ok(struct sf__cred_chain *c, time_t now, struct sf__credentials *cr);
void get_from(struct sf__cred_chain *c, struct sf__credentials *cr, const char *source,
              const char *why);
void expect_fake_keys(const struct sf__credentials *cr, const char *ak);
void expect_issued(const struct sf__credentials *cr, const char *source);
sf_status get_fail(struct sf__cred_chain *c, time_t now, char *err, size_t err_len);
void expect_denied(const struct sf__cred_options *o, const char *frag, char *err, size_t err_len);
/* credentials.NAME of the mock's /_mock/stats; a port nothing listens on;
 * the IMDS and container endpoints pointed at the mock. */
int cred_stat(const char *name);
unsigned closed_port(void);
void use_imds(void);
void use_container_full_uri(void);

#endif
