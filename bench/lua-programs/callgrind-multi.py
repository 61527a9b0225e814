#!/usr/bin/env python3
"""Instructions per EVALSHA (callgrind, counting only inside evalShaCommand): one call of
lua/rate-multi-v1.lua deciding three limits (token bucket, fixed window, GCRA; 100 per
hour) against the three single programs' calls for the same limits.

Usage: bench/lua-programs/callgrind-multi.py [CALLS]   (default 2000; needs valgrind,
redis-server and redis-cli on PATH; about a minute). Each figure is one private
redis-server under callgrind: CALLS calls over CALLS/10 keys (so most calls find state),
allow = cost 1, deny = cost 100 on keys already holding cost 1 (the first touch of each key
allows, so a tenth of the deny calls are allows).
"""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000


def src(name):
    with open(os.path.join(ROOT, "lua", name)) as f:
        return f.read()


def resp(args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def common(cost):
    # cost, revision, max_clock_regression_ms, cleanup_grace_ms
    return [str(cost), "1", "2000", "7200000"]


# 100 per hour: token bucket capacity 100, scale 36000, 1 unit/ms; fixed window 100 per
# 3600000 ms; GCRA burst 100, interval 36000 units, 1 unit/ms.
MEMBERS = [
    ("rate-token-bucket-v1.lua", "3", lambda c: common(c) + ["100", "36000", "1"]),
    ("rate-fixed-window-v1.lua", "1", lambda c: common(c) + ["100", "3600000"]),
    ("rate-gcra-v1.lua", "4", lambda c: common(c) + ["100", "36000", "1"]),
]


def measure(source, calls_of):
    """Instructions in evalShaCommand per call over the calls calls_of(sha) yields."""
    out = tempfile.mktemp(prefix="cg-multi.")
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


def keys_of(i, member):
    return "rl:{%04d}%012d%d" % (i % 1000, i, member)


def run(cost):
    spread = max(1, CALLS // 10)
    multi_args = ["3", "0"]
    for _, code, args in MEMBERS:
        a = args(cost)
        multi_args += [code, str(len(a))] + a

    def multi_calls(sha):
        for c in range(CALLS):
            i = c % spread
            yield resp(["EVALSHA", sha, "3"] + [keys_of(i, m) for m in range(3)] + multi_args)

    multi = measure(src("rate-multi-v1.lua"), multi_calls)
    singles = 0.0
    for m, (name, _, args) in enumerate(MEMBERS):
        def single_calls(sha, m=m, args=args):
            for c in range(CALLS):
                yield resp(["EVALSHA", sha, "1", keys_of(c % spread, m)] + args(cost))
        singles += measure(src(name), single_calls)
    return multi, singles


print("| decision | multi (3 members) | 3 single calls | ratio |")
print("| --- | ---: | ---: | ---: |")
for label, cost in [("allow", 1), ("deny", 100)]:
    multi, singles = run(cost)
    print("| %s | %d | %d | %.2f |" % (label, multi, singles, multi / singles))
