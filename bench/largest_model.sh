#!/usr/bin/env bash
# The largest model of one width that teraio can train on a machine, predicted before any run
# (issue 16, "The largest model on this box"): `teraio synth` traces the model with N decoder
# layers, `teraio plan --search` plans it for the GPU budget and tiers, and a binary search over N
# finds the largest N the planner can fit (it stops with "tier capacity exhausted" beyond). Prints
# one line per N tried and the answer, with the simulated step, tokens/s and model TFLOPS
# (6 x parameters x tokens / step). No GPU needed; about a second per N for 8B-wide models.
# BUDGET is what the Session is given (`teraio.Session(budget=...)`): the plan is made for what a
# CUDA Session plans for, that budget less its 1/32 margin (`teraio plan --session-budget`).
#
# Usage: bench/largest_model.sh [options]   (defaults: the H200 machine of docs/benchmarks.md)
#   MODEL=llama3.1-8b DTYPE=amp BATCH=4 SEQ=2048 BUDGET=130GiB ATTENTION=auto \
#   TIERS="host:96GiB:54.5:54.5:49 disk=file:/tmp:50GiB:1.65:3:1.04" MIN=1 MAX=256 TERAIO=build/bin/teraio
# SYNTH_ARGS: more `teraio synth` options, e.g. SYNTH_ARGS=--step-in-backward (the optimizer steps in
# backward: each gradient is freed at its update, docs/synth.md).
# TIERS are `teraio plan --tier` specs (docs/formats.md, "Tier specs"), space-separated: by default
# what the Session's own probe measured on the GPU machine (2026-12-04, docs/benchmarks.md): the
# host link 54.5 GB/s each way and 49 both ways, the disk 1.65 GB/s read, 3.0 write, 1.04 both ways.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-llama3.1-8b}
DTYPE=${DTYPE:-amp}
BATCH=${BATCH:-4}
SEQ=${SEQ:-2048}
BUDGET=${BUDGET:-130GiB}
ATTENTION=${ATTENTION:-auto}
TIERS=${TIERS:-"host:96GiB:54.5:54.5:49 disk=file:/tmp:50GiB:1.65:3:1.04"}
MIN=${MIN:-1}
MAX=${MAX:-256}
T=${TERAIO:-build/bin/teraio}
[[ -x $T ]] || { echo "largest_model.sh: $T not built (cmake --preset ci && cmake --build build)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tier_args=()
for t in $TIERS; do tier_args+=(--tier "$t"); done

# try N: 0 and a summary line when the plan fits, 1 when the planner refuses it
try() {
  local n=$1 trace=$work/trace.json plan=$work/plan.json out
  "$T" synth --model "$MODEL" --layers "$n" --batch "$BATCH" --seq "$SEQ" --micro-batches 1 \
    --grad-set-to-none --dtype "$DTYPE" --attention "$ATTENTION" ${SYNTH_ARGS:-} -o "$trace" >/dev/null
  if ! out=$("$T" plan "$trace" --budget "$BUDGET" --session-budget "${tier_args[@]}" --search -o "$plan" 2>&1); then
    echo "layers $n: does not fit ($(printf '%s\n' "$out" | grep -m1 'error' | sed 's/^teraio: error: //'))" >&2
    return 1
  fi
  "$T" simulate "$trace" "$plan" --iterations 4 --json >"$work/sim.json"
  python3 - "$n" "$trace" "$work/sim.json" "$BATCH" "$SEQ" <<'EOF'
import json, sys
n, trace, sim, batch, seq = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
t = json.load(open(trace))
params = sum(x["bytes"] for x in t["tensors"] if x["kind"] == "parameter")
elt = 2 if t["meta"]["dtype"] in ("bf16", "fp16") else 4
params //= elt
s = json.load(open(sim))
step = s["iteration_us"] / 1e6
tokens = batch * seq
print(f"layers {n}: {params / 1e9:.2f} B parameters, step {step:.3f} s (ideal {s['ideal_us'] / 1e6:.3f} s), "
      f"{tokens / step:,.0f} tokens/s, {6 * params * tokens / step / 1e12:.0f} model TFLOPS")
EOF
}

lo=$((MIN - 1)) hi=$((MAX + 1)) best=""
while ((hi - lo > 1)); do  # invariant: lo fits (or is MIN - 1), hi does not (or is MAX + 1)
  mid=$(((lo + hi) / 2))
  if line=$(try "$mid"); then
    echo "$line"
    lo=$mid best=$line
  else
    hi=$mid
  fi
done
if [[ -z $best ]]; then
  echo "largest: none ($MODEL width, $DTYPE, batch $BATCH x $SEQ, budget $BUDGET, tiers $TIERS)"
  exit 1
fi
echo "largest: $best ($MODEL width, $DTYPE, batch $BATCH x $SEQ, budget $BUDGET, tiers $TIERS)"
