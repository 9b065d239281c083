#!/usr/bin/env python3
"""Helper of bench/python_vs_torch.sh (one subcommand per step).

    python SHARD... [--batch-size 128] [--epochs 2] [--decode-threads N]
            [--seed 1] [--expect N]
        shardfeed.Loader from Python: every batch's images and labels become
        torch tensors (torch.from_dlpack, zero copy), no training step. One
        JSON line on stdout: images, batches, seconds and images_per_s (from
        just before shardfeed.Loader() to the last batch, as `shardfeed
        load` counts from just before sf_loader_open), first_batch_s,
        epoch_seconds, the loader's stats and consumer_wait_share: the
        starvation report's wait share (time blocked in next() over the time
        from the epoch's first next() on, as `shardfeed load` shows it), its
        report windows of every epoch taken together (epoch_wait_shares:
        each epoch's own). With --expect N every epoch
        must deliver N images (exit 1 otherwise). Imports are not timed.
    measure --out FILE [--interval 0.05] -- CMD...
        runs CMD (stdin, stdout and stderr inherited) and samples every
        INTERVAL seconds the memory of CMD's process and all its descendants
        (DataLoader workers): the sum of VmRSS (/proc/PID/status; pages
        shared between forked workers count once per process) and the sum of
        Pss (/proc/PID/smaps_rollup; shared pages split among their sharers).
        FILE gets one JSON object: peak_tree_rss_bytes, peak_tree_pss_bytes,
        max_rss_bytes (getrusage: the largest single process, exact for a
        one-process loader), cpu_s (user + system of the tree), wall_s,
        samples, rc. Exits with CMD's status.
    record OUTPUT MEASURE --run NAME --round R --expect N --results FILE
        checks a tool's JSON line (OUTPUT's last line starting with '{':
        every epoch delivered every image once) and appends it, with the
        measurement, to FILE (JSON lines); exits 1 when it is wrong.
    baseline --out FILE [--torch]
        the maximum RSS and the CPU time of a Python process that only
        imports what each Python tool imports (torch and shardfeed; with
        --torch also torchvision, webdataset and PIL): FILE gets {"python":
        bytes, "python_cpu_s": s, "torch": ..., "torch_cpu_s": ...}. The
        summary subtracts them to show what the loaders themselves cost.
    summary FILE [--baseline FILE] [--title TEXT]
        medians per tool and the ratios of the medians.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_results import RunResults, last_json_line  # noqa: E402
from torch_loader import _descendants, _kib_field  # noqa: E402  (the /proc tree walk)


def die(msg, code=1):
    print("python_loader: %s" % msg, file=sys.stderr)
    sys.exit(code)


# ------------------------------------------------------------------ python

def cmd_python(a):
    import torch

    import shardfeed

    options = {"batch_size": a.batch_size, "seed": a.seed}
    if a.decode_threads:
        options["decode_threads"] = a.decode_threads
    images = batches = 0
    epoch_seconds = []
    reports = []  # each epoch's starvation report (a window per epoch)
    first_batch_s = None
    t0 = time.perf_counter()
    loader = shardfeed.Loader(a.shards, **options)
    cuda_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for epoch in range(a.epochs):
        te = time.perf_counter()
        n = 0
        for batch in loader:  # each new iteration reads the next epoch
            x = torch.from_dlpack(batch.images)
            y = torch.from_dlpack(batch.labels)
            if first_batch_s is None:
                cuda_sync()
                first_batch_s = time.perf_counter() - t0
            n += len(y)
            batches += 1
            del x, y, batch  # the ring slot goes back here, as in a training loop
        cuda_sync()
        epoch_seconds.append(round(time.perf_counter() - te, 4))
        reports.append(loader.report())  # the epoch that just ended
        if a.expect and n != a.expect:
            die("epoch %d delivered %d images, not %d" % (epoch, n, a.expect))
        images += n
    seconds = time.perf_counter() - t0
    stats = loader.stats()
    loader.close()
    print(json.dumps({
        "ok": True,
        "images": images,
        "batches": batches,
        "seconds": round(seconds, 4),
        "images_per_s": round(images / seconds, 1),
        "first_batch_s": round(first_batch_s, 4),
        "epoch_seconds": epoch_seconds,
        "epochs": a.epochs,
        "batch_size": a.batch_size,
        "pads": stats["pad_samples"],
        "skipped": stats["samples_skipped"],
        "dropped": stats["dropped_samples"],
        "decode_threads": stats["decode_threads"],
        "on_device": stats["on_device"],
        # One wait share, the report's (wait_s / span_s), over the epochs'
        # windows together: with one epoch it is that report's wait_share.
        "consumer_wait_share": round(sum(r["wait_s"] for r in reports)
                                     / sum(r["span_s"] for r in reports), 4)
        if sum(r["span_s"] for r in reports) > 0 else None,
        "epoch_wait_shares": [round(r["wait_share"], 4) for r in reports],
        "torch": torch.__version__,
        "shardfeed": shardfeed.__version__,
    }), flush=True)


# ------------------------------------------------------------------ measure

def tree_memory(root, with_pss):
    """Summed VmRSS (and PSS when with_pss) of root and its descendants.

    PSS is read from smaps_rollup, which walks every mapping: about 19 ms per
    read of a process that imported torch, so at 20 samples a second it took
    ~40% of a core from the measured run (on 2 cores, the Python loader's
    images/s fell by ~10%). VmRSS (from status) costs 0.07 ms: it is sampled
    every interval, PSS once a second."""
    rss = pss = 0
    for pid in _descendants(root):
        rss += _kib_field("/proc/%d/status" % pid, "VmRSS:")
        if with_pss:
            pss += _kib_field("/proc/%d/smaps_rollup" % pid, "Pss:")
    return rss, pss


def cmd_measure(a):
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        die("measure: no command", 2)
    peak = {"rss": 0, "pss": 0, "samples": 0}
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd)
    done = threading.Event()

    pss_every = max(1, int(round(1.0 / a.interval)))

    def sample():
        while True:
            with_pss = peak["samples"] % pss_every == 0
            rss, pss = tree_memory(child.pid, with_pss)
            peak["rss"] = max(peak["rss"], rss)
            peak["pss"] = max(peak["pss"], pss)
            peak["samples"] += 1
            if done.wait(a.interval):
                return

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = child.wait()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(a.out, "w") as f:
        json.dump({"peak_tree_rss_bytes": peak["rss"], "peak_tree_pss_bytes": peak["pss"],
                   "max_rss_bytes": ru.ru_maxrss * 1024,
                   "cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "wall_s": round(wall, 3),
                   "samples": peak["samples"], "interval_s": a.interval, "rc": rc}, f)
        f.write("\n")
    sys.exit(rc if rc >= 0 else 128 - rc)


# ------------------------------------------------------------------ baseline

def usage_of(code):
    """(maximum RSS bytes, CPU seconds) of `python3 -c code` (that child alone)."""
    child = subprocess.Popen([sys.executable, "-c", code])
    _, status, ru = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        die("baseline: python3 -c %r failed" % code)
    return ru.ru_maxrss * 1024, ru.ru_utime + ru.ru_stime


def cmd_baseline(a):
    out = {}
    out["python"], out["python_cpu_s"] = usage_of("import torch, shardfeed")
    if a.torch:
        out["torch"], out["torch_cpu_s"] = usage_of(
            "import torch, torchvision.transforms, webdataset, PIL.Image")
    with open(a.out, "w") as f:
        json.dump(out, f)
        f.write("\n")


# ------------------------------------------------------------------ record

def cmd_record(a):
    d = last_json_line(a.output)
    if d is None:
        die("%s (round %d): no JSON line in %s" % (a.run, a.round, a.output))
    with open(a.measure) as f:
        m = json.load(f)
    if d.get("ok") is False:
        die("%s (round %d): %s" % (a.run, a.round, d.get("error")))
    want = a.expect * d.get("epochs", 1)
    if d.get("images") != want:
        die("%s (round %d): %s images, not %d" % (a.run, a.round, d.get("images"), want))
    if d.get("skipped") or d.get("pads") or d.get("dropped"):
        die("%s (round %d): skipped %s, pads %s, dropped %s: not every image once"
            % (a.run, a.round, d.get("skipped"), d.get("pads"), d.get("dropped")))
    d.update(m)
    # A single process: getrusage's maximum is exact where 50 ms samples may
    # miss a short peak; for a tree the sampled sum is all there is.
    d["peak_bytes"] = max(m["peak_tree_rss_bytes"], m["max_rss_bytes"]) \
        if a.run != "torch" else m["peak_tree_rss_bytes"]
    d["peak_pss_bytes"] = m["peak_tree_pss_bytes"]
    d["cpu_ms_per_image"] = m["cpu_s"] * 1000 / d["images"]
    d["run"], d["round"] = a.run, a.round
    with open(a.results, "a") as f:
        f.write(json.dumps(d) + "\n")
    print("  round %d %-7s %8.1f images/s, first batch %.3f s, peak %4.0f MiB (RSS sum), "
          "%4.0f MiB (PSS sum), %.2f CPU ms/image" % (
              a.round + 1, a.run, d["images_per_s"], d.get("first_batch_s") or 0,
              d["peak_bytes"] / 1048576, d["peak_pss_bytes"] / 1048576, d["cpu_ms_per_image"]),
          file=sys.stderr)


# ------------------------------------------------------------------ summary

LABELS = {"cli": "shardfeed load (CLI)", "python": "shardfeed.Loader (Python)",
          "torch": "DataLoader + WebDataset + PIL"}


def cmd_summary(a):
    results = RunResults(a.results)
    runs, med, span, paired = results.runs, results.median, results.span, results.paired

    if a.title:
        print(a.title)
    print("%-32s %2s %9s %13s %11s %10s %10s %9s" % (
        "tool", "n", "images/s", "(min-max)", "first batch", "peak MiB", "PSS MiB",
        "CPU ms/img"))
    for run in ("cli", "python", "torch"):
        if run not in runs:
            continue
        fb = med(run, "first_batch_s")
        print("%-32s %2d %9.1f %13s %11s %10.0f %10.0f %9.2f" % (
            LABELS[run], len(runs[run]), med(run, "images_per_s"),
            span(run, "images_per_s", "%.0f"), "%.3f s" % fb if fb is not None else "-",
            med(run, "peak_bytes") / 1048576, med(run, "peak_pss_bytes") / 1048576,
            med(run, "cpu_ms_per_image")))
    print("peak MiB: the largest sum of VmRSS over the loader's process and its DataLoader workers")
    print("  (sampled every %s s; for one process, at least getrusage's maximum RSS). PSS MiB: the"
          % (runs[next(iter(runs))][0].get("interval_s")))
    print("  same sum with PSS, which counts pages the forked workers share once in all.")

    def ratio(label, num, den, key, target, cmp):
        n, d = med(num, key), med(den, key)
        if n is None or not d:
            return
        r = n / d
        p = paired(num, den, key)
        if target is None:
            print("%-50s %5.3f  %s" % (label, r, "per round %.2f, %.2f-%.2f" % p if p else ""))
            return
        met = r <= target if cmp == "<=" else r >= target
        print("%-50s %5.3f  (target %s %.2f: %-7s) %s" % (
            label, r, cmp, target, "met" if met else "NOT met",
            "per round %.2f, %.2f-%.2f" % p if p else ""))

    base = {}
    if a.baseline:
        with open(a.baseline) as f:
            base = json.load(f)
        print("memory above the imports (peak MiB minus a process that only imports what the "
              "tool imports):")
        for run in ("python", "torch"):
            if run in runs and run in base:
                for d in runs[run]:
                    d["above_imports_bytes"] = d["peak_bytes"] - base[run]
                    d["cpu_ms_per_image_no_imports"] = \
                        (d["cpu_s"] - base[run + "_cpu_s"]) * 1000 / d["images"]
                print("  %-30s %6.0f MiB (imports: %.0f MiB); CPU ms/image without the "
                      "imports' %.1f s: %.2f" % (
                          LABELS[run], med(run, "above_imports_bytes") / 1048576,
                          base[run] / 1048576, base[run + "_cpu_s"],
                          med(run, "cpu_ms_per_image_no_imports")))
        for d in runs.get("cli", []):
            d["cpu_ms_per_image_no_imports"] = d["cpu_ms_per_image"]
    print("ratios of the medians (and the median and range of each round's own ratio):")
    ratio("images/s, Python / CLI", "python", "cli", "images_per_s", 0.97, ">=")
    ratio("images/s, Python / DataLoader", "python", "torch", "images_per_s", 2.5, ">=")
    ratio("peak memory (RSS sum), Python / DataLoader", "python", "torch", "peak_bytes", 0.35,
          "<=")
    print("for reference:")
    ratio("   CPU per image without imports, CLI / Python", "cli", "python",
          "cpu_ms_per_image_no_imports", None, None)
    if "torch" not in runs:
        return
    ratio("   peak memory (PSS sum), Python / DataLoader", "python", "torch", "peak_pss_bytes",
          None, None)
    ratio("   memory above the imports, Python / DataLoader", "python", "torch",
          "above_imports_bytes", None, None)
    ratio("   images/s, CLI / DataLoader", "cli", "torch", "images_per_s", None, None)
    ratio("   CPU ms per image, DataLoader / Python", "torch", "python", "cpu_ms_per_image",
          None, None)


# ------------------------------------------------------------------ main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("python")
    s.add_argument("shards", nargs="+")
    s.add_argument("--batch-size", type=int, default=128)
    s.add_argument("--epochs", type=int, default=2)
    s.add_argument("--decode-threads", type=int, default=0)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--expect", type=int, default=0)
    s = sub.add_parser("measure")
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=0.05)
    s.add_argument("command", nargs=argparse.REMAINDER)
    s = sub.add_parser("record")
    s.add_argument("output")
    s.add_argument("measure")
    s.add_argument("--run", required=True, choices=sorted(LABELS))
    s.add_argument("--round", type=int, required=True)
    s.add_argument("--expect", type=int, required=True)
    s.add_argument("--results", required=True)
    s = sub.add_parser("baseline")
    s.add_argument("--out", required=True)
    s.add_argument("--torch", action="store_true")
    s = sub.add_parser("summary")
    s.add_argument("results")
    s.add_argument("--baseline", default="")
    s.add_argument("--title", default="")
    a = p.parse_args()
    {"python": cmd_python, "measure": cmd_measure, "record": cmd_record,
     "baseline": cmd_baseline, "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    main()
