#!/usr/bin/env bash
# Session 44's device calls (issues 15, 16), one part per call (each under 10 minutes):
#   defer   llama-1b in bf16 autocast at 1/4 and 1/2 of the H200's Ideal footprint, steps in
#           backward, without and with deferred updates (watch(..., defer_updates=F), F in DEFER,
#           default "0.25 0.5"; docs/pytorch.md "Deferred updates"), host tier with no bandwidth
#           given, 16 warm-up steps, 3 measured; one run each (bench/call37.sh, REPEATS=1).
#   first   on an H200 the Llama-3-8B shape as a user runs it (bench/call43.sh first); on any
#           other GPU `defer`.
#   fsdp2amp bench/call43.sh fsdp2amp (FSDP2 + CPUOffloadPolicy + AC in autocast, then teraio at
#           its GPU memory; checks the probe fix and the link correction: run_summary's "links").
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call44.sh PART
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
part=${1:?usage: bench/call44.sh defer|first|fsdp2amp}
[[ $part == first && $gpu != *H200* ]] && part=defer
case $part in
defer)
  modes=step-in-backward
  for f in ${DEFER:-0.25 0.5}; do modes+=" step-in-backward+defer-updates=$f"; done
  OUT=$OUT/defer WARMUP=${WARMUP:-16} REPEATS=1 MODES=$modes bash bench/call37.sh "${FRACS:-4 2}"
  ;;
*)
  bash bench/call43.sh "$part"
  ;;
esac
echo "part $part done"
true
