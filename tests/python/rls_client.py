#!/usr/bin/env python3
"""Envoy RateLimitService v3 client for the interop test, on grpcio and xds-protos (the
generated Python stubs of Envoy's API), so that the server is checked against code it did not
generate itself.

    rls_client.py --check-modules          exit 0 when grpcio and xds-protos import, 3 if not
    rls_client.py ADDR REQUESTS_JSON       send each request in order on one channel

REQUESTS_JSON is a list of {"domain": str, "hits": int, "descriptors": [[[key, value], ...], ...],
"descriptor_hits": [int | null, ...] (optional: each descriptor's own hits_addend)}.
Prints one JSON list, one object per request: {"overall_code", "statuses": [{"code",
"limit": {"name", "requests_per_unit", "unit"} | null, "remaining", "reset_ms"}], "headers":
{key: value}}, or {"error": STATUS_CODE_NAME, "message": str} for a gRPC error status.
"""

import json
import sys


def modules():
    try:
        import grpc  # noqa: F401
        from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def ask(stub, rls_pb2, request):
    import grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

    descriptors = [
        ratelimit_pb2.RateLimitDescriptor(
            entries=[
                ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries
            ]
        )
        for entries in request["descriptors"]
    ]
    # A descriptor's own hits_addend, as Envoy sends it (an explicit 0 included).
    for d, hits in zip(descriptors, request.get("descriptor_hits", [])):
        if hits is not None:
            d.hits_addend.value = hits
    message = rls_pb2.RateLimitRequest(
        domain=request["domain"], descriptors=descriptors, hits_addend=request.get("hits", 0)
    )
    try:
        r = stub.ShouldRateLimit(message, timeout=10)
    except grpc.RpcError as e:
        return {"error": e.code().name, "message": e.details()}
    code = rls_pb2.RateLimitResponse.Code.Name
    unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Name
    statuses = []
    for s in r.statuses:
        limit = None
        if s.HasField("current_limit"):
            limit = {
                "name": s.current_limit.name,
                "requests_per_unit": s.current_limit.requests_per_unit,
                "unit": unit(s.current_limit.unit),
            }
        reset_ms = None
        if s.HasField("duration_until_reset"):
            d = s.duration_until_reset
            reset_ms = d.seconds * 1000 + d.nanos // 1_000_000
        statuses.append(
            {
                "code": code(s.code),
                "limit": limit,
                "remaining": s.limit_remaining,
                "reset_ms": reset_ms,
            }
        )
    return {
        "overall_code": code(r.overall_code),
        "statuses": statuses,
        "headers": {h.key: h.value for h in r.response_headers_to_add},
    }


def main(argv):
    if argv[1:] == ["--check-modules"]:
        missing = modules()
        if missing:
            print(missing, file=sys.stderr)
            return 3
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    with grpc.insecure_channel(argv[1]) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        answers = [ask(stub, rls_pb2, r) for r in json.loads(argv[2])]
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
