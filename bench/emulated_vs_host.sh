#!/usr/bin/env bash
# What the emulated device costs: `shardfeed load --device emulated` (copy
# stream, events and the checked normalise kernel on CPU threads, every
# batch also normalised to float32 "on the device") against `--device host`
# on the same local shards, alternating, R rounds; the ratio of the median
# images/s. Local shards (no network, no cache) so only the device path
# differs. RandomResizedCrop 224, uint8 CHW, batch 64, decode threads = cores.
#
# Usage: bash bench/emulated_vs_host.sh [--photos DIR | --per-photo N] [--rounds R]
#          [--build-dir DIR]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PHOTOS= PER_PHOTO=60 ROUNDS=3 BUILD_DIR=
bench_options --photos=PHOTOS --per-photo=PER_PHOTO --rounds=ROUNDS --build-dir=BUILD_DIR -- "$@"
bench_photos_setup sf-emulated-bench "$PER_PHOTO" shardfeed
"$SF" pack "$PHOTOS" "$TMP/shards/" --shard-size 16M --no-progress >&2
SRC=$(ls "$TMP"/shards/*.tar | tr '\n' ' ')
host=() emu=()
for r in $(seq "$ROUNDS"); do
  # shellcheck disable=SC2086
  h=$("$SF" load $SRC --device host --seed "$r" --json | json_field images_per_s)
  # shellcheck disable=SC2086
  e=$("$SF" load $SRC --device emulated --seed "$r" --json | json_field images_per_s)
  printf '  round %d  host %8.1f images/s   emulated %8.1f images/s\n' "$r" "$h" "$e"
  host+=("$h") emu+=("$e")
done
python3 - "${host[*]}" "${emu[*]}" <<'PY'
import statistics, sys
h = [float(x) for x in sys.argv[1].split()]
e = [float(x) for x in sys.argv[2].split()]
mh, me = statistics.median(h), statistics.median(e)
print(f"median images/s: host {mh:.1f}, emulated device {me:.1f}")
print(f"emulated / host: {me / mh:.2f}  (per round {', '.join(f'{b / a:.2f}' for a, b in zip(h, e))})")
PY
