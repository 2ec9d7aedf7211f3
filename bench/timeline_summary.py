#!/usr/bin/env python3
"""Where a simulated step goes: reads a `teraio simulate --timeline` file (docs/formats.md,
"Timeline") and prints, for the forward pass (up to the loss) and the rest, the compute time and
how long each link direction is busy, the bytes each direction moves by tensor kind, and the step
in BINS equal slices with the busy share of compute, writes and reads.

Usage: python3 bench/timeline_summary.py TIMELINE.json [BINS]   (default 20 bins)
"""
import collections
import json
import sys


def busy(transfers, direction, a, b):
    s = 0.0
    for x in transfers:
        if x["direction"] == direction:
            lo, hi = max(a, x["begin_us"]), min(b, x["end_us"])
            s += max(0.0, hi - lo)
    return s


def main():
    d = json.load(open(sys.argv[1]))
    bins = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    ks, xs, end = d["kernels"], d["transfers"], d["last_iteration_us"]
    loss = [i for i, k in enumerate(ks) if "log_softmax" in k["name"] or "cross_entropy" in k["name"]
            or "nll_loss_forward" in k["name"]]
    split = ks[loss[0] + 1]["start_us"] if loss and loss[0] + 1 < len(ks) else end
    print(f"iteration {end / 1e3:.1f} ms (last simulated), forward until {split / 1e3:.1f} ms")
    phases = [("forward", 0.0, split), ("rest", split, end)]
    for name, a, b in phases:
        comp = sum(k["time_us"] for k in ks if a <= k["start_us"] < b)
        print(f"{name:8s} {(b - a) / 1e3:8.1f} ms: compute {comp / 1e3:7.1f} ms, write busy "
              f"{busy(xs, 'write', a, b) / 1e3:7.1f} ms, read busy {busy(xs, 'read', a, b) / 1e3:7.1f} ms")
    moved = collections.defaultdict(float)
    for x in xs:
        phase = "forward" if x["begin_us"] < split else "rest"
        moved[(x["direction"], phase, x["kind"])] += x["bytes"]
    for (direction, phase, kind), b in sorted(moved.items()):
        print(f"  {direction:5s} {phase:8s} {kind:16s} {b / 1e9:7.2f} GB")
    print(f"{'slice (ms)':>17s} compute  write   read")
    for i in range(bins):
        a, b = end * i / bins, end * (i + 1) / bins
        comp = sum(max(0.0, min(b, k["start_us"] + k["time_us"]) - max(a, k["start_us"])) for k in ks)
        print(f"{a / 1e3:7.1f}-{b / 1e3:7.1f}   {100 * comp / (b - a):4.0f}%  "
              f"{100 * busy(xs, 'write', a, b) / (b - a):4.0f}%  {100 * busy(xs, 'read', a, b) / (b - a):4.0f}%")


if __name__ == "__main__":
    main()
