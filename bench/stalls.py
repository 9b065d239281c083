#!/usr/bin/env python3
"""Periodic stalls: the batch wait distribution when the step is just
faster than the pipeline.

    python3 bench/stalls.py SHARDS [--epochs 10] [--batch-size 64]
        [--decode-threads N] [--fraction 0.9] [--rounds N] [--crop C] [--json]
        [--trace]

1. Measures the pipeline's own rate: one epoch of shardfeed.Loader over
   SHARDS (a folder of tar shards with index.json) with no step.
2. Sets the step (a sleep, as a GPU step costs the host nothing) to
   FRACTION of the time the pipeline needs per batch, so the loader is the
   bound by a small margin, and runs EPOCHS epochs with it, timing every
   next() (the consumer's wait per batch).
3. Prints the wait percentiles (p50, p90, p99, max), p99 / p50 (the issue's
   target is <= 2), the same within epochs and at epoch starts, a histogram,
   and the range of the loader's own per-epoch reports (wait share, bound).
   The first timed epoch follows a step-less one (nothing read ahead), so its
   first batch is shown apart. With --rounds, a round whose median wait is
   under a quarter of the step's margin ((1 - FRACTION) of the pipeline's
   time per batch) is left out of the medians: the machine sped up after the
   calibration and the step did not bind.
4. Runs the same consumer against a reference pipeline in the same round
   (unless --no-reference): as many threads as the loader decodes with share
   each batch of items of one fixed cost (SHA-256 of a fixed buffer, which
   releases the GIL), sized to the loader's cost per image, through a queue
   of the same depth. Its batches cost the same every time, so its p99 / p50
   is what this machine's scheduling alone gives a pipeline with a 10 %
   margin: the floor under the loader's figure.

A DataLoader whose workers each hold whole batches delivers in bursts (a
wait every num_workers batches); shardfeed's decode threads share every
batch, so the waits should stay even. The step runs on this thread, the
waits are measured around next() only.
"""
import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "build", "python"))
import shardfeed  # noqa: E402


def run_epoch(loader, step_s, waits, firsts=None):
    n = 0
    while True:
        t0 = time.perf_counter()
        b = loader.next_batch()
        waits.append(time.perf_counter() - t0)
        if firsts is not None and n == 0:
            firsts.append(len(waits) - 1)
        if b is None:
            waits.pop()  # the end of the epoch is not a batch
            return n
        n += b.size
        if step_s:
            time.sleep(step_s)
        b.release()


class FixedPipeline:
    """Threads that share each batch's items of fixed cost; a batch is ready
    when its last item is done; at most `depth` batches ahead of the consumer
    (the loader's ring). next_batch() waits for the next one in order."""

    def __init__(self, threads, batch, depth, item_bytes, batches):
        self.buf = os.urandom(item_bytes)
        self.batch, self.depth, self.total = batch, depth, batches
        self.cv = threading.Condition()
        self.next_item = 0  # over all batches: batch = item // batch
        self.done = [0] * batches
        self.taken = 0
        self.stop = False
        self.threads = [threading.Thread(target=self.work, daemon=True)
                        for _ in range(threads)]
        for t in self.threads:
            t.start()

    def work(self):
        while True:
            with self.cv:
                while not self.stop and (self.next_item >= self.total * self.batch or
                                         self.next_item // self.batch >= self.taken + self.depth):
                    self.cv.wait()
                if self.stop:
                    return
                b = self.next_item // self.batch
                self.next_item += 1
            hashlib.sha256(self.buf).digest()
            with self.cv:
                self.done[b] += 1
                if self.done[b] == self.batch:
                    self.cv.notify_all()

    def next_batch(self):
        with self.cv:
            if self.taken >= self.total:
                return None
            while self.done[self.taken] < self.batch:
                self.cv.wait()
            self.taken += 1
            self.cv.notify_all()
            return self.batch

    def close(self):
        with self.cv:
            self.stop = True
            self.cv.notify_all()
        for t in self.threads:
            t.join()


def item_bytes_for(seconds):
    """The SHA-256 input size that takes `seconds` on this thread."""
    n = 1 << 20
    buf = os.urandom(n)
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2:
        hashlib.sha256(buf).digest()
        k += 1
    per_byte = (time.perf_counter() - t0) / (k * n)
    return max(4096, int(seconds / per_byte))


def reference_round(a, threads, loader_rate, batches):
    """The consumer of one_round against FixedPipeline: waits per batch."""
    per_image = threads / loader_rate  # one thread's time per image in the loader
    item = item_bytes_for(per_image)
    p = FixedPipeline(threads, a.batch_size, 4, item, batches + 8)
    try:
        t0 = time.perf_counter()
        for _ in range(8):  # its own rate, as the loader's step-less epoch
            p.next_batch()
        rate = 8 * a.batch_size / (time.perf_counter() - t0)
        step_s = a.fraction * a.batch_size / rate
        waits = []
        for _ in range(batches):
            t = time.perf_counter()
            p.next_batch()
            waits.append((time.perf_counter() - t) * 1e3)
            time.sleep(step_s)
    finally:
        p.close()
    return {"rate": rate, "step_ms": step_s * 1e3, "p50": pct(waits, .5),
            "p99": pct(waits, .99), "max": max(waits),
            "p99_over_p50": pct(waits, .99) / pct(waits, .5) if pct(waits, .5) > 0
            else float("inf")}


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def one_round(a, opts):
    with shardfeed.Loader([a.shards], **opts) as loader:
        waits = []
        t0 = time.perf_counter()
        n = run_epoch(loader, 0, waits)  # also warms the page cache
        loader.set_epoch(loader.epoch + 1)
        waits = []
        t0 = time.perf_counter()
        n = run_epoch(loader, 0, waits)
        rate = n / (time.perf_counter() - t0)
        step_s = a.fraction * a.batch_size / rate
        loader.set_epoch(loader.epoch + 1)
        waits, firsts, reports = [], [], []
        t0 = time.perf_counter()
        images = 0
        for e in range(a.epochs):
            images += run_epoch(loader, step_s, waits, firsts)
            reports.append(loader.report())
            loader.set_epoch(loader.epoch + 1)
        wall = time.perf_counter() - t0
        threads = loader.stats()["decode_threads"]
    ms = [w * 1e3 for w in waits]
    first = set(firsts)
    inner = [x for i, x in enumerate(ms) if i not in first]
    edge = [ms[i] for i in firsts if i < len(ms)]
    p50, p90, p99, mx = pct(ms, .5), pct(ms, .9), pct(ms, .99), max(ms)
    res = {"pipeline_per_s": rate, "step_ms": step_s * 1e3, "batches": len(ms),
           "images_per_s": images / wall, "wait_share": sum(waits) / wall,
           "wait_p50_ms": p50, "wait_p90_ms": p90, "wait_p99_ms": p99, "wait_max_ms": mx,
           "p99_over_p50": p99 / p50 if p50 > 0 else float("inf"),
           "within_epoch_p50_ms": pct(inner, .5) if inner else 0,
           "within_epoch_p99_ms": pct(inner, .99) if inner else 0,
           "within_epoch_max_ms": max(inner) if inner else 0,
           "within_epoch_p99_over_p50": (pct(inner, .99) / pct(inner, .5)
                                         if inner and pct(inner, .5) > 0 else float("inf")),
           "epoch_first_batch_median_ms": statistics.median(edge) if edge else 0,
           "epoch_first_batch_max_ms": max(edge) if edge else 0,
           "epoch_first_batch_max_later_ms": max(edge[1:]) if len(edge) > 1 else 0,
           "loader_wait_share": [r["wait_share"] for r in reports],
           "loader_bound": [r["bound"] for r in reports],
           "epoch_starts": firsts}
    if not a.no_reference:
        res["reference"] = reference_round(a, threads, rate, len(inner))
    return res, ms, edge, rate, step_s, images, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--decode-threads", type=int, default=0)
    ap.add_argument("--fraction", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=1,
                    help="calibrate and run the epochs this many times (the machine's load "
                         "moves the pipeline's rate; the median of the rounds is printed)")
    ap.add_argument("--crop", default="random_resized",
                    help="the loader's crop: random_resized (default; each image's decode "
                         "cost varies with its crop), center (about the same cost each)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the fixed-cost reference pipeline")
    ap.add_argument("--trace", action="store_true",
                    help="also print every batch's wait, epoch by epoch, in delivery order "
                         "(to see whether long waits recur at a period, e.g. shard ends)")
    a = ap.parse_args()
    opts = dict(batch_size=a.batch_size, device="host", prefetch_batches=4, crop=a.crop)
    if a.decode_threads:
        opts["decode_threads"] = a.decode_threads
    rounds = []
    for r in range(a.rounds):
        rounds.append(one_round(a, opts))
        if a.rounds > 1 and not a.json:
            rr = rounds[-1][0]
            ref = (f", reference {rr['reference']['p99_over_p50']:.2f}"
                   if "reference" in rr else "")
            print(f"round {r + 1}: pipeline {rr['pipeline_per_s']:.0f} img/s, wait share "
                  f"{100 * rr['wait_share']:.1f} %, p99 / p50 {rr['p99_over_p50']:.2f}, within "
                  f"epochs {rr['within_epoch_p99_over_p50']:.2f}{ref}")
    # A round whose median wait is under a quarter of the margin the step
    # leaves (1 - fraction of the pipeline's time per batch) measured
    # nothing: the machine sped up after the calibration, the step stopped
    # binding, and waits of ~0 make p99 / p50 meaningless.
    def binds(x):
        margin_ms = x[0]["step_ms"] / a.fraction * (1 - a.fraction)
        return x[0]["within_epoch_p50_ms"] >= margin_ms / 4
    bound = [x for x in rounds if binds(x)]
    if a.rounds > 1 and not a.json:
        if len(bound) < len(rounds):
            print(f"{len(rounds) - len(bound)} round(s) left out: the median wait within "
                  f"epochs was under a quarter of the step's margin (the step did not bind)")
        if not bound:
            bound = rounds
        print(f"median of {len(bound)} rounds: p99 / p50 "
              f"{statistics.median(x[0]['p99_over_p50'] for x in bound):.2f}, within epochs "
              f"{statistics.median(x[0]['within_epoch_p99_over_p50'] for x in bound):.2f} "
              f"(target <= 2)" + (
                  f"; the fixed-cost reference "
                  f"{statistics.median(x[0]['reference']['p99_over_p50'] for x in bound):.2f}"
                  if "reference" in rounds[0][0] else "") + "; the last round in full:")
    res, ms, edge, rate, step_s, images, wall = rounds[-1]
    p50, p90, p99, mx = pct(ms, .5), pct(ms, .9), pct(ms, .99), max(ms)
    if a.json:
        print(json.dumps(res))
        return
    print(f"pipeline alone: {rate:.0f} img/s; step {step_s * 1e3:.1f} ms per batch of "
          f"{a.batch_size} ({a.fraction:.0%} of the pipeline's time per batch)")
    print(f"{a.epochs} epochs, {len(ms)} batches: {images / wall:.0f} img/s, the step waited "
          f"{100 * res['wait_share']:.1f} % of the time")
    print(f"batch wait: p50 {p50:.2f} ms, p90 {p90:.2f} ms, p99 {p99:.2f} ms, max {mx:.2f} ms; "
          f"p99 / p50 = {res['p99_over_p50']:.2f} (target <= 2)")
    print(f"within epochs (each epoch's first batch left out): p50 "
          f"{res['within_epoch_p50_ms']:.2f} ms, p99 {res['within_epoch_p99_ms']:.2f} ms, "
          f"max {res['within_epoch_max_ms']:.2f} ms; p99 / p50 = "
          f"{res['within_epoch_p99_over_p50']:.2f}")
    print(f"each epoch's first batch (read ahead while the previous epoch ends): median "
          f"{res['epoch_first_batch_median_ms']:.2f} ms, max "
          f"{res['epoch_first_batch_max_later_ms']:.2f} ms after the first epoch; the first "
          f"epoch's (after the step-less one) {edge[0] if edge else 0:.2f} ms")
    if "reference" in res:
        r = res["reference"]
        print(f"fixed-cost reference (same threads, queue and step fraction, "
              f"{len(ms) - len(edge)} batches): {r['rate']:.0f} img/s, step "
              f"{r['step_ms']:.1f} ms; wait p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, max "
              f"{r['max']:.2f} ms; p99 / p50 = {r['p99_over_p50']:.2f}: this machine's floor")
    ws = res["loader_wait_share"]
    if ws:
        print(f"loader's reports: wait share {100 * min(ws):.1f}-{100 * max(ws):.1f} % per "
              f"epoch, bound: {', '.join(sorted(set(res['loader_bound'])))}")
    edges = [0, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1e9]
    for lo, hi in zip(edges, edges[1:]):
        k = sum(lo <= x < hi for x in ms)
        if k:
            label = f"{lo:g}-{hi:g} ms" if hi < 1e9 else f">= {lo:g} ms"
            print(f"  {label:>12} {k:6d} {'#' * max(1, round(60 * k / len(ms)))}")
    if a.trace:
        starts = res["epoch_starts"] + [len(ms)]
        for e, (lo, hi) in enumerate(zip(starts, starts[1:])):
            print(f"epoch {e + 1} waits (ms): " + " ".join(f"{x:.0f}" for x in ms[lo:hi]))


if __name__ == "__main__":
    main()
