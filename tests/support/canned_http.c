#include "support/canned_http.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void *canned_main(void *arg)
{
    struct canned_http *c = arg;
    for (;;) {
        int s = accept(c->fd, NULL, NULL);
        if (s < 0)
            return NULL;
        char req[4096];
        size_t n = 0;
        while (n + 1 < sizeof(req)) {
            ssize_t k = read(s, req + n, sizeof(req) - 1 - n);
            if (k <= 0)
                break;
            n += (size_t)k;
            req[n] = '\0';
            if (strstr(req, "\r\n\r\n"))
                break;
        }
        req[n] = '\0';
        if (!strstr(req, "\r\n\r\n")) {
            close(s);
            continue;
        }
        pthread_mutex_lock(&c->lock);
        size_t i = c->n_requests++;
        if (i < CANNED_MAX_REQUESTS)
            snprintf(c->requests[i], sizeof(c->requests[i]), "%s", req);
        pthread_mutex_unlock(&c->lock);
        const char *a = c->answers[i < c->n_answers ? i : c->n_answers - 1];
        size_t len = strlen(a), done = 0;
        while (done < len) {
            ssize_t k = write(s, a + done, len - done);
            if (k <= 0)
                break;
            done += (size_t)k;
        }
        shutdown(s, SHUT_WR);
        /* let the client read the answer and close first */
        while (read(s, req, sizeof(req)) > 0)
            ;
        close(s);
    }
}

void canned_http_start(struct canned_http *c, const char *const *answers, size_t n)
{
    memset(c, 0, sizeof(*c));
    cr_assert(n > 0);
    c->answers = answers;
    c->n_answers = n;
    pthread_mutex_init(&c->lock, NULL);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(c->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(bind(c->fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    cr_assert(listen(c->fd, 64) == 0);
    socklen_t len = sizeof(a);
    cr_assert(getsockname(c->fd, (struct sockaddr *)&a, &len) == 0);
    c->port = ntohs(a.sin_port);
    snprintf(c->url, sizeof(c->url), "http://127.0.0.1:%u", c->port);
    cr_assert(pthread_create(&c->th, NULL, canned_main, c) == 0);
}

void canned_http_stop(struct canned_http *c)
{
    shutdown(c->fd, SHUT_RDWR);
    pthread_join(c->th, NULL);
    close(c->fd);
    pthread_mutex_destroy(&c->lock);
}

size_t canned_http_requests(struct canned_http *c)
{
    pthread_mutex_lock(&c->lock);
    size_t n = c->n_requests;
    pthread_mutex_unlock(&c->lock);
    return n;
}

void canned_http_request(struct canned_http *c, size_t i, char *out, size_t cap)
{
    pthread_mutex_lock(&c->lock);
    snprintf(out, cap, "%s", i < c->n_requests && i < CANNED_MAX_REQUESTS ? c->requests[i] : "");
    pthread_mutex_unlock(&c->lock);
}
