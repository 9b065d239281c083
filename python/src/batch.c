/*
 * shardfeed.Batch: one delivered batch. Its buffers are views (shardfeed.Array)
 * of the loader's ring slot; keys, shard indices, pad flags and extra fields
 * are copied into Python objects on first access.
 */
#include "sfpy.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    struct sfpy_slot *slot; /* NULL once released */
    PyObject *cache_keys, *cache_fields;
} batch_object;

static PyTypeObject *batch_type;

PyObject *sfpy_batch_new(struct sfpy_slot *slot)
{
    batch_object *b = (batch_object *)PyType_GenericAlloc(batch_type, 0);
    if (!b) {
        sfpy_slot_decref(slot);
        return NULL;
    }
    b->slot = slot;
    return (PyObject *)b;
}

static void batch_dealloc(PyObject *self)
{
    batch_object *b = (batch_object *)self;
    if (b->slot)
        sfpy_slot_decref(b->slot);
    Py_XDECREF(b->cache_keys);
    Py_XDECREF(b->cache_fields);
    sfpy_free_object(self);
}

PyObject *sfpy_new_refused(PyTypeObject *t, PyObject *a, PyObject *k)
{
    (void)a;
    (void)k;
    PyErr_SetString(PyExc_TypeError, t == batch_type ? "shardfeed.Batch objects come from a Loader"
                                                     : "shardfeed.Array views come from a Batch");
    return NULL;
}

static const struct sf_batch *live(PyObject *self)
{
    batch_object *b = (batch_object *)self;
    if (!b->slot) {
        sfpy_raise(SF_ERR_INVALID_ARGUMENT,
                   "the batch was released: take its views (images, labels) before release()");
        return NULL;
    }
    return &b->slot->b;
}

/* The images getters' closure: which view. */
enum image_view { VIEW_HOST, VIEW_DELIVERED, VIEW_NORMALIZED };

static PyObject *get_image_view(PyObject *self, void *view)
{
    const int which = (int)(intptr_t)view; /* enum image_view */
    const struct sf_batch *x = live(self);
    if (!x)
        return NULL;
    struct sfpy_slot *slot = ((batch_object *)self)->slot;
    int64_t shape[4] = {(int64_t)x->size, 0, 0, 0};
    if (x->layout == SF_LAYOUT_CHW) {
        shape[1] = x->channels;
        shape[2] = x->height;
        shape[3] = x->width;
    } else {
        shape[1] = x->height;
        shape[2] = x->width;
        shape[3] = x->channels;
    }
    if (which == VIEW_NORMALIZED || (which == VIEW_DELIVERED && x->device_images)) {
        void *p = which == VIEW_NORMALIZED ? x->device_normalized : x->device_images;
        if (!p)
            Py_RETURN_NONE;
        return sfpy_array_new(
            slot, p,
            which == VIEW_NORMALIZED ? SFPY_F32
                                     : (x->dtype == SF_DTYPE_FLOAT32 ? SFPY_F32 : SFPY_U8),
            4, shape, x->device == SF_DEVICE_EMULATED ? SFPY_EMULATED : SFPY_CUDA, x->cuda_device);
    }
    return sfpy_array_new(slot, (void *)x->images,
                          x->dtype == SF_DTYPE_FLOAT32 ? SFPY_F32 : SFPY_U8, 4, shape, SFPY_CPU,
                          0);
}

/* labels (int64) or flags (uint32), one per sample: the closure says which. */
enum column { COLUMN_LABELS, COLUMN_FLAGS };

static PyObject *get_column(PyObject *self, void *column)
{
    const struct sf_batch *x = live(self);
    if (!x)
        return NULL;
    int64_t n = (int64_t)x->size;
    if ((intptr_t)column == COLUMN_FLAGS)
        return sfpy_array_new(((batch_object *)self)->slot, (void *)x->flags, SFPY_U32, 1, &n,
                              SFPY_CPU, 0);
    return sfpy_array_new(((batch_object *)self)->slot, (void *)x->labels, SFPY_I64, 1, &n,
                          SFPY_CPU, 0);
}

PyObject *sfpy_str(const char *s)
{
    /* Keys and URLs are bytes (tar member names): undecodable bytes survive
     * as surrogates, as os.fsdecode does. */
    if (!s)
        s = "";
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
}

/* A tuple of one object per sample of x, made by item(x, i, ctx). */
static PyObject *per_sample(const struct sf_batch *x,
                            PyObject *(*item)(const struct sf_batch *, size_t, const void *),
                            const void *ctx)
{
    PyObject *t = PyTuple_New((Py_ssize_t)x->size);
    for (size_t i = 0; t && i < x->size; i++) {
        PyObject *v = item(x, i, ctx);
        if (!v || PyTuple_SetItem(t, (Py_ssize_t)i, v) < 0)
            Py_CLEAR(t);
    }
    return t;
}

static PyObject *pad_of(const struct sf_batch *x, size_t i, const void *ctx)
{
    (void)ctx;
    return PyBool_FromLong((x->flags[i] & SF_SAMPLE_PAD) != 0);
}

static PyObject *key_of(const struct sf_batch *x, size_t i, const void *ctx)
{
    (void)ctx;
    return sfpy_str(x->keys[i]);
}

static PyObject *shard_of(const struct sf_batch *x, size_t i, const void *ctx)
{
    (void)ctx;
    return PyLong_FromUnsignedLongLong(x->shards[i]);
}

static PyObject *shard_url_of(const struct sf_batch *x, size_t i, const void *loader)
{
    return sfpy_str(sf_loader_shard_url(loader, (size_t)x->shards[i]));
}

static PyObject *field_of(const struct sf_batch *x, size_t i, const void *field)
{
    (void)x;
    const struct sf_batch_field *fd = field;
    return PyBytes_FromStringAndSize((const char *)fd->data + fd->offsets[i],
                                     (Py_ssize_t)(fd->offsets[i + 1] - fd->offsets[i]));
}

/* The getters of a tuple per sample: their closure is the item maker. */
struct item_maker {
    PyObject *(*item)(const struct sf_batch *x, size_t i, const void *loader);
};
static const struct item_maker pad_items = {pad_of}, shard_items = {shard_of},
                               shard_url_items = {shard_url_of};

static PyObject *get_per_sample(PyObject *self, void *maker)
{
    const struct sf_batch *x = live(self);
    const struct item_maker *m = maker;
    return x ? per_sample(x, m->item, ((batch_object *)self)->slot->core->l) : NULL;
}

static PyObject *get_keys(PyObject *self, void *c)
{
    (void)c;
    batch_object *b = (batch_object *)self;
    if (!b->cache_keys) {
        const struct sf_batch *x = live(self);
        if (!x || !(b->cache_keys = per_sample(x, key_of, NULL)))
            return NULL;
    }
    Py_INCREF(b->cache_keys);
    return b->cache_keys;
}


static PyObject *get_fields(PyObject *self, void *c)
{
    (void)c;
    batch_object *b = (batch_object *)self;
    if (!b->cache_fields) {
        const struct sf_batch *x = live(self);
        if (!x)
            return NULL;
        PyObject *d = PyDict_New();
        for (size_t f = 0; d && f < x->field_count; f++) {
            PyObject *t = per_sample(x, field_of, &x->fields[f]);
            if (!t || PyDict_SetItemString(d, x->fields[f].name, t) < 0)
                Py_CLEAR(d);
            Py_XDECREF(t);
        }
        if (!d)
            return NULL;
        b->cache_fields = d;
    }
    Py_INCREF(b->cache_fields);
    return b->cache_fields;
}

#define U64_GETTER(name, expr)                                                                   \
    static PyObject *get_##name(PyObject *self, void *c)                                         \
    {                                                                                            \
        (void)c;                                                                                 \
        const struct sf_batch *x = live(self);                                                   \
        return x ? PyLong_FromUnsignedLongLong((unsigned long long)(expr)) : NULL;               \
    }
U64_GETTER(epoch, x->epoch)
U64_GETTER(index, x->index)
U64_GETTER(position, x->position)
U64_GETTER(size, x->size)
U64_GETTER(width, x->width)
U64_GETTER(height, x->height)
U64_GETTER(channels, x->channels)

static PyObject *get_layout(PyObject *self, void *c)
{
    (void)c;
    const struct sf_batch *x = live(self);
    return x ? PyUnicode_FromString(x->layout == SF_LAYOUT_CHW ? "chw" : "hwc") : NULL;
}

static PyObject *get_dtype(PyObject *self, void *c)
{
    (void)c;
    const struct sf_batch *x = live(self);
    return x ? PyUnicode_FromString(x->dtype == SF_DTYPE_FLOAT32 ? "float32" : "uint8") : NULL;
}

static PyObject *get_on_device(PyObject *self, void *c)
{
    (void)c;
    const struct sf_batch *x = live(self);
    return x ? PyBool_FromLong(x->device_images != NULL) : NULL;
}

static PyObject *get_released(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(((batch_object *)self)->slot == NULL);
}

static Py_ssize_t batch_length(PyObject *self)
{
    const struct sf_batch *x = live(self);
    return x ? (Py_ssize_t)x->size : -1;
}

static PyObject *batch_release(PyObject *self, PyObject *unused)
{
    (void)unused;
    batch_object *b = (batch_object *)self;
    if (b->slot) {
        struct sfpy_slot *s = b->slot;
        b->slot = NULL;
        sfpy_slot_decref(s);
    }
    Py_RETURN_NONE;
}

static PyObject *batch_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

static PyObject *batch_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return batch_release(self, NULL);
}

static PyObject *batch_repr(PyObject *self)
{
    batch_object *b = (batch_object *)self;
    if (!b->slot)
        return PyUnicode_FromString("shardfeed.Batch(released)");
    const struct sf_batch *x = &b->slot->b;
    return PyUnicode_FromFormat("shardfeed.Batch(epoch=%llu, index=%llu, size=%zu, %ux%u %s%s)",
                                (unsigned long long)x->epoch, (unsigned long long)x->index,
                                x->size, x->width, x->height,
                                x->dtype == SF_DTYPE_FLOAT32 ? "float32" : "uint8",
                                x->device_images ? ", on device" : "");
}

static PyMethodDef batch_methods[] = {
    {"release", batch_release, METH_NOARGS,
     "Hands the ring slot back as soon as no view or tensor of it is alive."},
    {"__enter__", batch_enter, METH_NOARGS, NULL},
    {"__exit__", batch_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef batch_getset[] = {
    {"images", get_image_view, NULL,
     "Images (n, 3, H, W) or (n, H, W, 3): on the device when batches are delivered there",
     (void *)(intptr_t)VIEW_DELIVERED},
    {"host_images", get_image_view, NULL, "The host images", (void *)(intptr_t)VIEW_HOST},
    {"normalized", get_image_view, NULL, "float32 (x / 255 - mean) / std on the device, or None",
     (void *)(intptr_t)VIEW_NORMALIZED},
    {"labels", get_column, NULL, "int64 (n,): -1 where a sample has no label",
     (void *)(intptr_t)COLUMN_LABELS},
    {"flags", get_column, NULL, "uint32 (n,): SF_SAMPLE_PAD (1) for padding repeats",
     (void *)(intptr_t)COLUMN_FLAGS},
    {"pad", get_per_sample, NULL, "tuple of bool: the sample is a padding repeat",
     (void *)&pad_items},
    {"keys", get_keys, NULL, "tuple of sample keys", NULL},
    {"shards", get_per_sample, NULL, "tuple of shard indices (Loader.shards)",
     (void *)&shard_items},
    {"shard_urls", get_per_sample, NULL, "tuple of the samples' shard URLs",
     (void *)&shard_url_items},
    {"fields", get_fields, NULL, "dict: extra field name -> tuple of bytes", NULL},
    {"epoch", get_epoch, NULL, NULL, NULL},
    {"index", get_index, NULL, "batch number within the epoch", NULL},
    {"position", get_position, NULL, "epoch position of the first sample", NULL},
    {"size", get_size, NULL, "samples in the batch", NULL},
    {"width", get_width, NULL, NULL, NULL},
    {"height", get_height, NULL, NULL, NULL},
    {"channels", get_channels, NULL, NULL, NULL},
    {"layout", get_layout, NULL, "'chw' or 'hwc'", NULL},
    {"dtype", get_dtype, NULL, "'uint8' or 'float32'", NULL},
    {"on_device", get_on_device, NULL, "delivered on the GPU", NULL},
    {"released", get_released, NULL, "release() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_dealloc, batch_dealloc},
    {Py_tp_new, sfpy_new_refused},
    {Py_tp_methods, batch_methods},
    {Py_tp_getset, batch_getset},
    {Py_tp_repr, batch_repr},
    {Py_sq_length, batch_length},
    {Py_tp_doc, "A batch delivered by a Loader: zero-copy views of a ring slot."},
    {0, NULL},
};

static PyType_Spec batch_spec = {
    "shardfeed.Batch", sizeof(batch_object), 0, Py_TPFLAGS_DEFAULT, batch_slots,
};

int sfpy_batch_init(PyObject *module)
{
    if (sfpy_array_init(module) < 0)
        return -1;
    batch_type = sfpy_add_type(module, &batch_spec, "Batch");
    return batch_type ? 0 : -1;
}
