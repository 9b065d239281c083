# Shared by the bench scripts (source it): start shardfeed-mock-s3 and point
# the AWS variables at it. Each script keeps its own options and data.

# mock_start BIN OUT [ARGS...]: starts the mock in the background on a free
# port with ARGS (--root DIR, --fault ..., --quiet), its stdout in OUT and
# stderr in OUT.err; waits for its "listening on" line. Sets MOCK_PID and
# URL; exits 2 naming the failure when it does not start.
mock_start() {
  local bin=$1 out=$2
  shift 2
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
  unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_CA_BUNDLE
  export AWS_ACCESS_KEY_ID=mock-access-key AWS_SECRET_ACCESS_KEY=mock-secret-key
  export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
}
