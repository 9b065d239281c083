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

PHOTOS= PER_PHOTO=150 ROUNDS=3 SHARD_SIZE=32M BUILD_DIR=
bench_options --photos=PHOTOS --per-photo=PER_PHOTO --rounds=ROUNDS --shard-size=SHARD_SIZE \
  --build-dir=BUILD_DIR -- "$@"
bench_photos_setup sf-loader-bench "$PER_PHOTO" shardfeed shardfeed-mock-s3 bench_loader
BL=$BUILD_DIR/bench_loader
mkdir -p "$TMP/root/bench"
"$SF" pack "$PHOTOS" "$TMP/root/bench/train/" --shard-size "$SHARD_SIZE" --no-progress >&2

mock_start "$MOCK" "$TMP/mock.out" --root "$TMP/root"
mock_env
SRC=s3://bench/train/

echo "== 1. warm cache vs decode limit"
"$BL" --rounds "$ROUNDS" --endpoint-url "$URL" --cache-dir "$TMP/cache-warm" "$SRC"

echo "== 2. cold vs warm cache (shardfeed load, medians of $ROUNDS)"
cold=() warm=()
for ((r = 0; r < ROUNDS; r++)); do
  rm -rf "$TMP/cache"
  c=$("$SF" load "$SRC" --endpoint-url "$URL" --cache-dir "$TMP/cache" --device host \
        --seed "$r" --json | json_field images_per_s)
  w=$("$SF" load "$SRC" --endpoint-url "$URL" --cache-dir "$TMP/cache" --device host \
        --seed "$r" --json | json_field images_per_s)
  printf '  round %d: cold %.1f images/s, warm %.1f images/s\n' "$r" "$c" "$w"
  cold+=("$c") warm+=("$w")
done
mc=$(median "${cold[@]}") mw=$(median "${warm[@]}")
printf 'cold %.1f images/s, warm %.1f images/s: cold/warm %.2f (target >= 0.9)\n' \
  "$mc" "$mw" "$(python3 -c "print($mc / $mw)")"
