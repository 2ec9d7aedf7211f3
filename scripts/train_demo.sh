#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing (Debian packages, PyTorch 2.11 from
# PyPI into the project's .venv, scripts/venv.sh), builds teraio with the PyTorch integration
# against that torch in build-torch/ (as scripts/test.sh does, so neither rebuilds after the
# other), and trains the tiny Llama-architecture model on CPU under a 16 MiB budget (its training
# state peaks at 137 MiB) with a file tier in a temporary directory. Prints a progress line per
# step; writes the run report to out/run.json.
# Extra arguments go to `teraio train` (see docs/train.md), e.g. --steps 50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/install_torch.sh --no-teraio
source scripts/venv.sh
JOBS=${JOBS:-$(nproc)}
cmake --preset torch -DPython3_EXECUTABLE="$PY" >/dev/null
cmake --build build-torch -j"$JOBS" --target teraio teraio-train
mkdir -p out
TIER_DIR=$(mktemp -d)
trap 'rm -rf "$TIER_DIR"' EXIT
build-torch/bin/teraio train --budget 16MiB --tier "file:$TIER_DIR:1GiB" --threads 1 --report out/run.json "$@"
