#!/bin/sh
# rl-bench on one standalone redis-server and on a 3-master Redis Cluster, taking turns, on
# this machine (load generator and every server share its cores).
#
# Usage: bench/rl-bench/cluster-compare.sh [SECONDS] [ROUNDS] [REPLICAS]
#   SECONDS   length of each run (default 10)
#   ROUNDS    standalone/cluster pairs (default 3)
#   REPLICAS  replicas per cluster master (default 0; 1 adds replication work to the machine)
# Needs a release build: cargo build --release -p bench (CARGO_TARGET_DIR respected), and
# redis-server / redis-cli on PATH. Uses free loopback ports from 17400; never 6379.
# Prints one markdown row per run: many keys (1,000,000), token bucket, concurrency 64.
set -eu
SECS=${1:-10}
ROUNDS=${2:-3}
REPLICAS=${3:-0}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/rl-bench
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p bench" >&2; exit 2; }
. "$ROOT/bench/rl-bench/redis-servers.sh"
BASE=17400
NODES=$((3 * (1 + REPLICAS)))
start_redis $BASE
ADDRS=""
SEEDS=""
n=1; while [ $n -le $NODES ]; do
  p=$((BASE + n))
  start_redis $p --cluster-enabled yes --cluster-config-file "$DIR/nodes-$p.conf" --cluster-port $((p + 100))
  ADDRS="$ADDRS 127.0.0.1:$p"; SEEDS="${SEEDS:+$SEEDS,}redis://127.0.0.1:$p"
  n=$((n + 1))
done
# shellcheck disable=SC2086
redis-cli --cluster create $ADDRS --cluster-replicas "$REPLICAS" --cluster-yes >/dev/null
i=0; until redis-cli -p $((BASE + 1)) cluster info | grep -q 'cluster_state:ok'; do
  i=$((i+1)); [ $i -gt 200 ] && { echo "cluster not ok" >&2; exit 1; }; sleep 0.05
done
sleep 1

# CPU seconds (user + system) of every redis-server this script started.
redis_cpu() {
  t=0
  for f in "$DIR"/*.pid; do
    [ -f "$f" ] || continue
    t=$(awk -v t="$t" '{print t + $14 + $15}' "/proc/$(cat "$f")/stat" 2>/dev/null || echo "$t")
  done
  echo "$t"
}
run() { # label args...
  label=$1; shift
  r0=$(redis_cpu)
  /usr/bin/time -f "%U %S" -o "$DIR/bench.time" "$BIN" --provider redis --algorithm token_bucket \
    --keys 1000000 --concurrency 64 --duration "${SECS}s" --json "$@" >"$DIR/bench.json"
  r1=$(redis_cpu)
  python3 - "$label" "$r0" "$r1" "$(getconf CLK_TCK)" "$SECS" "$DIR/bench.json" "$DIR/bench.time" <<'PY'
import json, sys
label, r0, r1, tick, secs, jf, tf = sys.argv[1:]
j = json.load(open(jf)); u, s = map(float, open(tf).read().split())
redis = (float(r1) - float(r0)) / float(tick) / float(secs)
bench = (u + s) / float(secs)
print("| %s | %.0f | %.0f | %.0f | %d | %.2f | %.2f |" % (label, j["decisions_per_s"], j["p50_us"], j["p99_us"], j["errors"], redis, bench))
PY
}
echo "# token_bucket, 1,000,000 keys, concurrency 64, ${SECS}s per run, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), cluster 3 masters x $REPLICAS replicas"
echo "| run | decisions/s | p50 us | p99 us | errors | Redis cores busy | rl-bench cores busy |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
r=1; while [ $r -le "$ROUNDS" ]; do
  run "standalone" --redis-url "redis://127.0.0.1:$BASE/0"
  run "cluster (1 connection per master)" --topology cluster --redis-url "$SEEDS"
  r=$((r + 1))
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
