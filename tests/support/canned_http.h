/* Test support: a one-thread HTTP/1.1 server on loopback that answers each
 * request with a canned response, for the answers of real S3-compatible
 * stores the mock does not give (redirects, bare ETags, odd listing pages).
 * Each connection carries one request (the answers say Connection: close). */
#ifndef SF_TEST_CANNED_HTTP_H
#define SF_TEST_CANNED_HTTP_H

#include <pthread.h>
#include <stddef.h>

#define CANNED_MAX_REQUESTS 16

struct canned_http {
    int fd;
    unsigned port;
    char url[64]; /* "http://127.0.0.1:PORT" */
    pthread_t th;
    /* the answers, whole (status line, headers, blank line, body); request i
     * gets answers[i], or the last one past the end */
    const char *const *answers;
    size_t n_answers;
    pthread_mutex_t lock;
    size_t n_requests;                        /* under lock */
    char requests[CANNED_MAX_REQUESTS][4096]; /* head of each request, under lock */
};

/* Starts the server (cr_assert on failure) with n answers, which must stay
 * valid until canned_http_stop(). */
void canned_http_start(struct canned_http *c, const char *const *answers, size_t n);
/* Stops the thread and closes the socket. */
void canned_http_stop(struct canned_http *c);
/* Requests answered so far. */
size_t canned_http_requests(struct canned_http *c);
/* A copy of the head (request line and headers) of request i into out. */
void canned_http_request(struct canned_http *c, size_t i, char *out, size_t cap);

#endif
