#!/bin/sh
# Batched decisions on and off, side by side in one run (the goals in docs/performance.md):
# rl-bench --provider redis over 1,000,000 keys at c=64 (load: batches form) and c=1 (idle:
# every batch is one), each with --batch-max 16 and --batch-max 1, alternating per round.
# For each run: decisions/s and latency, the program calls Redis counted, and Redis's own time
# in programs per decision (INFO commandstats: the usec of EVALSHA and EVAL after CONFIG
# RESETSTAT, divided by the decisions), so the load generator's cost is not in that figure.
#
# Usage: bench/rl-bench/batch.sh [SECONDS] [ROUNDS] [ALGORITHM]   (defaults 5, 3, token_bucket)
# Needs a release build: cargo build --release -p bench (CARGO_TARGET_DIR respected), and
# redis-server / redis-cli on PATH. Uses loopback port 17462; never 6379.
set -eu
SECS=${1:-5}
ROUNDS=${2:-3}
ALGO=${3:-token_bucket}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/rl-bench
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p bench" >&2; exit 2; }
. "$ROOT/bench/rl-bench/redis-servers.sh"
P=17462
start_redis $P
# The usec Redis spent in program calls since CONFIG RESETSTAT.
program_usec() {
  redis-cli -p $P INFO commandstats | tr -d '\r' | awk -F'[=,:]' \
    '/^cmdstat_eval(sha)?:/ { for (i = 2; i < NF; i += 2) if ($i == "usec") n += $(i + 1) } END { print n + 0 }'
}
run() { # concurrency batch-max
  redis-cli -p $P FLUSHALL >/dev/null
  redis-cli -p $P CONFIG RESETSTAT >/dev/null
  out=$("$BIN" --provider redis --redis-url "redis://127.0.0.1:$P/0" --algorithm "$ALGO" \
    --keys 1000000 --concurrency "$1" --duration "${SECS}s" --batch-max "$2" --json)
  echo "$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
c, bm, calls, usec = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
d = max(j["decisions"], 1)
print("| %s | %s | %.0f | %.0f | %.0f | %d | %.2f | %.2f | %d |" % (c, bm,
  j["decisions_per_s"], j["p50_us"], j["p99_us"], calls, d / max(calls, 1), usec / d,
  j["errors"]))' "$1" "$2" "$(program_calls $P)" "$(program_usec)"
}
echo "# $ALGO, 1,000,000 keys, ${SECS}s per run, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(redis-server --version | cut -d' ' -f3)"
echo "| concurrency | batch_max | decisions/s | p50 us | p99 us | program calls | decisions per call | Redis us per decision | errors |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
r=1; while [ $r -le "$ROUNDS" ]; do
  run 64 16
  run 64 1
  run 1 16
  run 1 1
  r=$((r + 1))
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
