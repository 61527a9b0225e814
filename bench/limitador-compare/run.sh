#!/bin/sh
# limitador-server's HTTP check endpoint beside inbound-web's sidecar endpoint, on this
# machine, in one run (docs/performance.md, "Against limitador"; every run so far:
# bench/limitador-compare/RESULTS.md).
#
#   bench/limitador-compare/run.sh          (needs wrk, redis-server, curl, python3)
#
# Starts one private redis-server on a free loopback port, then, one after the other, with the
# same load generator command (wrk -t2 -c64 -d15s --latency, random subjects over 1,000,000,
# every request admitted):
#   limitador   limitador-sidecar: actix-web + limitador's AsyncRedisStorage, exactly how
#               `limitador-server LIMITS_FILE redis URL` builds it; POST /check_and_report
#   inbound-web the release binary with the redis provider; POST /v1/evaluate
#   floor       (FLOOR=1 only) the same binary with rate limiting disabled, GET /api/x of the
#               demo route: what HTTP handling alone costs this app, the part of a sidecar
#               request that no limiter can avoid
# Redis is emptied (FLUSHALL) before each server starts, so every run begins from the same
# state. With ROUNDS > 1 the order alternates (L I, I L, L I, ...) so that drift in the
# machine's load does not favour one side. Prints one row per run, with "other work": the share
# of the machine (100% = every core) that processes other than wrk, the server and Redis took
# during that run, and the load average just before it; then the ratios per round
# (inbound-web / limitador, for req/s and for p99) and their medians. Every run also reports
# the CPU time per request of the server, of Redis and of wrk (from /proc and `times`); when
# the three share the cores, req/s is about cores / (their sum), so the ratio of the sums is
# the throughput ratio without the noise of other work. With FLOOR=1 each round also splits
# inbound-web's CPU into HTTP (the floor run) and the evaluation path (the rest: JSON, HMAC,
# the Redis client and its socket), and prints the most the evaluation path could cost for
# 2x: half of limitador's sum, less inbound-web's HTTP, Redis and wrk CPU.
# Everything it starts is stopped on exit.
#
# Environment:
#   ROUNDS=1         rounds of (limitador, inbound-web)
#   DURATION=15s     wrk -d of each measured run
#   WARMUP=2s        an unmeasured wrk run of this length before each measured one (0 = none)
#   WINDOW=60        limitador limit window in seconds
#   BUILD=1          build both binaries first (0: use what is there)
#   FLOOR=0          1: add the `floor` run to every round (see above)
#   BASELINE=        path of another inbound-web binary (an earlier build): adds a `baseline`
#                    run to every round, same configuration and load, and prints its CPU per
#                    request against this build's (what a change to the evaluation path saved)
#   WITH_LIMITADOR=1 0: leave limitador out (with BASELINE, to compare two builds only)
#   WORKERS=         worker threads of both servers: inbound-web's http.worker_threads and
#                    limitador-sidecar's actix-web workers (LIMITADOR_SIDECAR_WORKERS); empty:
#                    each server's default (one per CPU for inbound-web, one per physical core
#                    for actix-web)
#   INBOUND_WORKERS, LIMITADOR_WORKERS  the same for one server only (default: WORKERS), to
#                    run each in the configuration it does best in; `default` for its default
#   CARGO_TARGET_DIR the workspace's target dir (inbound-web), as for cargo
#   LIMITADOR_TARGET_DIR  target dir of this crate (default: <workspace target>/limitador-compare);
#                    the first build compiles RocksDB (limitador's default `disk_storage`
#                    feature, see Cargo.toml): needs a C++ compiler and libclang-dev
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ROUNDS=${ROUNDS:-1}
DURATION=${DURATION:-15s}
WARMUP=${WARMUP:-2s}
WINDOW=${WINDOW:-60}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
LTARGET=${LIMITADOR_TARGET_DIR:-$TARGET/limitador-compare}
INBOUND=$TARGET/release/inbound-web
LIMITADOR=$LTARGET/release/limitador-sidecar
WRK_ARGS="-t2 -c64 -d$DURATION --latency"

for tool in wrk redis-server redis-cli curl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done

if [ "${BUILD:-1}" = 1 ]; then
  (cd "$ROOT" && cargo build --release -q -p inbound-web)
  cargo build --release -q --manifest-path "$HERE/Cargo.toml" --target-dir "$LTARGET"
fi
[ -x "$INBOUND" ] || { echo "no $INBOUND: cargo build --release -p inbound-web" >&2; exit 2; }
[ "${WITH_LIMITADOR:=1}" = 0 ] || [ -x "$LIMITADOR" ] || {
  echo "no $LIMITADOR (run with BUILD=1)" >&2; exit 2; }
[ -z "${BASELINE:-}" ] || [ -x "$BASELINE" ] || { echo "no $BASELINE" >&2; exit 2; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
RPORT=$(free_port)
HPORT=$(free_port)
[ "$RPORT" != 6379 ] || RPORT=$(free_port)

TMP=$(mktemp -d)
RPID=
APID=
WPID=
cleanup() {
  [ -z "$WPID" ] || { kill "$WPID" 2>/dev/null || true; wait "$WPID" 2>/dev/null || true; }
  [ -z "$APID" ] || { kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true; }
  [ -z "$RPID" ] || { kill "$RPID" 2>/dev/null || true; wait "$RPID" 2>/dev/null || true; }
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
  >"$TMP/redis.log" 2>&1 &
RPID=$!
i=0
until redis-cli -p "$RPORT" ping >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -le 100 ] || { echo "redis-server did not start" >&2; cat "$TMP/redis.log" >&2; exit 1; }
  sleep 0.05
done

# inbound-web's configuration: the redis mode of bench/http-sidecar/run.sh.
INBOUND_WORKERS=${INBOUND_WORKERS:-${WORKERS:-}}
LIMITADOR_WORKERS=${LIMITADOR_WORKERS:-${WORKERS:-}}
[ "$INBOUND_WORKERS" != default ] || INBOUND_WORKERS=
[ "$LIMITADOR_WORKERS" != default ] || LIMITADOR_WORKERS=
WORKERS_LINE=
[ -z "$INBOUND_WORKERS" ] || WORKERS_LINE="worker_threads = $INBOUND_WORKERS"
cat >"$TMP/floor.toml" <<EOF
[http]
bind = "127.0.0.1:$HPORT"
$WORKERS_LINE

[[routes]]
path_prefix = "/api"
subject = "header:x-api-key"
EOF
cat >"$TMP/inbound.toml" <<EOF
[http]
bind = "127.0.0.1:$HPORT"
$WORKERS_LINE

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
algorithm = "token_bucket"
capacity = 1000000000
refill_amount = 1000000000
refill_interval = "1s"

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-api-key"
EOF

# One sample request; the server must answer 200 before it is measured.
probe() { # $1 = server
  case $1 in
    limitador) curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
      -d '{"namespace":"api","values":{"subject":"probe"},"delta":1}' \
      "http://127.0.0.1:$HPORT/check_and_report" ;;
    inbound-web|baseline) curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
      -d '{"policy":"api","subject":"probe","cost":1}' "http://127.0.0.1:$HPORT/v1/evaluate" ;;
    floor) curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: probe' "http://127.0.0.1:$HPORT/api/x" ;;
  esac
}

start() { # $1 = server
  redis-cli -p "$RPORT" FLUSHALL >/dev/null
  case $1 in
    limitador) LIMITADOR_SIDECAR_WORKERS=$LIMITADOR_WORKERS "$LIMITADOR" "127.0.0.1:$HPORT" "redis://127.0.0.1:$RPORT/0" "$WINDOW" 2>"$TMP/app.log" & ;;
    inbound-web) RUST_LOG=warn "$INBOUND" --config "$TMP/inbound.toml" 2>"$TMP/app.log" & ;;
    baseline) RUST_LOG=warn "$BASELINE" --config "$TMP/inbound.toml" 2>"$TMP/app.log" & ;;
    floor) RUST_LOG=warn "$INBOUND" --config "$TMP/floor.toml" 2>"$TMP/app.log" & ;;
  esac
  APID=$!
  i=0
  until [ "$(probe "$1" 2>/dev/null)" = 200 ]; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$APID" 2>/dev/null; then
      echo "$1 did not start or does not answer 200" >&2; cat "$TMP/app.log" >&2; exit 1
    fi
    sleep 0.1
  done
}

# wrk in the background and waited for, so that a signal to this script is acted on at once
# (a foreground child would delay the traps until it ends) and cleanup can stop wrk too.
run_wrk() { # wrk arguments; stdout goes where the caller redirects it
  wrk "$@" &
  WPID=$!
  wait "$WPID"
  WPID=
}

stop() {
  kill -TERM "$APID" 2>/dev/null || true
  wait "$APID" 2>/dev/null || true
  APID=
}

# CPU accounting, in clock ticks, to tell how much of the machine other work took during a
# measured run (the load average counts the benchmark's own processes too):
# machine busy and total ticks, ticks of live processes, ticks of this shell's waited children.
cpu_machine() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
cpu_procs() { for p in "$@"; do sed 's/.*) //' "/proc/$p/stat"; done | awk '{ s += $12 + $13 } END { print s + 0 }'; }
cpu_children() { # $1 = output of `times` (run in this shell, not in a subshell)
  awk -v hz="$(getconf CLK_TCK)" 'NR == 2 { split($1, u, /[ms]/); split($2, y, /[ms]/)
    print (u[1] * 60 + u[2] + y[1] * 60 + y[2]) * hz }' "$1"
}

# Runs wrk against the server that is up and appends one line to $TMP/results:
# round server req/s p50_ms p90_ms p99_ms non2xx socket_errors others_pct load1 load5 load15
#   app_us redis_us wrk_us
# where others_pct is the share of the machine (100 = every core) that processes other than
# wrk, the server and redis-server used during the measured run, and *_us the CPU time (user
# and system) of the server, of redis-server and of wrk per completed request.
measure() { # $1 = round, $2 = server
  case $2 in
    limitador) script=$HERE/check-and-report.lua; path=/check_and_report ;;
    inbound-web|baseline) script=$ROOT/bench/http-sidecar/evaluate.lua; path=/v1/evaluate ;;
    floor) script=$ROOT/bench/http-sidecar/random-key.lua; path=/api/x ;;
  esac
  if [ "$WARMUP" != 0 ]; then
    run_wrk -t2 -c64 -d"$WARMUP" -s "$script" "http://127.0.0.1:$HPORT$path" >/dev/null
  fi
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  times >"$TMP/times0"
  m0=$(cpu_machine); a0=$(cpu_procs "$APID"); r0=$(cpu_procs "$RPID")
  run_wrk $WRK_ARGS -s "$script" "http://127.0.0.1:$HPORT$path" >"$TMP/wrk.out"
  m1=$(cpu_machine); a1=$(cpu_procs "$APID"); r1=$(cpu_procs "$RPID")
  times >"$TMP/times1"
  w0=$(cpu_children "$TMP/times0"); w1=$(cpu_children "$TMP/times1")
  others=$(echo "$m0 $m1 $((a0 + r0)) $((a1 + r1)) $w0 $w1" | awk '{
    busy = $3 - $1; total = $4 - $2; ours = ($6 - $5) + ($8 - $7)
    o = total > 0 ? 100 * (busy - ours) / total : 0; printf "%.0f", o < 0 ? 0 : o }')
  awk -v round="$1" -v server="$2" -v la="$load" -v others="$others" \
    -v app=$((a1 - a0)) -v redis=$((r1 - r0)) -v wrk="$(echo "$w0 $w1" | awk '{ print $2 - $1 }')" \
    -v hz="$(getconf CLK_TCK)" '
    function ms(v) {
      if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
      if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
      if (v ~ /s$/)  return substr(v, 1, length(v) - 1) * 1000
      return v + 0
    }
    /^ +50%/ { p50 = ms($2) }  /^ +90%/ { p90 = ms($2) }  /^ +99%/ { p99 = ms($2) }
    /^Requests\/sec:/ { rps = $2 }
    / requests in / { n = $1 }
    /Non-2xx or 3xx responses:/ { non2xx = $NF }
    /Socket errors:/ { errs = $4 + $6 + $8 + $10 }
    END { us = n > 0 ? 1e6 / hz / n : 0
          printf "%s %s %.0f %.3f %.3f %.3f %d %d %s %s %.1f %.1f %.1f\n", round, server, rps, p50,
                 p90, p99, non2xx, errs, others, la, app * us, redis * us, wrk * us }
  ' "$TMP/wrk.out" >>"$TMP/results"
  tail -1 "$TMP/results" | awk '{ printf "  %-11s %8.0f req/s  p50 %6.2f ms  p90 %6.2f ms  p99 %6.2f ms  non-2xx %d  socket errors %d  other work %s%%  load %s %s %s  CPU/request: server %s us, redis %s us, wrk %s us\n", $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 }'
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(redis-server --version | cut -d' ' -f3)," \
  "uptime: $(uptime | sed 's/^ *//')"
echo "# each run: wrk $WRK_ARGS (random subjects over 1,000,000), warm-up $WARMUP, Redis flushed before it," \
  "worker threads: inbound-web ${INBOUND_WORKERS:-default}, limitador ${LIMITADOR_WORKERS:-default}"
: >"$TMP/results"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  if [ $((r % 2)) = 1 ]; then order="limitador inbound-web"; else order="inbound-web limitador"; fi
  [ "$WITH_LIMITADOR" = 1 ] || order=inbound-web
  if [ -n "${BASELINE:-}" ]; then
    # Alternate the two builds too, so drift favours neither.
    if [ $((r % 2)) = 1 ]; then order="$order baseline"; else order="baseline $order"; fi
  fi
  [ "${FLOOR:-0}" = 0 ] || order="$order floor"
  echo "round $r"
  for server in $order; do
    start "$server"
    measure "$r" "$server"
    stop
  done
  r=$((r + 1))
done

echo
echo "| round | server | req/s | p50 ms | p90 ms | p99 ms | errors | other work | load average before | CPU µs/request: server, redis, wrk |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
awk '{ printf "| %s | %s | %s | %.2f | %.2f | %.2f | %d | %s%% | %s %s %s | %s, %s, %s |\n", $1, $2, $3, $4, $5, $6, $7 + $8, $9, $10, $11, $12, $13, $14, $15 }' "$TMP/results"
echo
python3 - "$TMP/results" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
by_round = {}
for r in rows:
    by_round.setdefault(r[0], {})[r[1]] = [float(v) for v in (r[2], r[5], r[12], r[13], r[14])]
tput, p99, path, budget, server_cpu, total_cpu = [], [], [], [], [], []
base_cpu, base_total = [], []
for rnd, s in sorted(by_round.items(), key=lambda kv: int(kv[0])):
    if "baseline" in s:
        base_cpu.append(s["baseline"][2] / s["inbound-web"][2])
        base_total.append(sum(s["baseline"][2:]) / sum(s["inbound-web"][2:]))
        print("round %s: baseline/inbound-web req/s %.2fx; CPU per request: server %.2fx,"
              " server + redis + wrk %.2fx" % (rnd, s["baseline"][0] / s["inbound-web"][0],
                                               base_cpu[-1], base_total[-1]))
    if "limitador" not in s:
        continue
    (lr, lp), (ir, ip) = s["limitador"][:2], s["inbound-web"][:2]
    tput.append(ir / lr)
    p99.append(ip / lp)
    # CPU per request, limitador / inbound-web: the server alone, and server + Redis + wrk
    # (what bounds req/s when the three share the cores).
    server_cpu.append(s["limitador"][2] / s["inbound-web"][2])
    total_cpu.append(sum(s["limitador"][2:]) / sum(s["inbound-web"][2:]))
    line = "round %s: inbound-web/limitador req/s %.2fx, p99 %.2fx; limitador/inbound-web CPU" \
        " per request: server %.2fx, all three %.2fx" % (
            rnd, tput[-1], p99[-1], server_cpu[-1], total_cpu[-1])
    if "floor" in s:
        app_us, redis_us, wrk_us = s["inbound-web"][2:]
        http_us = s["floor"][2]
        path.append(app_us - http_us)
        budget.append(sum(s["limitador"][2:]) / 2 - (http_us + redis_us + wrk_us))
        line += "; evaluation path %.1f us of CPU per request, at most %.1f us for 2x" % (
            path[-1], budget[-1])
    print(line)
if base_cpu:
    print("median over %d round(s): baseline/inbound-web CPU per request: server %.2fx,"
          " server + redis + wrk %.2fx" % (len(base_cpu), statistics.median(base_cpu),
                                           statistics.median(base_total)))
if not tput:
    sys.exit(0)
print("median over %d round(s): req/s %.2fx (goal >= 2), p99 %.2fx (goal <= 0.5);"
      " limitador/inbound-web CPU per request: server %.2fx, server + redis + wrk %.2fx" % (
    len(tput), statistics.median(tput), statistics.median(p99), statistics.median(server_cpu),
    statistics.median(total_cpu)))
if path:
    print("inbound-web's evaluation path: median %.1f us of CPU per request; for 2x: %.1f us" % (
        statistics.median(path), statistics.median(budget)))
EOF
