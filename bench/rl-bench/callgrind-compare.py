#!/usr/bin/env python3
"""Two callgrind dumps of N requests each, side by side: callgrind-compare.py N A B [TOP].

Prints, per request, the self instructions of each crate in A, in B and A - B (A is the gRPC
dump, B the HTTP one in grpc-vs-http-callgrind.sh), then the TOP (default 25)
functions whose inclusive instructions per request differ most (A - B), and each dump's top
inclusive functions. A function's crate is the first path segment of its name, taken inside
`<... as ...>` and `drop_in_place<...>` so that generic code counts for the type's crate;
the allocator's entry points (malloc, free, realloc, calloc and their internals) are
`[alloc]`, the C library's memory functions `[libc]`.

Inclusive cost is the function's self cost plus the inclusive cost of its calls, as
callgrind_annotate --inclusive=yes counts it (a recursive call is counted again).
"""
import re
import sys
from collections import Counter, defaultdict

ALLOC = re.compile(r"^(malloc|free|calloc|realloc|_int_malloc|_int_free|malloc_consolidate|"
                   r"unlink_chunk|tcache_\w+|_int_realloc|__libc_\w+|cfree|sysmalloc|"
                   r"__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_\w+)\b")
LIBC = re.compile(r"^(__mem|mem|__str|str|__GI_|__nss|pthread_|__pthread|epoll|syscall|__lll|"
                  r"__futex|__clock|clock_|__vdso|_dl_|__tls|writev|readv|recv|send|__libc)")


def parse(path):
    names = {}
    self_cost, incl_calls = Counter(), Counter()
    total = 0

    def resolve(spec):
        m = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if not m:
            return spec
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), spec)

    fn = None
    after_calls = False
    with open(path) as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                if after_calls:
                    incl_calls[fn] += cost
                else:
                    self_cost[fn] += cost
                after_calls = False
                continue
            after_calls = False
            if line.startswith("fn="):
                fn = resolve(line[3:].rstrip("\n"))
            elif line.startswith("cfn="):
                resolve(line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                after_calls = True
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    incl = Counter({f: self_cost[f] + incl_calls[f] for f in set(self_cost) | set(incl_calls)})
    return total, self_cost, incl


def crate(name):
    if ALLOC.match(name):
        return "[alloc]"
    if LIBC.match(name):
        return "[libc]"
    s = name
    for _ in range(4):
        m = re.match(r"^core::ptr::drop_in_place<(.*)>$", s)
        if m:
            s = m.group(1)
            continue
        if s.startswith(("<", "[")):
            s = s[1:]
            for p in ("&mut ", "&", "dyn ", "mut ", "["):
                if s.startswith(p):
                    s = s[len(p):]
            # `<T as Trait>`: a bare type parameter or a primitive names no crate; the trait does.
            ty, _, rest = s.partition(" as ")
            if rest and "::" not in ty:
                s = rest
            continue
        break
    if "::" not in s:
        return "[other]" if not s.startswith("0x") else "[no symbol]"
    head = s.split("::", 1)[0]
    return head.split("<", 1)[0] or "[other]"


def main():
    n = int(sys.argv[1])
    a_path, b_path = sys.argv[2], sys.argv[3]
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    ta, sa, ia = parse(a_path)
    tb, sb, ib = parse(b_path)
    print(f"instructions per request: A {ta / n:,.0f}  B {tb / n:,.0f}  A - B {(ta - tb) / n:+,.0f}"
          f"  A/B {ta / tb:.2f}x")
    by = defaultdict(lambda: [0, 0])
    for f, v in sa.items():
        by[crate(f)][0] += v
    for f, v in sb.items():
        by[crate(f)][1] += v
    print("\nself instructions per request by crate (A, B, A - B), by |A - B|:")
    for k, (x, y) in sorted(by.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1])):
        if max(x, y) / n < 20:
            continue
        print(f"  {k:<28} {x / n:>9,.0f} {y / n:>9,.0f} {(x - y) / n:>+9,.0f}")
    print(f"\nfunctions by inclusive instructions per request A - B (top {top} each way):")
    diff = {f: ia.get(f, 0) - ib.get(f, 0) for f in set(ia) | set(ib)}
    ranked = sorted(diff.items(), key=lambda kv: -kv[1])
    for f, d in ranked[:top] + [("...", None)] + ranked[-top // 2:]:
        if d is None:
            print("  ...")
            continue
        print(f"  {d / n:>+9,.0f}  A {ia.get(f, 0) / n:>8,.0f}  B {ib.get(f, 0) / n:>8,.0f}  {f[:150]}")
    for label, incl in (("A", ia), ("B", ib)):
        print(f"\n{label}: top {top} functions by inclusive instructions per request:")
        for f, v in incl.most_common(top):
            print(f"  {v / n:>9,.0f}  {f[:150]}")


main()
