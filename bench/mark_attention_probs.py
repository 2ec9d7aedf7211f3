"""Marks fp32 math attention's saved probabilities recomputable in a trace recorded before the
Session did, or charges them as it does now (docs/benchmarks.md, "Inputs kept for a recompute,
predicted"): each activation of BYTES (default 512 MiB) that aten::scaled_dot_product_attention
makes is remade by the nested operator from the operator's own inputs, at the operator's whole
time (Note [Nested producers] in src/offload/recorder.cpp). Prints how many it marked.
Usage: python3 bench/mark_attention_probs.py IN.json OUT.json [BYTES]"""
import json
import sys

trace = json.load(open(sys.argv[1]))
size = int(sys.argv[3]) if len(sys.argv) > 3 else 512 << 20
tensors, kernels = trace["tensors"], trace["kernels"]
marked = 0
for k, kernel in enumerate(kernels):
    if kernel["name"] != "aten::scaled_dot_product_attention":
        continue
    inputs = [t for t in kernel["tensors"] if tensors[t].get("producer") != k]
    for t in kernel["tensors"]:
        info = tensors[t]
        if info.get("producer") == k and info["bytes"] == size and info["kind"] == "activation":
            info.update(recomputable=True, recompute_inputs=inputs, recompute_us=kernel["time_us"])
            marked += 1
json.dump(trace, open(sys.argv[2], "w"))
print(marked)
