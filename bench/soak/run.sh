#!/bin/sh
# Soak run of inbound-web (docs/operations.md, "Soak run"); not part of CI.
#
#   bench/soak/run.sh                    (30 minutes; needs wrk, redis-server, curl, python3)
#   DURATION=2m bench/soak/run.sh        (a short try)
#
# Builds nothing: runs ${CARGO_TARGET_DIR:-target}/release/inbound-web (or $BIN) with the
# redis provider on a private redis-server (free loopback ports, never 6379), one policy
# route (/api, subject x-api-key) and one event gate (orders). For DURATION it offers a mixed
# load at about RATE requests/s in total (three paced wrk processes: the middleware route,
# /v1/evaluate and gate submissions, random subjects and keys), keeps WS_FAST fast and
# WS_SLOW slow WebSocket subscribers of the gate stream open (slow ones stop reading for
# SLOW_PAUSE seconds, default 90, are dropped by the server's send timeout and reconnect),
# and restarts Redis every RESTART_EVERY seconds (default 180, a third of a short run; kill,
# down RESTART_DOWN seconds, start on the same port).
# Every SAMPLE seconds the app's RSS (/proc/PID/status VmRSS), open descriptors
# (/proc/PID/fd), threads, Redis up/down and the /readyz status go to samples.csv. At the end
# summary.py prints warm-up (the first WARMUP seconds, default 300) against the rest. The
# outputs stay in $OUT (default a new temporary directory, printed at the end).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/inbound-web}
DURATION=${DURATION:-30m}
RATE=${RATE:-1500}
RESTART_EVERY=${RESTART_EVERY:-}
RESTART_DOWN=${RESTART_DOWN:-5}
SAMPLE=${SAMPLE:-10}
WS_FAST=${WS_FAST:-2}
WS_SLOW=${WS_SLOW:-2}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

case $DURATION in
  *h) SECS=$((${DURATION%h} * 3600)) ;;
  *m) SECS=$((${DURATION%m} * 60)) ;;
  *s) SECS=${DURATION%s} ;;
  *) SECS=$DURATION ;;
esac
if [ -z "${WARMUP:-}" ]; then
  WARMUP=300
  [ "$SECS" -ge 1200 ] || WARMUP=$((SECS / 4))
fi
if [ -z "$RESTART_EVERY" ]; then
  RESTART_EVERY=180
  [ "$SECS" -ge 540 ] || RESTART_EVERY=$((SECS / 3))
fi
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p inbound-web first"; exit 1; }
for tool in wrk redis-server curl python3; do
  command -v $tool >/dev/null || { echo "needs $tool"; exit 1; }
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
RPORT=${RPORT:-$(free_port)}
HPORT=${HPORT:-$(free_port)}
[ "$RPORT" != 6379 ] || { echo "refusing port 6379"; exit 1; }
BASE=http://127.0.0.1:$HPORT

APID= BGPIDS=
cleanup() {
  for p in $BGPIDS; do kill "$p" 2>/dev/null || true; done
  [ -z "$APID" ] || kill "$APID" 2>/dev/null || true
  [ ! -f "$OUT/redis.pid" ] || kill "$(cat "$OUT/redis.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

T0=$(date +%s)
log() { echo "t=$(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/events.log"; }

start_redis() {
  redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT" \
    >>"$OUT/redis.log" 2>&1 &
  echo $! >"$OUT/redis.pid"
  for _ in $(seq 1 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && return; sleep 0.1; done
}

cat >"$OUT/soak.toml" <<TOML
[http]
bind = "127.0.0.1:$HPORT"

[rate_limit]
enabled = true
provider = "redis"
default_policy = "api"
subject_secret = "soak-subject-secret-of-at-least-32-bytes"

[rate_limit.policies.api]
algorithm = "token_bucket"
capacity = 20
refill_amount = 20
refill_interval = "1s"

[rate_limit.redis]
url = "redis://127.0.0.1:$RPORT/0"
role = "coordination"
command_timeout = "1s"

[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-api-key"

[event_gates.orders]
mode = "only_once"
duration = "1s"
retention = "2m"
TOML

start_redis
RUST_LOG=warn "$BIN" --config "$OUT/soak.toml" >"$OUT/app.log" 2>&1 &
APID=$!
for _ in $(seq 1 600); do curl -sf "$BASE/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "$BASE/readyz" >/dev/null || { echo "app not ready"; cat "$OUT/app.log"; exit 1; }
log "start: app pid $APID on $HPORT, redis on $RPORT, $DURATION at ~$RATE req/s, nproc $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"

# The samples: every SAMPLE seconds until the app is gone or the time is up.
(
  echo "t_s,rss_kib,fds,threads,redis_up,readyz" >"$OUT/samples.csv"
  while [ -d "/proc/$APID" ]; do
    t=$(( $(date +%s) - T0 ))
    [ "$t" -le "$SECS" ] || break
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$APID/status")
    thr=$(awk '/^Threads:/ {print $2}' "/proc/$APID/status")
    fds=$(ls "/proc/$APID/fd" | wc -l)
    up=0; kill -0 "$(cat "$OUT/redis.pid")" 2>/dev/null && up=1
    rz=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$BASE/readyz" || true)
    echo "$t,$rss,$fds,$thr,$up,$rz" >>"$OUT/samples.csv"
    sleep "$SAMPLE"
  done
) &
BGPIDS="$BGPIDS $!"

# Redis restarts: kill, RESTART_DOWN seconds down, start on the same port, then time /readyz.
(
  n=0
  while sleep "$RESTART_EVERY"; do
    [ $(( $(date +%s) - T0 + RESTART_DOWN + 30 )) -lt "$SECS" ] || break
    n=$((n + 1)); pid=$(cat "$OUT/redis.pid")
    kill "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    log "redis restart $n: killed"
    sleep "$RESTART_DOWN"
    start_redis
    s=$(date +%s%N)
    ready=no
    for _ in $(seq 1 300); do
      curl -sf --max-time 1 "$BASE/readyz" >/dev/null && { ready=yes; break; }; sleep 0.1
    done
    ms=$(( ($(date +%s%N) - s) / 1000000 ))
    ev=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
      -d '{"policy":"api","subject":"restart-probe","cost":1}' "$BASE/v1/evaluate" || true)
    gt=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
      -d '{"key":"restart-probe-'"$n"'"}' "$BASE/v1/gates/orders/events" || true)
    log "redis restart $n: started; ready=$ready after ${ms} ms; evaluate $ev; gate submit $gt"
  done
) &
BGPIDS="$BGPIDS $!"

i=0
while [ $i -lt "$WS_FAST" ]; do
  python3 "$HERE/ws-subscriber.py" 127.0.0.1 "$HPORT" /v1/gates/orders/stream fast "$SECS" "$OUT/ws-fast-$i.json" &
  BGPIDS="$BGPIDS $!"; i=$((i + 1))
done
i=0
while [ $i -lt "$WS_SLOW" ]; do
  python3 "$HERE/ws-subscriber.py" 127.0.0.1 "$HPORT" /v1/gates/orders/stream slow "$SECS" "$OUT/ws-slow-$i.json" &
  BGPIDS="$BGPIDS $!"; i=$((i + 1))
done

# The load: shares of RATE 55% middleware, 30% evaluate, 15% gate; each connection waits
# connections * 1000 / rate - 1 ms (about 1 ms of latency) before each request.
load() { # $1 kind, $2 url, $3 connections, $4 share in percent
  d=$(( $3 * 1000 * 100 / (RATE * $4) - 1 )); [ "$d" -ge 0 ] || d=0
  wrk -t1 -c"$3" -d"${SECS}s" --timeout 5s -s "$HERE/load.lua" "$2" -- "$1" "$d" >"$OUT/wrk-$1.txt" 2>&1
}
load api "$BASE/api/x" 8 55 & W1=$!
load evaluate "$BASE/v1/evaluate" 4 30 & W2=$!
load gate "$BASE/v1/gates/orders/events" 2 15 & W3=$!
wait $W1 $W2 $W3 || true

alive=yes; kill -0 "$APID" 2>/dev/null || alive=no
log "end: app alive=$alive, app.log $(wc -l <"$OUT/app.log") lines"
sleep 1
python3 "$HERE/summary.py" "$OUT" "$WARMUP"
echo "outputs in $OUT"
