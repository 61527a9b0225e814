# Sourced by the gRPC benchmarks (not run): the app's configuration, one gRPC ShouldRateLimit
# call sent by h2load (an efficient HTTP/2 client), and the app's CPU time. Expects TMP and APID.
#   bench_app_config HPORT GPORT [WORKERS_LINE]
#                          prints the app's TOML: HTTP and gRPC on loopback, the local
#                          provider, one token bucket too large to deny, the rule of domain
#                          "bench" and entry "key"
#                          (WORKERS_LINE, e.g. "worker_threads = 1", goes under [http])
#   rls_call VALUE         writes $TMP/call.bin: a gRPC-framed RateLimitRequest {domain:
#                          "bench", descriptors: [{entries: [{key: "key", value: VALUE}]}],
#                          hits_addend: 1}, protobuf written out by hand
#   rls_h2load PORT ARGS   sends it over 2 connections x 32 streams (ARGS: -n N, ...)
#   app_cpu                utime + stime of $APID, in clock ticks (getconf CLK_TCK per second)
bench_app_config() {
  cat <<TOML
[http]
bind = "127.0.0.1:$1"
${3:-}

[grpc]
bind = "127.0.0.1:$2"

[reload]
watch = false

[rate_limit]
enabled = true
provider = "local"
default_policy = "api"

[rate_limit.policies.api]
algorithm = "token_bucket"
capacity = 1000000000
refill_amount = 1000000000
refill_interval = "1s"

[[rls.descriptors]]
domain = "bench"
entries = ["key"]
policy = "api"
TOML
}
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
