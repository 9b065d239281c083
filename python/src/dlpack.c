/*
 * shardfeed.Array: a zero-copy view of one buffer of a batch (images,
 * labels, flags), exported through DLPack (__dlpack__, __dlpack_device__)
 * and NumPy's __array_interface__.
 *
 * The DLPack structures below are written from the specification
 * (dmlc/dlpack, include/dlpack/dlpack.h, ABI 1.x): only the members and
 * constants this producer uses. Capsules: "dltensor" holding a
 * DLManagedTensor (legacy, the default), or "dltensor_versioned" holding a
 * DLManagedTensorVersioned when the consumer passes max_version >= (1, 0).
 * A consumer renames the capsule to "used_..." when it takes the tensor
 * over and later calls its deleter; an unconsumed capsule's destructor
 * calls the deleter itself.
 *
 * Each export holds a reference of the batch's slot (struct sfpy_slot): the
 * ring slot goes back to the loader only after the Batch, every Array and
 * every tensor made from them are freed. Deleters touch no Python object,
 * so consumers may run them on any thread without the GIL.
 */
#include "sfpy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ DLPack ABI */

enum { DL_CPU = 1, DL_CUDA = 2, DL_EXT = 12 };           /* DLDeviceType (12: kDLExtDev) */
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2 };        /* DLDataTypeCode */
#define DL_FLAG_IS_COPIED (UINT64_C(1) << 1)            /* DLPACK_FLAG_BITMASK_IS_COPIED */

typedef struct {
    int32_t device_type; /* an enum of int size in the C header */
    int32_t device_id;
} dl_device;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} dl_dtype;

typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements */
    uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
    dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *self);
} dl_managed;

typedef struct {
    uint32_t major, minor;
} dl_version;

typedef struct dl_managed_versioned {
    dl_version version;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_versioned *self);
    uint64_t flags;
    dl_tensor dl_tensor;
} dl_managed_versioned;

#define DL_MAJOR 1
#define DL_MINOR 0

/* ------------------------------------------------------------ the view */

typedef struct {
    PyObject_HEAD
    struct sfpy_slot *slot;
    void *data;
    enum sfpy_dtype dtype;
    enum sfpy_device dev;
    int dev_id;
    int ndim;
    int64_t shape[4];
} array_object;

static PyTypeObject *array_type;

static const struct {
    const char *name;
    const char *typestr; /* NumPy __array_interface__ */
    uint8_t code, bits;
} dtypes[] = {
    [SFPY_U8] = {"uint8", "|u1", DL_UINT, 8},
    [SFPY_F32] = {"float32", "<f4", DL_FLOAT, 32},
    [SFPY_I64] = {"int64", "<i8", DL_INT, 64},
    [SFPY_U32] = {"uint32", "<u4", DL_UINT, 32},
};

static size_t array_nbytes(const array_object *a)
{
    size_t n = dtypes[a->dtype].bits / 8;
    for (int i = 0; i < a->ndim; i++)
        n *= (size_t)a->shape[i];
    return n;
}

PyObject *sfpy_array_new(struct sfpy_slot *slot, void *data, enum sfpy_dtype dtype, int ndim,
                         const int64_t *shape, enum sfpy_device dev, int dev_id)
{
    array_object *a = (array_object *)PyType_GenericAlloc(array_type, 0);
    if (!a)
        return NULL;
    sfpy_slot_incref(slot);
    a->slot = slot;
    a->data = data;
    a->dtype = dtype;
    a->dev = dev;
    a->dev_id = dev_id;
    a->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        a->shape[i] = shape[i];
    return (PyObject *)a;
}

static void array_dealloc(PyObject *self)
{
    array_object *a = (array_object *)self;
    if (a->slot)
        sfpy_slot_decref(a->slot);
    sfpy_free_object(self);
}

/* One export: the managed tensor the consumer sees, and what it keeps alive. */
struct export {
    union {
        dl_managed legacy;
        dl_managed_versioned v;
    } m;
    int versioned;
    int64_t shape[4], strides[4];
    struct sfpy_slot *slot;
    void *copy; /* copy=True: a private copy of the data (malloc) */
};

static void export_free(struct export *e)
{
    if (e->slot)
        sfpy_slot_decref(e->slot);
    free(e->copy);
    free(e);
}

static void deleter_legacy(dl_managed *m)
{
    if (m)
        export_free((struct export *)m->manager_ctx);
}

static void deleter_versioned(dl_managed_versioned *m)
{
    if (m)
        export_free((struct export *)m->manager_ctx);
}

static void capsule_legacy_destructor(PyObject *cap)
{
    /* Consumed capsules were renamed "used_dltensor": their deleter is the
     * consumer's to call. */
    if (PyCapsule_IsValid(cap, "dltensor")) {
        dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        if (m && m->deleter)
            m->deleter(m);
    }
}

static void capsule_versioned_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        dl_managed_versioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m && m->deleter)
            m->deleter(m);
    }
}

static int parse_version(PyObject *mv, int *versioned)
{
    *versioned = 0;
    if (mv == NULL || mv == Py_None)
        return 0;
    PyObject *major = PySequence_Check(mv) && PySequence_Size(mv) == 2
                          ? PySequence_GetItem(mv, 0)
                          : NULL;
    if (!major) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "max_version must be a (major, minor) tuple or None");
        return -1;
    }
    long v = PyLong_AsLong(major);
    Py_DECREF(major);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *versioned = v >= 1;
    return 0;
}

/* A batch read on more streams than its release can wait for. */
static PyObject *limit_error(void)
{
    char msg[224];
    snprintf(msg, sizeof msg,
             "__dlpack__: this batch was exported to %d CUDA streams already, the most its "
             "release can wait for: make this stream wait on one of those and export on that "
             "one",
             SF_LOADER_RELEASE_STREAMS_MAX);
    return sfpy_raise(SF_ERR_LIMIT, msg);
}

static PyObject *array_dlpack(PyObject *self, PyObject *args, PyObject *kw)
{
    array_object *a = (array_object *)self;
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_dev = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream, &max_version,
                                     &dl_dev, &copy))
        return NULL;
    int versioned;
    if (parse_version(max_version, &versioned) < 0)
        return NULL;
    if (a->dev == SFPY_EMULATED) {
        PyErr_SetString(PyExc_BufferError,
                        "shardfeed.Array: memory of the emulated device (device=\"emulated\") "
                        "cannot be exported; the batch's host_images holds the same bytes");
        return NULL;
    }
    int32_t dev_type = a->dev == SFPY_CUDA ? DL_CUDA : DL_CPU;
    if (dl_dev != Py_None) {
        long t = -1, id = -1;
        PyObject *t0 = PySequence_Check(dl_dev) ? PySequence_GetItem(dl_dev, 0) : NULL;
        PyObject *t1 = t0 ? PySequence_GetItem(dl_dev, 1) : NULL;
        if (t0 && t1) {
            t = PyLong_AsLong(t0);
            id = PyLong_AsLong(t1);
        }
        Py_XDECREF(t0);
        Py_XDECREF(t1);
        if (PyErr_Occurred())
            return NULL;
        if (t != dev_type || id != (dev_type == DL_CPU ? 0 : a->dev_id)) {
            PyErr_SetString(PyExc_BufferError,
                            "shardfeed.Array: dl_device differs from the array's device; "
                            "copy across devices with the consumer library");
            return NULL;
        }
    }
    const int want_copy = copy == Py_None ? 0 : PyObject_IsTrue(copy);
    if (want_copy < 0)
        return NULL;
    if (want_copy && a->dev != SFPY_CPU) {
        PyErr_SetString(PyExc_BufferError,
                        "shardfeed.Array: copy=True is supported for host arrays only");
        return NULL;
    }
    /* The array API: on a device without streams only None is accepted;
     * on CUDA an integer >= -1 (anything else would be used as a handle). */
    if (a->dev != SFPY_CUDA && stream != Py_None) {
        PyErr_Format(PyExc_ValueError,
                     "__dlpack__: a %s array takes stream=None only (it has no streams)",
                     a->dev == SFPY_CPU ? "host" : "emulated-device");
        return NULL;
    }
    if (a->dev == SFPY_CUDA && stream != Py_None) {
        long long s = PyLong_AsLongLong(stream);
        if (s == -1 && PyErr_Occurred())
            return NULL;
        if (s == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "__dlpack__: stream 0 is ambiguous for CUDA (use 1 or 2)");
            return NULL;
        }
        if (s < -1) {
            PyErr_Format(PyExc_ValueError,
                         "__dlpack__: stream %lld is not a CUDA stream (-1, 1, 2 or a handle)", s);
            return NULL;
        }
        if (s != -1) {
            /* The consumer's stream waits on the batch's copy event: no
             * host synchronisation. */
            sf_status st = sfpy_slot_wait_stream(a->slot, (void *)(uintptr_t)s);
            if (st == SF_ERR_LIMIT)
                return limit_error();
            if (st != SF_OK)
                return sfpy_raise(st, "cannot make the consumer's stream wait for the batch");
        }
    } else if (a->dev == SFPY_CUDA) {
        /* None: the legacy default stream (the array API's rule). */
        sf_status st = sfpy_slot_wait_stream(a->slot, (void *)(uintptr_t)1);
        if (st == SF_ERR_LIMIT)
            return limit_error();
        if (st != SF_OK)
            return sfpy_raise(st, "cannot make the default stream wait for the batch");
    }

    struct export *e = calloc(1, sizeof(*e));
    if (!e)
        return PyErr_NoMemory();
    void *data = a->data;
    if (want_copy) {
        size_t n = array_nbytes(a);
        e->copy = malloc(n ? n : 1);
        if (!e->copy) {
            free(e);
            return PyErr_NoMemory();
        }
        memcpy(e->copy, a->data, n);
        data = e->copy;
    }
    int64_t stride = 1;
    for (int i = a->ndim - 1; i >= 0; i--) {
        e->shape[i] = a->shape[i];
        e->strides[i] = stride;
        stride *= a->shape[i];
    }
    dl_tensor t = {
        .data = data,
        .device = {dev_type, a->dev == SFPY_CUDA ? a->dev_id : 0},
        .ndim = a->ndim,
        .dtype = {dtypes[a->dtype].code, dtypes[a->dtype].bits, 1},
        .shape = e->shape,
        .strides = e->strides,
        .byte_offset = 0,
    };
    sfpy_slot_incref(a->slot);
    e->slot = a->slot;
    e->versioned = versioned;
    PyObject *cap;
    if (versioned) {
        e->m.v.version = (dl_version){DL_MAJOR, DL_MINOR};
        e->m.v.manager_ctx = e;
        e->m.v.deleter = deleter_versioned;
        e->m.v.flags = want_copy ? DL_FLAG_IS_COPIED : 0;
        e->m.v.dl_tensor = t;
        cap = PyCapsule_New(&e->m.v, "dltensor_versioned", capsule_versioned_destructor);
    } else {
        e->m.legacy.dl_tensor = t;
        e->m.legacy.manager_ctx = e;
        e->m.legacy.deleter = deleter_legacy;
        cap = PyCapsule_New(&e->m.legacy, "dltensor", capsule_legacy_destructor);
    }
    if (!cap)
        export_free(e);
    return cap;
}

static PyObject *array_dlpack_device(PyObject *self, PyObject *unused)
{
    (void)unused;
    array_object *a = (array_object *)self;
    return Py_BuildValue("(ii)",
                         a->dev == SFPY_CUDA ? DL_CUDA : a->dev == SFPY_EMULATED ? DL_EXT : DL_CPU,
                         a->dev == SFPY_CUDA ? a->dev_id : 0);
}

static PyObject *shape_tuple(const array_object *a)
{
    PyObject *t = PyTuple_New(a->ndim);
    if (!t)
        return NULL;
    for (int i = 0; i < a->ndim; i++) {
        PyObject *v = PyLong_FromLongLong(a->shape[i]);
        if (!v || PyTuple_SetItem(t, i, v) < 0) {
            Py_DECREF(t);
            return NULL;
        }
    }
    return t;
}

static PyObject *get_shape(PyObject *self, void *c)
{
    (void)c;
    return shape_tuple((array_object *)self);
}

static PyObject *get_dtype(PyObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(dtypes[((array_object *)self)->dtype].name);
}

static PyObject *get_device(PyObject *self, void *c)
{
    (void)c;
    array_object *a = (array_object *)self;
    if (a->dev == SFPY_EMULATED)
        return Py_BuildValue("(si)", "emulated", 0);
    return a->dev == SFPY_CUDA ? Py_BuildValue("(si)", "cuda", a->dev_id)
                               : Py_BuildValue("(si)", "cpu", 0);
}

static PyObject *get_nbytes(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(array_nbytes((array_object *)self));
}

static PyObject *get_data_ptr(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(((array_object *)self)->data);
}

/* NumPy's array interface (version 3): np.asarray(view) shares the memory
 * and keeps the view (and so the slot) alive as the array's base. */
static PyObject *get_array_interface(PyObject *self, void *c)
{
    (void)c;
    array_object *a = (array_object *)self;
    if (a->dev != SFPY_CPU) {
        PyErr_SetString(PyExc_AttributeError,
                        "__array_interface__: a device array (use DLPack: torch.from_dlpack)");
        return NULL;
    }
    PyObject *shape = shape_tuple(a);
    if (!shape)
        return NULL;
    return Py_BuildValue("{s:N,s:s,s:(NO),s:i}", "shape", shape, "typestr",
                         dtypes[a->dtype].typestr, "data", PyLong_FromVoidPtr(a->data), Py_False,
                         "version", 3);
}

static PyObject *array_repr(PyObject *self)
{
    array_object *a = (array_object *)self;
    char dims[96] = "";
    size_t off = 0;
    for (int i = 0; i < a->ndim && off < sizeof(dims); i++)
        off += (size_t)snprintf(dims + off, sizeof(dims) - off, i ? ", %lld" : "%lld",
                                (long long)a->shape[i]);
    return PyUnicode_FromFormat("shardfeed.Array(shape=(%s), dtype=%s, device=%s:%d)", dims,
                                dtypes[a->dtype].name,
                                a->dev == SFPY_CUDA       ? "cuda"
                                : a->dev == SFPY_EMULATED ? "emulated"
                                                          : "cpu",
                                a->dev == SFPY_CUDA ? a->dev_id : 0);
}

static Py_ssize_t array_length(PyObject *self)
{
    return (Py_ssize_t)((array_object *)self)->shape[0];
}

static PyMethodDef array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None): a DLPack "
     "capsule sharing this view's memory (versioned when max_version >= (1, 0))."},
    {"__dlpack_device__", array_dlpack_device, METH_NOARGS, "(device type, device id)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef array_getset[] = {
    {"shape", get_shape, NULL, "dimensions", NULL},
    {"dtype", get_dtype, NULL, "element type name: uint8, float32, int64, uint32", NULL},
    {"device", get_device, NULL, "('cpu', 0) or ('cuda', index)", NULL},
    {"nbytes", get_nbytes, NULL, "bytes of the view", NULL},
    {"data_ptr", get_data_ptr, NULL, "address of the first element", NULL},
    {"__array_interface__", get_array_interface, NULL, "NumPy array interface (host only)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot array_slots[] = {
    {Py_tp_dealloc, array_dealloc},
    {Py_tp_new, sfpy_new_refused},
    {Py_tp_methods, array_methods},
    {Py_tp_getset, array_getset},
    {Py_tp_repr, array_repr},
    {Py_sq_length, array_length},
    {Py_tp_doc, "A zero-copy view of a batch buffer (DLPack producer). torch.from_dlpack(a) "
                "and numpy.from_dlpack(a) share its memory; the loader's ring slot is reused "
                "only once the batch and every view and tensor of it are freed."},
    {0, NULL},
};

static PyType_Spec array_spec = {
    "shardfeed.Array", sizeof(array_object), 0, Py_TPFLAGS_DEFAULT, array_slots,
};

int sfpy_array_init(PyObject *module)
{
    array_type = sfpy_add_type(module, &array_spec, "Array");
    return array_type ? 0 : -1;
}
