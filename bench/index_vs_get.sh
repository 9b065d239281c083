#!/usr/bin/env bash
# `shardfeed index` against `shardfeed get` of the same shards, in one run.
#
# Usage: bash bench/index_vs_get.sh [--shards N] [--size-mib M] [--rounds R]
#          [--parallel P] [--window SIZE] [--build-dir DIR]
#
# N GNU tar shards of about M MiB (samples of ~110 KiB random bytes plus a
# label, written by the system tar, no index.json) are served by one
# shardfeed-mock-s3 from a temp dir (/dev/shm when it has room, else /tmp).
# Each round runs, in alternating order:
#   get    shardfeed get 's3://bench/shard-{000..N-1}.tar' -o OUTDIR/   (then deleted)
#   index  shardfeed index 's3://bench/shard-{000..N-1}.tar' --dry-run  (stdout discarded)
# with the same --concurrency and --chunk-size. index reads every byte once
# (hash + parse) and writes nothing; get writes every byte to OUTDIR. Prints
# the median MiB/s of each and the ratio index/get (1.0: indexing runs at the
# speed of downloading). Before the rounds, index's sample count is checked
# against the files written. Exits 0 unless setup failed (2) or a run failed (1).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bench_env SHARDS=16 SIZE_MIB=64 ROUNDS=5 PARALLEL=8 WINDOW=8M CONC:SF_BENCH_CONCURRENCY=16 \
  CHUNK=8M BUILD_DIR=

bench_options --shards=SHARDS --size-mib=SIZE_MIB --rounds=ROUNDS --parallel=PARALLEL \
  --window=WINDOW --build-dir=BUILD_DIR -- "$@"
bench_build shardfeed shardfeed-mock-s3
command -v tar >/dev/null || { echo "tar not found" >&2; exit 2; }

work=$(roomy_tmp sf-index-bench $((SHARDS * SIZE_MIB * 1024 * 3)))
bench_cleanup_on_exit "$work"
echo "data in $work ($SHARDS shards of ~$SIZE_MIB MiB)"

mkdir -p "$work/root/bench" "$work/files"
per_shard=$(( SIZE_MIB * 1024 / 110 ))
for ((s = 0; s < SHARDS; s++)); do
  rm -rf "$work/files"/*
  for ((i = 0; i < per_shard; i++)); do
    key=$(printf 's%03d_%05d' "$s" "$i")
    head -c $(( 100000 + (i * 7919) % 20000 )) /dev/urandom > "$work/files/$key.jpg"
    printf '%d' $(( i % 10 )) > "$work/files/$key.cls"
  done
  (cd "$work/files" && tar --format=gnu --sort=name -cf "$work/root/bench/$(printf 'shard-%03d.tar' "$s")" .)
done
rm -rf "$work/files"
total_samples=$(( SHARDS * per_shard ))
bytes=$(du -cb "$work/root/bench"/*.tar | tail -1 | cut -f1)

mock_start "$MOCK" "$work/mock.out" --root "$work/root" --anonymous --quiet
url=$URL
mock_env
pattern="s3://bench/shard-{000..$(printf '%03d' $((SHARDS - 1)))}.tar"
common=(--endpoint-url "$url" --concurrency "$CONC" --chunk-size "$CHUNK")

# check once: every sample counted
got=$("$SF" index "$pattern" "${common[@]}" --dry-run --no-progress | grep -o '"sample_count":[^,]*' | tr -dc 0-9)
[[ $got == "$total_samples" ]] || { echo "index counted $got samples, expected $total_samples" >&2; exit 1; }

run_get() {
  local t0 t1
  t0=$(date +%s.%N)
  "$SF" get "$pattern" "${common[@]}" -o "$work/out/" > /dev/null || return 1
  t1=$(date +%s.%N)
  rm -rf "$work/out"
  echo "$t0 $t1" | awk -v b="$bytes" '{printf "%.1f\n", b / 1048576 / ($2 - $1)}'
}
run_index() {
  local t0 t1
  t0=$(date +%s.%N)
  "$SF" index "$pattern" "${common[@]}" --dry-run --no-progress --parallel "$PARALLEL" \
    --window "$WINDOW" > /dev/null || return 1
  t1=$(date +%s.%N)
  echo "$t0 $t1" | awk -v b="$bytes" '{printf "%.1f\n", b / 1048576 / ($2 - $1)}'
}

run_get > /dev/null || { echo "get failed" >&2; exit 1; }   # warm-up
gets=() idxs=()
for ((r = 0; r < ROUNDS; r++)); do
  if (( r % 2 == 0 )); then
    g=$(run_get) || { echo "get failed" >&2; exit 1; }
    x=$(run_index) || { echo "index failed" >&2; exit 1; }
  else
    x=$(run_index) || { echo "index failed" >&2; exit 1; }
    g=$(run_get) || { echo "get failed" >&2; exit 1; }
  fi
  gets+=("$g") idxs+=("$x")
  echo "round $((r + 1)): get $g MiB/s, index $x MiB/s"
done
mg=$(median "${gets[@]}")
mi=$(median "${idxs[@]}")
printf '\n%-8s %12s\n' tool 'MiB/s (median)'
printf '%-8s %12s\n' get "$mg" index "$mi"
awk -v i="$mi" -v g="$mg" 'BEGIN {printf "ratio index/get: %.2f\n", i / g}'
