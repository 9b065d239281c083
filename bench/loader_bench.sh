#!/usr/bin/env bash
# The loader's own speed targets, in one run on one dataset of real photos:
#
#  1. warm cache vs the decode limit: bench_loader reads every JPEG of the
#     shards, times a single-thread full-decode loop (tjDecompress2), and an
#     epoch of the loader (RandomResizedCrop 224, uint8 CHW, host batches,
#     decode threads = cores) from a warm disk cache on the mock server.
#     Target: loader >= 0.8 x (single-thread decode x threads).
#  2. cold vs warm: `shardfeed load` over the mock with an empty cache
#     directory (every shard fetched with ranged GETs while it is parsed and
#     decoded), then the same run again from the now warm cache. Medians of R
#     rounds (the cache is emptied before each cold run). Target: cold/warm
#     >= 0.9.
#
# Usage: bash bench/loader_bench.sh [--photos DIR | --per-photo N] [--rounds R]
#          [--build-dir DIR] [--shard-size SIZE]
#   --photos DIR     an ImageFolder of JPEGs to use (default: made by
#                    scripts/make-sample-dataset.sh from mate-backgrounds)
#   --per-photo N    images cut per source photo when making it (default 150)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PHOTOS=
PER_PHOTO=150
ROUNDS=3
SHARD_SIZE=32M
BUILD_DIR=
while [[ $# -gt 0 ]]; do
  case $1 in
    --photos) PHOTOS=$2; shift 2 ;;
    --per-photo) PER_PHOTO=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --shard-size) SHARD_SIZE=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    *) sed -n '18,22p' "$0" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$HERE/build}
SF=$BUILD_DIR/shardfeed MOCK=$BUILD_DIR/shardfeed-mock-s3 BL=$BUILD_DIR/bench_loader
for b in "$SF" "$MOCK" "$BL"; do
  [[ -x $b ]] || { echo "missing $b: build first (cmake --build build)" >&2; exit 2; }
done

TMP=$(mktemp -d /tmp/sf-loader-bench.XXXXXX)
MOCK_PID=
cleanup() { [[ -n $MOCK_PID ]] && kill "$MOCK_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

sample_photos PHOTOS "$TMP" "$PER_PHOTO" "$BUILD_DIR"
mkdir -p "$TMP/root/bench"
"$SF" pack "$PHOTOS" "$TMP/root/bench/train/" --shard-size "$SHARD_SIZE" --no-progress >&2

mock_start "$MOCK" "$TMP/mock.out" --root "$TMP/root"
mock_env
SRC=s3://bench/train/

echo "== 1. warm cache vs decode limit"
"$BL" --rounds "$ROUNDS" --endpoint-url "$URL" --cache-dir "$TMP/cache-warm" "$SRC"

echo "== 2. cold vs warm cache (shardfeed load, medians of $ROUNDS)"
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
cold=() warm=()
for ((r = 0; r < ROUNDS; r++)); do
  rm -rf "$TMP/cache"
  c=$("$SF" load "$SRC" --endpoint-url "$URL" --cache-dir "$TMP/cache" --device host \
        --seed "$r" --json | field images_per_s)
  w=$("$SF" load "$SRC" --endpoint-url "$URL" --cache-dir "$TMP/cache" --device host \
        --seed "$r" --json | field images_per_s)
  printf '  round %d: cold %.1f images/s, warm %.1f images/s\n' "$r" "$c" "$w"
  cold+=("$c") warm+=("$w")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mc=$(median "${cold[@]}") mw=$(median "${warm[@]}")
printf 'cold %.1f images/s, warm %.1f images/s: cold/warm %.2f (target >= 0.9)\n' \
  "$mc" "$mw" "$(python3 -c "print($mc / $mw)")"
