#!/usr/bin/env python3
"""A WebSocket subscriber of a gate stream for the soak run (standard library only).

    ws-subscriber.py HOST PORT PATH fast|slow SECONDS OUT.json

fast: reads every frame as it arrives. slow: a small receive buffer, and after each read a
pause of SLOW_PAUSE seconds (default 90) without reading, so the server's send times out and
it drops the connection (its 1008 close frame cannot pass the full socket either, so this
client mostly sees "eof"); the subscriber then reconnects. Either way a
connection that ends is reopened after 1 s, until SECONDS have passed. OUT.json is rewritten
every few seconds with the counters: connects, connect errors, frames, bytes, close codes
seen ("1008", "1011", ...; "eof" when the connection ended without a close frame).
"""
import base64
import json
import os
import socket
import struct
import sys
import time

HOST, PORT, PATH, MODE, SECONDS, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), sys.argv[6]
SLOW_PAUSE = float(os.environ.get("SLOW_PAUSE", "90"))
END = time.monotonic() + SECONDS
stats = {"mode": MODE, "connects": 0, "connect_errors": 0, "frames": 0, "bytes": 0, "closes": {}}
last_write = 0.0


def save(force=False):
    global last_write
    now = time.monotonic()
    if force or now - last_write >= 5:
        last_write = now
        tmp = OUT + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, OUT)


def closed(why):
    stats["closes"][why] = stats["closes"].get(why, 0) + 1


def connect():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if MODE == "slow":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect((HOST, PORT))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {PATH} HTTP/1.1\r\nHost: {HOST}:{PORT}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
    return s, rest


def frames(s, buf):
    """Yields (opcode, payload); reads in slow mode only between pauses."""
    next_pause = time.monotonic() + 1
    while True:
        while True:  # parse what is buffered
            if len(buf) < 2:
                break
            b0, b1 = buf[0], buf[1]
            n, off = b1 & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, off = struct.unpack(">H", buf[2:4])[0], 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, off = struct.unpack(">Q", buf[2:10])[0], 10
            if len(buf) < off + n:
                break
            yield b0 & 0x0F, buf[off:off + n]
            buf = buf[off + n:]
        if time.monotonic() >= END:
            return
        if MODE == "slow" and time.monotonic() >= next_pause:
            time.sleep(min(SLOW_PAUSE, max(0.0, END - time.monotonic())))
            next_pause = time.monotonic() + 0.5
        try:
            chunk = s.recv(65536 if MODE == "fast" else 4096)
        except socket.timeout:
            continue
        if not chunk:
            closed("eof")
            return
        stats["bytes"] += len(chunk)
        buf += chunk


def session():
    s, rest = connect()
    stats["connects"] += 1
    try:
        for op, payload in frames(s, rest):
            if op == 0x8:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                closed(str(code))
                try:
                    s.sendall(bytes([0x88, 0x80]) + os.urandom(4))  # masked empty close
                except OSError:
                    pass
                return
            if op == 0x9:  # ping: answer with a masked pong
                mask = os.urandom(4)
                s.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask
                          + bytes(c ^ mask[i % 4] for i, c in enumerate(payload)))
            elif op in (0x1, 0x2, 0x0):
                stats["frames"] += 1
            save()
    except OSError as e:  # reset or timeout mid-stream
        closed("reset")
        stats["last_error"] = str(e)[:200]
    finally:
        s.close()


while time.monotonic() < END:
    try:
        session()
    except (OSError, ConnectionError) as e:
        stats["connect_errors"] += 1
        stats["last_error"] = str(e)[:200]
    save(force=True)
    time.sleep(1)
save(force=True)
