/*
 * The library's log lines, from any of its threads, to Python's logging.
 *
 * Loader threads never take the GIL (a thread that waits for it while the
 * consumer holds it and joins that thread would deadlock, and at interpreter
 * exit it would hang): sfpy_log() only queues the line; the consumer thread
 * hands the queue to logging.getLogger("shardfeed") between its waits
 * (every 100 ms while next() blocks) and after each call. At most
 * QUEUE_MAX lines wait; beyond that lines are counted and the count is
 * logged as a warning with the next drain.
 */
#include "sfpy.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUEUE_MAX 1024

struct line {
    enum sf_log_level level;
    char *text;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct line queue[QUEUE_MAX];
static unsigned head, count;
static unsigned long long dropped;

void sfpy_log(void *user, enum sf_log_level level, const char *message)
{
    (void)user;
    char *copy = strdup(message ? message : "");
    pthread_mutex_lock(&mu);
    if (!copy || count == QUEUE_MAX) {
        dropped++;
        pthread_mutex_unlock(&mu);
        free(copy);
        return;
    }
    queue[(head + count) % QUEUE_MAX] = (struct line){level, copy};
    count++;
    pthread_mutex_unlock(&mu);
}

/* A fork may happen while a loader thread holds mu: the child (which has
 * none of the parent's loader threads) starts with a fresh queue. The lines
 * queued in the parent stay the parent's to log. */
static void reset_in_child(void)
{
    pthread_mutex_init(&mu, NULL);
    head = count = 0;
    dropped = 0;
}

int sfpy_log_init(void)
{
    return pthread_atfork(NULL, NULL, reset_in_child) == 0 ? 0 : -1;
}

static int py_level(enum sf_log_level l)
{
    switch (l) {
    case SF_LOG_ERROR:
        return 40;
    case SF_LOG_WARN:
        return 30;
    case SF_LOG_INFO:
        return 20;
    default:
        return 10;
    }
}

static PyObject *get_logger(void)
{
    PyObject *logging = PyImport_ImportModule("logging");
    if (!logging)
        return NULL;
    PyObject *logger = PyObject_CallMethod(logging, "getLogger", "s", "shardfeed");
    Py_DECREF(logging);
    return logger;
}

int sfpy_log_drain(void)
{
    pthread_mutex_lock(&mu);
    if (count == 0 && dropped == 0) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    unsigned n = count;
    struct line taken[QUEUE_MAX];
    for (unsigned i = 0; i < n; i++)
        taken[i] = queue[(head + i) % QUEUE_MAX];
    head = (head + n) % QUEUE_MAX;
    count = 0;
    unsigned long long lost = dropped;
    dropped = 0;
    pthread_mutex_unlock(&mu);

    /* Keep any exception already set (a KeyboardInterrupt on its way up). */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    int rc = 0;
    PyObject *logger = get_logger();
    for (unsigned i = 0; i < n; i++) {
        if (logger && rc == 0) {
            /* Lines quote keys as the shard holds them, in any bytes. */
            PyObject *text = PyUnicode_DecodeUTF8(taken[i].text, (Py_ssize_t)strlen(taken[i].text),
                                                  "backslashreplace");
            PyObject *r = text ? PyObject_CallMethod(logger, "log", "iO", py_level(taken[i].level),
                                                     text)
                               : NULL;
            Py_XDECREF(text);
            if (!r)
                rc = -1;
            Py_XDECREF(r);
        }
        free(taken[i].text);
    }
    if (logger && rc == 0 && lost) {
        char msg[96];
        snprintf(msg, sizeof(msg), "%llu log lines dropped: the queue was full", lost);
        PyObject *r = PyObject_CallMethod(logger, "log", "is", 30, msg);
        Py_XDECREF(r);
        if (!r)
            rc = -1;
    }
    if (!logger)
        rc = -1;
    Py_XDECREF(logger);
    if (et) {
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
    return rc;
}

enum sf_log_level sfpy_log_level(void)
{
    PyObject *logger = get_logger();
    if (!logger) {
        PyErr_Clear();
        return SF_LOG_WARN;
    }
    enum sf_log_level out = SF_LOG_ERROR;
    const enum sf_log_level ls[] = {SF_LOG_DEBUG, SF_LOG_INFO, SF_LOG_WARN};
    for (size_t i = 0; i < 3; i++) {
        PyObject *r = PyObject_CallMethod(logger, "isEnabledFor", "i", py_level(ls[i]));
        int on = r ? PyObject_IsTrue(r) : 0;
        Py_XDECREF(r);
        if (!r)
            PyErr_Clear();
        if (on > 0) {
            out = ls[i];
            break;
        }
    }
    Py_DECREF(logger);
    return out;
}
