"""Ranks in separate processes: torch.distributed (gloo) and torchrun's
environment variables split the epoch into disjoint parts of equal length."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from sfutil import need_torch, options

WORKER = textwrap.dedent("""
    import json, os, sys
    url, opts, out, use_torch = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    if use_torch == "1":
        import torch
        import torch.distributed as dist
        # RANK, WORLD_SIZE, MASTER_*, as torchrun sets them; the loader takes
        # rank and world size from the initialised process group.
        dist.init_process_group("gloo", init_method="env://")
    import numpy
    import shardfeed

    def barrier(n):
        if use_torch == "1":
            dist.barrier()
            return
        import time
        d = os.path.dirname(out)
        open(os.path.join(d, f"barrier-{n}-{os.environ['RANK']}"), "w").close()
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 120
        names = [os.path.join(d, f"barrier-{n}-{r}") for r in range(world)]
        while not all(os.path.exists(x) for x in names):
            assert time.monotonic() < deadline, "barrier: the other ranks never came"
            time.sleep(0.01)

    epochs = []
    with shardfeed.Loader(url, **opts) as loader:
        n_batches = len(loader)
        for epoch in range(2):
            if epoch:
                # What DDP's collective of the last step does: every rank has
                # its last batch of the epoch before any starts the next
                # (docs/sampling.md, "When learned counts are used").
                barrier(epoch)
            loader.set_epoch(epoch)
            got = []
            for b in loader:
                got.append({"keys": list(b.keys), "pad": list(b.pad),
                            "labels": numpy.from_dlpack(b.labels).tolist()})
                b.release()
            st = loader.stats()
            epochs.append({"batches": got, "dropped": st["dropped_samples"],
                           "pads": st["pad_samples"], "known": loader.epoch_size_known})
    res = {"len": n_batches, "epochs": epochs}
    if use_torch == "1":
        # Every rank saw the same number of batches: a collective per batch
        # would have matched (DDP hangs otherwise).
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, [len(e["batches"]) for e in epochs])
        res["all_counts"] = counts
        res["rank"] = dist.get_rank()
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(res, f)
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(ds, tmp_path, world, use_torch, **kw):
    script = tmp_path / "rank_worker.py"
    script.write_text(WORKER)
    o = options(ds, **kw)
    for k in ("rank", "world_size"):
        o.pop(k)
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        out = tmp_path / f"rank{rank}.json"
        procs.append((subprocess.Popen(
            [sys.executable, str(script), ds.url, json.dumps(o), str(out),
             "1" if use_torch else "0"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), out))
    results = []
    for p, out in procs:
        try:
            text, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q, _o in procs:
                q.kill()
            raise
        assert p.returncode == 0, text.decode(errors="replace")[-4000:]
        results.append(json.loads(out.read_text()))
    return results


def check_split(ds, results, exact_epochs=(0, 1)):
    """Equal batch counts, disjoint samples with their labels; every sample
    on some rank in the epochs whose counts are exact (without index.json
    the first epoch is planned on estimates and may drop a few samples at
    the end of a rank's stream: docs/sampling.md)."""
    world = len(results)
    assert len({r["len"] for r in results}) == 1, [r["len"] for r in results]
    dropped_before = [0] * world
    for epoch in range(2):
        counts = [len(r["epochs"][epoch]["batches"]) for r in results]
        assert len(set(counts)) == 1, f"epoch {epoch}: batches per rank {counts}"
        real = []
        for r in results:
            batches = r["epochs"][epoch]["batches"]
            mine = [k for b in batches for k, p in zip(b["keys"], b["pad"]) if not p]
            assert len(mine) == len(set(mine)), "a rank got a sample twice"
            real.append(set(mine))
            for b in batches:
                assert b["labels"] == [ds.label_of[k] for k in b["keys"]]
        for i in range(world):
            for j in range(i + 1, world):
                assert not real[i] & real[j], f"epoch {epoch}: ranks {i} and {j} share samples"
        union = set().union(*real)
        missing = set(ds.keys) - union
        dropped = [r["epochs"][epoch]["dropped"] - d for r, d in zip(results, dropped_before)]
        dropped_before = [r["epochs"][epoch]["dropped"] for r in results]
        if epoch in exact_epochs:
            assert not missing, f"epoch {epoch}: {len(missing)} samples on no rank " \
                                f"(dropped {dropped})"
        else:
            assert len(missing) == sum(dropped), (len(missing), dropped)
        # Pads only even the ranks out: fewer than a batch on each.
        pads = [sum(p for b in r["epochs"][epoch]["batches"] for p in b["pad"])
                for r in results]
        assert all(p < 8 for p in pads), pads
    # Another epoch, another split.
    assert [b["keys"] for b in results[0]["epochs"][0]["batches"]] != \
        [b["keys"] for b in results[0]["epochs"][1]["batches"]]


@pytest.mark.parametrize("which", ["dataset", "webdataset_s3"])
def test_two_ranks_with_torch_distributed_split_every_epoch(which, request, tmp_path):
    need_torch()
    ds = request.getfixturevalue(which)
    # A shared cache directory, as ranks on one node have: without
    # index.json, epoch 1 uses the counts learned in epoch 0.
    results = run_ranks(ds, tmp_path, 2, True, ram_only=False,
                        cache_dir=str(tmp_path / "cache"))
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["all_counts"][0] == r["all_counts"][1]
    check_split(ds, results, exact_epochs=(0, 1) if ds.shards.indexed else (1,))


@pytest.mark.parametrize("which", ["dataset", "webdataset_s3"])
def test_three_ranks_from_torchrun_environment_without_torch(which, request, tmp_path):
    ds = request.getfixturevalue(which)
    results = run_ranks(ds, tmp_path, 3, False, ram_only=False,
                        cache_dir=str(tmp_path / "cache"))
    check_split(ds, results, exact_epochs=(0, 1) if ds.shards.indexed else (1,))
