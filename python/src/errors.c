/*
 * shardfeed.Error and its subclasses, one per family of sf_status.
 */
#include "sfpy.h"

#include <string.h>

/* Classes, created once at import (the module is single-phase: one
 * interpreter). */
static PyObject *base_error;
static PyObject *classes[SF_STATUS_COUNT_];

struct family {
    const char *name; /* shardfeed.<name> */
    const char *doc;
    PyObject *std_base; /* a built-in exception it also derives from, or NULL */
    sf_status statuses[5];
};

int sfpy_errors_init(PyObject *module)
{
    base_error = PyErr_NewExceptionWithDoc(
        "shardfeed.Error",
        "A shardfeed operation failed. .status is the sf_status code, .status_name its "
        "identifier (\"SF_ERR_NOT_FOUND\"), .message the library's detail (object, key, "
        "byte offset).",
        NULL, NULL);
    if (!base_error || PyModule_AddObject(module, "Error", base_error) < 0)
        return -1;
    Py_INCREF(base_error); /* PyModule_AddObject stole one */
    const struct family fams[] = {
        {"ConfigError", "A bad option, flag, URL or parameter.", PyExc_ValueError,
         {SF_ERR_INVALID_ARGUMENT}},
        {"NotFoundError", "A bucket, object, key or file does not exist.", NULL,
         {SF_ERR_NOT_FOUND}},
        {"AccessDeniedError", "Credentials missing or refused, or a signature mismatch.", NULL,
         {SF_ERR_ACCESS_DENIED, SF_ERR_SIGNATURE}},
        {"NetworkError",
         "The store could not be reached or kept failing (connection, timeout, HTTP status, "
         "throttling) after the retries.",
         NULL,
         {SF_ERR_NETWORK, SF_ERR_TIMEOUT, SF_ERR_HTTP, SF_ERR_THROTTLED, SF_ERR_RANGE}},
        {"ChangedError", "An object changed (ETag) while it was being read.", NULL,
         {SF_ERR_CHANGED}},
        {"CorruptError", "Data failed a format or checksum check (shard, sample, image).", NULL,
         {SF_ERR_CORRUPT, SF_ERR_PARSE}},
        {"LimitError",
         "A configured limit was hit (for a loader: more batches held than its ring allows).",
         NULL,
         {SF_ERR_LIMIT}},
        {"UnsupportedError", "A feature this build or server lacks.", NULL, {SF_ERR_UNSUPPORTED}},
    };
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        char qual[64];
        snprintf(qual, sizeof(qual), "shardfeed.%s", fams[i].name);
        PyObject *bases = fams[i].std_base ? PyTuple_Pack(2, base_error, fams[i].std_base)
                                           : PyTuple_Pack(1, base_error);
        if (!bases)
            return -1;
        PyObject *cls = PyErr_NewExceptionWithDoc(qual, fams[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (!cls)
            return -1;
        for (size_t k = 0; k < 5 && fams[i].statuses[k] != SF_OK; k++)
            classes[fams[i].statuses[k]] = cls;
        if (PyModule_AddObject(module, fams[i].name, cls) < 0) {
            Py_DECREF(cls);
            return -1;
        }
        Py_INCREF(cls); /* kept in classes[] */
    }
    return 0;
}

PyObject *sfpy_raise(sf_status st, const char *msg)
{
    PyObject *cls = (unsigned)st < SF_STATUS_COUNT_ && classes[st] ? classes[st] : base_error;
    const char *detail = msg && *msg ? msg : sf_status_str(st);
    PyObject *exc = PyObject_CallFunction(cls, "s", detail);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong((long)st);
    PyObject *name = PyUnicode_FromString(sf_status_name(st));
    PyObject *text = PyUnicode_FromString(detail);
    if (code && name && text && PyObject_SetAttrString(exc, "status", code) == 0 &&
        PyObject_SetAttrString(exc, "status_name", name) == 0 &&
        PyObject_SetAttrString(exc, "message", text) == 0)
        PyErr_SetObject(cls, exc);
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(text);
    Py_DECREF(exc);
    return NULL;
}
