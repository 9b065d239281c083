#!/usr/bin/env bash
# Multi-process scale simulation: P ranks against one rate-limited prefix.
#
# Usage: bash bench/scale_sim.sh [--procs P] [--objects-per-proc N] [--object-size SIZE]
#          [--chunk-size SIZE] [--rate-limit R] [--timeout-s T] [--build-dir DIR]
#          [--keep] [-- WARM_CACHE_FLAGS...]
#   --procs P            processes started at once, each as one rank (default 8)
#   --objects-per-proc N shards each rank fetches (default 4)
#   --object-size SIZE   size of each shard (default 4M)
#   --chunk-size SIZE    bytes per ranged GET (default 64K: many requests)
#   --rate-limit R       the mock's GET limit on the prefix, requests/s (default 200)
#   --timeout-s T        a rank still running after T s is killed and fails (300)
#   --keep               leave the temp dir (per-rank JSON, stderr, mock stats)
#   WARM_CACHE_FLAGS     extra `shardfeed warm-cache` flags for every rank
#
# One shardfeed-mock-s3 serves s3://bench/train/rankR-NNN.tar (random bytes) with
# `--fault prefix=bench/train/,rate_limit=R` (token bucket, burst R; over it a GET
# answers 503 SlowDown). Each rank runs, all at the same instant,
#   shardfeed warm-cache 's3://bench/train/rankR-{000..N-1}.tar' --cache-dir ITS_OWN
#     --chunk-size SIZE --json
# so every rank fetches its own split into its own cache, as the ranks of
# separate nodes do (one node's ranks share a cache and download once: docs/cache.md).
# The mock's per-key counters (/_mock/stats) give each rank's GETs and 503s.
#
# Prints per rank: completion time, GETs, 503s, useful GETs/s; then
#   throttled share   503 / all GETs                       target <= 5 %
#   aggregate rate    useful GETs / slowest completion     target >= 90 % of R
#   finished          ranks that exited 0 with every byte  target all
#   fairness          slowest / fastest completion         target <= 1.5
#                     and Jain's index of per-rank rates   (1 = equal)
# and which targets are met, and the useful GETs and 503s of each second (the
# mock's counters sampled once a second). The floor on completion time is the
# useful GETs less the burst (R, the bucket starts full), divided by R. Exit
# status 1 when a rank failed or fell short.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PROCS=8 PER=4 OSIZE=4M CHUNK=64K RATE=200 TMO=300 BUILD_DIR='' KEEP=0
EXTRA=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --procs) PROCS=$2; shift 2 ;;
    --objects-per-proc) PER=$2; shift 2 ;;
    --object-size) OSIZE=$2; shift 2 ;;
    --chunk-size) CHUNK=$2; shift 2 ;;
    --rate-limit) RATE=$2; shift 2 ;;
    --timeout-s) TMO=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) sed -n '4,14p' "$0" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$HERE/build}
for p in shardfeed shardfeed-mock-s3; do
  [[ -x $BUILD_DIR/$p ]] || { echo "missing $BUILD_DIR/$p: build first" >&2; exit 2; }
done
SF=$BUILD_DIR/shardfeed
bytes() {  # 4M, 64K, 123 -> bytes
  python3 -c "
import re, sys
m = re.fullmatch(r'(\d+)([KMG]?)(i?B)?', sys.argv[1])
if not m: sys.exit('bad size: ' + sys.argv[1])
print(int(m[1]) << {'': 0, 'K': 10, 'M': 20, 'G': 30}[m[2]])" "$1"
}
OBYTES=$(bytes "$OSIZE")

TMP=$(mktemp -d /tmp/sf-scale-sim.XXXXXX)
MOCK_PID='' SAMPLER=''
PIDS=()
cleanup() {
  [[ -n $SAMPLER ]] && kill "$SAMPLER" 2>/dev/null
  for p in ${PIDS[@]+"${PIDS[@]}"}; do kill "$p" 2>/dev/null || true; done
  [[ -n $MOCK_PID ]] && kill "$MOCK_PID" 2>/dev/null
  wait 2>/dev/null
  if ((KEEP)); then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

mkdir -p "$TMP/root/bench/train"
LAST=$(printf '%03d' $((PER - 1)))
for ((r = 0; r < PROCS; r++)); do
  for ((k = 0; k < PER; k++)); do
    head -c "$OBYTES" /dev/urandom >"$TMP/root/bench/train/rank$r-$(printf '%03d' "$k").tar"
  done
done

mock_start "$BUILD_DIR/shardfeed-mock-s3" "$TMP/mock.out" --root "$TMP/root" --quiet --fault "prefix=bench/train/,rate_limit=$RATE"
mock_env

curl -sf -X POST "$URL/_mock/reset" >/dev/null   # the counters start from 0 (HEADs are never limited)
T0=$(date +%s.%N)
(  # the mock's counters once a second: the aggregate rate and the 503s over time
  while sleep 1; do
    curl -sf "$URL/_mock/stats" | python3 -c "
import json, sys
j = json.load(sys.stdin)
print(j['operations'].get('GetObject', 0), j['status'].get('503', 0))" >>"$TMP/timeline" || true
  done
) &
SAMPLER=$!
for ((r = 0; r < PROCS; r++)); do
  (
    rc=0
    timeout "$TMO" "$SF" warm-cache "s3://bench/train/rank$r-{000..$LAST}.tar" \
      --endpoint-url "$URL" --cache-dir "$TMP/cache$r" --cache-limit 0 \
      --chunk-size "$CHUNK" --progress off --json ${EXTRA[@]+"${EXTRA[@]}"} \
      >"$TMP/rank$r.json" 2>"$TMP/rank$r.err" || rc=$?
    echo "$rc $(date +%s.%N)" >"$TMP/rank$r.end"
  ) &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || true; done
PIDS=()
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
SAMPLER=
curl -sf "$URL/_mock/stats" >"$TMP/stats.json"

python3 - "$TMP" "$PROCS" "$PER" "$OBYTES" "$CHUNK" "$RATE" "$T0" "$(nproc)" <<'EOF'
import json, os, sys
tmp, procs, per, obytes, chunk, rate, t0, ncpu = sys.argv[1:]
procs, per, obytes, rate, t0 = int(procs), int(per), int(obytes), float(rate), float(t0)
stats = json.load(open(f'{tmp}/stats.json'))
rows, ok_all = [], True
for r in range(procs):
    rc, end = open(f'{tmp}/rank{r}.end').read().split()
    rc, t = int(rc), float(end) - t0
    gets = ok = thr = 0
    for key, v in stats['keys'].items():
        if key.startswith(f'bench/train/rank{r}-'):
            gets += v['operations'].get('GetObject', 0)
            ok += v['status'].get('206', 0) + v['status'].get('200', 0) \
                  - v['operations'].get('HeadObject', 0)
            thr += v['status'].get('503', 0)
    try:
        j = json.load(open(f'{tmp}/rank{r}.json'))
        full = j['failed'] == 0 and j['bytes_fetched'] == per * obytes
    except Exception:
        full = False
    done = rc == 0 and full
    ok_all &= done
    rows.append((r, rc, done, t, gets, ok, thr, ok / t if t > 0 else 0))
    err = open(f'{tmp}/rank{r}.err').read().strip().splitlines()
    if not done and err:
        print(f'  rank {r} stderr: {err[-1]}')
print(f'{procs} ranks x {per} objects x {obytes >> 10} KiB, chunk {chunk}, '
      f'rate_limit={rate:g}/s on bench/train/, {ncpu} CPUs')
print('  rank  exit  done  seconds   GETs   503s  useful GETs/s')
for r, rc, done, t, gets, ok, thr, rr in rows:
    print(f'  {r:4d}  {rc:4d}  {"yes" if done else "NO":>4}  {t:7.2f}  {gets:5d}  {thr:5d}  {rr:13.1f}')
gets = sum(x[4] for x in rows); ok = sum(x[5] for x in rows); thr = sum(x[6] for x in rows)
times = [x[3] for x in rows]; rates = [x[7] for x in rows]
slow, fast = max(times), min(times)
share = thr / gets if gets else 0
agg = ok / slow if slow > 0 else 0
jain = sum(rates) ** 2 / (len(rates) * sum(x * x for x in rates)) if any(rates) else 0
floor = max(ok - rate, 0) / rate
print(f'mock: {stats["requests"]} requests, {gets} GETs, {ok} useful, {thr} answered 503 '
      f'(rate_limit faults {stats["faults"].get("rate_limit", 0)})')
prev, tl = (0, 0), []
for line in open(f'{tmp}/timeline') if os.path.exists(f'{tmp}/timeline') else []:
    g, t = map(int, line.split())
    tl.append(f'{g - prev[0] - (t - prev[1])}/{t - prev[1]}')
    prev = (g, t)
print('per second, useful GETs/503s:', ' '.join(tl))
print(f'completion: slowest {slow:.2f} s, fastest {fast:.2f} s '
      f'(floor at the limit {floor:.2f} s)')
targets = [
    (f'throttled share {100 * share:.1f} % (<= 5 %)', share <= 0.05),
    (f'aggregate {agg:.1f} GETs/s = {100 * agg / rate:.0f} % of {rate:g} (>= 90 %)',
     agg >= 0.9 * rate),
    (f'finished {sum(x[2] for x in rows)}/{procs} (all)', ok_all),
    (f'slowest/fastest {slow / fast if fast > 0 else float("inf"):.2f} (<= 1.5)',
     fast > 0 and slow / fast <= 1.5),
]
for text, met in targets:
    print(f'  {"met    " if met else "NOT met"}  {text}')
print(f'  Jain index of per-rank rates {jain:.3f} (1 = equal)')
print(f'targets met: {sum(m for _, m in targets)}/{len(targets)}')
sys.exit(0 if ok_all else 1)
EOF
