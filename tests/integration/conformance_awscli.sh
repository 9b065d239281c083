#!/usr/bin/env bash
# Conformance test: drive shardfeed-mock-s3 with the aws CLI, a client nobody here wrote.
#
# Usage: bash conformance_awscli.sh PATH_TO_BINARY
#
# Starts the server on a free port with a fresh temporary root, runs each check
# (one PASS/FAIL line each), stops the server with SIGTERM and prints a final
# line "N passed, M failed". Exits non-zero if any check failed.
set -u -o pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: bash $0 PATH_TO_BINARY" >&2
  exit 2
fi
SERVER_BIN=$1
if ! command -v aws >/dev/null; then
  echo "FAIL the aws CLI is not on PATH"
  echo "0 passed, 1 failed"
  exit 1
fi
ACCESS_KEY=cli-access-key
SERVER_SECRET=cli-secret-key
BUCKET=cli-bucket

TMP=$(mktemp -d "${TMPDIR:-/tmp}/sf-conformance-awscli.XXXXXX")
SERVER_PID=
cleanup() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "PASS $1"; }
fail() {
  FAILED=$((FAILED + 1)); echo "FAIL $1"
  # Show what the failing command printed, indented, to make the failure readable.
  [[ -s $TMP/out ]] && sed 's/^/    | /' "$TMP/out" | head -n 20
  return 0
}
# run NAME CMD...: the check passes when CMD exits 0. CMD's output goes to $TMP/out.
run() {
  local name=$1; shift
  if "$@" >"$TMP/out" 2>&1; then pass "$name"; else fail "$name (exit $?)"; fi
}

# ---- isolate the CLI from the user's AWS configuration ------------------------
# Drop every AWS_* variable (profiles, endpoints, tokens), then point the CLI at a
# config file of our own: path-style addressing is what the server supports.
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^AWS_')
cat >"$TMP/aws-config" <<'EOF'
[default]
region = us-east-1
s3 =
    addressing_style = path
EOF
export AWS_CONFIG_FILE=$TMP/aws-config
export AWS_SHARED_CREDENTIALS_FILE=/dev/null
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SERVER_SECRET
export AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
export AWS_PAGER=
export AWS_MAX_ATTEMPTS=1   # no retries: the test must see the first answer
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

# ---- start the server --------------------------------------------------------
mkdir "$TMP/root" "$TMP/data"
# stdout goes to a file (never a pipe that could fill up); the port is read
# from its first line.
"$SERVER_BIN" --port 0 --root "$TMP/root" \
  --access-key "$ACCESS_KEY" --secret-key "$SERVER_SECRET" --quiet \
  >"$TMP/server.out" 2>"$TMP/server.err" </dev/null &
SERVER_PID=$!
LINE=
for _ in $(seq 150); do
  # Only a complete line counts: the server may not have flushed the newline yet.
  if [[ $(wc -l <"$TMP/server.out") -ge 1 ]]; then LINE=$(head -n 1 "$TMP/server.out"); break; fi
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if [[ $LINE =~ ^listening\ on\ (http://127\.0\.0\.1:[0-9]+)$ ]]; then
  URL=${BASH_REMATCH[1]}
  pass "server starts and prints its port ($URL)"
else
  FAILED=$((FAILED + 1))
  echo "FAIL server starts and prints its port: first line was '${LINE}'"
  sed 's/^/    | /' "$TMP/server.err" | head -n 20
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi

aws() { command aws --endpoint-url "$URL" "$@"; }

# ---- test data ---------------------------------------------------------------
head -c 100000 /dev/urandom >"$TMP/data/small.bin"
head -c 3000000 /dev/urandom >"$TMP/data/three-mb.bin"   # under the 8 MiB multipart threshold
head -c 20000000 /dev/urandom >"$TMP/data/twenty-mb.bin" # over it: a multipart upload
printf 'hello from the aws cli\n' >"$TMP/data/with space.txt"
mkdir -p "$TMP/data/tree/sub"
for i in 1 2 3; do echo "tree file $i" >"$TMP/data/tree/f$i.txt"; done
echo "nested" >"$TMP/data/tree/sub/nested.txt"

# ---- checks ------------------------------------------------------------------
run "aws s3 mb s3://$BUCKET" aws s3 mb "s3://$BUCKET"

run "aws s3 cp upload small.bin" aws s3 cp "$TMP/data/small.bin" "s3://$BUCKET/small.bin"
run "aws s3 cp upload 3 MB file" aws s3 cp "$TMP/data/three-mb.bin" "s3://$BUCKET/dir/three-mb.bin"
run "aws s3 cp upload key with a space" \
  aws s3 cp "$TMP/data/with space.txt" "s3://$BUCKET/dir/with space.txt"
run "aws s3 cp --recursive upload of a tree" \
  aws s3 cp --recursive "$TMP/data/tree" "s3://$BUCKET/tree/"

run "aws s3 cp upload 20 MB file (multipart)" \
  aws s3 cp "$TMP/data/twenty-mb.bin" "s3://$BUCKET/big/twenty-mb.bin"

mkdir "$TMP/down"
for pair in "small.bin:small.bin" "dir/three-mb.bin:three-mb.bin" "dir/with space.txt:with space.txt"; do
  key=${pair%%:*} file=${pair#*:}
  name="aws s3 cp download $key matches (cmp)"
  if aws s3 cp "s3://$BUCKET/$key" "$TMP/down/$file" >"$TMP/out" 2>&1 &&
     cmp "$TMP/data/$file" "$TMP/down/$file" >>"$TMP/out" 2>&1; then
    pass "$name"
  else
    fail "$name"
  fi
done

# The CLI sends 8 MiB parts: 3 parts, and S3's ETag is the md5 of the parts' md5s, "-3".
name="aws s3 cp of the 20 MB multipart object back matches; ETag is md5 of md5s -3"
want_etag=$(python3 - "$TMP/data/twenty-mb.bin" <<'PY'
import hashlib, sys
data = open(sys.argv[1], "rb").read()
step = 8 * 1024 * 1024
md5s = b"".join(hashlib.md5(data[i:i + step]).digest() for i in range(0, len(data), step))
print('"%s-%d"' % (hashlib.md5(md5s).hexdigest(), (len(data) + step - 1) // step))
PY
)
if aws s3 cp "s3://$BUCKET/big/twenty-mb.bin" "$TMP/down/twenty-mb.bin" >"$TMP/out" 2>&1 &&
   cmp "$TMP/data/twenty-mb.bin" "$TMP/down/twenty-mb.bin" >>"$TMP/out" 2>&1 &&
   aws s3api head-object --bucket "$BUCKET" --key big/twenty-mb.bin \
     --query ETag --output text >"$TMP/etag" 2>>"$TMP/out" &&
   [[ $(cat "$TMP/etag") == "$want_etag" ]]; then
  pass "$name"
else
  echo "ETag $(cat "$TMP/etag" 2>/dev/null), want $want_etag" >>"$TMP/out"
  fail "$name"
fi

name="aws s3api multipart: create, upload-part, list-parts, abort leaves nothing"
if up=$(aws s3api create-multipart-upload --bucket "$BUCKET" --key mp/aborted \
          --query UploadId --output text 2>"$TMP/out") &&
   aws s3api upload-part --bucket "$BUCKET" --key mp/aborted --upload-id "$up" \
     --part-number 1 --body "$TMP/data/small.bin" >>"$TMP/out" 2>&1 &&
   [[ $(aws s3api list-parts --bucket "$BUCKET" --key mp/aborted --upload-id "$up" \
          --query 'Parts[].Size' --output text 2>>"$TMP/out") == 100000 ]] &&
   [[ $(aws s3api list-multipart-uploads --bucket "$BUCKET" \
          --query 'Uploads[].UploadId' --output text 2>>"$TMP/out") == "$up" ]] &&
   aws s3api abort-multipart-upload --bucket "$BUCKET" --key mp/aborted --upload-id "$up" \
     >>"$TMP/out" 2>&1 &&
   [[ $(aws s3api list-multipart-uploads --bucket "$BUCKET" \
          --query 'length(Uploads || `[]`)' --output text 2>>"$TMP/out") == 0 ]] &&
   ! aws s3api head-object --bucket "$BUCKET" --key mp/aborted >>"$TMP/out" 2>&1; then
  pass "$name"
else
  fail "$name"
fi

name="aws s3 cp --recursive download of a prefix matches (diff -r)"
if aws s3 cp --recursive "s3://$BUCKET/tree/" "$TMP/down/tree" >"$TMP/out" 2>&1 &&
   diff -r "$TMP/data/tree" "$TMP/down/tree" >>"$TMP/out" 2>&1; then
  pass "$name"
else
  fail "$name"
fi

name="aws s3 ls lists the bucket"
if aws s3 ls >"$TMP/out" 2>&1 && grep -q " $BUCKET\$" "$TMP/out"; then pass "$name"; else fail "$name"; fi

# Top level: one object and the rolled-up prefixes big/, dir/ and tree/.
name="aws s3 ls s3://$BUCKET/ shows PRE big/, PRE dir/, PRE tree/ and small.bin"
if aws s3 ls "s3://$BUCKET/" >"$TMP/out" 2>&1 &&
   grep -Eq '^ +PRE dir/$' "$TMP/out" && grep -Eq '^ +PRE tree/$' "$TMP/out" &&
   grep -Eq '^ +PRE big/$' "$TMP/out" &&
   grep -Eq ' 100000 small\.bin$' "$TMP/out" && [[ $(wc -l <"$TMP/out") -eq 4 ]]; then
  pass "$name"
else
  fail "$name"
fi

# --recursive prints "DATE TIME SIZE KEY"; compare key and size of every object.
name="aws s3 ls --recursive lists every key with its size"
cat >"$TMP/want" <<EOF
20000000 big/twenty-mb.bin
3000000 dir/three-mb.bin
23 dir/with space.txt
100000 small.bin
12 tree/f1.txt
12 tree/f2.txt
12 tree/f3.txt
7 tree/sub/nested.txt
EOF
if aws s3 ls --recursive "s3://$BUCKET/" >"$TMP/out" 2>&1 &&
   awk '{ size = $3; sub(/^[^ ]+ +[^ ]+ +[^ ]+ /, ""); print size, $0 }' "$TMP/out" |
     sort -k2 >"$TMP/got" && diff "$TMP/want" "$TMP/got" >>"$TMP/out" 2>&1; then
  pass "$name"
else
  fail "$name"
fi

name="aws s3api get-object --range bytes=0-9"
if aws s3api get-object --bucket "$BUCKET" --key small.bin --range bytes=0-9 \
     "$TMP/down/range.bin" >"$TMP/out" 2>&1 &&
   grep -q '"ContentRange": "bytes 0-9/100000"' "$TMP/out" &&
   [[ $(stat -c %s "$TMP/down/range.bin") -eq 10 ]] &&
   cmp -n 10 "$TMP/data/small.bin" "$TMP/down/range.bin" >>"$TMP/out" 2>&1; then
  pass "$name"
else
  fail "$name"
fi

name="aws s3api head-object: ContentLength and ETag (quoted md5)"
md5=$(md5sum "$TMP/data/small.bin" | cut -d' ' -f1)
if aws s3api head-object --bucket "$BUCKET" --key small.bin >"$TMP/out" 2>&1 &&
   grep -q '"ContentLength": 100000' "$TMP/out" &&
   grep -q "\"ETag\": \"\\\\\"$md5\\\\\"\"" "$TMP/out"; then
  pass "$name"
else
  fail "$name"
fi

name="aws s3api list-objects-v2 --page-size 1 pages through 4 keys"
if aws s3api list-objects-v2 --bucket "$BUCKET" --prefix tree/ --page-size 1 \
     --query 'Contents[].Key' --output text >"$TMP/out" 2>&1 &&
   [[ $(wc -w <"$TMP/out") -eq 4 ]]; then
  pass "$name"
else
  fail "$name"
fi

run "aws s3 rm s3://$BUCKET/small.bin" aws s3 rm "s3://$BUCKET/small.bin"

name="after rm: head-object fails with 404 and ls no longer shows it"
if ! aws s3api head-object --bucket "$BUCKET" --key small.bin >"$TMP/out" 2>&1 &&
   grep -q '404' "$TMP/out" &&
   aws s3 ls "s3://$BUCKET/" >"$TMP/out" 2>&1 && ! grep -q 'small\.bin' "$TMP/out"; then
  pass "$name"
else
  fail "$name"
fi

name="aws s3 cp of a missing key fails with 404"
if ! aws s3 cp "s3://$BUCKET/no/such/key" "$TMP/down/none" >"$TMP/out" 2>&1 &&
   grep -q '404' "$TMP/out"; then
  pass "$name"
else
  fail "$name"
fi

name="aws s3 ls of a missing bucket fails with NoSuchBucket"
if ! aws s3 ls "s3://no-such-bucket/" >"$TMP/out" 2>&1 && grep -q 'NoSuchBucket' "$TMP/out"; then
  pass "$name"
else
  fail "$name"
fi

name="wrong secret -> SignatureDoesNotMatch and non-zero exit"
if ! AWS_SECRET_ACCESS_KEY=wrong-secret aws s3 ls "s3://$BUCKET/" >"$TMP/out" 2>&1 &&
   grep -q 'SignatureDoesNotMatch' "$TMP/out"; then
  pass "$name"
else
  fail "$name"
fi

name="wrong secret on upload -> SignatureDoesNotMatch and non-zero exit"
if ! AWS_SECRET_ACCESS_KEY=wrong-secret aws s3 cp "$TMP/data/small.bin" "s3://$BUCKET/x" \
     >"$TMP/out" 2>&1 && grep -q 'SignatureDoesNotMatch' "$TMP/out"; then
  pass "$name"
else
  fail "$name"
fi

name="wrong access key -> InvalidAccessKeyId and non-zero exit"
if ! AWS_ACCESS_KEY_ID=AKIDUNKNOWN aws s3 ls "s3://$BUCKET/" >"$TMP/out" 2>&1 &&
   grep -q 'InvalidAccessKeyId' "$TMP/out"; then
  pass "$name"
else
  fail "$name"
fi

run "aws s3 rm --recursive empties the bucket" aws s3 rm --recursive "s3://$BUCKET/"
run "aws s3 rb removes the empty bucket" aws s3 rb "s3://$BUCKET"

name="bucket folder is gone from the root"
if [[ ! -e $TMP/root/$BUCKET ]]; then pass "$name"; else : >"$TMP/out"; fail "$name"; fi

# ---- shutdown ----------------------------------------------------------------
name="SIGTERM -> exit status 0 within 10 s"
kill -TERM "$SERVER_PID"
status=timeout
for _ in $(seq 100); do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    wait "$SERVER_PID"; status=$?
    break
  fi
  sleep 0.1
done
: >"$TMP/out"
if [[ $status == 0 ]]; then pass "$name"; else fail "$name (status: $status)"; fi

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
