# Shared by the bench scripts (source it): shardfeed-mock-s3 (and nginx) to
# run against with the AWS variables pointed at it, temp dirs and sample data,
# the scripts' settings and option parsing, build check and cleanup, output
# checks and medians. Each script keeps its own settings, runs and figures.

# mock_start BIN OUT [ARGS...]: starts the mock in the background on a free
# port with ARGS (--root DIR, --fault ..., --quiet), its stdout in OUT and
# stderr in OUT.err; waits for its "listening on" line. Sets MOCK_PID and
# URL; exits 2 naming the failure when it does not start.
mock_start() {
  local bin=$1 out=$2
  shift 2
  : >"$out"  # exists before the background job opens it: the poll below never reads a missing file
  "$bin" --port 0 "$@" </dev/null >"$out" 2>"$out.err" &
  MOCK_PID=$!
  URL=
  for _ in $(seq 100); do
    URL=$(sed -n 's/^listening on \(https\{0,1\}:\/\/[0-9.:]*\)$/\1/p' "$out")
    [[ -n $URL ]] && return 0
    kill -0 "$MOCK_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "shardfeed-mock-s3 did not start: $(head -c 300 "$out") $(head -c 300 "$out.err")" >&2
  exit 2
}

# mock_env: the mock's keys and region; nothing else of the caller's AWS
# environment (profiles, endpoints, tokens) leaks into a run.
mock_env() {
  unset AWS_PROFILE AWS_DEFAULT_PROFILE AWS_SESSION_TOKEN AWS_SECURITY_TOKEN AWS_ENDPOINT_URL \
    AWS_ENDPOINT_URL_S3 S3_ENDPOINT_URL AWS_CA_BUNDLE
  export AWS_ACCESS_KEY_ID=mock-access-key AWS_SECRET_ACCESS_KEY=mock-secret-key
  export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
}

# proc_stop PID: SIGTERM, then SIGKILL after 5 s, and reaps it. Never fails
# (it runs in EXIT traps); an empty PID or one already gone is fine.
proc_stop() {
  local pid=$1
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# roomy_tmp NAME NEED_KIB [PARENT]: a new temp dir NAME.XXXXXX under PARENT,
# else /dev/shm when it has NEED_KIB free, else /tmp; prints its path.
roomy_tmp() {
  local parent=${3:-}
  if [[ -z $parent ]]; then
    parent=/tmp
    if [[ -d /dev/shm ]] && (($(df -Pk /dev/shm | awk 'NR == 2 { print $4 }') > $2)); then
      parent=/dev/shm
    fi
  fi
  mktemp -d "$parent/$1.XXXXXX"
}

# nginx_start NGINX DIR ROOT PROBE: nginx in the foreground serving ROOT on a
# free port of 127.0.0.1, its config, logs and temp files under DIR (Debian's
# nginx has absolute compiled-in temp and log paths: overridden so it runs as
# any user). Ready when PROBE (a path, /bench/f0000) answers 200. Sets
# NGINX_PID and NGINX_URL; exits 2 with nginx's log when it does not start.
nginx_start() {
  local nginx=$1 dir=$2 root=$3 probe=$4 port user_line=
  mkdir -p "$dir/tmp"
  # As root, nginx would drop its workers to "nobody", who cannot read ROOT.
  [[ $(id -u) -eq 0 ]] && user_line="user $(id -un) $(id -gn);"
  for _ in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 40000))
    cat >"$dir/nginx.conf" <<CONF
$user_line
worker_processes auto;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 65;
  keepalive_requests 100000;
  default_type application/octet-stream;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  server {
    listen 127.0.0.1:$port;
    root $root;
  }
}
CONF
    "$nginx" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon off;' \
      </dev/null >/dev/null 2>>"$dir/error.log" &
    NGINX_PID=$!
    for _ in $(seq 50); do
      kill -0 "$NGINX_PID" 2>/dev/null || break # exited: port taken or bad config
      if curl -s -f -o /dev/null --noproxy '*' "http://127.0.0.1:$port$probe"; then
        NGINX_URL=http://127.0.0.1:$port
        return 0
      fi
      sleep 0.1
    done
    proc_stop "$NGINX_PID"
    NGINX_PID=
    grep -q 'Address already in use' "$dir/error.log" || break
  done
  echo "nginx did not start:" >&2
  cat "$dir/error.log" >&2
  exit 2
}

# sample_photos VAR TMP PER_PHOTO BUILD_DIR: when $VAR is empty, makes an
# ImageFolder of JPEGs in TMP/photos (scripts/make-sample-dataset.sh, PER_PHOTO
# images cut from each photograph; its output on stderr) and sets VAR to it.
# Exits 2 when it cannot.
sample_photos() {
  local -n photos_var=$1
  [[ -z $photos_var ]] || return 0
  photos_var=$2/photos
  bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/make-sample-dataset.sh" "$photos_var" \
    --per-photo "$3" --build-dir "$4" >&2 ||
    { echo "$(basename "$0" .sh): the sample dataset could not be made" >&2; exit 2; }
}

# bench_photos_setup NAME PER_PHOTO PROGRAM...: what a bench over sample
# photos does after reading its options: bench_build PROGRAMs, then TMP a new
# temp dir /tmp/NAME.XXXXXX removed at exit, and PHOTOS, when empty, sample
# photos made in it (PER_PHOTO from each photograph, sample_photos).
bench_photos_setup() {
  bench_build "${@:3}"
  TMP=$(mktemp -d "/tmp/$1.XXXXXX")
  bench_cleanup_on_exit "$TMP"
  sample_photos PHOTOS "$TMP" "$2" "$BUILD_DIR"
}

# bench_usage: prints the script's "# Usage:" comment (that line and the
# indented comment lines under it) on stderr and exits 2.
bench_usage() {
  awk '/^# Usage:/ { on = 1; sub(/^# /, ""); print; next }
       on && /^#  / { sub(/^# /, ""); print; next }
       on { exit }' "$0" >&2
  exit 2
}

# bench_env SETTING...: the script's settings from the environment, before
# bench_options reads its flags over them. `ROUNDS=5`: ROUNDS is
# $SF_BENCH_ROUNDS when that is set and not empty, else 5.
# `TMP_PARENT:SF_BENCH_TMPDIR=`: the same with the environment variable named
# (here with an empty default), for a variable called otherwise.
bench_env() {
  local _setting _var _env
  for _setting in "$@"; do
    _var=${_setting%%=*}
    _env=SF_BENCH_$_var
    [[ $_var != *:* ]] || _env=${_var#*:} _var=${_var%%:*}
    printf -v "$_var" '%s' "${!_env:-${_setting#*=}}"
  done
}

# bench_options SPEC... -- ARGS...: reads the script's arguments ARGS as the
# SPECs say. `--rounds=ROUNDS`: an option with a value (`--rounds 3` sets
# ROUNDS=3). `--no-aws=USE_AWS=0`: a flag (sets USE_AWS=0). `@EXTRA`: the
# words that are not options, and all after a `--`, are added to the array
# EXTRA (without it they are an error). -h, --help, an unknown option or one
# without its value: bench_usage.
bench_options() {
  local -A _with_value=() _flag=()
  local _spec _rest=
  while [[ $1 != -- ]]; do
    _spec=$1
    shift
    case $_spec in
      @*) _rest=${_spec#@} ;;
      *=*=*) _flag[${_spec%%=*}]=${_spec#*=} ;;
      *) _with_value[${_spec%%=*}]=${_spec#*=} ;;
    esac
  done
  shift
  [[ -z $_rest ]] || local -n _extra=$_rest
  while (($#)); do
    if [[ -n ${_with_value[$1]:-} ]]; then
      (($# >= 2)) || { echo "$(basename "$0" .sh): $1 needs a value" >&2; bench_usage; }
      printf -v "${_with_value[$1]}" '%s' "$2"
      shift 2
    elif [[ -n ${_flag[$1]:-} ]]; then
      printf -v "${_flag[$1]%%=*}" '%s' "${_flag[$1]#*=}"
      shift
    elif [[ -n $_rest && $1 == -- ]]; then
      shift
      _extra+=("$@")
      return 0
    elif [[ -n $_rest && $1 != -* ]]; then
      _extra+=("$1")
      shift
    else
      [[ $1 == -h || $1 == --help ]] || echo "$(basename "$0" .sh): unknown argument: $1" >&2
      bench_usage
    fi
  done
}

# bench_positive NAME...: exits 2 unless each variable NAME holds a whole
# number of at least 1.
bench_positive() {
  local name
  for name in "$@"; do
    [[ ${!name} =~ ^[1-9][0-9]*$ ]] && continue
    echo "$(basename "$0" .sh): $name must be a positive integer, not '${!name}'" >&2
    exit 2
  done
}

# bench_build PROGRAM...: REPO is the repository; BUILD_DIR, when empty, its
# build/; SF and MOCK the CLI and the mock server in it. Exits 2 naming the
# first BUILD_DIR/PROGRAM that is not built.
bench_build() {
  local program
  REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  BUILD_DIR=${BUILD_DIR:-$REPO/build}
  SF=$BUILD_DIR/shardfeed MOCK=$BUILD_DIR/shardfeed-mock-s3
  for program in "$@"; do
    [[ -x $BUILD_DIR/$program ]] ||
      { echo "$(basename "$0" .sh): missing $BUILD_DIR/$program: build first (cmake --build build)" >&2; exit 2; }
  done
}

# bench_cleanup_on_exit PATH...: when the script exits, stops the mock
# (MOCK_PID) and nginx (NGINX_PID) if they run and removes the PATHs; INT and
# TERM exit 130.
bench_cleanup_on_exit() {
  MOCK_PID=${MOCK_PID:-} NGINX_PID=${NGINX_PID:-}
  BENCH_CLEANUP_PATHS=("$@")
  trap 'proc_stop "$NGINX_PID"; proc_stop "$MOCK_PID"; rm -rf "${BENCH_CLEANUP_PATHS[@]}"' EXIT
  trap 'exit 130' INT TERM
}

# json_field KEY [FILE]: prints KEY of the JSON object in FILE (else stdin).
json_field() {
  python3 -c 'import json, sys
print(json.load(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin)[sys.argv[1]])' "$@"
}

# median VALUE...: the median of the numbers in the VALUEs, each one number or
# a list of them separated by blanks (the mean of the middle two when there is
# an even count; an empty line when there is none).
median() {
  printf '%s\n' "$@" | awk '{ for (i = 1; i <= NF; i++) print $i }' | sort -g |
    awk '{ v[NR] = $1 }
      END { print NR == 0 ? "" : (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# median_of_ratios NUMS DENS [FORMAT]: the median over i of NUMS[i] / DENS[i],
# each ratio printed with FORMAT (default %.6g, awk's own) first. NUMS and
# DENS are lists of numbers in one word each, e.g. the times of two tools in
# the same rounds.
median_of_ratios() {
  local -a nums dens ratios=()
  local i
  read -ra nums <<<"$1"
  read -ra dens <<<"$2"
  for i in "${!nums[@]}"; do
    ratios+=("$(awk -v x="${nums[$i]}" -v y="${dens[$i]}" -v f="${3:-%.6g}" \
      'BEGIN { printf f, x / y }')")
  done
  median "${ratios[@]}"
}

# random_objects DIR COUNT MIB SUMS: COUNT files obj-00.bin, obj-01.bin... of
# MIB MiB of random bytes in DIR, their sha256 list in SUMS; sets NAMES to
# their names.
random_objects() {
  local dir=$1 count=$2 mib=$3 sums=$4 i name
  NAMES=()
  for ((i = 0; i < count; i++)); do NAMES+=("$(printf 'obj-%02d.bin' "$i")"); done
  for name in "${NAMES[@]}"; do head -c $((mib << 20)) /dev/urandom >"$dir/$name"; done
  (cd "$dir" && sha256sum -- "${NAMES[@]}") >"$sums"
}

# check_outputs LABEL DIR COUNT SUMS FULL: exits 1 unless DIR holds COUNT
# files; FULL=1 also checks their bytes against the sha256 list SUMS.
check_outputs() {
  local label=$1 dir=$2 count=$3 sums=$4 full=$5 n
  n=$(find "$dir" -type f | wc -l)
  ((n == count)) || { echo "$label: $n files in the output, want $count" >&2; exit 1; }
  if ((full)); then
    (cd "$dir" && sha256sum --quiet -c "$sums") >&2 || { echo "$label: WRONG BYTES" >&2; exit 1; }
  fi
}
