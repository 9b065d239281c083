#!/usr/bin/env bash
# Default settings against the best --concurrency x --chunk-size point over an
# S3-like link (issue 16): `shardfeed get` from a shardfeed-mock-s3 that adds a
# latency to every answer and caps every connection's bandwidth.
#
# Usage: bash bench/link_grid.sh [--objects N] [--size-mib M] [--rounds R]
#          [--fault SPEC] [--conc "4 16 64"] [--chunk "1M 8M 32M"] [--build-dir DIR]
#
# N objects of M MiB (8 x 32) of random data in /dev/shm (else /tmp), one mock
# with --fault SPEC (default latency_ms=20,bandwidth=80M: 20 ms before each
# answer, 80 MiB/s per connection; docs/mock-server.md). Configurations:
#   default     shardfeed get --endpoint-url URL 's3://bench/obj-{00..NN}.bin' -o OUT/
#   cC/S        the same with --concurrency C --chunk-size S, for every C and S
# Every configuration runs once unmeasured (sha256 of every output), then R
# rounds, each running every configuration once in an order rotating by one,
# outputs deleted between runs. Prints per configuration the median wall s and
# MiB/s, the best grid point, and default's MiB/s as a share of the best's
# (target >= 0.90). Exits 1 when a run fails or writes wrong bytes, 2 on setup
# errors.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

OBJECTS=8 SIZE_MIB=32 ROUNDS=3
FAULT=latency_ms=20,bandwidth=80M
GRID_CONC="4 16 64" GRID_CHUNK="1M 8M 32M"
BUILD_DIR=
bench_options --objects=OBJECTS --size-mib=SIZE_MIB --rounds=ROUNDS --fault=FAULT --conc=GRID_CONC \
  --chunk=GRID_CHUNK --build-dir=BUILD_DIR -- "$@"
bench_positive OBJECTS SIZE_MIB ROUNDS
((OBJECTS <= 100)) || { echo "at most 100 objects" >&2; exit 2; }
bench_build shardfeed shardfeed-mock-s3

TMP=$(roomy_tmp sf-bench-link $((OBJECTS * SIZE_MIB * 1024 * 2 + 64 * 1024)))
bench_cleanup_on_exit "$TMP"

mkdir -p "$TMP/root/bench" "$TMP/out"
random_objects "$TMP/root/bench" "$OBJECTS" "$SIZE_MIB" "$TMP/SUMS"
mock_start "$MOCK" "$TMP/mock.out" --root "$TMP/root" --quiet --fault "$FAULT"
mock_env
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
if ((OBJECTS == 1)); then SRC=s3://bench/${NAMES[0]}
else SRC="s3://bench/obj-{00..$(printf '%02d' $((OBJECTS - 1)))}.bin"; fi

CONFIGS=(default)
for c in $GRID_CONC; do for s in $GRID_CHUNK; do CONFIGS+=("c$c/$s"); done; done
# run CONFIG FULL: sets WALL; FULL=1 checks sha256 of every output
run() {
  local opts=()
  if [[ $1 != default ]]; then
    local c=${1%%/*} s=${1#*/}
    opts=(--concurrency "${c#c}" --chunk-size "$s")
  fi
  rm -rf "$TMP/out"; mkdir -p "$TMP/out"
  local t0=$EPOCHREALTIME
  "$SF" get --endpoint-url "$URL" ${opts[@]+"${opts[@]}"} "$SRC" -o "$TMP/out/" \
    </dev/null >/dev/null 2>"$TMP/err" || { echo "$1 failed:" >&2; tail -n 20 "$TMP/err" >&2; exit 1; }
  WALL=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }')
  check_outputs "$1" "$TMP/out" "$OBJECTS" "$TMP/SUMS" "$2"
}

MIB=$((OBJECTS * SIZE_MIB))
echo "$OBJECTS objects x $SIZE_MIB MiB, mock --fault $FAULT, $ROUNDS rounds, $(nproc) CPUs, files in $(dirname "$TMP")"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for c in "${CONFIGS[@]}"; do run "$c" 1; done
echo "verified all ${#CONFIGS[@]} configurations (sha256)"
declare -A WALLS
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#CONFIGS[@]}; k++)); do
    c=${CONFIGS[(k + r) % ${#CONFIGS[@]}]}
    run "$c" 0
    WALLS[$c]+="$WALL "
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %8s %8s\n' config "wall s" "MiB/s"
best='' best_w=''
declare -A MED
for c in "${CONFIGS[@]}"; do
  MED[$c]=$(median "${WALLS[$c]}")
  printf '%-12s %8.3f %8.0f   (%s)\n' "$c" "${MED[$c]}" "$(awk -v m=$MIB -v w="${MED[$c]}" 'BEGIN { print m / w }')" "${WALLS[$c]% }"
  [[ $c == default ]] && continue
  if [[ -z $best ]] || awk -v a="${MED[$c]}" -v b="$best_w" 'BEGIN { exit !(a < b) }'; then
    best=$c best_w=${MED[$c]}
  fi
done
printf 'best grid point: %s (%.0f MiB/s); default = %.2f of it (target >= 0.90)\n' "$best" \
  "$(awk -v m=$MIB -v w="$best_w" 'BEGIN { print m / w }')" \
  "$(awk -v a="$best_w" -v b="${MED[default]}" 'BEGIN { print a / b }')"
