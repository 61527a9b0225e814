#!/bin/sh
# Server CPU per gRPC decision, measured with h2load (an efficient HTTP/2 client, so the
# server's cost is not hidden behind the load generator's), for one or more inbound-web
# binaries in turns on the same machine (docs/performance.md, "gRPC rate-limit service").
#
#   bench/rl-bench/grpc-cpu.sh [ROUNDS] BIN [BIN...]    (needs h2load: Debian nghttp2-client)
#
# Each binary serves ShouldRateLimit with the local provider and a policy that admits every
# call; h2load sends N calls (default 200,000) with one descriptor each over 2 connections,
# 32 streams each. Printed per run: calls/s, mean latency, and the server's CPU (utime +
# stime from /proc/PID/stat) per call in microseconds.
set -eu
ROUNDS=${1:-3}; shift
N=${N:-200000}
PORT=${PORT:-18197}
HPORT=${HPORT:-18198}
TMP=$(mktemp -d)
trap 'kill $APID 2>/dev/null || true; rm -rf "$TMP"' EXIT
. "$(dirname "$0")/grpc-call.sh"
bench_app_config "$HPORT" "$PORT" > "$TMP/app.toml"
rls_call k-1
tick=$(getconf CLK_TCK)
round=1
while [ "$round" -le "$ROUNDS" ]; do
  for BIN in "$@"; do
    RUST_LOG=warn "$BIN" --config "$TMP/app.toml" 2>"$TMP/app.log" &
    APID=$!
    for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done
    # Warm-up, then the measured run.
    rls_h2load "$PORT" -n 5000 >/dev/null
    before=$(app_cpu)
    out=$(rls_h2load "$PORT" -n "$N")
    after=$(app_cpu)
    done_calls=$(echo "$out" | awk '/^requests:/ {print $8}')
    rps=$(echo "$out" | awk '/^finished in/ {print $4}')
    mean=$(echo "$out" | awk '/^time for request:/ {print $6}')
    awk -v b="$before" -v a="$after" -v n="$done_calls" -v t="$tick" -v rps="$rps" -v m="$mean" \
      -v bin="$BIN" -v r="$round" \
      'BEGIN { printf "round %d  %s  calls/s %s  mean %s  ok %s  server CPU per call %.2f us\n", r, bin, rps, m, n, (a - b) / t / n * 1e6 }'
    kill "$APID"; wait "$APID" 2>/dev/null || true
  done
  round=$((round + 1))
done
