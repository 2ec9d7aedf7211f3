#!/usr/bin/env bash
# End-to-end checks of teraio-train (docs/train.md) on the tiny model, CPU, one thread (the CI
# machine has 2 shared cores): 5 steps under a Session with a file tier and a budget well under the
# footprint. Usage: train_check.sh BIN_DIR WORK_DIR. Exit 77 (skip) without teraio-train.
# The JSON checks run python3 from PATH (standard library only); scripts/test.sh puts the project's
# .venv first there.
set -euo pipefail
bin=$1
work=$2
train=$bin/teraio-train
if [[ ! -x $train ]]; then
  echo "SKIP: $train not built (configure with -DTERAIO_WITH_TORCH=ON)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work/tier"
fail() { echo "FAIL: $*"; exit 1; }
# The JSON checks share tests/train/runs.py.
export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"

common=(--model tiny --steps 5 --batch 4 --seq 64 --threads 1 --deterministic)

# 1. Offloaded run: 6 MiB budget (parameters, gradients and AdamW states alone are 13 MiB), a
#    file tier, trace and plan kept.
"$train" "${common[@]}" --budget 6MiB --tier "file:$work/tier:256MiB" --report "$work/run.json" \
  --save-trace "$work/trace.json" --save-plan "$work/plan.json" | tee "$work/offload.log"
grep -Eq '^step 5/5  loss [0-9.]+  tokens/s [0-9]+  resident [0-9.]+/0\.006 GiB  io [0-9.]+ GB/s  stall [0-9.]+%  \[planned\]$' \
  "$work/offload.log" || fail "progress line format"

# 2. The same run without offloading.
"$train" "${common[@]}" --report "$work/plain.json" > "$work/plain.log"

python3 - "$work" <<'PY'
import sys
from runs import load, same_falling_losses
work = sys.argv[1]
run, plain = load(work, "run"), load(work, "plain")
for key in ["format", "version", "iteration_us", "stall_us", "peak_bytes", "tiers", "config",
            "throughput", "memory", "traffic", "stalls", "drift_events", "predicted", "session",
            "loss", "steps"]:
    assert key in run, f"run report lacks {key}"
assert run["format"] == "teraio.run" and run["version"] == 1
assert run["iteration_us"] > 0 and 0 <= run["stall_us"] <= run["iteration_us"]
assert len(run["loss"]["history"]) == 5, run["loss"]["history"]
# Offloading moves bytes, never changes them: the losses are bitwise those of the plain run.
same_falling_losses(run, plain)
assert run["offloading"] == "on" and plain["offloading"] == "off"
assert run["session"]["mode"] == "planned", run["session"]
# Every SessionStats field (for_each_stats_field), among them those the report once lacked.
for key in ["step_peak_resident_bytes", "pinned_bytes", "untracked_bytes", "plan_budget_bytes",
            "plan_variant", "predicted_iteration_us", "aligned_moves", "stream_ordered_offloads",
            "tiers"]:
    assert key in run["session"], f"session lacks {key}"
assert "probe_memory" in run["session"]["tiers"][0], run["session"]["tiers"]
assert run["memory"]["budget_bytes"] == 6 * 2**20
assert run["memory"]["peak_resident_bytes"] < 3 * run["memory"]["budget_bytes"] // 2
assert run["traffic"]["bytes_offloaded"] > 0 and run["traffic"]["bytes_prefetched"] > 0
assert run["tiers"][0]["name"] == "file" and run["tiers"][0]["offload_bytes"] > 0
assert run["predicted"]["iteration_us"] > 0 and run["predicted"]["plan_moves"] > 0
assert [s["mode"] for s in run["steps"]] == ["profiling"] * 2 + ["planned"] * 3
assert run["config"]["model"] == "tiny" and run["config"]["steps"] == 5
print("report keys, falling loss, bitwise-equal losses: ok")
PY

# 3. `teraio report --run` reads the run report next to the trace and plan the run wrote.
if [[ -x $bin/teraio ]]; then
  "$bin/teraio" report "$work/trace.json" --plan "$work/plan.json" --run "$work/run.json" \
    -o "$work/report.html" --sweep-steps 0
  grep -q 'measured (run)' "$work/report.html" || fail "report page lacks the measured run"
  # `teraio train` passes every argument to teraio-train.
  "$bin/teraio" train --help | grep -q -- '--budget' || fail "teraio train --help"
fi

# 4. Faults (docs/train.md, "Faults"). Failed writes lose nothing: the run says so on stderr, goes
#    on, and its losses are still bitwise those of the plain run. A read that keeps failing ends the
#    run with teraio's error (exit 1, no crash) and leaves no tier files behind.
mkdir -p "$work/tier2" "$work/tier3"
"$train" "${common[@]}" --budget 6MiB --tier "file:$work/tier2:256MiB" --inject-fault 3:EIO:write:2 \
  --report "$work/fault.json" > "$work/fault.log" 2> "$work/fault.err"
grep -q "teraio-train: step 3: teraio: offload of tensor .* failed (it stays on the device): .*Input/output error.*no data was lost.*; continuing" \
  "$work/fault.err" || { cat "$work/fault.err"; fail "write-fault message"; }
if "$train" "${common[@]}" --budget 6MiB --tier "file:$work/tier3:256MiB" \
    --inject-fault 3:EIO:read:100000 > "$work/rfault.log" 2>&1; then
  fail "a lasting read fault did not end the run"
fi
grep -q "teraio-train: error: teraio: tensor .* could not be read back from tier 'file' after 3 attempts.*stripe.dat.*Input/output error" \
  "$work/rfault.log" || { cat "$work/rfault.log"; fail "read-fault message"; }
left=$(find "$work/tier2" "$work/tier3" -mindepth 1)
[[ -z $left ]] || fail "tier files left behind: $left"
python3 - "$work" <<'PY'
import sys
from runs import load
work = sys.argv[1]
run, plain = load(work, "fault"), load(work, "plain")
assert run["loss"]["history"] == plain["loss"]["history"], "write faults changed the numbers"
assert run["session"]["failed_transfers"] == 2 and run["session"]["lost_tensors"] == 0, run["session"]
print("faults: write faults bitwise and reported, lasting read fault is an error: ok")
PY

# 5. Mixed precision (--dtype bf16: fp32 parameters and states, bf16 autocast): the loss falls and
#    offloading leaves it bitwise the same. The tiers as one list, the host tier's bandwidths given
#    (docs/formats.md, "Tier specs").
"$train" "${common[@]}" --dtype bf16 --budget 6MiB --tier "host:1MiB:20:21,file:$work/tier:256MiB" \
  --report "$work/bf16.json" > "$work/bf16.log"
"$train" "${common[@]}" --dtype bf16 --report "$work/bf16-plain.json" > "$work/bf16-plain.log"
python3 - "$work" <<'PY'
import sys
from runs import load, same_falling_losses
work = sys.argv[1]
run, plain = load(work, "bf16"), load(work, "bf16-plain")
hist = same_falling_losses(run, plain)
assert run["config"]["dtype"] == "bf16"
host, file = run["session"]["tiers"]
assert (host["name"], file["name"]) == ("host", "file"), run["session"]["tiers"]
assert (host["read_gbps"], host["write_gbps"], host["read_source"]) == (20, 21, "given"), host
assert file["read_source"] != "given", file
assert run["memory"]["parameter_bytes"] == 4 * run["config"]["parameters"], "fp32 master weights"
fp32 = load(work, "plain")["loss"]["history"]
assert hist != fp32, "bf16 autocast computed exactly what fp32 did: autocast is off"
print("bf16 mixed precision: falling loss, bitwise with offloading, fp32 parameters: ok")
PY

# 5b. Optimizer steps in backward (docs/train.md): one AdamW per parameter stepped from its
#     post-accumulate-grad hook, under a Session: the losses are bitwise those of the plain run
#     without clipping (with clipping it is refused below).
"$train" "${common[@]}" --grad-clip 0 --step-in-backward --budget 6MiB \
  --tier "file:$work/tier:256MiB" --report "$work/inbwd.json" > "$work/inbwd.log"
"$train" "${common[@]}" --grad-clip 0 --report "$work/noclip-plain.json" > "$work/noclip-plain.log"
python3 - "$work" <<'PY'
import sys
from runs import load, same_falling_losses
work = sys.argv[1]
run, plain = load(work, "inbwd"), load(work, "noclip-plain")
same_falling_losses(run, plain)
assert run["config"]["step_in_backward"] and not plain["config"]["step_in_backward"]
assert run["session"]["mode"] == "planned" and run["session"]["drift_events"] == 0, run["session"]
print("steps in backward: bitwise with the plain run, planned, no drift: ok")
PY

# 6. Argument errors: exit 1 with a message naming the argument, before any training.
expect_error() {
  local pattern=$1; shift
  if "$train" "$@" > "$work/err.log" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$pattern" "$work/err.log" || { cat "$work/err.log"; fail "message for: $*"; }
}
expect_error '--budget needs at least one --tier' --budget 8MiB
expect_error '--tier needs --budget' --tier host:1GiB
expect_error '--tier "disk:1GiB": expected host:CAPACITY' --budget 8MiB --tier disk:1GiB
expect_error '--tier "ssd:1GiB:2:2": a Session.s tier is host:CAPACITY' --budget 8MiB --tier ssd:1GiB:2:2
expect_error '--tier "host:1GiB:2": a host tier is' --budget 8MiB --tier host:1GiB:2
expect_error '--step-in-backward .* cannot clip: add --grad-clip 0' --step-in-backward
expect_error 'unknown model' --model llama-9b
expect_error '--dtype "fp16": expected fp32, bf16 (mixed precision) or bf16-pure' --dtype fp16
expect_error 'cannot open the file' --data "$work/missing.txt"
expect_error 'exclude each other' --synthetic --data "$work/run.json"
expect_error '--inject-fault "3:EWHAT:read": unknown error' --budget 8MiB --tier host:64MiB --inject-fault 3:EWHAT:read
expect_error 'expected STEP:ERROR:DIRECTION' --budget 8MiB --tier host:64MiB --inject-fault 3
# A given number is checked, never replaced by a default (--batch 0 trained with 16).
expect_error '--batch 0: must be in \[1, 1000000\]' --batch 0
expect_error '--seq 0: must be in' --seq 0
expect_error '--threads -1: must be in \[0, 4096\]' --threads -1
expect_error '--grad-clip -1: must be a number >= 0' --grad-clip -1
expect_error '--weight-decay nan' --weight-decay nan
expect_error '--lr 0: must be a positive number' --lr 0
expect_error '--warmup-steps -1: must be >= 0' --warmup-steps -1
for bad in "--batch 0" "--threads -1" "--frobnicate"; do
  # shellcheck disable=SC2086
  "$train" $bad > /dev/null 2> "$work/err.log" || true
  [[ $(wc -l < "$work/err.log") -eq 1 ]] || { cat "$work/err.log"; fail "not one line: $bad"; }
done

# 7. Outputs: a full standard output is an error; a run report that cannot be written leaves the
#    old one whole.
one_step=(--model tiny --steps 1 --batch 4 --seq 64 --threads 1)
if "$train" "${one_step[@]}" > /dev/full 2> "$work/err.log"; then fail "exit 0 on a full stdout"; fi
grep -q 'teraio-train: cannot write to standard output: No space left on device' "$work/err.log" ||
  { cat "$work/err.log"; fail "message for a full stdout"; }
echo old > "$work/old.json"
# (stderr through a pipe: under `ulimit -f 0` no regular file can be written, err.log included)
if err=$( (ulimit -f 0; trap '' XFSZ; "$train" "${one_step[@]}" --report "$work/old.json" > /dev/null) 2>&1); then
  fail "exit 0 when the run report cannot be written"
fi
grep -q "cannot write $work/old.json: File too large" <<< "$err" || { echo "$err"; fail "report error"; }
[[ $(cat "$work/old.json") == old ]] || fail "the old run report was overwritten"
[[ $(find "$work" -maxdepth 1 -name '*.tmp-*' | wc -l) -eq 0 ]] || fail "a temporary file was left"
echo "train_check: all passed"
