#!/usr/bin/env bash
# Autotune against the full grid, in one run: `shardfeed tune` (budget B)
# then one epoch with its config, against every point of a grid of
# concurrency x chunk size x decode threads x prefetch_shards, each one RAM-only
# epoch from the mock server with a per-connection bandwidth cap (so that the
# fetch knobs matter, as over a real link). Prints the best grid point, the
# tuned point's images/s as a share of it (target >= 0.95) and tune's time as
# a share of the grid's (target <= 0.10).
#
# Usage: bash bench/tune_vs_grid.sh [--per-photo N] [--bandwidth 2M] [--budget-s B]
#          [--build-dir DIR]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PER_PHOTO=60 BANDWIDTH=2M BUDGET=6 BUILD_DIR=
bench_options --per-photo=PER_PHOTO --bandwidth=BANDWIDTH --budget-s=BUDGET --build-dir=BUILD_DIR -- "$@"
bench_build shardfeed shardfeed-mock-s3
TMP=$(mktemp -d /tmp/sf-tune-bench.XXXXXX)
bench_cleanup_on_exit "$TMP"

bash "$REPO/scripts/make-sample-dataset.sh" "$TMP/photos" --per-photo "$PER_PHOTO" \
  --build-dir "$BUILD_DIR" >/dev/null
mkdir -p "$TMP/root/bench"
"$SF" pack "$TMP/photos" "$TMP/root/bench/train/" --shard-size 8M --no-progress >/dev/null
mock_start "$BUILD_DIR/shardfeed-mock-s3" "$TMP/mock.out" --root "$TMP/root" --quiet --fault "prefix=bench/train,bandwidth=$BANDWIDTH"
mock_env
COMMON=(s3://bench/train/ --endpoint-url "$URL" --device host --ram-only --batch-size 64 --seed 1)

now() { python3 -c 'import time; print(time.monotonic())'; }
rate() { json_field images_per_s "$1"; }

echo "grid: concurrency {2,8,32} x chunk {1M,4M} x decode threads {1,2} x prefetch_shards {1,4}"
t0=$(now)
best=0 best_pt=
for c in 2 8 32; do for k in 1M 4M; do for d in 1 2; do for p in 1 4; do
  "$SF" load "${COMMON[@]}" --concurrency "$c" --chunk-size "$k" --decode-threads "$d" \
    --prefetch-shards "$p" --json >"$TMP/g.json" 2>/dev/null
  r=$(rate "$TMP/g.json")
  printf '  concurrency %-3s chunk %-3s threads %s shards %s: %7.0f img/s\n' "$c" "$k" "$d" "$p" "$r"
  if python3 -c "import sys; sys.exit(0 if $r > $best else 1)"; then best=$r best_pt="c=$c chunk=$k threads=$d shards=$p"; fi
done; done; done; done
t1=$(now)
grid_s=$(python3 -c "print($t1 - $t0)")

t0=$(now)
"$SF" tune "${COMMON[@]}" --budget-s "$BUDGET" -o "$TMP/tuned.json" 2>"$TMP/tune.err" >/dev/null ||
  { cat "$TMP/tune.err" >&2; exit 1; }
t1=$(now)
tune_s=$(python3 -c "print($t1 - $t0)")
"$SF" load "${COMMON[@]}" --config "$TMP/tuned.json" --json >"$TMP/t.json" 2>/dev/null
tuned=$(rate "$TMP/t.json")
echo "tune: $(cat "$TMP/tuned.json")"
sed 's/^/  /' "$TMP/tune.err"
python3 - "$best" "$tuned" "$grid_s" "$tune_s" "$best_pt" <<'PY'
import sys
best, tuned, grid_s, tune_s = map(float, sys.argv[1:5])
print(f"best grid point: {sys.argv[5]}, {best:.0f} img/s")
print(f"tuned: {tuned:.0f} img/s = {tuned / best:.2f} x the best grid point (target >= 0.95)")
print(f"time: tune {tune_s:.1f} s, grid {grid_s:.1f} s: {tune_s / grid_s:.2f} of the grid's "
      f"(target <= 0.10)")
PY
