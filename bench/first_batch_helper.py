#!/usr/bin/env python3
"""Helper of bench/first_batch_vs_webdataset.sh (one subcommand per step).

    shards PHOTOS OUT --counts FILE [--shards 12] [--seed 1] [--pattern P]
        WebDataset shards of an ImageFolder tree written by the system
        `tar --format=gnu`: sample key = the JPEG's base name without
        extension, members KEY.jpg and KEY.cls (the label: the class's index
        in sorted order, decimal, no newline). Samples are shuffled with the
        seed and cut into N shards of (nearly) equal counts. No index.json.
        FILE gets the counts (JSON) the other subcommands check against.
    index DIR --counts FILE
        DIR/index.json in `shardfeed pack`'s format (docs/pack.md), written
        when this build's shardfeed has no `index` command. XXH3-64 checksums
        only when Python's xxhash module is there (the loader reads names
        and sample counts only).
    check-index DIR --counts FILE
        exits 1 unless DIR/index.json lists every shard with its count.
    torch-first URL... [--batch-size 64] [--workers 2] [--seed 1]
                [--shuffle 1000] [--expect N]
        PyTorch DataLoader + WebDataset (bench/torch_loader.py's pipeline)
        over URLs such as "pipe:curl -s -f http://...": seconds from just
        before iter(loader) to the first batch. With --expect N the epoch is
        run to its end and must deliver N samples. One JSON line on stdout.
    record OUTPUT --run NAME --round R --expect N --batch-size B --results FILE
        checks one tool's JSON output (every image once in the epoch, no
        skips or pads; torch: a full first batch) and appends it to FILE;
        exits 1 when it is wrong.
    summary FILE [--title TEXT]
        the table of medians and the ratios.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

from run_results import RunResults, last_json_line


def die(msg, code=1):
    print("first_batch_helper: " + msg, file=sys.stderr)
    sys.exit(code)


# ------------------------------------------------------------------ shards

def cmd_shards(a):
    classes = sorted(d for d in os.listdir(a.photos)
                     if os.path.isdir(os.path.join(a.photos, d)) and not d.startswith("."))
    if not classes:
        die("%s has no class folders (an ImageFolder tree is expected)" % a.photos, 2)
    samples = []
    keys = set()
    for label, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(a.photos, c))):
            base, ext = os.path.splitext(f)
            if ext.lower() not in (".jpg", ".jpeg") or f.startswith("."):
                continue
            if "." in base or base in keys:
                die("%s/%s: key '%s' is not unique or holds a '.'" % (c, f, base), 2)
            keys.add(base)
            samples.append((base, os.path.join(a.photos, c, f), label))
    if len(samples) < a.shards:
        die("%d images for %d shards" % (len(samples), a.shards), 2)
    random.Random(a.seed).shuffle(samples)

    os.makedirs(a.out, exist_ok=True)
    stage = os.path.join(a.out, ".stage")
    shutil.rmtree(stage, ignore_errors=True)
    shards = []
    for i in range(a.shards):
        part = samples[i * len(samples) // a.shards:(i + 1) * len(samples) // a.shards]
        sdir = os.path.join(stage, "%d" % i)
        os.makedirs(sdir)
        members = []
        for key, path, label in part:
            dst = os.path.join(sdir, key + ".jpg")
            try:
                os.link(path, dst)
            except OSError:  # another file system
                shutil.copyfile(path, dst)
            with open(os.path.join(sdir, key + ".cls"), "w") as f:
                f.write(str(label))
            members += [key + ".jpg", key + ".cls"]
        lst = os.path.join(stage, "%d.list" % i)
        with open(lst, "w") as f:
            f.write("\n".join(members) + "\n")
        name = a.pattern % i
        out = os.path.join(a.out, name)
        # Fixed owner and time: the same photos give the same shard bytes.
        r = subprocess.run(["tar", "--format=gnu", "--owner=0", "--group=0", "--numeric-owner",
                            "--mtime=@0", "--no-recursion", "-cf", out, "-C", sdir,
                            "-T", lst])
        if r.returncode != 0:
            die("tar failed for %s" % out)
        shards.append({"name": name, "bytes": os.path.getsize(out), "samples": len(part),
                       "jpg_bytes": sum(os.path.getsize(p) for _, p, _ in part),
                       "cls_bytes": sum(len(str(label)) for _, _, label in part)})
        shutil.rmtree(sdir)
    shutil.rmtree(stage)
    counts = {"classes": classes, "sample_count": len(samples), "shards": shards}
    with open(a.counts, "w") as f:
        json.dump(counts, f, indent=1)
        f.write("\n")


def load_counts(path):
    with open(path) as f:
        return json.load(f)


def cmd_index(a):
    c = load_counts(a.counts)
    try:
        import xxhash
    except ImportError:
        xxhash = None
    shards = []
    for s in c["shards"]:
        e = {"name": s["name"], "bytes": s["bytes"], "samples": s["samples"]}
        if xxhash:
            h = xxhash.xxh3_64()
            with open(os.path.join(a.dir, s["name"]), "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            e["xxh3_64"] = h.hexdigest()
        shards.append(e)
    n = c["sample_count"]
    idx = {"format": "tar", "version": 1, "layout": "flat", "compression": "none"}
    if xxhash:
        idx["checksum"] = "xxh3_64"
    idx.update({
        "shard_size_limit": max(s["bytes"] for s in c["shards"]),
        "shards": shards,
        "shard_count": len(shards),
        "sample_count": n,
        "file_count": 2 * n,  # flat layout: KEY.cls is a file as much as KEY.jpg
        "bytes": sum(s["bytes"] for s in c["shards"]),
        "source_bytes": sum(s["jpg_bytes"] + s["cls_bytes"] for s in c["shards"]),
        "fields": {"cls": n, "jpg": n},
    })
    tmp = os.path.join(a.dir, ".index.json.tmp")
    with open(tmp, "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")
    os.rename(tmp, os.path.join(a.dir, "index.json"))


def cmd_check_index(a):
    c = load_counts(a.counts)
    path = os.path.join(a.dir, "index.json")
    try:
        with open(path) as f:
            idx = json.load(f)
        listed = {os.path.basename(s["name"]): s["samples"] for s in idx["shards"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        die("%s: %s" % (path, e))
    for s in c["shards"]:
        if listed.get(s["name"]) != s["samples"]:
            die("%s: %s has %s samples, not %d" % (path, s["name"], listed.get(s["name"]),
                                                   s["samples"]))


# ------------------------------------------------------------------ torch

def cmd_torch_first(a):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_loader import make_loader

    loader = make_loader(a.urls, a.batch_size, a.workers, a.shuffle, a.seed, False)
    t0 = time.perf_counter()
    it = iter(loader)  # starts the workers
    x, y = next(it)
    first_batch_s = time.perf_counter() - t0
    out = {"ok": True, "first_batch_s": round(first_batch_s, 4),
           "first_batch_images": len(y), "image_shape": list(x.shape[1:]),
           "workers": a.workers, "batch_size": a.batch_size, "shards": len(a.urls)}
    if a.expect:
        n = len(y)
        for x, y in it:
            n += len(y)
        seconds = time.perf_counter() - t0
        out.update({"images": n, "seconds": round(seconds, 4),
                    "images_per_s": round(n / seconds, 1)})
    t1 = time.perf_counter()
    if hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None
    del it
    out["shutdown_s"] = round(time.perf_counter() - t1, 4)
    print(json.dumps(out), flush=True)


# ------------------------------------------------------------------ results

def cmd_record(a):
    d = last_json_line(a.output)
    if d is None:
        die("%s (round %d): no JSON line in %s" % (a.run, a.round, a.output))
    if a.run.startswith("torch"):
        want = min(a.batch_size, a.expect)
        if d.get("first_batch_images") != want:
            die("%s (round %d): first batch of %s images, not %d"
                % (a.run, a.round, d.get("first_batch_images"), want))
        if "images" in d and d["images"] != a.expect:
            die("%s (round %d): the epoch delivered %d images, not %d"
                % (a.run, a.round, d["images"], a.expect))
    else:
        if not d.get("ok"):
            die("%s (round %d): %s" % (a.run, a.round, d.get("error")))
        dropped = d.get("dropped", 0)  # loaders that stream on estimated counts
        if d["images"] != a.expect or d["skipped"] or d["pads"] or dropped:
            die("%s (round %d): %d images (%d skipped, %d pads, %d dropped), not every one of "
                "%d once" % (a.run, a.round, d["images"], d["skipped"], d["pads"], dropped,
                             a.expect))
        want_batches = (a.expect + a.batch_size - 1) // a.batch_size
        if d["batches"] != want_batches:
            die("%s (round %d): %d batches, not %d"
                % (a.run, a.round, d["batches"], want_batches))
    if a.time:  # GNU time -f "%e %U %S": the whole process, threads and children
        try:
            with open(a.time) as f:
                wall, user, sys_ = (float(v) for v in f.read().split()[-3:])
            d["wall_s"], d["cpu_s"] = wall, round(user + sys_, 3)
        except (OSError, ValueError):
            pass
    d["run"], d["round"] = a.run, a.round
    with open(a.results, "a") as f:
        f.write(json.dumps(d) + "\n")
    if "images_per_s" in d:
        msg = "%.1f images/s, first batch %.3f s" % (d["images_per_s"], d["first_batch_s"])
    else:
        msg = "first batch %.3f s" % d["first_batch_s"]
    if "cache_hits" in d:
        msg += ", cache hits %d misses %d, %.0f MiB fetched" % (
            d["cache_hits"], d["cache_misses"], d["bytes_fetched"] / 1048576)
    when = "round %d" % (a.round + 1) if a.round >= 0 else "warm-up"
    print("  %-8s %-16s %s" % (when, a.run, msg), file=sys.stderr)


ROWS = [  # run, label
    ("sf-cold-plain", "shardfeed, cold disk cache, no index.json"),
    ("sf-cold-index", "shardfeed, cold disk cache, index.json"),
    ("sf-warm-index", "shardfeed, warm disk cache, index.json"),
    ("sf-ram-plain", "shardfeed --ram-only, no index.json"),
    ("sf-ram-index", "shardfeed --ram-only, index.json"),
    ("torch-first", "DataLoader + WebDataset, nginx (curl)"),
    ("torch-epoch", "  the same, one full epoch (unmeasured warm-up)"),
]


def cmd_summary(a):
    results = RunResults(a.results)
    runs, med, span, paired = results.runs, results.median, results.span, results.paired

    if a.title:
        print(a.title)
    for d in runs.get("sf-cold-plain", []) + runs.get("sf-cold-index", []) + \
            runs.get("sf-warm-index", []) + runs.get("sf-ram-plain", []) + \
            runs.get("sf-ram-index", []):
        if d.get("cpu_s") is not None and d.get("images"):
            d["cpu_ms_per_image"] = d["cpu_s"] * 1000 / d["images"]
    print("%-48s %2s %13s %12s %9s %10s %9s" % ("run", "n", "first batch s", "(min-max)",
                                               "images/s", "(min-max)", "CPU ms/img"))
    for run, label in ROWS:
        if run not in runs:
            continue
        fb, ips = med(run, "first_batch_s"), med(run, "images_per_s")
        cpu = med(run, "cpu_ms_per_image")
        print("%-48s %2d %13s %12s %9s %10s %9s" % (
            label, len(runs[run]), "%.3f" % fb if fb is not None else "-",
            span(run, "first_batch_s", "%.3f"),
            "%.0f" % ips if ips is not None else "-", span(run, "images_per_s", "%.0f"),
            "%.2f" % cpu if cpu is not None else "-"))
    warm = runs.get("sf-warm-index", [])
    if any(d.get("cache_misses") for d in warm):
        print("warning: a warm run missed the cache (cache_misses > 0): the warm figure is not "
              "warm")

    def ratio(label, num, den, key, target, cmp):
        n, d = med(num, key), med(den, key)
        if n is None or d is None or d == 0:
            return
        r = n / d
        met = r <= target if cmp == "<=" else r >= target
        p = paired(num, den, key)
        print("%-56s %5.2f  (target %s %.2f: %-7s) %s" % (
            label, r, cmp, target, "met" if met else "NOT met",
            "per round %.2f, %.2f-%.2f" % p if p else ""))

    print("ratios of the medians (and the median and range of the rounds' own ratios):")
    ratio("a) first batch, shardfeed (cold, no index) / torch", "sf-cold-plain", "torch-first",
          "first_batch_s", 0.35, "<=")
    ratio("b) images/s, cold / warm disk cache (index.json)", "sf-cold-index", "sf-warm-index",
          "images_per_s", 0.95, ">=")
    ratio("c) images/s, cold: no index.json / index.json", "sf-cold-plain", "sf-cold-index",
          "images_per_s", 0.95, ">=")
    print("for reference:")
    for label, num, den in (
            ("   b) by CPU time: warm / cold, CPU ms per image", "sf-cold-index", "sf-warm-index"),
            ("   c) by CPU time: index.json / none, CPU ms per image", "sf-cold-plain",
             "sf-cold-index")):
        n, d = med(num, "cpu_ms_per_image"), med(den, "cpu_ms_per_image")
        if n and d:  # images/s if the cores were the limit: inverse CPU per image
            print("%-56s %5.2f" % (label, d / n))
    for label, num, den, key in (
            ("   first batch, shardfeed (cold, index.json) / torch", "sf-cold-index",
             "torch-first", "first_batch_s"),
            ("   images/s, --ram-only / warm disk cache (index.json)", "sf-ram-index",
             "sf-warm-index", "images_per_s"),
            ("   images/s, --ram-only: no index.json / index.json", "sf-ram-plain",
             "sf-ram-index", "images_per_s"),
            ("   images/s, sf cold (no index) / torch epoch (1 run)", "sf-cold-plain",
             "torch-epoch", "images_per_s")):
        n, d = med(num, key), med(den, key)
        if n is not None and d:
            p = paired(num, den, key)
            print("%-56s %5.2f  %s" % (label, n / d,
                                       "per round %.2f, %.2f-%.2f" % p if p else ""))


# ------------------------------------------------------------------ main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shards")
    s.add_argument("photos")
    s.add_argument("out")
    s.add_argument("--counts", required=True)
    s.add_argument("--shards", type=int, default=12)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--pattern", default="train-%06d.tar")
    s = sub.add_parser("index")
    s.add_argument("dir")
    s.add_argument("--counts", required=True)
    s = sub.add_parser("check-index")
    s.add_argument("dir")
    s.add_argument("--counts", required=True)
    s = sub.add_parser("torch-first")
    s.add_argument("urls", nargs="+")
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--shuffle", type=int, default=1000)
    s.add_argument("--expect", type=int, default=0)
    s = sub.add_parser("record")
    s.add_argument("output")
    s.add_argument("--run", required=True)
    s.add_argument("--round", type=int, required=True)
    s.add_argument("--expect", type=int, required=True)
    s.add_argument("--batch-size", type=int, required=True)
    s.add_argument("--results", required=True)
    s.add_argument("--time", default="", help="GNU time's '%%e %%U %%S' output of the run")
    s = sub.add_parser("summary")
    s.add_argument("results")
    s.add_argument("--title", default="")
    a = p.parse_args()
    {"shards": cmd_shards, "index": cmd_index, "check-index": cmd_check_index,
     "torch-first": cmd_torch_first, "record": cmd_record,
     "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    main()
