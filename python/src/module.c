/*
 * `shardfeed._shardfeed`: module definition. The Python package
 * (python/shardfeed/) wraps these types and functions.
 */
#include "sfpy.h"

PyTypeObject *sfpy_add_type(PyObject *module, PyType_Spec *spec, const char *name)
{
    PyTypeObject *t = (PyTypeObject *)PyType_FromSpec(spec);
    if (!t)
        return NULL;
    Py_INCREF(t);
    if (PyModule_AddObject(module, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

void sfpy_free_object(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *py_version(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(sf_version());
}

static PyObject *py_cuda_compiled(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyBool_FromLong(sf_cuda_compiled());
}

static PyObject *py_drain_log(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    if (sfpy_log_drain() < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"version", py_version, METH_NOARGS, "The C library's version string."},
    {"cuda_compiled", py_cuda_compiled, METH_NOARGS, "Whether this build has the CUDA path."},
    {"drain_log", py_drain_log, METH_NOARGS,
     "Hands queued library log lines to logging.getLogger('shardfeed')."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_shardfeed",
    "The C core of shardfeed: loader, batches (DLPack), tools.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__shardfeed(void);
PyMODINIT_FUNC PyInit__shardfeed(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (sfpy_log_init() < 0) {
        Py_DECREF(m);
        return PyErr_Format(PyExc_ImportError, "shardfeed: pthread_atfork failed");
    }
    if (sfpy_errors_init(m) < 0 || sfpy_batch_init(m) < 0 || sfpy_loader_init(m) < 0 ||
        sfpy_tools_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
