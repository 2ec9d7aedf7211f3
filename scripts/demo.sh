#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds teraio, then analyzes, plans and
# simulates the bundled Llama3-8B training iteration (data/llama3-8b.trace.json.xz, made by
# `teraio synth --model llama3-8b`) for an 80 GiB GPU with one 16 GB/s SSD array and 64 GiB of host
# memory, and writes an HTML report. Outputs go to out/. Usage: scripts/demo.sh [BUDGET]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
BUDGET=${1:-80GiB}
JOBS=${JOBS:-$(nproc)}
cmake --preset default >/dev/null
cmake --build build -j"$JOBS" --target teraio
T=build/bin/teraio
mkdir -p out
xz -dc data/llama3-8b.trace.json.xz > out/llama3-8b.trace.json

echo; echo "== teraio analyze out/llama3-8b.trace.json"
$T analyze out/llama3-8b.trace.json

echo; echo "== teraio plan --budget $BUDGET --tier ssd:4TiB:16:16 --tier host:64GiB:50:50"
$T plan out/llama3-8b.trace.json --budget "$BUDGET" --tier ssd:4TiB:16:16 --tier host:64GiB:50:50 \
  -o out/llama3-8b.plan.json

echo; echo "== teraio simulate"
$T simulate out/llama3-8b.trace.json out/llama3-8b.plan.json

if $T --help | grep -q '^  report'; then
  echo; echo "== teraio report -> out/llama3-8b.report.html"
  $T report out/llama3-8b.trace.json --plan out/llama3-8b.plan.json -o out/llama3-8b.report.html
fi
