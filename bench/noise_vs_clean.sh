#!/usr/bin/env bash
# Random SlowDown and resets vs a clean server, in one run (issue 16):
#  1. an epoch of `shardfeed load` (cold cache) over the mock, 5 % 503 SlowDown
#     + 1 % connection resets on one prefix vs the same shards clean on
#     another: wall-time ratio (target <= 1.3), and the throttling counters;
#  2. `shardfeed get` against a listener that accepts and never answers, with
#     default options: time to the error.
# Usage: bench/noise_vs_clean.sh [--per-photo N (250: 3,000 photos)]   (BUILD_DIR, default build/)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PER_PHOTO=${PER_PHOTO:-250}
[[ ${1:-} == --per-photo ]] && PER_PHOTO=$2
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$HERE/build}
SF=$BUILD_DIR/shardfeed MOCK=$BUILD_DIR/shardfeed-mock-s3
TMP=$(mktemp -d /tmp/sf-noise-bench.XXXXXX)
MOCK_PID= SILENT_PID=
cleanup() {
  [[ -n $MOCK_PID ]] && kill "$MOCK_PID" 2>/dev/null
  [[ -n $SILENT_PID ]] && kill "$SILENT_PID" 2>/dev/null
  wait 2>/dev/null; rm -rf "$TMP"
}
trap cleanup EXIT
bash "$HERE/scripts/make-sample-dataset.sh" "$TMP/photos" --per-photo "$PER_PHOTO" \
  --build-dir "$BUILD_DIR" >&2
mkdir -p "$TMP/root/bench"
"$SF" pack "$TMP/photos" "$TMP/root/bench/clean/" --shard-size 8M --no-progress >&2
cp -r "$TMP/root/bench/clean" "$TMP/root/bench/noisy"
mock_start "$MOCK" "$TMP/mock.out" --root "$TMP/root" --fault "prefix=bench/noisy/,p503=0.05,reset=0.01"
mock_env
epoch() { # prefix -> seconds
  rm -rf "$TMP/cache"
  local t0 t1
  t0=$(date +%s.%N)
  "$SF" load "s3://bench/$1/" --endpoint-url "$URL" --cache-dir "$TMP/cache" --device host \
    --epochs 1 --json -v >"$TMP/$1.json" 2>"$TMP/$1.err"
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}
echo "== 1. epoch with 5 % SlowDown + 1 % resets vs clean (cold cache)"
for r in 1 2 3; do
  c=$(epoch clean) n=$(epoch noisy)
  printf '  round %d: clean %.2f s, noisy %.2f s: ratio %.2f (target <= 1.3)\n' "$r" "$c" "$n" \
    "$(python3 -c "print($n / $c)")"
done
curl -s "$URL/_mock/stats" | python3 -c "import json,sys; s=json.load(sys.stdin); print('  mock faults (all rounds):', s.get('faults'))"
echo "  noisy run's policy log lines: $(grep -c 'throttled:' "$TMP/noisy.err" || true) (rate cuts/probes)"

echo "== 2. shardfeed get against a server that accepts and never answers (defaults)"
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
print(s.getsockname()[1], flush=True); time.sleep(600)' >"$TMP/silent.port" &
SILENT_PID=$!
for _ in $(seq 50); do [[ -s $TMP/silent.port ]] && break; sleep 0.1; done
PORT=$(cat "$TMP/silent.port")
t0=$(date +%s.%N)
set +e
"$SF" get "s3://bench/clean/x.tar" --endpoint-url "http://127.0.0.1:$PORT" -o "$TMP/x" 2>"$TMP/get.err"
rc=$?
set -e
t1=$(date +%s.%N)
printf '  exit %d after %.1f s: %s\n' "$rc" "$(python3 -c "print($t1 - $t0)")" "$(tail -1 "$TMP/get.err")"
