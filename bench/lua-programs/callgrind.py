#!/usr/bin/env python3
"""Instructions per EVALSHA (callgrind, counting only inside evalShaCommand), which other
processes do not move: each Redis program against its floor (floors/: the same redis.calls
and reply shape, no decision), and the multi-limit program deciding three limits (token
bucket, fixed window, GCRA) against the three single programs' calls for the same limits,
and the batch program: instructions per decision in batches of 16 and 8 token-bucket allows,
on new keys and on keys that hold state, against single calls for the same decisions.

Usage: bench/lua-programs/callgrind.py [CALLS] [TABLE]   (default 2000; TABLE one of floors,
multi, batch for that table alone; needs valgrind,
redis-server and redis-cli on PATH; a few minutes). Each figure is one private redis-server
under callgrind: CALLS calls over CALLS/10 keys (so most calls find state), allow = cost 1
on 100 per hour, deny = cost 100 on keys already holding cost 1 (the first touch of each key
allows, so a tenth of the deny calls are allows; their floor is the allow floor's). The
programs take their arguments packed in one binary string (drive.py's pack); a floor is
given its program's own ARGV, so that Redis builds the same Lua strings for both. Every
reply is checked: a program's allow run must answer ALLOWED throughout, its deny run DENIED
but for each key's first touch, and no run may answer anything but ALLOWED or DENIED; a batch
must answer DECIDED with every row ALLOWED.
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from drive import pack, parse

HERE = os.path.dirname(os.path.abspath(__file__))
LUA = os.path.join(HERE, "..", "..", "crates", "adapter-redis", "lua")
CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
ONLY = sys.argv[2] if len(sys.argv) > 2 else None


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


def packed(fmt, params):
    """A program's ARGV[1] at a cost: cost, revision, max_clock_regression_ms and
    cleanup_grace_ms, then the policy's parameters, packed in the program's format."""
    return lambda cost: [pack(fmt, [cost, 1, 2000, 7200000] + params)]


# 100 per hour: token bucket capacity 100, scale 36000, 1 unit/ms; fixed window and
# sliding counter/log 100 per 3600000 ms; GCRA burst 100, interval 36000 units, 1 unit/ms.
SINGLES = [
    ("rate-fixed-window-v2.lua", "1", packed("<I7I4I5I5I7I5", [100, 3600000])),
    ("rate-sliding-counter-v2.lua", "2", packed("<I7I4I5I5I5I5", [100, 3600000])),
    ("rate-token-bucket-v2.lua", "3", packed("<I7I4I5I5I7I5I7", [100, 36000, 1])),
    ("rate-gcra-v2.lua", "4", packed("<I7I4I5I5I7I5I7", [100, 36000, 1])),
    ("rate-sliding-log-v2.lua", "5", packed("<I7I4I5I5I2I5", [100, 3600000])),
]
MEMBERS = [SINGLES[2], SINGLES[0], SINGLES[3]]
# The programs whose allows keep an existing key's expiry while its deadline stays: their
# allow floor keeps it too.
KEEPS = {"rate-fixed-window-v2.lua", "rate-sliding-counter-v2.lua", "rate-token-bucket-v2.lua",
         "rate-gcra-v2.lua", "rate-sliding-log-v2.lua"}


def batch_rows(buf, pos):
    """(status, end) of a batch reply at buf[pos:] (an array of bulk strings), or None while
    it is incomplete; status is DECIDED only when every row's status code is 1 (ALLOWED)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return None
    if buf[pos] != 42:  # '*'
        return buf[pos:end], end + 2
    items, pos, first, allowed = int(buf[pos + 1:end]), end + 2, None, True
    for _ in range(items):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        n = int(buf[pos + 1:end])
        if end + 2 + n + 2 > len(buf):
            return None
        item = buf[end + 2:end + 2 + n]
        if first is None:
            first = item
        elif n != 43 or item[0] != 1:
            allowed = False
        pos = end + 2 + n + 2
    return (first if allowed else b"NOT ALL ALLOWED"), pos


def send(port, calls, parse=parse):
    """Sends the calls on one connection; the count of each status answered."""
    s = socket.create_connection(("127.0.0.1", int(port)))
    s.sendall(b"".join(calls))
    buf, pos, tally, done = b"", 0, {}, 0
    while done < len(calls):
        data = s.recv(262144)
        if not data:
            sys.exit("connection closed after %d replies" % done)
        buf += data
        while True:
            r = parse(buf, pos)
            if r is None:
                break
            tally[r[0]] = tally.get(r[0], 0) + 1
            pos, done = r[1], done + 1
        buf, pos = buf[pos:], 0
    s.close()
    return tally


def measure(source, calls_of, allowed=None, batch=False):
    """Instructions in evalShaCommand per call over the calls calls_of(sha) yields, whose
    replies must all be ALLOWED or DENIED, and ALLOWED `allowed` times when it is given (a
    batch's: DECIDED, every row ALLOWED)."""
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
    tally = send(port, calls, batch_rows if batch else parse)
    subprocess.run(cli + ["SHUTDOWN", "NOSAVE"], capture_output=True)
    server.wait()
    with open(out) as f:
        total = int(re.search(r"^(?:summary|totals):\s*(\d+)", f.read(), re.M).group(1))
    os.remove(out)
    if batch:
        if set(tally) != {b"DECIDED"}:
            sys.exit("unexpected answers %r to %r" % (tally, calls[0]))
    elif set(tally) - {b"ALLOWED", b"DENIED"} or allowed not in (None, tally.get(b"ALLOWED", 0)):
        sys.exit("unexpected answers %r to %r" % (tally, calls[0]))
    return total / len(calls)


def key(i, member):
    return "rl:{%04d}%012d%d" % (i % 1000, i, member)


SPREAD = max(1, CALLS // 10)


# A program's ALLOWED answers: every call for an allow; for a deny, each key's first touch.
def allows(cost):
    return CALLS if cost == 1 else SPREAD


def single(source, args, m=0, allowed=None):
    def calls(sha):
        for c in range(CALLS):
            yield resp(["EVALSHA", sha, "1", key(c % SPREAD, m)] + args)
    return measure(source, calls, allowed)


def multi(source, args, allowed=None):
    def calls(sha):
        for c in range(CALLS):
            i = c % SPREAD
            yield resp(["EVALSHA", sha, "3"] + [key(i, m) for m in range(3)] + args)
    return measure(source, calls, allowed)


def floors_table():
    print("| program | decision | instructions | floor | program / floor |")
    print("| --- | --- | ---: | ---: | ---: |")
    for label, cost, floor_name in [("allow", 1, "single.lua"), ("deny", 100, "single-deny.lua")]:
        for name, _, args in SINGLES:
            # The floor of each program is measured with that program's argument.
            f = "single-keep.lua" if cost == 1 and name in KEEPS else floor_name
            base = single(floor(f), args(cost))
            n = single(program(name), args(cost), allowed=allows(cost))
            print("| %s | %s | %d | %d | %.2f |" % (name, label, n, base, n / base))


def multi_table():
    print("| decision | multi (3 members) | its floor | multi / floor | 3 single calls | multi / singles |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, cost, floor_name in [("allow", 1, "multi-3.lua"), ("deny", 100, "multi-3-deny.lua")]:
        # The header (3 members, no evaluation id), then per member its code and argument.
        args = [pack("<I1I4", [3, 0])]
        for _, code, a in MEMBERS:
            args += [code] + a(cost)
        m = multi(program("rate-multi-v2.lua"), args, allows(cost))
        base = multi(floor(floor_name), args)
        singles = sum(single(program(name), a(cost), i, allows(cost))
                      for i, (name, _, a) in enumerate(MEMBERS))
        print("| %s | %d | %d | %.2f | %d | %.2f |" % (label, m, base, m / base, singles, m / singles))


def batch_table():
    """Per decision: batches of `size` token-bucket allows against single calls of the same
    decisions, CALLS decisions in all, on new keys (every key written once) and on keys
    that hold state (CALLS/10 keys, written ten times each)."""
    name, code, args = SINGLES[2]
    a = args(1)
    print("| keys | batch size | batch, per decision | single calls | batch / single |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for keys, spread in [("new", CALLS), ("holding state", SPREAD)]:
        for size in [16, 8]:
            batches = CALLS // size

            def batch_calls(sha, size=size, spread=spread, batches=batches):
                for c in range(batches):
                    ks = [key((c * size + j) % spread, 0) for j in range(size)]
                    yield resp(["EVALSHA", sha, str(size)] + ks + [pack("<I1", [size])]
                               + [code, a[0]] * size)

            def single_calls(sha, size=size, spread=spread, batches=batches):
                for i in range(batches * size):
                    yield resp(["EVALSHA", sha, "1", key(i % spread, 0)] + a)

            b = measure(program("rate-batch-v2.lua"), batch_calls, batch=True) / size
            one = measure(program(name), single_calls, allowed=batches * size)
            print("| %s | %d | %d | %d | %.3f |" % (keys, size, b, one, b / one))


if ONLY in (None, "floors"):
    floors_table()
    print()
if ONLY in (None, "multi"):
    multi_table()
    print()
if ONLY in (None, "batch"):
    batch_table()
