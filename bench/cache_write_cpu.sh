#!/usr/bin/env bash
# CPU cost of the disk cache's write path, build against build.
#
# Usage: bash bench/cache_write_cpu.sh --shards DIR [--rounds R] [--cache-parent DIR]
#          BUILD_DIR [BUILD_DIR...]
#
# Serves the files of DIR (e.g. tar shards) from one shardfeed-mock-s3 and, each
# round, for each build in turn (the order rotates), runs `shardfeed warm-cache`
# of all of them into an empty cache directory under --cache-parent (default
# /tmp, a disk) with the defaults (concurrency 32, chunk 8M), then `sync`.
# Reports per build the medians of the client's CPU time (user + sys, from
# /usr/bin/time) and of the wall time; each run's entries are checked with
# `shardfeed cache verify`. On a shared machine CPU time is the steadier
# measure: it leaves out the mock server and other jobs, and counts what the
# write path costs the process that also has to decode.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SHARDS= ROUNDS=7 CACHE_PARENT=/tmp BUILDS=()
bench_options --shards=SHARDS --rounds=ROUNDS --cache-parent=CACHE_PARENT @BUILDS -- "$@"
[[ -n $SHARDS && ${#BUILDS[@]} -gt 0 ]] || bench_usage
for b in "${BUILDS[@]}"; do
  [[ -x $b/shardfeed ]] || { echo "missing $b/shardfeed" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time)" >&2; exit 2; }

TMP=$(mktemp -d /tmp/sf-write-bench.XXXXXX)
CACHES=$(mktemp -d "$CACHE_PARENT/sf-write-cache.XXXXXX")
bench_cleanup_on_exit "$TMP" "$CACHES"
mkdir -p "$TMP/root/bench/d"
cp -l "$SHARDS"/* "$TMP/root/bench/d/" 2>/dev/null || cp "$SHARDS"/* "$TMP/root/bench/d/"
mock_start "${BUILDS[0]}/shardfeed-mock-s3" "$TMP/mock.out" --root "$TMP/root" --quiet
mock_env
MIB=$(du -smL "$TMP/root/bench/d" | cut -f1)

declare -A CPU WALL
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#BUILDS[@]}; k++)); do
    i=$(( (k + r) % ${#BUILDS[@]} ))
    b=${BUILDS[$i]}
    rm -rf "$CACHES/c"; sync
    t0=$EPOCHREALTIME
    /usr/bin/time -f '%U %S' -o "$TMP/cpu" "$b/shardfeed" warm-cache s3://bench/d/ \
      --endpoint-url "$URL" --cache-dir "$CACHES/c" --progress off >"$TMP/warm.log" 2>&1 ||
      { echo "warm-cache failed ($b)" >&2; cat "$TMP/warm.log" >&2; exit 1; }
    wall=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')
    cpu=$(awk '{ printf "%.3f", $1 + $2 }' "$TMP/cpu")
    "$b/shardfeed" cache verify --cache-dir "$CACHES/c" >"$TMP/verify.log" 2>&1 ||
      { echo "bad entries ($b)" >&2; cat "$TMP/verify.log" >&2; exit 1; }
    printf '  round %d %s: cpu %s s, wall %s s\n' "$r" "$b" "$cpu" "$wall"
    CPU[$i]+=" $cpu" WALL[$i]+=" $wall"
  done
done
echo "$MIB MiB into $CACHE_PARENT, $ROUNDS rounds, $(nproc) CPUs, medians:"
for ((i = 0; i < ${#BUILDS[@]}; i++)); do
  # shellcheck disable=SC2086
  c=$(median ${CPU[$i]}) w=$(median ${WALL[$i]})
  printf '%s: client CPU %.3f s (%.2f ms/MiB), wall %.3f s (%.0f MiB/s)\n' "${BUILDS[$i]}" "$c" \
    "$(awk -v c="$c" -v m="$MIB" 'BEGIN { print c * 1000 / m }')" "$w" \
    "$(awk -v w="$w" -v m="$MIB" 'BEGIN { print m / w }')"
done
