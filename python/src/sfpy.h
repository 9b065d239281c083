/*
 * The `_shardfeed` extension module: declarations shared by its files.
 *
 * Written against CPython's limited API (Py_LIMITED_API, set by the build):
 * no struct internals, types from PyType_Spec, one abi3 module for every
 * Python from 3.9 on.
 *
 * Ownership across threads (docs/python.md "Lifetimes"): the loader's memory
 * is held by C reference counts (struct sfpy_core, struct sfpy_slot), never by
 * Python objects, so DLPack deleters, which consumers may call from any
 * thread without the GIL, only touch atomics and sf_loader_release().
 */
#ifndef SFPY_H
#define SFPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "shardfeed.h"
#include "shardfeed_loader.h"

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

/* ------------------------------------------------------------ module.c */

/* The type made from spec, added to module as name (the module holds one
 * reference, the caller the other); NULL with the exception. */
PyTypeObject *sfpy_add_type(PyObject *module, PyType_Spec *spec, const char *name);
/* The end of every tp_dealloc: tp_free of self's heap type, then the
 * reference self held on its type. */
void sfpy_free_object(PyObject *self);

/* ------------------------------------------------------------ dicts (tools.c) */

/* d[key] = v, dropping v (NULL v: -1, the exception of its making). -1 on failure. */
int sfpy_set_item(PyObject *d, const char *key, PyObject *v);
int sfpy_set_u64(PyObject *d, const char *key, unsigned long long v);
/* s as str (NULL: None), undecodable bytes replaced. */
int sfpy_set_str(PyObject *d, const char *key, const char *s);
/* d once filled, or NULL (dropping d) when failed: a dict built as
 * `return sfpy_dict_filled(d, !d || set(...) || set(...))`. */
PyObject *sfpy_dict_filled(PyObject *d, int failed);

/* ------------------------------------------------------------ errors.c */

/* Looks up shardfeed.Error and its subclasses (shardfeed._errors) and adds
 * them to module. */
int sfpy_errors_init(PyObject *module);
/* Raises the exception class of st with message msg (the C detail: object,
 * key, offset); the exception carries .status (int), .status_name and
 * .message. Returns NULL for `return sfpy_raise(...)`. */
PyObject *sfpy_raise(sf_status st, const char *msg);

/* ------------------------------------------------------------ logq.c */

/* Once, at import: the queue's fork handler. */
int sfpy_log_init(void);
/* The C log sink of every loader and tool call: queues the line (bounded,
 * any thread, no GIL). */
void sfpy_log(void *user, enum sf_log_level level, const char *message);
/* Hands queued lines to logging.getLogger("shardfeed"). Needs the GIL; called
 * by the consumer thread between waits. Returns -1 with an exception set if
 * logging raised. */
int sfpy_log_drain(void);
/* The most detailed level any handler of the "shardfeed" logger would take,
 * as an sf_log_level (so the library does not format what nobody reads). */
enum sf_log_level sfpy_log_level(void);

/* ------------------------------------------------------------ loader.c */

#include <pthread.h>

/* One open sf_loader, shared by the Loader object and every batch and view
 * made from it; closed when the last of them lets go. */
struct sfpy_core {
    atomic_long refs;
    struct sf_loader *l;
    pid_t pid;               /* the process that opened it: a forked child never touches it */
    pthread_mutex_t call_mu; /* one consumer call at a time (taken without the GIL) */
};
void sfpy_core_incref(struct sfpy_core *c);
/* The last reference closes the loader (sf_loader_close), without the GIL
 * being needed; in a forked child nothing is touched. */
void sfpy_core_decref(struct sfpy_core *c);
/* 1 in the process that opened c. */
int sfpy_core_owned(const struct sfpy_core *c);

/* One delivered batch: a ring slot, held by the Batch object and by every
 * view (Array) and DLPack export of it. */
struct sfpy_slot {
    atomic_long refs;
    struct sfpy_core *core;
    struct sf_batch b;
    /* The CUDA streams consumers read the device buffers on (DLPack
     * stream=), each once: the release is ordered after the work queued on
     * every one of them (sf_loader_release_after_streams). Under streams_mu. */
    pthread_mutex_t streams_mu;
    void *streams[SF_LOADER_RELEASE_STREAMS_MAX];
    size_t n_streams;
};
/* Takes over one core reference. */
struct sfpy_slot *sfpy_slot_new(struct sfpy_core *core, const struct sf_batch *b);
void sfpy_slot_incref(struct sfpy_slot *s);
/* The last reference hands the slot back (sf_loader_release, any thread). */
void sfpy_slot_decref(struct sfpy_slot *s);
/* Makes `stream` wait for the slot's device copy (sf_batch_wait_stream) and
 * notes it for the release. A stream beyond SF_LOADER_RELEASE_STREAMS_MAX
 * distinct ones is refused with SF_ERR_LIMIT before it waits. */
sf_status sfpy_slot_wait_stream(struct sfpy_slot *s, void *stream);

int sfpy_loader_init(PyObject *module);

/* ------------------------------------------------------------ batch.c */

int sfpy_batch_init(PyObject *module);
/* s (NULL: "") as str, undecodable bytes as surrogates. */
PyObject *sfpy_str(const char *s);
/* A new shardfeed.Batch owning one reference of slot. */
PyObject *sfpy_batch_new(struct sfpy_slot *slot);
/* tp_new of Batch and Array, which only the loader and a batch make: refuses. */
PyObject *sfpy_new_refused(PyTypeObject *t, PyObject *a, PyObject *k);

/* ------------------------------------------------------------ dlpack.c */

enum sfpy_dtype { SFPY_U8, SFPY_F32, SFPY_I64, SFPY_U32 };
/* SFPY_EMULATED: memory of the emulated device (device="emulated",
 * docs/gpu.md): no framework can read it, DLPack export refuses. */
enum sfpy_device { SFPY_CPU, SFPY_CUDA, SFPY_EMULATED };

int sfpy_array_init(PyObject *module);
/* A new shardfeed.Array: a view of data (owned by slot, which it takes a
 * reference of) with ndim <= 4 dimensions, C-contiguous. */
PyObject *sfpy_array_new(struct sfpy_slot *slot, void *data, enum sfpy_dtype dtype, int ndim,
                         const int64_t *shape, enum sfpy_device dev, int dev_id);

/* ------------------------------------------------------------ tools.c */

/* ls, stat, warm_cache, pack, index: module-level functions. Their S3
 * options arrive as JSON text and go through the loader's JSON option parser,
 * so the names and checks are the same. */
int sfpy_tools_init(PyObject *module);

#endif /* SFPY_H */
