#!/usr/bin/env bash
# Makes the sample dataset of real photographs (an ImageFolder tree of
# ImageNet-like JPEGs) used by the demo and the loader benchmarks.
#
# Usage: scripts/make-sample-dataset.sh OUT_DIR [--per-photo N] [--seed S]
#          [--build-dir DIR] [--photos DIR] [--force]
#
# The photographs are the twelve of Debian's mate-backgrounds package
# (nature/*.jpg): `apt-get download` + `dpkg-deb -x` into a temp dir (no
# install, no root), or, when that fails, /usr/share/backgrounds/mate/nature
# if the package is installed. --photos DIR takes the *.jpg of DIR instead.
# Each photo becomes one class of N images (default 300: 3600 in all) cut by
# sf_make_photos (bench/make_photos.c) from the build dir (default build/).
# OUT_DIR must not exist or be empty (--force empties it first). Prints the
# image count, the mean file size and the time taken. Same seed, same bytes.
# docs/sample-dataset.md says more.
#
# Pack it into WebDataset shards:
#   build/shardfeed pack OUT_DIR SHARDS_DIR --format tar --shard-size 64M
set -euo pipefail

PER_PHOTO=300
SEED=1
BUILD_DIR=
PHOTOS=
FORCE=0
OUT=

usage() { sed -n '5,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --per-photo) PER_PHOTO=${2:-}; shift 2 || usage ;;
    --seed) SEED=${2:-}; shift 2 || usage ;;
    --build-dir) BUILD_DIR=${2:-}; shift 2 || usage ;;
    --photos) PHOTOS=${2:-}; shift 2 || usage ;;
    --force) FORCE=1; shift ;;
    -h|--help) usage ;;
    -*) echo "make-sample-dataset: unknown option $1" >&2; usage ;;
    *)
      [[ -z $OUT ]] || { echo "make-sample-dataset: one OUT_DIR only" >&2; usage; }
      OUT=$1; shift ;;
  esac
done
[[ -n $OUT ]] || { echo "make-sample-dataset: OUT_DIR is required" >&2; usage; }
[[ $PER_PHOTO =~ ^[1-9][0-9]*$ ]] ||
  { echo "make-sample-dataset: --per-photo must be a positive integer, not '$PER_PHOTO'" >&2; exit 2; }
[[ $SEED =~ ^[0-9]+$ ]] ||
  { echo "make-sample-dataset: --seed must be a non-negative integer, not '$SEED'" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
GEN=$BUILD_DIR/sf_make_photos
if [[ ! -x $GEN ]]; then
  echo "make-sample-dataset: $GEN not found: build first" \
    "(cmake -S . -B $BUILD_DIR -G Ninja && cmake --build $BUILD_DIR)" >&2
  exit 2
fi

if [[ -e $OUT && -n $(ls -A "$OUT" 2>/dev/null) ]]; then
  if ((FORCE)); then
    rm -rf "${OUT:?}"/* "${OUT:?}"/.[!.]* 2>/dev/null || true
  else
    echo "make-sample-dataset: $OUT is not empty (--force empties it)" >&2
    exit 2
  fi
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/sf-sample-photos.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

NATURE=(Aqua Blinds Dune FreshFlower Garden GreenMeadow LadyBird RainDrops Storm TwoWings
        Wood YellowFlower)
have_all() { # DIR: all twelve photographs there?
  local n
  for n in "${NATURE[@]}"; do [[ -f $1/$n.jpg ]] || return 1; done
}

SRC=
FROM=
if [[ -n $PHOTOS ]]; then
  [[ -d $PHOTOS ]] || { echo "make-sample-dataset: --photos $PHOTOS is not a folder" >&2; exit 2; }
  SRC=$PHOTOS FROM="$PHOTOS"
else
  # apt (as root) drops to the _apt user to download, which must be able to
  # write the folder; a warning otherwise, harmless, kept in the log.
  chmod 755 "$TMP"
  if (cd "$TMP" && apt-get download mate-backgrounds) >"$TMP/apt.log" 2>&1 &&
     dpkg-deb -x "$TMP"/mate-backgrounds_*.deb "$TMP/pkg" 2>>"$TMP/apt.log" &&
     have_all "$TMP/pkg/usr/share/backgrounds/mate/nature"; then
    SRC=$TMP/pkg/usr/share/backgrounds/mate/nature
    FROM=$(basename "$TMP"/mate-backgrounds_*.deb)
  elif have_all /usr/share/backgrounds/mate/nature; then
    SRC=/usr/share/backgrounds/mate/nature
    FROM="the installed mate-backgrounds ($SRC)"
  else
    echo "make-sample-dataset: cannot get the photographs of mate-backgrounds:" >&2
    sed 's/^/  /' "$TMP/apt.log" >&2
    echo "  (run 'apt-get update' first, install mate-backgrounds, or pass --photos DIR)" >&2
    exit 1
  fi
fi
if [[ -n $PHOTOS ]]; then
  mapfile -t FILES < <(find "$SRC" -maxdepth 1 -type f \( -name '*.jpg' -o -name '*.jpeg' \
    -o -name '*.JPG' -o -name '*.JPEG' \) | LC_ALL=C sort)
  ((${#FILES[@]} > 0)) || { echo "make-sample-dataset: no *.jpg in $SRC" >&2; exit 2; }
else
  FILES=()
  for n in "${NATURE[@]}"; do FILES+=("$SRC/$n.jpg"); done
fi

echo "make-sample-dataset: ${#FILES[@]} photographs from $FROM, $PER_PHOTO images each, seed $SEED"
t0=$EPOCHREALTIME
"$GEN" --out "$OUT" --per-photo "$PER_PHOTO" --seed "$SEED" "${FILES[@]}" >/dev/null
secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
find "$OUT" -type f -name '*.jpg' -printf '%s\n' |
  awk -v out="$OUT" -v s="$secs" -v c="${#FILES[@]}" '
    { n++; b += $1 }
    END { printf "make-sample-dataset: %d images in %d classes in %s, %.1f MiB, mean %.0f bytes (%.1f KB), %s s\n",
                 n, c, out, b / 1048576, b / n, b / n / 1000, s }'
