#!/bin/sh
# rl-bench --provider redis side by side with redis-benchmark running EVALSHA of the same
# program with the same arguments at the same concurrency (the server's own ceiling).
#
# The programs take their arguments packed in one binary string (ARGV[1], NUL bytes
# included), which redis-benchmark cannot send: its arguments are C strings. So the ceiling
# runs the program with `local A = ARGV[1]` turned into `local A = ARGV[1] and '<rl-bench's
# policy, packed>'`, called with a NUL-free stand-in of the same length: Redis still builds
# one ARGV string of that length, and the program checks, decodes and decides on the same
# bytes; the only extra work is loading a constant (+0.2% instructions per call under
# callgrind). floor.sh's drive.py sends the real argument, but it is a Python client and
# reports no latency percentiles.
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

# Each program, its packed format (from its header) and rl-bench's policy parameters.
case $ALGO in
  token_bucket)   FILE=rate-token-bucket-v2.lua;    FMT='<I7I4I5I5I7I5I7'; PARAMS="1000 1 1" ;;  # capacity scale units_per_ms
  gcra)           FILE=rate-gcra-v2.lua;            FMT='<I7I4I5I5I7I5I7'; PARAMS="1000 1 1" ;;  # burst interval_units units_per_ms
  fixed_window)   FILE=rate-fixed-window-v2.lua;    FMT='<I7I4I5I5I7I5';   PARAMS="1000 1000" ;; # limit window_ms
  sliding_window) FILE=rate-sliding-counter-v2.lua; FMT='<I7I4I5I5I5I5';   PARAMS="1000 1000" ;;
  sliding_log)    FILE=rate-sliding-log-v2.lua;     FMT='<I7I4I5I5I2I5';   PARAMS="100 1000" ;;
  *) echo "unknown algorithm $ALGO" >&2; exit 2 ;;
esac
# ARGV[1] as rl-bench's policy sends it, packed: cost, revision, max_clock_regression_ms,
# cleanup_grace_ms, params.
ARGS="1 1 2000 10000 $PARAMS"

DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
  --logfile "$DIR/redis.log" --daemonize yes --pidfile "$DIR/redis.pid"
trap 'kill "$(cat "$DIR/redis.pid")" 2>/dev/null; rm -rf "$DIR"' EXIT
i=0; until redis-cli -p "$PORT" ping >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.05; done
# The ceiling's program (see above) into $DIR/ceiling.lua, and its stand-in argument.
# shellcheck disable=SC2086
STANDIN=$(python3 -c '
import sys
root, name, out, fmt, values = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
sys.path.insert(0, root + "/bench/lua-programs")
from drive import pack
packed = pack(fmt, values)
src = open(root + "/lua/" + name).read()
line = "local A = ARGV[1]\n"
if src.count(line) != 1:
    sys.exit(name + ": no single line \"local A = ARGV[1]\" to give the packed policy")
literal = "".join("\\%03d" % b for b in packed)
open(out, "w").write(src.replace(line, "local A = ARGV[1] and \"%s\"\n" % literal))
print("x" * len(packed))
' "$ROOT" "$FILE" "$DIR/ceiling.lua" "$FMT" $ARGS)
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$DIR/ceiling.lua")")
# The ceiling must decide (a refused argument would measure the program's cheapest path).
STATUS=$(redis-cli -p "$PORT" EVALSHA "$SHA" 1 'rl:{check}' "$STANDIN" | head -1)
[ "$STATUS" = ALLOWED ] || { echo "$FILE answers $STATUS to the ceiling's argument" >&2; exit 1; }

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
    CSV=$(redis-benchmark -p "$PORT" -c "$C" -n "$N" $RANGE --csv EVALSHA "$SHA" 1 "$KEY" "$STANDIN" | tail -1)
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
