"""shardfeed.Loader against the mock S3 server: epochs, order, zero copy,
checkpoints, errors and faults."""
import json
import os
import pickle
import shutil
import tarfile

import numpy as np
import pytest

import shardfeed
from conftest import pack, put_shards, Shards
from sfutil import (Got, check_epoch, class_of_pixels, keys_of, need_torch, open_and_read,
                    options, read_batches)


@pytest.fixture(params=["indexed", "webdataset"])
def any_dataset(request):
    """The packed shards with index.json, and plain GNU tar shards without."""
    name = "dataset" if request.param == "indexed" else "webdataset_s3"
    return request.getfixturevalue(name)


# ------------------------------------------------------------ epochs and order

def test_extra_fields_come_as_bytes_per_sample(dataset):
    """extra_fields: each sample's raw member bytes, lined up with the keys
    and labels (the "cls" member holds the label as text)."""
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, extra_fields="cls")) as loader:
        n = 0
        for b in loader:
            fields = b.fields
            assert list(fields) == ["cls"] and len(fields["cls"]) == len(b)
            labels = np.from_dlpack(b.labels).tolist()
            assert [int(v) for v in fields["cls"]] == labels
            assert [ds.label_of[k] for k in b.keys] == labels
            assert b.fields is fields  # made once per batch
            n += len(b)
            b.release()
        assert n == ds.n



def test_one_epoch_gives_every_sample_once_with_its_label(any_dataset):
    ds = any_dataset
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        assert loader.shards == ds.shard_urls
        if ds.shards.indexed:
            assert loader.epoch_size_known
            assert loader.epoch_samples == ds.n
        assert len(loader) == ds.n // 8  # 96 samples, batches of 8
        assert loader.epoch == 0
        got = []
        for b in loader:
            assert isinstance(b, shardfeed.Batch)
            assert (b.epoch, b.index, b.position) == (0, len(got), 8 * len(got))
            assert len(b) == b.size == 8
            assert (b.width, b.height, b.layout, b.dtype) == (32, 32, "chw", "uint8")
            assert b.images.shape == (8, 3, 32, 32) and b.images.dtype == "uint8"
            assert b.images.device == ("cpu", 0)
            assert b.images.nbytes == 8 * 3 * 32 * 32
            assert b.labels.shape == (8,) and b.labels.dtype == "int64"
            assert b.flags.dtype == "uint32" and not np.from_dlpack(b.flags).any()
            assert all(0 <= s < len(ds.shard_urls) for s in b.shards)
            for key, url in zip(b.keys, b.shard_urls):
                # The key's shard really holds it.
                with tarfile.open(ds.shard_path(os.path.basename(url))) as t:
                    assert key + ".jpg" in t.getnames()
            got.append(Got(b))
            b.release()
        check_epoch(ds, got)
        assert len(got) == len(loader)
        assert loader.epoch_size_known and loader.epoch_samples == ds.n
        st = loader.stats()
        assert st["samples_delivered"] == ds.n and st["batches_delivered"] == len(got)
        assert st["samples_skipped"] == 0 and st["pad_samples"] == 0

        # Iterating again reads the next epoch: every sample again, in another order.
        again = read_batches(loader)
        assert loader.epoch == 1 and all(g.epoch == 1 for g in again)
        check_epoch(ds, again)
        assert keys_of(again) != keys_of(got)


def test_same_seed_gives_identical_batches_another_seed_another_order(any_dataset, tmp_path):
    ds = any_dataset
    runs = []
    for seed, threads, cache in ((7, 2, None), (7, 1, str(tmp_path / "c")), (8, 2, None)):
        o = options(ds, seed=seed, decode_threads=threads)
        if cache:
            o.update(ram_only=False, cache_dir=cache)
        with shardfeed.Loader(ds.url, **o) as loader:
            runs.append(read_batches(loader))
    a, b, c = runs
    assert len(a) == len(b) and all(x == y for x, y in zip(a, b)), \
        "the same seed gave other batches"
    assert [g.digest() for g in a] == [g.digest() for g in b]
    check_epoch(ds, c)
    assert keys_of(c) != keys_of(a)


def test_drop_last_and_a_short_last_batch(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, batch_size=10)) as loader:
        got = read_batches(loader)
    assert [len(g.keys) for g in got] == [10] * 9 + [6]
    check_epoch(ds, got)
    with shardfeed.Loader(ds.url, **options(ds, batch_size=10, drop_last=True)) as loader:
        assert len(loader) == 9
        got = read_batches(loader)
    assert [len(g.keys) for g in got] == [10] * 9
    assert len(set(keys_of(got))) == 90


def test_set_epoch_reads_that_epoch_from_its_start(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        loader.set_epoch(3)
        three = read_batches(loader)
    with shardfeed.Loader(ds.url, **options(ds, epoch=3)) as loader:
        assert loader.epoch == 3
        assert read_batches(loader) == three
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        read_batches(loader, limit=2)  # part of epoch 0, then epoch 3 anyway
        loader.set_epoch(3)
        assert read_batches(loader) == three
    assert all(g.epoch == 3 for g in three)
    check_epoch(ds, three)


# ------------------------------------------------------------ zero copy

def test_views_share_the_ring_memory(dataset):
    torch = need_torch()
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        b = loader.next_batch()
        img = b.images
        n = np.from_dlpack(img)
        t = torch.from_dlpack(img)
        assert n.ctypes.data == img.data_ptr == t.data_ptr()
        assert n.shape == tuple(t.shape) == img.shape == (8, 3, 32, 32)
        assert n.dtype == np.uint8 and t.dtype == torch.uint8
        assert not n.flags.owndata

        # Writing through one view shows in a second view of the same batch.
        second = np.from_dlpack(b.images)
        before = int(second[2, 1, 5, 7])
        n[2, 1, 5, 7] = (before + 101) % 256
        assert int(second[2, 1, 5, 7]) == (before + 101) % 256
        assert int(t[2, 1, 5, 7]) == (before + 101) % 256
        assert int(torch.from_dlpack(b.images)[2, 1, 5, 7]) == (before + 101) % 256

        lab = b.labels
        nl, tl = np.from_dlpack(lab), torch.from_dlpack(lab)
        assert nl.ctypes.data == lab.data_ptr == tl.data_ptr()
        assert tl.dtype == torch.int64 and nl.dtype == np.int64
        assert [ds.label_of[k] for k in b.keys] == tl.tolist()

        # The array interface and an explicit copy.
        assert np.asarray(b.images).ctypes.data == img.data_ptr
        if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 1):  # copy= is 2.1's
            c = np.from_dlpack(b.images, copy=True)
            assert c.ctypes.data != img.data_ptr and np.array_equal(c, n)
        else:
            c = None
        del n, t, second, nl, tl, c, img, lab
        b.release()


@pytest.mark.parametrize("layout,dtype", [("hwc", "uint8"), ("chw", "float32"),
                                          ("hwc", "float32")])
def test_layouts_and_dtypes(dataset, layout, dtype):
    ds = dataset
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    with shardfeed.Loader(ds.url, **options(ds, layout="chw")) as loader:
        ref = read_batches(loader, limit=2)
    with shardfeed.Loader(ds.url, **options(ds, layout=layout, dtype=dtype, width=40,
                                            height=24)) as loader:
        b = loader.next_batch()
        shape = (8, 3, 24, 40) if layout == "chw" else (8, 24, 40, 3)
        assert b.images.shape == shape and b.images.dtype == dtype
        assert (b.layout, b.dtype, b.width, b.height) == (layout, dtype, 40, 24)
        assert np.from_dlpack(b.images).dtype == np.dtype(dtype)
        b.release()
    with shardfeed.Loader(ds.url, **options(ds, layout=layout, dtype=dtype)) as loader:
        got = read_batches(loader, limit=2)
    for r, g in zip(ref, got):
        assert g.keys == r.keys
        want = r.images if layout == "chw" else r.images.transpose(0, 2, 3, 1)
        if dtype == "uint8":
            assert np.array_equal(g.images, want)
        else:
            ax = (1, 3, 1, 1) if layout == "chw" else (1, 1, 1, 3)
            norm = (want / 255.0 - np.reshape(mean, ax)) / np.reshape(std, ax)
            # The same pixels, normalised on the CPU (rounding aside).
            assert np.allclose(g.images, norm, atol=0.02)


# ------------------------------------------------------------ checkpoints

@pytest.mark.parametrize("epoch,k", [(0, 0), (0, 5), (1, 3), (0, 11), (0, 12)])
def test_state_dict_resumes_with_exactly_the_remaining_batches(any_dataset, epoch, k, tmp_path):
    ds = any_dataset
    # With a cache directory, as in training: without index.json the counts
    # learned in epoch 0 are kept there, and the resumed loader needs them.
    o = options(ds, ram_only=False, cache_dir=str(tmp_path / "cache"))
    with shardfeed.Loader(ds.url, **o) as loader:
        if epoch:
            read_batches(loader)  # a whole epoch 0 first
            loader.set_epoch(epoch)
        first = read_batches(loader, limit=k)
        state = loader.state_dict()
        rest = read_batches(loader)
    assert state["format"] == "shardfeed.loader" and state["version"] == 1
    assert state["epoch"] == epoch and isinstance(state["state"], bytes)
    whole = k == ds.n // 8
    if whole:
        # Every batch taken, the end not asked for: the next loop is the
        # next epoch, whole (it was the empty rest of this one).
        assert len(first) == k and len(rest) == k
        check_epoch(ds, first)
        check_epoch(ds, rest)
    else:
        assert len(first) == k and len(first) + len(rest) == ds.n // 8
        check_epoch(ds, first + rest)

    state = pickle.loads(pickle.dumps(state))  # what a checkpoint does to it
    with shardfeed.Loader(ds.url, **o) as resumed:
        resumed.load_state_dict(state)
        assert resumed.epoch == epoch
        again = read_batches(resumed)
    assert len(again) == len(rest)
    for x, y in zip(again, rest):
        assert x == y, f"batch {y.index} differs after the restore"
        assert x.index == y.index and x.epoch == y.epoch == epoch + whole


def test_loops_of_exactly_len_batches_read_one_whole_epoch_each(dataset):
    """zip(range(len(loader)), loader) takes every batch without asking for
    the end: the next loop still starts the next epoch (it resumed the
    finished one and came out empty, every other loop)."""
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        for e in range(3):
            got = []
            for _, b in zip(range(len(loader)), loader):
                with b:
                    got.append(Got(b))
            assert len(got) == ds.n // 8 and {g.epoch for g in got} == {e}, (e, len(got))
            check_epoch(ds, got)
            assert loader.epoch == e
        # a loop stopped one batch short resumes that epoch, as before
        short = []
        for _, b in zip(range(len(loader) - 1), loader):
            with b:
                short.append(Got(b))
        assert {g.epoch for g in short} == {3}
        rest = read_batches(loader)
        assert len(rest) == 1 and rest[0].epoch == 3


def test_state_of_another_configuration_is_refused(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds)) as loader:
        read_batches(loader, limit=2)
        state = loader.state_dict()
    with shardfeed.Loader(ds.url, **options(ds, batch_size=4)) as other:
        with pytest.raises(shardfeed.Error) as ei:
            other.load_state_dict(state)
    assert "batch_size" in str(ei.value) or "batch size" in str(ei.value)
    broken = dict(state, state=state["state"][:-1] + bytes([state["state"][-1] ^ 0xFF]))
    with shardfeed.Loader(ds.url, **options(ds)) as l2:
        with pytest.raises(shardfeed.CorruptError):
            l2.load_state_dict(broken)
        with pytest.raises(shardfeed.ConfigError):
            l2.load_state_dict({"format": "something else"})


# ------------------------------------------------------------ options

def test_config_file_with_keyword_overrides(dataset, tmp_path):
    ds = dataset
    cfg = tmp_path / "loader.json"
    cfg.write_text(json.dumps({"batch_size": 4, "width": 20, "height": 16, "seed": 7}))
    o = options(ds)
    for k in ("batch_size", "seed", "size"):
        del o[k]
    with shardfeed.Loader(ds.url, config=str(cfg), batch_size=6, **o) as loader:
        b = loader.next_batch()
        assert (len(b), b.width, b.height) == (6, 20, 16)
        b.release()
    with shardfeed.Loader(ds.url, config=cfg, **o) as loader:  # a path-like config
        assert len(loader) == ds.n // 4


def test_bad_options_raise_config_error_naming_them(dataset, tmp_path):
    ds = dataset
    bad = [("batch_size", 0), ("batch_size", "many"), ("crop", "diagonal"),
           ("layout", "nchw"), ("dtype", "float16"), ("on_error", "ignore"),
           ("epoch_policy", "round"), ("prefetch_batches", 1), ("cache_limit", "lots"),
           ("device", "tpu"), ("scale_min", 2.0), ("batchsize", 8), ("learned_counts", "maybe")]
    for name, value in bad:
        with pytest.raises(shardfeed.ConfigError) as ei:
            open_and_read(ds.url, **options(ds, **{name: value}))
        assert name in str(ei.value), (name, value, str(ei.value))
        assert isinstance(ei.value, ValueError)
        assert ei.value.status_name == "SF_ERR_INVALID_ARGUMENT"
    with pytest.raises(shardfeed.ConfigError) as ei:
        shardfeed.Loader([], **options(ds))
    assert "sources" in str(ei.value)
    notjson = tmp_path / "bad.json"
    notjson.write_text("{batch_size: 3")
    with pytest.raises(shardfeed.ConfigError) as ei:
        shardfeed.Loader(ds.url, config=str(notjson), **options(ds))
    assert "bad.json" in str(ei.value)


# ------------------------------------------------------------ errors

def test_missing_objects_raise_not_found_naming_them(dataset):
    ds = dataset
    with pytest.raises(shardfeed.NotFoundError) as ei:
        open_and_read(ds.url + "shard-{000000..000099}.tar", **options(ds))
    assert "s3://data/train/shard-0000" in str(ei.value)
    assert ei.value.status_name == "SF_ERR_NOT_FOUND"
    with pytest.raises(shardfeed.NotFoundError) as ei:
        open_and_read([ds.shard_urls[0], "s3://data/train/nope.tar"], **options(ds))
    assert "s3://data/train/nope.tar" in str(ei.value)
    with pytest.raises(shardfeed.NotFoundError) as ei:
        open_and_read("s3://no-such-bucket/x/", **options(ds))
    assert "no-such-bucket" in str(ei.value)


def test_nothing_to_read_is_an_error(mock_s3):
    b = mock_s3.bucket("empty")
    with pytest.raises(shardfeed.Error) as ei:
        open_and_read(b + "/train/", endpoint_url=mock_s3.endpoint_url, device="host",
                      ram_only=True)
    assert "s3://empty/train/" in str(ei.value)


@pytest.fixture(scope="session")
def corrupt_shards(photos, tmp_path_factory):
    """The photos with one JPEG cut at 60% of its length, packed."""
    src = tmp_path_factory.mktemp("corrupt") / "src"
    shutil.copytree(photos.root, src)
    bad_key = photos.keys[37]
    path = src / (bad_key + ".jpg")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 6 // 10])
    dest = tmp_path_factory.mktemp("corrupt-packed")
    pack(src, dest, "40K", ["--layout", "imagefolder"])
    names = sorted(p.name for p in dest.iterdir() if p.name.endswith(".tar"))
    shards = Shards(dest, photos, names, True)
    for name in names:  # where the bad image lies
        with tarfile.open(dest / name) as t:
            for m in t.getmembers():
                if m.name == bad_key + ".jpg":
                    shards.bad = (bad_key, name, m.offset_data, m.offset)
    assert hasattr(shards, "bad")
    return shards


def test_corrupt_jpeg_fails_naming_shard_and_offset(mock_s3, corrupt_shards):
    ds = put_shards(mock_s3, corrupt_shards, prefix="bad/")
    key, shard, data_off, header_off = corrupt_shards.bad
    with shardfeed.Loader(ds.url, **options(ds, on_error="fail")) as loader:
        delivered = []
        with pytest.raises(shardfeed.CorruptError) as ei:
            for b in loader:
                delivered += b.keys
                b.release()
        msg = str(ei.value)
        assert ds.url + shard in msg, msg
        assert f"'{key}'" in msg, msg
        # The offset of the image's bytes in the shard (after its tar header).
        assert f"image at offset {data_off}:" in msg, (msg, data_off, header_off)
        assert ei.value.status_name in ("SF_ERR_CORRUPT", "SF_ERR_PARSE")
        assert key not in delivered and len(delivered) < ds.n
        # Sticky: the loader keeps saying so.
        with pytest.raises(shardfeed.CorruptError):
            loader.next_batch()


def test_corrupt_jpeg_under_on_error_skip_is_counted(mock_s3, corrupt_shards):
    ds = put_shards(mock_s3, corrupt_shards, prefix="bad/")
    key = corrupt_shards.bad[0]
    with shardfeed.Loader(ds.url, **options(ds, on_error="skip")) as loader:
        got = read_batches(loader)
        assert loader.stats()["samples_skipped"] == 1
    keys = keys_of(got)
    assert key not in keys
    assert sorted(keys) == sorted(k for k in ds.keys if k != key)
    # The hole: one batch is a sample short.
    assert sum(len(g.keys) for g in got) == ds.n - 1


def test_a_shard_deleted_mid_epoch_is_an_error_not_a_short_epoch(mock_s3, webdataset):
    ds = put_shards(mock_s3, webdataset, prefix="del/")
    # Many small shards and a shallow pipeline: most shards are not opened
    # when the first batch arrives.
    o = options(ds, batch_size=4, prefetch_batches=2, prefetch_shards=1, shuffle_buffer=4,
                initial_fill=4, decode_threads=1)
    with shardfeed.Loader(ds.url, **o) as loader:
        b = loader.next_batch()
        seen_shards = set(b.shards)
        delivered = list(b.keys)
        b.release()
        deleted = [n for i, n in enumerate(ds.shards.names) if i not in seen_shards]
        for name in deleted:
            os.remove(ds.shard_path(name))
        assert len(deleted) >= 3
        with pytest.raises(shardfeed.Error) as ei:
            for b in loader:
                delivered += b.keys
                b.release()
        assert isinstance(ei.value, (shardfeed.NotFoundError, shardfeed.ChangedError)), ei.value
        assert "s3://data/del/wds-" in str(ei.value)
        assert len(delivered) < ds.n
        assert len(set(delivered)) == len(delivered)


def test_many_small_shards_webdataset_with_more_shards(mock_s3, photos, tmp_path):
    """24 single-class-mixed shards of 4 samples (a wider fan-out than the
    fixtures), plus a non-shard object beside them that a prefix ignores."""
    src = tmp_path / "wds"
    src.mkdir()
    keys = photos.keys
    for s in range(24):
        with tarfile.open(src / f"p-{s:03d}.tar", "w", format=tarfile.GNU_FORMAT) as t:
            for key in keys[s::24]:
                t.add(photos.files[key], arcname=key + ".jpg")
                cls = src / "cls.tmp"
                cls.write_text(str(photos.label_of[key]))
                t.add(cls, arcname=key + ".cls")
    (src / "cls.tmp").unlink()
    (src / "README.txt").write_text("not a shard")
    sh = Shards(src, photos, sorted(p.name for p in src.iterdir() if p.suffix == ".tar"), False)
    ds = put_shards(mock_s3, sh, prefix="many/")
    with shardfeed.Loader(ds.url, **options(ds, prefetch_shards=6)) as loader:
        assert len(loader.shards) == 24
        check_epoch(ds, read_batches(loader))


# ------------------------------------------------------------ held batches

def test_holding_too_many_batches_raises_limit_error(dataset):
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, prefetch_batches=3)) as loader:
        held = [loader.next_batch(), loader.next_batch()]  # prefetch_batches - 1
        with pytest.raises(shardfeed.LimitError) as ei:
            loader.next_batch()
        assert "prefetch_batches" in str(ei.value)
        assert ei.value.status_name == "SF_ERR_LIMIT"
        held[0].release()
        b = loader.next_batch()  # a slot came back: the next batch comes
        assert b.index == 2

        # A view alone holds its slot too.
        view = np.from_dlpack(b.images)
        b.release()
        del b
        with pytest.raises(shardfeed.LimitError):
            loader.next_batch()
        del view
        c = loader.next_batch()
        assert c.index == 3
        c.release()
        held[1].release()
        rest = read_batches(loader)
        assert [g.index for g in rest] == list(range(4, ds.n // 8))


# ------------------------------------------------------------ faults

def test_503s_and_resets_still_give_every_sample_exactly_once(any_dataset, tmp_path):
    ds = any_dataset
    m = ds.mock
    # Few 503s: throttling backs off from 500 ms and shrinks the request
    # window and rate (docs/transport.md), so they cost seconds each. Two of
    # them are certain (queued), the rest random (seeded by the mock). Only
    # shards are faulted: 503s on index.json, the first request, would
    # throttle the whole epoch to one request a second.
    shards = f"{ds.bucket}/{ds.prefix}{os.path.commonprefix(ds.shards.names)}"
    m.faults(f"prefix={shards},p503=0.02,reset=0.15,p500=0.15")
    m.fault(shards, "503", 2)
    # Small ranges: many requests, so many of them are faulted.
    o = options(ds, chunk_size="16K", max_attempts=10)
    with shardfeed.Loader(ds.url, **o) as loader:
        got = read_batches(loader)
        st = loader.stats()
    check_epoch(ds, got)
    ms = m.stats()
    assert ms["faults"].get("503", 0) >= 2 and ms["faults"].get("500", 0) > 0, ms["faults"]
    assert st["retries"] > 0

    # Through the disk cache, faults and all, then warm with no requests.
    o.update(ram_only=False, cache_dir=str(tmp_path / "cache"))
    with shardfeed.Loader(ds.url, **o) as loader:
        cold = read_batches(loader)
        assert loader.stats()["cache_misses"] == len(ds.shard_urls)
    m.faults()
    m.reset()
    with shardfeed.Loader(ds.url, **o) as loader:
        warm = read_batches(loader)
        st = loader.stats()
        assert st["cache_hits"] + st["cache_misses"] == len(ds.shard_urls)
        if ds.shards.indexed:
            assert st["cache_hits"] == len(ds.shard_urls), st
        # GNU tar pads a shard to 10 KiB records: the reader ends a shard at its
        # end-of-archive blocks, and closing the loader may cut the download of
        # the padding after them, so that shard is not cached.
    if ds.shards.indexed:
        # No shard was asked for again (index.json, read at open, is not a shard).
        keys = m.stats()["keys"]
        for url in ds.shard_urls:
            k = url[len("s3://"):]
            assert keys.get(k, {}).get("operations", {}).get("GetObject", 0) == 0, k
    assert [g.digest() for g in warm] == [g.digest() for g in cold] == \
        [g.digest() for g in got]


def test_class_colours_are_told_apart():
    """The pixel check of the other tests would catch a swapped label."""
    from sfutil import CLASS_COLORS
    for k, c in enumerate(CLASS_COLORS):
        img = np.broadcast_to(np.asarray(c, dtype=np.uint8)[:, None, None], (3, 8, 8))
        assert class_of_pixels(img) == k
        assert class_of_pixels(img.transpose(1, 2, 0), "hwc") == k
    assert class_of_pixels(np.full((3, 8, 8), 128, np.uint8)) == -1


def test_emulated_device_batches(dataset):
    """device="emulated": the whole device path (ring, copy stream, events,
    normalise kernel) on the emulated device. Device arrays say where they
    live and refuse export; host_images has the bytes; every sample once."""
    ds = dataset
    with shardfeed.Loader(ds.url, **options(ds, device="emulated", sync_device=True)) as loader:
        got = []
        for b in loader:
            assert b.on_device
            assert b.images.device == ("emulated", 0)
            assert b.images.__dlpack_device__() == (12, 0)  # kDLExtDev
            assert b.normalized is not None and b.normalized.dtype == "float32"
            with pytest.raises(BufferError, match="emulated device"):
                b.images.__dlpack__()
            assert b.host_images.device == ("cpu", 0)
            assert np.from_dlpack(b.host_images).shape == (len(b), 3, 32, 32)
            got.append(Got(b))
            b.release()
        check_epoch(ds, got)
        assert loader.stats()["on_device"]


def test_each_epoch_ends_with_a_starvation_report_in_the_log(packed, caplog):
    ds = packed
    with caplog.at_level("INFO", logger="shardfeed"):
        with shardfeed.Loader([ds.folder + "/"], batch_size=8, size=32, decode_threads=1,
                              device="host") as loader:
            during = None
            for i, b in enumerate(loader):
                if i == 1:
                    during = loader.report()
                b.release()
            r = loader.report()
            assert during is not None and during["batches"] == 2
            assert r["batches"] == len(loader) and r["samples"] == ds.photos.n
            assert 0 < r["wait_share"] <= 1 and r["wait_s"] <= r["span_s"]
            assert r["wait_p50_ms"] <= r["wait_p99_ms"] <= r["wait_max_ms"]
            assert r["bound"] in ("none", "startup", "fetch", "read", "decode", "assembly",
                                  "device")
            assert r["starving"] == (r["wait_share"] > 0.05) and r["verdict"]
            # The next epoch's window starts afresh; the ended one stays readable.
            assert loader.report() == r
            for b in loader:
                b.release()
    epochs = [rec for rec in caplog.records if rec.name == "shardfeed"
              and "waited for data" in rec.getMessage()]
    assert [rec.getMessage().split(":")[0] for rec in epochs] == ["epoch 0", "epoch 1"]
    for rec in epochs:
        starving = "not starving" not in rec.getMessage()
        assert rec.levelname == ("WARNING" if starving else "INFO"), rec.getMessage()


def test_doctor_names_the_step_or_the_decode_stage(packed):
    import time
    folder = packed.folder + "/"
    calls = []

    def slow_step(batch):
        calls.append(batch.size)
        time.sleep(0.05)  # 8 samples per 50 ms: 160 samples/s, far below decode

    r = shardfeed.doctor(folder, step=slow_step, seconds=0.3, batch_size=8, size=32,
                         device="host")
    assert calls and all(n == 8 for n in calls)
    assert r["bound"] == "step", r["verdict"]
    assert r["verdict"].startswith("step-bound"), r["verdict"]
    assert 0 < r["step_per_s"] <= 8 / 0.05
    assert r["stages"]["decode"]["samples_per_s"] > r["step_per_s"]
    assert r["stages"]["fetch"]["samples_per_s"] == 0 and r["data_in_cache"]
    assert r["pipeline_per_s"] > 0 and "_raw" not in r

    r = shardfeed.doctor([folder], seconds=0.3, batch_size=8, size=32, decode_threads=1,
                         device="host")
    assert r["step_per_s"] == 0 and r["bound"] == "decode", r["verdict"]
    assert r["verdict"].startswith("decode-bound: 1 threads"), r["verdict"]

    with pytest.raises(shardfeed.ConfigError):
        shardfeed.doctor(folder, seconds=0)
    with pytest.raises(TypeError):
        shardfeed.doctor(folder, step="not callable", seconds=0.3)
    with pytest.raises(shardfeed.NotFoundError):
        shardfeed.doctor(folder + "no-such-shard.tar", seconds=0.3)


@pytest.mark.parametrize("indexed", [True, False])
def test_doctor_on_data_smaller_than_one_batch_says_it_is_too_small(photos, tmp_path, indexed):
    """Three samples and batches of 8: with drop_last no batch ever comes,
    without it every batch is a part of one. doctor raises NotFoundError
    ("too small to measure", as the CLI exits 1 with SF_ERR_NOT_FOUND)
    instead of "the sources hold no samples" or a verdict made from partial
    batches; with an index.json (the epoch's size known at open) and
    without. A batch of exactly the data's size still gets a verdict."""
    keys = photos.keys[:3]
    folder = tmp_path / "tiny"
    folder.mkdir()
    if indexed:
        src = tmp_path / "src"
        for k in keys:
            os.makedirs(src / os.path.dirname(k), exist_ok=True)
            shutil.copyfile(photos.files[k], src / (k + ".jpg"))
        pack(src, folder, "40K", ["--layout", "imagefolder"])
        assert (folder / "index.json").exists()
    else:
        with tarfile.open(folder / "tiny-0000.tar", "w", format=tarfile.GNU_FORMAT) as t:
            for k in keys:
                t.add(photos.files[k], arcname=k + ".jpg")
    for drop_last in (True, False):
        with pytest.raises(shardfeed.NotFoundError, match="too small to measure") as e:
            shardfeed.doctor(str(folder) + "/", seconds=0.1, batch_size=8, size=32,
                             device="host", drop_last=drop_last)
        assert "batch_size 8" in str(e.value)
        # With drop_last no batch comes; without, the one batch holds all 3.
        assert ("no batch" if drop_last else "holds 3 samples") in str(e.value)
    r = shardfeed.doctor(str(folder) + "/", seconds=0.1, batch_size=3, size=32, device="host",
                         drop_last=True)
    assert r["bound"] and r["pipeline_per_s"] > 0, r


def test_tune_output_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """tune(output=PATH) replaces PATH as a whole, as `shardfeed tune -o`
    does: a write that fails half way (a full disk) leaves the earlier
    config as it was and no temporary beside it; one that completes keeps
    the file's mode; an output that cannot be written is refused before
    the search. The search itself is stubbed: only the writing is
    under test."""
    import shardfeed._doctor as doctor_module
    out = tmp_path / "tuned.json"
    out.write_text('{"decode_threads": 3}\n')
    out.chmod(0o640)
    monkeypatch.setattr(doctor_module._shardfeed, "_tune",
                        lambda sources, options, budget: {"config_json": '{"decode_threads": 5}'})

    def torn(obj, f):
        f.write('{"decode_thr')
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(doctor_module.json, "dump", torn)
        with pytest.raises(OSError, match="No space left"):
            shardfeed.tune("unused/", output=str(out))
    assert out.read_text() == '{"decode_threads": 3}\n'
    assert os.listdir(tmp_path) == ["tuned.json"]
    r = shardfeed.tune("unused/", output=str(out))
    assert json.loads(out.read_text()) == r["config"] == {"decode_threads": 5}
    assert out.stat().st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["tuned.json"]
    # A folder, or a folder that is not there, is refused before the search.
    monkeypatch.setattr(doctor_module._shardfeed, "_tune",
                        lambda *a: pytest.fail("searched for an output it cannot write"))
    for bad in (tmp_path, tmp_path / "no-such-folder" / "tuned.json"):
        with pytest.raises(shardfeed.ConfigError, match="output"):
            shardfeed.tune("unused/", output=str(bad))


def test_tune_writes_a_config_that_loader_and_autotune_take(packed, tmp_path):
    import json
    folder = packed.folder + "/"
    out = tmp_path / "tuned.json"
    r = shardfeed.tune(folder, budget_s=3, output=str(out), batch_size=8, size=32,
                       device="host")
    cfg = r["config"]
    assert json.loads(out.read_text()) == cfg
    # The search tried decode thread counts and kept the options given.
    assert r["trace"].startswith("decode_threads=1:"), r["trace"]
    assert set(cfg) == {"decode_threads", "concurrency", "chunk_size", "prefetch_shards",
                        "prefetch_batches"}, cfg
    assert cfg["decode_threads"] >= 1 and cfg["prefetch_batches"] >= 2
    assert r["tuned_per_s"] > 0 and r["given_per_s"] > 0
    # Kept the given options only when they measured faster.
    assert r["kept_given"] == (r["given_per_s"] > r["tuned_per_s"])
    with shardfeed.Loader(folder, config=str(out), batch_size=8, size=32,
                          device="host") as loader:
        assert loader.stats()["decode_threads"] == cfg["decode_threads"]
        n = sum(b.size for b in loader)
    assert n == packed.photos.n

    with shardfeed.Loader(folder, autotune=2, batch_size=8, size=32, device="host",
                          decode_threads=1) as loader:
        assert loader.tuned is not None and loader.tuned["config"]["decode_threads"] >= 1
        # An option given explicitly wins over the tuned one.
        assert loader.stats()["decode_threads"] == 1
        n = sum(b.size for b in loader)
    assert n == packed.photos.n

    with pytest.raises(shardfeed.ConfigError):
        shardfeed.tune(folder, budget_s=0)
    with pytest.raises(shardfeed.NotFoundError):
        shardfeed.tune(folder + "no-such-shard.tar", budget_s=2)
