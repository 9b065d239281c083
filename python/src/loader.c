/*
 * shardfeed._shardfeed.Loader: the C loader for one consumer thread at a
 * time, with the GIL released while it works or waits.
 *
 * Waits are cut in 100 ms steps (sf_loader_next_wait): between them the
 * thread takes the GIL back, hands queued log lines to logging and runs
 * Python's signal handlers, so Ctrl-C stops a blocked next() promptly.
 */
#include "sfpy.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_STEP_MS 100

/* ------------------------------------------------------------ core, slots */

void sfpy_core_incref(struct sfpy_core *c)
{
    atomic_fetch_add(&c->refs, 1);
}

int sfpy_core_owned(const struct sfpy_core *c)
{
    return c->pid == getpid();
}

void sfpy_core_decref(struct sfpy_core *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    /* A forked child has the parent's memory but none of its threads: the
     * loader's mutexes may be held forever there. Leave it alone. */
    if (!sfpy_core_owned(c))
        return;
    sf_loader_close(c->l);
    pthread_mutex_destroy(&c->call_mu);
    free(c);
}

struct sfpy_slot *sfpy_slot_new(struct sfpy_core *core, const struct sf_batch *b)
{
    struct sfpy_slot *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    atomic_init(&s->refs, 1);
    if (pthread_mutex_init(&s->streams_mu, NULL) != 0) {
        free(s);
        return NULL;
    }
    s->core = core;
    s->b = *b;
    return s;
}

void sfpy_slot_incref(struct sfpy_slot *s)
{
    atomic_fetch_add(&s->refs, 1);
}

sf_status sfpy_slot_wait_stream(struct sfpy_slot *s, void *stream)
{
    pthread_mutex_lock(&s->streams_mu);
    size_t i = 0;
    while (i < s->n_streams && s->streams[i] != stream)
        i++;
    sf_status st = SF_ERR_LIMIT;
    if (i < SF_LOADER_RELEASE_STREAMS_MAX)
        st = sf_batch_wait_stream(&s->b, stream);
    if (st == SF_OK && i == s->n_streams)
        s->streams[s->n_streams++] = stream;
    pthread_mutex_unlock(&s->streams_mu);
    return st;
}

void sfpy_slot_decref(struct sfpy_slot *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    struct sfpy_core *c = s->core;
    if (sfpy_core_owned(c)) {
        /* The last reference: no one notes a stream any more. */
        if (s->n_streams == 0 ||
            sf_loader_release_after_streams(c->l, &s->b, s->streams, s->n_streams) == SF_ERR_LIMIT)
            sf_loader_release(c->l, &s->b); /* (bounded above: never refused) */
    }
    pthread_mutex_destroy(&s->streams_mu);
    free(s);
    sfpy_core_decref(c);
}

/* ------------------------------------------------------------ Loader type */

typedef struct {
    PyObject_HEAD
    struct sfpy_core *core; /* NULL once closed */
    /* A batch next() took from the loader while handing the log lines over
     * raised (a logging filter, Ctrl-C in a handler): the next next() returns
     * it, so the exception neither loses a batch nor keeps its slot. */
    struct sfpy_slot *pending;
} loader_object;

static PyTypeObject *loader_type;

/* The core of an open loader in this process, or NULL with an exception. */
static struct sfpy_core *usable(loader_object *self)
{
    if (!self->core) {
        sfpy_raise(SF_ERR_INVALID_ARGUMENT, "the loader is closed");
        return NULL;
    }
    if (!sfpy_core_owned(self->core)) {
        sfpy_raise(SF_ERR_UNSUPPORTED,
                   "this loader was opened by the parent process: its threads do not exist "
                   "after fork(); open a new Loader in the child");
        return NULL;
    }
    return self->core;
}

/* A reference of self's open core for a call that releases the GIL: a
 * close() meanwhile (another thread, a signal handler, a __del__ run by the
 * collector) then only drops the Loader's own reference, and the loader
 * stays open until the call lets go with drop_held(). NULL with the
 * exception when self is closed. */
static struct sfpy_core *hold(loader_object *self)
{
    struct sfpy_core *c = usable(self);
    if (c)
        sfpy_core_incref(c);
    return c;
}

/* The last reference closes the loader, which joins its threads: not with
 * the GIL held. */
static void drop_held(struct sfpy_core *c)
{
    Py_BEGIN_ALLOW_THREADS
    sfpy_core_decref(c);
    Py_END_ALLOW_THREADS
}

/* Hands a pending batch back to the loader (set_epoch, a restore, close). */
static void drop_pending(loader_object *self)
{
    struct sfpy_slot *s = self->pending;
    self->pending = NULL;
    if (s) {
        Py_BEGIN_ALLOW_THREADS
        sfpy_slot_decref(s);
        Py_END_ALLOW_THREADS
    }
}

/* Loader(sources: list[str] | None, options_json: str) */
static int loader_init(PyObject *pyself, PyObject *args, PyObject *kw)
{
    loader_object *self = (loader_object *)pyself;
    static char *kwlist[] = {"sources", "options_json", NULL};
    PyObject *sources = Py_None;
    const char *json = "{}";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Os:Loader", kwlist, &sources, &json))
        return -1;
    if (self->core) {
        PyErr_SetString(PyExc_RuntimeError, "Loader.__init__ called twice");
        return -1;
    }

    struct sf_loader_options o;
    sf_loader_options_init_default(&o);
    void *keep = NULL;
    char err[1024] = "";
    sf_status st = sf_loader_options_from_json(&o, json, &keep, err, sizeof(err));
    if (st != SF_OK) {
        sf_loader_options_free_json(keep);
        sfpy_raise(st, err);
        return -1;
    }

    PyObject *seq = NULL;
    const char **urls = NULL;
    if (sources != Py_None) {
        seq = PySequence_List(sources);
        if (!seq)
            goto fail_py;
        Py_ssize_t n = PyList_Size(seq);
        urls = calloc((size_t)n + 1, sizeof(*urls));
        if (!urls) {
            PyErr_NoMemory();
            goto fail_py;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyList_GetItem(seq, i); /* borrowed */
            if (!PyUnicode_Check(item)) {
                PyErr_Format(PyExc_TypeError, "sources[%zd] is not a str", i);
                goto fail_py;
            }
            /* The list now holds the UTF-8 bytes that urls[] points into. */
            PyObject *utf8 = PyUnicode_AsUTF8String(item);
            if (!utf8 || PyList_SetItem(seq, i, utf8) < 0)
                goto fail_py;
            urls[i] = PyBytes_AsString(utf8);
            if (!urls[i])
                goto fail_py;
            /* C reads up to the NUL: another source than the one given. */
            if (strlen(urls[i]) != (size_t)PyBytes_Size(utf8)) {
                char msg[96];
                snprintf(msg, sizeof(msg), "sources[%zd] holds a NUL character", i);
                sfpy_raise(SF_ERR_INVALID_ARGUMENT, msg);
                goto fail_py;
            }
        }
        o.sources = urls;
        o.source_count = (size_t)n;
    }
    if (o.source_count == 0) {
        sfpy_raise(SF_ERR_INVALID_ARGUMENT,
                   "no sources: give s3:// URLs, patterns, prefixes or paths (or \"sources\" in "
                   "the config)");
        goto fail_py;
    }

    o.log = sfpy_log;
    o.log_level = sfpy_log_level();

    struct sf_loader *l = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = sf_loader_open(&o, &l, err, sizeof(err));
    Py_END_ALLOW_THREADS
    sf_loader_options_free_json(keep);
    keep = NULL;
    free(urls);
    urls = NULL;
    Py_CLEAR(seq);
    if (sfpy_log_drain() < 0) {
        sf_loader_close(l);
        return -1;
    }
    if (st != SF_OK) {
        sfpy_raise(st, err);
        return -1;
    }
    struct sfpy_core *c = calloc(1, sizeof(*c));
    if (!c) {
        sf_loader_close(l);
        PyErr_NoMemory();
        return -1;
    }
    atomic_init(&c->refs, 1);
    c->l = l;
    c->pid = getpid();
    pthread_mutex_init(&c->call_mu, NULL);
    self->core = c;
    return 0;

fail_py:
    sf_loader_options_free_json(keep);
    free(urls);
    Py_XDECREF(seq);
    return -1;
}

static void loader_close_core(loader_object *self)
{
    drop_pending(self);
    struct sfpy_core *c = self->core;
    if (!c)
        return;
    self->core = NULL;
    Py_BEGIN_ALLOW_THREADS
    sfpy_core_decref(c);
    Py_END_ALLOW_THREADS
}

static void loader_dealloc(PyObject *pyself)
{
    loader_close_core((loader_object *)pyself);
    sfpy_free_object(pyself);
}

/* next() with a held reference c of self's core. */
static PyObject *next_held(loader_object *self, struct sfpy_core *c)
{
    int collected = 0;
    for (;;) {
        /* Closed while this call waited or collected: c is still ours, but
         * the user is done with the loader. */
        if (!self->core)
            return sfpy_raise(SF_ERR_INVALID_ARGUMENT, "the loader was closed during next()");
        struct sf_batch b;
        sf_status st;
        char msg[1024];
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&c->call_mu);
        st = sf_loader_next_wait(c->l, &b, WAIT_STEP_MS);
        if (st != SF_OK && st != SF_NOT_READY && st != SF_END_OF_EPOCH)
            snprintf(msg, sizeof(msg), "%s", sf_loader_errmsg(c->l));
        pthread_mutex_unlock(&c->call_mu);
        Py_END_ALLOW_THREADS
        const int drained = sfpy_log_drain();
        if (st == SF_OK) {
            sfpy_core_incref(c);
            struct sfpy_slot *s = sfpy_slot_new(c, &b);
            if (!s) {
                sf_loader_release(c->l, &b);
                sfpy_core_decref(c);
                return PyErr_NoMemory();
            }
            if (drained < 0) {
                self->pending = s;
                return NULL;
            }
            return sfpy_batch_new(s);
        }
        if (drained < 0)
            return NULL;
        if (st == SF_END_OF_EPOCH)
            Py_RETURN_NONE;
        if (st == SF_NOT_READY) {
            if (PyErr_CheckSignals() < 0)
                return NULL;
            continue;
        }
        if (st == SF_ERR_LIMIT && !collected) {
            /* Batches in reference cycles wait for the collector: run it once
             * before calling the ring full. */
            collected = 1;
            /* gc.collect(), not PyGC_Collect(): the latter does nothing
             * while a training script has gc.disable()d. */
            PyObject *gc = PyImport_ImportModule("gc");
            PyObject *r = gc ? PyObject_CallMethod(gc, "collect", NULL) : NULL;
            Py_XDECREF(gc);
            if (!r)
                return NULL;
            Py_DECREF(r);
            continue;
        }
        if (st == SF_ERR_LIMIT)
            snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg),
                     ": a batch is held while it, or a view or tensor made from it, is alive "
                     "(del them or call batch.release()), or raise prefetch_batches");
        return sfpy_raise(st, msg);
    }
}

/* next() -> Batch, or None at the end of the epoch. */
static PyObject *loader_next(PyObject *pyself, PyObject *unused)
{
    (void)unused;
    loader_object *self = (loader_object *)pyself;
    struct sfpy_core *c = hold(self);
    if (!c)
        return NULL;
    PyObject *r;
    if (self->pending) {
        struct sfpy_slot *s = self->pending;
        self->pending = NULL;
        r = sfpy_batch_new(s);
    } else {
        r = next_held(self, c);
    }
    drop_held(c);
    return r;
}

/* A loader call that may block: the arguments of each. */
struct loader_call {
    enum { CALL_SET_EPOCH, CALL_STATE_SAVE, CALL_STATE_RESTORE } op;
    unsigned long long epoch; /* CALL_SET_EPOCH */
    void *buf;                /* CALL_STATE_SAVE: out; CALL_STATE_RESTORE: in */
    size_t len;
};

/* Runs k on self's loader, its core held for the call (hold()), with the
 * GIL released and the core's call_mu locked: 0 with k's status in *st (on
 * failure, the loader's message in msg), or -1 with the exception when self
 * is closed. */
static int run_call(loader_object *self, const struct loader_call *k, sf_status *st, char *msg,
                    size_t n)
{
    struct sfpy_core *c = hold(self);
    if (!c)
        return -1;
    sf_status r = SF_OK;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&c->call_mu);
    switch (k->op) {
    case CALL_SET_EPOCH:
        r = sf_loader_set_epoch(c->l, k->epoch);
        break;
    case CALL_STATE_SAVE:
        r = sf_loader_state_save(c->l, k->buf, k->len);
        break;
    case CALL_STATE_RESTORE:
        r = sf_loader_state_restore(c->l, k->buf, k->len);
        break;
    }
    if (r != SF_OK)
        snprintf(msg, n, "%s", sf_loader_errmsg(c->l));
    pthread_mutex_unlock(&c->call_mu);
    Py_END_ALLOW_THREADS
    drop_held(c);
    *st = r;
    return 0;
}

/* None after k (set_epoch, restore: which move the position, so a pending
 * batch goes back); NULL with the exception when k failed or the log drain
 * raised. */
static PyObject *run_call_none(loader_object *self, const struct loader_call *k)
{
    char msg[1024] = "";
    sf_status st;
    if (run_call(self, k, &st, msg, sizeof(msg)) < 0)
        return NULL;
    if (st == SF_OK)
        drop_pending(self);
    if (sfpy_log_drain() < 0)
        return NULL;
    if (st != SF_OK)
        return sfpy_raise(st, msg);
    Py_RETURN_NONE;
}

static PyObject *loader_set_epoch(PyObject *pyself, PyObject *arg)
{
    if (!usable((loader_object *)pyself))
        return NULL;
    struct loader_call k = {.op = CALL_SET_EPOCH};
    k.epoch = PyLong_AsUnsignedLongLong(arg);
    if (k.epoch == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    return run_call_none((loader_object *)pyself, &k);
}

/* A pending batch (see loader_object) counts as delivered here, as in the
 * loader's own counters. */
static PyObject *loader_state_save(PyObject *pyself, PyObject *unused)
{
    (void)unused;
    unsigned char buf[SF_LOADER_STATE_BYTES];
    struct loader_call k = {.op = CALL_STATE_SAVE, .buf = buf, .len = sizeof(buf)};
    char msg[1024] = "";
    sf_status st;
    if (run_call((loader_object *)pyself, &k, &st, msg, sizeof(msg)) < 0)
        return NULL;
    if (st != SF_OK)
        return sfpy_raise(st, msg);
    return PyBytes_FromStringAndSize((const char *)buf, sizeof(buf));
}

static PyObject *loader_state_restore(PyObject *pyself, PyObject *arg)
{
    if (!usable((loader_object *)pyself))
        return NULL;
    char *data;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &data, &len) < 0)
        return NULL;
    struct loader_call k = {.op = CALL_STATE_RESTORE, .buf = data, .len = (size_t)len};
    return run_call_none((loader_object *)pyself, &k);
}

static PyObject *loader_stats(PyObject *pyself, PyObject *unused)
{
    (void)unused;
    struct sfpy_core *c = usable((loader_object *)pyself);
    if (!c)
        return NULL;
    struct sf_loader_stats s;
    sf_loader_get_stats(c->l, &s);
    PyObject *d = PyDict_New();
#define U(f) sfpy_set_item(d, #f, PyLong_FromUnsignedLongLong((unsigned long long)s.f))
#define F(f) sfpy_set_item(d, #f, PyFloat_FromDouble(s.f))
    int failed = !d || F(elapsed_s) || U(batches_delivered) || U(samples_delivered) ||
                 U(samples_skipped) || U(pad_samples) || U(dropped_samples) || U(samples_read) ||
                 U(samples_decoded) || U(shards_opened) || U(bytes_fetched) || U(bytes_read) ||
                 U(cache_hits) || U(cache_misses) || U(requests) || U(retries) ||
                 F(consumer_wait_s) || F(decode_busy_s) || F(read_busy_s) || F(gpu_copy_s) ||
                 F(images_per_s) || F(decode_per_s) || F(read_per_s) || F(fetch_mib_per_s) ||
                 U(decode_queue) || U(decode_queue_cap) || U(ready_batches) || U(batch_ring) ||
                 U(shards_in_flight) || U(decode_threads) ||
                 sfpy_set_item(d, "on_device", PyBool_FromLong(s.on_device)) || U(epoch) ||
                 U(shards_without_end_marker);
#undef U
#undef F
    return sfpy_dict_filled(d, failed);
}

static PyObject *loader_report(PyObject *pyself, PyObject *arg)
{
    struct sfpy_core *c = usable((loader_object *)pyself);
    if (!c)
        return NULL;
    const int reset = PyObject_IsTrue(arg);
    if (reset < 0)
        return NULL;
    struct sf_loader_report r;
    sf_loader_report(c->l, &r);
    if (reset)
        sf_loader_report_reset(c->l);
    PyObject *d = PyDict_New();
#define U(f) sfpy_set_item(d, #f, PyLong_FromUnsignedLongLong((unsigned long long)r.f))
#define F(f) sfpy_set_item(d, #f, PyFloat_FromDouble(r.f))
    int failed = !d || F(span_s) || U(batches) || U(samples) || F(wait_s) || F(wait_share) ||
                 F(first_wait_s) || F(wait_p50_ms) || F(wait_p99_ms) || F(wait_max_ms) ||
                 F(step_per_s) || F(decode_per_thread_per_s) || F(decode_busy) || F(read_busy) ||
                 F(device_busy) || F(fetch_mib_per_s) ||
                 sfpy_set_item(d, "bound", PyUnicode_FromString(sf_stage_name(r.bound))) ||
                 sfpy_set_item(d, "starving", PyBool_FromLong(r.starving)) ||
                 sfpy_set_item(d, "verdict", PyUnicode_FromString(r.verdict));
#undef U
#undef F
    return sfpy_dict_filled(d, failed);
}

static PyObject *loader_close(PyObject *pyself, PyObject *unused)
{
    (void)unused;
    loader_close_core((loader_object *)pyself);
    if (sfpy_log_drain() < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The epoch's numbers: one getter, its closure says which. */
enum epoch_number {
    EPOCH_BATCHES,
    EPOCH_SAMPLES,
    EPOCH_SIZE_KNOWN,
    EPOCH_DELIVERED,
    EPOCH_CURRENT
};

static PyObject *get_epoch_number(PyObject *pyself, void *which)
{
    struct sfpy_core *c = usable((loader_object *)pyself);
    if (!c)
        return NULL;
    struct sf_loader_stats s;
    switch ((enum epoch_number)(intptr_t)which) {
    case EPOCH_BATCHES:
        return PyLong_FromUnsignedLongLong(sf_loader_epoch_batches(c->l));
    case EPOCH_SAMPLES:
        return PyLong_FromUnsignedLongLong(sf_loader_epoch_samples(c->l));
    case EPOCH_SIZE_KNOWN:
        return PyBool_FromLong(sf_loader_epoch_size_known(c->l));
    case EPOCH_DELIVERED:
        return PyLong_FromUnsignedLongLong(sf_loader_epoch_delivered(c->l));
    case EPOCH_CURRENT:
        break;
    }
    sf_loader_get_stats(c->l, &s);
    return PyLong_FromUnsignedLongLong(s.epoch);
}

static PyObject *get_shards(PyObject *pyself, void *cl)
{
    (void)cl;
    struct sfpy_core *c = usable((loader_object *)pyself);
    if (!c)
        return NULL;
    size_t n = sf_loader_shard_count(c->l);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *v = sfpy_str(sf_loader_shard_url(c->l, i));
        if (!v || PyList_SetItem(list, (Py_ssize_t)i, v) < 0)
            Py_CLEAR(list);
    }
    return list;
}

static PyObject *get_closed(PyObject *pyself, void *cl)
{
    (void)cl;
    return PyBool_FromLong(((loader_object *)pyself)->core == NULL);
}

static PyMethodDef loader_methods[] = {
    {"next", loader_next, METH_NOARGS,
     "The next batch of the epoch, or None when the epoch is over. Raises the loader's error."},
    {"set_epoch", loader_set_epoch, METH_O, "Starts epoch n from its beginning."},
    {"state_save", loader_state_save, METH_NOARGS, "The consumer's position, as bytes."},
    {"state_restore", loader_state_restore, METH_O, "Goes back to a saved position."},
    {"stats", loader_stats, METH_NOARGS, "Counters since open (struct sf_loader_stats)."},
    {"report", loader_report, METH_O,
     "The starvation report of the window (struct sf_loader_report) as a dict; a true "
     "argument starts a new window after it."},
    {"close", loader_close, METH_NOARGS,
     "Closes the loader once no batch, view or tensor of it is alive."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef loader_getset[] = {
    {"epoch_batches", get_epoch_number, NULL, "batches of this rank's epoch",
     (void *)(intptr_t)EPOCH_BATCHES},
    {"epoch_samples", get_epoch_number, NULL, "samples of this rank's epoch",
     (void *)(intptr_t)EPOCH_SAMPLES},
    {"epoch_size_known", get_epoch_number, NULL, "the epoch size is exact",
     (void *)(intptr_t)EPOCH_SIZE_KNOWN},
    {"epoch_delivered", get_epoch_number, NULL,
     "samples of this rank's epoch delivered so far (pads included)",
     (void *)(intptr_t)EPOCH_DELIVERED},
    {"epoch", get_epoch_number, NULL, "the current epoch", (void *)(intptr_t)EPOCH_CURRENT},
    {"shards", get_shards, NULL, "shard URLs, in index order", NULL},
    {"closed", get_closed, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot loader_slots[] = {
    {Py_tp_init, loader_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, loader_dealloc},
    {Py_tp_methods, loader_methods},
    {Py_tp_getset, loader_getset},
    {Py_tp_doc, "The C loader (use shardfeed.Loader)."},
    {0, NULL},
};

static PyType_Spec loader_spec = {
    "shardfeed._shardfeed.Loader", sizeof(loader_object), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, loader_slots,
};

int sfpy_loader_init(PyObject *module)
{
    loader_type = sfpy_add_type(module, &loader_spec, "Loader");
    return loader_type ? 0 : -1;
}
