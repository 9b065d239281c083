/*
 * _doctor_measure, _doctor_conclude and _tune: the doctor's measurements
 * and verdict, and the tuner, as dicts. Shared helpers in tools.h.
 */
#include "tools.h"

#include <string.h>

/* ------------------------------------------------------------ doctor */

/* Frees what sfpy_sources_options made, then passes on the log and st.
 * -1 with an exception set when either fails. */
static int options_done(struct strv *sv, void *keep, sf_status st, const char *err)
{
    if (sfpy_sources_options_free(sv, keep) < 0)
        return -1;
    if (st != SF_OK) {
        sfpy_raise(st, err);
        return -1;
    }
    return 0;
}

/* The result as a dict; "_raw" keeps the C struct for _doctor_conclude. */
static PyObject *doctor_dict(const struct sf_doctor_result *r)
{
    static const enum sf_stage stages[] = {SF_STAGE_FETCH, SF_STAGE_READ, SF_STAGE_DECODE,
                                           SF_STAGE_ASSEMBLY, SF_STAGE_DEVICE};
    PyObject *d = PyDict_New(), *st = PyDict_New();
    if (!d || !st) {
        Py_XDECREF(d);
        Py_XDECREF(st);
        return NULL;
    }
    for (size_t i = 0; i < sizeof(stages) / sizeof(stages[0]); i++) {
        PyObject *one = PyDict_New();
        if (!one ||
            sfpy_set_item(one, "samples_per_s", PyFloat_FromDouble(r->stage_per_s[stages[i]])) ||
            sfpy_set_str(one, "how", r->stage_note[stages[i]]) ||
            sfpy_set_item(st, sf_stage_name(stages[i]), one)) {
            Py_DECREF(st);
            Py_DECREF(d);
            return NULL;
        }
    }
#define F(f) sfpy_set_item(d, #f, PyFloat_FromDouble(r->f))
#define U(f) sfpy_set_u64(d, #f, (unsigned long long)r->f)
    int failed =
        sfpy_set_item(d, "stages", st) || F(decode_per_thread_per_s) || U(decode_threads) ||
        U(cores) || F(fetch_mib_per_s) || F(fetch_mib_per_s_more) || U(concurrency) ||
        U(concurrency_more) || F(bytes_per_sample) || U(samples_measured) || F(step_per_s) ||
        F(max_side_speedup) || F(max_side_bytes) || F(pipeline_per_s) || F(wait_share) ||
        sfpy_set_str(d, "bound", r->bound == SF_STAGE_NONE ? "step" : sf_stage_name(r->bound)) ||
        sfpy_set_str(d, "verdict", r->verdict) ||
        sfpy_set_item(d, "_raw", PyBytes_FromStringAndSize((const char *)r, sizeof(*r)));
#undef F
#undef U
    return sfpy_dict_filled(d, failed);
}

/* Parses (sources, options_json, seconds) as fmt says and runs the doctor's
 * measurements into *dr, or with dr NULL the tuner into *tr, with the GIL
 * released. 0, or -1 with the exception. */
static int run_on_sources(PyObject *args, const char *fmt, const char *fn,
                          struct sf_doctor_result *dr, struct sf_tune_result *tr)
{
    PyObject *sources;
    const char *json;
    double seconds;
    if (!PyArg_ParseTuple(args, fmt, &sources, &json, &seconds))
        return -1;
    struct strv sv;
    struct sf_loader_options lo;
    void *keep = NULL;
    if (sfpy_sources_options(sources, json, fn, &sv, &lo, &keep) < 0)
        return -1;
    lo.sources = sv.v;
    lo.source_count = sv.n;
    char err[1024] = "";
    sf_status st;
    Py_BEGIN_ALLOW_THREADS
    st = dr ? sf_doctor_measure(&lo, seconds, dr, err, sizeof(err))
            : sf_tune(&lo, seconds, tr, err, sizeof(err));
    Py_END_ALLOW_THREADS
    return options_done(&sv, keep, st, err);
}

/* _doctor_measure(sources, options_json, seconds) -> dict */
PyObject *sfpy_doctor_measure(PyObject *self, PyObject *args)
{
    (void)self;
    struct sf_doctor_result r;
    if (run_on_sources(args, "Osd:_doctor_measure", "doctor", &r, NULL) < 0)
        return NULL;
    return doctor_dict(&r);
}

/* _doctor_conclude(raw, step_per_s, pipeline_per_s, wait_share, data_in_cache) -> dict */
PyObject *sfpy_doctor_conclude(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *raw;
    double step, pipe, wait;
    int in_cache;
    if (!PyArg_ParseTuple(args, "Sdddp:_doctor_conclude", &raw, &step, &pipe, &wait, &in_cache))
        return NULL;
    struct sf_doctor_result r;
    char *buf = NULL;
    Py_ssize_t len = 0;
    if (PyBytes_AsStringAndSize(raw, &buf, &len) < 0)
        return NULL;
    if (len != (Py_ssize_t)sizeof(r)) {
        sfpy_raise(SF_ERR_INVALID_ARGUMENT, "doctor: not a result of _doctor_measure");
        return NULL;
    }
    memcpy(&r, buf, sizeof(r));
    struct sf_loader_report rep;
    memset(&rep, 0, sizeof(rep));
    rep.wait_share = wait;
    sf_doctor_conclude(&r, step, pipe, &rep, in_cache);
    return doctor_dict(&r);
}

/* _tune(sources, options_json, budget_s) -> dict (sf_tune) */
PyObject *sfpy_tune(PyObject *self, PyObject *args)
{
    (void)self;
    struct sf_tune_result r;
    if (run_on_sources(args, "Osd:_tune", "tune", NULL, &r) < 0)
        return NULL;
    PyObject *d = PyDict_New();
#define F(f) sfpy_set_item(d, #f, PyFloat_FromDouble(r.f))
#define U(f) sfpy_set_u64(d, #f, (unsigned long long)r.f)
    int failed = !d || sfpy_set_str(d, "config_json", r.config_json) || U(decode_threads) ||
                 U(concurrency) || U(chunk_bytes) || U(prefetch_shards) || U(prefetch_batches) ||
                 F(decode_per_s) || F(fetch_mib_per_s) || F(tuned_per_s) || F(given_per_s) ||
                 sfpy_set_item(d, "kept_given", PyBool_FromLong(r.kept_given)) || U(points) ||
                 F(seconds) || sfpy_set_str(d, "trace", r.trace);
#undef F
#undef U
    return sfpy_dict_filled(d, failed);
}
