"""Calls in an unexpected order, hostile arguments and exceptions raised by
user code (signal handlers, logging filters) while the loader works: each
raises a clear exception and leaves nothing held, lost or freed too early."""
import io
import logging
import tarfile
import textwrap
import time

import numpy as np
import pytest

import shardfeed
from sfutil import check_epoch, options, read_batches, spawn_with_shards_stalled
from test_lifetimes import ring_is_free

CLOSE_WHILE_WAITING = textwrap.dedent("""
    import json, signal, sys, threading
    import shardfeed
    url, opts = sys.argv[1], json.loads(sys.argv[2])
    for how in ("signal handler", "thread"):
        loader = shardfeed.Loader(url, **opts)
        if how == "thread":
            threading.Timer(0.3, loader.close).start()
        else:
            signal.signal(signal.SIGALRM, lambda *a: loader.close())
            signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            loader.next_batch()
            print(how, "got a batch", flush=True)
        except shardfeed.ConfigError as e:
            print(how, "raised:", e, flush=True)
""")


def test_close_during_a_blocked_next_ends_it_with_config_error(dataset, tmp_path):
    """close() from a signal handler (run by next()'s signal checks) or from
    another thread while next() waits: the loader must stay alive under the
    waiting call (not be freed under it) and next() raises that it was
    closed."""
    p = spawn_with_shards_stalled(dataset, tmp_path / "close_while_waiting.py",
                                  CLOSE_WHILE_WAITING)
    try:
        # A hang check, not a timing threshold: the bug waits forever on a
        # freed loader (or crashes).
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    lines = out.decode().splitlines()
    assert p.returncode == 0, (lines, err.decode()[-3000:])
    assert lines == ["signal handler raised: the loader was closed during next()",
                     "thread raised: the loader was closed during next()"], lines


class _Raising(logging.Filter):
    def filter(self, record):
        raise RuntimeError("a logging filter failed")


def test_a_logging_filter_raising_in_next_loses_no_batch(dataset):
    """The log lines queued by the loader's threads go to logging when next()
    has its batch: an exception there propagates, and the batch is the next
    call's (not dropped with its ring slot held forever)."""
    ds = dataset
    # Two failed GETs: the I/O thread logs each retry (a WARNING).
    ds.mock.fault(f"{ds.bucket}/{ds.prefix}shard-", "500", 2)
    logger = logging.getLogger("shardfeed")
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        while loader.stats()["ready_batches"] == 0:  # the first batch waits, with the lines
            time.sleep(0.01)
        assert ds.mock.stats()["faults"].get("500", 0) == 2
        logger.addFilter(_Raising())
        try:
            with pytest.raises(RuntimeError, match="logging filter"):
                loader.next_batch()
        finally:
            logger.filters.clear()
        got = read_batches(loader)
        assert got[0].index == 0
        check_epoch(ds, got)
        assert ring_is_free(loader, 3)


def test_set_epoch_inside_a_loop_ends_it_and_the_next_loop_reads_that_epoch(dataset):
    """set_epoch(n) is the next iteration's epoch: the loop it was called in
    used to go on into epoch n, and the next loop then got no batch at all."""
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        first = []
        for b in loader:
            with b:
                first.append(b.epoch)
            if len(first) == 2:
                loader.set_epoch(5)
        assert first == [0, 0]
        again = read_batches(loader)
        assert {g.epoch for g in again} == {5}
        check_epoch(ds, again)
        assert {g.epoch for g in read_batches(loader)} == {6}


def test_load_state_dict_checks_the_epoch_before_it_moves(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        read_batches(loader, limit=3)
        state = loader.state_dict()
    no_epoch = {k: v for k, v in state.items() if k != "epoch"}
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        for bad in (no_epoch, dict(state, epoch="0"), dict(state, epoch=None)):
            with pytest.raises(shardfeed.ConfigError, match="'epoch'"):
                loader.load_state_dict(bad)
        # A dict whose epoch is not the saved position's: refused, and the
        # loader stays where it was (at the start of epoch 0).
        for bad in ("no", None, 2, 0.0):
            with pytest.raises(shardfeed.ConfigError, match="'ended'"):
                loader.load_state_dict(dict(state, ended=bad))
        with pytest.raises(shardfeed.CorruptError, match="epoch 0"):
            loader.load_state_dict(dict(state, epoch=5))
        assert loader.epoch == 0
        first = read_batches(loader, limit=1)
        assert first[0].index == 0 and first[0].epoch == 0
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        # What a checkpointer may turn the int into is still taken.
        loader.load_state_dict(dict(state, epoch=np.int64(0), ended=np.bool_(False)))
        assert read_batches(loader, limit=1)[0].index == 3


def test_sources_with_a_nul_character_are_refused(dataset):
    """C would read the URL up to the NUL: another source than the one given."""
    ds = dataset
    with pytest.raises(shardfeed.ConfigError, match=r"sources\[1\].*NUL"):
        shardfeed.Loader([ds.shard_urls[0], ds.url + "\0shard-000001.tar"], **options(ds))


def test_every_entry_point_takes_the_same_forms_of_sources(packed):
    """Loader took a path object but not bytes (a bytes path was iterated
    into ints: a TypeError about an int), doctor and tune took neither (a
    Path was iterated), the tools took paths. Each takes a str, bytes or a
    path, or a list of them, and refuses anything else with ConfigError
    naming the call and the type."""
    import os
    import pathlib
    shard = os.path.join(packed.folder, packed.names[0])
    counts = []
    for form in (shard, shard.encode(), pathlib.Path(shard), [pathlib.Path(shard)],
                 (shard.encode(),)):
        with shardfeed.Loader(form, batch_size=1, size=32, decode_threads=1,
                              device="host") as l:
            counts.append(sum(b.size for b in l))
    assert counts[0] > 0 and counts == [counts[0]] * 5, counts
    missing = pathlib.Path(packed.folder) / "no-such-shard.tar"
    for call in (lambda s: shardfeed.doctor(s, seconds=0.2),
                 lambda s: shardfeed.tune(s, budget_s=1)):
        for form in (missing, bytes(missing), [missing]):
            with pytest.raises(shardfeed.NotFoundError, match="no-such-shard.tar"):
                call(form)
    for bad, name in ((5, "int"), ([shard, 5], "int"), ([None], "NoneType")):
        for fn, call in (("Loader", lambda s: shardfeed.Loader(s)),
                         ("doctor", lambda s: shardfeed.doctor(s, seconds=0.2)),
                         ("warm_cache", lambda s: shardfeed.warm_cache(s, cache_dir="/tmp/x"))):
            with pytest.raises(shardfeed.ConfigError, match=f"{fn}: sources: .*{name}"):
                call(bad)


def test_option_strings_with_a_nul_and_non_finite_numbers_are_refused(dataset, tmp_path):
    """C would take the path up to the NUL (another folder than the one
    given); NaN is not JSON: each is refused naming the option."""
    ds = dataset
    cut = tmp_path / "cache\0dir"
    with pytest.raises(shardfeed.ConfigError, match="option 'cache_dir': holds a NUL"):
        shardfeed.Loader(ds.url, **options(ds, ram_only=False, cache_dir=str(cut)))
    with pytest.raises(shardfeed.ConfigError, match="option 'extra_fields': holds a NUL"):
        shardfeed.Loader(ds.url, **options(ds, extra_fields=["cls", "j\0pg"]))
    with pytest.raises(shardfeed.ConfigError, match="option 'scale_min': nan"):
        shardfeed.Loader(ds.url, **options(ds, scale_min=float("nan")))
    with pytest.raises(shardfeed.ConfigError, match="warm_cache: option 'cache_dir': holds a NUL"):
        shardfeed.warm_cache(ds.url, cache_dir=str(cut), endpoint_url=ds.endpoint_url)
    assert list(tmp_path.iterdir()) == []


def test_an_error_naming_a_key_that_is_not_utf8_is_still_the_error(tmp_path, caplog):
    """A tar member name in Latin-1 quoted in a CorruptError's message or a
    log line: the exception is the CorruptError and the line reaches logging
    (the bytes escaped), not a UnicodeDecodeError of the text."""
    shard = tmp_path / "latin1.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as t:
        for name, data in (("caf\xe9.jpg", b"\xff\xd8 not a JPEG" * 8), ("caf\xe9.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    with shardfeed.Loader(str(shard), batch_size=1, size=32, device="host",
                          ram_only=True) as loader:
        with pytest.raises(shardfeed.CorruptError) as ei:
            loader.next_batch()
    assert "'caf\\xe9'" in str(ei.value), str(ei.value)
    assert ei.value.status_name in ("SF_ERR_CORRUPT", "SF_ERR_PARSE")
    caplog.set_level(logging.WARNING, logger="shardfeed")
    with shardfeed.Loader(str(shard), batch_size=1, size=32, device="host", ram_only=True,
                          on_error="skip") as loader:
        assert loader.next_batch() is None  # its only sample skipped
    assert any("skipped" in r.getMessage() and "caf\\xe9" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_doctor_and_tune_refuse_an_infinite_time(dataset):
    """seconds=inf passed the positive check and ran each stage forever."""
    ds = dataset
    for call in (lambda: shardfeed.doctor(ds.url, seconds=float("inf"), **options(ds)),
                 lambda: shardfeed.tune(ds.url, budget_s=float("inf"), **options(ds)),
                 lambda: shardfeed.Loader(ds.url, autotune=float("inf"), **options(ds))):
        with pytest.raises(shardfeed.ConfigError, match="positive finite number, got inf"):
            call()


def test_dlpack_stream_on_a_host_array_is_refused(dataset):
    """The array API: a device without streams accepts stream=None only (a
    stream given was ignored, as if the consumer's work were ordered)."""
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        b = loader.next_batch()
        for s in (1, 2, -1, 12345):
            with pytest.raises(ValueError, match="stream=None only"):
                b.images.__dlpack__(stream=s)
        assert np.from_dlpack(b.labels).shape == (len(b),)
        b.release()
        assert ring_is_free(loader, 3)


def test_dlpack_copy_whose_truth_raises_propagates_it(dataset):
    ds = dataset

    class NoTruth:
        def __bool__(self):
            raise ZeroDivisionError("no truth value")

    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        b = loader.next_batch()
        labels = b.labels
        with pytest.raises(ZeroDivisionError, match="no truth value"):
            labels.__dlpack__(copy=NoTruth())
        # The refused export holds nothing: one capsule made and dropped
        # unconsumed, and the rest, hand the slot back.
        cap = labels.__dlpack__(max_version=(1, 0))
        del cap, labels, b
        assert ring_is_free(loader, 3)
