#!/usr/bin/env bash
# Where the Session's callbacks spend their host time on a GPU machine without perf: llama-1b in
# bf16 autocast, 4 x 1024, loop AdamW, steps in backward, at BUDGET (default 1/2 of the Ideal
# footprint) with deep recompute chains and writebacks, under py-spy with native frames
# (docs/benchmarks.md, "Where the callbacks wait"). py-spy is a single static binary: it is taken
# from PATH, else from build-gpudeps/py-spy (here: `pip download py-spy --no-deps` and unzip the
# wheel's py_spy-*.data/scripts/py-spy there; the GPU machine has no registry access).
# Usage (repo root on the GPU machine, build-gpudeps/ carried): OUT=... bash bench/host_spy.sh
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
SPY=$(command -v py-spy || echo build-gpudeps/py-spy)
[[ -x $SPY ]] || { echo "no py-spy (PATH or build-gpudeps/py-spy)"; exit 1; }
source bench/h200_env.sh
ensure_teraio_logged "$OUT/log_install.txt"
tail -1 "$OUT/log_install.txt"
# At 100 samples a second py-spy fell 50 s behind on an H100 machine (native stacks of every thread)
# and wrote nothing before the limit: sample slower, and stop it with SIGINT, which still writes
# what it has.
timeout --signal=INT --kill-after=20 "${LIMIT:-280}" "$SPY" record --native --idle -r "${RATE:-10}" -f raw -o "$OUT/spy.txt" -- \
  $PY bench/llm_bench.py --system teraio --model llama-1b --dtype amp --tiers host --host-gbps 0 \
  --adamw loop --step-in-backward --steps 5 --budget "${BUDGET:-12758463744B}" --deep-recompute --writebacks \
  --out "$OUT/teraio-spy.json" 2>&1 | grep -E 'mean|FAILED|py-spy>'
[[ -s $OUT/spy.txt ]] || { echo "py-spy wrote no profile"; exit 1; }
python3 bench/spy_summary.py "$OUT/spy.txt" | tee "$OUT/spy_summary.txt" | head -60
xz -T0 -f "$OUT/spy.txt"
