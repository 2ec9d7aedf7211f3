#!/usr/bin/env bash
# Session 32's last device call (docs/benchmarks.md, "Recompute chains, writebacks and the peers
# with checkpointing on the H200"): (1) llama-1b autocast at 1/2 with steps in backward, deep chains
# and writebacks, after the engine stopped sweeping every tensor before each operator's reads (Note
# [Sweeps where they matter]): its host time per step (stats()["hook_us"]) against call 2's 73 ms;
# (2) teraio at the GPU memory FSDP2 + CPUOffloadPolicy with activation checkpointing took for
# llama-1b fp32 (4,410,952,192 B, below the parameters' 4.6 GiB), steps in backward, which failed
# before the watched parameters were tracked from the first step's start (Note [Adopted tensors]).
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
R=$OUT/res_call32
mkdir -p "$R"
source bench/h200_env.sh
ensure_teraio || { echo "teraio install failed"; exit 1; }
run() {  # NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  echo "== $(date -u +%T) $name"
  timeout --signal=INT --kill-after=5 "$limit" $PY bench/llm_bench.py --warmup 3 --steps 3 --system teraio \
    --model llama-1b --tiers host --host-gbps 0 --adamw loop --step-in-backward --out "$R/$name.json" \
    --plan-out "$R/plan-$name.json" "$@" 2>&1 | grep -E 'mean|FAILED|Error' | cut -c1-300
}
run half-amp-deep-wb 75 --dtype amp --budget 12758463744B --deep-recompute --writebacks
run at-fsdp2-ac-fp32 90 --budget 4410952192B
for f in "$R"/plan-*.json "$R"/trace-*.json; do [[ -f $f ]] && xz -T4 "$f"; done
$PY - "$R" <<'PYEOF'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    r = json.load(open(f))
    if not r.get("ok"):
        print(f.split("/")[-1], r.get("error")); continue
    d = r["system_info"]["measured_delta"]; n = len(r["step_s"])
    print(f.split("/")[-1], r["step_s"], "hook %.1f ms/step" % (d["hook_us"] / n / 1e3),
          "stall %.1f" % (d["stall_us"] / n / 1e3), "recompute %.1f" % (d["recompute_us"] / n / 1e3),
          "moves %d" % (d["plan_moves"] / n), "maxalloc", r["memory"]["cuda_max_allocated_bytes"])
PYEOF
