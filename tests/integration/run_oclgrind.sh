#!/usr/bin/env bash
# Runs a program under Oclgrind with its checks on, and fails when Oclgrind
# reports anything: Oclgrind prints invalid accesses, data races,
# uninitialised values and API misuse, but the program's exit status stays
# the program's own. Its messages go to a log file here; a non-empty log is
# a failure, printed in full (the first 20 messages: one bug is often
# reported once per work-item).
#   run_oclgrind.sh OCLGRIND LOG PROGRAM [ARGS...]
set -u
oclgrind=$1
log=$2
shift 2
rm -f "$log"
# `oclgrind` preloads its runtime (LD_PRELOAD), so in the sanitizer build
# the ASan runtime is not first in the library list and ASan refuses to
# start. Without that check it still finds overflows and leaks (tried with
# a deliberately broken program); other builds ignore the variable.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
"$oclgrind" --check-api --data-races --uninitialized --max-errors 20 --log "$log" "$@"
rc=$?
if [ -s "$log" ]; then
  echo "run_oclgrind.sh: FAIL: Oclgrind reported (log $log):"
  cat "$log"
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "run_oclgrind.sh: FAIL: $* exited with status $rc"
fi
exit "$rc"
