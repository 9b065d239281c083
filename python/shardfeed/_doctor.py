"""shardfeed.doctor: find the stage that starves the training step.

Each stage of the pipeline is measured on its own on the user's data and
options (fetch, read, decode, assembly, device copy: the C library's
sf_doctor_measure), then the user's step alone on one batch, then the whole
pipeline with the step; the slowest stage that runs every epoch is the
bound, and the verdict names the knob to turn (docs/doctor.md).
"""
import json
import math
import os
import stat
import time

from . import _shardfeed
from ._loader import Loader, _options_json, _source_list


def doctor(sources, step=None, *, seconds=2.0, config=None, **options):
    """Measures the pipeline for ``sources`` with the loader ``options``
    (those of :class:`Loader`, or ``config=`` a JSON file) and returns a
    dict: ``stages`` (``fetch``, ``read``, ``decode``, ``assembly``,
    ``device``: ``samples_per_s``, 0 when not measured, and ``how``),
    ``step_per_s`` (``step`` alone, called with one batch again and again;
    0 without a step), ``pipeline_per_s`` and ``wait_share`` (the whole
    loader feeding ``step``), ``bound`` (``step`` or a stage name) and
    ``verdict`` (the figures and the knob). ``seconds`` is spent on each
    stage (the pipeline gets twice that). ``step`` is the training step:
    a callable taking a :class:`Batch`; it must not keep the batch.
    Raises the loader's exceptions (a missing shard, bad options), and
    NotFoundError when this rank's epoch holds fewer samples than one
    batch ("the data is too small to measure": no whole batch to time)."""
    sources = _source_list("doctor", sources)
    seconds = float(seconds)
    if not (seconds > 0 and math.isfinite(seconds)):  # inf: every stage would run forever
        raise _shardfeed.ConfigError(
            f"doctor: seconds must be a positive finite number, got {seconds!r}")
    if step is not None and not callable(step):
        raise TypeError("doctor: step must be callable (it gets one Batch)")
    res = _shardfeed._doctor_measure(sources, _options_json(config, options), seconds)
    step_per_s = 0.0
    with Loader(sources, config=config, **options) as loader:
        c = loader._core()
        first = c.next()
        if first is None:
            raise _shardfeed.NotFoundError("doctor: the sources hold no samples")
        if step is not None:
            calls, t0 = 0, time.monotonic()
            while True:
                step(first)
                calls += 1
                elapsed = time.monotonic() - t0
                if elapsed >= seconds / 2:
                    break
            step_per_s = calls * first.size / elapsed
        first.release()
        # The whole pipeline with the step, in a report window of its own.
        before = c.stats()["bytes_fetched"]
        c.report(True)
        epoch, images, t0 = loader.epoch, 0, time.monotonic()
        while time.monotonic() - t0 < 2 * seconds:
            b = c.next()
            if b is None:
                epoch += 1
                c.set_epoch(epoch)
                continue
            if step is not None:
                step(b)
            images += b.size
            b.release()
        elapsed = time.monotonic() - t0
        rep = c.report(False)
        in_cache = c.stats()["bytes_fetched"] == before
    out = _shardfeed._doctor_conclude(res["_raw"], step_per_s, images / elapsed,
                                      rep["wait_share"], in_cache)
    del out["_raw"]
    out["wait_p50_ms"] = rep["wait_p50_ms"]
    out["wait_p99_ms"] = rep["wait_p99_ms"]
    out["data_in_cache"] = in_cache
    return out


def tune(sources, *, budget_s=20.0, config=None, output=None, **options):
    """Searches decode_threads, concurrency, chunk_size, prefetch_shards and
    prefetch_batches for ``sources`` with the loader ``options`` within
    about ``budget_s`` seconds (docs/doctor.md "Autotune") and returns a
    dict: ``config`` (the tuned options, a dict :class:`Loader` takes as
    keyword arguments or, written with ``output=PATH``, as ``config=``),
    the measured rates, ``tuned_per_s`` / ``given_per_s`` (the whole
    pipeline with each), ``kept_given`` and ``trace`` (every point tried)."""
    sources = _source_list("tune", sources)
    budget_s = float(budget_s)
    if not (budget_s > 0 and math.isfinite(budget_s)):
        raise _shardfeed.ConfigError(
            f"tune: budget_s must be a positive finite number, got {budget_s!r}")
    if output is not None:
        _check_writable(output)  # before the search, not after budget_s of it
    r = _shardfeed._tune(list(sources), _options_json(config, options), budget_s)
    r["config"] = json.loads(r.pop("config_json"))
    if output is not None:
        _write_whole(output, r["config"])
    return r


def _check_writable(path):
    """ConfigError unless ``path`` can be written (a folder cannot), as
    ``shardfeed tune -o`` checks before its search (exit 2)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise _shardfeed.ConfigError("tune: output %s: Is a directory" % path)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise _shardfeed.ConfigError("tune: output %s: Permission denied" % path)
    if not os.path.exists(path):  # a dangling link: its folder, as the CLI
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise _shardfeed.ConfigError("tune: output %s: No such directory" % path)
        if not os.access(folder, os.W_OK):
            raise _shardfeed.ConfigError("tune: output %s: Permission denied" % path)


def _write_whole(path, obj):
    """Writes ``obj`` as one JSON line to ``path`` as a whole or not at all,
    as ``shardfeed tune -o`` does: a temporary file beside it (the same
    folder, so the same file system), flushed to disk, then renamed over
    it; a failure removes the temporary and leaves what was at ``path``. A
    link writes its target; a path that is not a regular file (/dev/stdout,
    a FIFO) is written in place. An existing file keeps its mode; a new one
    gets 0666 less the umask, as ``open()`` gives."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "w") as f:
            json.dump(obj, f)
            f.write("\n")
        return
    final = os.path.realpath(path) if st is not None else path
    folder, name = os.path.split(final)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for k in range(100):
        tmp = os.path.join(folder, ".%s.tmp-%d-%d" % (name, os.getpid(), k))
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError("tune: no free temporary name beside %s" % path)
    try:
        with os.fdopen(fd, "w") as f:
            if st is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
            json.dump(obj, f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
