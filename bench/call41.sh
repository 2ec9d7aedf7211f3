#!/usr/bin/env bash
# Session 41's first device call (any GPU, ~4 min with the install): the GPU storage tests (build-gpu/
# carried: storage_gpu_test built here, with HostLanes.ReadOrderedAfterARunningWriteWaitsOnTheGpu)
# and the CUDA bitwise checks of HF Llama in bf16 autocast with the reads back ordered after their
# running writes in the tier (Note [Reads after their write]) and session 40's deferred read extents.
# Prints, per case: equal, reads_after_writes, stream-ordered offloads and the CPU's write waits.
# Usage (repo root on the GPU machine, build-gpudeps/ and build-gpu/ carried): bash bench/call41.sh
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
source bench/h200_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [[ -x build-gpu/bin/storage_gpu_test ]]; then
  LD_LIBRARY_PATH="$PWD/build-gpu/lib:$LD_LIBRARY_PATH" build-gpu/bin/storage_gpu_test --gtest_brief=1 \
    > "$OUT/storage_gpu_test.txt" 2>&1
  echo "storage_gpu_test exit $?"; grep -E 'FAILED|PASSED|Failure' "$OUT/storage_gpu_test.txt" | head -12
fi
ensure_teraio_logged "$OUT/log_install.txt"
tail -1 "$OUT/log_install.txt"
TORCH_GPU_BITWISE_ONLY=1 TORCH_GPU_CASES=${CASES:-llama-amp,llama-amp-inbwd} \
  $PY bench/torch_gpu.py "$OUT/torch_gpu.json" > "$OUT/torch_gpu.log" 2>&1
rc=$?; echo "torch_gpu exit $rc"; [[ $rc == 0 ]] || tail -15 "$OUT/torch_gpu.log"
$PY - "$OUT/torch_gpu.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
for k, v in r["bitwise"].items():
    st = v.get("stats", {})
    print(k, "equal", v.get("equal"), v.get("error", ""), "within budget", v.get("planned_peak_within_budget"),
          "| reads after writes", st.get("reads_after_writes"), "stream-ordered", st.get("stream_ordered_offloads"),
          "| waits ms: write read back %.1f, write %.1f, read %.1f (at a use %.1f)" % tuple(
              st.get(x, 0) / 1e3 for x in ("stall_write_readback_us", "stall_write_us", "stall_read_us", "stall_read_use_us")),
          "| taken over", st.get("writebacks_taken_over"), "recomputes", st.get("recomputes"), "lost", st.get("lost_tensors"))
PYEOF
