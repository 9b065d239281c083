#!/usr/bin/env bash
# The shardfeed demo: the main job on a sample dataset of real photographs.
#
#  1. builds everything;
#  2. cuts ImageNet-like JPEGs (about 100 KB each, 12 classes) from the
#     photographs of Debian's mate-backgrounds package
#     (scripts/make-sample-dataset.sh);
#  3. starts the local S3 server (shardfeed-mock-s3) and packs the photos
#     into WebDataset tar shards in a bucket with `shardfeed pack ... s3://`;
#  4. warms the local cache with `warm-cache`;
#  5. runs examples/train_loop: the loader decodes RandomResizedCrop 224x224
#     batches (GPU copy + normalise kernel when there is a GPU, host batches
#     otherwise) and a tiny classifier learns the classes from them;
#  6. examples/train_torch.py: the same batches from Python (shardfeed.Loader)
#     train a torchvision ResNet-18 for a few dozen steps (skipped, saying
#     so, when python3 cannot import torch and torchvision);
#  7. `shardfeed load` reports images/s, the consumer's wait share and the
#     per-stage rates of the same job.
#
# Usage: scripts/demo.sh [--per-photo N] [--device D]
#   --per-photo N   default 100: 1,200 images
#   --device D      step 7's device: auto (default), host, cuda, emulated
set -euo pipefail
cd "$(dirname "$0")/.."

PER_PHOTO=100
DEVICE=auto
while [[ $# -gt 0 ]]; do
  case $1 in
    --per-photo) PER_PHOTO=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    *) sed -n '/^# Usage: /,/^set /{/^set /d;s/^# Usage: /usage: /;s/^# //;p}' "$0" >&2; exit 2 ;;
  esac
done

jobs=$(nproc 2>/dev/null || echo 2)
echo "== building"
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$jobs" >/dev/null

work=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== making the sample dataset from Debian's mate-backgrounds photographs"
./scripts/make-sample-dataset.sh "$work/photos" --per-photo "$PER_PHOTO" --build-dir build

AK=demo-access-key
SK=demo-secret-key
mkdir -p "$work/root/demo"
./build/shardfeed-mock-s3 --root "$work/root" --port 0 --access-key "$AK" --secret-key "$SK" \
  --quiet >"$work/server.out" &
server_pid=$!
for _ in $(seq 100); do grep -q listening "$work/server.out" 2>/dev/null && break; sleep 0.05; done
url=$(sed -n 's/^listening on //p' "$work/server.out")
echo "== shardfeed-mock-s3 $(head -n1 "$work/server.out")"
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK AWS_REGION=us-east-1
export AWS_ENDPOINT_URL=$url AWS_CONFIG_FILE=$work/aws-config
export AWS_SHARED_CREDENTIALS_FILE=$work/aws-credentials
: >"$AWS_CONFIG_FILE"
: >"$AWS_SHARED_CREDENTIALS_FILE"
cache=$work/cache

echo
echo "== shardfeed pack $work/photos s3://demo/train/ --shard-size 16M"
./build/shardfeed pack "$work/photos" s3://demo/train/ --shard-size 16M --no-progress
./build/shardfeed ls s3://demo/train/

echo
echo "== warm-cache s3://demo/train/ (parallel ranged GETs into $cache)"
./build/warm-cache s3://demo/train/ --cache-dir "$cache" --progress off

echo
echo "== train_loop: 3 epochs of RandomResizedCrop 224 batches of 64 from the warm cache"
./build/train_loop --epochs 3 --batch-size 64 --cache-dir "$cache" s3://demo/train/

echo
if ! PYTHONPATH=build/python python3 -c 'import shardfeed' 2>/dev/null; then
  echo "== examples/train_torch.py skipped: this build has no shardfeed Python package" \
    "(python3 headers missing: install python3-dev)"
elif ! python3 -c 'import torch, torchvision' 2>/dev/null; then
  echo "== examples/train_torch.py skipped: python3 cannot import torch and torchvision" \
    "(pip install torch torchvision)"
else
  echo "== train_torch.py: a torchvision ResNet-18 fed by shardfeed.Loader from Python (40 steps)"
  PYTHONPATH=build/python python3 examples/train_torch.py --endpoint-url "$url" \
    --cache-dir "$cache" --epochs 2 --steps 40 --classes 12 s3://demo/train/
fi

echo
echo "== shardfeed load: the same pipeline, measured (2 epochs, a 20 ms training step per batch)"
./build/shardfeed load s3://demo/train/ --cache-dir "$cache" --batch-size 64 --epochs 2 \
  --step-ms 20 --device "$DEVICE"
