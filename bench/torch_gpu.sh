#!/usr/bin/env bash
# GPU checks of the PyTorch integration, self-contained (run on the H200 machine from the repo
# root): builds and installs teraio into the given Python (default /opt/torch/.venv/bin/python3,
# PyTorch 2.11, no network: no build isolation), then runs bench/torch_gpu.py: bitwise equality on
# CUDA (MLP, CNN, HF Llama; reactive and planned), max_memory_allocated vs budget, and the overhead
# of the hooks with an empty plan. Results: $OUT/torch_gpu.json and $OUT/torch_gpu.log.
# The GPU machine lacks libsimdjson/liburing: run scripts/torch_gpu_deps.sh first and carry build-gpudeps.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
[[ -x "$PY" ]] || PY=python3
OUT=${OUT:-out}
mkdir -p "$OUT"
if [[ -d build-gpudeps ]]; then  # headers and libraries the GPU machine lacks (scripts/torch_gpu_deps.sh)
  export CPATH="$PWD/build-gpudeps/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$PWD/build-gpudeps/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$PWD/build-gpudeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
  echo "== python: $PY ($($PY -c 'import torch;print(torch.__version__, torch.cuda.is_available())'))"
  echo "== build"
  start=$(date +%s)
  TERAIO_CUDA=${TERAIO_CUDA:-1} MAX_JOBS=${MAX_JOBS:-16} $PY -m pip install --no-build-isolation --no-deps -q . 
  echo "build seconds: $(( $(date +%s) - start ))"
  echo "== checks"
  $PY bench/torch_gpu.py "$OUT/torch_gpu.json"
} 2>&1 | tee "$OUT/torch_gpu.log"
exit "${PIPESTATUS[0]}"
