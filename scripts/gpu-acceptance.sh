#!/usr/bin/env bash
# What only a machine with an NVIDIA GPU can check (docs/gpu.md): the GPU
# ring's suites on the CUDA backend, the CUDA ring against the emulated
# device bit for bit, the same under compute-sanitizer, and the loader end
# to end on the device. No machine of the project has a GPU: run this on one
# after scripts/install-deps.sh and a CUDA toolkit with a driver.
#   scripts/gpu-acceptance.sh [BUILD_DIR]      (default build-gpu)
# Exit 0 when every step passed; the steps and their results are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
jobs=$(nproc 2>/dev/null || echo 2)

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-acceptance: no NVIDIA GPU here (nvidia-smi -L fails): nothing to check" >&2
  exit 2
fi
nvidia-smi -L

set -e
cmake -S . -B "$build" -G Ninja -DSF_WITH_CUDA=ON -DSF_WERROR=ON >/dev/null
grep -q 'gpu_cuda\.cu"' "$build/compile_commands.json" ||
  { echo "gpu-acceptance: this build has no CUDA (nvcc not found)" >&2; exit 2; }
cmake --build "$build" -j "$jobs"
set +e

failed=()
step() {
  local name=$1
  shift
  echo "== $name"
  if "$@"; then
    echo "-- $name: ok"
  else
    echo "-- $name: FAILED"
    failed+=("$name")
  fi
}

export SF_TEST_GPU_BACKEND=cuda
t="$build/tests"
step "static checks of the CUDA code" bash scripts/check-cuda.sh "$build"
step "ring suite on CUDA" "$t/test_gpu" --jobs 1
step "loader GPU delivery on CUDA" "$t/test_loader" --jobs 1 --filter 'loader/gpu*'
step "CUDA ring vs emulated device, bit for bit" "$t/gpu_diff" cuda

if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck initcheck; do
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    step "compute-sanitizer $tool: gpu_diff" \
      compute-sanitizer --tool "$tool" --error-exitcode 99 "${extra[@]}" "$t/gpu_diff" cuda
    step "compute-sanitizer $tool: ring suite" \
      compute-sanitizer --tool "$tool" --error-exitcode 99 --target-processes all \
      "$t/test_gpu" --jobs 1
  done
else
  echo "gpu-acceptance: compute-sanitizer not found (it comes with the CUDA toolkit)"
  failed+=("compute-sanitizer missing")
fi

# The loader end to end on the device, through the CLI and the mock server.
# (scripts/demo.sh builds in build/: the same sources.)
step "the demo with shardfeed load --device cuda" bash scripts/demo.sh --per-photo 20 --device cuda

unset SF_TEST_GPU_BACKEND
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-acceptance: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu-acceptance: all steps passed"
