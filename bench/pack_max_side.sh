#!/usr/bin/env bash
# pack --max-side: what re-encoding at pack time buys the decode stage, in one
# run. Packs the same photos three ways (as they are, --max-side 320 and
# --max-side 256, quality 90), then times `shardfeed load` epochs over each
# (local shards, RandomResizedCrop 224, decode threads = cores: decode-bound),
# the three in turn in each of E rounds so that they see the same machine,
# and prints the best images/s of each, the speed-up against the originals
# and the bytes.
#
# Usage: bash bench/pack_max_side.sh [--photos DIR | --per-photo N] [--epochs E]
#          [--build-dir DIR]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PHOTOS= PER_PHOTO=100 EPOCHS=3 BUILD_DIR=
bench_options --photos=PHOTOS --per-photo=PER_PHOTO --epochs=EPOCHS --build-dir=BUILD_DIR -- "$@"
bench_photos_setup sf-maxside-bench "$PER_PHOTO" shardfeed

rate() { # shards dir -> images/s of one epoch
  "$SF" load "$1/" --epochs 1 --json 2>/dev/null | json_field images_per_s
}

declare -A RATE BYTES SECS
for side in 0 320 256; do
  out=$TMP/packed-$side
  if [[ $side == 0 ]]; then
    "$SF" pack "$PHOTOS" "$out/" --shard-size 32M --no-progress --json >"$TMP/p.json"
  else
    "$SF" pack "$PHOTOS" "$out/" --shard-size 32M --max-side "$side" --quality 90 \
      --no-progress --json >"$TMP/p.json"
  fi
  BYTES[$side]=$(json_field bytes "$TMP/p.json")
  SECS[$side]=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(round(d["seconds"], 2))' "$TMP/p.json")
  RATE[$side]=0
done
for round in $(seq "$EPOCHS"); do
  for side in 0 320 256; do
    r=$(rate "$TMP/packed-$side")
    echo "round $round, max side ${side/#0/none}: $r img/s" >&2
    RATE[$side]=$(python3 -c "print(max(${RATE[$side]}, $r))")
  done
done
for side in 0 320 256; do
  echo "max side ${side/#0/none}: pack ${SECS[$side]} s, ${BYTES[$side]} bytes, load ${RATE[$side]} img/s (best of $EPOCHS)" >&2
done
for side in 320 256; do
  python3 - "$side" "${RATE[0]}" "${RATE[$side]}" "${BYTES[0]}" "${BYTES[$side]}" <<'PY'
import sys
side, r0, r, b0, b = sys.argv[1], *map(float, sys.argv[2:])
print(f"--max-side {side}: decode-bound load {r:.0f} img/s vs {r0:.0f} as packed: "
      f"{r / r0:.2f}x; shards {b / 2**20:.1f} MiB vs {b0 / 2**20:.1f} MiB "
      f"({100 * (1 - b / b0):.0f} % smaller)")
PY
done
