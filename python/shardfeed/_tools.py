"""Module-level tools: ls, stat, warm_cache, pack, index (as the CLI's commands).

Every function takes the S3 options as keywords (``**s3``):

- ``endpoint_url`` (str): the S3 endpoint, e.g. ``"http://127.0.0.1:9000"``;
  default AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's, else AWS.
- ``region`` (str), ``profile`` (str): as the AWS tools resolve them.
- ``no_sign_request`` (bool): anonymous requests, no credential lookup.
- ``concurrency`` (int): requests in flight in total (default 32).
- ``io_threads`` (int): I/O threads sharing them, each with its own connections
  (default 0: the CPUs the process may use, at most 4).
- ``chunk_size`` (int bytes or a string such as ``"8M"``): bytes per ranged GET.
- ``max_attempts`` (int): attempts per request, the first included (default 10).

They are read by the loader's option parser (docs/loader.md): a bad value
raises :class:`shardfeed.ConfigError` naming the option. Failures raise the
:class:`shardfeed.Error` subclass of their status; the message names the
object and, where it applies, the byte offset.

``progress`` (warm_cache, pack, index): a callable taking one dict, the
library's progress snapshot; it is called on the calling thread at most five
times a second and once more at the end. An exception it raises cancels the
operation and propagates; so does Ctrl-C.
"""
import json
import os

from . import _shardfeed
from ._loader import _check_json_value, _config_error, _path, _source_list

_S3_OPTIONS = ("endpoint_url", "region", "profile", "no_sign_request", "addressing",
               "ca_bundle", "insecure", "http2", "concurrency", "io_threads", "chunk_size",
               "max_attempts", "stall_timeout_ms", "connect_timeout_ms",
               "first_byte_timeout_ms", "request_timeout_ms")


def _options_json(fn, s3, extra=None):
    """The S3 options (and extra ones, e.g. cache_dir) as the JSON text the
    C parser reads; None values keep the default."""
    merged = {}
    for key, value in s3.items():
        if key not in _S3_OPTIONS:
            raise _config_error(
                f"{fn}: unknown option '{key}' (S3 options: {', '.join(_S3_OPTIONS)})")
        if value is not None:
            merged[key] = value
    for key, value in (extra or {}).items():
        if value is not None:
            merged[key] = os.fspath(value) if isinstance(value, os.PathLike) else value
    for key, value in merged.items():
        _check_json_value(f"{fn}: ", key, value)
    try:
        return json.dumps(merged)
    except (TypeError, ValueError) as e:
        raise _config_error(f"{fn}: options: {e}") from None


def _flag(fn, name, value):
    if not isinstance(value, bool):
        raise _config_error(f"{fn}: {name}: expected True or False, got {value!r}")
    return value


def _choice(fn, name, value, allowed):
    if value not in allowed:
        raise _config_error(
            f"{fn}: {name}: expected one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
    return value


def _callable(fn, progress):
    if progress is not None and not callable(progress):
        raise _config_error(f"{fn}: progress: expected a callable or None")
    return progress


def ls(url_or_pattern, *, recursive=False, **s3):
    """Lists objects: ``s3://bucket/prefix`` (keys below the next '/' grouped
    into prefixes unless ``recursive``), ``s3://`` (the buckets), or a brace
    pattern (``s3://b/train-{000..099}.tar``: every object it names, each
    checked to exist; a missing one raises NotFoundError naming it).

    Returns a list of dicts ``{"url", "key", "size", "etag",
    "last_modified", "is_prefix"}``: size in bytes, last_modified in seconds
    since the epoch (None where unknown, and for prefixes)."""
    url = _path("ls", "url_or_pattern", url_or_pattern)
    return _shardfeed._ls(url, _flag("ls", "recursive", recursive), _options_json("ls", s3))


def stat(url, **s3):
    """Size, ETag and modification time of one object (HEAD; a local file is
    stat()ed): a dict with the keys of :func:`ls`. A missing object raises
    NotFoundError; a brace pattern raises ConfigError (use :func:`ls`)."""
    return _shardfeed._stat(_path("stat", "url", url), _options_json("stat", s3))


def warm_cache(sources, *, cache_dir, cache_limit=None, verify=False, dry_run=False,
               max_objects=None, progress=None, **s3):
    """Downloads shards into the disk cache at ``cache_dir`` before a job
    (``shardfeed warm-cache``). Objects already cached are skipped; an
    interrupted run resumes where it stopped.

    sources: a str or list of str (s3:// URLs, brace patterns, prefixes
    ending in '/'). cache_limit: bytes (int or "50G"; the objects must fit,
    else LimitError before anything is fetched). verify: hash cached entries
    before skipping them. dry_run: fetch nothing, report what would be
    fetched (``would_fetch``). max_objects: objects downloading at once
    (default 8).

    Returns a dict of the sf_warm_stats fields (objects_total, objects_done,
    fetched, cached, peer, failed, bytes_total, bytes_to_fetch,
    bytes_fetched, elapsed_s) plus ``cache_dir``, ``failures`` and, for a dry
    run, ``would_fetch`` (URLs). progress gets the same stats fields. When an
    object fails, the Error of the first failure is raised after the others
    were fetched; its ``.stats`` is that dict (``failures`` lists each one).
    """
    fn = "warm_cache"
    opts = _options_json(fn, s3, {"cache_dir": _path(fn, "cache_dir", cache_dir),
                                  "cache_limit": cache_limit})
    return _shardfeed._warm_cache(_source_list(fn, sources), opts, _flag(fn, "verify", verify),
                                  _flag(fn, "dry_run", dry_run), max_objects,
                                  _callable(fn, progress))


def pack(src_dir, dest_url, *, format="tar", shard_bytes=None, zstd_level=0, name_pattern=None,
         layout="auto", follow_symlinks=False, tmp_dir=None, progress=None, part_size=None,
         **s3):
    """Packs the folder ``src_dir`` (ImageFolder: one folder per class; or
    flat, WebDataset-style) into tar or record shards plus index.json at
    ``dest_url`` (a local folder or ``s3://bucket/prefix``), as
    ``shardfeed pack`` does (docs/pack.md).

    format: "tar" or "record". shard_bytes: close a shard before it would
    pass this size (int or "256M"; default 256 MiB). zstd_level: 1..22
    compresses records (record format only; 0 = off). name_pattern: shard
    names with one %u (default "shard-%06u.tar" / ".sfr"). layout: "auto",
    "imagefolder" or "flat". tmp_dir: staging folder for s3:// uploads.
    part_size: s3:// only, a shard larger than this is uploaded as a
    multipart upload in parts of this size (int or "64M"; 5 MiB to 5 GiB;
    default 64 MiB), as ``--part-size``.

    progress gets {bytes_done, bytes_total, files_done, files_total,
    shards_done}. Returns a dict of the sf_pack_result fields (format,
    layout, shards, samples, files, source_bytes, shard_bytes, ignored,
    classes). On failure nothing is reported as done: no index.json is
    written and local shards this call made are removed."""
    fn = "pack"
    if isinstance(zstd_level, bool) or not isinstance(zstd_level, int):
        raise _config_error(f"pack: zstd_level: expected an int from 0 to 22, got "
                                     f"{zstd_level!r}")
    if name_pattern is not None and not isinstance(name_pattern, str):
        raise _config_error(f"pack: name_pattern: expected a str, got {name_pattern!r}")
    return _shardfeed._pack(
        _path(fn, "src_dir", src_dir), _path(fn, "dest_url", dest_url), _options_json(fn, s3),
        _choice(fn, "format", format, ("tar", "record")), shard_bytes, zstd_level, name_pattern,
        _choice(fn, "layout", layout, ("auto", "imagefolder", "flat")),
        _flag(fn, "follow_symlinks", follow_symlinks),
        None if tmp_dir is None else _path(fn, "tmp_dir", tmp_dir), _callable(fn, progress),
        part_size)


def index(sources, *, dry_run=False, output=None, parallel=None, window=None, progress=None,
          **s3):
    """Reads existing tar/record shards once and writes the index.json
    ``pack`` would have written for them (counts, sizes, XXH3-64 checksums),
    as ``shardfeed index`` does: by default as index.json in the folder of
    the first shard, or at ``output`` (a local path or s3:// URL).

    sources: a str or list of str (s3:// keys, brace patterns, prefixes
    ending in '/', local paths); every named object must exist. dry_run:
    write nothing. parallel: shards read at once (default 8). window: memory
    per shard being read (int or "8M").

    progress gets {shards_done, shards_total, bytes_done, bytes_total}.
    Returns the index (the parsed index.json)."""
    fn = "index"
    if output is not None:
        output = _path(fn, "output", output)
    text, _url = _shardfeed._index(_source_list(fn, sources), _options_json(fn, s3),
                                   _flag(fn, "dry_run", dry_run), output, parallel, window,
                                   _callable(fn, progress))
    return json.loads(text)
