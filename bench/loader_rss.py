#!/usr/bin/env python3
"""Where a shardfeed.Loader's resident memory goes.

    python3 bench/loader_rss.py SHARDS [--batch-size 128] [--epochs 2]
        [--build-dir DIR] [--no-torch]

Imports torch (as a training script does; --no-torch leaves it out), then
runs EPOCHS epochs of shardfeed.Loader over SHARDS (a local folder of
shards, or anything Loader takes) with torch.from_dlpack of every batch, and
samples /proc/self/status and /proc/self/maps every 20 ms. Prints the peak
of VmRSS, RssAnon (the batch ring, decoder scratch) and RssFile (mapped
shards and cache entries), each above what the imports left, and the most
shard files mapped at once. Memory, not speed: any load will do.
"""
import argparse
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def status():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem")):
                k, v = line.split(":")
                d[k] = int(v.split()[0]) / 1024
    with open("/proc/self/maps") as f:
        d["shards mapped"] = sum(1 for line in f
                                 if line.rstrip().endswith((".tar", ".sfr", ".sf")))
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--build-dir", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.build_dir, "python"))
    torch = None
    if not a.no_torch:
        import torch
    import shardfeed
    base = status()
    peak = dict(base)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            for k, v in status().items():
                peak[k] = max(peak[k], v)
            time.sleep(0.02)

    t = threading.Thread(target=sample)
    t.start()
    images = 0
    try:
        with shardfeed.Loader([a.shards], batch_size=a.batch_size) as loader:
            for e in range(a.epochs):
                for b in loader:
                    if torch is not None:
                        x = torch.from_dlpack(b.images)
                        del x
                    images += b.size
                loader.set_epoch(loader.epoch + 1)
    finally:
        stop.set()
        t.join()
    print(f"{images} images, batch {a.batch_size}, {a.epochs} epochs; MiB, peak and above the "
          f"imports ({'torch, ' if torch else ''}shardfeed):")
    for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
        print(f"  {k:9} {peak[k]:8.0f} {peak[k] - base[k]:8.0f}")
    print(f"  shard files mapped at once, at most: {peak['shards mapped']:.0f}")


if __name__ == "__main__":
    main()
