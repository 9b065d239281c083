/* Sockets for curl (s3/socket.h). */
#include "s3/socket.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

curl_socket_t sf__socket_open(void *socket_errno, curlsocktype purpose, struct curl_sockaddr *addr)
{
    (void)purpose;
    curl_socket_t s = socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
    if (s == CURL_SOCKET_BAD)
        *(int *)socket_errno = errno;
    return s;
}

void sf__socket_why(int socket_errno, char *msg, size_t cap)
{
    size_t l = strnlen(msg, cap);
    if (!socket_errno || l + 1 >= cap)
        return;
    if (socket_errno == EMFILE || socket_errno == ENFILE)
        snprintf(msg + l, cap - l,
                 " (socket: %s: no file descriptor left for a connection; raise the limit, "
                 "ulimit -n, or lower concurrency)",
                 strerror(socket_errno));
    else
        snprintf(msg + l, cap - l, " (socket: %s)", strerror(socket_errno));
}
