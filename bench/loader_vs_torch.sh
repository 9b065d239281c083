#!/usr/bin/env bash
# shardfeed's loader against PyTorch's usual tuned input pipeline, on the same
# WebDataset tar shards of real photographs, from local files.
#
# Usage: bash bench/loader_vs_torch.sh [--per-photo N] [--epochs E] [--rounds R]
#          [--batch-size B] [--shard-size SIZE] [--data DIR] [--only torch|shardfeed]
#          [--build-dir DIR] [--tmpdir DIR]
#
# 1. Data: scripts/make-sample-dataset.sh cuts N images (default 300) from each
#    of the 12 photographs of Debian's mate-backgrounds (3600 ImageNet-like
#    JPEGs, mean ~110 KB; docs/sample-dataset.md), or --data DIR takes an
#    ImageFolder tree already made. `shardfeed pack DIR SHARDS --format tar
#    --shard-size SIZE` packs it (default 64M, lowered when that would give
#    fewer shards than CPUs: WebDataset gives each DataLoader worker whole
#    shards, so torch could not use every core). All in a temp dir (/dev/shm
#    when it has room, else /tmp; the script says which); the shards are read
#    once first so both tools read them from the page cache.
# 2. R rounds (default 3), the tools' order alternating by round, each run a
#    fresh process under GNU time -v:
#      torch      python3 bench/torch_loader.py SHARDS --batch-size B --epochs E
#                 --workers $(nproc): WebDataset + DataLoader(num_workers=nproc,
#                 persistent_workers, prefetch_factor=4, pin_memory with CUDA),
#                 RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor
#      shardfeed  shardfeed load SHARDS/shard-*.tar --batch-size B --epochs E
#                 --decode-threads $(nproc) --json  (RandomResizedCrop 224 +
#                 flip, uint8 CHW batches: the same work)
#    Both check that every epoch delivers every image once.
# Prints the median images/s of each tool (each tool's own figure: images over
# the seconds from the start of loading to the last batch, start-up of workers
# or threads and the first batch included; torch's figure without the first
# batch is shown too), the ratio shardfeed/torch of the medians (target >=
# 2.5), and peak memory (medians over rounds):
#   shardfeed  GNU time's "Maximum resident set size": one process, threads
#              included, so that is the whole loader.
#   torch      the main process and its DataLoader worker processes together:
#              the largest sum of their PSS (proportional set size: pages the
#              forked workers share with each other are split among them, not
#              counted once per process), sampled every 0.2 s by
#              torch_loader.py. GNU time's figure for torch is the largest
#              single process only (workers not added) and is shown as such.
#
# Settings (flags override the environment):
#   SF_BENCH_PER_PHOTO   --per-photo   images per photograph      (default 300)
#   SF_BENCH_EPOCHS      --epochs      epochs per run             (default 2)
#   SF_BENCH_ROUNDS      --rounds      measured runs per tool     (default 3)
#   SF_BENCH_BATCH       --batch-size  images per batch           (default 256)
#   SF_BENCH_SHARD_SIZE  --shard-size  pack --shard-size, or auto (default auto: 64M)
#   SF_BENCH_DATA        --data        existing ImageFolder tree  (default: make one)
#   SF_BENCH_ONLY        --only        run one tool only          (default: both)
#   SF_BENCH_BUILD_DIR   --build-dir   where shardfeed is         (default: build/)
#   SF_BENCH_TMPDIR      --tmpdir      parent of the temp dir
# Exits 0 (a benchmark, not a test) unless setup failed (2) or a tool failed or
# delivered a wrong image count (1). Needs scripts/install-bench-deps.sh.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bench_env PER_PHOTO=300 EPOCHS=2 ROUNDS=3 BATCH=256 SHARD_SIZE=auto DATA= ONLY= BUILD_DIR= \
  TMP_PARENT:SF_BENCH_TMPDIR=

bench_options --per-photo=PER_PHOTO --epochs=EPOCHS --rounds=ROUNDS --batch-size=BATCH \
  --shard-size=SHARD_SIZE --data=DATA --only=ONLY --build-dir=BUILD_DIR --tmpdir=TMP_PARENT -- "$@"
bench_positive PER_PHOTO EPOCHS ROUNDS BATCH
case $ONLY in
  '') TOOLS=(torch shardfeed) ;;
  torch|shardfeed) TOOLS=("$ONLY") ;;
  *) echo "loader_vs_torch: --only takes torch or shardfeed, not '$ONLY'" >&2; exit 2 ;;
esac
if [[ $SHARD_SIZE != auto && ! $SHARD_SIZE =~ ^[1-9][0-9]*[KMG]?$ ]]; then
  echo "loader_vs_torch: --shard-size takes auto or a size like 64M, not '$SHARD_SIZE'" >&2
  exit 2
fi

bench_build shardfeed sf_make_photos
/usr/bin/time -v true >/dev/null 2>&1 ||
  { echo "loader_vs_torch: GNU time (/usr/bin/time -v) is needed: scripts/install-bench-deps.sh" >&2; exit 2; }
if [[ " ${TOOLS[*]} " == *" torch "* ]] &&
   ! python3 -c 'import torch, torchvision, webdataset, PIL' 2>/dev/null; then
  echo "loader_vs_torch: python3 lacks torch, torchvision, webdataset or pillow:" \
    "run scripts/install-bench-deps.sh" >&2
  exit 2
fi
if [[ " ${TOOLS[*]} " == *" shardfeed "* ]] && ! "$SF" load --help >/dev/null 2>&1; then
  echo "loader_vs_torch: this build's shardfeed has no working 'load' command" \
    "('$SF load --help' fails); --only torch runs the reference alone" >&2
  exit 2
fi
if [[ -n $DATA && ! -d $DATA ]]; then
  echo "loader_vs_torch: --data $DATA is not a folder" >&2
  exit 2
fi
CPUS=$(nproc)

# The dataset (~110 KB an image) twice: the tree and the shards.
WORK=$(roomy_tmp sf-loader-bench $((PER_PHOTO * 12 * 110 * 2 + 65536)) "$TMP_PARENT")
bench_cleanup_on_exit "$WORK"

# ------------------------------------------------------------ data
if [[ -z $DATA ]]; then
  DATA=$WORK/photos
  bash "$REPO/scripts/make-sample-dataset.sh" "$DATA" --per-photo "$PER_PHOTO" \
    --build-dir "$BUILD_DIR" >&2
fi
SRC_BYTES=$(find "$DATA" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
if [[ $SHARD_SIZE == auto ]]; then
  # 64 MiB, or less so that there are at least as many shards as CPUs.
  mib=$((SRC_BYTES / CPUS / 1048576))
  ((mib > 64)) && mib=64
  ((mib < 1)) && mib=1
  SHARD_SIZE=${mib}M
fi
SHARDS=$WORK/shards
"$SF" pack "$DATA" "$SHARDS" --format tar --shard-size "$SHARD_SIZE" --no-progress --json \
  >"$WORK/pack.json"
read -r SAMPLES NSHARDS CLASSES < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(d["sample_count"], d["shard_count"], len(d["classes"]))' "$SHARDS/index.json")
mapfile -t SHARD_FILES < <(find "$SHARDS" -name '*.tar' | LC_ALL=C sort)
cat "${SHARD_FILES[@]}" >/dev/null # into the page cache
EXPECT=$((SAMPLES * EPOCHS))

# ------------------------------------------------------------ runs
cmd_torch() {
  CMD=(python3 "$REPO/bench/torch_loader.py" "$SHARDS" --batch-size "$BATCH" --epochs "$EPOCHS"
       --workers "$CPUS")
}
cmd_shardfeed() {
  CMD=("$SF" load "${SHARD_FILES[@]}" --batch-size "$BATCH" --epochs "$EPOCHS"
       --decode-threads "$CPUS" --json)
}

# One run: fills R_IPS R_IPS2 R_SECS R_MEM R_TIME_RSS R_WAIT R_WALL.
run() { # TOOL ROUND
  local tool=$1 log=$WORK/$1.$2
  "cmd_$tool"
  local t0=$EPOCHREALTIME
  if ! /usr/bin/time -v -o "$log.time" "${CMD[@]}" </dev/null >"$log.out" 2>"$log.err"; then
    echo "loader_vs_torch: $tool failed (round $2): ${CMD[*]}" >&2
    tail -n 20 "$log.err" >&2
    exit 1
  fi
  R_WALL=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  R_TIME_RSS=$(awk -F': ' '/Maximum resident set size/ { print $2 * 1024 }' "$log.time")
  # CPU time of the whole tree (GNU time adds the waited-for children's)
  # per image: less sensitive than images/s to other load on the machine.
  R_CPU=$(awk -F': ' -v n="$EXPECT" '/User time|System time/ { s += $2 }
    END { printf "%.2f", s * 1000 / n }' "$log.time")
  local fields
  if ! fields=$(python3 - "$tool" "$EXPECT" "$log.out" <<'EOF'
import json, sys
tool, expect, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [l for l in open(path) if l.lstrip().startswith("{")]
if not lines:
    sys.exit("no JSON line in the output")
d = json.loads(lines[-1])
if d["images"] != expect:
    sys.exit("delivered %d images, not %d" % (d["images"], expect))
if tool == "torch":
    mem, wait, ips2 = d["peak_tree_pss_bytes"], "-", d["images_per_s_after_first_batch"]
else:
    mem, ips2 = d["peak_rss_bytes"], "-"
    wait = "%.3f" % d["consumer_wait_share"]
print(d["images_per_s"], ips2, d["seconds"], mem, wait)
EOF
  ); then
    echo "loader_vs_torch: $tool (round $2): bad result (output in $log.out):" >&2
    tail -n 5 "$log.out" >&2
    exit 1
  fi
  read -r R_IPS R_IPS2 R_SECS R_MEM R_WAIT <<<"$fields"
  # shardfeed is one process: GNU time's figure is all of it (its own
  # peak_rss_bytes is kept as R_OWN). torch: the summed PSS of the tree.
  R_OWN=-
  if [[ $tool == shardfeed ]]; then R_OWN=$R_MEM R_MEM=$R_TIME_RSS; fi
}

declare -A IPS IPS2 MEM TRSS OWN WAIT WALL CPU
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#TOOLS[@]}; k++)); do
    t=${TOOLS[$(((k + r) % ${#TOOLS[@]}))]}
    run "$t" "$r"
    echo "round $((r + 1))/$ROUNDS $t: $R_IPS images/s, $R_SECS s, wall $R_WALL s," \
      "$R_CPU CPU ms/image" >&2
    IPS[$t]="${IPS[$t]:-} $R_IPS" IPS2[$t]="${IPS2[$t]:-} $R_IPS2"
    MEM[$t]="${MEM[$t]:-} $R_MEM" TRSS[$t]="${TRSS[$t]:-} $R_TIME_RSS" OWN[$t]="${OWN[$t]:-} $R_OWN"
    WAIT[$t]="${WAIT[$t]:-} $R_WAIT" WALL[$t]="${WALL[$t]:-} $R_WALL" CPU[$t]="${CPU[$t]:-} $R_CPU"
  done
done

median() { # VALUES... ("-" when they are not numbers)
  [[ $1 == - ]] && { echo -; return; }
  printf '%s\n' "$@" | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
mib() {
  if [[ $1 == - ]]; then echo -; else awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; fi
}

echo "loader vs PyTorch: $SAMPLES images in $CLASSES classes, mean" \
  "$(awk -v b="$SRC_BYTES" -v n="$SAMPLES" 'BEGIN { printf "%.0f", b / n / 1000 }') KB," \
  "$NSHARDS tar shards of <= $SHARD_SIZE in $TMP_PARENT (page cache warm)"
echo "batch $BATCH, $EPOCHS epochs a run, RandomResizedCrop 224 + flip, uint8;" \
  "$ROUNDS rounds; $CPUS CPUs; medians"
printf '%-10s %9s %15s %9s %11s %11s %7s %12s\n' tool "images/s" "after 1st batch" "peak MiB" \
  "time -v MiB" "wait share" "wall s" "CPU ms/img"
declare -A MED
for t in "${TOOLS[@]}"; do
  read -r -a a <<<"${IPS[$t]}"; MED[$t]=$(median "${a[@]}")
  read -r -a a <<<"${IPS2[$t]}"; ips2=$(median "${a[@]}")
  read -r -a a <<<"${MEM[$t]}"; mem=$(mib "$(median "${a[@]}")")
  read -r -a a <<<"${TRSS[$t]}"; trss=$(mib "$(median "${a[@]}")")
  read -r -a a <<<"${WAIT[$t]}"; wait=$(median "${a[@]}")
  read -r -a a <<<"${WALL[$t]}"; wall=$(median "${a[@]}")
  read -r -a a <<<"${CPU[$t]}"; cpu=$(median "${a[@]}")
  printf '%-10s %9.1f %15s %9s %11s %11s %7.1f %12s\n' "$t" "${MED[$t]}" "$ips2" "$mem" "$trss" \
    "$wait" "$wall" "$cpu"
  if [[ $t == shardfeed ]]; then
    read -r -a a <<<"${OWN[$t]}"; own=$(mib "$(median "${a[@]}")")
  fi
done
echo "peak MiB: all the loader's memory: shardfeed's process (= time -v); torch's main process"
echo "  + DataLoader workers, summed PSS. time -v MiB: GNU time's maximum RSS, the largest single"
echo "  process (torch: workers not added). wall s: the whole command, imports included."
echo "CPU ms/img: user + system time of the command and its children over images delivered."
[[ -n ${own:-} ]] && echo "shardfeed's own peak_rss_bytes (JSON): $own MiB"
if [[ -n ${MED[torch]:-} && -n ${MED[shardfeed]:-} ]]; then
  printf 'ratio shardfeed/torch (median images/s): %.2f (target >= 2.50)\n' \
    "$(awk -v a="${MED[shardfeed]}" -v b="${MED[torch]}" 'BEGIN { print a / b }')"
fi
