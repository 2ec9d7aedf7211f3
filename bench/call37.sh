#!/usr/bin/env bash
# Session 37's device call when the H200 is not lent (issue 15's "3+ repeats with spread", on any
# GPU with 80 GB): llama-1b in bf16 autocast at 1/2 and 1/4 of the H200's Ideal footprint
# (25,516,927,488 B), steps in backward, host tier with no bandwidth given, REPEATS runs of each
# (default 3), each run profiling, planning (and planning again for the host that runs it) and
# measuring anew, so that the spread between runs shows; 6 warm-up steps (WARMUP), 3 measured.
# Results under $OUT/rI/res_recompute/, one summary line per run at the end.
# Usage (repo root on the GPU machine, build-gpudeps/ carried): bash bench/call37.sh [FRACS]
#   (FRACS default "2 4"; REPEATS=N; MODES: h200_run.sh's RC_MODES, default "step-in-backward", the
#   Session's defaults: since 2026-12-06 with deep recompute chains and writebacks; the A/B against
#   them: MODES="step-in-backward step-in-backward+no-deep-recompute+no-writebacks")
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
source bench/h200_env.sh
ensure_teraio_logged "$OUT/log_install.txt"
tail -1 "$OUT/log_install.txt"
nvidia-smi --query-gpu=name --format=csv,noheader
for r in $(seq 1 "${REPEATS:-3}"); do
  OUT=$OUT/r$r WARMUP=${WARMUP:-6} FOOTPRINT_llama_1b_amp=25516927488 RC_DTYPES=amp RC_FRACS="${1:-2 4}" \
    RC_MODES="${MODES:-step-in-backward}" bash bench/h200_run.sh recompute > /dev/null 2>&1
  xz -T0 -f "$OUT"/r"$r"/res_*/trace-*.json "$OUT"/r"$r"/res_*/plan-*.json 2>/dev/null
done
grep -h -E '^== |mean .* s/step|FAILED|rc=|Error' "$OUT"/r*/log_*.txt | cut -c1-220
for f in "$OUT"/r*/res_*/teraio-*.json; do [[ -e $f ]] && { echo "${f#"$OUT"/}"; python3 bench/run_summary.py "$f"; }; done
true
