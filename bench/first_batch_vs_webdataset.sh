#!/usr/bin/env bash
# Cold start of shardfeed's loader on a plain WebDataset bucket (GNU tar
# shards, no index.json) against PyTorch's DataLoader + WebDataset over HTTP,
# and what the first epoch costs with a cold cache or without an index.
#
# Usage: bash bench/first_batch_vs_webdataset.sh [--per-photo N] [--shards N]
#          [--rounds R] [--batch-size B] [--threads T] [--data DIR] [--no-torch]
#          [--build-dir DIR] [--tmpdir DIR] [--cache-tmpdir DIR] [--results FILE]
#
# Data (in a temp dir: /dev/shm when it has room, else /tmp):
#   scripts/make-sample-dataset.sh cuts N images (default 250) from each of the
#   12 photographs of Debian's mate-backgrounds (3,000 ImageNet-like JPEGs of
#   ~110 KB; docs/sample-dataset.md), or --data DIR takes an ImageFolder tree.
#   bench/first_batch_helper.py shuffles the samples (seed 1) and writes the
#   shards with the system `tar --format=gnu` (not `shardfeed pack`): sample
#   key = base name, members KEY.jpg and KEY.cls, no index.json
#   (bench/plain/train-{000000..}.tar). A copy of the same shards gets an
#   index.json (bench/index/): from `shardfeed index` when this build has it,
#   else written by the helper in pack's format (docs/pack.md).
# Servers, both on 127.0.0.1, free ports, serving the same folder:
#   shardfeed-mock-s3 (signed requests, the mock's default keys) as s3://bench/
#   nginx (Debian's nginx-light, a user process with its own config)
# Every run is a fresh process; batch B (64), T decode threads / DataLoader
# workers (2), RandomResizedCrop 224 + flip, uint8, host batches; seed = round.
#   sf-cold-plain  shardfeed load s3://bench/plain/train-{..}.tar, empty
#                  --cache-dir, one epoch, --json (first_batch_s is taken from
#                  before sf_loader_open, images_per_s over the whole epoch)
#   sf-cold-index  the same on bench/index/ (with index.json), empty cache dir
#   sf-warm-index  the same again on the cache the cold run left
#   sf-ram-plain, sf-ram-index   --ram-only (no disk cache), for reference
#   torch-first    python3 bench/first_batch_helper.py torch-first: the
#                  pipeline of bench/torch_loader.py (WebDataset shuffle 1000,
#                  decode pil, RandomResizedCrop 224 + flip, PILToTensor;
#                  DataLoader num_workers=T, prefetch_factor 4) over
#                  "pipe:curl -s -f http://127.0.0.1:PORT/bench/plain/..."
#                  URLs; seconds from just before iter(loader) (workers start)
#                  to the first batch. Python imports are not timed, and
#                  shardfeed's process start is not either.
# One unmeasured warm-up of each shardfeed kind (the mock's ETag cache) and one
# full torch epoch over nginx (checks it delivers every image; its images/s is
# printed for context). R rounds (default 5); the order of the runs rotates by
# round (a warm run always follows its cold run). Every shardfeed epoch must
# deliver every image once (images, batches, no skips, no pads).
#
# Prints the medians and:
#   a) first batch, shardfeed cold without index / torch   (target <= 0.35)
#   b) images/s, cold / warm disk cache, with index.json   (target >= 0.95)
#   c) images/s, cold: without / with index.json           (target >= 0.95)
#   and, for reference, --ram-only against the warm cache and without index.
# Each ratio is the ratio of the medians; beside it, the median and range of
# the ratios within each round (runs of one round are close in time, so these
# move less with other load on the machine). CPU ms/img: GNU time's user +
# system seconds of a shardfeed run over the images it delivered.
#
# Settings (flags override the environment):
#   SF_BENCH_PER_PHOTO    --per-photo     images per photograph        (250)
#   SF_BENCH_SHARDS       --shards        shards                       (12)
#   SF_BENCH_ROUNDS       --rounds        measured rounds              (5)
#   SF_BENCH_BATCH        --batch-size    images per batch             (64)
#   SF_BENCH_THREADS      --threads       decode threads / workers     (2)
#   SF_BENCH_DATA         --data          existing ImageFolder tree    (make one)
#   SF_BENCH_BUILD_DIR    --build-dir     where shardfeed is           (build/)
#   SF_BENCH_TMPDIR       --tmpdir        parent of the data temp dir  (/dev/shm or /tmp)
#   SF_BENCH_CACHE_TMPDIR --cache-tmpdir  parent of the cache dirs     ($TMPDIR or /tmp)
#   --no-torch      shardfeed only (no ratio a)
#   --results FILE  also keep every run's JSON line (JSON lines) in FILE
# Exits 0 (a benchmark, not a test) unless setup failed (2) or a tool failed or
# delivered a wrong image count (1). Needs scripts/install-bench-deps.sh.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bench_env PER_PHOTO=250 NSHARDS:SF_BENCH_SHARDS=12 ROUNDS=5 BATCH=64 THREADS=2 DATA= BUILD_DIR= \
  TMP_PARENT:SF_BENCH_TMPDIR= CACHE_PARENT:SF_BENCH_CACHE_TMPDIR="${TMPDIR:-/tmp}"
TORCH=1
RESULTS_COPY=

bench_options --per-photo=PER_PHOTO --shards=NSHARDS --rounds=ROUNDS --batch-size=BATCH \
  --threads=THREADS --data=DATA --build-dir=BUILD_DIR --tmpdir=TMP_PARENT \
  --cache-tmpdir=CACHE_PARENT --results=RESULTS_COPY --no-torch=TORCH=0 -- "$@"
bench_positive PER_PHOTO NSHARDS ROUNDS BATCH THREADS
((NSHARDS <= 1000000)) || { echo "first_batch_vs_webdataset: too many shards" >&2; exit 2; }

bench_build shardfeed
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
HELPER=$REPO/bench/first_batch_helper.py
MOCK=
for m in "$BUILD_DIR/shardfeed-mock-s3" "$BUILD_DIR/mock_server/shardfeed-mock-s3"; do
  [[ -x $m ]] && { MOCK=$m; break; }
done
[[ -n $MOCK ]] ||
  { echo "first_batch_vs_webdataset: shardfeed-mock-s3 not found in $BUILD_DIR:" \
      "build first (cmake --build $BUILD_DIR)" >&2; exit 2; }
[[ -n $DATA || -x $BUILD_DIR/sf_make_photos ]] ||
  { echo "first_batch_vs_webdataset: $BUILD_DIR/sf_make_photos not found (or pass --data)" >&2
    exit 2; }
if [[ -n $DATA && ! -d $DATA ]]; then
  echo "first_batch_vs_webdataset: --data $DATA is not a folder" >&2
  exit 2
fi
"$SF" load --help >/dev/null 2>&1 ||
  { echo "first_batch_vs_webdataset: '$SF load --help' fails" >&2; exit 2; }
for t in tar curl timeout python3; do
  command -v "$t" >/dev/null || { echo "first_batch_vs_webdataset: $t not found" >&2; exit 2; }
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if ((TORCH)); then
  [[ -x $NGINX ]] ||
    { echo "first_batch_vs_webdataset: nginx not found: scripts/install-bench-deps.sh" >&2; exit 2; }
  python3 -c 'import torch, torchvision, webdataset, PIL' 2>/dev/null ||
    { echo "first_batch_vs_webdataset: python3 lacks torch, torchvision, webdataset or pillow:" \
        "run scripts/install-bench-deps.sh (or --no-torch)" >&2; exit 2; }
fi

# The dataset (~110 KB an image) three times: the tree and two copies of the shards.
need_kib=$((PER_PHOTO * 12 * 110 * 3 + 65536))
WORK=$(roomy_tmp sf-first-batch "$need_kib" "$TMP_PARENT")
CACHES=$(mktemp -d "$CACHE_PARENT/sf-first-batch-cache-XXXXXX")
bench_cleanup_on_exit "$WORK" "$CACHES"
setup_fail() { echo "first_batch_vs_webdataset: $*" >&2; exit 2; }

# ------------------------------------------------------------ data
sample_photos DATA "$WORK" "$PER_PHOTO" "$BUILD_DIR"
SITE=$WORK/root
PLAIN=$SITE/bench/plain
INDEXED=$SITE/bench/index
python3 "$HELPER" shards "$DATA" "$PLAIN" --counts "$WORK/counts.json" --shards "$NSHARDS" ||
  setup_fail "writing the shards failed"
mkdir -p "$INDEXED"
cp "$PLAIN"/*.tar "$INDEXED/"
LAST=$(printf '%06d' $((NSHARDS - 1)))
PATTERN="train-{000000..$LAST}.tar"
INDEX_BY="shardfeed index"
# `shardfeed index` (when this build has it) writes index.json beside the shards.
if ! "$SF" index --help >/dev/null 2>&1 ||
   ! "$SF" index "$INDEXED/$PATTERN" >"$WORK/index.log" 2>&1; then
  [[ -s $WORK/index.log ]] && { echo "shardfeed index failed; the helper writes index.json:" >&2
                                cat "$WORK/index.log" >&2; }
  INDEX_BY="first_batch_helper.py (pack's format)"
  python3 "$HELPER" index "$INDEXED" --counts "$WORK/counts.json" ||
    setup_fail "writing index.json failed"
fi
python3 "$HELPER" check-index "$INDEXED" --counts "$WORK/counts.json" ||
  setup_fail "index.json ($INDEX_BY) does not give the shards' counts"
[[ ! -e $PLAIN/index.json ]] || setup_fail "$PLAIN/index.json must not exist"
read -r SAMPLES SHARD_BYTES JPG_BYTES < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["sample_count"], sum(s["bytes"] for s in c["shards"]),
      sum(s["jpg_bytes"] for s in c["shards"]))' "$WORK/counts.json")
cat "$PLAIN"/*.tar "$INDEXED"/*.tar >/dev/null # page cache (tmpfs: already)

# ------------------------------------------------------------ servers
# The mock signs with its default keys; nginx (bench/lib.sh) serves the same
# folder to webdataset's curl.
mock_start "$MOCK" "$WORK/mock.out" --root "$SITE" --quiet
MOCK_URL=$URL
((TORCH)) && nginx_start "$NGINX" "$WORK/nginx" "$SITE" /bench/plain/train-000000.tar
mock_env
export NO_PROXY='*' no_proxy='*'
# Nothing of the user's cache is read or written ($XDG_CACHE_HOME/shardfeed).
export XDG_CACHE_HOME=$CACHES/xdg
TORCH_URLS=()
for ((i = 0; i < NSHARDS; i++)); do
  TORCH_URLS+=("pipe:curl -s -f ${NGINX_URL:-}/bench/plain/$(printf 'train-%06d.tar' "$i")")
done

# ------------------------------------------------------------ runs
RESULTS=$WORK/results.jsonl
# GNU time gives each run's CPU seconds (user + system, threads and children).
HAVE_TIME=1
/usr/bin/time -f '%e' -o /dev/null true 2>/dev/null || HAVE_TIME=0
: >"$RESULTS"
NRUN=0
# run NAME ROUND CMD...: runs CMD (10 min at most), records its JSON.
run() {
  local name=$1 round=$2 log
  shift 2
  NRUN=$((NRUN + 1))
  log=$WORK/run.$NRUN
  local timer=()
  ((HAVE_TIME)) && timer=(/usr/bin/time -f '%e %U %S' -o "$log.time")
  if ! timeout 600 "${timer[@]}" "$@" </dev/null >"$log.out" 2>"$log.err"; then
    echo "first_batch_vs_webdataset: $name failed (round $((round + 1))): $*" >&2
    tail -n 20 "$log.err" >&2
    tail -n 3 "$log.out" >&2
    exit 1
  fi
  python3 "$HELPER" record "$log.out" --run "$name" --round "$round" --expect "$SAMPLES" \
    --batch-size "$BATCH" --results "$RESULTS" --time "$log.time" ||
    { tail -n 20 "$log.err" >&2; exit 1; }
}
sf_load() { # ROUND DIR(plain|index) EXTRA...
  local round=$1 dir=$2
  shift 2
  SF_CMD=("$SF" load "s3://bench/$dir/$PATTERN" --endpoint-url "$MOCK_URL" --device host
          --batch-size "$BATCH" --decode-threads "$THREADS" --seed "$((round + 1))" --json "$@")
}
g_cold_plain() {
  rm -rf "$CACHES/c"
  sf_load "$1" plain --cache-dir "$CACHES/c"
  run sf-cold-plain "$1" "${SF_CMD[@]}"
  rm -rf "$CACHES/c"
}
g_cold_warm_index() {
  rm -rf "$CACHES/c"
  sf_load "$1" index --cache-dir "$CACHES/c"
  run sf-cold-index "$1" "${SF_CMD[@]}"
  run sf-warm-index "$1" "${SF_CMD[@]}"
  rm -rf "$CACHES/c"
}
# --ram-only caches no shard, but a loader may keep what it learns (sample
# counts) in the cache dir: a fresh one each run keeps these runs cold too.
g_ram() { # ROUND DIR NAME
  rm -rf "$CACHES/r"
  sf_load "$1" "$2" --ram-only --cache-dir "$CACHES/r"
  run "$3" "$1" "${SF_CMD[@]}"
  rm -rf "$CACHES/r"
}
g_ram_plain() { g_ram "$1" plain sf-ram-plain; }
g_ram_index() { g_ram "$1" index sf-ram-index; }
g_torch() {
  run torch-first "$1" python3 "$HELPER" torch-first "${TORCH_URLS[@]}" --batch-size "$BATCH" \
    --workers "$THREADS" --seed "$(($1 + 1))"
}
GROUPS_=(g_cold_plain g_cold_warm_index g_ram_plain g_ram_index)
((TORCH)) && GROUPS_+=(g_torch)

echo "data: $SAMPLES images in $NSHARDS GNU tar shards" \
  "($(awk -v b="$SHARD_BYTES" 'BEGIN { printf "%.0f", b / 1048576 }') MiB) in $WORK;" \
  "index.json by $INDEX_BY; cache dirs in $CACHES; mock $MOCK_URL, nginx ${NGINX_URL:-off}" >&2
echo "warm-up (unmeasured)" >&2
WARM_RESULTS=$WORK/warmup.jsonl
REAL_RESULTS=$RESULTS
RESULTS=$WARM_RESULTS
g_ram -1 plain sf-ram-plain
g_ram -1 index sf-ram-index
RESULTS=$REAL_RESULTS
if ((TORCH)); then
  # One full epoch through nginx: torch delivers every image (and its rate).
  run torch-epoch -1 python3 "$HELPER" torch-first "${TORCH_URLS[@]}" --batch-size "$BATCH" \
    --workers "$THREADS" --expect "$SAMPLES"
fi
for ((r = 0; r < ROUNDS; r++)); do
  echo "round $((r + 1))/$ROUNDS" >&2
  for ((k = 0; k < ${#GROUPS_[@]}; k++)); do
    "${GROUPS_[$(((k + r) % ${#GROUPS_[@]}))]}" "$r"
  done
done

TORCH_SIDE="torch: nginx, curl"
((TORCH)) || TORCH_SIDE="torch: not run"
TITLE="first batch and first epoch: $SAMPLES images (mean $(awk -v b="$JPG_BYTES" -v n="$SAMPLES" \
  'BEGIN { printf "%.0f", b / n / 1000 }') KB) in $NSHARDS GNU tar shards on 127.0.0.1
(shardfeed: shardfeed-mock-s3, signed; $TORCH_SIDE); batch $BATCH, $THREADS decode threads /
DataLoader workers, RandomResizedCrop 224 + flip, uint8 host batches; rounds: $ROUNDS; CPUs: $(nproc);
$("$SF" version 2>/dev/null | head -n 1)"
python3 "$HELPER" summary "$RESULTS" --title "$TITLE" || exit 1
if [[ -n $RESULTS_COPY ]]; then cp "$RESULTS" "$RESULTS_COPY"; fi
