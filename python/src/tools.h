/*
 * What the files of the module-level tools share (tools.c: options, argument
 * conversion, dicts, the progress callbacks, the method table;
 * tools_s3.c: ls and stat; tools_cache.c: warm_cache; tools_pack.c: pack;
 * tools_index.c: index; tools_doctor.c: doctor and tune).
 */
#ifndef SFPY_TOOLS_H
#define SFPY_TOOLS_H

#include "sfpy.h"
#include "shardfeed_cache.h"
#include "shardfeed_pack.h"

#define PROGRESS_S 0.2 /* at most 5 progress calls a second (plus the last) */
#define CHECK_S    0.05

/* ------------------------------------------------------------ options */

/* Reads the S3 (and cache) options of json into *lo with the loader's
 * parser; the strings point into *keep (free with
 * sf_loader_options_free_json). Sets the log sinks. -1 with ConfigError. */
int sfpy_parse_options(const char *json, struct sf_loader_options *lo, void **keep);
/* A client for lo->s3, or NULL with the exception of the failure. */
struct sf_s3 *sfpy_open_client(const struct sf_loader_options *lo);
PyObject *sfpy_raise_s3(struct sf_s3 *s3, sf_status st);
/* Converts obj (an int, not a bool) into *out in [min, max]; -1 with
 * ConfigError naming the argument otherwise. */
int sfpy_get_uint(PyObject *obj, const char *fn, const char *name, unsigned long long min,
                  unsigned long long max, unsigned long long *out);
/* A byte size: an int or a string such as "8M" (sf_parse_bytes), at least min. */
int sfpy_get_size(PyObject *obj, const char *fn, const char *name, unsigned long long min,
                  unsigned long long *out);

/* A list of str as C strings; the UTF-8 bytes are kept by list. */
struct strv {
    PyObject *list;
    const char **v;
    size_t n;
};

int sfpy_strv_from(PyObject *obj, const char *fn, struct strv *out);
void sfpy_strv_clear(struct strv *s);
/* sfpy_strv_from(sources) and sfpy_parse_options(json), for the calls that
 * take both; -1 with the exception set and nothing left to free. */
int sfpy_sources_options(PyObject *sources, const char *json, const char *fn, struct strv *sv,
                         struct sf_loader_options *lo, void **keep);
/* Frees what sfpy_sources_options made (after the client and cache that
 * use it) and passes on the log; -1 with an exception when that raised. */
int sfpy_sources_options_free(struct strv *sv, void *keep);

/* ------------------------------------------------------------ callbacks */

enum cb_kind { CB_PACK, CB_INDEX, CB_WARM };

/* State of the callbacks of one blocking call, on the calling thread. */
struct pycb {
    PyObject *progress; /* the user's callable, borrowed; NULL = none */
    enum cb_kind kind;
    union {
        struct sf_pack_progress pack;
        struct sf_index_progress index;
        struct sf_warm_stats warm;
    } last;                 /* the newest snapshot */
    int pending;            /* last not handed to progress yet */
    double next_call_s;     /* earliest time of the next progress call */
    double next_check_s;    /* earliest time of the next signal check */
    int stop;               /* an exception is saved: cancel */
    PyObject *et, *ev, *tb; /* that exception */
};

/* 0 when progress is None or callable; else -1 with ConfigError "fn:
 * progress: expected a callable". */
int sfpy_cb_check(PyObject *progress, const char *fn);
void sfpy_cb_init(struct pycb *cb, PyObject *progress, enum cb_kind kind);
PyObject *sfpy_snapshot_dict(const struct pycb *cb);
/* For sf_pack and sf_index: o's progress callback set to hand cb its
 * snapshots, sfpy_cb_check(progress, "pack" / "index") and sfpy_cb_init
 * with the kind of that callback (one call, so the two cannot disagree).
 * 0, or -1 with the ConfigError of sfpy_cb_check (nothing to undo). */
int sfpy_cb_pack(struct pycb *cb, PyObject *progress, struct sf_pack_options *o);
int sfpy_cb_index(struct pycb *cb, PyObject *progress, struct sf_index_options *o);
/* From a library callback, without the GIL: checks for signals and hands
 * log lines over (every CHECK_S), calls progress (every PROGRESS_S when a
 * new snapshot is pending). Returns 1 when the call must stop. */
int sfpy_cb_poll(struct pycb *cb);
/* After the call returned (GIL held): on success the last snapshot goes to
 * progress when it has not yet. Returns -1 with an exception set when the
 * callbacks stopped the call (their exception) or the last call raised. */
int sfpy_cb_finish(struct pycb *cb, int succeeded);

/* ------------------------------------------------------------ the tools */

/* The functions of the method table in tools.c (signatures there). */
PyObject *sfpy_ls(PyObject *self, PyObject *args);
PyObject *sfpy_stat(PyObject *self, PyObject *args);
PyObject *sfpy_warm_cache(PyObject *self, PyObject *args);
PyObject *sfpy_pack(PyObject *self, PyObject *args);
PyObject *sfpy_index(PyObject *self, PyObject *args);
PyObject *sfpy_doctor_measure(PyObject *self, PyObject *args);
PyObject *sfpy_doctor_conclude(PyObject *self, PyObject *args);
PyObject *sfpy_tune(PyObject *self, PyObject *args);

#endif
