#!/usr/bin/env python3
"""Load for floor.sh: N EVALSHA calls of one loaded script over CLIENTS connections, each
keeping PIPELINE calls in flight, keys drawn at random from RANGE per call. It exists because
the rate programs take their arguments packed in one binary string (NUL bytes included),
which redis-benchmark cannot send (its arguments are C strings). A Python client is slower
than redis-benchmark, which does not matter to floor.sh: its figure is Redis's own
usec_per_call. Every reply is checked: an error reply, or a decision other than ALLOWED or
DENIED (INVALID, say, which would measure a program's cheapest path), fails the run.

Usage: drive.py --port PORT --sha SHA --key KEY [--key KEY ...] [-n N] [-c CLIENTS]
                [-P PIPELINE] [-r RANGE] [--check TEXT] [ARG ...]
  KEY   a key template; __rand_int__ becomes a random 12-digit number below RANGE, drawn
        per key and call (as redis-benchmark -r does)
  ARG   ARGV, in order: FORMAT=V,V,... packs the values as unsigned little-endian integers
        of the widths of a struct format of I<n> fields ('<I1I4=3,0' is 5 bytes); any other
        ARG is sent as it is ('3')
  --check TEXT  one call with __rand_int__ as TEXT; prints the reply's status and exits
Prints the calls made and the statuses answered. callgrind.py and rl-bench/compare.sh use
its pack (and callgrind.py its reply parser).
"""
import argparse
import random
import re
import selectors
import socket
import sys
import time


def pack(fmt, values):
    """The bytes of struct format fmt ('<I7I4...', unsigned little-endian) holding values."""
    widths = [int(w) for w in re.findall(r"I(\d+)", fmt)]
    if not fmt.startswith("<") or len(widths) != len(values):
        raise ValueError("%s does not fit %d values" % (fmt, len(values)))
    return b"".join(int(v).to_bytes(w, "little") for v, w in zip(values, widths))


def argument(spec):
    """An ARG of the command line as the bytes sent."""
    if "=" in spec:
        fmt, values = spec.split("=", 1)
        return pack(fmt, values.split(","))
    return spec.encode()


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


def parse(buf, pos):
    """(status, end) of the reply at buf[pos:], or None while it is incomplete. status is
    the reply's first string (a decision's status); an error's is b'-' and its text."""
    find, size = buf.find, len(buf)
    # Walk the nested arrays with a stack of the elements still due at each level.
    pending, stack, status = 1, [], None
    while pending:
        end = find(b"\r\n", pos)
        if end < 0:
            return None
        kind = buf[pos]
        pending -= 1
        if kind == 36:  # '$'
            n = int(buf[pos + 1:end])
            pos = end + 2
            if n >= 0:
                if pos + n + 2 > size:
                    return None
                if status is None:
                    status = buf[pos:pos + n]
                pos += n + 2
        elif kind == 42:  # '*'
            n = int(buf[pos + 1:end])
            pos = end + 2
            if n > 0:
                stack.append(pending)
                pending = n
        else:
            if status is None and kind != 58:  # not ':'
                status = (b"-" if kind == 45 else b"") + buf[pos + 1:end]
            pos = end + 2
        while not pending and stack:
            pending = stack.pop()
    return (b"?" if status is None else status), pos


class Driver:
    def __init__(self, sha, keys, args, key_range):
        self.head = b"*%d\r\n" % (3 + len(keys) + len(args)) + bulk(b"EVALSHA") + bulk(
            sha.encode()) + bulk(b"%d" % len(keys))
        self.tail = b"".join(bulk(a) for a in args)
        self.keys = keys
        # Each key's RESP form with a %012d slot: __rand_int__ always takes 12 digits.
        self.slots = b"".join(b"$%d\r\n%s\r\n" % (
            len(k.replace("__rand_int__", "0" * 12)), k.replace("__rand_int__", "%012d").encode())
            for k in keys)
        self.range = key_range

    def fixed(self, text):
        return self.head + b"".join(
            bulk(k.replace("__rand_int__", text).encode()) for k in self.keys) + self.tail

    def calls(self, count):
        r, n, slots, head, tail = random.randrange, len(self.keys), self.slots, self.head, self.tail
        rng = self.range
        return b"".join(head + slots % tuple(r(rng) for _ in range(n)) + tail
                        for _ in range(count))


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def fail(why):
    print("drive.py: " + why, file=sys.stderr)
    sys.exit(1)


def check(port, driver, text):
    s = connect(port)
    s.sendall(driver.fixed(text))
    buf = b""
    while True:
        data = s.recv(65536)
        if not data:
            fail("connection closed")
        buf += data
        got = parse(buf, 0)
        if got:
            print(got[0].decode(errors="replace"))
            return


def run(port, driver, n, clients, pipeline):
    sel = selectors.DefaultSelector()
    sent = done = 0
    tally = {}
    for _ in range(min(clients, n)):
        s = connect(port)
        k = min(pipeline, n - sent)
        s.sendall(driver.calls(k))
        sent += k
        sel.register(s, selectors.EVENT_READ, [b"", k])
    start = time.monotonic()
    while done < n:
        for key, _ in sel.select():
            s, state = key.fileobj, key.data
            data = s.recv(262144)
            if not data:
                fail("connection closed after %d replies" % done)
            buf, pos, got = state[0] + data, 0, 0
            while True:
                r = parse(buf, pos)
                if r is None:
                    break
                status, pos = r
                tally[status] = tally.get(status, 0) + 1
                got += 1
                if status[:1] == b"-":
                    fail("error reply: %s" % status[1:].decode(errors="replace"))
            state[0] = buf[pos:]
            state[1] -= got
            done += got
            k = min(pipeline - state[1], n - sent)
            if k > 0:
                s.sendall(driver.calls(k))
                sent += k
                state[1] += k
    took = time.monotonic() - start
    answers = " ".join("%s=%d" % (k.decode(errors="replace"), v) for k, v in sorted(tally.items()))
    print("%d calls in %.1f s (%.0f/s): %s" % (done, took, done / took, answers))
    if set(tally) - {b"ALLOWED", b"DENIED"}:
        fail("answers other than ALLOWED or DENIED: " + answers)


def main():
    p = argparse.ArgumentParser(description="EVALSHA load with binary-safe arguments")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sha", required=True)
    p.add_argument("--key", action="append", required=True)
    p.add_argument("-n", type=int, default=100000)
    p.add_argument("-c", type=int, default=16)
    p.add_argument("-P", type=int, default=1)
    p.add_argument("-r", type=int, default=1000000)
    p.add_argument("--check")
    p.add_argument("args", nargs="*")
    o = p.parse_args()
    driver = Driver(o.sha, o.key, [argument(a) for a in o.args], o.r)
    if o.check is not None:
        check(o.port, driver, o.check)
    else:
        run(o.port, driver, o.n, o.c, o.P)


if __name__ == "__main__":
    main()
