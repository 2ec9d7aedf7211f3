#!/usr/bin/env python3
"""Marks, in a trace a Session recorded before Note [Nested producers] (src/offload/recorder.cpp),
autocast's bf16 copies of weights as a Session records them now: each tensor made inside
aten::linear whose size is half that of a persistent tensor the linear lists (its fp32 weight)
becomes recomputable by that cast alone (recompute_inputs: the weight; recompute_us: its share of
the linear's time by the bytes it reads and writes, at most those bytes at the profile's memory
rate). Only for predictions from old profiles
(docs/benchmarks.md, "Recomputable autocast copies, predicted"); new traces carry this already.

Usage: bench/mark_autocast_copies.py TRACE_IN TRACE_OUT
"""
import json
import sys


def nested_output(name: str) -> bool:
    # The Session names a tensor an operator nested in operator k made "op<k>.out<n>", n >= 0x4000.
    head, _, index = name.rpartition(".out")
    return head.startswith("op") and index.isdigit() and int(index) >= 0x4000


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    trace = json.load(open(sys.argv[1]))
    kernels, tensors = trace["kernels"], trace["tensors"]
    # the profile's memory rate, as the recorder takes it: the 90th percentile of bytes per us over
    # operators touching 1 MiB or more
    rates = sorted(b / k["time_us"] for k in kernels
                   for b in [sum(tensors[x]["bytes"] for x in k["tensors"])]
                   if b >= 1 << 20 and k["time_us"] > 0)
    rate = rates[(len(rates) - 1) * 9 // 10] if len(rates) >= 16 else 0
    marked = 0
    for t in tensors:
        k = t.get("producer")
        if k is None or t.get("recomputable") or not nested_output(t.get("name", "")):
            continue
        if kernels[k]["name"] != "aten::linear":
            continue
        weights = [x for x in kernels[k]["tensors"]
                   if tensors[x]["persistent"] and tensors[x]["bytes"] == 2 * t["bytes"]]
        if not weights:
            continue
        listed = sum(tensors[x]["bytes"] for x in kernels[k]["tensors"])
        mine = t["bytes"] + tensors[weights[0]]["bytes"]
        us = kernels[k]["time_us"] * min(1.0, mine / listed)
        t["recomputable"] = True
        t["recompute_inputs"] = [weights[0]]
        t["recompute_us"] = min(us, mine / rate) if rate else us
        marked += 1
    json.dump(trace, open(sys.argv[2], "w"))
    print(f"{sys.argv[2]}: {marked} weight copies marked recomputable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
