#!/usr/bin/env bash
# The H200 runs of docs/benchmarks.md, in phases that each fit one device call (< 10 min):
#   checks   storage GPU tests, bench/torch_gpu.py (bitwise, planned peak vs budget, hook overhead),
#            teraio-train llama-1b under a Session
#   1b       HF llama-1b: Ideal, teraio (host tier) at 1/2 (also with CPU-waited offloads) and 1/4
#            of the footprint and at the GPU memory FSDP2 + CPU offload took
#   3b       HF llama-3b: the same
#   peers1b  FSDP2 with CPU offload and DeepSpeed ZeRO-Offload on llama-1b, each also with activation
#            checkpointing, and teraio (with and without steps in backward) at the GPU memory each
#            of those took (pick with the name filter: e.g. `peers1b -ac-`)
#   disk     teraio host+disk and disk-only, DeepSpeed ZeRO-Infinity (NVMe) on llama-1b
#   peers3b  the same on llama-3b
#   faults   issue 13 and issue 16's probe: storage GPU tests, checksum speed, iobench quick probe and
#            full passes (file tier with and without checksums), bench/faults_gpu.py (CUDA faults),
#            torch_gpu.py (bitwise), llama-1b at 1/2 with the measured host bandwidth (no knob), and
#            llama-small on the disk with and without verify (the checksums' cost on a training step)
#   verify   the checksums' cost, paired: iobench on the disk with and without them (interleaved,
#            VERIFY_ROUNDS rounds, default 3 for iobench and 2 for training),
#            llama-small trained through the disk with verify on and off (interleaved), and
#            bench/faults_gpu.py
#   moe      issue 17: HF Mixtral (mixtral-2b, 8 experts, top 2): Ideal, then teraio at 1/2 of its
#            footprint (host tier, measured bandwidth)
#   timing   issue 16: llama-1b Ideal and teraio at 1/2 (no bandwidth given), fp32 and bf16 autocast:
#            the profile's operator times (CUPTI, events) against the Ideal step, predicted vs measured
#   recompute issue 15: teraio with and without recompute at 1/2 and 1/4 of the footprint, fp32 and
#            bf16 autocast (RC_MODEL, RC_DTYPES, RC_FRACS, RC_MODES select)
#   real     issue 16's workloads, Llama-3-8B shape (docs/benchmarks.md "Issue 16's workloads"): Ideal
#            at batch 1 x 2048 (autocast; fused and loop AdamW), teraio as the README writes it (host
#            tier 96 GiB, no bandwidth given) in autocast at 4 x 2048 (110 GiB; 130 GiB with the host
#            alone and with a 50 GiB disk tier), fp32 at 1 x 4096 (host + disk), FSDP2 + CPUOffloadPolicy with and without
#            activation checkpointing, ZeRO-Offload with and without it, ZeRO-Infinity, and the
#            largest model predicted to fit (REAL_LAYERS, default 61 layers: host tier only;
#            REAL_LAYERS_INBWD, default 74, with steps in backward: bench/largest_model.sh with
#            SYNTH_ARGS=--step-in-backward); the teraio runs named inbwd run the optimizer steps in backward (--step-in-backward). Each run
#            takes minutes: pick a few per call with the name filter (ideal, teraio, fsdp2, ds-,
#            largest; e.g. `bash bench/h200_run.sh real teraio-host-8b`); the peers need .whl/
#            carried (bash bench/peer_wheels.sh, where there is network)
#   hf       issue 17 on CUDA: bench/hf_gpu.py (HF Mixtral 20 steps bitwise, fp32 and autocast, at half
#            [HF_MODEL=mixtral-2b: that shape of data/models.json]
#            its footprint; the HF Trainer under TeraioCallback bitwise); OPTIM=default: foreach AdamW
#   ddp      issue 7, on nvidia-h200-x2: bench/ddp_bench.py, DDP of llama-1b on 1 and 2 GPUs at 1/2
#            of the per-GPU footprint, with and without teraio (throughput scaling, bitwise)
# Still to measure (issues 15, 16; docs/benchmarks.md, "Issue 15's peers at their memory, and plans
# made again for the host, on an H100"), one device call each (< 10 min), in this order (ask only
# with >= 6 min of device time left: a start is refused under 4). bench/call43.sh runs them a part
# per call (`first`: the 8B on an H200, the A/B elsewhere):
#   WARMUP=16 bash bench/h200_call36.sh 8b-teraio  (H200: the 8B as a user runs it, with reads back
#                                            modelled and offloads and writebacks issued past them,
#                                            the allocator's waits out of the host times, and plans
#                                            made again once the host's numbers settle: expect about
#                                            1.01 s, profiled_allocator_waits > 0, prediction within 5%)
#   bash bench/call43.sh fsdp2amp            (any 80 GB GPU, ~3 min: teraio at the memory of FSDP2 with
#                                            checkpointing in autocast, with the probe that plans
#                                            with the upper quartile of its passes and the links
#                                            corrected from their copies' rates (run_summary's
#                                            "links"); session 43's H100: 0.396 s against FSDP2's
#                                            0.527, planned for a 26 GB/s link)
#   bash bench/h200_call36.sh fp32          (H200: the 8B in fp32 at 1 x 4096 on host + disk; LARGEST=1
#                                            adds the largest model, or `bash bench/h200_run.sh real
#                                            largest-inbwd`)
#   bash bench/h200_run.sh real fsdp2-8b-amp, real ds-infinity   (the 8B peers not run yet: error rows)
# Measured in session 43 (H100): the A/B with 13 warm-up steps twice (call37.sh "2 4"), FSDP2 with
# checkpointing and teraio at its memory (fp32 and autocast).
# "Footprint" is the Ideal run's torch.cuda.max_memory_allocated(); budgets are fractions of it.
# WARMUP=N: llm_bench's --warmup for every run (default 3: 2 profiled, 1 planned); 6 lets the Session
# plan again for the planned steps' host times before the measured steps (Note [Plans for the host
# that runs them] in src/offload/controller.cpp: after 3 planned steps); 13 lets it plan again once
# more when the host's numbers settle later (they did after 6 planned steps on an H100), 16 also
# keeps a third try's search (about 0.7 s of one step) out of the measured steps.
# TIMELINE=1: every llm_bench run also profiles one step after the measured ones (bench/timeline.py;
# its Chrome trace beside the result, its summary in the result's "timeline").
# Usage (repo root on the GPU machine, build-gpu/, build-train-gpu/, build-gpudeps/ and .whl/ carried):
#   OUT=... bash bench/h200_run.sh PHASE [name-filter]
# Results: $OUT/h200_<phase>.tgz (one JSON per run, traces and plans; rewritten after every run, so
# a call cut short still returns what finished) and $OUT/log_<phase>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:?phase: checks, 1b, 3b, peers1b, disk, peers3b, faults, verify, moe, timing, recompute, real, hf or ddp}
FILTER=${2:-}
OUT=${OUT:-$PWD/h200-out}
R=$OUT/res_$PHASE
mkdir -p "$R"
exec > >(tee -a "$OUT/log_$PHASE.txt") 2>&1
source bench/h200_env.sh
DISK=${DISK_DIR:-/tmp}
STEPS=${STEPS:-3}
step() { echo; echo "== $(date -u +%T) $*"; }
# the archive is replaced whole, so a call cut short mid-write still returns the previous one
finish() { tar czf "$OUT/.h200_$PHASE.tgz.part" -C "$R" . && mv "$OUT/.h200_$PHASE.tgz.part" "$OUT/h200_$PHASE.tgz"; }
trap finish EXIT

# bench NAME TIMEOUT ARGS...: one llm_bench.py configuration (skipped when NAME misses the filter)
bench() {
  local name=$1 limit=$2
  shift 2
  [[ -n $FILTER && $name != *$FILTER* ]] && return 0
  step "bench $name: $*"
  rm -f "$R/$name.json"
  timeout --signal=INT --kill-after=20 "$limit" $PY bench/llm_bench.py --steps "$STEPS" ${WARMUP:+--warmup "$WARMUP"} --out "$R/$name.json" \
    ${TIMELINE:+--timeline "$R/timeline-$name.json.xz"} "$@"
  local rc=$?
  echo "rc=$rc for $name"
  if [[ ! -s $R/$name.json ]]; then  # killed before it could write (out of host memory, the limit)
    $PY - "$R/$name.json" "$rc" "$limit" "$name" "$@" <<'EOF'
import json, sys
out, rc, limit, name, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
why = {124: f"stopped at the {limit} s limit", 137: "killed (SIGKILL: the kernel's OOM killer, or the limit)"}
json.dump({"ok": False, "name": name, "argv": argv, "exit_status": rc,
           "error": f"llm_bench exited with status {rc} without writing its result: {why.get(rc, 'see the log')}"},
          open(out, "w"), indent=1)
EOF
  fi
  finish
}
# peer_bench NAME TIMEOUT ARGS...: bench for a peer system, installing the peers (once) only when
# the run passes the name filter
peers_ready=0
peer_bench() {
  [[ -n $FILTER && $1 != *$FILTER* ]] && return 0
  ((peers_ready)) || { ensure_peers && peers_ready=1; }
  bench "$@"
}
# footprint MODEL: the Ideal run's peak allocated bytes for MODEL (from this or an earlier phase)
footprint() {
  local var="FOOTPRINT_${1//-/_}"  # e.g. FOOTPRINT_llama_1b=37541007360 from an earlier call
  if [[ -n ${!var:-} ]]; then echo "${!var}"; return; fi
  $PY - "$1" "$OUT" <<'EOF'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[2]}/res_*/ideal-{sys.argv[1]}.json")):
    r = json.load(open(f))
    if r.get("ok"):
        print(r["memory"]["cuda_max_allocated_bytes"]); break
else:
    print(0)
EOF
}
fraction() { echo $(( $1 / $2 ))B; }  # bytes / n, as a size teraio parses
# peak_allocated NAME: torch.cuda.max_memory_allocated() of run NAME of this call (0 if none)
peak_allocated() {
  $PY - "$R/$1.json" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print(r["memory"]["cuda_max_allocated_bytes"] if r.get("ok") else 0)
except (OSError, ValueError, KeyError):
    print(0)
EOF
}

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
nproc; free -g | head -2; df -h "$DISK" | tail -1
step "install"
ensure_teraio || { echo "teraio install failed"; exit 1; }

case $PHASE in
checks)
  step "storage GPU tests"
  if [[ -x build-gpu/bin/storage_gpu_test ]]; then
    LD_LIBRARY_PATH="$PWD/build-gpu/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH" timeout 120 \
      build-gpu/bin/storage_gpu_test --gtest_brief=1 2>&1 | tail -15
  else
    echo "build-gpu/bin/storage_gpu_test not carried: skipped (scripts/gpu_prebuild.sh builds it)"
  fi
  step "torch_gpu.py"
  # stderr (TERAIO_LOG=1: every move outside the plan, docs/pytorch.md "Diagnostics") to a file
  TERAIO_LOG=${TERAIO_LOG:-1} timeout 240 $PY bench/torch_gpu.py "$R/torch_gpu.json" 2>"$R/teraio_log.txt"
  echo "rc=$?"
  tail -5 "$R/teraio_log.txt"
  finish
  step "teraio-train llama-1b fp32, 12 GiB budget, host tier"
  [[ -x build-train-gpu/bin/teraio-train ]] || { echo "build-train-gpu/bin/teraio-train not carried: skipped"; exit 0; }
  LD_LIBRARY_PATH="$TORCH_LIB:$PWD/build-train-gpu/lib:$LD_LIBRARY_PATH" timeout 150 \
    build-train-gpu/bin/teraio-train --device cuda --model llama-1b --steps 8 --budget 12GiB \
    --tier host:64GiB --report "$R/train-llama-1b-12GiB.json"
  echo "rc=$?"
  ;;
1b | 3b)
  m=llama-$PHASE
  var="FOOTPRINT_${m//-/_}"
  if [[ -z ${!var:-} ]]; then
    bench ideal-$m 200 --system ideal --model $m --adamw fused
    bench ideal-loop-$m 200 --system ideal --model $m --adamw loop
  fi
  fp=$(footprint $m)
  echo "$m footprint (Ideal peak allocated): $fp bytes"
  if (( fp > 0 )); then
    bench teraio-host-half-$m 240 --system teraio --model $m --tiers host --budget "$(fraction "$fp" 2)" \
      --trace-out "$R/trace-$m-half.json" --plan-out "$R/plan-$m-half.json"
    bench teraio-host-quarter-$m 240 --system teraio --model $m --tiers host --budget "$(fraction "$fp" 4)" \
      --trace-out "$R/trace-$m-quarter.json" --plan-out "$R/plan-$m-quarter.json"
    # A/B: offloads due before an operator waited for on the CPU (the default waits on the GPU)
    bench teraio-host-half-cpuwait-$m 240 --system teraio --model $m --tiers host --budget "$(fraction "$fp" 2)" \
      --no-stream-ordered-offloads
  fi
  # the same GPU memory as the best peer took (FSDP2 + CPUOffloadPolicy's max allocated on
  # 2026-12-02: 24,837,679,616 bytes for llama-1b), for a comparison at equal memory
  if [[ $m == llama-1b ]]; then
    bench teraio-host-fsdpmem-$m 240 --system teraio --model $m --tiers host --budget 24837679616B \
      --trace-out "$R/trace-$m-fsdpmem.json" --plan-out "$R/plan-$m-fsdpmem.json"
  fi
  ;;
peers1b | peers3b)
  m=llama-${PHASE#peers}
  ensure_peers
  bench fsdp2-offload-$m 240 --system fsdp2-offload --model $m
  bench ds-offload-$m 300 --system ds-offload --model $m --disk-dir "$DISK"
  # issue 15's peers at tight memory: activation checkpointing of every decoder layer, then teraio
  # at the GPU memory each took (its max allocated), with steps in backward and without
  bench fsdp2-offload-ac-$m 240 --system fsdp2-offload --model $m --grad-ckpt
  bench ds-offload-ac-$m 300 --system ds-offload --model $m --disk-dir "$DISK" --grad-ckpt
  for peer in fsdp2-offload-ac ds-offload-ac; do
    mem=$(peak_allocated "$peer-$m")
    (( mem > 0 )) || { echo "no memory figure for $peer-$m: teraio at its memory skipped"; continue; }
    for mode in step-in-backward no-step-in-backward; do
      bench teraio-$mode-at-$peer-$m 300 --system teraio --model $m --tiers host --budget "${mem}B" \
        --host-gbps 0 --adamw loop --$mode --trace-out "$R/trace-$mode-at-$peer-$m.json" \
        --plan-out "$R/plan-$mode-at-$peer-$m.json"
    done
  done
  ;;
disk)
  fp=$(footprint llama-1b)
  if (( fp > 0 )); then
    bench teraio-hostdisk-quarter-llama-1b 240 --system teraio --model llama-1b --tiers host+disk --host-gib 8 \
      --budget "$(fraction "$fp" 4)" --disk-dir "$DISK"
    bench teraio-disk-half-llama-1b 300 --system teraio --model llama-1b --tiers disk --budget "$(fraction "$fp" 2)" \
      --disk-dir "$DISK"
  fi
  ensure_peers
  bench ds-infinity-llama-1b 300 --system ds-infinity --model llama-1b --disk-dir "$DISK"
  ;;
faults)
  step "storage GPU tests"
  if [[ -x build-gpu/bin/storage_gpu_test ]]; then
    LD_LIBRARY_PATH="$PWD/build-gpu/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH" timeout 120 \
      build-gpu/bin/storage_gpu_test --gtest_brief=1 2>&1 | tail -15
    step "checksum speed, one core"
    LD_LIBRARY_PATH="$PWD/build-gpu/lib:$LD_LIBRARY_PATH" build-gpu/bin/checksum_bench | tee "$R/checksum.txt"
    step "iobench: quick probe (the Session's) and full passes; file tier with and without checksums"
    io() { LD_LIBRARY_PATH="$PWD/build-gpu/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH" timeout 90 \
             build-gpu/bin/teraio iobench --device cuda "$@"; }
    io --tier host --quick --json > "$R/iobench-host-quick.json"; tail -c 600 "$R/iobench-host-quick.json"; echo
    io --tier file --path "$DISK" --quick --json > "$R/iobench-file-quick.json"; tail -c 600 "$R/iobench-file-quick.json"; echo
    io --tier file --path "$DISK" --size 1GiB --repeat 3 --request 16MiB | tee "$R/iobench-file.txt"
    io --tier file --path "$DISK" --size 1GiB --repeat 3 --request 16MiB --checksums | tee "$R/iobench-file-checksums.txt"
    finish
  else
    echo "build-gpu/ not carried: storage tests, checksum speed and iobench skipped (scripts/gpu_prebuild.sh)"
  fi
  step "faults_gpu.py"
  timeout 150 $PY bench/faults_gpu.py "$R/faults_gpu.json" "$DISK"
  echo "rc=$?"
  finish
  step "torch_gpu.py"
  TERAIO_LOG=${TERAIO_LOG:-1} timeout 200 $PY bench/torch_gpu.py "$R/torch_gpu.json" 2>"$R/teraio_log.txt"
  echo "rc=$?"
  finish
  fp=$(footprint llama-1b)
  if (( fp > 0 )); then  # no bandwidth given: the Session measures the host link (issue 16)
    bench teraio-host-half-measured-llama-1b 200 --system teraio --model llama-1b --tiers host \
      --budget "$(fraction "$fp" 2)" --host-gbps 0
  fi
  # the checksums' cost on a step that moves bytes through the disk (disk tier only, measured link)
  bench teraio-disk-verify-llama-small 150 --system teraio --model llama-small --tiers disk \
    --budget 3GiB --disk-gbps 0 --disk-dir "$DISK" --verify
  bench teraio-disk-noverify-llama-small 150 --system teraio --model llama-small --tiers disk \
    --budget 3GiB --disk-gbps 0 --disk-dir "$DISK" --no-verify
  ;;
verify)
  if [[ -x build-gpu/bin/teraio ]]; then
    step "iobench on the disk, device buffers, without and with checksums, interleaved x3"
    for i in $(seq 1 "${VERIFY_ROUNDS:-3}"); do
      for c in "" --checksums; do
        LD_LIBRARY_PATH="$PWD/build-gpu/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH" timeout 60 \
          build-gpu/bin/teraio iobench --device cuda --tier file --path "$DISK" --size 1GiB --repeat 3 \
          --request 16MiB $c | grep '^file' | sed "s/^/round $i ${c:-plain} /" | tee -a "$R/iobench-verify.txt"
      done
    done
    finish
  fi
  step "faults_gpu.py"
  timeout 150 $PY bench/faults_gpu.py "$R/faults_gpu.json" "$DISK"
  echo "rc=$?"
  finish
  for i in $(seq 1 "${VERIFY_ROUNDS:-2}"); do  # the checksums' cost on a training step, interleaved
    bench teraio-disk-verify$i-llama-small 150 --system teraio --model llama-small --tiers disk \
      --budget 3GiB --disk-gbps 0 --disk-dir "$DISK" --verify --warmup 3 --steps 4
    bench teraio-disk-noverify$i-llama-small 150 --system teraio --model llama-small --tiers disk \
      --budget 3GiB --disk-gbps 0 --disk-dir "$DISK" --no-verify --warmup 3 --steps 4
  done
  ;;
moe)
  m=mixtral-2b
  bench ideal-$m 200 --system ideal --model $m --adamw loop
  fp=$(footprint $m)
  echo "$m footprint (Ideal peak allocated): $fp bytes"
  if (( fp > 0 )); then
    bench teraio-host-half-$m 240 --system teraio --model $m --tiers host --budget "$(fraction "$fp" 2)" \
      --host-gbps 0 --steps 5
  fi
  ;;
timing)
  # issue 16: the operators' times a profile records (CUPTI, events) against the Ideal step, fp32
  # and bf16 autocast, and the plan's prediction against the measured step (no bandwidth given)
  for dt in fp32 amp; do
    bench ideal-llama-1b-$dt 200 --system ideal --model llama-1b --dtype $dt --adamw loop
    fp=$(footprint llama-1b-$dt)
    if (( fp > 0 )); then
      bench teraio-host-half-measured-llama-1b-$dt 200 --system teraio --model llama-1b --dtype $dt \
        --tiers host --budget "$(fraction "$fp" 2)" --host-gbps 0 --trace-out "$R/trace-llama-1b-$dt.json"
    fi
  done
  ;;
recompute)
  # issue 15: teraio with and without recompute at fractions of the Ideal footprint (host tier,
  # measured bandwidth), traces and plans kept (the simulator's prediction). RC_MODEL (llama-1b),
  # RC_DTYPES ("fp32 amp"), RC_FRACS ("2 4"), RC_MODES ("recompute no-recompute"; each mode is a
  # llm_bench flag, e.g. "no-discard-dead" for the A/B of docs/pytorch.md "Dead tensors", "step-in-backward"
  # for "Optimizer steps in backward", or flags joined by '+': "step-in-backward+writebacks", its files named with '_' for '+'
  # (a flag's value after '=': "step-in-backward+adamw=fused", named step-in-backward_adamw_fused; '.' becomes 'p');
  # since 2026-12-06 the Session plans deep recompute chains and writebacks by default: the runs without
  # them are "step-in-backward+no-deep-recompute+no-writebacks"); the footprint
  # comes from an Ideal run of this call or FOOTPRINT_<model>_<dtype> (e.g. FOOTPRINT_llama_1b_fp32)
  m=${RC_MODEL:-llama-1b}
  for dt in ${RC_DTYPES:-fp32 amp}; do
    var="FOOTPRINT_${m//-/_}_$dt"
    [[ -z ${!var:-} ]] && bench ideal-$m-$dt 200 --system ideal --model $m --dtype $dt --adamw loop
    fp=$(footprint $m-$dt)
    (( fp > 0 )) || { echo "no footprint for $m $dt"; continue; }
    for frac in ${RC_FRACS:-2 4}; do
      for mode in ${RC_MODES:-recompute no-recompute}; do
        n=$(tr '+=.' '__p' <<<"$mode")  # plain file names (the device call returns only those)
        # shellcheck disable=SC2046  # a mode may join flags with '+': step-in-backward+writebacks
        bench teraio-$n-1of$frac-$m-$dt 300 --system teraio --model $m --dtype $dt --tiers host \
          --budget "$(fraction "$fp" "$frac")" --host-gbps 0 $(sed 's/^/--/; s/+/ --/g' <<<"$mode") \
          --trace-out "$R/trace-$n-1of$frac-$m-$dt.json" --plan-out "$R/plan-$n-1of$frac-$m-$dt.json"
      done
    done
  done
  ;;
real)
  # issue 16: the model that does not fit, trained as a user would (random init, HF, no bandwidth
  # given, the README's 96 GiB host tier); traces and plans kept for the predictions of
  # docs/benchmarks.md "Issue 16's workloads, predicted before running"
  m=llama-8b
  a8=(--model $m --dtype amp --batch 4 --seq 2048)
  bench ideal-8b-amp-b1-fused 300 --system ideal --model $m --dtype amp --batch 1 --seq 2048 --adamw fused
  bench ideal-8b-amp-b1-loop 300 --system ideal --model $m --dtype amp --batch 1 --seq 2048 --adamw loop
  bench ideal-8b-amp-b2-fused 300 --system ideal --model $m --dtype amp --batch 2 --seq 2048 --adamw fused
  bench teraio-host-8b-amp 540 --system teraio "${a8[@]}" --budget 110GiB --tiers host --host-gib 96 \
    --host-gbps 0 --trace-out "$R/trace-teraio-host-8b-amp.json" --plan-out "$R/plan-teraio-host-8b-amp.json"
  bench teraio-host-inbwd-8b-amp 540 --system teraio "${a8[@]}" --budget 110GiB --tiers host --host-gib 96 \
    --host-gbps 0 --step-in-backward --adamw "${ADAMW_8B:-fused}" --trace-out "$R/trace-teraio-host-inbwd-8b-amp.json" \
    --plan-out "$R/plan-teraio-host-inbwd-8b-amp.json"
  bench teraio-host130-inbwd-8b-amp 540 --system teraio "${a8[@]}" --budget 130GiB --tiers host --host-gib 96 \
    --host-gbps 0 --step-in-backward --trace-out "$R/trace-teraio-host130-inbwd-8b-amp.json" \
    --plan-out "$R/plan-teraio-host130-inbwd-8b-amp.json"
  bench teraio-host130-8b-amp 540 --system teraio "${a8[@]}" --budget 130GiB --tiers host --host-gib 96 \
    --host-gbps 0 --trace-out "$R/trace-teraio-host130-8b-amp.json" --plan-out "$R/plan-teraio-host130-8b-amp.json"
  bench teraio-hostdisk-8b-amp 540 --system teraio "${a8[@]}" --budget 130GiB --tiers host+disk --host-gib 96 \
    --disk-gib 50 --host-gbps 0 --disk-gbps 0 --disk-dir "$DISK" \
    --trace-out "$R/trace-teraio-hostdisk-8b-amp.json" --plan-out "$R/plan-teraio-hostdisk-8b-amp.json"
  bench teraio-hostdisk-8b-fp32-s4096 580 --system teraio --model $m --dtype fp32 --batch 1 --seq 4096 \
    --budget 130GiB --tiers host+disk --host-gib 96 --disk-gib 50 --host-gbps 0 --disk-gbps 0 --disk-dir "$DISK" \
    --trace-out "$R/trace-teraio-hostdisk-8b-fp32-s4096.json" --plan-out "$R/plan-teraio-hostdisk-8b-fp32-s4096.json"
  bench teraio-inbwd-hostdisk-8b-fp32-s4096 580 --system teraio --model $m --dtype fp32 --batch 1 --seq 4096 \
    --budget 130GiB --tiers host+disk --host-gib 96 --disk-gib 50 --host-gbps 0 --disk-gbps 0 --disk-dir "$DISK" \
    --step-in-backward --trace-out "$R/trace-teraio-inbwd-hostdisk-8b-fp32-s4096.json" \
    --plan-out "$R/plan-teraio-inbwd-hostdisk-8b-fp32-s4096.json"
  bench teraio-largest-inbwd-host-amp-b1 580 --system teraio --model $m --layers "${REAL_LAYERS_INBWD:-74}" --dtype amp \
    --batch 1 --seq 2048 --budget 130GiB --tiers host --host-gib 96 --host-gbps 0 --warmup 2 --steps 2 \
    --step-in-backward
  bench teraio-largest-host-amp-b1 580 --system teraio --model $m --layers "${REAL_LAYERS:-61}" --dtype amp \
    --batch 1 --seq 2048 --budget 130GiB --tiers host --host-gib 96 --host-gbps 0 --warmup 2 --steps 2
  peer_bench fsdp2-8b-amp 480 --system fsdp2-offload "${a8[@]}"
  peer_bench fsdp2-ac-8b-amp 480 --system fsdp2-offload "${a8[@]}" --grad-ckpt
  peer_bench ds-offload-8b-amp 540 --system ds-offload "${a8[@]}" --disk-dir "$DISK"
  peer_bench ds-offload-ac-8b-amp 540 --system ds-offload "${a8[@]}" --disk-dir "$DISK" --grad-ckpt
  peer_bench ds-infinity-8b-amp 580 --system ds-infinity "${a8[@]}" --disk-dir "$DISK"
  ;;
hf)
  # issue 17 on CUDA: HF Mixtral 20 steps bitwise (fp32, autocast) at half its footprint, the HF
  # Trainer under TeraioCallback bitwise; OPTIM=default uses PyTorch's default (foreach) AdamW
  step "hf_gpu.py (optimizer: ${OPTIM:-loop})"
  timeout 400 $PY bench/hf_gpu.py --out "$R/hf_gpu-${OPTIM:-loop}.json" --optim "${OPTIM:-loop}" \
    ${HF_CASES:+--cases "$HF_CASES"} ${HF_MODEL:+--model "$HF_MODEL"}
  echo "rc=$?"
  finish
  ;;
ddp)
  ngpu=$(nvidia-smi -L | wc -l)
  (( ngpu >= 2 )) || { echo "ddp needs 2 GPUs (kind nvidia-h200-x2); this machine has $ngpu"; exit 2; }
  [[ -n $FILTER && ddp-llama-1b != *$FILTER* ]] && exit 0
  step "ddp_bench llama-1b, world 1 and 2, budget 1/2 per GPU, host tier"
  $PY bench/ddp_bench.py --world 1,2 --model llama-1b --budget 1/2 --steps 5 --timeout 270 --out "$R/ddp-1b"
  echo "rc=$? for ddp-llama-1b"
  ;;
*)
  echo "unknown phase $PHASE"; exit 2 ;;
esac
