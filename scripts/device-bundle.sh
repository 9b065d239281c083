#!/usr/bin/env bash
# Packs into .dev/ (git-ignored) what scripts/device-check.sh needs on a lent
# GPU machine that has the NVIDIA driver, CUDA's tools and Python with torch
# but not the project's Debian libraries and cannot fetch them: the binaries
# of a CUDA build (debug info stripped), the shared libraries they load from
# this machine, and the twelve sample photographs (docs/gpu.md, "On a lent
# GPU machine"). About 32 MiB.
#   scripts/device-bundle.sh [BUILD_DIR]      (default build, with CUDA)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
[[ -x $B/tests/gpu_diff && -x $B/bench_gpu_h2d ]] ||
  { echo "device-bundle: $B has no CUDA test programs: configure with CUDA and build" >&2; exit 2; }
gd=$(git rev-parse --git-dir)
mkdir -p "$gd/info"
grep -qx '/.dev/' "$gd/info/exclude" 2>/dev/null || echo '/.dev/' >>"$gd/info/exclude"
rm -rf .dev
mkdir -p .dev/build/tests .dev/build/python .dev/lib .dev/photos
for f in shardfeed shardfeed-mock-s3 sf_make_photos bench_gpu_h2d bench_loader; do cp "$B/$f" .dev/build/; done
cp "$B/libshardfeed.so.0".* .dev/build/
(cd .dev/build && ln -s libshardfeed.so.0.* libshardfeed.so.0 && ln -s libshardfeed.so.0 libshardfeed.so)
for t in test_gpu test_loader gpu_diff; do cp "$B/tests/$t" .dev/build/tests/; done
cp -r "$B/python/shardfeed" .dev/build/python/
find .dev/build -type f -exec strip --strip-debug {} \; 2>/dev/null || true
# every library they load but the C runtime, which the other machine has
ldd .dev/build/shardfeed .dev/build/shardfeed-mock-s3 .dev/build/bench_gpu_h2d .dev/build/tests/* \
    "$B/libshardfeed.so.0" .dev/build/python/shardfeed/_shardfeed*.so 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
  grep -v "/$(basename "$PWD")/" | while read -r l; do cp -L "$l" .dev/lib/; done
# the sample photographs (scripts/make-sample-dataset.sh --photos)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download mate-backgrounds >/dev/null && dpkg -x mate-backgrounds_*.deb x)
cp "$tmp"/x/usr/share/backgrounds/mate/nature/*.jpg .dev/photos/
cp scripts/device-check.sh scripts/device_check.py .dev/
du -sh .dev
