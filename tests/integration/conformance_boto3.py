#!/usr/bin/env python3
"""Conformance test: drive shardfeed-mock-s3 with boto3, a client nobody here wrote.

Usage: python3 conformance_boto3.py --server PATH_TO_BINARY

Starts the server on a free port with a fresh temporary root, runs every check
(one line each: PASS/FAIL), stops the server with SIGTERM and prints a final
line "N passed, M failed". Exits non-zero if any check failed.

Only the standard library and boto3 are used.
"""

import argparse
import base64
import concurrent.futures
import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import zlib

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

ACCESS_KEY = "conformance-access-key"
SECRET_KEY = "conformance-secret-key/with+odd=chars"
REGION = "us-east-1"
BUCKET = "conformance"
MIB = 1024 * 1024

# Keys that exercise URL encoding of the request path and of list results.
# '+' matters twice: in a path it is a literal plus, and boto3 decodes
# encoding-type=url listings with unquote_plus, so the server must send %2B.
SPECIAL_KEYS = [
    "with space.txt",
    "plus+sign.txt",
    "percent%20literal.txt",
    "amp&ersand=eq?q.txt",
    "données/é.bin",
    "tilde~star*paren(1).txt",
]
BIG_KEY = "big/random-3mib.bin"
MANY_PREFIX = "many/"
MANY_COUNT = 1050  # > 1000 so a default-MaxKeys listing needs 2 pages


class Checks:
    """Records one PASS/FAIL line per check; a failing check does not stop the run."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    @contextlib.contextmanager
    def check(self, name):
        try:
            yield
        except Exception as e:  # noqa: BLE001 - report anything as a failure
            self.failed += 1
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            print(f"FAIL {name}: {detail}", flush=True)
            if os.environ.get("SF_CONFORMANCE_TRACE"):
                traceback.print_exc()
        else:
            self.passed += 1
            print(f"PASS {name}", flush=True)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def expect_eq(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: expected {want!r}, got {got!r}")


def client_error(fn, *args, **kwargs):
    """Call fn, which must raise ClientError; return (code, http_status)."""
    try:
        fn(*args, **kwargs)
    except ClientError as e:
        return (e.response.get("Error", {}).get("Code"),
                e.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    raise AssertionError("expected a ClientError, the call succeeded")


def md5_etag(data):
    return '"' + hashlib.md5(data).hexdigest() + '"'


def expect_download(s3, key, path, cfg, want):
    """download_file of key to path gives exactly want."""
    s3.download_file(BUCKET, key, path, Config=cfg)
    with open(path, "rb") as f:
        expect(f.read() == want, f"downloaded bytes of {key} differ")


def upload_via_file(s3, path, key, data, cfg):
    """upload_file of data, written to path first, as key."""
    with open(path, "wb") as f:
        f.write(data)
    s3.upload_file(path, BUCKET, key, Config=cfg)


def expect_head(s3, key, length, etag, what=""):
    """head_object of key gives this ContentLength and ETag; returns its answer."""
    h = s3.head_object(Bucket=BUCKET, Key=key)
    expect_eq(h["ContentLength"], length, f"ContentLength{what}")
    expect_eq(h["ETag"], etag, f"ETag{what}")
    return h


def multipart_etag(parts):
    """S3's ETag of an object uploaded in these parts: md5 of the md5s, "-N"."""
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    return '"%s-%d"' % (hashlib.md5(md5s).hexdigest(), len(parts))


class Server:
    """The mock server as a child process; port read from its first stdout line."""

    def __init__(self, binary, root, tls=None):
        extra = ["--tls-cert", tls[0], "--tls-key", tls[1]] if tls else []
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--root", root,
             "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, "--quiet"] + extra,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None)
        line = self._first_line(timeout=15)
        m = re.fullmatch(r"listening on (https?)://127\.0\.0\.1:(\d+)", line.strip())
        if not m:
            raise RuntimeError(f"unexpected first stdout line: {line!r}")
        self.port = int(m.group(2))
        self.url = f"{m.group(1)}://127.0.0.1:{self.port}"
        # Keep draining stdout so a chatty server can never block on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _first_line(self, timeout):
        box = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()),
                             daemon=True)
        t.start()
        t.join(timeout)
        if not box:
            raise RuntimeError(f"no 'listening on' line within {timeout} s")
        if not box[0]:
            raise RuntimeError(f"server exited before listening (status {self.proc.wait()})")
        return box[0].decode("utf-8", "replace")

    def _drain(self):
        for _ in self.proc.stdout:
            pass

    def terminate(self, timeout):
        """SIGTERM; return the exit status, or None if it did not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def make_client(url, access_key=ACCESS_KEY, secret_key=SECRET_KEY, verify=None):
    cfg = Config(
        s3={"addressing_style": "path"},
        signature_version="s3v4",
        region_name=REGION,
        # No retries: a conformance test must see the first answer, not a retried one.
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=32,
        connect_timeout=10,
        read_timeout=60,
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=url, region_name=REGION, config=cfg,
        aws_access_key_id=access_key, aws_secret_access_key=secret_key, verify=verify)


def open_stalled_get(url, path, stall_ms):
    """Start a signed GET whose body the server stalls (x-sfmock-fault) and leave it open.

    Signed by hand with botocore's signer because boto3 has no per-call header
    option; returns the connection and the response, with the headers read.
    """
    req = AWSRequest(method="GET", url=url + path, headers={"x-sfmock-fault": f"stall={stall_ms}"})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION).add_auth(req)
    prepared = req.prepare()
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=30)
    conn.request("GET", path, headers=dict(prepared.headers.items()))
    return conn, conn.getresponse()


def list_all(s3, **kwargs):
    """Every key and common prefix over all pages of ListObjectsV2, plus page count."""
    keys, prefixes, pages = [], [], 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, **kwargs):
        pages += 1
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return keys, prefixes, pages


def run_checks(c, server, tmp):
    s3 = make_client(server.url)
    objects = {}  # key -> bytes, everything currently in the bucket
    gets = 0      # GetObject calls made, compared with /_mock/stats at the end

    # ---- buckets -------------------------------------------------------------
    with c.check("create_bucket"):
        r = s3.create_bucket(Bucket=BUCKET)
        expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 200, "status")
        expect(os.path.isdir(os.path.join(tmp, "root", BUCKET)), "bucket folder not created")

    with c.check("create_bucket again -> BucketAlreadyOwnedByYou (409)"):
        expect_eq(client_error(s3.create_bucket, Bucket=BUCKET),
                  ("BucketAlreadyOwnedByYou", 409), "error")

    with c.check("head_bucket"):
        expect_eq(s3.head_bucket(Bucket=BUCKET)["ResponseMetadata"]["HTTPStatusCode"], 200,
                  "status")

    with c.check("list_buckets contains the bucket"):
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
        expect(BUCKET in names, f"{BUCKET!r} not in {names!r}")

    # ---- put / head ----------------------------------------------------------
    rng = random.Random(20240611)
    with c.check(f"put_object {len(SPECIAL_KEYS)} keys with special characters"):
        for i, key in enumerate(SPECIAL_KEYS):
            data = f"object {i}: {key}\n".encode() * (i + 1)
            r = s3.put_object(Bucket=BUCKET, Key=key, Body=data)
            expect_eq(r["ETag"], md5_etag(data), f"ETag of {key!r}")
            objects[key] = data

    big = rng.randbytes(3 * MIB)
    with c.check("put_object 3 MiB random object"):
        r = s3.put_object(Bucket=BUCKET, Key=BIG_KEY, Body=big)
        expect_eq(r["ETag"], md5_etag(big), "ETag")
        objects[BIG_KEY] = big

    with c.check("put_object stores the bytes on disk under root/bucket/key"):
        with open(os.path.join(tmp, "root", BUCKET, "données", "é.bin"), "rb") as f:
            expect_eq(f.read(), objects["données/é.bin"], "file content")

    with c.check("put_object of an empty object"):
        r = s3.put_object(Bucket=BUCKET, Key="empty", Body=b"")
        expect_eq(r["ETag"], md5_etag(b""), "ETag")
        objects["empty"] = b""

    with c.check("head_object ContentLength and ETag (quoted md5)"):
        for key in SPECIAL_KEYS + [BIG_KEY, "empty"]:
            h = expect_head(s3, key, len(objects[key]), md5_etag(objects[key]), f" of {key!r}")
            expect("LastModified" in h, f"no LastModified for {key!r}")

    with c.check("get_object of every special key round-trips"):
        for key in SPECIAL_KEYS + ["empty"]:
            r = s3.get_object(Bucket=BUCKET, Key=key)
            gets += 1
            expect_eq(r["Body"].read(), objects[key], f"body of {key!r}")
            expect_eq(r["ETag"], md5_etag(objects[key]), f"ETag of {key!r}")

    # Prefix/delimiter layout: dir/a/{1,2}, dir/b/1, dir/top.txt
    dir_keys = ["dir/a/1", "dir/a/2", "dir/b/1", "dir/top.txt"]
    with c.check("put_object prefix/delimiter layout"):
        for key in dir_keys:
            s3.put_object(Bucket=BUCKET, Key=key, Body=key.encode())
            objects[key] = key.encode()

    many_keys = [f"{MANY_PREFIX}k{i:05d}" for i in range(MANY_COUNT)]
    with c.check(f"put_object {MANY_COUNT} small keys (16 threads)"):
        def put(key):
            s3.put_object(Bucket=BUCKET, Key=key, Body=key.encode())
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(put, many_keys))
        for key in many_keys:
            objects[key] = key.encode()

    # ---- listings ------------------------------------------------------------
    # Python sorts str by code point, which is the same order as UTF-8 bytes (S3's order).
    with c.check("list_objects_v2 whole bucket, default MaxKeys: 2+ pages, each key once, sorted"):
        keys, prefixes, pages = list_all(s3)
        expect(pages >= 2, f"only {pages} page(s) for {len(keys)} keys")
        expect_eq(len(keys), len(set(keys)), "duplicate keys across pages")
        expect_eq(keys, sorted(objects), "keys")
        expect_eq(prefixes, [], "CommonPrefixes without delimiter")

    with c.check("list_objects_v2 Prefix=many/ MaxKeys=100: 11 pages, each key once, sorted"):
        keys, _, pages = list_all(s3, Prefix=MANY_PREFIX, PaginationConfig={"PageSize": 100})
        expect_eq(pages, (MANY_COUNT + 99) // 100, "pages")
        expect_eq(keys, many_keys, "keys")

    with c.check("list_objects_v2 single page fields (KeyCount, IsTruncated, Size, ETag)"):
        r = s3.list_objects_v2(Bucket=BUCKET, Prefix=MANY_PREFIX, MaxKeys=100)
        expect_eq(r["KeyCount"], 100, "KeyCount")
        expect_eq(r["MaxKeys"], 100, "MaxKeys")
        expect_eq(r["IsTruncated"], True, "IsTruncated")
        expect("NextContinuationToken" in r, "no NextContinuationToken")
        first = r["Contents"][0]
        expect_eq(first["Key"], many_keys[0], "first key")
        expect_eq(first["Size"], len(many_keys[0]), "Size")
        expect_eq(first["ETag"], md5_etag(many_keys[0].encode()), "ETag")
        r = s3.list_objects_v2(Bucket=BUCKET, Prefix="dir/")
        expect_eq(r["IsTruncated"], False, "IsTruncated of a short listing")
        expect_eq(r["KeyCount"], len(dir_keys), "KeyCount of a short listing")

    with c.check("list_objects_v2 StartAfter"):
        keys, _, _ = list_all(s3, Prefix=MANY_PREFIX, StartAfter=many_keys[1000])
        expect_eq(keys, many_keys[1001:], "keys")

    with c.check("list_objects_v2 Prefix=dir/ Delimiter=/ -> CommonPrefixes"):
        keys, prefixes, _ = list_all(s3, Prefix="dir/", Delimiter="/")
        expect_eq(keys, ["dir/top.txt"], "Contents")
        expect_eq(prefixes, ["dir/a/", "dir/b/"], "CommonPrefixes")

    with c.check("list_objects_v2 Delimiter=/ at the root"):
        keys, prefixes, _ = list_all(s3, Delimiter="/")
        want_prefixes = sorted({k.split("/")[0] + "/" for k in objects if "/" in k})
        want_keys = sorted(k for k in objects if "/" not in k)
        expect_eq(prefixes, want_prefixes, "CommonPrefixes")
        expect_eq(keys, want_keys, "Contents")

    # A common prefix counts against MaxKeys, and the continuation token must skip
    # the whole rolled-up prefix (S3 semantics).
    with c.check("list_objects_v2 Prefix=dir/ Delimiter=/ MaxKeys=1: 3 pages, no repeats"):
        keys, prefixes, pages = list_all(s3, Prefix="dir/", Delimiter="/",
                                         PaginationConfig={"PageSize": 1})
        expect_eq(prefixes, ["dir/a/", "dir/b/"], "CommonPrefixes")
        expect_eq(keys, ["dir/top.txt"], "Contents")
        expect_eq(pages, 3, "pages")

    # boto3 adds encoding-type=url on its own and decodes the answer only if the
    # server echoes <EncodingType>url</EncodingType>.
    with c.check("list_objects_v2 encoding-type=url (boto3 default): special keys round-trip"):
        r = s3.list_objects_v2(Bucket=BUCKET, MaxKeys=1)
        expect_eq(r.get("EncodingType"), "url", "EncodingType in response")
        listed = set(list_all(s3)[0])
        for key in SPECIAL_KEYS:
            expect(key in listed, f"{key!r} not listed as-is (got e.g. "
                   f"{sorted(k for k in listed if not k.startswith(MANY_PREFIX))[:8]!r})")

    with c.check("list_objects_v2 Prefix with special characters"):
        for key in SPECIAL_KEYS:
            keys, _, _ = list_all(s3, Prefix=key)
            expect_eq(keys, [key], f"Prefix={key!r}")

    with c.check("list_objects_v2 Prefix=données/ Delimiter=/ (UTF-8)"):
        keys, prefixes, _ = list_all(s3, Prefix="données/", Delimiter="/")
        expect_eq(keys, ["données/é.bin"], "Contents")
        expect_eq(prefixes, [], "CommonPrefixes")

    with c.check("list_objects (v1) with Marker pagination"):
        keys, marker = [], None
        pages = 0
        while True:
            kw = {"Marker": marker} if marker else {}
            r = s3.list_objects(Bucket=BUCKET, Prefix=MANY_PREFIX, MaxKeys=400, **kw)
            pages += 1
            keys += [o["Key"] for o in r.get("Contents", [])]
            if not r["IsTruncated"]:
                break
            marker = r.get("NextMarker") or keys[-1]
            expect(pages < 10, "v1 listing does not end")
        expect_eq(keys, many_keys, "keys")
        expect_eq(pages, 3, "pages")

    # ---- ranged and conditional gets ----------------------------------------
    size = len(big)
    for rng_hdr, lo, hi in [("bytes=10-99", 10, 99),
                            ("bytes=100-", 100, size - 1),
                            ("bytes=-50", size - 50, size - 1),
                            ("bytes=0-0", 0, 0),
                            (f"bytes={size - 10}-{size + 1000}", size - 10, size - 1)]:
        with c.check(f"get_object Range {rng_hdr}"):
            r = s3.get_object(Bucket=BUCKET, Key=BIG_KEY, Range=rng_hdr)
            gets += 1
            expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 206, "status")
            expect_eq(r.get("ContentRange"), f"bytes {lo}-{hi}/{size}", "ContentRange")
            expect_eq(r["ContentLength"], hi - lo + 1, "ContentLength")
            body = r["Body"].read()
            expect(body == big[lo:hi + 1], f"body differs ({len(body)} bytes)")

    with c.check("get_object unsatisfiable Range -> InvalidRange (416)"):
        gets += 1
        expect_eq(client_error(s3.get_object, Bucket=BUCKET, Key=BIG_KEY,
                               Range=f"bytes={size}-"),
                  ("InvalidRange", 416), "error")

    with c.check("get_object malformed Range is ignored -> 200 full body"):
        r = s3.get_object(Bucket=BUCKET, Key=BIG_KEY, Range="bytes=abc")
        gets += 1
        expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 200, "status")
        expect(r["Body"].read() == big, "body differs")

    etag = md5_etag(big)
    with c.check("get_object IfMatch wrong -> PreconditionFailed (412)"):
        gets += 1
        expect_eq(client_error(s3.get_object, Bucket=BUCKET, Key=BIG_KEY,
                               IfMatch='"0123456789abcdef0123456789abcdef"'),
                  ("PreconditionFailed", 412), "error")

    with c.check("get_object IfMatch right -> 200"):
        r = s3.get_object(Bucket=BUCKET, Key=BIG_KEY, IfMatch=etag, Range="bytes=0-9")
        gets += 1
        expect_eq(r["Body"].read(), big[:10], "body")

    with c.check("get_object IfNoneMatch same ETag -> 304"):
        gets += 1
        _, status = client_error(s3.get_object, Bucket=BUCKET, Key=BIG_KEY, IfNoneMatch=etag)
        expect_eq(status, 304, "status")

    with c.check("get_object IfNoneMatch other ETag -> 200"):
        r = s3.get_object(Bucket=BUCKET, Key=BIG_KEY,
                          IfNoneMatch='"0123456789abcdef0123456789abcdef"')
        gets += 1
        expect(r["Body"].read() == big, "body differs")

    # ---- transfers (s3transfer) ----------------------------------------------
    # Thresholds high so both transfers are single requests (no multipart, no
    # ranged parallel download); the multipart checks come after.
    tcfg = TransferConfig(multipart_threshold=64 * MIB, preferred_transfer_client="classic")
    with c.check("download_file of the 3 MiB object, sha256 matches"):
        path = os.path.join(tmp, "download.bin")
        s3.download_file(BUCKET, BIG_KEY, path, Config=tcfg)
        gets += 1
        with open(path, "rb") as f:
            expect_eq(hashlib.sha256(f.read()).hexdigest(), hashlib.sha256(big).hexdigest(),
                      "sha256")

    upload = rng.randbytes(5 * MIB + 123)
    with c.check("upload_file of a 5 MiB file, then get_object matches"):
        upload_via_file(s3, os.path.join(tmp, "upload.bin"), "uploads/file.bin", upload, tcfg)
        objects["uploads/file.bin"] = upload
        r = s3.get_object(Bucket=BUCKET, Key="uploads/file.bin")
        gets += 1
        expect_eq(r["ETag"], md5_etag(upload), "ETag")
        expect(r["Body"].read() == upload, "body differs")

    # ---- multipart upload ------------------------------------------------------
    mp_data = rng.randbytes(20 * MIB + 4321)
    mp_cfg = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB,
                            max_concurrency=4, preferred_transfer_client="classic")
    mp_parts = [mp_data[i:i + 5 * MIB] for i in range(0, len(mp_data), 5 * MIB)]
    mp_etag = multipart_etag(mp_parts)
    with c.check("upload_file of 20 MiB in 5 MiB parts (4 threads): ETag is md5 of md5s -5"):
        upload_via_file(s3, os.path.join(tmp, "multipart.bin"), "uploads/multipart.bin", mp_data,
                        mp_cfg)
        objects["uploads/multipart.bin"] = mp_data
        expect_head(s3, "uploads/multipart.bin", len(mp_data), mp_etag)

    with c.check("download_file of the multipart object (ranged, 4 threads) is identical"):
        expect_download(s3, "uploads/multipart.bin", os.path.join(tmp, "multipart-down.bin"),
                        mp_cfg, mp_data)
        r = s3.get_object(Bucket=BUCKET, Key="uploads/multipart.bin")
        gets += 1
        expect_eq(r["ETag"], mp_etag, "GetObject ETag")
        expect(r["Body"].read() == mp_data, "get_object bytes differ")

    small = b"x" * 1000
    big_part = mp_data[:5 * MIB]
    with c.check("list_parts lists the parts; list_multipart_uploads lists the upload"):
        up = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/listed")
        uid = up["UploadId"]
        e1 = s3.upload_part(Bucket=BUCKET, Key="mp/listed", UploadId=uid, PartNumber=1,
                            Body=big_part)["ETag"]
        e2 = s3.upload_part(Bucket=BUCKET, Key="mp/listed", UploadId=uid, PartNumber=2,
                            Body=small)["ETag"]
        expect_eq(e1, md5_etag(big_part), "part 1 ETag")
        parts = s3.list_parts(Bucket=BUCKET, Key="mp/listed", UploadId=uid)["Parts"]
        expect_eq([(p["PartNumber"], p["Size"], p["ETag"]) for p in parts],
                  [(1, len(big_part), e1), (2, len(small), e2)], "parts")
        ups = s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        expect_eq([(u["Key"], u["UploadId"]) for u in ups], [("mp/listed", uid)], "uploads")

    with c.check("complete_multipart_upload errors: InvalidPart, InvalidPartOrder, "
                 "EntityTooSmall, NoSuchUpload"):
        e3 = s3.upload_part(Bucket=BUCKET, Key="mp/listed", UploadId=uid, PartNumber=3,
                            Body=small)["ETag"]

        def complete(parts, upload_id=uid):
            s3.complete_multipart_upload(
                Bucket=BUCKET, Key="mp/listed", UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]})
        bad = '"0123456789abcdef0123456789abcdef"'
        expect_eq(client_error(complete, [(1, e1), (2, bad)]), ("InvalidPart", 400),
                  "wrong ETag")
        expect_eq(client_error(complete, [(2, e2), (1, e1)]), ("InvalidPartOrder", 400),
                  "out of order")
        expect_eq(client_error(complete, [(1, e1), (2, e2), (3, e3)]), ("EntityTooSmall", 400),
                  "small part before the last")
        expect_eq(client_error(complete, [(1, e1)], upload_id="no-such-upload"),
                  ("NoSuchUpload", 404), "unknown upload id")

    with c.check("abort_multipart_upload: no object, no upload listed, its parts gone"):
        r = s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/listed", UploadId=uid)
        expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 204, "status")
        expect_eq(client_error(s3.head_object, Bucket=BUCKET, Key="mp/listed")[1], 404,
                  "head after abort")
        expect_eq(s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []), [], "uploads")
        expect_eq(client_error(s3.list_parts, Bucket=BUCKET, Key="mp/listed", UploadId=uid),
                  ("NoSuchUpload", 404), "list_parts after abort")
        left = [n for n in os.listdir(os.path.join(tmp, "root", BUCKET))
                if n.startswith(".sfmock-")]
        expect_eq(left, [], "staged part files")

    with c.check("put_object overwrite changes content and ETag"):
        s3.put_object(Bucket=BUCKET, Key="plus+sign.txt", Body=b"overwritten")
        objects["plus+sign.txt"] = b"overwritten"
        r = s3.get_object(Bucket=BUCKET, Key="plus+sign.txt")
        gets += 1
        expect_eq(r["Body"].read(), b"overwritten", "body")
        expect_eq(r["ETag"], md5_etag(b"overwritten"), "ETag")

    # ---- deletes and errors --------------------------------------------------
    with c.check("delete_object then head_object -> 404"):
        r = s3.delete_object(Bucket=BUCKET, Key="with space.txt")
        expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 204, "delete status")
        del objects["with space.txt"]
        expect_eq(client_error(s3.head_object, Bucket=BUCKET, Key="with space.txt")[1], 404,
                  "head status")

    with c.check("delete_object of a missing key -> 204"):
        r = s3.delete_object(Bucket=BUCKET, Key="never/existed")
        expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 204, "status")

    with c.check("get_object missing key -> NoSuchKey (404)"):
        gets += 1
        expect_eq(client_error(s3.get_object, Bucket=BUCKET, Key="no/such/key"),
                  ("NoSuchKey", 404), "error")

    with c.check("get_object missing bucket -> NoSuchBucket (404)"):
        gets += 1
        expect_eq(client_error(s3.get_object, Bucket="no-such-bucket", Key="k"),
                  ("NoSuchBucket", 404), "error")

    with c.check("list_objects_v2 missing bucket -> NoSuchBucket (404)"):
        expect_eq(client_error(s3.list_objects_v2, Bucket="no-such-bucket"),
                  ("NoSuchBucket", 404), "error")

    with c.check("head_bucket missing bucket -> 404"):
        expect_eq(client_error(s3.head_bucket, Bucket="no-such-bucket")[1], 404, "status")

    with c.check("delete_bucket of a non-empty bucket -> BucketNotEmpty (409)"):
        expect_eq(client_error(s3.delete_bucket, Bucket=BUCKET), ("BucketNotEmpty", 409),
                  "error")

    with c.check("create_bucket + delete_bucket of an empty bucket"):
        s3.create_bucket(Bucket="scratch")
        r = s3.delete_bucket(Bucket="scratch")
        expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 204, "status")
        expect_eq(client_error(s3.head_bucket, Bucket="scratch")[1], 404, "head after delete")

    with c.check("wrong secret key -> SignatureDoesNotMatch (403)"):
        bad = make_client(server.url, secret_key=SECRET_KEY + "x")
        gets += 1
        expect_eq(client_error(bad.get_object, Bucket=BUCKET, Key=BIG_KEY),
                  ("SignatureDoesNotMatch", 403), "get_object")
        expect_eq(client_error(bad.list_objects_v2, Bucket=BUCKET),
                  ("SignatureDoesNotMatch", 403), "list_objects_v2")
        expect_eq(client_error(bad.put_object, Bucket=BUCKET, Key="x", Body=b"x"),
                  ("SignatureDoesNotMatch", 403), "put_object")

    with c.check("wrong access key -> InvalidAccessKeyId (403)"):
        bad = make_client(server.url, access_key="AKIDUNKNOWN")
        gets += 1
        expect_eq(client_error(bad.get_object, Bucket=BUCKET, Key=BIG_KEY),
                  ("InvalidAccessKeyId", 403), "error")

    with c.check("unsigned request without --anonymous -> AccessDenied (403)"):
        try:
            urllib.request.urlopen(f"{server.url}/{BUCKET}/dir/top.txt", timeout=10)
            raise AssertionError("unsigned GET succeeded")
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace")
            expect_eq(e.code, 403, "status")
            expect("<Code>AccessDenied</Code>" in body, f"body: {body[:200]!r}")
            expect(e.headers.get("x-amz-request-id"), "no x-amz-request-id")

    with c.check("final listing matches every put and delete"):
        keys, _, _ = list_all(s3)
        expect_eq(keys, sorted(objects), "keys")

    # ---- statistics -----------------------------------------------------------
    with c.check("/_mock/stats counters are plausible"):
        with urllib.request.urlopen(f"{server.url}/_mock/stats", timeout=10) as r:
            stats = json.load(r)
        ops, status = stats.get("operations", {}), stats.get("status", {})
        expect(ops.get("GetObject", 0) >= gets,
               f"GetObject {ops.get('GetObject')} < {gets} gets made")
        expect(ops.get("PutObject", 0) >= MANY_COUNT + len(SPECIAL_KEYS),
               f"PutObject {ops.get('PutObject')}")
        expect(ops.get("ListObjectsV2", 0) >= 10, f"ListObjectsV2 {ops.get('ListObjectsV2')}")
        expect(ops.get("HeadObject", 0) >= len(SPECIAL_KEYS), f"HeadObject {ops.get('HeadObject')}")
        for code in ("200", "206", "304", "403", "404", "412", "416"):
            expect(status.get(code, 0) >= 1, f"no {code} in status {status!r}")
        expect(stats.get("requests", 0) >= sum(ops.values()) > 0,
               f"requests {stats.get('requests')} < sum of operations {sum(ops.values())}")
        expect(stats.get("bytes_received", 0) >= len(big) + len(upload),
               f"bytes_received {stats.get('bytes_received')}")
        expect(stats.get("bytes_sent", 0) >= 3 * len(big),
               f"bytes_sent {stats.get('bytes_sent')}")
        per_key = stats.get("keys", {}).get(f"{BUCKET}/{BIG_KEY}", {})
        expect(per_key.get("status", {}).get("416", 0) >= 1,
               f"per-key stats of {BIG_KEY}: {per_key!r}")

    # Leave a transfer hanging (and boto3's idle keep-alive connections open) so
    # the SIGTERM check below proves that open transfers do not delay shutdown.
    held = []
    with c.check("a GET stalled by x-sfmock-fault: stall=60000 is held open"):
        conn, resp = open_stalled_get(server.url, f"/{BUCKET}/{BIG_KEY}", 60000)
        held.append(conn)
        expect_eq(resp.status, 200, "status")
        got = resp.read(1024)  # the first half of the body comes before the stall
        expect_eq(got, big[:1024], "first bytes")
    return held


def make_cert(tmp):
    """A self-signed P-256 certificate for 127.0.0.1 (its own CA): (cert, key) paths."""
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-addext", "basicConstraints=critical,CA:TRUE"],
        check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    return cert, key


def run_tls_checks(c, binary, tmp):
    """boto3 over HTTPS: botocore then sends PutObject and UploadPart bodies
    aws-chunked (STREAMING-UNSIGNED-PAYLOAD-TRAILER, a CRC32 trailer). The mock
    counts those bodies in /_mock/stats, so these checks fail if botocore stops
    using aws-chunked (the point of the section) as well as if the mock
    decodes them wrong. Then a restart on the same root keeps the multipart
    ETag."""
    root = os.path.join(tmp, "tls-root")
    os.mkdir(root)
    tls = None
    with c.check("TLS: a self-signed certificate is made (openssl)"):
        tls = make_cert(tmp)
    if tls is None:
        return
    server = None
    with c.check("TLS: the server starts on https"):
        server = Server(binary, root, tls=tls)
        expect(server.url.startswith("https://"), server.url)
    if server is None:
        return
    ctx = ssl.create_default_context(cafile=tls[0])

    def mock_stats():
        with urllib.request.urlopen(server.url + "/_mock/stats", context=ctx, timeout=10) as r:
            return json.loads(r.read())

    rng = random.Random(4242)
    s3 = make_client(server.url, verify=tls[0])
    mp_data = rng.randbytes(15 * MIB + 777)
    mp_parts = [mp_data[i:i + 5 * MIB] for i in range(0, len(mp_data), 5 * MIB)]
    mp_etag = multipart_etag(mp_parts)
    try:
        with c.check("TLS: bucket created"):
            s3.create_bucket(Bucket=BUCKET)

        small = rng.randbytes(300 * 1024 + 5)
        with c.check("TLS: put_object is sent aws-chunked with a CRC32 trailer, stored exactly"):
            before = mock_stats().get("aws_chunked", {})
            r = s3.put_object(Bucket=BUCKET, Key="tls/small.bin", Body=small)
            after = mock_stats()
            chunked = after.get("aws_chunked", {})
            got = sum(chunked.values()) - sum(before.values())
            expect_eq(got, 1, "aws-chunked bodies seen by the mock (botocore over https)")
            expect(after.get("checksums", {}).get("CRC32", 0) >= 1, "no CRC32 checked")
            crc = base64.b64encode(zlib.crc32(small).to_bytes(4, "big")).decode()
            expect_eq(r.get("ChecksumCRC32"), crc, "echoed x-amz-checksum-crc32")
            expect_eq(r["ETag"], md5_etag(small), "ETag")
            body = s3.get_object(Bucket=BUCKET, Key="tls/small.bin")["Body"].read()
            expect(body == small, "body differs")

        mp_cfg = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB,
                                max_concurrency=4, preferred_transfer_client="classic")
        with c.check("TLS: upload_file of 15 MiB in 5 MiB parts, each part aws-chunked"):
            before = sum(mock_stats().get("aws_chunked", {}).values())
            upload_via_file(s3, os.path.join(tmp, "tls-multipart.bin"), "tls/multipart.bin",
                            mp_data, mp_cfg)
            after = mock_stats()
            expect_eq(sum(after.get("aws_chunked", {}).values()) - before, len(mp_parts),
                      "aws-chunked UploadPart bodies")
            expect_eq(after["operations"].get("UploadPart"), len(mp_parts), "UploadPart count")
            expect_head(s3, "tls/multipart.bin", len(mp_data), mp_etag)

        with c.check("TLS: download_file of the multipart object is identical"):
            expect_download(s3, "tls/multipart.bin", os.path.join(tmp, "tls-down.bin"),
                            mp_cfg, mp_data)

        with c.check("TLS: a wrong x-amz-checksum-crc32 is 400 BadDigest, nothing stored"):
            code = client_error(s3.put_object, Bucket=BUCKET, Key="tls/bad.bin",
                                Body=b"0123456789", ChecksumCRC32="AAAAAA==")
            expect_eq(code, ("BadDigest", 400), "error")
            expect_eq(client_error(s3.head_object, Bucket=BUCKET, Key="tls/bad.bin"),
                      ("404", 404), "HEAD of the refused key")
    finally:
        with c.check("TLS: SIGTERM -> exit status 0"):
            expect_eq(server.terminate(timeout=10), 0, "exit status")
        server.kill()

    with c.check("TLS: after a restart on the same root, the multipart ETag is the same"):
        again = Server(binary, root, tls=tls)
        try:
            s3 = make_client(again.url, verify=tls[0])
            h = s3.head_object(Bucket=BUCKET, Key="tls/multipart.bin")
            expect_eq(h["ETag"], mp_etag, "ETag after the restart")
            expect_eq(h["ContentLength"], len(mp_data), "ContentLength")
        finally:
            again.terminate(timeout=10)
            again.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="path to shardfeed-mock-s3")
    args = ap.parse_args()

    # Keep the user's AWS settings out of the run (endpoint, proxies, profiles...).
    for var in list(os.environ):
        if var.startswith("AWS_"):
            del os.environ[var]
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"

    c = Checks()
    tmp = tempfile.mkdtemp(prefix="sf-conformance-boto3-")
    server = None
    try:
        root = os.path.join(tmp, "root")
        os.mkdir(root)
        with c.check("server starts and prints its port"):
            server = Server(args.server, root)
        if server is not None:
            held = run_checks(c, server, tmp)
            with c.check("SIGTERM -> exit status 0 within 10 s"):
                start = time.monotonic()
                rc = server.terminate(timeout=10)
                expect(rc is not None, "still running 10 s after SIGTERM")
                expect_eq(rc, 0, f"exit status (after {time.monotonic() - start:.2f} s)")
            for conn in held:
                conn.close()
            run_tls_checks(c, args.server, tmp)
    except Exception:  # noqa: BLE001 - an unexpected crash of the script itself
        c.failed += 1
        print("FAIL unexpected error in the test script:", flush=True)
        traceback.print_exc()
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{c.passed} passed, {c.failed} failed", flush=True)
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
