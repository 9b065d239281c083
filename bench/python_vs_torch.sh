#!/usr/bin/env bash
# shardfeed's Python package against the CLI on the same loader, and against
# PyTorch's tuned DataLoader, on the same WebDataset tar shards.
#
# Usage: bash bench/python_vs_torch.sh [--per-photo N] [--shards N] [--rounds R]
#          [--epochs E] [--batch-size B] [--threads T] [--data DIR] [--no-torch]
#          [--build-dir DIR] [--tmpdir DIR] [--results FILE]
#
# Data (in a temp dir: /dev/shm when it has room, else /tmp), made as
# bench/first_batch_vs_webdataset.sh makes it: scripts/make-sample-dataset.sh
# cuts N images (default 250) from each of the 12 photographs of Debian's
# mate-backgrounds (ImageNet-like JPEGs of ~110 KB; docs/sample-dataset.md),
# or --data DIR takes an ImageFolder tree; bench/first_batch_helper.py
# shuffles them and writes S GNU tar shards with the system tar (KEY.jpg +
# KEY.cls; default 12, raised to the CPU count so that every DataLoader
# worker has a shard); `shardfeed index` writes index.json beside them.
# Every tool reads the same local files, from the page cache.
#
# R rounds (default 3); in each, one fresh process of each tool, their order
# rotating by round; batch B (128), E epochs a run (2), T decode threads /
# DataLoader workers (default: the CPUs), RandomResizedCrop 224 + flip, uint8
# CHW; each epoch must deliver every image once:
#   cli     shardfeed load SHARDS --batch-size B --epochs E --decode-threads T --json
#   python  bench/python_loader.py python: shardfeed.Loader(SHARDS, batch_size=B,
#           decode_threads=T), torch.from_dlpack of every batch's images and
#           labels, no step (with a GPU both shardfeed runs deliver on the GPU)
#   torch   bench/torch_loader.py: WebDataset(shardshuffle, split_by_worker)
#           .shuffle(1000).decode("pil") + RandomResizedCrop(224) +
#           RandomHorizontalFlip + PILToTensor, DataLoader(num_workers=T,
#           persistent_workers=True, prefetch_factor=4, pin_memory=True when
#           CUDA is there: pinning needs it); with CUDA the batches are
#           copied to the GPU and normalised there
# images/s is each tool's own figure: images over the seconds from just
# before the loader is made (workers or threads start, first batch
# included) to the last batch; imports are not timed.
# Memory: every run goes through `python_loader.py measure`, which samples the
# tool's process and all its descendants every 50 ms: the peak of the summed
# VmRSS (for one process at least getrusage's maximum RSS), and the peak of
# the summed PSS, sampled once a second: reading smaps_rollup of a process that
# imported torch costs ~19 ms, too much to do every 50 ms (pages the forked
# DataLoader workers share counted once).
#
# Both Python tools import torch (about 0.5 GiB of RSS by itself): the summary
# also shows each one's peak minus the maximum RSS of a process that only
# imports the same modules (`python_loader.py baseline`).
#
# Prints the medians and the ratios of the medians, each with the median and
# range of the rounds' own ratios:
#   images/s, Python / CLI                    (target >= 0.97)
#   images/s, Python / DataLoader             (target >= 2.5)
#   peak memory (RSS sum), Python / DataLoader (target <= 0.35)
#
# Settings (flags override the environment):
#   SF_BENCH_PER_PHOTO   --per-photo   images per photograph        (250)
#   SF_BENCH_SHARDS      --shards      shards                       (12, at least the CPUs)
#   SF_BENCH_ROUNDS      --rounds      measured rounds              (3)
#   SF_BENCH_EPOCHS      --epochs      epochs a run                 (2)
#   SF_BENCH_BATCH       --batch-size  images per batch             (128)
#   SF_BENCH_THREADS     --threads     decode threads / workers     (the CPUs)
#   SF_BENCH_DATA        --data        existing ImageFolder tree    (make one)
#   SF_BENCH_BUILD_DIR   --build-dir   where shardfeed is           (build/)
#   SF_BENCH_TMPDIR      --tmpdir      parent of the data temp dir  (/dev/shm or /tmp)
#   --no-torch      shardfeed only (Python / CLI)
#   --results FILE  also keep every run's JSON (JSON lines) in FILE
# Exits 0 (a benchmark, not a test) unless setup failed (2) or a tool failed or
# delivered a wrong image count (1). Needs scripts/install-bench-deps.sh.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bench_env PER_PHOTO=250 NSHARDS:SF_BENCH_SHARDS= ROUNDS=3 EPOCHS=2 BATCH=128 THREADS="$(nproc)" \
  DATA= BUILD_DIR= TMP_PARENT:SF_BENCH_TMPDIR=
TORCH=1
RESULTS_COPY=

bench_options --per-photo=PER_PHOTO --shards=NSHARDS --rounds=ROUNDS --epochs=EPOCHS \
  --batch-size=BATCH --threads=THREADS --data=DATA --build-dir=BUILD_DIR --tmpdir=TMP_PARENT \
  --results=RESULTS_COPY --no-torch=TORCH=0 -- "$@"
CPUS=$(nproc)
if [[ -z $NSHARDS ]]; then NSHARDS=$((CPUS > 12 ? CPUS : 12)); fi
bench_positive PER_PHOTO NSHARDS ROUNDS EPOCHS BATCH THREADS
((NSHARDS <= 100000)) || { echo "python_vs_torch: too many shards" >&2; exit 2; }

bench_build shardfeed
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
HELPER=$REPO/bench/python_loader.py
FB_HELPER=$REPO/bench/first_batch_helper.py
[[ -n $DATA || -x $BUILD_DIR/sf_make_photos ]] ||
  { echo "python_vs_torch: $BUILD_DIR/sf_make_photos not found (or pass --data)" >&2; exit 2; }
if [[ -n $DATA && ! -d $DATA ]]; then
  echo "python_vs_torch: --data $DATA is not a folder" >&2
  exit 2
fi
"$SF" load --help >/dev/null 2>&1 || { echo "python_vs_torch: '$SF load --help' fails" >&2; exit 2; }
export PYTHONPATH=$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import shardfeed; shardfeed.Loader' 2>/dev/null ||
  { echo "python_vs_torch: this build has no shardfeed Python package with a Loader" \
      "($BUILD_DIR/python; python3 headers are needed to build it)" >&2; exit 2; }
python3 -c 'import torch' 2>/dev/null ||
  { echo "python_vs_torch: python3 lacks torch: run scripts/install-bench-deps.sh" >&2; exit 2; }
if ((TORCH)); then
  python3 -c 'import torch, torchvision, webdataset, PIL' 2>/dev/null ||
    { echo "python_vs_torch: python3 lacks torchvision, webdataset or pillow:" \
        "run scripts/install-bench-deps.sh (or --no-torch)" >&2; exit 2; }
fi
command -v tar >/dev/null || { echo "python_vs_torch: tar not found" >&2; exit 2; }

# The dataset (~110 KB an image) twice: the tree and the shards.
WORK=$(roomy_tmp sf-python-bench $((PER_PHOTO * 12 * 110 * 2 + 65536)) "$TMP_PARENT")
bench_cleanup_on_exit "$WORK"
setup_fail() { echo "python_vs_torch: $*" >&2; exit 2; }

# ------------------------------------------------------------ data
sample_photos DATA "$WORK" "$PER_PHOTO" "$BUILD_DIR"
SHARDS=$WORK/shards
python3 "$FB_HELPER" shards "$DATA" "$SHARDS" --counts "$WORK/counts.json" --shards "$NSHARDS" ||
  setup_fail "writing the shards failed"
LAST=$(printf '%06d' $((NSHARDS - 1)))
"$SF" index "$SHARDS/train-{000000..$LAST}.tar" >"$WORK/index.log" 2>&1 ||
  { cat "$WORK/index.log" >&2; setup_fail "shardfeed index failed"; }
python3 "$FB_HELPER" check-index "$SHARDS" --counts "$WORK/counts.json" ||
  setup_fail "index.json does not give the shards' counts"
read -r SAMPLES SHARD_BYTES JPG_BYTES < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["sample_count"], sum(s["bytes"] for s in c["shards"]),
      sum(s["jpg_bytes"] for s in c["shards"]))' "$WORK/counts.json")
mapfile -t SHARD_FILES < <(find "$SHARDS" -name '*.tar' | LC_ALL=C sort)
cat "${SHARD_FILES[@]}" >/dev/null # into the page cache (tmpfs: already)
# Nothing of the user's cache is read or written (local files are not cached,
# but a loader may keep learned counts there).
export XDG_CACHE_HOME=$WORK/xdg

# ------------------------------------------------------------ runs
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
cmd_cli() {
  CMD=("$SF" load "${SHARD_FILES[@]}" --batch-size "$BATCH" --epochs "$EPOCHS"
       --decode-threads "$THREADS" --seed "$1" --json)
}
cmd_python() {
  CMD=(python3 "$HELPER" python "${SHARD_FILES[@]}" --batch-size "$BATCH" --epochs "$EPOCHS"
       --decode-threads "$THREADS" --seed "$1" --expect "$SAMPLES")
}
cmd_torch() { # its own memory sampler is slowed to every 5 s: ours does the work
  CMD=(python3 "$REPO/bench/torch_loader.py" "$SHARDS" --batch-size "$BATCH" --epochs "$EPOCHS"
       --workers "$THREADS" --seed "$1" --sample-interval 5)
}
NRUN=0
run() { # TOOL ROUND
  local tool=$1 round=$2 log
  NRUN=$((NRUN + 1))
  log=$WORK/run.$NRUN
  "cmd_$tool" "$((round + 1))"
  if ! timeout 1200 python3 "$HELPER" measure --out "$log.mem" -- "${CMD[@]}" \
       </dev/null >"$log.out" 2>"$log.err"; then
    echo "python_vs_torch: $tool failed (round $((round + 1))): ${CMD[*]}" >&2
    tail -n 20 "$log.err" >&2
    tail -n 3 "$log.out" >&2
    exit 1
  fi
  python3 "$HELPER" record "$log.out" "$log.mem" --run "$tool" --round "$round" \
    --expect "$SAMPLES" --results "$RESULTS" || { tail -n 20 "$log.err" >&2; exit 1; }
}
TOOLS=(cli python)
((TORCH)) && TOOLS+=(torch)

BASE_ARGS=()
((TORCH)) && BASE_ARGS=(--torch)
python3 "$HELPER" baseline --out "$WORK/baseline.json" "${BASE_ARGS[@]}" ||
  setup_fail "measuring the imports' memory failed"
echo "data: $SAMPLES images in $NSHARDS GNU tar shards" \
  "($(awk -v b="$SHARD_BYTES" 'BEGIN { printf "%.0f", b / 1048576 }') MiB) in $WORK" >&2
for ((r = 0; r < ROUNDS; r++)); do
  echo "round $((r + 1))/$ROUNDS" >&2
  for ((k = 0; k < ${#TOOLS[@]}; k++)); do
    run "${TOOLS[$(((k + r) % ${#TOOLS[@]}))]}" "$r"
  done
done

TORCH_SIDE="DataLoader: $THREADS workers, persistent, prefetch_factor 4"
((TORCH)) || TORCH_SIDE="DataLoader: not run"
TITLE="Python vs CLI vs DataLoader: $SAMPLES images (mean $(awk -v b="$JPG_BYTES" -v n="$SAMPLES" \
  'BEGIN { printf "%.0f", b / n / 1000 }') KB) in $NSHARDS GNU tar shards, local files
(page cache); batch $BATCH, $EPOCHS epochs a run, $THREADS decode threads; $TORCH_SIDE;
RandomResizedCrop 224 + flip, uint8; rounds: $ROUNDS; CPUs: $CPUS; $(python3 -c '
import torch; print("torch", torch.__version__, "(CUDA)" if torch.cuda.is_available() else "(no GPU)")');
$("$SF" version 2>/dev/null | head -n 1)"
python3 "$HELPER" summary "$RESULTS" --baseline "$WORK/baseline.json" --title "$TITLE" || exit 1
if [[ -n $RESULTS_COPY ]]; then cp "$RESULTS" "$RESULTS_COPY"; fi
