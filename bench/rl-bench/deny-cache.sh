#!/bin/sh
# The exact denial cache on and off, side by side in one run (its goals in docs/performance.md):
# - a hot-key denial flood: one key, c=64, a fixed window of LIMIT per second (mostly denied);
# - a spread that rarely hits: 1,000,000 keys, c=64, mostly admitted (the cache's cost when it
#   does not hit).
# For each run: rl-bench's decisions/s and latency, how many it answered from the cache, and
# the program calls Redis itself counted (INFO commandstats after CONFIG RESETSTAT).
#
# Usage: bench/rl-bench/deny-cache.sh [SECONDS] [ROUNDS] [LIMIT] [ALGORITHM]
#        (defaults 5, 3, 100, fixed_window)
# Needs a release build: cargo build --release -p bench (CARGO_TARGET_DIR respected), and
# redis-server / redis-cli on PATH. Uses loopback port 17460; never 6379.
set -eu
SECS=${1:-5}
ROUNDS=${2:-3}
LIMIT=${3:-100}
ALGO=${4:-fixed_window}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/rl-bench
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p bench" >&2; exit 2; }
. "$ROOT/bench/rl-bench/redis-servers.sh"
P=17460
start_redis $P
run() { # label keys hot-share cache
  redis-cli -p $P FLUSHALL >/dev/null
  redis-cli -p $P CONFIG RESETSTAT >/dev/null
  out=$("$BIN" --provider redis --redis-url "redis://127.0.0.1:$P/0" --algorithm "$ALGO" \
    --limit "$LIMIT" --keys "$2" --hot-key-share "$3" --concurrency 64 \
    --duration "${SECS}s" --deny-cache "$4" --json)
  echo "$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
label, calls = sys.argv[1], int(sys.argv[2])
print("| %s | %.0f | %d | %d | %d | %d | %.2f | %.0f | %.0f | %d |" % (label,
  j["decisions_per_s"], j["decisions"], j["denied"], j["local_cache"], calls,
  j["decisions"] / max(calls, 1), j["p50_us"], j["p99_us"], j["errors"]))' "$1" "$(program_calls $P)"
}
echo "# $ALGO admitting $LIMIT per second, c=64, ${SECS}s per run, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| run | decisions/s | decisions | denied | from cache | program calls | decisions per call | p50 us | p99 us | errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
r=1; while [ $r -le "$ROUNDS" ]; do
  run "hot key, cache off" 1 1.0 off
  run "hot key, cache on" 1 1.0 on
  run "1M keys, cache off" 1000000 0.0 off
  run "1M keys, cache on" 1000000 0.0 on
  r=$((r + 1))
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
