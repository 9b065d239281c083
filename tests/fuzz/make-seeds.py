#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<harness>/ (docs/testing.md).

    tests/fuzz/make-seeds.py [--photos DIR] [--shardfeed BUILD/shardfeed]

Real inputs, kept small (the whole corpus stays well under 2 MB): archives
made by GNU tar and by Python's tarfile, record shards made by
`shardfeed pack`, S3 XML answers as AWS sends them, AWS config files,
SigV4 requests, loader configurations, an index.json from pack, photos
(downscaled JPEGs: baseline, progressive, grayscale, restart markers),
brace patterns and URLs. Each file starts with the harness's own prefix
(flags, seeds) where it has one: see the comment at the top of each
tests/fuzz/fuzz_<harness>.c. Run again to regenerate; existing seeds are
overwritten, other files are left alone.
"""
import argparse
import glob
import io
import os
import struct
import subprocess
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = struct.pack(">Q", 0x5EED5EED12345678)


def put(harness, name, data):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def members():
    """A small WebDataset: 3 samples, a nested key, an image and a label each."""
    out = []
    for i in range(3):
        out.append((f"train/{i:06d}.cls", str(i).encode()))
        out.append((f"train/{i:06d}.txt", b"a photo of a thing\n" * (i + 1)))
    out.append(("train/000003.json", b'{"label": 7}'))
    out.append(("train/" + "long" * 40 + ".x.txt", b"a long name"))
    return out


def tars(tmp):
    files = members()
    src = os.path.join(tmp, "src")
    for name, data in files:
        p = os.path.join(src, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    out = {}
    for fmt in ("gnu", "posix", "ustar", "v7"):
        dst = os.path.join(tmp, f"gnu-{fmt}.tar")
        names = [n for n, _ in files if fmt not in ("ustar", "v7") or len(n) < 100]
        pax = ["--pax-option=delete=atime,delete=ctime,exthdr.name=%d/PaxHeaders/%f"] \
            if fmt == "posix" else []
        subprocess.run(["tar", "--format", fmt, "-b", "1", "--sort=name", "--owner=0",
                        "--group=0", "--mtime=2024-01-01", "-cf", dst, "-C", src] + pax + names,
                       check=True)
        out[f"gnu-tar-{fmt}"] = open(dst, "rb").read()
    for fmt, name in ((tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax"),
                      (tarfile.USTAR_FORMAT, "ustar")):
        b = io.BytesIO()
        kw = {"pax_headers": {"comment": "seed"}} if fmt == tarfile.PAX_FORMAT else {}
        with tarfile.open(fileobj=b, mode="w", format=fmt, **kw) as t:
            for n, data in files:
                if fmt == tarfile.USTAR_FORMAT and len(n) >= 100:
                    continue
                ti = tarfile.TarInfo(n)
                ti.size = len(data)
                ti.mtime = 1700000000
                t.addfile(ti, io.BytesIO(data))
        raw = b.getvalue()
        # tarfile pads to 10 KiB records: keep the end-of-archive blocks only.
        end = (len(raw.rstrip(b"\0")) + 511) // 512 * 512
        out[f"python-tarfile-{name}"] = raw[:end] + b"\0" * 1024
    return out


def records(tmp, shardfeed):
    src = os.path.join(tmp, "folder")
    for cls in ("ant", "bee"):
        os.makedirs(os.path.join(src, cls), exist_ok=True)
        for i in range(3):
            with open(os.path.join(src, cls, f"{cls}_{i}.txt"), "wb") as f:
                f.write(f"{cls} {i} ".encode() * (4 + i))
    out = {}
    for extra, name in (([], "plain"), (["--zstd=3"], "zstd")):
        dst = os.path.join(tmp, "rec-" + name)
        r = subprocess.run([shardfeed, "pack", src, dst, "--format", "record"] + extra,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"pack failed: {r.stderr}")
        for p in sorted(glob.glob(os.path.join(dst, "*.sfr"))):
            out[f"pack-{name}"] = open(p, "rb").read()
        idx = os.path.join(dst, "index.json")
        if os.path.exists(idx):
            out[f"index-{name}"] = open(idx, "rb").read()
    return out


XML = {
    "list-v2": """<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name><Prefix>train/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken><Contents><Key>train/train-000000.tar</Key><LastModified>2009-10-12T17:50:30.000Z</LastModified><ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag><Size>434234</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>train/train-000001.tar</Key><LastModified>2009-10-12T17:50:31Z</LastModified><ETag>"599bab3ed2c697f1d26842727561fd94-2"</ETag><Size>0</Size><StorageClass>STANDARD</StorageClass></Contents><CommonPrefixes><Prefix>train/sub/</Prefix></CommonPrefixes></ListBucketResult>""",
    "list-v2-url": """<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix></Prefix><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated><Contents><Key>odd/a%20b%2Bc%26d%25e.tar</Key><Size>12</Size><ETag>"x"</ETag></Contents><Contents><Key>odd/%E2%9C%93.tar</Key><Size>1</Size></Contents><CommonPrefixes><Prefix>odd/%3F/</Prefix></CommonPrefixes></ListBucketResult>""",
    "buckets": """<?xml version="1.0" encoding="UTF-8"?>
<ListAllMyBucketsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Owner><ID>bcaf1ffd86f461ca5fb16fd081034f</ID><DisplayName>webfile</DisplayName></Owner><Buckets><Bucket><Name>datasets</Name><CreationDate>2006-02-03T16:45:09.000Z</CreationDate></Bucket><Bucket><Name>my.bucket</Name><CreationDate>2006-02-03T16:41:58Z</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>""",
    "error-nosuchkey": """<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The resource you requested does not exist</Message><Key>train/x.tar</Key><BucketName>bucket</BucketName><RequestId>4442587FB7D0A2F9</RequestId><HostId>eftixk72aD6Ap51TnqcoF8eFidJG9Z/2mkiDFu8yU9AS1ed4OpIszj7UDNEHGran</HostId></Error>""",
    "error-signature": """<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match &amp; &lt;so&gt;</Message><StringToSign>AWS4-HMAC-SHA256
20150830T123600Z</StringToSign></Error>""",
    "entities": """<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><ListBucketResult><Contents><Key>&a;&#x41;&#65;</Key><Size>18446744073709551615</Size></Contents></ListBucketResult>""",
}

AWS = [
    ("default", "[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY\n",
     "[default]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:9000\ns3 =\n  addressing_style = path\n  endpoint_url = http://minio:9000\n"),
    ("dev", "# comment\n[dev]\naws_access_key_id=AK2\n; other\naws_secret_access_key=SK2\naws_session_token = tok\n\n[prod]\naws_access_key_id = AK3\n",
     "[profile dev]\nregion=us-west-2\nca_bundle = /etc/ssl/ca.pem\n[dev]\nregion = ignored\n[profile prod]\nregion = ap-south-1\n"),
    ("a b", "[a b]\naws_access_key_id = X\n", "[profile a b]\nregion =   us-east-2   \n"),
]

SIGV4 = [
    ["AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
     "GET", "/bucket/train-000000.tar", "", "20150830T123600Z",
     "host:bucket.s3.amazonaws.com", "x-amz-date:20150830T123600Z",
     "x-amz-content-sha256:UNSIGNED-PAYLOAD", "range:bytes=0-1023"],
    ["AWS4-HMAC-SHA256 Credential=AK/20240101/eu-west-1/s3/aws4_request,SignedHeaders=host;range;x-amz-date,Signature=" + "0" * 64,
     "GET", "/b/odd%20key+%2B/%E2%9C%93", "list-type=2&prefix=a%2Fb&continuation-token=x%3D%3D", "20240101T000000Z",
     "Host:127.0.0.1:9000", "Range: bytes=5-9 ", "My-Header:  a   b  c ", "my-header:second"],
    ["AWS4-HMAC-SHA256 Credential=AK/20240101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=zz",
     "PUT", "/", "a=1&a=&b", "19700101T000000Z", "host:x"],
]

OPTIONS = [
    '{"batch_size": 64, "decode_threads": 4, "shuffle_buffer": 1000, "seed": 7, "width": 224, "height": 224, "crop": "random_resized"}',
    '{"sources": ["s3://bucket/train-{000000..000009}.tar"], "cache_dir": "/tmp/c", "cache_limit": "8G", "concurrency": 16, "chunk_size": "8M", "prefetch_shards": 4, "ram_only": false}',
    '{"crop": "center", "layout": "hwc", "dtype": "float32", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "hflip": 0, "on_error": "skip", "rank": 1, "world_size": 4, "drop_last": true}',
    '{"batch_size": 1e300, "width": -1, "seed": 1.5, "unknown": null}',
]

INDEX = [
    '{"format": "tar", "version": 1, "shards": [{"name": "train-000000.tar", "bytes": 10240, "samples": 3, "xxh3_64": "0123456789abcdef"}, {"name": "train-000001.sfr", "samples": 18446744073709549568}, {"name": "/data/x.tar", "samples": 0}], "shard_count": 3}',
    '{"shards": [{"name": "train-000000.tar", "samples": 1e300}, {"name": "train-000001.sfr", "samples": 1e999}, {"name": "x.tar", "samples": 12.5}]}',
]

BRACES = ["s3://bucket/train-{000000..000099}.tar", "a{1..010}b{x,y,}c", "{10..1}{a,b}",
          "x{,-v2}.tar", "{x}{}", "plain/path.tar", "{1..3", "a}b", "{0..18446744073709551615}",
          "{a,{b,c}}", "{-5..5}"]

URLS = [
    (0, ["s3://bucket/train/000.tar", "", "us-east-1", "bucket", "train/000.tar", ""]),
    (1, ["https://example.com/a/b.tar?x=1", "http://127.0.0.1:9000/minio/", "eu-west-1",
         "my.bucket", "odd/a b+c&d%e?#;.tar", "list-type=2&prefix=a%2F"]),
    (2, ["file:///tmp/a%20b/c.tar", "https://s3.amazonaws.com", "", "UPPER", "\xe2\x9c\x93/..", ""]),
    (6, ["relative/path{0..1}.tar", "http://[::1]:9000", "us-gov-west-1", "", "", "a=b"]),
    (24, ["s3://", "https://user:pw@host:99999/x", "r", "b", "%zz%2", ""]),
]

# fuzz_state: configuration and flags, epoch, position, reads; then a mask
# XORed into the genuine state (offsets of docs/sampling.md's layout).
def state_mask(**at):
    m = bytearray(128)
    for off, val in at.values():
        m[off:off + len(val)] = val
    return bytes(m)


STATES = {
    "exact-pad-2-ranks": bytes([0, 3, 5, 0]),
    "exact-uneven-by-samples": bytes([1, 0, 7, 0]),
    "open-ended-length-known": bytes([2, 1, 4, 9]),
    "open-ended-length-unknown": bytes([2, 1, 4, 8]),
    "estimated-pad-2-ranks": bytes([3, 2, 3, 0]),
    "open-ended-position-2-40": bytes([2, 0, 0, 8]) + state_mask(p=(37, b"\x01")),
    "open-ended-length-2-40": bytes([2, 0, 1, 9]) + state_mask(l=(117, b"\x01")),
    "exact-other-world-size": bytes([0, 0, 2, 0]) + state_mask(w=(68, b"\x02")),
    "exact-epoch-size-off": bytes([0, 0, 2, 0]) + state_mask(s=(40, b"\x01")),
    "exact-version-3": bytes([0, 0, 2, 0]) + state_mask(v=(8, b"\x02")),
    "cut-short": bytes([0x40, 0, 2, 0]) + bytes(100),
    "bad-checksum": bytes([0x80, 0, 2, 0]) + state_mask(e=(24, b"\x01")),
}

CREDENTIALS = [
    '{"AccessKeyId":"ASIAEXAMPLE","SecretAccessKey":"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY","Token":"IQoJb3JpZ2luX2VjEXAMPLE","Expiration":"2026-11-21T12:00:00Z"}',
    '{"Code":"Success","LastUpdated":"2024-02-29T00:00:00Z","Type":"AWS-HMAC","AccessKeyId":"ASIA2","SecretAccessKey":"s","Token":"t","Expiration":"2024-02-29T23:59:59.123Z"}',
    '{"AccessKeyId":"A","SecretAccessKey":"s","Expiration":"2026-11-21T14:00:00+02:00"}',
    '{"Code":"AssumeRoleUnauthorizedAccess","Message":"not authorized"}',
    '{"AccessKeyId":"AKIA\\u0000junk","SecretAccessKey":"s","Token":"a\\\\u0000b"}',
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--photos", default=None,
                    help="folder of JPEG photos (default: the first two of data/ or the sample dataset)")
    ap.add_argument("--shardfeed", default=os.path.join(HERE, "..", "..", "build", "shardfeed"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, raw in tars(tmp).items():
            put("tar", name, bytes([1]) + SEED + raw)
            put("tar", name + "-late-size-small-steps", bytes([8]) + SEED + raw)
        for name, raw in records(tmp, a.shardfeed).items():
            if name.startswith("index-"):
                put("index", name + ".json", raw)
            else:
                put("record", name, bytes([1]) + SEED + raw)
                put("record", name + "-late-size-small-steps", bytes([8]) + SEED + raw)
    for name, text in XML.items():
        put("xml", name + ".xml", text)
    for i, (prof, cred, conf) in enumerate(AWS):
        names = ["default", "dev", "prod", "a b", "profile", "s3"]
        put("aws_config", f"profiles-{i}", bytes([names.index(prof)]) + cred.encode() + b"\0" + conf.encode())
    for i, parts in enumerate(SIGV4):
        put("sigv4", f"request-{i}", "\0".join(parts))
    for i, text in enumerate(OPTIONS):
        put("options", f"config-{i}.json", text)
    for i, text in enumerate(INDEX):
        put("index", f"crafted-{i}.json", text)
    for i, p in enumerate(BRACES):
        put("braces", f"pattern-{i}", p)
    for i, (flags, parts) in enumerate(URLS):
        put("url", f"url-{i}", bytes([flags]) + "\0".join(parts).encode("utf-8", "surrogateescape"))
    for name, raw in STATES.items():
        put("state", name, raw)
    for i, text in enumerate(CREDENTIALS):
        put("credentials", f"document-{i}.json", text)
    photos(a.photos)


def photos(folder):
    from PIL import Image
    srcs = []
    if folder:
        srcs = sorted(glob.glob(os.path.join(folder, "*.jpg")))[:2]
    if not srcs:
        raise SystemExit("make-seeds: --photos DIR with at least one JPEG photo is needed")
    # options prefix: width, height, mode, scale_min, center_fraction, max_scans, 2 spare; seed
    opts = [bytes([63, 47, 0, 8, 87, 63, 0, 0]), bytes([95, 95, 1 | 4 | 16, 50, 50, 10, 0, 0]),
            bytes([31, 15, 2 | 8, 99, 99, 63, 0, 0])]
    k = 0
    for si, src in enumerate(srcs):
        im = Image.open(src).convert("RGB")
        im.thumbnail((96, 96))
        variants = [("baseline", dict(quality=85)),
                    ("progressive", dict(quality=75, progressive=True)),
                    ("gray", None), ("restart", dict(quality=90, subsampling=0, restart_marker_rows=1))]
        for vname, kw in variants:
            b = io.BytesIO()
            if kw is None:
                im.convert("L").save(b, "JPEG", quality=80)
            else:
                im.save(b, "JPEG", **kw)
            put("jpeg", f"photo{si}-{vname}.jpg", opts[k % len(opts)] + SEED + b.getvalue())
            k += 1


if __name__ == "__main__":
    main()
