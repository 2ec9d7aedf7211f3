#!/usr/bin/env bash
# Installs PyTorch 2.11 (from PyPI) and the Python test dependencies into the project's virtual
# environment (.venv/, made by scripts/venv.sh; PYTHON=... picks another interpreter) when they are
# missing, then builds and installs the teraio Python package there (`pip install .`). Idempotent:
# a second run only checks versions and reinstalls teraio. Usage: install_torch.sh [--no-teraio]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
want=2.11.0
have=$("$PY" -c 'import torch;print(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [[ "$have" != "$want" ]]; then
  echo "== installing torch==$want into $("$PY" -c 'import sys;print(sys.prefix)') (found '${have:-none}')"
  "$PY" -m pip install --quiet "torch==$want"
fi
for mod in numpy pytest transformers accelerate; do  # accelerate: the HF Trainer needs it
  "$PY" -c "import $mod" 2>/dev/null || "$PY" -m pip install --quiet "$mod"
done
if [[ "${1:-}" != "--no-teraio" ]]; then
  echo "== pip install . (teraio against torch $("$PY" -c 'import torch;print(torch.__version__)'))"
  "$PY" -m pip install --quiet --no-deps .
fi
