#!/bin/sh
# The gRPC rate-limit service beside the HTTP sidecar, one after the other on one release
# binary with the local provider (docs/performance.md, "gRPC rate-limit service").
#
#   bench/rl-bench/grpc-compare.sh [DURATION] [CONCURRENCY]    (default 10s, 64; needs wrk)
#
# The same app serves both: `[grpc] bind` for ShouldRateLimit (driven by rl-bench --provider
# grpc, one descriptor per call over 2 HTTP/2 connections) and POST /v1/evaluate (driven by
# wrk -t2, the sidecar's usual load generator). Random subjects over 1,000,000 and a policy
# that admits all of them, so both figures are the cost of evaluating, not of answering
# "over limit". Load generator and app share this machine's cores.
set -eu
D=${1:-10s}
C=${2:-64}
HERE=$(cd "$(dirname "$0")" && pwd)
T=${CARGO_TARGET_DIR:-target}/release
HPORT=${HPORT:-18098}
GPORT=${GPORT:-18097}
TMP=$(mktemp -d)
trap 'kill $APID 2>/dev/null; rm -rf "$TMP"' EXIT
cat > "$TMP/app.toml" <<TOML
[http]
bind = "127.0.0.1:$HPORT"

[grpc]
bind = "127.0.0.1:$GPORT"

[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "token_bucket"
capacity = 1000000000
refill_amount = 1000000000
refill_interval = "1s"

[[rls.descriptors]]
domain = "bench"
entries = ["key"]
policy = "api"
TOML
RUST_LOG=warn "$T/inbound-web" --config "$TMP/app.toml" 2>"$TMP/app.log" &
APID=$!
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done

echo "== grpc: rl-bench --provider grpc --concurrency $C --connections 2 --duration $D (random keys over 1,000,000)"
"$T/rl-bench" --provider grpc --grpc-addr "127.0.0.1:$GPORT" --algorithm token_bucket \
  --keys 1000000 --concurrency "$C" --connections 2 --duration "$D"

echo "== http sidecar: wrk -t2 -c$C -d$D --latency POST /v1/evaluate (random subjects over 1,000,000)"
wrk -t2 -c"$C" -d"$D" --latency -s "$HERE/../http-sidecar/evaluate.lua" \
  "http://127.0.0.1:$HPORT/v1/evaluate" | grep -E "Requests/sec|50%|99%|Non-2xx|Socket errors"
