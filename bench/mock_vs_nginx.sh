#!/usr/bin/env bash
# Throughput of shardfeed-mock-s3 against nginx serving the same files.
#
# Usage: bash bench/mock_vs_nginx.sh [--files N] [--file-mib N] [--parallel N]
#                                    [--rounds N] [PATH_TO_MOCK_BINARY]
#
# Both servers serve one directory of random files; curl downloads all of them
# in parallel to /dev/null. Rounds alternate between the servers (nginx, mock,
# then mock, nginx, ...) so that drift of the machine (CPU frequency, other load)
# hits both alike. The mock server runs with --anonymous so curl's unsigned
# requests are accepted; plain GETs are what its sendfile path serves.
#
# Settings (flags override the environment):
#   SF_BENCH_FILES     --files     number of files          (default 16)
#   SF_BENCH_FILE_MIB  --file-mib  size of each file in MiB (default 64)
#   SF_BENCH_PARALLEL  --parallel  curl --parallel-max      (default 16)
#   SF_BENCH_ROUNDS    --rounds    measured rounds per server (default 5)
#   SF_MOCK_S3_BIN     the mock binary when no path is given
#                      (default: build/ of this repository)
#
# Prints a per-round table and, last, the line
#   mock/nginx throughput ratio: X.XX (median of N rounds; target >= 0.80)
# Exits 0 (a benchmark, not a test) unless a server failed to start (2) or a
# transfer failed or came back short (1).
set -u -o pipefail
. "$(dirname "$0")/lib.sh"

bench_env FILES=16 FILE_MIB=64 PARALLEL=16 ROUNDS=5 MOCK_BIN:SF_MOCK_S3_BIN=

ARGS=()
bench_options --files=FILES --file-mib=FILE_MIB --parallel=PARALLEL --rounds=ROUNDS @ARGS -- "$@"
bench_positive FILES FILE_MIB PARALLEL ROUNDS
((${#ARGS[@]} <= 1)) || bench_usage
MOCK_BIN=${ARGS[0]:-$MOCK_BIN}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z $MOCK_BIN ]]; then
  for cand in "$REPO/build/shardfeed-mock-s3"; do
    [[ -x $cand ]] && { MOCK_BIN=$cand; break; }
  done
fi
[[ -n $MOCK_BIN && -x $MOCK_BIN ]] || { echo "mock server binary not found; pass its path" >&2; exit 2; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $NGINX ]] || { echo "nginx not found (looked on PATH and at /usr/sbin/nginx)" >&2; exit 2; }
command -v curl >/dev/null || { echo "curl not found" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/sf-bench-mock-vs-nginx.XXXXXX")
bench_cleanup_on_exit "$TMP"

# ---- data: generated once, then read once so both servers start from a warm page cache
BUCKET=bench
ROOT=$TMP/root
mkdir -p "$ROOT/$BUCKET"
FILE_BYTES=$((FILE_MIB * 1024 * 1024))
echo "generating $FILES x $FILE_MIB MiB of random data in $ROOT/$BUCKET ..."
for ((i = 0; i < FILES; i++)); do
  head -c "$FILE_BYTES" /dev/urandom >"$ROOT/$BUCKET/f$(printf %04d "$i")" || exit 2
done
cat "$ROOT/$BUCKET"/* >/dev/null

# ---- servers: nginx (bench/lib.sh) and the mock, anonymous, on the same folder
nginx_start "$NGINX" "$TMP/nginx" "$ROOT" "/$BUCKET/f0000"
mock_start "$MOCK_BIN" "$TMP/mock.out" --root "$ROOT" --anonymous --quiet
MOCK_URL=$URL

# One curl config per server: every file to /dev/null, parallel transfers.
for name in nginx mock; do
  url_var=${name^^}_URL
  for ((i = 0; i < FILES; i++)); do
    printf 'url = "%s/%s/f%04d"\noutput = "/dev/null"\n' "${!url_var}" "$BUCKET" "$i"
  done >"$TMP/curl-$name.conf"
done

# download NAME: one round against one server; prints MiB/s. Fails (exit 1 of
# the whole script) when curl fails or any transfer is not a full 200.
download() {
  local name=$1 t0 t1 bad
  t0=$(date +%s.%N)
  if ! curl --parallel --parallel-immediate --parallel-max "$PARALLEL" \
       --noproxy '*' -sS --no-progress-meter --fail -K "$TMP/curl-$name.conf" \
       -w '%{http_code} %{size_download}\n' >"$TMP/curl.out" 2>"$TMP/curl.err"; then
    echo "curl failed against $name:" >&2
    cat "$TMP/curl.err" >&2
    exit 1
  fi
  t1=$(date +%s.%N)
  # Every transfer must be a 200 of exactly FILE_BYTES, or a failure could look fast.
  bad=$(awk -v want="$FILE_BYTES" '$1 != 200 || $2 != want' "$TMP/curl.out")
  if [[ -n $bad || $(wc -l <"$TMP/curl.out") -ne $FILES ]]; then
    echo "short or failed transfers against $name (want $FILES x 200 $FILE_BYTES):" >&2
    sed 's/^/    /' "$TMP/curl.out" >&2
    exit 1
  fi
  awk -v n="$FILES" -v mib="$FILE_MIB" -v t0="$t0" -v t1="$t1" \
    'BEGIN { printf "%.1f\n", n * mib / (t1 - t0) }'
}

echo "nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///') at $NGINX_URL, mock at $MOCK_URL"
echo "$FILES files x $FILE_MIB MiB, curl --parallel-max $PARALLEL, $ROUNDS rounds, $(nproc) CPUs"
# Unmeasured warm-up round each: connections, server threads and the mock's
# ETag cache (the first GET of a file hashes it) are not what is measured.
download nginx >/dev/null
download mock >/dev/null

printf '%-6s %12s %12s %11s\n' round "nginx MiB/s" "mock MiB/s" mock/nginx
NGINX_RES=() MOCK_RES=() RATIOS=()
for ((r = 1; r <= ROUNDS; r++)); do
  # ABBA order: nginx first in odd rounds, mock first in even ones.
  if ((r % 2)); then n=$(download nginx) || exit 1; m=$(download mock) || exit 1
  else m=$(download mock) || exit 1; n=$(download nginx) || exit 1; fi
  ratio=$(awk -v m="$m" -v n="$n" 'BEGIN { printf "%.3f", m / n }')
  NGINX_RES+=("$n") MOCK_RES+=("$m") RATIOS+=("$ratio")
  printf '%-6s %12s %12s %11.2f\n' "$r" "$n" "$m" "$ratio"
done

printf '%-6s %12.1f %12.1f %11.2f\n' median "$(median "${NGINX_RES[@]}")" \
  "$(median "${MOCK_RES[@]}")" "$(median "${RATIOS[@]}")"
# The ratio is the median of the per-round ratios: each pairs two adjacent runs.
printf 'mock/nginx throughput ratio: %.2f (median of %d rounds; target >= 0.80)\n' \
  "$(median "${RATIOS[@]}")" "$ROUNDS"
