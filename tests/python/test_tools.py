"""shardfeed.ls, stat, warm_cache, pack and index against the mock S3 server.

The mock_s3 fixture (conftest.py) starts shardfeed-mock-s3 on a free port with
AWS credentials it accepts in the environment; .bucket(name) creates a bucket
and returns "s3://name", .put() writes an object into the folder it serves
(.root), .fault() / .faults() set its fault injection.
"""
import hashlib
import json
import logging
import os
import signal
import threading

import pytest

import shardfeed


def put(mock, bucket, key, data):
    """Writes an object straight into the mock's folder; returns the bytes."""
    mock.put(bucket, key, data)
    return data


def blob(n, seed):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(b"%d:%d" % (seed, i)).digest()
        i += 1
    return bytes(out[:n])


def cache_entries(cache_dir):
    """Published entries (*.sf) of a cache directory."""
    n = 0
    for _dirpath, _dirs, files in os.walk(os.path.join(cache_dir, "v1")):
        n += sum(1 for f in files if f.endswith(".sf") and not f.startswith("."))
    return n


def image_folder(tmp_path, per_class, size):
    """An ImageFolder tree: cat/ and dog/, per_class files each; returns
    (path, number of files, total bytes)."""
    src = tmp_path / "src"
    total = 0
    for c, name in enumerate(("cat", "dog")):
        d = src / name
        d.mkdir(parents=True)
        for i in range(per_class):
            data = blob(size + i, 100 * c + i)
            (d / f"{i:04d}.jpg").write_bytes(data)
            total += len(data)
    return src, 2 * per_class, total


# ------------------------------------------------------------ ls, stat

def test_ls_lists_exactly_the_objects_with_their_sizes(mock_s3):
    b = mock_s3.bucket("data")
    objs = {"a/x.tar": blob(100, 1), "a/y.tar": blob(2000, 2), "a/deep/z.tar": blob(7, 3),
            "b/other.bin": blob(10, 4)}
    for k, v in objs.items():
        put(mock_s3, "data", k, v)
    ep = mock_s3.endpoint_url

    got = shardfeed.ls(b + "/a/", recursive=True, endpoint_url=ep)
    assert sorted(e["key"] for e in got) == ["a/deep/z.tar", "a/x.tar", "a/y.tar"]
    for e in got:
        data = objs[e["key"]]
        assert e["url"] == "s3://data/" + e["key"]
        assert e["size"] == len(data)
        assert e["etag"] == '"%s"' % hashlib.md5(data).hexdigest()
        assert isinstance(e["last_modified"], int) and e["last_modified"] > 0
        assert e["is_prefix"] is False

    top = shardfeed.ls(b + "/", endpoint_url=ep)
    prefixes = sorted(e["key"] for e in top if e["is_prefix"])
    assert prefixes == ["a/", "b/"]
    assert all(e["size"] is None for e in top if e["is_prefix"])
    assert not [e for e in top if not e["is_prefix"]]

    assert shardfeed.ls(b + "/nothing/", recursive=True, endpoint_url=ep) == []


def test_ls_pattern_gives_each_named_object_and_names_a_missing_one(mock_s3):
    b = mock_s3.bucket("data")
    for i in range(4):
        put(mock_s3, "data", f"s-{i}.tar", blob(50 + i, i))
    ep = mock_s3.endpoint_url
    got = shardfeed.ls(b + "/s-{0..3}.tar", endpoint_url=ep)
    assert [e["key"] for e in got] == [f"s-{i}.tar" for i in range(4)]
    assert [e["size"] for e in got] == [50, 51, 52, 53]

    os.remove(os.path.join(mock_s3.root, "data", "s-2.tar"))
    with pytest.raises(shardfeed.NotFoundError) as ei:
        shardfeed.ls(b + "/s-{0..3}.tar", endpoint_url=ep)
    assert "s3://data/s-2.tar" in str(ei.value)
    assert ei.value.status_name == "SF_ERR_NOT_FOUND"
    assert "s3://data/s-2.tar" in ei.value.message


def test_stat_gives_one_object_and_names_a_missing_one(mock_s3):
    b = mock_s3.bucket("data")
    data = put(mock_s3, "data", "k/one.bin", blob(3333, 9))
    st = shardfeed.stat(b + "/k/one.bin", endpoint_url=mock_s3.endpoint_url)
    assert st["url"] == "s3://data/k/one.bin"
    assert st["key"] == "k/one.bin"
    assert st["size"] == len(data)
    assert st["etag"] == '"%s"' % hashlib.md5(data).hexdigest()

    with pytest.raises(shardfeed.NotFoundError) as ei:
        shardfeed.stat(b + "/k/missing.bin", endpoint_url=mock_s3.endpoint_url)
    assert "s3://data/k/missing.bin" in str(ei.value)

    with pytest.raises(shardfeed.ConfigError) as ei:
        shardfeed.stat(b + "/k/{a,b}.bin", endpoint_url=mock_s3.endpoint_url)
    assert "pattern" in str(ei.value)


def test_bad_credentials_raise_access_denied(mock_s3, monkeypatch):
    b = mock_s3.bucket("data")
    put(mock_s3, "data", "x", b"x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(shardfeed.AccessDeniedError) as ei:
        shardfeed.ls(b + "/", endpoint_url=mock_s3.endpoint_url)
    assert ei.value.status_name in ("SF_ERR_SIGNATURE", "SF_ERR_ACCESS_DENIED")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key")
    with pytest.raises(shardfeed.AccessDeniedError):
        shardfeed.stat(b + "/x", endpoint_url=mock_s3.endpoint_url)


def test_bad_options_raise_config_error_naming_them(mock_s3, tmp_path):
    b = mock_s3.bucket("data")
    ep = mock_s3.endpoint_url
    cases = [
        (lambda: shardfeed.ls(b + "/", endpoint_url=ep, concurrency=0), "concurrency"),
        (lambda: shardfeed.ls(b + "/", endpoint_url=ep, chunk_size="lots"), "chunk_size"),
        (lambda: shardfeed.stat(b + "/x", endpoint_url=ep, max_attempts="3"), "max_attempts"),
        (lambda: shardfeed.ls(b + "/", endpoint=ep), "endpoint"),
        (lambda: shardfeed.ls(b + "/", endpoint_url=ep, batch_size=4), "batch_size"),
        (lambda: shardfeed.ls(b + "/", endpoint_url=ep, recursive="yes"), "recursive"),
        (lambda: shardfeed.warm_cache(b + "/", cache_dir=str(tmp_path), cache_limit="many",
                                      endpoint_url=ep), "cache_limit"),
        (lambda: shardfeed.warm_cache([], cache_dir=str(tmp_path), endpoint_url=ep), "sources"),
        (lambda: shardfeed.warm_cache(b + "/", cache_dir=str(tmp_path), max_objects=0,
                                      endpoint_url=ep), "max_objects"),
        (lambda: shardfeed.pack(str(tmp_path), str(tmp_path / "o"), format="zip"), "format"),
        (lambda: shardfeed.pack(str(tmp_path), str(tmp_path / "o"), zstd_level=3), "zstd_level"),
        (lambda: shardfeed.pack(str(tmp_path), str(tmp_path / "o"), shard_bytes="1"),
         "shard_bytes"),
        (lambda: shardfeed.pack(str(tmp_path), str(tmp_path / "o"), name_pattern="x/%u.tar"),
         "name_pattern"),
        (lambda: shardfeed.pack(str(tmp_path), str(tmp_path / "o"), progress=3), "progress"),
        (lambda: shardfeed.index(b + "/", window=1024, endpoint_url=ep), "window"),
        (lambda: shardfeed.index(b + "/", output="http://x/i.json", endpoint_url=ep), "output"),
    ]
    for call, name in cases:
        with pytest.raises(shardfeed.ConfigError) as ei:
            call()
        assert name in str(ei.value), (name, str(ei.value))
        assert isinstance(ei.value, ValueError)
        assert ei.value.status_name == "SF_ERR_INVALID_ARGUMENT"


def test_every_s3_option_of_the_loader_reaches_the_tools(mock_s3):
    """The tools take the S3 options the loader's JSON takes (they were
    refused as unknown: addressing, TLS, HTTP/2 and the timeouts)."""
    b = mock_s3.bucket("data")
    mock_s3.put("data", "o/one.bin", b"x" * 10)
    got = shardfeed.ls(b + "/o/", endpoint_url=mock_s3.endpoint_url, addressing="path",
                       insecure=False, http2=False, stall_timeout_ms=30000,
                       connect_timeout_ms=5000, first_byte_timeout_ms=30000,
                       request_timeout_ms=60000)
    assert [o["key"] for o in got] == ["o/one.bin"]
    with pytest.raises(shardfeed.ConfigError) as ei:
        shardfeed.ls(b + "/", endpoint_url=mock_s3.endpoint_url, addressing="sideways")
    assert "addressing" in str(ei.value)


def test_log_lines_reach_the_shardfeed_logger(mock_s3, caplog):
    b = mock_s3.bucket("data")
    put(mock_s3, "data", "retry.bin", blob(100, 5))
    # The first two requests for the key fail with 503: the client retries and logs it.
    mock_s3.fault("data/retry.bin", "503", 2)
    caplog.set_level(logging.DEBUG, logger="shardfeed")
    st = shardfeed.stat(b + "/retry.bin", endpoint_url=mock_s3.endpoint_url)
    assert st["size"] == 100
    records = [r for r in caplog.records if r.name == "shardfeed"]
    assert records, "no library log line was handed to logging"
    assert any("retry.bin" in r.getMessage() for r in records), [r.getMessage() for r in records]


# ------------------------------------------------------------ warm_cache

def test_warm_cache_fetches_then_finds_everything_cached(mock_s3, tmp_path):
    b = mock_s3.bucket("data")
    sizes = [300000, 5, 70000]
    for i, n in enumerate(sizes):
        put(mock_s3, "data", f"w/w-{i}.tar", blob(n, 10 + i))
    cache_dir = str(tmp_path / "cache")
    ep = mock_s3.endpoint_url

    dry = shardfeed.warm_cache(b + "/w/", cache_dir=cache_dir, dry_run=True, endpoint_url=ep)
    assert sorted(dry["would_fetch"]) == [f"s3://data/w/w-{i}.tar" for i in range(3)]
    assert dry["fetched"] == 0 and dry["bytes_to_fetch"] == sum(sizes)
    assert cache_entries(cache_dir) == 0

    seen = []
    got = shardfeed.warm_cache(b + "/w/w-{0..2}.tar", cache_dir=cache_dir, progress=seen.append,
                               chunk_size="64K", endpoint_url=ep)
    assert got["objects_total"] == 3 and got["objects_done"] == 3
    assert got["fetched"] == 3 and got["failed"] == 0 and got["cached"] == 0
    assert got["bytes_total"] == sum(sizes) and got["bytes_fetched"] == sum(sizes)
    assert got["failures"] == []
    assert os.path.samefile(got["cache_dir"], cache_dir)
    assert cache_entries(cache_dir) == 3
    assert seen, "progress was never called"
    assert seen[-1]["objects_done"] == 3 and seen[-1]["bytes_fetched"] == sum(sizes)
    assert all(isinstance(s, dict) and "bytes_to_fetch" in s for s in seen)

    again = shardfeed.warm_cache([b + "/w/w-0.tar", b + "/w/w-1.tar", b + "/w/w-2.tar"],
                                 cache_dir=cache_dir, verify=True, endpoint_url=ep)
    assert again["cached"] == 3 and again["fetched"] == 0 and again["bytes_fetched"] == 0


def test_warm_cache_of_a_listing_keeps_its_shards_only(mock_s3, tmp_path):
    # What the loader reads from the folder: its .tar and .sfr shards, not the
    # index.json beside them (read with one GET, never cached) nor other files.
    b = mock_s3.bucket("data")
    put(mock_s3, "data", "l/l-0.tar", blob(1000, 1))
    put(mock_s3, "data", "l/l-1.sfr", blob(1000, 2))
    put(mock_s3, "data", "l/index.json", b"{}")
    put(mock_s3, "data", "l/notes.txt", b"x")
    got = shardfeed.warm_cache(b + "/l/", cache_dir=str(tmp_path / "cache"),
                               endpoint_url=mock_s3.endpoint_url)
    assert got["objects_total"] == 2 and got["fetched"] == 2
    assert cache_entries(str(tmp_path / "cache")) == 2


def test_warm_cache_names_a_missing_object_and_keeps_the_rest(mock_s3, tmp_path):
    b = mock_s3.bucket("data")
    put(mock_s3, "data", "m-0.tar", blob(1000, 1))
    put(mock_s3, "data", "m-2.tar", blob(1000, 2))
    cache_dir = str(tmp_path / "cache")
    with pytest.raises(shardfeed.NotFoundError) as ei:
        shardfeed.warm_cache(b + "/m-{0..3}.tar", cache_dir=cache_dir,
                             endpoint_url=mock_s3.endpoint_url)
    assert "s3://data/m-1.tar" in str(ei.value)
    stats = ei.value.stats
    assert stats["fetched"] == 2 and stats["failed"] == 2
    assert sorted(f["url"] for f in stats["failures"]) == ["s3://data/m-1.tar",
                                                           "s3://data/m-3.tar"]
    assert all(f["status"] == "SF_ERR_NOT_FOUND" for f in stats["failures"])
    assert cache_entries(cache_dir) == 2


def test_warm_cache_over_the_limit_raises_limit_error_before_fetching(mock_s3, tmp_path):
    b = mock_s3.bucket("data")
    for i in range(3):
        put(mock_s3, "data", f"big-{i}.tar", blob(400000, i))
    cache_dir = str(tmp_path / "cache")
    with pytest.raises(shardfeed.LimitError) as ei:
        shardfeed.warm_cache(b + "/", cache_dir=cache_dir, cache_limit="1M",
                             endpoint_url=mock_s3.endpoint_url)
    assert "cache_limit" in str(ei.value)
    assert cache_entries(cache_dir) == 0


def test_warm_cache_progress_exception_cancels_and_propagates(mock_s3, tmp_path):
    b = mock_s3.bucket("slow")
    for i in range(2):
        put(mock_s3, "slow", f"s-{i}.tar", blob(1 << 20, 30 + i))
    # 1 MiB at 64 KiB/s per connection: a download takes 16 s unless cancelled.
    mock_s3.faults("prefix=slow/,bandwidth=64K")
    cache_dir = str(tmp_path / "cache")
    ep = mock_s3.endpoint_url

    class Stop(Exception):
        pass

    calls = []

    def progress(s):
        # The first call comes at once, the second while the downloads run.
        calls.append(s)
        if len(calls) == 2:
            raise Stop("enough")

    with pytest.raises(Stop):
        shardfeed.warm_cache(b + "/", cache_dir=cache_dir, progress=progress, chunk_size="1M",
                             endpoint_url=ep)
    assert len(calls) == 2, "progress was called after its exception"
    assert calls[-1]["fetched"] == 0
    left = shardfeed.warm_cache(b + "/", cache_dir=cache_dir, dry_run=True, endpoint_url=ep)
    assert sorted(left["would_fetch"]) == ["s3://slow/s-0.tar", "s3://slow/s-1.tar"]
    assert cache_entries(cache_dir) == 0


def test_ctrl_c_cancels_warm_cache(mock_s3, tmp_path):
    b = mock_s3.bucket("slow")
    put(mock_s3, "slow", "big.tar", blob(1 << 20, 40))
    mock_s3.faults("prefix=slow/,bandwidth=64K")
    cache_dir = str(tmp_path / "cache")
    ep = mock_s3.endpoint_url
    sent = []

    def progress(s):
        # While the download runs, SIGINT arrives from another thread as the
        # call blocks in C: the cancel poll must notice it.
        if s["objects_total"] == 1 and not sent:
            sent.append(1)
            threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGINT)).start()

    with pytest.raises(KeyboardInterrupt):
        shardfeed.warm_cache(b + "/big.tar", cache_dir=cache_dir, progress=progress,
                             chunk_size="1M", endpoint_url=ep)
    assert sent
    left = shardfeed.warm_cache(b + "/big.tar", cache_dir=cache_dir, dry_run=True,
                                endpoint_url=ep)
    assert left["would_fetch"] == ["s3://slow/big.tar"]


# ------------------------------------------------------------ pack, index

def test_pack_to_s3_then_ls_shows_the_shards_and_the_index(mock_s3, tmp_path):
    b = mock_s3.bucket("out")
    src, n_files, n_bytes = image_folder(tmp_path, 12, 3000)
    seen = []
    res = shardfeed.pack(str(src), b + "/ds", shard_bytes="16K", progress=seen.append,
                         tmp_dir=str(tmp_path), endpoint_url=mock_s3.endpoint_url)
    assert res["format"] == "tar" and res["layout"] == "imagefolder"
    assert res["files"] == n_files and res["samples"] == n_files
    assert res["source_bytes"] == n_bytes and res["classes"] == 2
    assert res["shards"] > 1

    listed = shardfeed.ls(b + "/ds/", recursive=True, endpoint_url=mock_s3.endpoint_url)
    names = sorted(e["key"] for e in listed)
    shards = [f"ds/shard-{i:06d}.tar" for i in range(res["shards"])]
    assert names == sorted(shards + ["ds/index.json"])
    assert sum(e["size"] for e in listed if e["key"] != "ds/index.json") == res["shard_bytes"]

    with open(os.path.join(mock_s3.root, "out", "ds", "index.json")) as f:
        idx = json.load(f)
    assert idx["shard_count"] == res["shards"]
    assert idx["sample_count"] == n_files
    assert sum(s["samples"] for s in idx["shards"]) == n_files

    assert seen, "progress was never called"
    last = seen[-1]
    assert last["files_done"] == last["files_total"] == n_files
    assert last["bytes_done"] == last["bytes_total"] == n_bytes
    assert last["shards_done"] == res["shards"]


def test_pack_part_size_uploads_a_large_shard_in_parts(mock_s3, tmp_path):
    b = mock_s3.bucket("parts")
    src, n_files, n_bytes = image_folder(tmp_path, 3, 2 * 1024 * 1024)  # one ~12 MiB shard
    res = shardfeed.pack(str(src), b + "/ds", shard_bytes="64M", part_size="5M",
                         tmp_dir=str(tmp_path), endpoint_url=mock_s3.endpoint_url)
    assert res["shards"] == 1 and res["files"] == n_files
    st = shardfeed.stat(b + "/ds/shard-000000.tar", endpoint_url=mock_s3.endpoint_url)
    assert st["size"] == res["shard_bytes"]
    # 5 MiB parts: S3's multipart ETag ends in -3 (md5 of the parts' md5s, "-N")
    with open(os.path.join(mock_s3.root, "parts", "ds", "shard-000000.tar"), "rb") as f:
        data = f.read()
    part = 5 * 1024 * 1024
    md5s = b"".join(hashlib.md5(data[i:i + part]).digest() for i in range(0, len(data), part))
    assert st["etag"].strip('"') == f"{hashlib.md5(md5s).hexdigest()}-3"
    assert mock_s3.stats()["operations"].get("UploadPart") == 3

    with pytest.raises(shardfeed.ConfigError, match="part_size"):
        shardfeed.pack(str(src), b + "/x", part_size="1M", endpoint_url=mock_s3.endpoint_url)
    with pytest.raises(shardfeed.Error, match="part size"):
        shardfeed.pack(str(src), b + "/y", part_size="6G", tmp_dir=str(tmp_path),
                       endpoint_url=mock_s3.endpoint_url)


def test_pack_progress_exception_cancels_and_leaves_nothing(tmp_path):
    src, _n, _b = image_folder(tmp_path, 6, 2000)
    dest = tmp_path / "dest"

    calls = []

    def progress(p):
        # The first snapshot (after the scan) goes out at once: stop there.
        calls.append(p)
        if p["files_done"] < p["files_total"]:
            raise RuntimeError("stop the pack")

    with pytest.raises(RuntimeError, match="stop the pack"):
        shardfeed.pack(str(src), str(dest), shard_bytes="4K", progress=progress)
    assert len(calls) == 1
    assert not (dest / "index.json").exists()
    assert not [p for p in dest.iterdir() if p.name.endswith(".tar")]

    res = shardfeed.pack(src, dest, shard_bytes="4K")  # path-like arguments
    assert (dest / "index.json").exists()
    assert len([p for p in dest.iterdir() if p.name.endswith(".tar")]) == res["shards"]


def test_pack_missing_source_raises_not_found(tmp_path):
    with pytest.raises(shardfeed.NotFoundError) as ei:
        shardfeed.pack(str(tmp_path / "nope"), str(tmp_path / "dest"))
    assert "nope" in str(ei.value)


def test_index_matches_what_pack_wrote(mock_s3, tmp_path):
    src, n_files, _b = image_folder(tmp_path, 10, 2500)
    dest = tmp_path / "local"
    res = shardfeed.pack(str(src), str(dest), format="record", zstd_level=1, shard_bytes="12K")
    packed = json.loads((dest / "index.json").read_text())

    seen = []
    got = shardfeed.index(str(dest) + "/", dry_run=True, progress=seen.append)
    assert [(s["name"], s["bytes"], s["samples"], s["xxh3_64"]) for s in got["shards"]] == [
        (s["name"], s["bytes"], s["samples"], s["xxh3_64"]) for s in packed["shards"]]
    assert got["sample_count"] == n_files
    assert seen and seen[-1]["shards_done"] == seen[-1]["shards_total"] == res["shards"]

    # Shards in the bucket: the index is written beside them (or at output=).
    b = mock_s3.bucket("idx")
    for s in packed["shards"]:
        put(mock_s3, "idx", "set/" + s["name"], (dest / s["name"]).read_bytes())
    ep = mock_s3.endpoint_url
    pattern = b + "/set/shard-{%06d..%06d}.sfr" % (0, res["shards"] - 1)
    written = shardfeed.index(pattern, output=b + "/set/copy.json", endpoint_url=ep)
    with open(os.path.join(mock_s3.root, "idx", "set", "copy.json")) as f:
        assert json.load(f) == written
    assert written["sample_count"] == n_files
    beside = shardfeed.index(b + "/set/", endpoint_url=ep)
    assert shardfeed.stat(b + "/set/index.json", endpoint_url=ep)["size"] > 0
    assert beside["shards"] == written["shards"]

    with pytest.raises(shardfeed.NotFoundError) as ei:
        shardfeed.index(b + "/set/shard-{000000..000099}.sfr", dry_run=True, endpoint_url=ep)
    assert "s3://idx/set/shard-" in str(ei.value)


def test_index_of_a_corrupt_shard_raises_corrupt_error_with_the_offset(mock_s3):
    b = mock_s3.bucket("bad")
    put(mock_s3, "bad", "broken.tar", b"\x01" * 1536)  # not a tar header: bad checksum
    with pytest.raises(shardfeed.CorruptError) as ei:
        shardfeed.index(b + "/broken.tar", dry_run=True, endpoint_url=mock_s3.endpoint_url)
    assert "broken.tar" in str(ei.value)


def test_star_import_gives_the_tools_and_every_public_name_exists():
    """`from shardfeed import *` (notebooks) brings the tools the docs show;
    a name in __all__ that the package lacks would make it raise."""
    ns = {}
    exec("from shardfeed import *", ns)
    for name in ("Loader", "ls", "stat", "warm_cache", "pack", "index", "doctor", "tune"):
        assert callable(ns[name]), name
    import shardfeed
    for name in shardfeed.__all__:
        assert hasattr(shardfeed, name), name

