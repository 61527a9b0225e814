#!/bin/sh
# Instructions and allocations per request of the release code, under callgrind: figures
# that other processes on the machine do not move (docs/performance.md, "HTTP layer"). It
# counts malloc and friends by name, so it runs the `profiling` build (release code with
# debug info and symbols): cargo build --profile profiling -p inbound-web (BIN= another).
#
#   bench/http-sidecar/callgrind.sh [N] [MODES]     (needs valgrind, python3, redis-server)
#
# N requests (default 20000) from fixed-count.py on 16 keep-alive connections, after 2,000
# warm-up requests with other subjects; counters are zeroed after the warm-up and dumped after
# the N requests, so start-up is not counted. MODES (default "off local redis sidecar"): off,
# local and redis serve GET /api/x with a random x-api-key; sidecar is POST /v1/evaluate with
# the redis provider. Prints, per mode, instructions per request and malloc+calloc+realloc calls
# per request; the callgrind files are kept in $OUT (default /tmp/callgrind-inbound-web).
# CG_OPTS adds valgrind options, e.g. CG_OPTS=--cache-sim=yes to count simulated data-cache
# misses per request as well.
set -eu
N=${1:-20000}
MODES=${2:-off local redis sidecar}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/profiling/inbound-web}
RPORT=${RPORT:-16398}
HPORT=${HPORT:-18098}
OUT=${OUT:-/tmp/callgrind-inbound-web}
TMP=$(mktemp -d)
mkdir -p "$OUT"
. "$HERE/common.sh"
trap 'kill $RPID 2>/dev/null; kill $APID 2>/dev/null; rm -rf "$TMP"' EXIT
start_redis

for m in $MODES; do
  case $m in sidecar) mode=redis; load=evaluate ;; *) mode=$m; load=get ;; esac
  start $mode valgrind --tool=callgrind --dump-instr=no ${CG_OPTS:-} --callgrind-out-file="$OUT/$m.%p"
  python3 "$HERE/fixed-count.py" $load "$HPORT" 2000 16 1 >/dev/null
  callgrind_control -z "$APID" >/dev/null 2>&1
  statuses=$(python3 "$HERE/fixed-count.py" $load "$HPORT" "$N" 16 0)
  callgrind_control -d "$APID" >/dev/null 2>&1
  pid=$APID
  stop
  # The dump is $m.PID.1; $m.PID, written at exit, counts the whole run and is dropped.
  rm -f "$OUT/$m.$pid"
  python3 "$HERE/callgrind-per-request.py" "$N" "$OUT/$m.$pid.1" "$m ($statuses)"
done
