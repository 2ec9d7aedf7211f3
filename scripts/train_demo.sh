#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing (Debian packages, PyTorch 2.11 from
# PyPI), builds teraio with the PyTorch integration, and trains the tiny Llama-architecture model on
# CPU under a 16 MiB budget (its training state peaks at 137 MiB) with a file tier in a temporary
# directory. Prints a progress line per step; writes the run report to out/run.json.
# Extra arguments go to `teraio train` (see docs/train.md), e.g. --steps 50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/install_torch.sh --no-teraio
JOBS=${JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_WITH_TORCH=ON >/dev/null
cmake --build build -j"$JOBS" --target teraio teraio-train
mkdir -p out
TIER_DIR=$(mktemp -d)
trap 'rm -rf "$TIER_DIR"' EXIT
build/bin/teraio train --budget 16MiB --tier "file:$TIER_DIR:1GiB" --threads 1 --report out/run.json "$@"
