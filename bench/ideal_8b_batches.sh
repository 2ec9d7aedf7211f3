#!/usr/bin/env bash
# Issue 16's other Ideal: the Llama-3-8B shape in bf16 autocast (fused AdamW, no offloading) at the
# largest batch of 2048-token sequences that fits the H200, tried upwards from batch 2 (batch 1 is
# docs/benchmarks.md's 6,861 tokens/s) until one does not fit. expandable_segments keeps the
# allocator's fragmentation from deciding it. No teraio install needed (llm_bench's ideal system).
# Usage (repo root on the GPU machine): OUT=... bash bench/ideal_8b_batches.sh [BATCHES]  (default "2 4")
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1
for b in ${1:-2 4}; do
  timeout --signal=INT --kill-after=10 150 python3 bench/llm_bench.py --system ideal --model llama-8b --dtype amp \
    --batch "$b" --seq 2048 --adamw fused --steps 3 --out "$OUT/ideal-8b-amp-b$b-fused.json" 2>&1 |
    grep -E 'llm_bench|Error|error' | cut -c1-300
  python3 -c "import json, sys; sys.exit(0 if json.load(open('$OUT/ideal-8b-amp-b$b-fused.json')).get('ok') else 1)" 2>/dev/null || break
done
