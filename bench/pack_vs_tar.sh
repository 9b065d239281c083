#!/usr/bin/env bash
# Throughput of `shardfeed pack --format tar` against GNU tar on the same folder.
#
# Usage: bash bench/pack_vs_tar.sh [--files N] [--size-kib K] [--classes C]
#          [--rounds R] [--build-dir DIR] [--tmpdir DIR]
#
# Makes an ImageFolder tree of N files of about K KiB of random bytes (sizes vary
# by +-10% around K) in C class folders, in a temp dir (/dev/shm when it has room,
# else /tmp; the script says which), reads it once so the page cache is warm,
# runs each tool once unmeasured, then R measured rounds. Each round runs both
# tools in an order that alternates by round, into an empty output folder on the
# same file system, with `sync` (not timed) before each run so one run's
# write-back does not land in the next one's time:
#
#   shardfeed  shardfeed pack SRC OUT --format tar --no-progress
#              (sorted order, 512-byte ustar headers, XXH3 of every shard,
#               index.json; one 256 MiB shard per 256 MiB of input)
#   tar        tar -cf OUT/all.tar -C SRC .   (GNU tar, its defaults: readdir
#              order, 10 KiB records)
#
# MiB/s is source bytes / wall time. The table gives the median and the best
# round of each tool and the ratio shardfeed/tar of the medians. Both outputs are
# checked after the warm-up: `tar -tf` must list every source file in each, and
# the shards must extract byte-identical to the source.
#
# Settings (flags override the environment):
#   SF_BENCH_FILES     --files      number of files              (default 2000)
#   SF_BENCH_SIZE_KIB  --size-kib   mean file size in KiB        (default 110)
#   SF_BENCH_CLASSES   --classes    class folders                (default 10)
#   SF_BENCH_ROUNDS    --rounds     measured rounds per tool     (default 7)
#   SF_BENCH_BUILD_DIR --build-dir  where the shardfeed binary is (default: build/)
#   SF_BENCH_TMPDIR    --tmpdir     parent of the temp dir
# Exits 0 (a benchmark, not a test) unless setup failed (2) or a tool failed or
# wrote wrong bytes (1).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

bench_env FILES=2000 SIZE_KIB=110 CLASSES=10 ROUNDS=7 BUILD_DIR= TMP_PARENT:SF_BENCH_TMPDIR=

bench_options --files=FILES --size-kib=SIZE_KIB --classes=CLASSES --rounds=ROUNDS \
  --build-dir=BUILD_DIR --tmpdir=TMP_PARENT -- "$@"
bench_positive FILES SIZE_KIB CLASSES ROUNDS

bench_build shardfeed
if ! tar --version 2>/dev/null | grep -q 'GNU tar'; then
  echo "pack_vs_tar: GNU tar is needed" >&2
  exit 2
fi

need_kib=$((FILES * SIZE_KIB * 3 + 65536)) # source + two outputs + slack
WORK=$(roomy_tmp sf-pack-bench "$need_kib" "$TMP_PARENT")
TMP_PARENT=$(dirname "$WORK")
bench_cleanup_on_exit "$WORK"
SRC=$WORK/src
mkdir -p "$SRC"

# ------------------------------------------------------------ data
python3 - "$SRC" "$FILES" "$SIZE_KIB" "$CLASSES" <<'EOF'
import os, random, sys
src, files, size_kib, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(1)
for c in range(classes):
    os.makedirs(os.path.join(src, "class%03d" % c), exist_ok=True)
for i in range(files):
    size = int(size_kib * 1024 * rng.uniform(0.9, 1.1))
    path = os.path.join(src, "class%03d" % (i % classes), "img%07d.jpg" % i)
    with open(path, "wb") as f:
        f.write(os.urandom(size))
EOF
SRC_BYTES=$(find "$SRC" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
find "$SRC" -type f -exec cat {} + > /dev/null # warm the page cache

now() { date +%s.%N; }

run_pack() { # OUT
  "$SF" pack "$SRC" "$1" --format tar --no-progress > /dev/null
}
run_tar() { # OUT
  mkdir -p "$1"
  tar -cf "$1/all.tar" -C "$SRC" .
}

declare -A T
one() { # TOOL ROUND
  local out=$WORK/out-$1
  rm -rf "$out"
  sync
  local t0 t1
  t0=$(now)
  if ! "run_$1" "$out"; then
    echo "pack_vs_tar: $1 failed" >&2
    exit 1
  fi
  t1=$(now)
  T[$1,$2]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }')
}

# ------------------------------------------------------------ warm-up and checks
one pack warm
one tar warm
listed=$(for s in "$WORK"/out-pack/*.tar; do tar -tf "$s"; done | grep -c '\.jpg$')
if [[ $listed -ne $FILES ]]; then
  echo "pack_vs_tar: the shards list $listed .jpg members, not $FILES" >&2
  exit 1
fi
listed=$(tar -tf "$WORK/out-tar/all.tar" | grep -c '\.jpg$')
if [[ $listed -ne $FILES ]]; then
  echo "pack_vs_tar: tar's archive lists $listed .jpg members, not $FILES" >&2
  exit 1
fi
mkdir -p "$WORK/x"
for s in "$WORK"/out-pack/*.tar; do tar -xf "$s" -C "$WORK/x"; done
if ! diff -r -x '*.cls' "$SRC" "$WORK/x" > /dev/null; then
  echo "pack_vs_tar: the extracted shards differ from the source" >&2
  exit 1
fi
rm -rf "$WORK/x"

# ------------------------------------------------------------ rounds
for ((r = 0; r < ROUNDS; r++)); do
  if ((r % 2 == 0)); then one pack "$r"; one tar "$r"; else one tar "$r"; one pack "$r"; fi
done

stats() { # TOOL -> "median best" in MiB/s
  local tool=$1 r
  for ((r = 0; r < ROUNDS; r++)); do echo "${T[$tool,$r]}"; done |
    awk -v bytes="$SRC_BYTES" '{ print bytes / 1048576 / $1 }' | sort -g |
    awk '{ v[NR] = $1 }
      END { n = NR; m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2;
            printf "%.1f %.1f", m, v[n] }'
}
read -r pack_med pack_best <<< "$(stats pack)"
read -r tar_med tar_best <<< "$(stats tar)"
ratio=$(awk -v a="$pack_med" -v b="$tar_med" 'BEGIN { printf "%.2f", a / b }')

echo "pack vs GNU tar: $FILES files, $(awk -v b="$SRC_BYTES" 'BEGIN { printf "%.1f", b / 1048576 }') MiB in $CLASSES class folders, in $TMP_PARENT, $ROUNDS rounds (page cache warm)"
echo "$(tar --version | head -1); $("$SF" version | head -1); $(nproc) CPUs"
printf '%-10s %14s %14s\n' tool "median MiB/s" "best MiB/s"
printf '%-10s %14s %14s\n' shardfeed "$pack_med" "$pack_best"
printf '%-10s %14s %14s\n' tar "$tar_med" "$tar_best"
echo "ratio shardfeed/tar (medians): $ratio"
