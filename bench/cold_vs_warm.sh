#!/usr/bin/env bash
# Cold vs warm epochs through the disk cache, and RAM-only streaming, in one run.
#
# Usage: bash bench/cold_vs_warm.sh [--photos DIR | --shards DIR] [--rounds R]
#          [--build-dir DIR] [--baseline-build-dir DIR] [--shard-size SIZE]
#          [--cache-parent DIR] [-- LOAD_FLAGS...]
#   --photos DIR     an ImageFolder of JPEGs, packed into tar shards first
#                    (default: scripts/make-sample-dataset.sh --per-photo 300)
#   --shards DIR     tar shards already packed (served as s3://bench/train/)
#   --baseline-build-dir DIR   a second build (e.g. the code before a change),
#                    run in the same rounds, interleaved, for a before/after
#   --cache-parent DIR   where the cache directories go (default /tmp: a disk,
#                    as on a training node; /dev/shm takes the disk out)
#   LOAD_FLAGS       extra `shardfeed load` flags for every run
#
# Each round, for each build: `shardfeed load --device host --json` with an
# empty cache directory (cold: every shard fetched from the mock with ranged
# GETs, written to the cache, parsed and decoded as it arrives), the same run
# again on the now warm cache, and a RAM-only run (--ram-only: streamed into
# memory, no cache). An unmeasured cold run comes first. Prints per-round
# images/s, first_batch_s and the loader's CPU time (user + sys), then the
# medians and the ratios cold/warm and ram-only/warm (target: cold/warm >=
# 0.95) per build, whole epochs and after the first batch (images/s once the
# first batch is out: the start-up latency left out, as in a long epoch).
# Ratios compare runs of the same build in the same rounds.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PHOTOS= SHARDS= ROUNDS=5 SHARD_SIZE=64M BUILD_DIR= BASE_DIR= CACHE_PARENT=/tmp
EXTRA=()
bench_options --photos=PHOTOS --shards=SHARDS --rounds=ROUNDS --shard-size=SHARD_SIZE \
  --build-dir=BUILD_DIR --baseline-build-dir=BASE_DIR --cache-parent=CACHE_PARENT @EXTRA -- "$@"
[[ -z $BASE_DIR ]] || BUILD_DIR=$BASE_DIR bench_build shardfeed shardfeed-mock-s3
bench_build shardfeed shardfeed-mock-s3 # after the baseline's: SF is this build's
BUILDS=("$BUILD_DIR" ${BASE_DIR:+"$BASE_DIR"})

TMP=$(mktemp -d /tmp/sf-cold-bench.XXXXXX)
CACHES=$(mktemp -d "$CACHE_PARENT/sf-cold-cache.XXXXXX")
bench_cleanup_on_exit "$TMP" "$CACHES"

mkdir -p "$TMP/root/bench"
if [[ -n $SHARDS ]]; then
  mkdir -p "$TMP/root/bench/train"   # the mock does not follow symlinks: link or copy the files
  cp -l "$SHARDS"/* "$TMP/root/bench/train/" 2>/dev/null || cp "$SHARDS"/* "$TMP/root/bench/train/"
else
  if [[ -z $PHOTOS ]]; then
    PHOTOS=$TMP/photos
    bash "$REPO/scripts/make-sample-dataset.sh" "$PHOTOS" --per-photo 300 --build-dir "$BUILD_DIR" >&2
  fi
  "$SF" pack "$PHOTOS" "$TMP/root/bench/train/" --shard-size "$SHARD_SIZE" --no-progress >&2
fi

mock_start "$BUILD_DIR/shardfeed-mock-s3" "$TMP/mock.out" --root "$TMP/root" --quiet
mock_env
SRC=s3://bench/train/

TIME=$(command -v /usr/bin/time || true)
load() {  # BUILD CACHE_FLAGS... -> "images_per_s first_batch_s cpu_s steady_images_per_s"
  local b=$1; shift
  local cmd=("$b/shardfeed" load "$SRC" --endpoint-url "$URL" --device host --seed 1 --json "$@"
             ${EXTRA[@]+"${EXTRA[@]}"})
  echo 0 0 >"$TMP/cpu"
  if [[ -n $TIME ]]; then cmd=("$TIME" -f '%U %S' -o "$TMP/cpu" "${cmd[@]}"); fi
  "${cmd[@]}" >"$TMP/run.json" ||
    { echo "shardfeed load failed ($b $*)" >&2; cat "$TMP/run.json" >&2; exit 1; }
  # steady: images/s after the first batch (start-up latency left out)
  python3 -c "
import json
j = json.load(open('$TMP/run.json'))
u, s = open('$TMP/cpu').read().split()[:2]
first = j['images'] / max(j['batches'], 1)
steady = (j['images'] - first) / max(j['seconds'] - j['first_batch_s'], 1e-9)
print(j['images_per_s'], j['first_batch_s'], float(u) + float(s), steady)"
}

# Unmeasured: the first cold run of all warms the mock's page cache and ETags.
load "$BUILD_DIR" --cache-dir "$CACHES/c" >/dev/null
rm -rf "$CACHES/c"
declare -A R
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#BUILDS[@]}; k++)); do
    i=$(( (k + r) % ${#BUILDS[@]} ))   # alternate which build goes first
    b=${BUILDS[$i]}
    rm -rf "$CACHES/c"
    read -r c cf cc cs < <(load "$b" --cache-dir "$CACHES/c")
    read -r w wf wc ws < <(load "$b" --cache-dir "$CACHES/c")
    read -r m mf mc ms < <(load "$b" --ram-only)
    rm -rf "$CACHES/c"
    printf '  round %d %s: cold %6.1f img/s (first batch %.2f s, cpu %.2f s)  warm %6.1f (%.2f s, %.2f s)  ram-only %6.1f (%.2f s, %.2f s)\n' \
      "$r" "$b" "$c" "$cf" "$cc" "$w" "$wf" "$wc" "$m" "$mf" "$mc"
    R[$i,cold]+=" $c" R[$i,warm]+=" $w" R[$i,ram]+=" $m"
    R[$i,coldf]+=" $cf" R[$i,warmf]+=" $wf" R[$i,ramf]+=" $mf"
    R[$i,coldc]+=" $cc" R[$i,warmc]+=" $wc" R[$i,ramc]+=" $mc"
    R[$i,ratio]+=" $(python3 -c "print($c / $w)")" R[$i,rratio]+=" $(python3 -c "print($m / $w)")"
    R[$i,sratio]+=" $(python3 -c "print($cs / $ws)")" R[$i,srratio]+=" $(python3 -c "print($ms / $ws)")"
  done
done
echo "cache directories under $CACHE_PARENT, $(nproc) CPUs, $ROUNDS rounds, medians:"
for ((i = 0; i < ${#BUILDS[@]}; i++)); do
  # shellcheck disable=SC2086
  printf '%s\n  images/s: cold %.1f, warm %.1f, ram-only %.1f\n  first batch: cold %.2f s, warm %.2f s, ram-only %.2f s\n  loader CPU (user+sys): cold %.2f s, warm %.2f s, ram-only %.2f s\n  cold/warm %.2f, ram-only/warm %.2f (medians of per-round ratios; target cold/warm >= 0.95)\n  after the first batch: cold/warm %.2f, ram-only/warm %.2f\n' \
    "${BUILDS[$i]}" "$(median ${R[$i,cold]})" "$(median ${R[$i,warm]})" \
    "$(median ${R[$i,ram]})" "$(median ${R[$i,coldf]})" "$(median ${R[$i,warmf]})" \
    "$(median ${R[$i,ramf]})" "$(median ${R[$i,coldc]})" "$(median ${R[$i,warmc]})" \
    "$(median ${R[$i,ramc]})" "$(median ${R[$i,ratio]})" "$(median ${R[$i,rratio]})" \
    "$(median ${R[$i,sratio]})" "$(median ${R[$i,srratio]})"
done
