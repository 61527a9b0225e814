#!/usr/bin/env python3
"""The summary of a soak run (bench/soak/run.sh): summary.py OUT_DIR WARMUP_SECONDS.

Warm-up (t < WARMUP) against the rest: max RSS, max descriptors, max threads, and the
least-squares slope of RSS over the rest in KiB per minute; then the HTTP statuses each wrk
process saw, the WebSocket subscribers' counters and the Redis restart log.
"""
import glob
import json
import os
import re
import sys

out, warmup = sys.argv[1], float(sys.argv[2])
rows = []
with open(os.path.join(out, "samples.csv")) as f:
    next(f)
    for line in f:
        t, rss, fds, thr, up, rz = line.strip().split(",")
        rows.append((int(t), int(rss), int(fds), int(thr), up == "1", rz))
warm = [r for r in rows if r[0] < warmup]
rest = [r for r in rows if r[0] >= warmup]


def slope(rs):
    if len(rs) < 2:
        return float("nan")
    xs = [r[0] / 60 for r in rs]
    ys = [r[1] for r in rs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


print(f"== samples: {len(rows)} (warm-up t < {warmup:.0f} s: {len(warm)}, rest: {len(rest)})")
print("phase     samples  min_rss_kib  max_rss_kib  max_fds  max_threads  rss_slope_kib_per_min")
for name, rs in (("warm-up", warm), ("rest", rest), ("all", rows)):
    if rs:
        print(f"{name:9} {len(rs):7}  {min(r[1] for r in rs):11}  {max(r[1] for r in rs):11}  "
              f"{max(r[2] for r in rs):7}  {max(r[3] for r in rs):11}  {slope(rs):21.1f}")
if rest:
    last = rest[-len(rest) // 3:] if len(rest) >= 3 else rest
    print(f"rest, last third: max_rss_kib {max(r[1] for r in last)}, max_fds {max(r[2] for r in last)}, "
          f"rss at end {rows[-1][1]} KiB, fds at end {rows[-1][2]}")
down = [r for r in rows if not r[4]]
print(f"samples with redis down: {len(down)}; readyz codes: "
      + ", ".join(f"{c} x{sum(1 for r in rows if r[5] == c)}" for c in sorted({r[5] for r in rows})))

print("== HTTP statuses (wrk)")
for path in sorted(glob.glob(os.path.join(out, "wrk-*.txt"))):
    kind = os.path.basename(path)[4:-4]
    text = open(path).read()
    codes = sorted((int(c), int(n)) for c, n in re.findall(r"^status (\d+) (\d+)$", text, re.M))
    total = sum(n for _, n in codes)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    errs = re.search(r"^errors (.*)$", text, re.M)
    lat = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", text)
    print(f"{kind:9} {total} responses, {rps.group(1) if rps else '?'} req/s"
          f"{', latency avg ' + lat.group(1) + ' max ' + lat.group(3) if lat else ''}: "
          + ", ".join(f"{c} x{n}" for c, n in codes) + (f"; {errs.group(1)}" if errs else ""))

print("== WebSocket subscribers")
for path in sorted(glob.glob(os.path.join(out, "ws-*.json"))):
    s = json.load(open(path))
    closes = ", ".join(f"{k} x{v}" for k, v in sorted(s["closes"].items())) or "none"
    print(f"{os.path.basename(path)[:-5]:10} connects {s['connects']}, connect errors {s['connect_errors']}, "
          f"frames {s['frames']}, closes: {closes}" + (f"; last error: {s['last_error']}" if s.get("last_error") else ""))

print("== events")
print(open(os.path.join(out, "events.log")).read().rstrip())
