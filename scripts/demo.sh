#!/usr/bin/env bash
# The shardfeed demo, as far as the project goes today: build, generate a
# sample bucket, start the local S3 server on it and show it answering signed
# requests (from aws-cli and curl, two signers nobody here wrote), refusing
# bad ones, injecting a fault on demand and counting everything.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 2)
echo "== building"
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$jobs" >/dev/null

work=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== generating the sample bucket 'sample' (8 shards x 4 MiB)"
mkdir -p "$work/root/sample/train"
for i in $(seq -f '%06g' 0 7); do
  head -c $((4 << 20)) /dev/urandom > "$work/root/sample/train/shard-$i.bin"
done

AK=demo-access-key
SK=demo-secret-key
./build/shardfeed-mock-s3 --root "$work/root" --port 0 --access-key "$AK" --secret-key "$SK" \
  --quiet > "$work/server.out" &
server_pid=$!
for _ in $(seq 100); do grep -q listening "$work/server.out" 2>/dev/null && break; sleep 0.05; done
url=$(sed -n 's/^listening on //p' "$work/server.out")
echo "== shardfeed-mock-s3 $(head -n1 "$work/server.out")"

# aws-cli with an empty private config, so nothing of the user's leaks in.
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK AWS_DEFAULT_REGION=us-east-1
export AWS_CONFIG_FILE=$work/aws-config AWS_SHARED_CREDENTIALS_FILE=$work/aws-creds
printf '[default]\ns3 =\n    addressing_style = path\n' > "$AWS_CONFIG_FILE"
: > "$AWS_SHARED_CREDENTIALS_FILE"

echo
echo "== aws s3 ls s3://sample/train/   (aws-cli signs with SigV4)"
aws --endpoint-url "$url" s3 ls s3://sample/train/

echo
echo "== curl --aws-sigv4, Range: bytes=0-15 of shard-000003.bin"
curl -sS -D "$work/headers" -o "$work/range.bin" --aws-sigv4 "aws:amz:us-east-1:s3" \
  --user "$AK:$SK" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -H "Range: bytes=0-15" \
  "$url/sample/train/shard-000003.bin"
grep -iE '^(HTTP|content-range|etag)' "$work/headers"
cmp <(head -c 16 "$work/root/sample/train/shard-000003.bin") "$work/range.bin" &&
  echo "   16 bytes, identical to the file on disk"

echo
echo "== an unsigned request"
curl -sS "$url/sample/train/shard-000000.bin" | grep -o '<Code>[^<]*</Code>'
echo "== a request signed with the wrong secret"
curl -sS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AK:wrong-secret" \
  -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$url/sample/train/shard-000000.bin" |
  grep -o '<Code>[^<]*</Code>'
echo "== a forced fault (x-sfmock-fault: 503)"
curl -sS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AK:$SK" \
  -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -H "x-sfmock-fault: 503" \
  -o /dev/null -w '   HTTP %{http_code}\n' "$url/sample/train/shard-000001.bin"

echo
echo "== shardfeed ls s3://sample/train/"
export AWS_EC2_METADATA_DISABLED=true
./build/shardfeed ls --endpoint-url "$url" s3://sample/train/
echo "== shardfeed get 's3://sample/train/shard-{000000..000007}.bin' -o shards/  (2 MiB ranges, 8 in flight)"
curl -sS -X POST "$url/_mock/fault?prefix=sample/train/shard-000002&fault=reset=1000000&count=1" >/dev/null
curl -sS -X POST "$url/_mock/fault?prefix=sample/train/shard-000005&fault=503&count=2" >/dev/null
echo "   (a connection reset queued for shard 2, two 503s for shard 5)"
./build/shardfeed get -v --endpoint-url "$url" --concurrency 8 --chunk-size 2M --json \
  's3://sample/train/shard-{000000..000007}.bin' -o "$work/shards/" 2> "$work/get.err" |
  python3 -c '
import json, sys
d = json.load(sys.stdin)
print("   %d objects, %d bytes, %d requests, %d retries, %.0f MiB/s" % (len(d["objects"]), d["bytes"], d["requests"], d["retries"], d["mib_per_s"]))'
sed 's/^/   /' "$work/get.err"
if cmp -s "$work/shards/shard-000002.bin" "$work/root/sample/train/shard-000002.bin" &&
   cmp -s "$work/shards/shard-000005.bin" "$work/root/sample/train/shard-000005.bin"; then
  echo "   byte-identical to the files on disk despite the faults"
else
  echo "   MISMATCH"; exit 1
fi
echo "== shardfeed stat of a missing key (exit status 1, the reason on stderr)"
./build/shardfeed stat --endpoint-url "$url" s3://sample/train/nope.bin 2>&1 | sed 's/^/   /' || true

echo
echo "== /_mock/stats"
curl -sS "$url/_mock/stats" | python3 -c '
import json, sys
s = json.load(sys.stdin)
print("   requests:", s["requests"], " operations:", s["operations"], " status:", s["status"])'

kill "$server_pid"
wait "$server_pid" && echo "== server stopped cleanly (exit 0)"
server_pid=""
