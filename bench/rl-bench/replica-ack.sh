#!/bin/sh
# The cost of min_replicas_ack: rl-bench on a master with one replica, WAIT off and on,
# taking turns, on this machine (load generator, master and replica share its cores).
#
# Usage: bench/rl-bench/replica-ack.sh [SECONDS] [ROUNDS]   (defaults 10, 2)
# Needs a release build: cargo build --release -p bench (CARGO_TARGET_DIR respected), and
# redis-server / redis-cli on PATH. Uses loopback ports 17450-17451; never 6379.
set -eu
SECS=${1:-10}
ROUNDS=${2:-2}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/rl-bench
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p bench" >&2; exit 2; }
. "$ROOT/bench/rl-bench/redis-servers.sh"
M=17450; R=17451
start_redis $M
start_redis $R --replicaof 127.0.0.1 $M
# Linked is not enough: after a diskless sync the master streams to the replica only after
# its first acknowledgement. Wait until a write is acknowledged.
i=0; until [ "$(printf 'SET bench:probe 1\nDEL bench:probe\nWAIT 1 100\n' | redis-cli -p $M | tail -1)" = 1 ]; do
  i=$((i+1)); [ $i -gt 100 ] && { echo "replica not streaming" >&2; exit 1; }; sleep 0.05
done
run() { # label concurrency connections acks
  "$BIN" --provider redis --redis-url "redis://127.0.0.1:$M/0" --algorithm token_bucket \
    --keys 1000000 --concurrency "$2" --connections "$3" --min-replicas-ack "$4" \
    --duration "${SECS}s" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
print("| %s | %.0f | %.0f | %.0f | %.0f | %d |" % (sys.argv[1], j["decisions_per_s"], j["p50_us"], j["p99_us"], j["p999_us"], j["errors"]))' "$1"
}
echo "# token_bucket, 1,000,000 keys, ${SECS}s per run, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), master + 1 replica"
echo "| run | decisions/s | p50 us | p99 us | p99.9 us | errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
r=1; while [ $r -le "$ROUNDS" ]; do
  run "c=1, WAIT off" 1 1 0
  run "c=1, min_replicas_ack=1" 1 1 1
  run "c=64, WAIT off" 64 1 0
  run "c=64, min_replicas_ack=1" 64 1 1
  run "c=64, min_replicas_ack=1, 4 connections" 64 4 1
  r=$((r + 1))
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
