/*
 * Raising shardfeed.Error and its subclasses (python/shardfeed/_errors.py)
 * with the status and message of a failure.
 */
#include "sfpy.h"

#include <string.h>

/* Classes, looked up once at import (the module is single-phase: one
 * interpreter). */
static PyObject *base_error;
static PyObject *classes[SF_STATUS_COUNT_];

int sfpy_errors_init(PyObject *module)
{
    PyObject *mod = PyImport_ImportModule("shardfeed._errors");
    if (!mod)
        return -1;
    const struct {
        const char *name;
        sf_status statuses[5];
    } fams[] = {
        {"Error", {SF_OK}},
        {"ConfigError", {SF_ERR_INVALID_ARGUMENT}},
        {"NotFoundError", {SF_ERR_NOT_FOUND}},
        {"AccessDeniedError", {SF_ERR_ACCESS_DENIED, SF_ERR_SIGNATURE}},
        {"NetworkError",
         {SF_ERR_NETWORK, SF_ERR_TIMEOUT, SF_ERR_HTTP, SF_ERR_THROTTLED, SF_ERR_RANGE}},
        {"ChangedError", {SF_ERR_CHANGED}},
        {"CorruptError", {SF_ERR_CORRUPT, SF_ERR_PARSE}},
        {"LimitError", {SF_ERR_LIMIT}},
        {"UnsupportedError", {SF_ERR_UNSUPPORTED}},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]) && rc == 0; i++) {
        PyObject *cls = PyObject_GetAttrString(mod, fams[i].name);
        if (!cls) {
            rc = -1;
            break;
        }
        if (i == 0)
            base_error = cls; /* keeps the reference */
        for (size_t k = 0; k < 5 && fams[i].statuses[k] != SF_OK; k++)
            classes[fams[i].statuses[k]] = cls;
        Py_INCREF(cls); /* one for the module attribute */
        if (PyModule_AddObject(module, fams[i].name, cls) < 0) {
            Py_DECREF(cls);
            rc = -1;
        }
        /* the classes[] / base_error reference stays: it lives as long as the process */
    }
    Py_DECREF(mod);
    return rc;
}

PyObject *sfpy_raise(sf_status st, const char *msg)
{
    PyObject *cls = (unsigned)st < SF_STATUS_COUNT_ && classes[st] ? classes[st] : base_error;
    const char *detail = msg && *msg ? msg : sf_status_str(st);
    /* Messages quote keys and names as the shard holds them: bytes that are
     * not UTF-8 (a Latin-1 tar member name) must not turn the failure into
     * a UnicodeDecodeError. */
    PyObject *text = PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail), "backslashreplace");
    if (!text)
        return NULL;
    PyObject *exc = PyObject_CallFunction(cls, "Ois", text, (int)st, sf_status_name(st));
    Py_DECREF(text);
    if (!exc)
        return NULL;
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}
