"""The Python package on a CUDA device (scripts/device-check.sh): batches on the
device equal the host path byte for byte, the normalised floats equal torch's,
tensors are views of the ring, a side stream waits on the copy; then images/s
of host and device batches."""
import sys, time
import numpy as np
import torch
import shardfeed
from shardfeed.torch import to_tensors

S = sys.argv[1]
dev = torch.device("cuda", 0)
print("cuda_compiled", shardfeed.cuda_compiled, torch.cuda.get_device_name(0), flush=True)
opts = dict(batch_size=64, size=64, seed=3, decode_threads=4)
host = []
with shardfeed.Loader([S], device="host", **opts) as L:
    for b in L:
        x, y = to_tensors(b, torch.device("cpu"))
        host.append((x.clone(), y.clone()))
        del x, y
        b.release()
mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
side = torch.cuda.Stream()
got, worst, same_ptr = 0, 0.0, 0
with shardfeed.Loader([S], device="cuda", **opts) as L:
    for i, b in enumerate(L):
        assert b.on_device, "not on device"
        assert b.images.__dlpack_device__() == (2, 0), b.images.__dlpack_device__()
        if i % 2:
            with torch.cuda.stream(side):  # __dlpack__(stream=side): side waits on the copy event
                x = torch.from_dlpack(b.images)
                xs = x.float().sum()
            torch.cuda.current_stream().wait_stream(side)
        x, y = to_tensors(b, dev)
        x2 = torch.from_dlpack(b.images)
        same_ptr += x.data_ptr() == x2.data_ptr()
        hx, hy = host[i]
        assert torch.equal(x.cpu(), hx), f"batch {i}: device images differ from host"
        assert torch.equal(y.cpu(), hy), f"batch {i}: labels differ"
        nz = torch.from_dlpack(b.normalized)
        assert nz.is_cuda and nz.dtype == torch.float32
        ref = (x.float() - mean) / std
        worst = max(worst, (nz - ref).abs().max().item())
        got += len(b)
        del x, x2, nz, ref
        b.release()
print(f"cuda batches: {len(host)} batches, {got} images equal to the host path byte for byte; "
      f"normalized vs torch max abs diff {worst:.2e}; zero-copy views {same_ptr}/{len(host)}",
      flush=True)
assert got == sum(len(h[1]) for h in host) and worst < 1e-4
# speed: host batches + torch copy vs device batches, one epoch each, 224 crops
for d in ("host", "cuda"):
    with shardfeed.Loader([S], device=d, batch_size=128, size=224, seed=1) as L:
        t0, n = time.perf_counter(), 0
        for b in L:
            x, y = to_tensors(b, dev)
            x = torch.from_dlpack(b.normalized) if b.normalized is not None else (x.float() - mean) / std
            n += len(b)
            del x, y
            b.release()
        torch.cuda.synchronize()
        print(f"device={d}: {n / (time.perf_counter() - t0):.0f} images/s (epoch incl. start)", flush=True)
print("pycheck ok")
