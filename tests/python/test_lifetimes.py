"""Who keeps a ring slot alive: batches, their views and tensors, the loader,
set_epoch, release(), garbage collection, fork() and process memory."""
import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardfeed
from sfutil import (SANITIZED, Got, check_epoch, need_torch, options, read_batches,
                    rss_bytes)


def ring_is_free(loader, prefetch_batches):
    """True when prefetch_batches - 1 batches can be held at once, i.e. no
    slot is still held by something the test dropped."""
    held = []
    try:
        for _ in range(prefetch_batches - 1):
            b = loader.next_batch()
            if b is None:
                break
            held.append(b)
        return True
    except shardfeed.LimitError:
        return False
    finally:
        for b in held:
            b.release()


def test_a_tensor_outlives_its_batch(dataset):
    torch = need_torch()
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        b = loader.next_batch()
        t = torch.from_dlpack(b.images)
        labels = torch.from_dlpack(b.labels)
        want = t.clone()
        want_labels = labels.clone()
        del b
        gc.collect()
        # The ring goes round many times; the tensor's slot must not be reused.
        rest = read_batches(loader)
        assert len(rest) == ds.n // 8 - 1
        for _ in range(2):
            read_batches(loader)  # two more epochs
        assert torch.equal(t, want) and torch.equal(labels, want_labels)
        del t, labels
        assert ring_is_free(loader, 3)


@pytest.mark.parametrize("order", ["batch-first", "views-first", "torch-last", "numpy-last"])
def test_views_dropped_in_any_order_hand_the_slot_back(dataset, order):
    torch = need_torch()
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        b = loader.next_batch()
        img = b.images
        n = np.from_dlpack(img)
        t = torch.from_dlpack(img)
        n2 = t.numpy()  # a view of the tensor: keeps the tensor, which keeps the slot
        lab = torch.from_dlpack(b.labels)
        want = n.copy()
        names = {"batch-first": ["b", "img", "n", "t", "n2", "lab"],
                 "views-first": ["n", "n2", "t", "lab", "img", "b"],
                 "torch-last": ["b", "n", "img", "n2", "lab", "t"],
                 "numpy-last": ["t", "lab", "b", "img", "n", "n2"]}[order]
        objs = {"b": b, "img": img, "n": n, "t": t, "n2": n2, "lab": lab}
        del b, img, n, t, n2, lab
        for i, name in enumerate(names):
            obj = objs.pop(name)
            if name in ("n", "n2"):
                assert np.array_equal(obj, want)
            elif name == "t":
                assert np.array_equal(obj.numpy(), want)
            del obj
            if objs:
                # Something still holds the slot: only one more batch fits.
                assert not ring_is_free(loader, 3), f"slot freed with {sorted(objs)} alive"
        gc.collect()
        assert ring_is_free(loader, 3), "the slot never came back"


def _batches_in_cycles(loader, n):
    for _ in range(n):
        b = loader.next_batch()
        cycle = [b]
        cycle.append(cycle)  # only the collector frees it
        del b, cycle


def test_a_batch_in_a_reference_cycle_is_collected_before_limit_error(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        old = gc.get_threshold()
        gc.set_threshold(1000000)  # no automatic collection meanwhile
        try:
            _batches_in_cycles(loader, 4)
            # Cycles hold the ring's two slots: next() collects, then goes on.
            got = read_batches(loader)
        finally:
            gc.set_threshold(*old)
        assert len(got) == ds.n // 8 - 4


def test_a_batch_in_a_reference_cycle_is_collected_with_gc_disabled(dataset):
    """Training scripts often gc.disable(); "after one gc pass" must still
    collect (PyGC_Collect() does nothing while the collector is disabled,
    gc.collect() does)."""
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        gc.disable()
        try:
            _batches_in_cycles(loader, 4)
            got = read_batches(loader)
        finally:
            gc.enable()
        assert len(got) == ds.n // 8 - 4


def test_a_batch_held_across_set_epoch_keeps_its_contents(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        first = read_batches(loader, limit=1)[0]
        b = loader.next_batch()
        kept = Got(b)
        view = np.from_dlpack(b.images)
        loader.set_epoch(1)
        one = read_batches(loader)
        check_epoch(ds, one)
        assert all(g.epoch == 1 for g in one)
        loader.set_epoch(0)
        zero = read_batches(loader)
        assert zero[0] == first  # epoch 0 again, from its start
        assert (b.epoch, b.index) == (0, 1)
        assert Got(b) == kept and np.array_equal(view, kept.images)
        b.release()
        assert np.array_equal(view, kept.images)  # the view keeps the slot
        del view
        assert ring_is_free(loader, 3)


@pytest.mark.parametrize("how", ["close", "del", "with"])
def test_tensors_outlive_the_loader(dataset, how):
    torch = need_torch()
    ds = dataset
    loader = shardfeed.Loader(ds.url, **options(ds))
    read_batches(loader, limit=1)
    b = loader.next_batch()
    keys = b.keys
    t = torch.from_dlpack(b.images)
    n = np.from_dlpack(b.labels)
    want = t.clone()
    want_labels = n.copy()
    if how == "close":
        loader.close()
        assert loader.closed
        with pytest.raises(shardfeed.ConfigError, match="closed"):
            loader.next_batch()
    elif how == "with":
        with loader:
            pass
    del loader
    gc.collect()
    assert torch.equal(t, want) and np.array_equal(n, want_labels)
    assert [ds.label_of[k] for k in keys] == n.tolist()
    # The batch works too, until released.
    assert b.keys == keys and np.array_equal(np.from_dlpack(b.images), want.numpy())
    del b
    assert torch.equal(t, want)
    t += 1  # still writable memory
    assert torch.equal(t, want + 1)
    del t, n
    gc.collect()


def test_release_keeps_exported_views_and_refuses_new_ones(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=2)) as loader:
        with loader.next_batch() as b:
            img = b.images
            n = np.from_dlpack(img)
            want = n.copy()
        assert b.released
        with pytest.raises(shardfeed.ConfigError, match="released"):
            b.images
        with pytest.raises(shardfeed.ConfigError):
            len(b)
        b.release()  # twice: nothing happens
        # The Array taken before release still exports (it holds the slot).
        assert np.array_equal(np.from_dlpack(img), want) and np.array_equal(n, want)
        with pytest.raises(shardfeed.LimitError):
            loader.next_batch()  # prefetch_batches 2: the one slot is still held
        del img, n
        c = loader.next_batch()
        assert c.index == 1
        c.release()


def test_memory_stays_flat_over_20_epochs(dataset):
    if SANITIZED:
        pytest.skip("RSS under ASan grows with its quarantine, not with the program")
    torch = need_torch()
    ds = dataset
    # 224x224 batches of 32: a ring slot is 4.8 MB, the ring 19 MB. Leaking a
    # slot, a batch's keys, its views or the ring per epoch would add
    # hundreds of MB over 17 epochs.
    o = options(ds, batch_size=32, size=224, prefetch_batches=4, ram_only=True)
    slot = 32 * 3 * 224 * 224
    with shardfeed.Loader(ds.url, **o) as loader:
        def epoch():
            n = 0
            for b in loader:
                t = torch.from_dlpack(b.images)
                a = np.from_dlpack(b.labels)
                n += int(t[:, 0, 0, 0].sum() >= 0) + len(b.keys) + len(a)
                del t, a
            return n
        for _ in range(3):
            epoch()
        gc.collect()
        warm = rss_bytes()
        for _ in range(17):
            assert epoch() > 0
        gc.collect()
        grown = rss_bytes() - warm
    assert grown < 3 * slot, f"RSS grew {grown / 1e6:.1f} MB over 17 epochs"


FORK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import shardfeed
    url, opts = sys.argv[1], json.loads(sys.argv[2])
    n_all = int(sys.argv[3])

    def keys_of_epoch(loader):
        keys = []
        for b in loader:
            keys += b.keys
            b.release()
        return keys

    parent = shardfeed.Loader(url, **opts)
    held = parent.next_batch()          # the parent's threads are running
    first = list(held.keys)
    parent_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        # A hung child must not outlive the test (which kills the parent).
        import ctypes, signal
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:
            os._exit(5)
        # The child never touches the parent's loader or batch: it opens its own.
        try:
            with shardfeed.Loader(url, **opts) as mine:
                keys = keys_of_epoch(mine)
            ok = sorted(keys) == sorted(set(keys)) and len(keys) == n_all
            print(json.dumps({"who": "child", "n": len(keys), "ok": ok}), flush=True)
            code = 0 if ok else 3
        except BaseException as e:
            print(json.dumps({"who": "child", "error": repr(e)}), flush=True)
            code = 4
        # A normal exit: the interpreter frees the parent's loader copy too.
        sys.exit(code)
    _, status = os.waitpid(pid, 0)
    held.release()
    rest = keys_of_epoch(parent)
    keys = first + rest
    ok = sorted(keys) == sorted(set(keys)) and len(keys) == n_all
    again = keys_of_epoch(parent)       # and the next epoch
    parent.close()
    print(json.dumps({"who": "parent", "n": len(keys), "ok": ok and len(again) == n_all,
                      "child_status": os.waitstatus_to_exitcode(status)}), flush=True)
""")


@pytest.mark.skipif(SANITIZED, reason="GCC 12's ASan runtime locks its allocator without "
                    "fork handlers: a child forked while a loader thread allocates can hang in "
                    "malloc; the normal build runs this test")
def test_a_forked_child_opens_its_own_loader_and_the_parent_goes_on(dataset, tmp_path):
    ds = dataset
    script = tmp_path / "fork_loader.py"
    script.write_text(FORK_SCRIPT)
    o = options(ds, ram_only=False, cache_dir=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(script), ds.url, json.dumps(o), str(ds.n)],
                       capture_output=True, timeout=120)
    out = [json.loads(line) for line in r.stdout.decode().splitlines() if line.startswith("{")]
    assert r.returncode == 0, (r.returncode, out, r.stderr.decode()[-3000:])
    child = [x for x in out if x["who"] == "child"]
    parent = [x for x in out if x["who"] == "parent"]
    assert child == [{"who": "child", "n": ds.n, "ok": True}], (out, r.stderr.decode()[-3000:])
    assert parent and parent[0]["ok"] and parent[0]["n"] == ds.n, out
    assert parent[0]["child_status"] == 0


def _held():
    """Descriptors and threads of this process."""
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def test_open_close_cycles_with_tensors_alive_give_everything_back(dataset):
    """Loaders opened, read, closed (or dropped) while a batch and its array
    are alive, the arrays dropped after: descriptors and threads back to
    where they were (SF_TEST_CYCLES=200 for a long run)."""
    ds = dataset
    o = options(ds)

    def cycle(i):
        loader = shardfeed.Loader(ds.url, **o)
        b = loader.next_batch()
        a = np.from_dlpack(b.images)
        if i % 2:
            loader.close()
        else:
            del loader
        return a, b

    kept = [cycle(0)]
    del kept
    gc.collect()
    before = _held()
    kept = []
    for i in range(int(os.environ.get("SF_TEST_CYCLES", "24"))):
        kept.append(cycle(i))
        if len(kept) > 3:  # a few alive across the next open and close
            kept.pop(0)
    kept.clear()
    gc.collect()
    assert _held() == before
