#!/usr/bin/env bash
# Session 45's device calls (issue 15): HF llama-3b in bf16 autocast (fp32 parameters and AdamW
# states), 4 x 1024, never measured in autocast before. On any GPU with 80 GB, one part per call:
#   a   Ideal (no offloading, the footprint: max_memory_allocated), then teraio at 1/2 of it
#   b   teraio at 1/4 of the footprint FOOTPRINT_llama_3b_amp (bytes, from part a's Ideal)
#   ab  both in one call (Ideal, 1/2, 1/4; each run's result is kept as it ends)
# teraio: steps in backward with the fused AdamW (docs/pytorch.md, "Optimizer steps in backward":
# fused on CUDA), host tier with no bandwidth given, WARMUP warm-up steps (default 12), 3 measured;
# traces and plans kept (xz). Results under $OUT/PART/res_recompute/, a summary line per run.
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call45.sh a|b|ab
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
part=${1:?usage: bench/call45.sh a|b|ab}
mkdir -p "$OUT/$part"
source bench/h200_env.sh
ensure_teraio_logged "$OUT/$part/log_install.txt"
nvidia-smi --query-gpu=name --format=csv,noheader
case $part in
a) fracs=2 ;;
ab) fracs="2 4" ;;
b) fracs=4; [[ -n ${FOOTPRINT_llama_3b_amp:-} ]] || { echo "part b needs FOOTPRINT_llama_3b_amp"; exit 2; } ;;
*) echo "unknown part $part"; exit 2 ;;
esac
OUT=$OUT/$part WARMUP=${WARMUP:-12} RC_MODEL=llama-3b RC_DTYPES=amp RC_FRACS=$fracs \
  RC_MODES="step-in-backward+adamw=fused" bash bench/h200_run.sh recompute > /dev/null 2>&1
xz -T0 -f "$OUT/$part"/res_*/trace-*.json "$OUT/$part"/res_*/plan-*.json 2>/dev/null
grep -h -E '^== |mean .* s/step|FAILED|rc=|Error' "$OUT/$part"/log_*.txt | cut -c1-220
for f in "$OUT/$part"/res_*/*.json; do [[ -e $f ]] && { echo "${f#"$OUT"/}"; python3 bench/run_summary.py "$f"; }; done
true
