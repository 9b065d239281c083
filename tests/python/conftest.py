"""Fixtures of the shardfeed pytest suite.

The suite runs against a build tree: PYTHONPATH=<build>/python imports the
package, SF_BUILD_DIR names the build (default: <repo>/build), SF_MOCK_S3_BIN
and SF_CLI_BIN override the mock server and the CLI found there. ctest's
`python` test sets all four (tests/CMakeLists.txt).

- mock_s3: a fresh shardfeed-mock-s3 for each test, on a free port, serving
  an empty temporary folder, with the AWS environment pointed at it (its
  default keys, no profile, no instance metadata). .endpoint_url, .root,
  .bucket(name) -> "s3://name", .put(bucket, key, data), .admin(path, body),
  .faults(*specs), .fault(prefix, fault, count), .stats(), .stop().
- photos: an ImageFolder tree of small real JPEGs (8 classes x 12), made once.
  Each class has its own colour, so a decoded image tells its class.
- packed: `shardfeed pack` of photos into tar shards plus index.json, once.
- webdataset: the same samples as plain GNU tar shards (jpg + cls members),
  no index.json, once.
- dataset / webdataset_s3: copies of packed / webdataset in the mock's bucket.
"""
import ctypes
import faulthandler
import json
import os
import select
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from sfutil import CLASS_COLORS, CLASS_NAMES, PER_CLASS

REPO = Path(__file__).resolve().parents[2]

# Default credentials of shardfeed-mock-s3 (mock_server/main.c, docs/mock-server.md).
MOCK_ACCESS_KEY = "mock-access-key"
MOCK_SECRET_KEY = "mock-secret-key"

# Environment a test must not inherit: it would point the client elsewhere.
_AWS_VARS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_CA_BUNDLE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
    # torchrun's variables: the C library reads them when rank/world_size are not given.
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
)

# A test that hangs dumps every thread's stack and ends the run, rather
# than waiting for ctest's timeout.
HANG_S = float(os.environ.get("SF_TEST_HANG_S", "300"))


def build_dir():
    return Path(os.environ.get("SF_BUILD_DIR") or REPO / "build").resolve()


def tool(env, name):
    path = os.environ.get(env) or str(build_dir() / name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not an executable: build the project "
                    f"(cmake --build <build>) and set SF_BUILD_DIR or {env}")
    return path


def tool_env(extra=None):
    """Environment for a non-Python child (mock server, CLI, cjpeg, tar): the
    sanitizer run preloads ASan into Python, which these do not need."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if extra:
        env.update(extra)
    return env


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM when the test process dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_tool(args, **kw):
    """Runs a tool; fails the test with its output when it does not exit 0."""
    r = subprocess.run(args, capture_output=True, env=tool_env(), timeout=300, **kw)
    if r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))}: exit {r.returncode}\n"
                    f"{r.stdout.decode(errors='replace')}\n{r.stderr.decode(errors='replace')}")
    return r


@pytest.fixture(autouse=True)
def _hang_guard():
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# ------------------------------------------------------------------ mock S3

class MockS3:
    """One running shardfeed-mock-s3 serving `root` (each folder a bucket)."""

    def __init__(self, root, args=()):
        self.root = str(root)
        os.makedirs(self.root, exist_ok=True)
        cmd = [tool("SF_MOCK_S3_BIN", "shardfeed-mock-s3"), "--root", self.root, "--port", "0",
               "--quiet", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=tool_env(),
                                     # Under the ASan preload a preexec_fn child
                                     # can deadlock on the allocator's lock (a
                                     # thread allocating at fork): there, the
                                     # fixture's stop() alone ends the server.
                                     preexec_fn=None if os.environ.get("SF_TEST_SANITIZED")
                                     else _die_with_parent)
        line = self._first_line(10.0)
        if not line.startswith("listening on http://"):
            self.stop()
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            raise RuntimeError(f"shardfeed-mock-s3 did not start: {line!r} {err}")
        self.port = int(line.rsplit(":", 1)[1])
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.admin("/_mock/stats")  # it answers

    def _first_line(self, timeout):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            c = os.read(fd, 1)
            if not c:
                break
            buf += c
        return buf.decode(errors="replace").strip()

    def bucket(self, name):
        """Creates bucket `name` (a folder of the root) and returns "s3://name"."""
        os.makedirs(os.path.join(self.root, name), exist_ok=True)
        return "s3://" + name

    def put(self, bucket, key, data):
        """Writes an object straight into the served folder."""
        path = os.path.join(self.root, bucket, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return "s3://%s/%s" % (bucket, key)

    def admin(self, path, body=None, method=None):
        """Calls one of the unsigned /_mock/ endpoints (POST when body is given)
        and returns the answer's bytes; a status other than 200 raises."""
        if isinstance(body, str):
            body = body.encode()
        req = urllib.request.Request(self.endpoint_url + path, data=body,
                                     method=method or ("POST" if body is not None else "GET"))
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise RuntimeError(f"{path}: HTTP {r.status}")
            return r.read()

    def faults(self, *specs):
        """Replaces every fault rule: faults("prefix=b/,p503=0.2") (none: clears)."""
        self.admin("/_mock/faults", "".join(s + "\n" for s in specs))

    def fault(self, prefix, fault, count=1):
        """Queues `fault` (500, 503, reset=N, stall=MS, ...) for the next
        `count` object requests under prefix ("bucket/key...")."""
        q = urllib.parse.urlencode({"prefix": prefix, "fault": fault, "count": count})
        self.admin("/_mock/fault?" + q, b"")

    def stats(self):
        return json.loads(self.admin("/_mock/stats"))

    def reset(self):
        self.admin("/_mock/reset", b"")

    def stop(self):
        p = self.proc
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in (p.stdout, p.stderr):
            if f:
                f.close()
        return p.returncode


def isolate_aws_env(monkeypatch, tmp):
    for v in _AWS_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MOCK_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MOCK_SECRET_KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.path.join(tmp, "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.path.join(tmp, "no-aws-credentials"))
    # The default cache directory ($XDG_CACHE_HOME/shardfeed) stays in the test's folder.
    monkeypatch.setenv("XDG_CACHE_HOME", os.path.join(tmp, "xdg-cache"))


@pytest.fixture
def mock_s3(tmp_path_factory, monkeypatch):
    """A fresh mock server per test (no objects, faults or counters left over
    from another test), with the AWS environment set for it."""
    tmp = str(tmp_path_factory.mktemp("mock"))
    isolate_aws_env(monkeypatch, tmp)
    m = MockS3(os.path.join(tmp, "root"))
    try:
        yield m
    finally:
        m.stop()


# ------------------------------------------------------------------ photos

class Photos:
    def __init__(self, root):
        self.root = str(root)
        self.classes = list(CLASS_NAMES)  # already sorted: labels are their indices
        self.label_of = {}  # sample key ("amber/amber_003") -> label
        self.files = {}  # key -> path of the .jpg
        self.total_bytes = 0

    @property
    def keys(self):
        return sorted(self.label_of)

    @property
    def n(self):
        return len(self.label_of)


def _ppm(w, h, color, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    noise = rng.integers(-6, 7, size=(h, w, 1))
    # A gentle gradient and noise: images differ, the mean stays the class colour.
    ramp = (np.arange(w)[None, :, None] * 12 // max(w - 1, 1)) - 6
    px = np.clip(np.asarray(color)[None, None, :] + noise + ramp, 0, 255).astype(np.uint8)
    return b"P6\n%d %d\n255\n" % (w, h) + px.tobytes()


def make_photos(root, per_class=PER_CLASS):
    cjpeg = shutil.which("cjpeg")
    if not cjpeg:
        pytest.fail("cjpeg (libjpeg-turbo-progs) is needed to make the test photos: "
                    "scripts/install-deps.sh installs it")
    photos = Photos(root)
    env = tool_env()
    for c, (name, color) in enumerate(zip(CLASS_NAMES, CLASS_COLORS)):
        d = os.path.join(root, name)
        os.makedirs(d)
        for i in range(per_class):
            j = c * per_class + i
            w, h = 64 + (j * 37) % 257, 64 + (j * 53) % 177  # 64..320 x 64..240
            jpeg = subprocess.run([cjpeg, "-quality", "90"], input=_ppm(w, h, color, j),
                                  capture_output=True, env=env, check=True).stdout
            key = f"{name}/{name}_{i:03d}"
            path = os.path.join(root, key + ".jpg")
            with open(path, "wb") as f:
                f.write(jpeg)
            photos.label_of[key] = c
            photos.files[key] = path
            photos.total_bytes += len(jpeg)
    return photos


@pytest.fixture(scope="session")
def photos(tmp_path_factory):
    return make_photos(str(tmp_path_factory.mktemp("photos") / "src"))


# ------------------------------------------------------------------ shards

class Shards:
    """A folder of shards made from photos."""

    def __init__(self, folder, photos, names, indexed):
        self.folder = str(folder)
        self.photos = photos
        self.names = names  # shard file names, in order
        self.indexed = indexed


def pack(src, dest, shard_size="40K", extra=()):
    """`shardfeed pack` (the CLI); returns its --json result."""
    r = run_tool([tool("SF_CLI_BIN", "shardfeed"), "pack", str(src), str(dest),
                  "--shard-size", shard_size, "--no-progress", "--json", *extra])
    return json.loads(r.stdout)


@pytest.fixture(scope="session")
def packed(photos, tmp_path_factory):
    """Tar shards of about 40 KiB (a dozen or more) and index.json."""
    dest = tmp_path_factory.mktemp("packed")
    res = pack(photos.root, dest, "40K", ["--layout", "imagefolder"])
    assert res["samples"] == photos.n and res["classes"] == len(CLASS_NAMES)
    names = sorted(p.name for p in dest.iterdir() if p.name.endswith(".tar"))
    assert len(names) == res["shards"] >= 8, res
    return Shards(dest, photos, names, True)


@pytest.fixture(scope="session")
def webdataset(photos, tmp_path_factory):
    """Plain WebDataset shards written by GNU tar: <key>.jpg and <key>.cls
    members, samples dealt round-robin over 6 shards, no index.json."""
    stage = tmp_path_factory.mktemp("wds-stage")
    dest = tmp_path_factory.mktemp("wds")
    n_shards = 6
    lists = [[] for _ in range(n_shards)]
    for i, key in enumerate(photos.keys):
        os.makedirs(stage / os.path.dirname(key), exist_ok=True)
        shutil.copyfile(photos.files[key], stage / (key + ".jpg"))
        (stage / (key + ".cls")).write_text(str(photos.label_of[key]))
        lists[i % n_shards] += [key + ".jpg", key + ".cls"]
    names = []
    for s, members in enumerate(lists):
        name = f"wds-{s:04d}.tar"
        listing = stage / f"list-{s}.txt"
        listing.write_text("".join(m + "\n" for m in members))
        run_tool(["tar", "--format=gnu", "-cf", str(dest / name), "-C", str(stage),
                  "--no-recursion", "-T", str(listing)])
        names.append(name)
    return Shards(dest, photos, names, False)


class Dataset:
    """Shards in the mock's bucket."""

    def __init__(self, mock, shards, bucket, prefix):
        self.mock = mock
        self.shards = shards
        self.photos = shards.photos
        self.bucket = bucket
        self.prefix = prefix  # "train/"
        self.url = "s3://%s/%s" % (bucket, prefix)  # the prefix source
        self.folder = os.path.join(mock.root, bucket, prefix)
        self.endpoint_url = mock.endpoint_url
        self.shard_urls = [self.url + n for n in shards.names]

    @property
    def n(self):
        return self.photos.n

    @property
    def keys(self):
        return self.photos.keys

    @property
    def label_of(self):
        return self.photos.label_of

    def shard_path(self, name):
        return os.path.join(self.folder, name)


def put_shards(mock, shards, bucket="data", prefix="train/"):
    mock.bucket(bucket)
    folder = os.path.join(mock.root, bucket, prefix)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(shards.folder):
        shutil.copyfile(os.path.join(shards.folder, name), os.path.join(folder, name))
    return Dataset(mock, shards, bucket, prefix)


@pytest.fixture
def dataset(mock_s3, packed):
    """The packed shards (with index.json) at s3://data/train/."""
    return put_shards(mock_s3, packed)


@pytest.fixture
def webdataset_s3(mock_s3, webdataset):
    """The plain tar shards (no index.json) at s3://data/wds/."""
    return put_shards(mock_s3, webdataset, prefix="wds/")
