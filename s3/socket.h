/*
 * The sockets curl opens for us: close-on-exec (a training script's
 * subprocesses must not inherit connections), and why socket() failed kept,
 * since curl then says only "Couldn't connect to server".
 */
#ifndef SF_S3_SOCKET_H
#define SF_S3_SOCKET_H

#include <curl/curl.h>
#include <stddef.h>

/* A CURLOPT_OPENSOCKETFUNCTION; its data is an int that receives errno
 * when socket() fails (left as it is otherwise). */
curl_socket_t sf__socket_open(void *socket_errno, curlsocktype purpose, struct curl_sockaddr *addr);

/* Appends to msg (within cap bytes) what socket_errno says, with the remedy
 * when the process is out of descriptors; nothing when it is 0. */
void sf__socket_why(int socket_errno, char *msg, size_t cap);

#endif
