#!/bin/sh
# rl-bench --provider redis side by side with redis-benchmark running EVALSHA of the same
# program with the same arguments at the same concurrency (the server's own ceiling).
#
# Usage: bench/rl-bench/compare.sh [PORT] [SECONDS] [ALGORITHM]
#   PORT       a free loopback port for a dedicated redis-server (default 17379; never 6379)
#   SECONDS    length of each run (default 5)
#   ALGORITHM  token_bucket (default) | fixed_window | sliding_window | gcra | sliding_log
# Needs a release build: cargo build --release -p bench (CARGO_TARGET_DIR respected).
# Prints one markdown table row per (keys, concurrency).
set -eu

PORT=${1:-17379}
SECS=${2:-5}
ALGO=${3:-token_bucket}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/rl-bench
[ "$PORT" = 6379 ] && { echo "refusing port 6379" >&2; exit 2; }
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p bench" >&2; exit 2; }

case $ALGO in
  token_bucket)   FILE=rate-token-bucket-v1.lua;    PARAMS="1000 1 1" ;;   # capacity scale units_per_ms
  gcra)           FILE=rate-gcra-v1.lua;            PARAMS="1000 1 1" ;;   # burst interval_units units_per_ms
  fixed_window)   FILE=rate-fixed-window-v1.lua;    PARAMS="1000 1000" ;;  # limit window_ms
  sliding_window) FILE=rate-sliding-counter-v1.lua; PARAMS="1000 1000" ;;
  sliding_log)    FILE=rate-sliding-log-v1.lua;     PARAMS="100 1000" ;;
  *) echo "unknown algorithm $ALGO" >&2; exit 2 ;;
esac
# ARGV as rl-bench's policy sends it: cost, revision, max_clock_regression_ms, cleanup_grace_ms, params.
ARGS="1 1 2000 10000 $PARAMS"

DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
  --logfile "$DIR/redis.log" --daemonize yes --pidfile "$DIR/redis.pid"
trap 'kill "$(cat "$DIR/redis.pid")" 2>/dev/null; rm -rf "$DIR"' EXIT
i=0; until redis-cli -p "$PORT" ping >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.05; done
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$ROOT/lua/$FILE")")

echo "# $ALGO, ${SECS}s per run, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(redis-server --version | cut -d' ' -f3)"
echo "| keys | concurrency | rl-bench decisions/s | p50 us | p99 us | p99.9 us | errors | redis-benchmark rps | p50 us | p99 us | ratio |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for KEYS in 1 1000000; do
  for C in 1 16 64; do
    J=$("$BIN" --provider redis --redis-url "redis://127.0.0.1:$PORT/0" --algorithm "$ALGO" \
        --keys "$KEYS" --concurrency "$C" --duration "${SECS}s" --json)
    RATE=$(printf '%s' "$J" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["decisions_per_s"]))')
    N=$((RATE * SECS)); [ "$N" -lt 1000 ] && N=1000
    if [ "$KEYS" = 1 ]; then
      KEY='rl:{hot0}aaaaaaaaaaaaaaaa'; RANGE=""
    else
      KEY='rl:{__rand_int__}'; RANGE="-r $KEYS"
    fi
    # shellcheck disable=SC2086
    CSV=$(redis-benchmark -p "$PORT" -c "$C" -n "$N" $RANGE --csv EVALSHA "$SHA" 1 "$KEY" $ARGS | tail -1)
    printf '%s\n%s\n' "$J" "$CSV" | python3 -c '
import csv, json, sys
j = json.loads(sys.stdin.readline())
row = next(csv.reader([sys.stdin.readline()]))
rps, p50, p99 = float(row[1]), float(row[4]) * 1000, float(row[6]) * 1000
print("| %d | %d | %.0f | %.0f | %.0f | %.0f | %d | %.0f | %.0f | %.0f | %.2f |" % (
    j["keys"], j["concurrency"], j["decisions_per_s"], j["p50_us"], j["p99_us"], j["p999_us"],
    j["errors"], rps, p50, p99, j["decisions_per_s"] / rps))
'
  done
done
# Server time per decision over all runs above (Redis' own accounting of the script).
echo
echo "server: $(redis-cli -p "$PORT" INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha:')"
echo "server: $(redis-cli -p "$PORT" INFO memory | tr -d '\r' | grep '^used_memory:'), keys $(redis-cli -p "$PORT" DBSIZE)"
