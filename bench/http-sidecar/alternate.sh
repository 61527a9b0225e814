#!/bin/sh
# The HTTP-layer figures as ratios measured side by side: three apps run at once (off, local,
# redis; see common.sh) and wrk loads one at a time, in an order that rotates every round, so
# that the drift of this shared machine's speed does not favour one mode. Prints every run and,
# per round, the ratios to `off` and the medians over the rounds.
#
#   bench/http-sidecar/alternate.sh [DURATION] [ROUNDS]     (defaults 5s, 7)
#
# Runs: GET /api/x on off, local and redis (wrk -t2 -c64, random x-api-key over 1,000,000),
# and the sidecar POST /v1/evaluate on the redis app (random subjects over 1,000,000).
# Redis is emptied (FLUSHALL, synchronously) before every run: a million keys left by a redis
# run keep the server busy expiring them in the background, which slowed whichever run came
# next (the local layer measured 0.86 of off that way, 0.94 without).
set -eu
D=${1:-5s}
ROUNDS=${2:-7}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/inbound-web}
RPORT=${RPORT:-16399}
TMP=$(mktemp -d)
PIDS=
RPID=
trap 'kill $PIDS $RPID 2>/dev/null; rm -rf "$TMP"' EXIT
. "$HERE/common.sh"
start_redis
port_of() { case $1 in off) echo 18101 ;; local) echo 18102 ;; redis) echo 18103 ;; esac; }
for mode in off local redis; do
  HPORT=$(port_of $mode)
  write_config "$mode"
  RUST_LOG=warn "$BIN" --config "$TMP/$mode.toml" 2>"$TMP/$mode.log" &
  PIDS="$PIDS $!"
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done
done
run() { # mode -> "req/s p99_ms"
  case $1 in
    sidecar) url="http://127.0.0.1:$(port_of redis)/v1/evaluate"; script=evaluate.lua ;;
    *) url="http://127.0.0.1:$(port_of "$1")/api/x"; script=random-key.lua ;;
  esac
  wrk -t2 -c64 -d"$D" --latency -s "$HERE/$script" "$url" | python3 -c '
import re, sys
t = sys.stdin.read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
v, u = re.search(r"\s99%\s+([\d.]+)(us|ms|s)", t).groups()
p99 = float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[u]
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
print("%.0f %.2f %s" % (rps, p99, bad.group(1) if bad else "0"))'
}
echo "# $(date -u '+%F %H:%M UTC'), wrk -t2 -c64 -d$D per run, $ROUNDS rounds, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
MODES="off local redis sidecar"
r=1
: >"$TMP/results"
while [ $r -le "$ROUNDS" ]; do
  order=$MODES
  i=1; while [ $i -lt $r ]; do set -- $order; order="$2 $3 $4 $1"; i=$((i + 1)); done
  for m in $order; do
    redis-cli -p "$RPORT" FLUSHALL SYNC >/dev/null
    out=$(run "$m")
    echo "$r $m $out" | tee -a "$TMP/results"
  done
  r=$((r + 1))
done
python3 - "$TMP/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for r, m, rps, p99, bad in rows:
    by.setdefault(int(r), {})[m] = (float(rps), float(p99), int(bad))
ratio = lambda m: [by[r][m][0] / by[r]["off"][0] for r in sorted(by)]
print("| mode | median req/s | median p99 | median req/s ratio to off (per round) |")
print("| --- | ---: | ---: | --- |")
for m in ["off", "local", "redis", "sidecar"]:
    rps = statistics.median(by[r][m][0] for r in by)
    p99 = statistics.median(by[r][m][1] for r in by)
    rs = ratio(m)
    print("| %s | %.0f | %.2f ms | %.3f (%s) |" % (m, rps, p99, statistics.median(rs), ", ".join("%.2f" % x for x in rs)))
print("non-2xx answers in all runs:", sum(v[2] for r in by for v in by[r].values()))
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
