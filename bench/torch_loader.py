#!/usr/bin/env python3
"""The reference: PyTorch's usual tuned input pipeline on WebDataset tar shards.

    python3 bench/torch_loader.py SHARDS [--batch-size 256] [--epochs 2]
        [--workers N] [--shuffle 1000] [--seed 1] [--device auto|cpu|cuda]
        [--expect N]

SHARDS is a folder of *.tar shards (index.json beside them, as `shardfeed pack`
writes, gives the expected sample count) or one or more shard paths. The
pipeline is what WebDataset's and torchvision's documentation recommend for
ImageNet training:

    wds.WebDataset(shards, shardshuffle=len(shards), detshuffle=True, seed=S,
                   workersplitter=wds.split_by_worker)
       .shuffle(1000).decode("pil").to_tuple("jpg", "cls")
       .map_tuple(Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
                           PILToTensor()]), int)
    DataLoader(ds, batch_size=B, num_workers=N, pin_memory=<cuda available>,
               persistent_workers=True, prefetch_factor=4)

uint8 CHW 224x224 images, as shardfeed's loader delivers them by default.
With CUDA (--device auto finds it) each batch is also copied to the GPU and
normalised to float there, as shardfeed does; without it batches stay in host
memory and pin_memory is off (pinning needs CUDA).

Shards are split between workers (split_by_worker: worker w reads shards w,
w + N, ...), so every sample is read exactly once per epoch; the count is
checked against index.json (or --expect) and a mismatch fails. N defaults to
the cores this process may run on, capped at the shard count (a worker
without a shard would fail WebDataset's empty check).

Prints one JSON line on stdout:
  images, seconds, images_per_s, batches   all epochs, from the first
      iterator's creation (worker start-up included) to the last batch
  first_batch_s; images_after_first_batch, seconds_after_first_batch,
      images_per_s_after_first_batch   the same without the start-up and the
      first batch
  epoch_seconds, workers, pin_memory, device, batch_size, epochs, shards
  peak memory, in bytes (Linux /proc; see docs/sample-dataset.md):
    peak_rss_self_bytes        ru_maxrss of this (main) process
    peak_rss_max_child_bytes   ru_maxrss of the largest worker, read after
                               the workers exit (RUSAGE_CHILDREN is a maximum
                               over children, not a sum)
    peak_tree_rss_bytes        the largest sum of VmRSS over this process and
                               all its descendants, sampled every 0.2 s; counts
                               pages shared between the forked workers (torch's
                               libraries) once per process, so it overstates
    peak_tree_pss_bytes        the same sum with PSS (smaps_rollup: shared
                               pages divided among their sharers): the memory
                               the tree really holds; the figure to compare
                               with a single process's maximum RSS
Startup (imports, dataset construction) is not timed.
"""
import argparse
import glob
import json
import os
import resource
import sys
import threading
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shards", nargs="+", help="a folder of *.tar shards, or shard paths")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=0, help="0: the usable cores (default)")
    p.add_argument("--shuffle", type=int, default=1000, help="sample shuffle buffer")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--expect", type=int, default=0,
                   help="samples per epoch (default: index.json's sample_count)")
    p.add_argument("--sample-interval", type=float, default=0.2,
                   help="seconds between memory samples of the process tree")
    a = p.parse_args()
    for name in ("batch_size", "epochs"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.workers < 0 or a.shuffle < 0 or a.expect < 0:
        p.error("--workers, --shuffle and --expect must not be negative")
    return a


def find_shards(args):
    """Shard paths (sorted) and the expected sample count (0: unknown)."""
    if len(args.shards) == 1 and os.path.isdir(args.shards[0]):
        d = args.shards[0]
        shards = sorted(glob.glob(os.path.join(d, "*.tar")))
        expect = args.expect
        index = os.path.join(d, "index.json")
        if not expect and os.path.exists(index):
            with open(index) as f:
                idx = json.load(f)
            listed = sorted(os.path.join(d, s["name"]) for s in idx["shards"])
            if listed != shards:
                sys.exit("torch_loader: %s does not list the *.tar files of %s" % (index, d))
            expect = idx["sample_count"]
    else:
        shards, expect = list(args.shards), args.expect
    if not shards:
        sys.exit("torch_loader: no *.tar shards in %s" % " ".join(args.shards))
    for s in shards:
        if not os.path.isfile(s):
            sys.exit("torch_loader: %s is not a file" % s)
    return shards, expect


# ------------------------------------------------------------------ memory of the process tree

def _descendants(root):
    """root and every process below it (a scan of /proc for parent ids)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _kib_field(path, name):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1]) * 1024
    except OSError:  # the process exited between the scan and the read
        pass
    return 0


class TreeMemory(threading.Thread):
    """Samples the summed RSS and PSS of this process and its descendants."""

    def __init__(self, interval_s):
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_pss = 0
        self.stop_event = threading.Event()

    def sample(self):
        rss = pss = 0
        for pid in _descendants(os.getpid()):
            rss += _kib_field("/proc/%d/status" % pid, "VmRSS:")
            pss += _kib_field("/proc/%d/smaps_rollup" % pid, "Pss:")
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)

    def run(self):
        while not self.stop_event.wait(self.interval_s):
            self.sample()

    def stop(self):
        self.stop_event.set()
        self.join()
        self.sample()


# ------------------------------------------------------------------ the pipeline

def make_loader(shards, batch_size, workers, shuffle, seed, pin):
    """The DataLoader over shards (paths, or WebDataset URLs such as
    "pipe:curl -s http://..."); also used by bench/first_batch_helper.py."""
    import torch
    import torchvision.transforms as T
    import webdataset as wds

    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = (wds.WebDataset(shards, shardshuffle=len(shards), detshuffle=True, seed=seed,
                         nodesplitter=wds.single_node_only,
                         workersplitter=wds.split_by_worker)
          .shuffle(shuffle)
          .decode("pil")
          .to_tuple("jpg", "cls")
          .map_tuple(transform, int))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers,
                                       pin_memory=pin, persistent_workers=True,
                                       prefetch_factor=4)


def main():
    args = parse_args()
    shards, expect = find_shards(args)

    import torch
    import webdataset as wds

    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        sys.exit("torch_loader: --device cuda but torch.cuda.is_available() is False")
    device = "cuda" if (args.device == "cuda" or (args.device == "auto" and cuda)) else "cpu"
    pin = device == "cuda"  # pinned host memory only means something with a GPU

    cores = len(os.sched_getaffinity(0))
    workers = args.workers or cores
    if workers > len(shards):
        print("torch_loader: %d workers asked, %d shards: using %d workers (a worker "
              "without a shard fails WebDataset's empty check)"
              % (workers, len(shards), len(shards)), file=sys.stderr)
        workers = len(shards)

    loader = make_loader(shards, args.batch_size, workers, args.shuffle, args.seed, pin)
    if device == "cuda":
        mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    mem = TreeMemory(args.sample_interval)
    mem.start()
    images = batches = 0
    first_batch_s = None
    epoch_seconds = []
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        # Each epoch re-creates the (persistent) workers' iterators; their
        # detshuffle stage counts epochs itself: shard order = f(seed, epoch).
        te = time.perf_counter()
        n = 0
        for x, y in loader:
            if device == "cuda":
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                x = (x.float() - mean) / std
            if first_batch_s is None:
                if device == "cuda":
                    torch.cuda.synchronize()
                first_batch_s = time.perf_counter() - t0
                first_batch_images = len(y)
            n += len(y)
            batches += 1
        if device == "cuda":
            torch.cuda.synchronize()
        epoch_seconds.append(round(time.perf_counter() - te, 4))
        if expect and n != expect:
            sys.exit("torch_loader: epoch %d delivered %d samples, not %d" % (epoch, n, expect))
        images += n
    seconds = time.perf_counter() - t0
    mem.stop()

    # Shut the persistent workers down so RUSAGE_CHILDREN covers them.
    loader._iterator = None
    del loader
    import gc
    gc.collect()
    ru_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ru_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024

    after_s = seconds - first_batch_s
    after_n = images - first_batch_images
    print(json.dumps({
        "images": images,
        "seconds": round(seconds, 4),
        "images_per_s": round(images / seconds, 1),
        "batches": batches,
        "first_batch_s": round(first_batch_s, 4),
        "images_after_first_batch": after_n,
        "seconds_after_first_batch": round(after_s, 4),
        "images_per_s_after_first_batch": round(after_n / after_s, 1) if after_s > 0 else None,
        "epoch_seconds": epoch_seconds,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "shards": len(shards),
        "workers": workers,
        "cores": cores,
        "pin_memory": pin,
        "device": device,
        "peak_rss_self_bytes": ru_self,
        "peak_rss_max_child_bytes": ru_children,
        "peak_tree_rss_bytes": mem.peak_rss,
        "peak_tree_pss_bytes": mem.peak_pss,
        "torch": torch.__version__,
        "webdataset": getattr(wds, "__version__", None),
    }))


if __name__ == "__main__":
    main()
