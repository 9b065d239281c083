#!/usr/bin/env python3
"""Fails when a folder includes a header above its layer (docs/DECISIONS.md,
"Code"). The layers, from the bottom:

    include/shardfeed/common.h   status, log, export (public)
    common/                      helpers that know no S3, cache or loader
    s3/                          URLs, SigV4, credentials, requests, fetch
    cache/                       RAM and disk tiers
    src/                         shards, sampler, decode, loader, pack, CLI
    mock_server/                 beside src/: common/ and s3/ only
    python/src/                  the extension: the public headers

and the public headers as a tree: every sub-header includes
shardfeed/common.h and the sub-headers below it, never shardfeed.h (which
includes them all).

    python3 scripts/check-layers.py [ROOT]
    python3 scripts/check-layers.py --self-test

Prints each upward include as FILE:LINE: ... and exits 1; exits 0 when
there is none. Only quoted includes count (system headers are <...>).
--self-test builds a small tree twice, once clean and once with an upward
include in s3/ and a sub-header that includes the umbrella, and fails
unless the check passes the first and names both faults of the second.
"""
import os
import re
import sys

PUBLIC_COMMON = ["shardfeed/common.h", "shardfeed/export.h"]

# Public headers: what each may include (besides itself).
PUBLIC = {
    "shardfeed/export.h": [],
    "shardfeed/common.h": ["shardfeed/export.h"],
    "shardfeed_s3.h": PUBLIC_COMMON,
    "shardfeed_shard.h": PUBLIC_COMMON,
    "shardfeed_sampling.h": PUBLIC_COMMON,
    "shardfeed_cache.h": PUBLIC_COMMON + ["shardfeed_s3.h"],
    "shardfeed_pack.h": PUBLIC_COMMON + ["shardfeed_s3.h", "shardfeed_shard.h"],
    "shardfeed_loader.h": PUBLIC_COMMON
    + ["shardfeed_s3.h", "shardfeed_cache.h", "shardfeed_sampling.h"],
    "shardfeed.h": None,  # the umbrella: any public header
}
ALL_PUBLIC = [h for h in PUBLIC if h != "shardfeed.h"]

# Folders: the prefixes and public headers their files may include.
FOLDERS = {
    "common": ["common/"] + PUBLIC_COMMON,
    "s3": ["common/", "s3/"] + PUBLIC_COMMON + ["shardfeed_s3.h"],
    "cache": ["common/", "cache/"] + PUBLIC_COMMON + ["shardfeed_s3.h", "shardfeed_cache.h"],
    "src": ["common/", "s3/", "cache/", "src/"] + list(PUBLIC),
    "mock_server": ["common/", "s3/", "mock_server/"] + PUBLIC_COMMON + ["shardfeed_s3.h"],
    "python/src": ["common/"] + list(PUBLIC),
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def allowed(name, rules, folder):
    for r in rules:
        if r.endswith("/") and name.startswith(r):
            return True
        if name == r:
            return True
    # a header next to the file, named without its folder ("cli.h", "sfpy.h");
    # public headers name each other exactly
    return (folder is not None and "/" not in name
            and os.path.exists(os.path.join(folder, name)))


def check(root):
    bad = []

    def scan(path, rules, folder):
        with open(path, encoding="utf-8", errors="replace") as f:
            for no, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if m and not allowed(m.group(1), rules, folder):
                    rel = os.path.relpath(path, root)
                    bad.append(f"{rel}:{no}: includes \"{m.group(1)}\", above its layer")

    inc = os.path.join(root, "include")
    for name, rules in PUBLIC.items():
        path = os.path.join(inc, name)
        if not os.path.exists(path):
            bad.append(f"include/{name}: missing (the public header tree)")
            continue
        scan(path, ALL_PUBLIC if rules is None else rules, None)
    for dirpath, _, files in os.walk(inc):
        for fn in files:
            rel = os.path.relpath(os.path.join(dirpath, fn), inc)
            if fn.endswith(".h") and rel not in PUBLIC:
                bad.append(f"include/{rel}: a public header this check does not know")
    for folder, rules in FOLDERS.items():
        d = os.path.join(root, folder)
        if not os.path.isdir(d):
            bad.append(f"{folder}/: missing")
            continue
        for fn in sorted(os.listdir(d)):
            if fn.endswith((".c", ".h", ".cu")):
                scan(os.path.join(d, fn), rules, d)
    return bad


def self_test():
    import tempfile

    def tree(root, upward):
        for name in PUBLIC:
            path = os.path.join(root, "include", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write('#include "shardfeed/export.h"\n' if name == "shardfeed/common.h" else "")
        with open(os.path.join(root, "include", "shardfeed_s3.h"), "a") as f:
            f.write('#include "shardfeed/common.h"\n')
            if upward:
                f.write('#include "shardfeed.h"\n')
        for folder in FOLDERS:
            os.makedirs(os.path.join(root, folder), exist_ok=True)
        with open(os.path.join(root, "cache", "c.h"), "w") as f:
            f.write('#include "common/x.h"\n#include <stdio.h>\n')
        with open(os.path.join(root, "s3", "f.c"), "w") as f:
            f.write('#include "s3/f.h"\n#include "shardfeed_s3.h"\n')
            if upward:
                f.write('#include "cache/c.h"\n')

    with tempfile.TemporaryDirectory() as clean, tempfile.TemporaryDirectory() as broken:
        tree(clean, False)
        tree(broken, True)
        ok, bad = check(clean), check(broken)
    want = ['s3/f.c:3: includes "cache/c.h"', 'include/shardfeed_s3.h:2: includes "shardfeed.h"']
    if ok or len(bad) != 2 or not all(any(b.startswith(w) for b in bad) for w in want):
        print("check-layers self-test failed: clean tree gave", ok, "broken tree gave", bad)
        return 1
    print("check-layers self-test: a clean tree passes, both upward includes are named")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = check(os.path.abspath(root))
    for b in bad:
        print(b)
    if bad:
        print(f"check-layers: {len(bad)} include(s) against the layers (docs/DECISIONS.md, Code)")
        return 1
    print("check-layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
