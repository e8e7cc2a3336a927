#!/usr/bin/env python3
"""gaps.py: where the GPU idles in a training step, from an Nsight Systems
trace (tools/cuda/gaps.sh: `nsys stats -r cuda_gpu_trace -f csv`).

Usage: gaps.py TRACE.csv [FIRST_KERNEL_REGEX]

Cuts the kernel and memcpy rows into steps at each launch of the first
kernel of a step (default: the embedding's forward), and prints for the
middle steps: the step's wall time (first start to next step's first
start), the GPU busy time (the union of the rows' intervals), the idle
time, and the largest idle gaps with the names of the rows on each side.
"""
import csv, re, sys


def main():
    path = sys.argv[1]
    first = re.compile(sys.argv[2] if len(sys.argv) > 2 else r"^encoder_forward")
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if "," in l]
    r = csv.reader(lines)
    head = next(r)
    idx = {h: i for i, h in enumerate(head)}
    si, di, ni = idx.get("Start (ns)"), idx.get("Duration (ns)"), idx.get("Name")
    for row in r:
        try:
            rows.append((int(float(row[si])), int(float(row[di])), row[ni]))
        except (ValueError, IndexError, TypeError):
            pass
    rows.sort()
    starts = [i for i, (_, _, n) in enumerate(rows) if first.search(n)]
    if len(starts) < 4:
        print(f"gaps.py: {len(starts)} steps found")
        return
    for a, b in zip(starts[len(starts) // 2 - 1:], starts[len(starts) // 2:len(starts) // 2 + 2]):
        step = rows[a:b]
        t0, t1 = step[0][0], rows[b][0]
        busy, end, gaps = 0, t0, []
        prev = None
        for s, d, n in step:
            e = s + d
            if s > end:
                gaps.append((s - end, prev, n))
                busy += d
            elif e > end:
                busy += e - end
            if e > end:
                end, prev = e, n
        if t1 > end:  # up to the next step's first row
            gaps.append((t1 - end, prev, rows[b][2]))
        wall = t1 - t0
        print(f"step: wall {wall/1e6:.3f} ms, busy {busy/1e6:.3f} ms, idle {(wall-busy)/1e6:.3f} ms, {len(step)} rows, {len(gaps)} gaps")
        gaps.sort(reverse=True)
        for g, p, n in gaps[:12]:
            print(f"   {g/1e3:8.1f} us  after {str(p)[:60]:60s} before {n[:60]}")
        small = sum(g for g, _, _ in gaps if g < 20000)
        print(f"   gaps under 20 us: {small/1e6:.3f} ms in all")


if __name__ == "__main__":
    main()
