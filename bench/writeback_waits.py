#!/usr/bin/env python3
"""Where a plan's writebacks would make the CPU wait: reads a plan, its trace and the timeline of
its replay (`teraio simulate TRACE PLAN --timeline TL.json`, docs/formats.md "Timeline") and counts,
in the replayed iteration, the writeback copies still running when their tensor's offload is issued
(the end of the offload's start kernel) and when an operator that uses the tensor starts before
then. Before session 39 the engine waited for such a copy on the CPU in both cases; it now takes the
copy over as the offload's write, and on a GPU a use does not wait (src/runtime/engine.cpp, Note [An
offload takes over its writeback's copy]). "busy" is the union of the intervals from each such
point to its copy's end: how long a CPU that waited there would have stood, at most.

    python3 bench/writeback_waits.py TRACE.json PLAN.json TIMELINE.json [RESULT.json]

RESULT.json (bench/llm_bench.py) adds the measured CPU waits for writes per measured step
(stats()["stall_write_us"] over the measured steps).
"""
import collections
import json
import sys


def union_ms(intervals):
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total / 1e3


def main():
    trace, plan, tl = (json.load(open(p)) for p in sys.argv[1:4])
    ks = tl["kernels"]
    moves = plan["moves"]
    copies = {x["move"]: x for x in tl["transfers"] if x["op"] == "writeback"}
    uses = collections.defaultdict(list)
    for k, kernel in enumerate(trace["kernels"]):
        for t in kernel["tensors"]:
            uses[t].append(k)
    by_tensor = collections.defaultdict(list)
    for i, m in enumerate(moves):
        by_tensor[m["tensor"]].append((i, m))
    at_offload, at_use = [], []
    n_wb = n_off = n_use = 0
    for i, m in enumerate(moves):
        if m["op"] != "writeback" or i not in copies:
            continue
        n_wb += 1
        end = copies[i]["end_us"]
        offs = [o for _, o in by_tensor[m["tensor"]] if o["op"] == "offload" and o["start"] >= m["start"]]
        if not offs:
            continue
        off = min(offs, key=lambda o: o["start"])
        issue = ks[off["start"]]["start_us"] + ks[off["start"]]["time_us"]
        if end > issue:
            n_off += 1
            at_offload.append((issue, end))
        for u in uses[m["tensor"]]:
            if m["start"] < u <= off["start"] and end > ks[u]["start_us"]:
                n_use += 1
                at_use.append((ks[u]["start_us"], end))
    print(f"{n_wb} writebacks in the replayed iteration; copy still running at its offload: {n_off} "
          f"(busy {union_ms(at_offload):.1f} ms), at a use before it: {n_use} "
          f"(busy {union_ms(at_use):.1f} ms); both: busy {union_ms(at_offload + at_use):.1f} ms")
    if len(sys.argv) > 4:
        r = json.load(open(sys.argv[4]))
        d, n = r["system_info"]["measured_delta"], len(r["step_s"])
        print(f"measured: CPU waits for writes {d['stall_write_us'] / n / 1e3:.1f} ms per step, step "
              f"{r['step_s_median']:.3f} s, predicted {r['system_info']['stats']['predicted_iteration_us'] / 1e6:.3f} s")


if __name__ == "__main__":
    main()
