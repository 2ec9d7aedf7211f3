#!/usr/bin/env python3
"""Where a training step's GPU time goes: one step under torch.profiler, read back as a timeline.

Used by llm_bench.py --timeline (a step after the measured ones), and on its own to read a saved
trace again:

    python3 bench/timeline.py TRACE.json[.xz|.gz]      # prints the summary as JSON

The summary answers what the simulator cannot see (docs/benchmarks.md, "Where a planned step
waits"): the compute stream's idle time, split into time it was *starved* (the CPU had not yet
launched the next kernel: the CPU was behind, or waiting) and time it *waited* with the next kernel
already launched (a dependency on the GPU: a copy it must follow), the copies per direction (busy
time, bytes, the rate they ran at by size), and which operators launched the kernels that came late.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import lzma
import sys

GAP_MIN_US = 2.0      # gaps shorter than this are the GPU's own kernel-to-kernel time
NEAR_COPY_US = 30.0   # a dependency wait ending this soon after a copy ended is that copy's


def _open(path):
    if path.endswith(".xz"):
        return lzma.open(path, "rt")
    if path.endswith(".gz"):
        return gzip.open(path, "rt")
    return open(path)


def load(path):
    with _open(path) as f:
        return json.load(f)


def _union(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _direction(name):
    n = name.lower()
    if "htod" in n:
        return "read"   # host to device: a prefetch
    if "dtoh" in n:
        return "write"  # device to host: an offload
    return "other"


def analyze(trace, top=12):
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    gpu, runtime, cpu_ops = [], {}, collections.defaultdict(list)
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        args = ev.get("args", {}) or {}
        ts, dur = float(ev["ts"]), float(ev.get("dur", 0))
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append({"cat": cat, "name": ev.get("name", ""), "s": ts, "e": ts + dur,
                        "stream": args.get("stream"), "corr": args.get("correlation"),
                        "bytes": args.get("bytes", 0) or 0})
        elif cat in ("cuda_runtime", "cuda_driver"):
            if args.get("correlation") is not None:
                runtime[args["correlation"]] = (ts, ts + dur, ev.get("tid"))
        elif cat == "cpu_op":
            cpu_ops[ev.get("tid")].append((ts, ts + dur, ev.get("name", "")))
    if not gpu:
        return {"error": "no GPU activity in the trace"}

    # Top-level operators per thread (the ones not inside another), to name what launched a kernel.
    top_ops = {}
    for tid, ops in cpu_ops.items():
        ops.sort(key=lambda o: (o[0], -o[1]))
        level, end = [], -1.0
        for o in ops:
            if o[0] >= end:
                level.append(o)
                end = o[1]
        top_ops[tid] = (level, [o[0] for o in level])

    def launcher(corr):
        r = runtime.get(corr)
        if r is None:
            return None, "?"
        level, starts = top_ops.get(r[2], ([], []))
        i = bisect.bisect_right(starts, r[0]) - 1
        if i >= 0 and level[i][1] >= r[0]:
            return r, level[i][2]
        return r, "(outside operators)"

    busy_by_stream = collections.Counter()
    for g in gpu:
        if g["cat"] == "kernel":
            busy_by_stream[g["stream"]] += g["e"] - g["s"]
    compute = busy_by_stream.most_common(1)[0][0]
    comp = sorted((g for g in gpu if g["stream"] == compute), key=lambda g: g["s"])
    copies = sorted((g for g in gpu if g["cat"] == "gpu_memcpy" and g["stream"] != compute),
                    key=lambda g: g["s"])
    ends = {"read": [], "write": []}
    for c in copies:
        d = _direction(c["name"])
        if d in ends:
            ends[d].append(c["e"])
    for d in ends:
        ends[d].sort()

    def copy_ended_near(t):
        best = None
        for d, es in ends.items():
            i = bisect.bisect_right(es, t) - 1
            if i >= 0 and t - es[i] <= NEAR_COPY_US and (best is None or es[i] > best[1]):
                best = (d, es[i])
        return best[0] if best else None

    span = comp[-1]["e"] - comp[0]["s"]
    busy = _union([(g["s"], g["e"]) for g in comp])
    starved = waited = 0.0
    waited_by = collections.Counter()
    starved_by_op = collections.Counter()
    waited_by_op = collections.Counter()
    gaps = collections.Counter()
    end = comp[0]["e"]
    for g in comp[1:]:
        gap = g["s"] - end
        if gap >= GAP_MIN_US:
            r, op = launcher(g["corr"])
            late = 0.0 if r is None else min(gap, max(0.0, r[1] - end))
            starved += late
            waited += gap - late
            if late > 0:
                starved_by_op[op] += late
            if gap - late > 0:  # after a late launch, unless a copy ended just before: its latency
                near = copy_ended_near(g["s"])
                waited_by[near or ("launch" if late > 0 else "other")] += gap - late
                waited_by_op[op] += gap - late
            bucket = ("<10us" if gap < 10 else "<100us" if gap < 100 else "<1ms" if gap < 1000
                      else ">=1ms")
            gaps[bucket] += 1
        end = max(end, g["e"])

    out_copies = {}
    for d in ("read", "write", "other"):
        cs = [c for c in copies if _direction(c["name"]) == d]
        if not cs:
            continue
        by_size = collections.defaultdict(lambda: [0, 0, 0.0])
        for c in cs:
            b = c["bytes"]
            k = ("<1MiB" if b < 2**20 else "<16MiB" if b < 2**24 else "<64MiB" if b < 2**26
                 else ">=64MiB")
            by_size[k][0] += 1
            by_size[k][1] += b
            by_size[k][2] += c["e"] - c["s"]
        streams = sorted({c["stream"] for c in cs})
        between = []  # idle time between consecutive copies of one stream
        for st in streams:
            sc = [c for c in cs if c["stream"] == st]
            between += [b["s"] - a["e"] for a, b in zip(sc, sc[1:]) if b["s"] > a["e"]]
        nbytes = sum(c["bytes"] for c in cs)
        cbusy = _union([(c["s"], c["e"]) for c in cs])
        out_copies[d] = {
            "count": len(cs), "bytes": nbytes, "busy_us": cbusy, "streams": len(streams),
            "gbps_while_busy": nbytes / cbusy / 1e3 if cbusy else 0.0,
            "idle_between_copies_us": sum(between),
            "idle_between_copies_under_100us": sum(x for x in between if x < 100),
            "by_size": {k: {"count": v[0], "bytes": v[1], "us": v[2],
                            "gbps": v[1] / v[2] / 1e3 if v[2] else 0.0}
                        for k, v in sorted(by_size.items())},
        }
    rw = [(c["s"], c["e"]) for c in copies if _direction(c["name"]) in ("read", "write")]
    either = _union(rw)
    both = (out_copies.get("read", {}).get("busy_us", 0) + out_copies.get("write", {}).get("busy_us", 0)
            - either)
    return {
        "compute_stream": compute,
        "span_us": span,
        "compute_busy_us": busy,
        "compute_idle_us": span - busy,
        "idle_starved_us": starved,
        "idle_waiting_us": waited,
        "idle_waiting_after": dict(waited_by),
        "gap_counts": dict(gaps),
        "starved_by_launching_op": dict(starved_by_op.most_common(top)),
        "waiting_by_launching_op": dict(waited_by_op.most_common(top)),
        "kernels": sum(1 for g in comp if g["cat"] == "kernel"),
        "copies": out_copies,
        "link_busy_either_us": either,
        "link_busy_both_us": both,
        "notes": ("starved: the next kernel on the compute stream was launched after the previous "
                  "one ended (the CPU was behind); waiting: it was launched in time and the GPU "
                  "waited for a dependency (idle_waiting_after: a read or write copy ended within "
                  f"{NEAR_COPY_US:g} us before it started; launch: the time from a late launch to "
                  "the kernel's start)"),
    }


def profile_step(step, trace_path=None):
    """Runs step() under torch.profiler (CPU and CUDA) and returns (its result, the summary);
    writes the Chrome trace to trace_path (.xz compressed when the name ends so)."""
    import os
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        result = step()
        torch.cuda.synchronize()
    fd, raw = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(raw)
        with open(raw) as f:
            trace = json.load(f)
        if trace_path:
            opener = lzma.open if trace_path.endswith(".xz") else open
            with opener(trace_path, "wt") as f:
                json.dump(trace, f)
    finally:
        os.unlink(raw)
    return result, analyze(trace)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a Chrome trace written by torch.profiler (.json, .json.xz, .json.gz)")
    args = p.parse_args(argv)
    json.dump(analyze(load(args.trace)), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
