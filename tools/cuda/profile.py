#!/usr/bin/env python3
"""profile.py: summarise the ncu logs of tools/cuda/profile.sh.

Usage: profile.py LOG [FIRST_KERNEL_REGEX]

Reads the CSV rows of an ncu --csv --page raw log (kernel name and
gpu__time_duration.sum), cuts them into training steps at each launch of the
first kernel of a step (a regex; default: the embedding's forward kernel),
and prints, for the last whole step, the kernel count, the summed GPU time and
the time per kernel name, largest first.
"""
import csv, re, sys, collections

def rows(path):
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    r = csv.reader(lines)
    head = next(r)
    next(r)  # units
    ki, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    for row in r:
        if len(row) > ti:
            yield row[ki], float(row[ti].replace(",", "")) / 1e3  # us

def short(name):
    name = re.sub(r"\(.*", "", name.replace("void ", ""))
    return name[:110]

def main():
    path = sys.argv[1]
    first = re.compile(sys.argv[2] if len(sys.argv) > 2 else r"^encoder_forward")
    ks = list(rows(path))
    starts = [i for i, (n, _) in enumerate(ks) if first.search(n)]
    if len(starts) < 2:
        print(f"{path}: {len(ks)} kernels, {len(starts)} step starts: no whole step"); return
    a, b = starts[-2], starts[-1]
    step = ks[a:b]
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for n, t in step:
        tot[short(n)] += t; cnt[short(n)] += 1
    s = sum(tot.values())
    print(f"{path}: one step = {len(step)} kernels, {s/1e3:.2f} ms of GPU time")
    for n, t in sorted(tot.items(), key=lambda x: -x[1]):
        print(f"{t/1e3:8.3f} ms {100*t/s:5.1f}% {cnt[n]:5d}x  {n}")

main()
