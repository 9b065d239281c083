"""shardfeed.Loader: the C loader as a Python iterable of batches."""
import json
import logging
import math
import operator
import os
import sys

from . import _shardfeed

_STATE_FORMAT = "shardfeed.loader"
_STATE_VERSION = 1


def _distributed_rank_world():
    """(rank, world_size) of an initialised torch.distributed, else None.

    torch is only looked at when the program already imported it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except (RuntimeError, ValueError):
        return None
    return None


def _config_error(message):
    """A ConfigError like the C side's: .status, .status_name, .message set."""
    e = _shardfeed.ConfigError(message)
    e.status = 1  # SF_ERR_INVALID_ARGUMENT
    e.status_name = "SF_ERR_INVALID_ARGUMENT"
    e.message = message
    return e


def _source_list(fn, sources):
    """sources as a list of str: one str, bytes or path, or an iterable of
    them (every entry point takes the same forms)."""
    if isinstance(sources, (str, bytes, os.PathLike)):
        sources = [sources]
    try:
        items = list(sources)
    except TypeError:
        raise _config_error(
            f"{fn}: sources: expected a str, a path or a list of them, got "
            f"{type(sources).__name__}") from None
    return [_path(fn, "sources", s) for s in items]


def _path(fn, name, value):
    """value (str, bytes or os.PathLike) as a str, else ConfigError."""
    if isinstance(value, (bytes, os.PathLike)):
        value = os.fsdecode(value)
    if not isinstance(value, str):
        raise _config_error(
            f"{fn}: {name}: expected a str or path, got {type(value).__name__}")
    return value


def _check_json_value(where, key, value):
    """Raises ConfigError for what JSON would carry but the C parser cannot
    take as given: a NUL in a string (C reads up to it: another path or
    URL) and a NaN or infinity (not JSON)."""
    if isinstance(value, str):
        if "\0" in value:
            raise _shardfeed.ConfigError(f"{where}option '{key}': holds a NUL character")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _shardfeed.ConfigError(f"{where}option '{key}': {value!r} is not a finite number")
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_json_value(where, key, v)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_json_value(where, key, k)
            _check_json_value(where, key, v)


def _options_json(config, options):
    merged = {}
    if config is not None:
        with open(os.fspath(config), "rb") as f:
            try:
                merged = json.loads(f.read())
            except ValueError as e:
                raise _shardfeed.ConfigError(f"config {config}: not JSON: {e}") from None
        if not isinstance(merged, dict):
            raise _shardfeed.ConfigError(f"config {config}: not a JSON object")
    for key, value in options.items():
        if value is None:
            continue  # None keeps the default
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        merged[key] = value
    if "rank" not in merged and "world_size" not in merged:
        rw = _distributed_rank_world()
        if rw is not None:
            merged["rank"], merged["world_size"] = rw
    for key, value in merged.items():
        _check_json_value("", key, value)
    try:
        return json.dumps(merged)
    except TypeError as e:
        raise _shardfeed.ConfigError(f"options: {e}") from None


def _is_torch_tensor(value):
    """A torch.Tensor, told without importing torch (it stays optional)."""
    module = getattr(type(value), "__module__", None) or ""
    return ((module == "torch" or module.startswith("torch.")) and
            hasattr(value, "tolist") and hasattr(value, "numpy"))


def _from_tensor(key, value, kind):
    """The Python value of a CPU tensor that a checkpointer made of the
    state's `key`: bytes from a 1-d uint8 tensor (kind "bytes"), an int from
    a 0-d integer one ("int"), a bool from a 0-d bool or integer one
    ("bool"). A tensor elsewhere than on the CPU, of another dtype or shape
    raises ConfigError naming the key."""
    device = getattr(value, "device", None)
    if getattr(device, "type", "cpu") != "cpu":
        raise _shardfeed.ConfigError(
            f"load_state_dict: {key!r} is a tensor on {device}: give the CPU tensor "
            f"(.cpu()) or load the checkpoint with map_location='cpu'")
    dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
    ndim = len(tuple(value.shape))
    integer = dtype in ("uint8", "int8", "int16", "int32", "int64")
    if kind == "bytes":
        ok, want = dtype == "uint8" and ndim == 1, "a 1-d uint8 tensor"
    elif kind == "int":
        ok, want = integer and ndim == 0, "a 0-d integer tensor"
    else:
        ok, want = (integer or dtype == "bool") and ndim == 0, "a 0-d bool tensor"
    if not ok:
        raise _shardfeed.ConfigError(
            f"load_state_dict: {key!r} is a {ndim}-d {dtype} tensor, not {want}")
    v = value.tolist()
    return bytes(v) if kind == "bytes" else v


_logger = logging.getLogger("shardfeed")


def _log_report(epoch, r):
    if r["batches"] == 0:
        return
    msg = (f"epoch {epoch}: {r['batches']} batches, waited for data "
           f"{100.0 * r['wait_share']:.1f} % of the time (batch wait p50 "
           f"{r['wait_p50_ms']:.2f} ms, p99 {r['wait_p99_ms']:.2f} ms, max "
           f"{r['wait_max_ms']:.2f} ms); {r['verdict']}")
    _logger.log(logging.WARNING if r["starving"] else logging.INFO, "%s", msg)


class _EpochIterator:
    """Batches of one epoch. An exception (a failure, LimitError,
    KeyboardInterrupt) leaves it usable: the next call asks again, so a caught
    LimitError never turns into a silent end of epoch. It ends when
    set_epoch() or load_state_dict() moved the loader since it was made: the
    new position is the next iteration's."""

    __slots__ = ("_loader", "_moves")

    def __init__(self, loader):
        self._loader = loader
        self._moves = loader._moves

    def __iter__(self):
        return self

    def __next__(self):
        if self._loader._moves != self._moves:
            raise StopIteration
        batch = self._loader.next_batch()
        if batch is None:
            raise StopIteration
        return batch


class Loader:
    """Streams batches from shards in an S3 bucket (or local files).

    ``Loader(sources, *, config=None, **options)``: sources are s3:// URLs,
    brace patterns, prefixes ending in '/', or local paths; options are the
    loader options of docs/loader.md by their names (batch_size,
    decode_threads, cache_dir, endpoint_url, ...), over those of the JSON file
    ``config``. Iterating yields :class:`shardfeed.Batch` objects for one
    epoch; iterating again starts the next epoch (or the one set with
    :meth:`set_epoch`). See docs/python.md.
    """

    def __init__(self, sources=None, *, config=None, autotune=False, **options):
        if sources is not None:
            sources = _source_list("Loader", sources)
        self._c = None
        self.tuned = None
        if autotune:
            # The tuned knobs, under every option given explicitly
            # (autotune=True: 20 s; a number: that budget in seconds).
            from ._doctor import tune
            if sources is None:
                raise _shardfeed.ConfigError("autotune: needs the sources as an argument")
            budget = 20.0 if autotune is True else float(autotune)
            self.tuned = tune(sources, budget_s=budget, config=config, **options)
            options = {**self.tuned["config"],
                       **{k: v for k, v in options.items() if v is not None}}
        self._c = _shardfeed.Loader(sources, _options_json(config, options))
        self._epoch = self._c.epoch
        self._ended = False  # the current epoch was read to its end
        self._epoch_report = None  # the last ended epoch's report
        self._epoch_set = False
        self._moves = 0  # set_epoch / load_state_dict calls: ends older iterators

    # -- iteration -----------------------------------------------------
    def _epoch_over(self, c):
        """True when the next iteration starts the next epoch."""
        if self._epoch_set:
            return False
        if self._ended:
            return True
        # Every batch of the epoch was taken (a loop of exactly len()
        # batches, zip(range(len(loader)), loader)) but its end was not
        # asked for: the epoch is over, not resumed with nothing left
        # (every other loop came out empty).
        n = c.epoch_samples if c.epoch_size_known else 0
        return n > 0 and c.epoch_delivered >= n

    def _next_epoch(self):
        """The epoch the next iteration reads (ShardDataset reopens there)."""
        return self._epoch + 1 if self._epoch_over(self._core()) else self._epoch

    def __iter__(self):
        """An iterator over the rest of the current epoch (the next epoch
        when the current one was read to its end and set_epoch was not
        called since)."""
        c = self._core()
        if not self._ended and self._epoch_over(c):
            self._epoch_report = c.report(True)
            _log_report(self._epoch, self._epoch_report)
            self._ended = True
        if self._ended and not self._epoch_set:
            self.set_epoch(self._epoch + 1)
        self._epoch_set = False
        return _EpochIterator(self)

    def next_batch(self):
        """The next batch of the current epoch, or None when it is over."""
        c = self._core()
        batch = c.next()
        if batch is None and not self._ended:
            self._epoch_report = c.report(True)
            _log_report(self._epoch, self._epoch_report)
        self._ended = batch is None
        return batch

    def report(self):
        """The starvation report (docs/loader.md "Starvation report") as a
        dict: the share of time the consumer waited for batches
        (``wait_share``), the p50 / p99 / max wait per batch in ms, the
        bounding stage (``bound``: none, startup, fetch, read, decode,
        assembly, device), ``starving`` (waited over 5 %) and ``verdict``
        (the figures and the knob to turn). During an epoch it covers the
        epoch so far; after an epoch ended, that epoch. Each epoch's report
        is also logged to the ``shardfeed`` logger when it ends: INFO, or
        WARNING when starving."""
        if self._ended and self._epoch_report is not None:
            return dict(self._epoch_report)
        return self._core().report(False)

    def __len__(self):
        """Batches of this rank's epoch (an estimate until epoch_size_known)."""
        return self._core().epoch_batches

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` from its beginning (the next iteration reads it)."""
        c = self._core()
        c.set_epoch(int(epoch))
        c.report(True)  # a new report window
        self._epoch_report = None
        self._epoch = int(epoch)
        self._epoch_set = True
        self._ended = False
        self._moves += 1

    @property
    def epoch(self):
        return self._epoch

    @property
    def epoch_samples(self):
        return self._core().epoch_samples

    @property
    def epoch_size_known(self):
        return self._core().epoch_size_known

    @property
    def shards(self):
        return self._core().shards

    # -- checkpoints ---------------------------------------------------
    def state_dict(self):
        """The consumer's position, in plain Python types (torch.save, DCP,
        torchdata's StatefulDataLoader and Lightning can keep it)."""
        c = self._core()
        stats = c.stats()
        return {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches_delivered": stats["batches_delivered"],
            "ended": self._ended,
            "state": c.state_save(),
        }

    def load_state_dict(self, state):
        """Goes back to a position saved by :meth:`state_dict` (of a loader
        with the same sources and options): the next batch is the first one
        not delivered before the save."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise _shardfeed.ConfigError("load_state_dict: not a shardfeed loader state")
        if state.get("version") != _STATE_VERSION:
            raise _shardfeed.ConfigError(
                f"load_state_dict: state version {state.get('version')!r}, "
                f"this shardfeed reads {_STATE_VERSION}")
        blob = state.get("state")
        if _is_torch_tensor(blob):  # torch.load of a checkpoint that keeps tensors, DCP
            blob = _from_tensor("state", blob, "bytes")
        elif isinstance(blob, (bytearray, memoryview)):
            blob = bytes(blob)
        elif not isinstance(blob, bytes) and hasattr(blob, "tobytes"):
            blob = blob.tobytes()  # a tensor or array a checkpointer made of it
        if not isinstance(blob, bytes):
            raise _shardfeed.ConfigError("load_state_dict: 'state' is not bytes")
        epoch = state.get("epoch")
        if _is_torch_tensor(epoch):
            epoch = _from_tensor("epoch", epoch, "int")
        try:
            if isinstance(epoch, bool):
                raise TypeError
            epoch = operator.index(epoch)  # an int, or a NumPy / 0-d tensor integer
        except TypeError:
            raise _shardfeed.ConfigError(
                f"load_state_dict: 'epoch' is {epoch!r}, not an int") from None
        ended = state.get("ended", False)
        if _is_torch_tensor(ended):
            ended = _from_tensor("ended", ended, "bool")
        elif hasattr(ended, "item") and not isinstance(ended, int):
            ended = ended.item()  # a NumPy or 0-d tensor value a checkpointer made of it
        if not isinstance(ended, int) or ended not in (0, 1):
            # bool("no") is True: the rest of the epoch would be skipped.
            raise _shardfeed.ConfigError(f"load_state_dict: 'ended' is {ended!r}, not a bool")
        c = self._core()
        before = c.state_save()
        c.state_restore(blob)
        restored = c.epoch
        if restored != epoch:
            # The blob (checksummed) and the dict were not saved together:
            # go back rather than iterate an epoch the caller did not ask for.
            c.state_restore(before)
            raise _shardfeed.CorruptError(
                f"load_state_dict: 'epoch' is {epoch} but the saved position is in epoch "
                f"{restored}")
        self._epoch = epoch
        self._ended = bool(ended)
        self._epoch_set = False
        self._moves += 1

    # -- the rest ------------------------------------------------------
    def stats(self):
        """Counters since open, as a dict (the fields of sf_loader_stats)."""
        return self._core().stats()

    def close(self):
        """Stops the loader. Batches, views and tensors still alive keep
        their memory; the threads stop when the last of them is freed."""
        if self._c is not None:
            c, self._c = self._c, None
            c.close()

    @property
    def closed(self):
        return self._c is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _core(self):
        if self._c is None:
            raise _shardfeed.ConfigError("the loader is closed")
        return self._c

    def __repr__(self):
        if self._c is None:
            return "shardfeed.Loader(closed)"
        return (f"shardfeed.Loader({len(self.shards)} shards, epoch {self._epoch}, "
                f"{len(self)} batches{'' if self.epoch_size_known else ' (estimated)'})")
