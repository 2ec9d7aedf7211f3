#!/usr/bin/env bash
# Session 47's A/B of deep chains across the peak (docs/planner.md, "Recompute across the peak"), on
# one GPU with 80 GB: HF llama-3b in bf16 autocast, 4 x 1024, steps in backward with the fused
# AdamW, host tier with no bandwidth given, at 1/2 then 1/4 of its footprint (session 46's H100
# Ideal: 58214318592 B), each with the search as it is ("peak") and with
# TERAIO_RECOMPUTE_ACROSS_PEAK=0 ("nopeak"), in the order 1/2 peak, 1/2 nopeak, 1/4 peak, 1/4
# nopeak. WARMUP warm-up steps (default 12), 3 measured. Results in $OUT/MODE-1ofF.tar (res_recompute/).
# MODES (default "peak nopeak") picks the modes ("norecompute": Session(recompute=False); "bgoff": the
# search as it is with plans made again searched inside the step, TERAIO_BACKGROUND_SEARCH=0); no run
# starts after STOP_AFTER_S seconds (420). A mode may carry a suffix after a dot to repeat it
# ("peak.2": peak again, in its own folder).
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call47b.sh [FRACS]
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
source bench/h200_env.sh
ensure_teraio_logged "$OUT/log_install.txt"
nvidia-smi --query-gpu=name --format=csv,noheader
for frac in ${1:-2 4}; do
  for mode in ${MODES:-peak nopeak}; do
    # A run takes 2-3 minutes: none is started past STOP_AFTER_S (the device call's limit is 600 s).
    ((SECONDS > ${STOP_AFTER_S:-420})) && { echo "skipped $mode 1/$frac: ${SECONDS} s gone"; continue; }
    o=$OUT/$mode-1of$frac
    base=${mode%%.*}
    off=1; [[ $base == nopeak ]] && off=0
    flags=step-in-backward+adamw=fused; [[ $base == norecompute ]] && flags+=+no-recompute
    bg=1; [[ $base == bgoff ]] && bg=0
    TERAIO_BACKGROUND_SEARCH=$bg TERAIO_RECOMPUTE_ACROSS_PEAK=$off OUT=$o WARMUP=${WARMUP:-12} FOOTPRINT_llama_3b_amp=${FOOTPRINT_llama_3b_amp:-58214318592} \
      RC_MODEL=llama-3b RC_DTYPES=amp RC_FRACS=$frac RC_MODES="$flags" \
      bash bench/h200_run.sh recompute > /dev/null 2>&1
    xz -T0 -f "$o"/res_*/trace-*.json "$o"/res_*/plan-*.json 2>/dev/null
    rm -f "$o"/h200_*.tgz
    for f in "$o"/res_*/teraio-*.json; do [[ -e $f ]] && { echo "$mode 1/$frac"; python3 bench/run_summary.py "$f"; }; done
    # One file back per run (the device call returns a limited number of files).
    (cd "$OUT" && tar cf "$mode-1of$frac.tar" "$mode-1of$frac" && rm -rf "$mode-1of$frac")
  done
done
true
