"""Helpers of the Loader tests (not a test module)."""
import collections
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import shardfeed

# Far-apart colours, one per class: the mean of a decoded image names its class.
CLASS_NAMES = ("amber", "birch", "coral", "dusk", "ember", "fjord", "grass", "heron")
CLASS_COLORS = ((210, 50, 40), (40, 190, 60), (50, 60, 210), (220, 210, 50),
                (200, 50, 200), (40, 200, 200), (225, 225, 225), (30, 30, 30))
PER_CLASS = 12

SANITIZED = os.environ.get("SF_TEST_SANITIZED") == "1"


def need_torch():
    """torch, or a skip: when it is not installed, and in the sanitizer run
    when CMake found that torch cannot run under the ASan preload."""
    if os.environ.get("SF_TEST_NO_TORCH") == "1":
        pytest.skip("torch is not usable in this run (SF_TEST_NO_TORCH=1: sanitizer build)")
    return pytest.importorskip("torch")


def class_of_pixels(img, layout="chw"):
    """The class whose colour is nearest to the mean of one decoded uint8
    image ((3, H, W) or (H, W, 3)), or -1 when none is near."""
    a = np.asarray(img, dtype=np.float64)
    mean = a.reshape(3, -1).mean(axis=1) if layout == "chw" else a.reshape(-1, 3).mean(axis=0)
    d = ((np.asarray(CLASS_COLORS, dtype=np.float64) - mean) ** 2).sum(axis=1)
    k = int(d.argmin())
    return k if d[k] < 40.0 ** 2 else -1


def options(ds, **kw):
    """Small, fast loader options for a Dataset in the mock (overridable)."""
    o = dict(endpoint_url=ds.endpoint_url, batch_size=8, size=32, decode_threads=2,
             prefetch_batches=3, prefetch_shards=2, shuffle_buffer=32, seed=7, rank=0,
             world_size=1, device="host", ram_only=True, max_attempts=8)
    o.update(kw)
    return o


class Got:
    """What one batch held, copied out of the ring."""

    def __init__(self, b):
        self.epoch, self.index, self.position = b.epoch, b.index, b.position
        self.keys = tuple(b.keys)
        self.shards = tuple(b.shards)
        self.pad = tuple(b.pad)
        self.labels = np.from_dlpack(b.labels).copy()
        self.images = np.from_dlpack(b.host_images).copy()
        self.layout = b.layout

    def digest(self):
        h = hashlib.sha256(self.images.tobytes())
        h.update(self.labels.tobytes())
        h.update("\0".join(self.keys).encode())
        return h.hexdigest()

    def __eq__(self, other):
        return (self.keys == other.keys and self.pad == other.pad and
                np.array_equal(self.labels, other.labels) and
                self.images.dtype == other.images.dtype and
                self.images.shape == other.images.shape and
                self.images.tobytes() == other.images.tobytes())

    def __repr__(self):
        return f"Got(epoch={self.epoch}, index={self.index}, keys={self.keys[:3]}...)"


def read_batches(loader, limit=None):
    """Reads the current epoch (or `limit` batches of it), releasing each batch."""
    out = []
    it = iter(loader)
    while limit is None or len(out) < limit:
        try:
            b = next(it)
        except StopIteration:
            break
        with b:
            out.append(Got(b))
    return out


def check_epoch(ds, got, world_size=1):
    """Every sample exactly once (pads aside), each with the label of its
    class folder and pixels of its class; batch indices in order."""
    seen = collections.Counter()
    for i, g in enumerate(got):
        assert g.index == i, f"batch {i} has index {g.index}"
        for j, key in enumerate(g.keys):
            assert key in ds.label_of, f"unknown key {key!r}"
            want = ds.label_of[key]
            assert g.labels[j] == want, f"{key}: label {g.labels[j]}, its folder says {want}"
            if g.images.dtype == np.uint8:
                assert class_of_pixels(g.images[j], g.layout) == want, f"{key}: pixels"
            if not g.pad[j]:
                seen[key] += 1
    if world_size == 1:
        assert not any(p for g in got for p in g.pad)
        twice = [k for k, c in seen.items() if c > 1]
        assert not twice, f"delivered more than once: {twice[:5]}"
        missing = sorted(set(ds.keys) - set(seen))
        assert not missing, f"{len(missing)} samples never delivered: {missing[:5]}"
    return seen


def keys_of(got):
    return [k for g in got for k, p in zip(g.keys, g.pad) if not p]


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_and_read(sources, **kw):
    """Opens a loader and reads one epoch: errors may come from either step."""
    with shardfeed.Loader(sources, **kw) as loader:
        return read_batches(loader)


def spawn_with_shards_stalled(ds, script, code):
    """Starts `python3 script URL OPTIONS_JSON` (code written to script)
    while every shard GET of ds stops halfway for 10 minutes, so the child's
    next() has nothing to give; its stdout and stderr are pipes."""
    ds.mock.faults(f"prefix={ds.bucket}/{ds.prefix}shard-,stall=1,stall_ms=600000")
    script.write_text(code)
    return subprocess.Popen([sys.executable, str(script), ds.url, json.dumps(options(ds))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
