#!/bin/sh
# HTTP-layer benchmark of inbound-web (docs/performance.md, "HTTP layer (inbound-web)").
#
#   bench/http-sidecar/run.sh [DURATION]      (default 10s; needs wrk, hey, redis-server)
#
# Starts one private redis-server and the release binary in four configurations, one at a
# time, all on this machine (load generator, app and Redis share its cores):
#   off     rate limiting disabled: the demo route alone
#   local   the middleware with the local provider
#   redis   the middleware with the redis provider
#   sidecar POST /v1/evaluate with the redis provider (wrk -t2 -c64 --latency, random subjects)
# Every limited run uses random subjects over 1,000,000 and a policy that admits all of them,
# so the figures are the cost of evaluating, not of answering 429.
set -eu
D=${1:-10s}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/inbound-web}
RPORT=${RPORT:-16399}
HPORT=${HPORT:-18099}
TMP=$(mktemp -d)
. "$HERE/common.sh"
trap 'kill $RPID 2>/dev/null; kill $APID 2>/dev/null; rm -rf "$TMP"' EXIT
start_redis

for mode in off local redis; do
  start $mode
  echo "== $mode: wrk -t2 -c64 -d$D --latency GET /api/x (random x-api-key)"
  wrk -t2 -c64 -d"$D" --latency -s "$HERE/random-key.lua" "http://127.0.0.1:$HPORT/api/x" | grep -E "Requests/sec|50%|99%|Non-2xx|Socket errors"
  stop
done

start redis
echo "== sidecar: wrk -t2 -c64 -d15s --latency POST /v1/evaluate (redis, random subjects over 1,000,000)"
wrk -t2 -c64 -d15s --latency -s "$HERE/evaluate.lua" "http://127.0.0.1:$HPORT/v1/evaluate" | grep -E "Requests/sec|50%|90%|99%|Non-2xx|Socket errors"
stop

if [ -n "${HALF_RATE:-}" ]; then
  # p99 at a fixed offered load (hey -q is per worker): HALF_RATE requests/s in total.
  start redis
  echo "== redis middleware at a fixed ${HALF_RATE} req/s (hey, 32 workers)"
  hey -z "$D" -c 32 -q $((HALF_RATE / 32)) -H "x-api-key: fixed-rate" "http://127.0.0.1:$HPORT/api/x" | grep -E "Requests/sec|99%|50%|\[2|\[4|\[5"
  stop
fi
