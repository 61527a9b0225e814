#!/usr/bin/env python3
"""Instructions per EVALSHA (callgrind, counting only inside evalShaCommand), which other
processes do not move: each Redis program against its floor (floors/: the same redis.calls
and reply shape, no decision), and the multi-limit program deciding three limits (token
bucket, fixed window, GCRA) against the three single programs' calls for the same limits.

Usage: bench/lua-programs/callgrind.py [CALLS]   (default 2000; needs valgrind,
redis-server and redis-cli on PATH; a few minutes). Each figure is one private redis-server
under callgrind: CALLS calls over CALLS/10 keys (so most calls find state), allow = cost 1
on 100 per hour, deny = cost 100 on keys already holding cost 1 (the first touch of each key
allows, so a tenth of the deny calls are allows; their floor is the allow floor's).
"""
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LUA = os.path.join(HERE, "..", "..", "crates", "adapter-redis", "lua")
CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000


def src(path):
    with open(path) as f:
        return f.read()


def program(name):
    return src(os.path.join(LUA, name))


def floor(name):
    return src(os.path.join(HERE, "floors", name))


def resp(args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def common(cost):
    # cost, revision, max_clock_regression_ms, cleanup_grace_ms
    return [str(cost), "1", "2000", "7200000"]


# 100 per hour: token bucket capacity 100, scale 36000, 1 unit/ms; fixed window and
# sliding counter/log 100 per 3600000 ms; GCRA burst 100, interval 36000 units, 1 unit/ms.
SINGLES = [
    ("rate-fixed-window-v1.lua", "1", lambda c: common(c) + ["100", "3600000"]),
    ("rate-sliding-counter-v1.lua", "2", lambda c: common(c) + ["100", "3600000"]),
    ("rate-token-bucket-v1.lua", "3", lambda c: common(c) + ["100", "36000", "1"]),
    ("rate-gcra-v1.lua", "4", lambda c: common(c) + ["100", "36000", "1"]),
    ("rate-sliding-log-v1.lua", "5", lambda c: common(c) + ["100", "3600000"]),
]
MEMBERS = [SINGLES[2], SINGLES[0], SINGLES[3]]


def measure(source, calls_of):
    """Instructions in evalShaCommand per call over the calls calls_of(sha) yields."""
    out = tempfile.mktemp(prefix="cg-lua.")
    port = "17480"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--toggle-collect=evalShaCommand",
         "--callgrind-out-file=" + out, "redis-server", "--port", port, "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli = ["redis-cli", "-p", port]
    for _ in range(200):
        time.sleep(0.2)
        if subprocess.run(cli + ["PING"], capture_output=True, text=True).stdout.strip() == "PONG":
            break
    sha = subprocess.run(cli + ["SCRIPT", "LOAD", source], capture_output=True,
                         text=True).stdout.strip()
    calls = list(calls_of(sha))
    subprocess.run(cli + ["--pipe"], input=b"".join(calls), capture_output=True, check=True)
    subprocess.run(cli + ["SHUTDOWN", "NOSAVE"], capture_output=True)
    server.wait()
    with open(out) as f:
        total = int(re.search(r"^(?:summary|totals):\s*(\d+)", f.read(), re.M).group(1))
    os.remove(out)
    return total / len(calls)


def key(i, member):
    return "rl:{%04d}%012d%d" % (i % 1000, i, member)


SPREAD = max(1, CALLS // 10)


def single(source, args, m=0):
    def calls(sha):
        for c in range(CALLS):
            yield resp(["EVALSHA", sha, "1", key(c % SPREAD, m)] + args)
    return measure(source, calls)


def multi(source, args):
    def calls(sha):
        for c in range(CALLS):
            i = c % SPREAD
            yield resp(["EVALSHA", sha, "3"] + [key(i, m) for m in range(3)] + args)
    return measure(source, calls)


def floors_table():
    print("| program | decision | instructions | floor | program / floor |")
    print("| --- | --- | ---: | ---: | ---: |")
    for label, cost, floor_name in [("allow", 1, "single.lua"), ("deny", 100, "single-deny.lua")]:
        base = single(floor(floor_name), common(cost))
        for name, _, args in SINGLES:
            n = single(program(name), args(cost))
            print("| %s | %s | %d | %d | %.2f |" % (name, label, n, base, n / base))


def multi_table():
    print("| decision | multi (3 members) | its floor | multi / floor | 3 single calls | multi / singles |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, cost, floor_name in [("allow", 1, "multi-3.lua"), ("deny", 100, "multi-3-deny.lua")]:
        args = ["3", "0"]
        for _, code, a in MEMBERS:
            a = a(cost)
            args += [code, str(len(a))] + a
        m = multi(program("rate-multi-v1.lua"), args)
        base = multi(floor(floor_name), args)
        singles = sum(single(program(name), a(cost), i) for i, (name, _, a) in enumerate(MEMBERS))
        print("| %s | %d | %d | %.2f | %d | %.2f |" % (label, m, base, m / base, singles, m / singles))


floors_table()
print()
multi_table()
