# Sourced by grpc-cpu.sh and deny-cache-edges.sh (not run): one gRPC ShouldRateLimit call sent
# by h2load (an efficient HTTP/2 client), and the app's CPU time. Expects TMP and APID.
#   rls_call VALUE         writes $TMP/call.bin: a gRPC-framed RateLimitRequest {domain:
#                          "bench", descriptors: [{entries: [{key: "key", value: VALUE}]}],
#                          hits_addend: 1}, protobuf written out by hand
#   rls_h2load PORT ARGS   sends it over 2 connections x 32 streams (ARGS: -n N, ...)
#   app_cpu                utime + stime of $APID, in clock ticks (getconf CLK_TCK per second)
rls_call() {
  python3 - "$TMP/call.bin" "$1" <<'PY'
import sys
def field(tag, payload): return bytes([tag << 3 | 2, len(payload)]) + payload
entry = field(1, b"key") + field(2, sys.argv[2].encode())
msg = field(1, b"bench") + field(2, field(1, entry)) + bytes([3 << 3 | 0, 1])
open(sys.argv[1], "wb").write(b"\x00" + len(msg).to_bytes(4, "big") + msg)
PY
}
rls_h2load() {
  port=$1; shift
  h2load "$@" -c 2 -m 32 -d "$TMP/call.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
}
app_cpu() { awk '{print $14 + $15}' "/proc/$APID/stat"; }
