"""shardfeed.torch: ShardDataset and to_tensors on local tar shards.

Skipped when torch (or PIL, which makes the test images) is missing. The
shards are made once per session: 60 small JPEGs in 3 class folders, packed
by shardfeed.pack into tar shards with index.json.
"""
import os
import pickle
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

import shardfeed  # noqa: E402
import shardfeed.torch as sft  # noqa: E402

CLASSES = ("ant", "bee", "cat")
PER_CLASS = 20
TOTAL = len(CLASSES) * PER_CLASS
BATCH = 8


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_ds")
    photos = root / "photos"
    for c, name in enumerate(CLASSES):
        (photos / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            # a colour per class and image, so images differ
            img = Image.new("RGB", (64 + i, 48), (40 * c + 20, 7 * i, 200 - 40 * c))
            img.save(photos / name / f"{name}_{i:03d}.jpg", quality=90)
    out = root / "shards"
    shardfeed.pack(str(photos), str(out), shard_bytes="24K")
    assert len(list(out.glob("*.tar"))) >= 4
    return str(out) + "/"


def options(**extra):
    o = dict(batch_size=BATCH, size=32, device="host", decode_threads=2, seed=7)
    o.update(extra)
    return o


def collect(ds):
    """The items of one epoch through a DataLoader, the image views dropped
    as a training loop drops them (each holds a ring slot)."""
    out = []
    for item in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
        images = item.pop("images")
        item.update(shape=tuple(images.shape), dtype=images.dtype,
                    labels=item["labels"].clone(), pad=item["pad"].clone())
        out.append(item)
    return out


def test_importing_shardfeed_torch_does_not_import_torch():
    code = ("import sys, shardfeed, shardfeed.torch; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ))
    assert r.returncode == 0


def test_dataset_through_dataloader_delivers_every_sample_once(shards):
    ds = sft.ShardDataset(shards, **options())
    assert isinstance(ds, torch.utils.data.IterableDataset)
    items = collect(ds)
    assert len(items) == len(ds) == (TOTAL + BATCH - 1) // BATCH
    keys = [k for it in items for k in it["keys"]]
    assert sorted(keys) == sorted(f"{c}/{c}_{i:03d}" for c in CLASSES for i in range(PER_CLASS))
    for it in items:
        n = len(it["keys"])
        assert it["shape"] == (n, 3, 32, 32) and it["dtype"] == torch.uint8
        assert it["labels"].dtype == torch.int64 and it["labels"].shape == (n,)
        assert it["pad"].dtype == torch.bool and not it["pad"].any()
        # the label is the class folder's index (sorted class names)
        want = [CLASSES.index(k.split("/")[0]) for k in it["keys"]]
        assert it["labels"].tolist() == want


def test_epochs_follow_set_epoch_and_differ(shards):
    ds = sft.ShardDataset(shards, **options())
    ds.set_epoch(3)  # before the loader opens: its first epoch
    first = [k for it in collect(ds) for k in it["keys"]]
    assert ds.epoch == 3
    ds.set_epoch(4)
    second = [k for it in collect(ds) for k in it["keys"]]
    assert sorted(first) == sorted(second) and first != second
    again = sft.ShardDataset(shards, **options())
    again.set_epoch(3)
    assert [k for it in collect(again) for k in it["keys"]] == first


def test_worker_processes_are_refused_with_the_reason(shards):
    ds = sft.ShardDataset(shards, **options())
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    with pytest.raises(Exception, match="num_workers=0") as info:
        next(iter(dl))
    assert "decode_threads" in str(info.value)


def test_to_tensors_shares_the_ring_memory(shards):
    with shardfeed.Loader(shards, **options()) as loader:
        batch = next(iter(loader))
        images, labels = sft.to_tensors(batch)
        assert images.data_ptr() == batch.images.data_ptr
        assert labels.data_ptr() == batch.labels.data_ptr
        assert images.device.type == "cpu" and labels.device.type == "cpu"
        host, _ = sft.to_tensors(batch, "cpu")
        assert host.data_ptr() == images.data_ptr()
        assert labels.tolist() == [CLASSES.index(k.split("/")[0]) for k in batch.keys]
        # the tensors keep the slot after the batch lets go of it
        pixels = images.clone()
        batch.release()
        del batch
        assert torch.equal(images, pixels)


def test_state_dict_resumes_at_the_next_batch(shards):
    ds = sft.ShardDataset(shards, **options())
    it = iter(ds)
    for _ in range(3):
        next(it)
    state = ds.state_dict()
    want = next(it)["keys"]
    other = sft.ShardDataset(shards, **options())
    other.load_state_dict(state)
    assert next(iter(other))["keys"] == want


def test_rank_and_world_size_come_from_torchrun_variables(shards, monkeypatch):
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = sft.ShardDataset(shards, **options(epoch_policy="uneven"))
        seen.append({k for it in collect(ds) for k in it["keys"]})
        ds.close()
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == TOTAL


def test_explicit_rank_wins_over_the_environment(shards, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = sft.ShardDataset(shards, **options(rank=0, world_size=1))
    assert sum(len(it["keys"]) for it in collect(ds)) == TOTAL


def test_extra_fields_arrive_as_lists_of_bytes(shards):
    ds = sft.ShardDataset(shards, **options(extra_fields="cls"))
    item = next(iter(ds))
    assert item["cls"] == [str(v).encode() for v in item["labels"].tolist()]


def test_a_pickled_dataset_opens_its_own_loader(shards):
    ds = sft.ShardDataset(shards, **options())
    next(iter(ds))
    copy = pickle.loads(pickle.dumps(ds))
    assert "not opened" in repr(copy)
    assert sum(len(it["keys"]) for it in collect(copy)) == TOTAL


def test_an_initialised_process_group_wins_over_the_environment(shards, monkeypatch, tmp_path):
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        ds = sft.ShardDataset(shards, **options())
        assert sum(len(it["keys"]) for it in collect(ds)) == TOTAL
    finally:
        dist.destroy_process_group()


def test_a_caught_error_does_not_end_the_epoch_through_the_dataloader(shards):
    # Items view the ring: holding prefetch_batches - 1 of them makes the
    # next one raise LimitError. Caught, and the items freed, the same
    # DataLoader iterator goes on with the rest of the epoch (the loader's
    # own iterator does; a generator would have ended at the exception).
    ds = sft.ShardDataset(shards, **options(prefetch_batches=3))
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0))
    held = [next(it), next(it)]
    with pytest.raises(shardfeed.LimitError):
        next(it)
    keys = [k for item in held for k in item["keys"]]
    held.clear()
    keys += [k for item in it for k in item["keys"]]
    assert sorted(keys) == sorted(f"{c}/{c}_{i:03d}" for c in CLASSES for i in range(PER_CLASS))


def test_torchrun_variables_are_parsed_as_strictly_as_by_the_loader(shards, monkeypatch):
    # docs/sampling.md: ASCII digits only. Python's int() also takes "+0",
    # " 1" and "1_0": the dataset would run on a rank the loader refuses.
    monkeypatch.setenv("RANK", "+0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(shardfeed.ConfigError, match="RANK"):
        shardfeed.Loader(shards, **options())
    with pytest.raises(shardfeed.ConfigError, match="RANK"):
        len(sft.ShardDataset(shards, **options()))


def test_epoch_none_keeps_the_default_before_the_loader_opens(shards):
    # A keyword set to None keeps the default (docs/python.md): epoch 0.
    ds = sft.ShardDataset(shards, **options(epoch=None))
    assert ds.epoch == 0
    assert len(ds) == (TOTAL + BATCH - 1) // BATCH and ds.epoch == 0


def test_a_closed_dataset_reopens_at_the_epoch_set_last(shards):
    # close() drops the loader; the next iteration opens a new one, which
    # must read the epoch set_epoch() named, not the constructor's.
    want = [k for it in collect(sft.ShardDataset(shards, **options(epoch=5))) for k in it["keys"]]
    ds = sft.ShardDataset(shards, **options(epoch=1))
    collect(ds)
    ds.set_epoch(5)
    ds.close()
    assert ds.epoch == 5
    assert [k for it in collect(ds) for k in it["keys"]] == want
    assert ds.epoch == 5


def test_a_closed_dataset_reopens_at_the_epoch_it_had_reached(shards):
    # Epoch 2 read to its end, then closed: the next iteration is epoch 3,
    # as it would have been without the close.
    want = [k for it in collect(sft.ShardDataset(shards, **options(epoch=3))) for k in it["keys"]]
    ds = sft.ShardDataset(shards, **options())
    ds.set_epoch(2)
    collect(ds)
    ds.close()
    assert ds.epoch == 3
    assert [k for it in collect(ds) for k in it["keys"]] == want


def _as_tensors(state):
    """state as a checkpointer that keeps tensors hands it back."""
    return {**state,
            "state": torch.frombuffer(bytearray(state["state"]), dtype=torch.uint8),
            "epoch": torch.tensor(state["epoch"]),
            "batches_delivered": torch.tensor(state["batches_delivered"]),
            "ended": torch.tensor(state["ended"])}


def test_load_state_dict_takes_cpu_tensors(shards, tmp_path):
    with shardfeed.Loader(shards, **options(epoch=2)) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it).release()
        state = loader.state_dict()
        want = next(it).keys
    tensors = _as_tensors(state)
    torch.save(tensors, tmp_path / "ckpt.pt")
    for loaded in (tensors, torch.load(tmp_path / "ckpt.pt")):
        assert isinstance(loaded["state"], torch.Tensor)
        with shardfeed.Loader(shards, **options()) as other:
            other.load_state_dict(loaded)
            assert other.epoch == 2
            assert next(iter(other)).keys == want


def test_load_state_dict_names_the_key_of_a_tensor_it_cannot_take(shards):
    with shardfeed.Loader(shards, **options()) as loader:
        state = loader.state_dict()
        good = _as_tensors(state)
        bad = {"state": good["state"].to(torch.float32),
               "epoch": torch.tensor(float(state["epoch"])),
               "ended": torch.tensor([0, 1])}
        for key, value in bad.items():
            with pytest.raises((TypeError, ValueError), match=repr(key)):
                loader.load_state_dict({**good, key: value})

        class CudaTensor:  # what a tensor on the GPU looks like to the loader
            __module__ = "torch"
            device = torch.device("cuda", 0)
            dtype = torch.uint8
            shape = (4,)

            def tolist(self):
                raise AssertionError("read a tensor on the GPU")

            numpy = tolist
        with pytest.raises(ValueError, match="'state'.*cuda"):
            loader.load_state_dict({**good, "state": CudaTensor()})
        loader.load_state_dict(good)  # still usable
