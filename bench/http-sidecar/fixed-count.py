#!/usr/bin/env python3
"""Fixed-count HTTP/1.1 load for instruction counts (callgrind.sh): exactly N requests.

    fixed-count.py MODE PORT N [CONNECTIONS [SEED]]   MODE: get (GET /api/x, random
                                  x-api-key) or evaluate (POST /v1/evaluate, random subject)

Subjects are random over 1,000,000 like wrk's scripts, but drawn from fixed seeds, so two
runs send the same requests. Keep-alive connections, one request in flight on each. Prints
the count of each status; exits 1 if any request was not answered 200.
"""
import random
import socket
import sys
import threading
from collections import Counter

MODE, PORT, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CONNS = int(sys.argv[4]) if len(sys.argv) > 4 else 16
SEED = int(sys.argv[5]) if len(sys.argv) > 5 else 0


def request(rnd):
    n = rnd.randint(1, 1_000_000)
    if MODE == "get":
        return f"GET /api/x HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: {n}\r\n\r\n".encode()
    body = f'{{"policy":"api","subject":"user-{n}","cost":1}}'
    return (
        "POST /v1/evaluate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n{body}"
    ).encode()


def worker(i, count, statuses, lock):
    rnd = random.Random(SEED * 1000 + i)
    s = socket.create_connection(("127.0.0.1", PORT))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = s.makefile("rb")
    seen = Counter()
    for _ in range(count):
        s.sendall(request(rnd))
        status = int(f.readline().split()[1])
        length = 0
        while (line := f.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        f.read(length)
        seen[status] += 1
    s.close()
    with lock:
        statuses.update(seen)


statuses, lock = Counter(), threading.Lock()
threads = [
    threading.Thread(target=worker, args=(i, N // CONNS + (i < N % CONNS), statuses, lock))
    for i in range(CONNS)
]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(" ".join(f"{k}:{v}" for k, v in sorted(statuses.items())))
sys.exit(0 if set(statuses) == {200} else 1)
