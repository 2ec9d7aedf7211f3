#!/usr/bin/env bash
# Session 32's last device call (docs/benchmarks.md, "Issue 15's peers with activation
# checkpointing"): teraio at the GPU memory FSDP2 + CPUOffloadPolicy with activation checkpointing
# took for llama-1b fp32 (4,410,952,192 B, below the parameters' 4.6 GiB), steps in backward, host
# tier measured by its probe. It failed before the watched parameters were tracked from the first
# step's start (Note [Adopted tensors]).
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
R=$OUT/res_call32
mkdir -p "$R"
source bench/h200_env.sh
ensure_teraio || { echo "teraio install failed"; exit 1; }
timeout --signal=INT --kill-after=10 "${LIMIT:-150}" $PY bench/llm_bench.py --steps 3 --system teraio --model llama-1b \
  --tiers host --budget 4410952192B --host-gbps 0 --adamw loop --step-in-backward \
  --out "$R/teraio-step-in-backward-at-fsdp2-offload-ac-llama-1b.json" \
  --trace-out "$R/trace-step-in-backward-at-fsdp2-offload-ac-llama-1b.json" \
  --plan-out "$R/plan-step-in-backward-at-fsdp2-offload-ac-llama-1b.json" 2>&1 | grep -v '^\s*$' | tail -15
for f in "$R"/trace-*.json "$R"/plan-*.json; do [[ -f $f ]] && xz -T4 "$f"; done
