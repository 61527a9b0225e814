#!/bin/sh
# The exact denial cache on and off through the two edges of one release inbound-web, Redis
# provider: the HTTP sidecar's /v1/evaluate under wrk (9 of 10 requests for one hot subject,
# bench/http-sidecar/hot-key.lua) and the gRPC ShouldRateLimit under h2load (one hot
# descriptor). Per run: requests/s, latency, 429 / OVER_LIMIT share, and the server's CPU
# (utime + stime from /proc/PID/stat) per request. Runs take turns, cache off then on.
#
#   bench/rl-bench/deny-cache-edges.sh [ROUNDS] [SECONDS]   (defaults 3, 5)
# Needs a release build (cargo build --release -p inbound-web; BIN= overrides), wrk, h2load
# (Debian nghttp2-client), redis-server. Loopback ports 18297-18299 (PORT, HPORT, RPORT).
set -eu
ROUNDS=${1:-3}
SECS=${2:-5}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/inbound-web}
N=${N:-300000}
PORT=${PORT:-18297}; HPORT=${HPORT:-18298}; RPORT=${RPORT:-18299}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p inbound-web" >&2; exit 2; }
. "$ROOT/bench/rl-bench/redis-servers.sh"
TMP=$DIR
APID=
trap 'kill $APID 2>/dev/null || true; cleanup' EXIT
start_redis "$RPORT"
config() { # deny_cache
  cat <<TOML
[http]
bind = "127.0.0.1:$HPORT"
[grpc]
bind = "127.0.0.1:$PORT"
[reload]
watch = false
[rate_limit]
enabled = true
provider = "redis"
default_policy = "api"
subject_secret = "bench-subject-secret-of-at-least-32-bytes"
[rate_limit.redis]
role = "coordination"
url = "redis://127.0.0.1:$RPORT/0"
command_timeout = "1s"
[rate_limit.policies.api]
algorithm = "fixed_window"
limit = 100
window = "1s"
deny_cache = $1
[[rls.descriptors]]
domain = "bench"
entries = ["key"]
policy = "api"
TOML
}
. "$ROOT/bench/rl-bench/grpc-call.sh"
rls_call hot
tick=$(getconf CLK_TCK)
echo "# fixed_window 100/s, Redis provider, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| round | edge | deny_cache | req/s | latency | server CPU per request (us) | program calls per request |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: |"
round=1
while [ "$round" -le "$ROUNDS" ]; do
  for cache in false true; do
    config "$cache" > "$TMP/app.toml"
    RUST_LOG=warn "$BIN" --config "$TMP/app.toml" 2>"$TMP/app.log" &
    APID=$!
    for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done
    # HTTP: wrk, 1 thread, 64 connections.
    wrk -t1 -c64 -d1s -s "$ROOT/bench/http-sidecar/hot-key.lua" "http://127.0.0.1:$HPORT" >/dev/null
    redis-cli -p "$RPORT" CONFIG RESETSTAT >/dev/null
    before=$(app_cpu)
    out=$(wrk -t1 -c64 -d"${SECS}s" --latency -s "$ROOT/bench/http-sidecar/hot-key.lua" "http://127.0.0.1:$HPORT")
    after=$(app_cpu); c=$(program_calls "$RPORT")
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
    awk -v b="$before" -v a="$after" -v r="$reqs" -v t="$tick" -v rps="$rps" -v p="$p99" -v k="$cache" -v n="$round" -v c="$c" \
      'BEGIN { printf "| %d | HTTP /v1/evaluate (wrk, 90%% hot) | %s | %s | p99 %s | %.1f | %.3f |\n", n, k, rps, p, (a - b) / t / r * 1e6, c / r }'
    # gRPC: h2load, 2 connections x 32 streams, one hot descriptor.
    rls_h2load "$PORT" -n 5000 >/dev/null
    redis-cli -p "$RPORT" CONFIG RESETSTAT >/dev/null
    before=$(app_cpu)
    out=$(rls_h2load "$PORT" -n "$N")
    after=$(app_cpu); c=$(program_calls "$RPORT")
    done_calls=$(echo "$out" | awk '/^requests:/ {print $8}')
    rps=$(echo "$out" | awk '/^finished in/ {print $4}')
    mean=$(echo "$out" | awk '/^time for request:/ {print $6}')
    awk -v b="$before" -v a="$after" -v r="$done_calls" -v t="$tick" -v rps="$rps" -v m="$mean" -v k="$cache" -v n="$round" -v c="$c" \
      'BEGIN { printf "| %d | gRPC ShouldRateLimit (h2load, hot) | %s | %s | mean %s | %.1f | %.3f |\n", n, k, rps, m, (a - b) / t / r * 1e6, c / r }'
    kill "$APID"; wait "$APID" 2>/dev/null || true; APID=
  done
  round=$((round + 1))
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
