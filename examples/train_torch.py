#!/usr/bin/env python3
"""Trains a torchvision ResNet-18 on batches streamed by shardfeed.Loader.

    python3 examples/train_torch.py [--endpoint-url URL] [--epochs N]
        [--batch-size N] [--steps N] [--size N] [--classes N]
        [--cache-dir DIR] [--decode-threads N] [--lr LR] SOURCE...

SOURCE: s3:// URLs, brace patterns, prefixes ending in '/', or local paths
(credentials and the endpoint also come from the usual AWS variables).

With a GPU (torch.cuda.is_available()), the loader copies each batch to the
GPU and normalises it there: the step reads ``batch.normalized`` (float32
NCHW on the device, ordered after the loader's copy on the current stream)
and runs in bfloat16 autocast; defaults 224x224, batch 128. Without one, the
step runs on the CPU on 64x64 crops in batches of 16, so that a few dozen
steps take seconds. Under torchrun (WORLD_SIZE > 1) the model is wrapped in
DistributedDataParallel and each rank's loader reads its own shards.

Prints, per epoch, images/s of the training loop and the mean loss, then a
summary of the loader's counters (Loader.stats()). Exits 1 when the loader
fails (the message names the shard, the sample and the byte offset).
"""
import argparse
import os
import sys
import time

import torch
import torchvision

import shardfeed
from shardfeed.torch import to_tensors


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sources", nargs="+", help="shards: s3:// URLs, patterns, prefixes, paths")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=0, help="default 128 on a GPU, 16 on CPU")
    p.add_argument("--steps", type=int, default=0, help="stop after N steps (0: all epochs)")
    p.add_argument("--size", type=int, default=0, help="crop size; default 224 on a GPU, 64 on CPU")
    p.add_argument("--classes", type=int, default=1000, help="outputs of the classifier")
    p.add_argument("--cache-dir", default=None, help="shardfeed's disk cache")
    p.add_argument("--decode-threads", type=int, default=0, help="default: the cores")
    p.add_argument("--lr", type=float, default=0.0,
                   help="SGD learning rate (default 0.1 x batch size / 256)")
    a = p.parse_args()
    if a.epochs < 1 or a.batch_size < 0 or a.steps < 0 or a.size < 0 or a.classes < 1 or a.lr < 0:
        p.error("--epochs and --classes must be >= 1; --batch-size, --steps, --size, --lr >= 0")
    return a


def main():
    args = parse_args()
    cuda = torch.cuda.is_available()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # torchrun: the loader takes rank and world size from the process group
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    size = args.size or (224 if cuda else 64)
    batch_size = args.batch_size or (128 if cuda else 16)

    loader = shardfeed.Loader(
        args.sources, endpoint_url=args.endpoint_url, cache_dir=args.cache_dir,
        batch_size=batch_size, size=size, decode_threads=args.decode_threads or None,
        device="cuda" if cuda and shardfeed.cuda_compiled else "host")

    model = torchvision.models.resnet18(num_classes=args.classes).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local_rank] if cuda else None)
    lr = args.lr or 0.1 * batch_size / 256  # the linear scaling rule
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-5)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-1)  # -1: a sample without a label
    # For host batches: the loader's default normalisation, done here.
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    where = f"GPU {torch.cuda.get_device_name(device)}" if cuda else "CPU"
    print(f"train_torch: ResNet-18 on the {where}, {size}x{size} crops, batch {batch_size}, "
          f"{len(loader.shards)} shards, {len(loader)} batches an epoch"
          f"{'' if loader.epoch_size_known else ' (estimated)'}", flush=True)

    steps = 0
    t_start = time.perf_counter()
    images_all = 0
    try:
        with loader:
            for epoch in range(args.epochs):
                loader.set_epoch(epoch)
                t0, images, loss_n = time.perf_counter(), 0, 0
                loss_sum = torch.zeros((), device=device)  # summed on the device: no sync a step
                for batch in loader:
                    # uint8 images and int64 labels on `device`: views of the loader's
                    # ring where they already are there (always for the images here)
                    x, y = to_tensors(batch, device)
                    if batch.normalized is not None:
                        x = torch.from_dlpack(batch.normalized)  # float32, normalised on the GPU
                    else:
                        x = (x.float() - mean) / std
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                        loss = loss_fn(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    batch.release()  # the slot returns once x and y are freed too
                    loss_sum += loss.detach()
                    loss_n += 1
                    images += len(y)
                    steps += 1
                    if args.steps and steps >= args.steps:
                        break
                if cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                images_all += images
                print(f"epoch {epoch}: {images} images in {dt:.2f} s, {images / dt:.1f} images/s, "
                      f"mean loss {loss_sum.item() / max(loss_n, 1):.3f}", flush=True)
                if args.steps and steps >= args.steps:
                    break
            s = loader.stats()
    except shardfeed.Error as e:
        print(f"train_torch: {e}", file=sys.stderr)
        return 1
    dt = time.perf_counter() - t_start
    print(f"train_torch: {images_all} images, {steps} steps in {dt:.2f} s "
          f"({images_all / dt:.1f} images/s)")
    wait = s["consumer_wait_s"] / s["elapsed_s"] if s["elapsed_s"] > 0 else 0.0
    print(f"loader: {s['samples_delivered']} samples in {s['batches_delivered']} batches, "
          f"waited for data {100 * wait:.1f} % of the time; decode {s['decode_per_s']:.0f} "
          f"images/s with {s['decode_threads']} threads; {s['shards_opened']} shards opened, "
          f"cache hits {s['cache_hits']} misses {s['cache_misses']}, "
          f"{s['bytes_fetched'] / 1048576:.1f} MiB fetched, {s['retries']} retries, "
          f"{s['samples_skipped']} skipped, on the GPU: {s['on_device']}")
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
