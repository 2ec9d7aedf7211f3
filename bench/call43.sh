#!/usr/bin/env bash
# Session 43's device calls (issues 15, 16), one part per call (each under 10 minutes):
#   first   on an H200 the Llama-3-8B shape as a user runs it (bench/h200_call36.sh 8b-teraio, fused
#           AdamW unless ADAMW_8B=loop (docs/pytorch.md: fused with steps in backward), 16
#           warm-up steps so that the Session plans again once the host's numbers settle); on any
#           other GPU the llama-1b autocast A/B's default runs at 1/2 and 1/4 (bench/call37.sh, 13
#           warm-up steps): plan_variant should end in "planned again ..., kept: ..." where a plan
#           made for the settled host ran faster (Note [Plans for the host that runs them]).
#   ab      the A/B alone (as `first` on a GPU other than an H200).
#   fsdp2   issue 15's tightest peer: FSDP2 + CPUOffloadPolicy with activation checkpointing of
#           every decoder layer on llama-1b fp32, then teraio (steps in backward and after) at the
#           GPU memory FSDP2 took (bench/h200_run.sh peers1b fsdp2-offload-ac), same machine.
#   fsdp2amp the same in bf16 autocast (teraio with steps in backward, 16 warm-up steps).
#   fp32    the 8B in fp32 at 1 x 4096 on host + disk, then the largest model (H200 only).
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call43.sh PART
# Results under $OUT/PART/, and $OUT/PART.log.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
part=${1:?usage: bench/call43.sh first|ab|fsdp2|fp32}
[[ $part == first && $gpu != *H200* ]] && part=ab
[[ $part == first ]] && part=8b
case $part in
8b)
  OUT=$OUT/8b WARMUP=${WARMUP:-16} bash bench/h200_call36.sh 8b-teraio
  xz -T0 -f "$OUT"/8b/res_real/trace-*.json "$OUT"/8b/res_real/plan-*.json \
    "$OUT"/8b/res_real/timeline-*.json 2>/dev/null
  ;;
ab)
  OUT=$OUT/ab WARMUP=${WARMUP:-16} REPEATS=1 MODES=step-in-backward bash bench/call37.sh "${FRACS:-2 4}"
  ;;
fsdp2)
  OUT=$OUT/fsdp2 bash bench/h200_run.sh peers1b fsdp2-offload-ac > /dev/null 2>&1
  grep -h -E '^== |mean .* s/step|FAILED|rc=|Error|error' "$OUT"/fsdp2/log_*.txt | cut -c1-240
  for f in "$OUT"/fsdp2/res_peers1b/*.json; do
    [[ $f == */trace-* || $f == */plan-* ]] || python3 bench/run_summary.py "$f"
  done
  xz -T0 -f "$OUT"/fsdp2/res_peers1b/trace-*.json "$OUT"/fsdp2/res_peers1b/plan-*.json 2>/dev/null
  ;;
fsdp2amp)
  o=$OUT/fsdp2amp/res; mkdir -p "$o"; source bench/h200_env.sh; ensure_teraio
  python3 bench/llm_bench.py --steps 3 --out "$o/fsdp2-offload-ac-llama-1b-amp.json" --system fsdp2-offload \
    --model llama-1b --dtype amp --grad-ckpt 2>&1 | tail -3
  mem=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["memory"]["cuda_max_allocated_bytes"] if r.get("ok") else 0)' "$o/fsdp2-offload-ac-llama-1b-amp.json")
  ((mem > 0)) && python3 bench/llm_bench.py --steps 3 --warmup 16 --out "$o/teraio-at-fsdp2-offload-ac-llama-1b-amp.json" \
    --system teraio --model llama-1b --dtype amp --tiers host --budget "${mem}B" --host-gbps 0 --step-in-backward 2>&1 | tail -3
  for f in "$o"/*.json; do python3 bench/run_summary.py "$f"; done
  ;;
fp32)
  OUT=$OUT/fp32 LARGEST=1 bash bench/h200_call36.sh fp32
  ;;
esac
echo "part $part done"
true
