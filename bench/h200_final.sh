#!/usr/bin/env bash
# One short device call that checks a merged tree on the H200 (2026-12-03, session 5): install
# (issue 14: the extension built by CMake, timed), HF Mixtral 20 steps bitwise in fp32 and autocast
# with PyTorch's default optimizer and the Session's defaults (recompute on: issue 15 bitwise on
# CUDA), the HF Trainer, the bitwise checks of bench/torch_gpu.py (no overhead blocks), and
# llama-1b fp32 at 1/2 with the measured host link, both ways included (issue 16: the duplex probe,
# the prediction).
# Usage: OUT=... bash bench/h200_final.sh   (results: $OUT/final.tgz, summary on stdout)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/h200-out}
R=$OUT/final
mkdir -p "$R"
source bench/h200_env.sh
finish() { tar czf "$OUT/final.tgz" -C "$R" .; }
trap finish EXIT
cmake --version | head -1
ensure_teraio > "$R/install.txt" 2>&1 || { tail -30 "$R/install.txt"; exit 1; }
tail -1 "$R/install.txt"
timeout 150 $PY bench/hf_gpu.py --out "$R/hf_gpu-default.json" --optim default > "$R/hf.txt" 2>&1
echo "hf_gpu rc=$?"; grep -E "^(mixtral|trainer)" "$R/hf.txt" | cut -c1-200
$PY - "$R/hf_gpu-default.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in ("mixtral-fp32", "mixtral-bf16", "trainer"):
    x = r.get(c, {}); st = x.get("stats", {})
    print(c, "equal", x.get("equal"), {k: st.get(k) for k in ("recomputes", "urgent_recomputes", "lost_tensors", "skipped_moves")},
          x.get("teraio_step_s"), x.get("ideal_step_s"), x.get("error", "")[:300])
PY
finish
TORCH_GPU_BITWISE_ONLY=1 timeout 100 $PY bench/torch_gpu.py "$R/torch_gpu.json" > "$R/torch_gpu.txt" 2>&1
echo "torch_gpu rc=$?"; cut -c1-110 "$R/torch_gpu.txt"
finish
# 18770466048 B: half of llama-1b's Ideal peak as measured on 2026-12-03 (h200_run.sh 1b), the
# budget of the earlier runs this one is compared with
timeout 130 $PY bench/llm_bench.py --system teraio --model llama-1b --dtype fp32 --tiers host \
  --budget 18770466048B --host-gbps 0 --steps 3 --out "$R/teraio-half-llama-1b.json" > "$R/llm.txt" 2>&1
echo "llm_bench rc=$?"; grep -E "step [0-9]|mean" "$R/llm.txt"
$PY - "$R/teraio-half-llama-1b.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); st = r["system_info"]["stats"]
print({k: st.get(k) for k in ("kernel_timing", "profiled_kernel_us", "profiled_event_us", "predicted_iteration_us",
                               "plan_variant", "recomputes")})
print([{k: t.get(k) for k in ("read_gbps", "write_gbps", "duplex_gbps", "duplex_source")} for t in st["tiers"]])
PY
