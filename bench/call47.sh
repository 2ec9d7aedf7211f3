#!/usr/bin/env bash
# Session 47's device call. On an H200: bench/call43.sh first (the Llama-3-8B shape in autocast, fused
# AdamW, 16 warm-up steps). On any other GPU (80 GB): HF llama-3b in bf16 autocast at 1/2 of its
# footprint (session 46's H100 Ideal: 58214318592 B), steps in backward with the fused AdamW, one
# profiled step after the measured ones (TIMELINE=1, bench/timeline.py): where the host's time goes
# in the host-bound step (session 46: hook 125 ms a step, 1316 recomputes).
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call47.sh
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash bench/call43.sh first
  exit
fi
mkdir -p "$OUT/tl"
source bench/h200_env.sh
ensure_teraio_logged "$OUT/tl/log_install.txt"
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/tl WARMUP=${WARMUP:-12} TIMELINE=1 FOOTPRINT_llama_3b_amp=${FOOTPRINT_llama_3b_amp:-58214318592} \
  RC_MODEL=llama-3b RC_DTYPES=amp RC_FRACS=2 RC_MODES="step-in-backward+adamw=fused" \
  bash bench/h200_run.sh recompute > /dev/null 2>&1
xz -T0 -f "$OUT"/tl/res_*/trace-*.json "$OUT"/tl/res_*/plan-*.json 2>/dev/null
grep -h -E '^== |mean .* s/step|FAILED|rc=|Error' "$OUT"/tl/log_*.txt | cut -c1-220
for f in "$OUT"/tl/res_*/*.json; do [[ -e $f ]] && { echo "${f#"$OUT"/}"; python3 bench/run_summary.py "$f"; }; done

python3 - "$OUT"/tl/res_*/teraio-*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    t = json.load(open(f)).get("timeline")
    if t: print(f, json.dumps(t)[:3000])
PY
true
