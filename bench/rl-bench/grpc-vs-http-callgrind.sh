#!/bin/sh
# Instructions and allocations per decision under callgrind, gRPC ShouldRateLimit beside HTTP
# POST /v1/evaluate, the same decision (local provider, a token bucket that admits every
# call, one subject "k-1"): where the gRPC path spends more than the HTTP one. Counts are of
# user-space instructions only (system calls are not counted), so they do not move with the
# machine's load; grpc-vs-http-cpu.sh measures the CPU time.
#
#   cargo build --profile profiling -p inbound-web
#   bench/rl-bench/grpc-vs-http-callgrind.sh [N] [MODES]    (needs valgrind, h2load, python3)
#
# MODES (default "grpc http"): grpc is h2load -c16 -m8 (HTTP/2, the call of grpc-call.sh),
# http is h2load --h1 -c16 -m1 (HTTP/1.1 keep-alive, one request in flight per connection,
# as wrk sends). Each mode runs its own app (BIN, default
# ${CARGO_TARGET_DIR:-target}/profiling/inbound-web; one worker thread) under valgrind:
# 2,000 warm-up calls, counters zeroed, N calls (default 20000), counters dumped. Prints per
# mode callgrind-per-request.py's line (instructions and allocations per request), then
# callgrind-compare.py's self instructions per request by crate and the functions whose
# inclusive cost differs most. Dumps stay in OUT (default /tmp/callgrind-grpc-vs-http):
# OUT/MODE.PID.1; callgrind_annotate --inclusive=yes on them lists the top functions.
# Run it alone: callgrind beside another heavy process once hung.
set -eu
N=${1:-20000}
MODES=${2:-grpc http}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/profiling/inbound-web}
GPORT=${GPORT:-18397}
HPORT=${HPORT:-18398}
OUT=${OUT:-/tmp/callgrind-grpc-vs-http}
TMP=$(mktemp -d)
APID=
mkdir -p "$OUT"
cleanup() {
  if [ -n "$APID" ]; then kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=grpc-call.sh source-path=SCRIPTDIR disable=SC1091
. "$HERE/grpc-call.sh"
bench_app_config "$HPORT" "$GPORT" "worker_threads = 1" > "$TMP/app.toml"
rls_call k-1
printf '%s' '{"policy":"api","subject":"k-1","cost":1}' > "$TMP/evaluate.json"

load() { # MODE COUNT: exactly COUNT calls; prints h2load's requests line
  case $1 in
    grpc) h2load -t1 -c16 -m8 -n "$2" -d "$TMP/call.bin" -H 'content-type: application/grpc' \
            -H 'te: trailers' "http://127.0.0.1:$GPORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" ;;
    http) h2load --h1 -t1 -c16 -m1 -n "$2" -d "$TMP/evaluate.json" \
            -H 'content-type: application/json' "http://127.0.0.1:$HPORT/v1/evaluate" ;;
  esac | awk '/^requests:/ || /^status codes:/'
}

files=
for m in $MODES; do
  RUST_LOG=warn valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$OUT/$m.%p" \
    "$BIN" --config "$TMP/app.toml" 2>"$TMP/app.log" &
  APID=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && break; sleep 0.1; done
  load "$m" 2000 >/dev/null
  callgrind_control -z "$APID" >/dev/null 2>&1
  statuses=$(load "$m" "$N" | tr -s ' \n' ' ')
  callgrind_control -d "$APID" >/dev/null 2>&1
  pid=$APID
  kill "$APID"; wait "$APID" 2>/dev/null || true; APID=
  # The dump is $m.PID.1; $m.PID, written at exit, counts the whole run and is dropped.
  rm -f "$OUT/$m.$pid"
  echo "$m: $statuses"
  python3 "$HERE/../http-sidecar/callgrind-per-request.py" "$N" "$OUT/$m.$pid.1" "$m"
  files="$files $OUT/$m.$pid.1"
done
# shellcheck disable=SC2086
[ "$(echo $files | wc -w)" -eq 2 ] && python3 "$HERE/callgrind-compare.py" "$N" $files
echo "dumps:$files"
