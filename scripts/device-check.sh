#!/usr/bin/env bash
# The GPU checks on a lent machine, from the bundle of scripts/device-bundle.sh
# (docs/gpu.md, "On a lent GPU machine"), in the repository root there:
#   bash .dev/device-check.sh     (about 90 s on an H100 with 16 cores)
# The CUDA ring's suites and the loader's GPU delivery on CUDA, compute-
# sanitizer over the CUDA ring against the emulated device, a 3,000-photo
# dataset, shardfeed load on host and device, bench_gpu_h2d, the Python
# package on the device (device_check.py), examples/train_torch.py, and the
# cold/warm epoch bench with 2 decode threads. Binaries compiled into
# /work/main/build paths: /work/main points at this tree.
set -u
R=$PWD
export LD_LIBRARY_PATH=$R/.dev/lib:$R/.dev/build
mkdir -p /work; [ -e /work/main ] || ln -s "$R" /work/main
rm -rf "$R/build"; ln -s "$R/.dev/build" "$R/build"
B=$R/build
log() { echo; echo "=== $(date +%T) $*"; }
nvidia-smi -L; nproc
log gpu_diff cuda: the CUDA ring against the emulated device, bit for bit
timeout 90 "$B/tests/gpu_diff" cuda 2>&1 | tail -2; echo "rc=${PIPESTATUS[0]}"
export SF_TEST_GPU_BACKEND=cuda
log test_gpu on CUDA
timeout 150 "$B/tests/test_gpu" --jobs 1 2>&1 | grep -v "^\[----\]" | tail -12; echo "rc=${PIPESTATUS[0]}"
log test_loader gpu on CUDA
timeout 120 "$B/tests/test_loader" --jobs 1 --filter 'loader/gpu*' 2>&1 | grep -v "^\[----\]" | tail -12; echo "rc=${PIPESTATUS[0]}"
unset SF_TEST_GPU_BACKEND
for tool in memcheck racecheck synccheck initcheck; do
  log compute-sanitizer $tool gpu_diff
  extra=()
  [ $tool = memcheck ] && extra=(--leak-check full)
  timeout 90 compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 99 "$B/tests/gpu_diff" cuda 2>&1 |
    tail -2
  echo "rc=${PIPESTATUS[0]}"
done
log dataset
timeout 120 bash scripts/make-sample-dataset.sh /tmp/photos --force --per-photo 250 --photos "$R/.dev/photos" 2>&1 | tail -2
timeout 60 "$B/shardfeed" pack /tmp/photos /tmp/S --format tar --shard-size 32M --no-progress 2>&1 | tail -2
log load host vs cuda
for d in host cuda; do timeout 60 "$B/shardfeed" load /tmp/S --device $d --epochs 2 2>&1 | tail -3; done
log bench_gpu_h2d
timeout 90 "$B/bench_gpu_h2d" --rounds 20 /tmp/S 2>&1 | tail -12
log python on CUDA
PYTHONPATH=$B/python PYTHONUNBUFFERED=1 timeout 150 python3 .dev/device_check.py /tmp/S 2>&1 | tail -8
log train_torch
PYTHONPATH=$B/python PYTHONUNBUFFERED=1 timeout 90 python3 examples/train_torch.py /tmp/S --epochs 1 --steps 30 --classes 12 2>&1 | tail -5
log cold vs warm, 2 decode threads
timeout 200 bash bench/cold_vs_warm.sh --shards /tmp/S --rounds 3 --build-dir "$B" -- --decode-threads 2 2>&1 | tail -9
log done
