#!/usr/bin/env bash
# Static checks of the CUDA code, for a machine with nvcc and no GPU
# (ctest `cuda_static`; docs/gpu.md). Every check reads what the build in
# BUILD_DIR really compiles (its compile_commands.json and objects):
#   1. no fast-math flag in any C or CUDA compile line;
#   2. every .cu recompiled with the build's own command plus nvcc's
#      `-Werror all-warnings`, host `-Wall -Wextra -Werror`, and ptxas
#      warnings as errors for spills and local memory; the resource report
#      must show 0 bytes of stack frame, spill stores and spill loads;
#   3. the library's kernels in PTX: IEEE division (div.rn.f32), no
#      approximate division, no flush-to-zero (the bits must equal the C
#      path's, docs/gpu.md);
#   4. the library's objects carry SASS for every architecture the build
#      names, and PTX (for later GPUs);
#   5. the CUDA runtime symbols the library's objects call are an allow-list
#      (no synchronous copies or device-wide syncs), and every kernel launch
#      in src/ names a stream.
#   scripts/check-cuda.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check-cuda.sh BUILD_DIR}
build=$(cd "$build" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
commands="$build/compile_commands.json"
[ -f "$commands" ] || { echo "check-cuda: FAIL: $commands missing (configure with CMake)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SF_CHECK_ROOT="$root" SF_CHECK_TMP="$tmp" SF_CHECK_COMMANDS="$commands"
exec python3 - <<'PY'
import json, os, re, shlex, struct, subprocess, sys

root = os.environ["SF_CHECK_ROOT"]
tmp = os.environ["SF_CHECK_TMP"]
entries = json.load(open(os.environ["SF_CHECK_COMMANDS"]))
failures = []


def fail(msg):
    failures.append(msg)
    print("check-cuda: FAIL: " + msg)


def ok(msg):
    print("check-cuda: ok   " + msg)


def argv_of(e):
    return e["arguments"] if "arguments" in e else shlex.split(e["command"])


def rel(path):
    return os.path.relpath(path, root)


# -- 1. fast-math flags -------------------------------------------------------
FAST = {"-Ofast", "-ffast-math", "-funsafe-math-optimizations", "-ffinite-math-only",
        "-fassociative-math", "-freciprocal-math", "-use_fast_math", "--use_fast_math"}
# nvcc's value options, as `-opt value`, `-opt=value` or `--opt=value`: the
# value each must keep.
KEEP = {"ftz": "false", "prec-div": "true", "prec-sqrt": "true"}
cu = [e for e in entries if e["file"].endswith(".cu")]
if not cu:
    fail("no .cu file in compile_commands.json: is this a build with CUDA?")
bad = 0
for e in entries:
    argv = argv_of(e)
    for i, a in enumerate(argv):
        host = a.split("=", 1)[1].split(",") if a.startswith("-Xcompiler=") else []
        for p in [a] + host:
            if p in FAST:
                fail(f"{rel(e['file'])}: fast-math flag {p} in its compile line")
                bad += 1
        name, _, value = a.lstrip("-").partition("=")
        if a.startswith("-") and name in KEEP:
            if not value and i + 1 < len(argv):
                value = argv[i + 1]
            if value != KEEP[name]:
                fail(f"{rel(e['file'])}: {a} {'' if '=' in a else value} in its compile line "
                     f"(must stay {name}={KEEP[name]})")
                bad += 1
if bad == 0:
    ok(f"no fast-math flag in {len(entries)} compile lines")


def without_output(argv, drop=lambda a: False):
    """argv less its `-o FILE` and every argument drop() is true for."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif not drop(a):
            kept.append(a)
    return kept


# -- 2. warnings as errors, resource usage ------------------------------------
RES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
for e in cu:
    argv = argv_of(e)
    out = os.path.join(tmp, os.path.basename(e["file"]) + ".o")
    strict = without_output(argv) + ["-o", out, "-Werror", "all-warnings", "-Xcompiler=-Wall,-Wextra,-Werror",
               "--resource-usage", "-Xptxas", "-warn-spills,-warn-lmem-usage,-Werror"]
    r = subprocess.run(strict, cwd=e["directory"], capture_output=True, text=True)
    text = r.stdout + r.stderr
    if r.returncode != 0:
        fail(f"{rel(e['file'])}: does not compile with warnings as errors:\n{text}")
        continue
    kernels = len(re.findall(r"Compiling entry function", text))
    usage = RES.findall(text)
    nonzero = [u for u in usage if u != ("0", "0", "0")]
    if nonzero:
        fail(f"{rel(e['file'])}: stack frame / spills (bytes) {nonzero}:\n{text}")
    elif kernels and len(usage) < kernels:
        fail(f"{rel(e['file'])}: {kernels} kernels compiled, {len(usage)} resource reports:\n{text}")
    else:
        ok(f"{rel(e['file'])}: no warning; {kernels} kernel compilations, "
           "0 bytes stack, spills or local memory")

lib = [e for e in cu if rel(e["file"]).startswith("src/")]
if not lib:
    fail("no src/*.cu among the CUDA compile lines")


def build_object(e):
    argv = argv_of(e)
    o = argv[argv.index("-o") + 1]
    return os.path.join(e["directory"], o)


# -- 3. IEEE division in the kernels' PTX --------------------------------------
for e in lib:
    argv = argv_of(e)
    if "__global__" not in open(e["file"]).read():
        continue
    ptx = os.path.join(tmp, os.path.basename(e["file"]) + ".ptx")
    cmd = without_output(argv, lambda a: a == "-c" or a.startswith(("--generate-code", "-gencode")))
    vs = sorted(set(re.findall(r"compute_(\d+)", " ".join(argv))), key=int)
    cmd += ["-ptx", f"--gpu-architecture=compute_{vs[0] if vs else '80'}", "-o", ptx]
    r = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{rel(e['file'])}: PTX generation failed:\n{r.stdout}{r.stderr}")
        continue
    text = open(ptx).read()
    divs = re.findall(r"\bdiv(?:\.[a-z0-9]+)*\.f32\b", text)
    approx = [d for d in divs if ".approx" in d or ".full" in d]
    ftz = re.findall(r"\b[a-z]+(?:\.[a-z0-9]+)*\.ftz(?:\.[a-z0-9]+)*\b", text)
    if not divs:
        fail(f"{rel(e['file'])}: no f32 division in the PTX (is the kernel still there?)")
    elif approx or ftz:
        fail(f"{rel(e['file'])}: approximate or flush-to-zero arithmetic in the PTX: "
             f"{sorted(set(approx + ftz))}")
    else:
        ok(f"{rel(e['file'])}: {len(divs)} f32 divisions in the PTX, all {sorted(set(divs))}, "
           "no flush-to-zero")

# -- 4. SASS for every architecture, and PTX -----------------------------------
for e in lib:
    argv = argv_of(e)
    obj = build_object(e)
    if not os.path.exists(obj):
        fail(f"{rel(e['file'])}: object {obj} missing: build first")
        continue
    if "__global__" not in open(e["file"]).read():
        continue
    want = sorted({int(x) for x in re.findall(r"sm_(\d+)", " ".join(argv))})
    fb = os.path.join(tmp, "fatbin")
    r = subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", obj, fb],
                       capture_output=True, text=True)
    data = open(fb, "rb").read() if r.returncode == 0 and os.path.exists(fb) else b""
    # Fat binary: a 16-byte header (magic 0xBA55ED50, version, header size,
    # size), then entries: kind (1 PTX, 2 ELF/SASS), header size, size, and
    # the architecture at byte 28 of the entry's header.
    sass, ptx = set(), set()
    off = 0
    while off + 16 <= len(data):
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", data, off)
        if magic != 0xBA55ED50:
            break
        p, end = off + hsize, off + hsize + fsize
        while p + 32 <= end:
            kind, _, ehs, size = struct.unpack_from("<HHIQ", data, p)
            arch = struct.unpack_from("<I", data, p + 28)[0]
            (ptx if kind == 1 else sass if kind == 2 else set()).add(arch)
            p += ehs + size
        off = end
    if not data or not sass:
        fail(f"{rel(e['file'])}: no device code found in {obj}")
    elif set(want) - sass or not ptx or max(ptx) < max(want):
        fail(f"{rel(e['file'])}: SASS for {sorted(sass)}, PTX for {sorted(ptx)}; the build names "
             f"{want} (SASS for each, PTX for the newest)")
    else:
        ok(f"{rel(e['file'])}: SASS for sm_{', sm_'.join(map(str, sorted(sass)))}; "
           f"PTX for compute_{', compute_'.join(map(str, sorted(ptx)))}")

# -- 5. runtime symbols, streams -----------------------------------------------
ALLOWED = {
    # each op of the table (gpu_dev.h), gpu_info.cu, and errors
    "cudaGetDeviceCount", "cudaSetDevice", "cudaDeviceGetAttribute", "cudaHostAlloc",
    "cudaFreeHost", "cudaMalloc", "cudaFree", "cudaStreamCreateWithFlags", "cudaStreamDestroy",
    "cudaStreamSynchronize", "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaEventRecord",
    "cudaEventQuery", "cudaEventSynchronize", "cudaEventElapsedTime", "cudaStreamWaitEvent",
    "cudaMemcpyAsync", "cudaGetLastError", "cudaGetErrorString", "cudaGetErrorName",
    # what nvcc emits for a <<<>>> launch and the module's registration
    "__cudaGetKernel", "__cudaLaunchKernel", "cudaLaunchKernel", "__cudaPopCallConfiguration",
    "__cudaPushCallConfiguration", "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd",
    "__cudaRegisterFunction", "__cudaUnregisterFatBinary", "__cudaRegisterVar",
}
for e in lib:
    obj = build_object(e)
    if not os.path.exists(obj):
        continue
    r = subprocess.run(["nm", "-u", obj], capture_output=True, text=True)
    syms = {l.split()[-1] for l in r.stdout.splitlines() if l.strip()}
    cuda = sorted(s for s in syms if "cuda" in s.lower())
    extra = [s for s in cuda if s not in ALLOWED]
    if r.returncode != 0:
        fail(f"{rel(e['file'])}: nm failed: {r.stderr}")
    elif extra:
        fail(f"{rel(e['file'])}: CUDA runtime calls outside the allow-list: {extra}")
    else:
        ok(f"{rel(e['file'])}: {len(cuda)} CUDA runtime symbols, all allowed")
    src = open(e["file"]).read()
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    for m in re.finditer(r"<<<(.*?)>>>", src, flags=re.S):
        args, depth, cur = [], 0, ""
        for ch in m.group(1):
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            if ch == "," and depth == 0:
                args.append(cur.strip())
                cur = ""
            else:
                cur += ch
        args.append(cur.strip())
        if len(args) < 4 or args[3] in ("0", "NULL", "nullptr", "cudaStreamLegacy"):
            line = src[:m.start()].count("\n") + 1
            fail(f"{rel(e['file'])}:{line}: kernel launch <<<{m.group(1)}>>> on the default stream")
        else:
            ok(f"{rel(e['file'])}: launch <<<...>>> on stream {args[3]}")

if failures:
    print(f"check-cuda: {len(failures)} failure(s)")
    sys.exit(1)
print("check-cuda: all checks passed")
PY
