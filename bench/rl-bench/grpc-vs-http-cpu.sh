#!/bin/sh
# The server's CPU per decision of the gRPC rate-limit service (ShouldRateLimit) beside the
# HTTP sidecar's POST /v1/evaluate, for the same decision, in one run of one binary
# (docs/performance.md, "gRPC rate-limit service"; the goal: gRPC at most 1.0x HTTP).
#
#   bench/rl-bench/grpc-vs-http-cpu.sh [ROUNDS] [SECONDS]     (needs h2load: Debian
#                                                              nghttp2-client; wrk; curl; python3)
#
# One app process (BIN, default ${CARGO_TARGET_DIR:-target}/release/inbound-web), local
# provider, a token bucket that admits every call, serving gRPC and HTTP on loopback ports
# (GPORT, HPORT; never 6379). WORKERS (default 1) is http.worker_threads, the serving threads
# both servers run on (thread per core); WORKERS=0 leaves the default (one per CPU). Each round
# drives, in turn and for SECONDS (default 8) each, after a 2 s warm-up of each:
#   grpc-c16m8   h2load -t1 -c16 -m8: ShouldRateLimit, one descriptor {key: "k-1"} per call
#   grpc-c2m32   h2load -t1 -c2 -m32 (grpc-cpu.sh's shape)
#   http-c16     wrk -t1 -c16: POST /v1/evaluate {"policy":"api","subject":"k-1","cost":1}
# The same policy, the same subject, one decision per request. Printed per run: requests/s,
# p99 (h2load: from its per-request log; wrk: --latency), the server's CPU (utime + stime
# of /proc/PID/stat) per decision in microseconds, and its threads' context switches per
# decision, voluntary + involuntary (a thread that slept in epoll_wait and was woken, and a
# thread preempted: /proc/PID/task/*/status); per round the ratios gRPC/HTTP, and at
# the end the medians. The raw outputs stay in OUT (default /tmp/grpc-vs-http-cpu).
# Runs with anything but 2xx/200 answers are flagged ("errors N").
set -eu
ROUNDS=${1:-3}
SECONDS_EACH=${2:-8}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/inbound-web}
GPORT=${GPORT:-18297}
HPORT=${HPORT:-18298}
WORKERS=${WORKERS:-1}
OUT=${OUT:-/tmp/grpc-vs-http-cpu}
LOADS=${LOADS:-grpc-c16m8 grpc-c2m32 http-c16}
TMP=$(mktemp -d)
APID=
mkdir -p "$OUT"
cleanup() {
  if [ -n "$APID" ]; then kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

workers_line=
[ "$WORKERS" -gt 0 ] && workers_line="worker_threads = $WORKERS"
# shellcheck source=grpc-call.sh source-path=SCRIPTDIR disable=SC1091
. "$(dirname "$0")/grpc-call.sh"
bench_app_config "$HPORT" "$GPORT" "$workers_line" > "$TMP/app.toml"

# The gRPC call: RateLimitRequest {domain: "bench", descriptors: [{entries: [{key: "key",
# value: "k-1"}]}], hits_addend: 1}, gRPC-framed (grpc-call.sh's rls_call).
rls_call k-1
# The HTTP request, written out once (as http-sidecar/evaluate.lua does, without a random subject).
cat > "$TMP/evaluate.lua" <<'LUA'
local body = '{"policy":"api","subject":"k-1","cost":1}'
local req = "POST /v1/evaluate HTTP/1.1\r\nHost: " .. wrk.host
  .. "\r\ncontent-type: application/json\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body
request = function() return req end
LUA

tick=$(getconf CLK_TCK)
GRPC_URL="http://127.0.0.1:$GPORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HTTP_URL="http://127.0.0.1:$HPORT/v1/evaluate"

h2() { # h2load ARGS...: the gRPC call
  h2load "$@" -d "$TMP/call.bin" -H 'content-type: application/grpc' -H 'te: trailers' "$GRPC_URL"
}

# run LOAD ROUND: one measured run; appends "LOAD ROUND rps p99_ms cpu_us errors" to $TMP/rows.
run() {
  load=$1; round=$2; raw="$OUT/$load.r$round.txt"
  case $load in
    grpc-c*)
      c=${load#grpc-c}; m=${c#*m}; c=${c%m*}
      h2 -t1 -c "$c" -m "$m" -D 2 >/dev/null
      rm -f "$TMP/h2.log"
      before=$(app_cpu); sw0=$(app_switches)
      h2 -t1 -c "$c" -m "$m" -D "$SECONDS_EACH" --log-file="$TMP/h2.log" > "$raw"
      after=$(app_cpu); sw1=$(app_switches)
      reqs=$(awk '/^requests:/ {print $8}' "$raw")   # succeeded
      errs=$(awk '/^requests:/ {print $10 + $12}' "$raw")   # failed + errored
      # A gRPC error is HTTP 200 with grpc-status in the trailers: h2load cannot see it, so
      # the app's own counters are checked at the end (see below).
      rps=$(awk '/^finished in/ {print $4}' "$raw")
      p99=$(cut -f3 "$TMP/h2.log" | sort -n | awk '{v[NR] = $1} END {i = int(NR * 0.99); if (i < 1) i = 1; printf "%.2fms", v[i] / 1000}')
      ;;
    http-c*)
      c=${load#http-c}
      wrk -t1 -c "$c" -d 2s -s "$TMP/evaluate.lua" "$HTTP_URL" >/dev/null
      before=$(app_cpu); sw0=$(app_switches)
      wrk -t1 -c "$c" -d "${SECONDS_EACH}s" --latency -s "$TMP/evaluate.lua" "$HTTP_URL" > "$raw"
      after=$(app_cpu); sw1=$(app_switches)
      reqs=$(awk '/requests in/ {print $1}' "$raw")
      errs=$(awk '/Non-2xx/ {n += $NF} /Socket errors/ {n += 1} END {print n + 0}' "$raw")
      rps=$(awk '/Requests\/sec/ {print $2}' "$raw")
      p99=$(awk '$1 == "99%" {print $2}' "$raw")
      ;;
  esac
  awk -v l="$load" -v r="$round" -v b="$before" -v a="$after" -v n="$reqs" -v t="$tick" \
    -v rps="$rps" -v p99="$p99" -v e="$errs" -v sw0="$sw0" -v sw1="$sw1" \
    'BEGIN { split(sw0, s0, " "); split(sw1, s1, " ");
             printf "%-11s round %d  req/s %9s  p99 %9s  server CPU/decision %6.2f us  switches/decision %.3f + %.3f  errors %s\n", l, r, rps, p99, (a - b) / t / n * 1e6, (s1[1] - s0[1]) / n, (s1[2] - s0[2]) / n, e;
             printf "%s %d %s %s %.3f %s\n", l, r, rps, p99, (a - b) / t / n * 1e6, e >> "'"$TMP/rows"'" }'
}

RUST_LOG=warn "$BIN" --config "$TMP/app.toml" 2>"$TMP/app.log" &
APID=$!
app_cpu() { awk '{print $14 + $15}' "/proc/$APID/stat"; }
# Context switches of all the app's threads (voluntary: a thread slept, e.g. in epoll_wait,
# and was woken; involuntary: preempted).
# Printed as "voluntary involuntary".
app_switches() { cat /proc/"$APID"/task/*/status | awk '/^voluntary_ctxt/ {v += $2} /^nonvoluntary_ctxt/ {i += $2} END {print v, i}'; }
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null || { echo "app did not start"; cat "$TMP/app.log"; exit 1; }
threads=$(awk '/^Threads:/ {print $2}' "/proc/$APID/status")
echo "binary $BIN, workers ${WORKERS} (0: default), app threads $threads, ${SECONDS_EACH}s per run, load $(cut -d' ' -f1-3 /proc/loadavg)"
: > "$TMP/rows"
round=1
while [ "$round" -le "$ROUNDS" ]; do
  for load in $LOADS; do run "$load" "$round"; done
  awk -v r="$round" '$2 == r { cpu[$1] = $5; rps[$1] = $3 }
    END { for (l in cpu) if (l ~ /^grpc/ && ("http-c16" in cpu))
            printf "round %d  %s/http-c16: CPU per decision %.2fx, req/s %.2fx\n", r, l, cpu[l] / cpu["http-c16"], rps[l] / rps["http-c16"] }' "$TMP/rows"
  round=$((round + 1))
done
# Every decision the app made, by outcome (all should be allowed).
curl -sf "http://127.0.0.1:$HPORT/metrics" | grep '^rate_limit_decisions_total' | grep -v ' 0$' || true
echo "medians over $ROUNDS rounds:"
for load in $LOADS; do
  for col in 3 5; do
    awk -v l="$load" -v c="$col" '$1 == l {print $c}' "$TMP/rows" | sort -g |
      awk '{v[NR] = $1} END {printf "%s ", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
  done | awk -v l="$load" '{printf "%-11s req/s %s  server CPU/decision %s us\n", l, $1, $2}'
done
awk '{ratio[$1 " " $2] = $5} $1 == "http-c16" {h[$2] = $5}
  END { for (k in ratio) { split(k, p, " "); if (p[1] ~ /^grpc/ && (p[2] in h)) print p[1], ratio[k] / h[p[2]] } }' "$TMP/rows" |
  sort -k1,1 -k2,2g | awk '{v[$1] = v[$1] " " $2; n[$1]++; a[$1, n[$1]] = $2}
    END { for (l in n) { k = n[l]; m = (k % 2) ? a[l, (k + 1) / 2] : (a[l, k / 2] + a[l, k / 2 + 1]) / 2;
            printf "%s/http-c16 CPU per decision, per round (sorted):%s  median %.2fx\n", l, v[l], m } }'
cp "$TMP/rows" "$OUT/rows.txt"
