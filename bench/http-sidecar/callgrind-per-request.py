#!/usr/bin/env python3
"""Per-request figures from one callgrind dump: callgrind-per-request.py N FILE [LABEL].

Prints instructions (Ir) per request, the same without SHA-256 block compression, and calls
per request of the allocator entry points (malloc, calloc, realloc; free separately), summed
over every call site in FILE.

Why "without SHA-256": valgrind does not implement the SHA-NI instructions, so under callgrind
the sha2 crate falls back to its portable code, about 3,500 instructions per 64-byte block.
Natively (this machine's CPU has SHA-NI) a block is a few dozen instructions, so the figure
without compression is the one that compares with native cost; the blocks are counted apart.
"""
import re
import sys
from collections import Counter

n, path = int(sys.argv[1]), sys.argv[2]
label = sys.argv[3] if len(sys.argv) > 3 else path
names, calls, total = {}, Counter(), 0
events, totals = [], []
sha_self, sha_calls = 0, 0
ALLOC = {"malloc", "calloc", "realloc", "free"}
SHA = "sha2::sha256::compress256"


def resolve(spec):
    # "(12) name" defines id 12, "(12)" refers to it (name compression).
    m = re.match(r"\((\d+)\)(?: (.*))?", spec)
    if not m:
        return spec
    if m.group(2) is not None:
        names[m.group(1)] = m.group(2)
    return names.get(m.group(1), spec)


fn = cfn = None
after_calls = False
with open(path) as f:
    for line in f:
        c = line[:1]
        if c.isdigit() or c in "+-*":
            # A cost line: self cost of `fn`, unless it follows `calls=` (then inclusive).
            if not after_calls and fn == SHA:
                sha_self += int(line.split()[1])
            after_calls = False
            continue
        after_calls = False
        if line.startswith("fn="):
            fn, cfn = resolve(line[3:].rstrip("\n")), None
        elif line.startswith("cfn="):
            cfn = resolve(line[4:].rstrip("\n"))
        elif line.startswith("calls="):
            after_calls = True
            count = int(line[6:].split()[0])
            if cfn in ALLOC:
                calls[cfn] += count
            elif cfn == SHA:
                sha_calls += count
        elif line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            totals = [int(v) for v in line.split()[1:]]
            total = totals[0]
allocs = calls["malloc"] + calls["calloc"] + calls["realloc"]
print(
    f"{label}: {total / n:,.0f} instructions/request, {(total - sha_self) / n:,.0f} without "
    f"SHA-256 compression ({sha_calls / n:.2f} blocks/request, {sha_self / n:,.0f} instructions); "
    f"{allocs / n:.2f} allocations/request ({calls['malloc'] / n:.2f} malloc, "
    f"{calls['calloc'] / n:.2f} calloc, {calls['realloc'] / n:.2f} realloc), "
    f"{calls['free'] / n:.2f} free/request"
)
# With --cache-sim=yes: simulated first-level and last-level data-cache misses (read + write).
cache = dict(zip(events, totals))
if "D1mr" in cache:
    d1 = cache["D1mr"] + cache["D1mw"]
    ll = cache["DLmr"] + cache["DLmw"]
    print(f"{label}: {d1 / n:.1f} D1 misses/request, {ll / n:.2f} LL misses/request (simulated)")
