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
#include <sys/types.h>

/* ------------------------------------------------------------ errors.c */

/* Creates shardfeed.Error and its subclasses and adds them to module. */
int sfpy_errors_init(PyObject *module);
/* Raises the exception class of st with message msg (the C detail: object,
 * key, offset); the exception carries .status (int), .status_name and
 * .message. Returns NULL for `return sfpy_raise(...)`. */
PyObject *sfpy_raise(sf_status st, const char *msg);

/* ------------------------------------------------------------ logq.c */

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

/* ------------------------------------------------------------ loader.c, batch.c, dlpack.c */

int sfpy_loader_init(PyObject *module);
int sfpy_batch_init(PyObject *module);

/* ------------------------------------------------------------ tools.c */

/* ls, stat, warm_cache, pack, index: module-level functions. */
int sfpy_tools_init(PyObject *module);

/* Options shared by the tools: S3 options from keyword arguments
 * (endpoint_url, region, profile, no_sign_request, concurrency, chunk_size,
 * max_attempts) given as a JSON object text, parsed with the loader's JSON
 * option parser so the names and checks are the same. */

#endif /* SFPY_H */
