#!/bin/sh
# Two builds of rl-bench side by side against one private redis-server, taking turns, so a
# change on the provider's hot path is measured against the build before it in one run (the
# machine's speed drifts between runs; a per-round ratio cancels most of it).
#
#   bench/rl-bench/builds-compare.sh BASELINE_BIN [SECONDS] [ROUNDS]   (defaults 5, 5)
#
# BASELINE_BIN is an rl-bench binary of the earlier build; this build's is
# ${CARGO_TARGET_DIR:-target}/release/rl-bench (build it first: cargo build --release -p bench).
# Each round runs both builds, in an order alternating per round, on the hot key (--keys 1)
# and on 1,000,000 keys, at concurrency 64 and 1, token bucket, with Redis emptied before
# every run (KEYS="1 1000000" and CONCURRENCY="64 1" choose the cases). Prints one row per
# run and then, per case, the median of the per-round ratios (this build / baseline) of
# decisions/s, p50 and p99.
set -eu
BASE=${1:?usage: builds-compare.sh BASELINE_BIN [SECONDS] [ROUNDS]}
SECS=${2:-5}
ROUNDS=${3:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NEW=${NEW:-${CARGO_TARGET_DIR:-$ROOT/target}/release/rl-bench}
PORT=${PORT:-17393}
. "$HERE/redis-servers.sh"
start_redis "$PORT"
OUT="$DIR/runs"
: >"$OUT"
echo "# $(date -u '+%F %H:%M UTC'), ${SECS}s per run, $ROUNDS rounds, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# round build keys concurrency decisions_per_s p50_us p99_us errors"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  if [ $((r % 2)) -eq 1 ]; then order="baseline new"; else order="new baseline"; fi
  for keys in ${KEYS:-1 1000000}; do
    for c in ${CONCURRENCY:-64 1}; do
      for build in $order; do
        if [ "$build" = baseline ]; then bin=$BASE; else bin=$NEW; fi
        redis-cli -p "$PORT" FLUSHALL SYNC >/dev/null
        "$bin" --provider redis --redis-url "redis://127.0.0.1:$PORT/0" --algorithm token_bucket \
          --keys "$keys" --concurrency "$c" --duration "${SECS}s" --json |
          python3 -c '
import json, sys
j = json.load(sys.stdin)
print(sys.argv[1], sys.argv[2], j["keys"], j["concurrency"], "%.0f" % j["decisions_per_s"],
      "%.0f" % j["p50_us"], "%.0f" % j["p99_us"], j["errors"])' "$r" "$build" | tee -a "$OUT"
      done
    done
  done
  r=$((r + 1))
done
python3 - "$OUT" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, build, keys, c, dps, p50, p99, err = line.split()
    runs[(r, build, keys, c)] = (float(dps), float(p50), float(p99))
print("# median per-round ratio new/baseline: decisions/s, p50, p99 (and each build's median decisions/s)")
for keys in sorted({k[2] for k in runs}, key=int):
    for c in sorted({k[3] for k in runs}, key=int, reverse=True):
        rounds = sorted({k[0] for k in runs if k[2] == keys and k[3] == c})
        ratio = lambda i: statistics.median(runs[(r, "new", keys, c)][i] / runs[(r, "baseline", keys, c)][i] for r in rounds)
        med = lambda b: statistics.median(runs[(r, b, keys, c)][0] for r in rounds)
        print(f"keys={keys} c={c}: decisions/s {ratio(0):.3f}x  p50 {ratio(1):.3f}x  p99 {ratio(2):.3f}x  "
              f"(new {med('new'):.0f}/s, baseline {med('baseline'):.0f}/s)")
EOF
