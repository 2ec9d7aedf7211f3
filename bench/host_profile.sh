#!/usr/bin/env bash
# Where the host's time goes in a planned autocast step (docs/benchmarks.md, "Host time in planned
# autocast steps"): llama-1b in bf16 autocast, 4 x 1024, loop AdamW, steps in backward, host tier
# measured by its probe, run twice: with a budget nothing needs to move at (the callbacks' base
# cost per operator, stats()["hook_us"]) and at 1/2 of the Ideal footprint with deep recompute
# chains and writebacks, the latter under `perf record` when the machine has perf (a flat profile
# per thread: $OUT/perf_threads.txt, $OUT/perf_symbols.txt).
# Usage (repo root on the GPU machine, build-gpudeps/ carried): OUT=... bash bench/host_profile.sh
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/h200-out}
R=$OUT/res_host
mkdir -p "$R"
exec > >(tee -a "$OUT/log_host.txt") 2>&1
source bench/h200_env.sh
ensure_teraio || { echo "teraio install failed"; exit 1; }
common=(--system teraio --model llama-1b --dtype amp --tiers host --host-gbps 0 --adamw loop --step-in-backward --steps 5)
echo "== $(date -u +%T) no moves"
timeout 150 $PY bench/llm_bench.py "${common[@]}" --budget 100GiB --out "$R/teraio-nomoves.json" 2>&1 | grep -E 'mean|FAILED'
PERF=()
if command -v perf > /dev/null; then
  PERF=(perf record -F 1999 -o "$OUT/perf.data" --)
else
  echo "no perf on this machine"
fi
echo "== $(date -u +%T) 1/2 deep recompute + writebacks ${PERF:+under perf}"
timeout 200 "${PERF[@]}" $PY bench/llm_bench.py "${common[@]}" --budget 12758463744B --deep-recompute --writebacks \
  --out "$R/teraio-half-deep-wb.json" 2>&1 | grep -E 'mean|FAILED'
if [[ -s $OUT/perf.data ]]; then
  perf report -i "$OUT/perf.data" --no-children --sort tid --stdio 2>/dev/null | grep '%' | head -30 > "$OUT/perf_threads.txt"
  perf report -i "$OUT/perf.data" --no-children --sort tid,dso,sym --stdio 2>/dev/null | grep '%' | head -300 \
    | cut -c1-200 > "$OUT/perf_symbols.txt"
  rm -f "$OUT/perf.data"
  head -12 "$OUT/perf_threads.txt"
fi
$PY - "$R" <<'PYEOF'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    r = json.load(open(f))
    if not r.get("ok"):
        print(f, r.get("error")); continue
    d = r["system_info"]["measured_delta"]; n = len(r["step_s"]); ops = r["system_info"]["stats"]["operators"]
    print(f.split("/")[-1], "step %.3f s" % r["step_s_median"], "hook %.1f ms/step" % (d["hook_us"] / n / 1e3),
          "stall %.1f" % (d["stall_us"] / n / 1e3), "recompute %.1f" % (d["recompute_us"] / n / 1e3),
          "moves %d" % (d["plan_moves"] / n), "hook/op %.1f us" % (d["hook_us"] / n / ops))
PYEOF
