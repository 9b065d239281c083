#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang (ASan + UBSan) and
# runs each for a while, one after the other (docs/testing.md).
#   scripts/fuzz.sh                      every harness, 600 s each
#   scripts/fuzz.sh --seconds 15         the CI smoke (scripts/test.sh)
#   scripts/fuzz.sh tar record           some harnesses
# Options: --seconds N, --build-dir DIR (default build-fuzz), --work DIR
# (the corpus each run grows; default BUILD_DIR/work), --no-build.
# Seeds: tests/fuzz/corpus/<h>/ and tests/fuzz/regressions/<h>/. A crash is
# written to BUILD_DIR/crashes/<h>/ and the script exits 1 naming it: fix
# the bug, then keep the input as tests/fuzz/regressions/<h>/<name> so that
# ctest's fuzz_replay_<h> replays it in every build.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=600
build=build-fuzz
work=
do_build=1
harnesses=()
usage() { sed -n '2,13p' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=${2:-}; shift 2 || usage ;;
    --build-dir) build=${2:-}; shift 2 || usage ;;
    --work) work=${2:-}; shift 2 || usage ;;
    --no-build) do_build=0; shift ;;
    -h|--help) usage ;;
    -*) echo "fuzz.sh: unknown option '$1'" >&2; usage ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
case "$seconds" in ''|*[!0-9]*|0) echo "fuzz.sh: --seconds needs a positive integer" >&2; exit 2 ;; esac
work=${work:-$build/work}
all=$(sed -n 's/^set(SF_FUZZ_HARNESSES \(.*\))$/\1/p' tests/fuzz/CMakeLists.txt)
if [ "${#harnesses[@]}" -eq 0 ]; then
  read -r -a harnesses <<<"$all"
fi
for h in "${harnesses[@]}"; do
  case " $all " in *" $h "*) ;; *) echo "fuzz.sh: no harness '$h' (have: $all)" >&2; exit 2 ;; esac
done

if [ "$do_build" = 1 ]; then
  cc=${CC_FUZZ:-}
  if [ -z "$cc" ]; then
    for c in clang-14 clang; do
      if command -v "$c" >/dev/null; then cc=$c; break; fi
    done
  fi
  [ -n "$cc" ] || { echo "fuzz.sh: no clang (scripts/install-deps.sh installs clang-14)" >&2; exit 1; }
  CC=$cc cmake -S . -B "$build" -G Ninja -DSF_FUZZ=ON -DSF_WERROR=ON -DSF_BUILD_TESTS=OFF \
    -DSF_BUILD_PYTHON=OFF -DSF_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target fuzz_all
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
printf '%-11s %8s %12s %9s %7s %7s  %s\n' harness seconds execs exec/s cov ft result
for h in "${harnesses[@]}"; do
  mkdir -p "$work/$h" "$build/crashes/$h"
  log=$build/fuzz_$h.log
  seeds=(tests/fuzz/corpus/"$h")
  [ -d tests/fuzz/regressions/"$h" ] && seeds+=(tests/fuzz/regressions/"$h")
  rc=0
  "$build"/tests/fuzz/fuzz_"$h" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$build/crashes/$h/" \
    "$work/$h" "${seeds[@]}" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  result=ok
  if [ "$rc" -ne 0 ]; then
    result="FAILED (exit $rc)"
    failed+=("$h")
  fi
  printf '%-11s %8s %12s %9s %7s %7s  %s\n' "$h" "$seconds" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "$result"
done
if [ "${#failed[@]}" -gt 0 ]; then
  for h in "${failed[@]}"; do
    echo "== $h: $build/fuzz_$h.log" >&2
    grep -E 'ERROR|SUMMARY|invariant|runtime error|Test unit written' "$build/fuzz_$h.log" | head -8 >&2 || true
  done
  echo "fuzz.sh: ${#failed[@]} harness(es) found a crash: fix it and keep the input under" \
       "tests/fuzz/regressions/<harness>/ (docs/testing.md)" >&2
  exit 1
fi
