#!/usr/bin/env bash
# Storage measurements on the GPU machine (docs/storage.md, "Measuring on the H200"): builds teraio,
# runs the storage GPU tests, probes GPUDirect Storage under several cuFile configurations on the
# disk and on /dev/shm, then measures the host and file tiers with host and device buffers next to
# the raw disk and the raw pinned host link. Everything lands in $OUT (default ./iobench-out).
# Environment: OUT, DISK_DIR (default /tmp), SHM_DIR (default /dev/shm), SIZE (default 4GiB),
# REPEAT (default 3), BUILD_DIR (default build-iobench), JOBS (default nproc).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/iobench-out}
DISK_DIR=${DISK_DIR:-/tmp}
SHM_DIR=${SHM_DIR:-/dev/shm}
SIZE=${SIZE:-4GiB}
REPEAT=${REPEAT:-3}
BUILD_DIR=${BUILD_DIR:-build-iobench}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
LOG="$OUT/iobench_gpu.log"
exec > >(tee -a "$LOG") 2>&1
echo "== teraio iobench_gpu.sh $(date -u +%FT%TZ) on $(hostname)"

step() { echo; echo "== $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 | tee "$OUT/gpu.csv"
uname -r; nproc; free -g | head -2
df -h "$DISK_DIR" "$SHM_DIR"; findmnt -T "$DISK_DIR"; findmnt -T "$SHM_DIR"
ls -l /dev/nvidia-fs* 2>&1 | head -3; lsmod 2>/dev/null | grep -i nvidia_fs || echo "nvidia_fs module: not loaded"
ls -d /run/udev 2>&1
ls /usr/local/cuda/lib64/libcufile* /usr/lib/x86_64-linux-gnu/libcufile* 2>/dev/null
cat /etc/cufile.json 2>/dev/null | grep -vE '^\s*//' | head -60 > "$OUT/etc_cufile.json" || true
cat /proc/sys/kernel/io_uring_disabled 2>/dev/null | sed 's/^/io_uring_disabled=/'

step "build ($BUILD_DIR)"
# A prebuilt tree (scripts/gpu_prebuild.sh: binaries in $BUILD_DIR/bin, the shared libraries the GPU
# machine lacks in $BUILD_DIR/lib) is used as is; otherwise build here.
if [[ -x "$BUILD_DIR/bin/teraio" ]]; then
  echo "using prebuilt $BUILD_DIR"
  export LD_LIBRARY_PATH="$PWD/$BUILD_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_BUILD_BENCH=OFF > "$OUT/cmake.log" 2>&1; then
    echo "configure with tests failed (see cmake.log); retrying without tests"
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_BUILD_BENCH=OFF -DTERAIO_BUILD_TESTS=OFF \
      >> "$OUT/cmake.log" 2>&1 || { echo "configure failed"; tail -30 "$OUT/cmake.log"; exit 1; }
  fi
  cmake --build "$BUILD_DIR" --target teraio storage_gpu_test storage_conformance_test storage_unit_test -j "$JOBS" \
    > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; }
fi
T="$BUILD_DIR/bin/teraio"
$T --version || exit 1

step "storage tests (cpu + gpu)"
for t in storage_gpu_test storage_unit_test storage_conformance_test; do
  if [[ -x "$BUILD_DIR/bin/$t" ]]; then
    "$BUILD_DIR/bin/$t" --gtest_brief=1 > "$OUT/$t.txt" 2>&1; echo "$t exit $? ($(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/$t.txt" | tr '\n' ' '))"
  else
    echo "$t: not built"
  fi
done

cat > "$OUT/summarize.py" <<'PY'
# Summaries of `teraio iobench --json` output for the log.
import json, sys
mode = sys.argv[1]
if mode == "probe":
    text = sys.stdin.read()
    try:
        g = json.loads(text)[0]["gds"]
        print("usable=%s step=%s error=%s :: %s" % (g["usable"], g["step"] or "-", g["error_code"], g["reason"]))
    except Exception:
        print("unparsable: " + text.strip().replace("\n", " ")[:300])
else:
    d = json.load(open(sys.argv[2]))
    for r in d["results"]:
        print("%-10s %-5s req=%5dKiB qd=%2d tier=%6.2f [%.2f, %.2f] raw=%6.2f GB/s" % (
            r["engine"], r["direction"], r["request_bytes"] >> 10, r["queue_depth"], r["gbps"]["median"],
            r["gbps"]["min"], r["gbps"]["max"], r["raw_gbps"]["median"]))
PY

step "GDS probes under cuFile configurations"
PROBE_DISK="$DISK_DIR/teraio-probe-$$"; PROBE_SHM="$SHM_DIR/teraio-probe-$$"
mkdir -p "$PROBE_DISK" "$PROBE_SHM" "$OUT/cufile-logs"
write_json() {  # $1 file, $2 allow_compat, $3 force_compat, $4 poll
  cat > "$1" <<JSON
{
  "logging": { "dir": "$OUT/cufile-logs", "level": "TRACE" },
  "properties": {
    "allow_compat_mode": $2,
    "force_compat_mode": $3,
    "use_poll_mode": $4,
    "poll_mode_max_size_kb": 4,
    "max_direct_io_size_kb": 16384
  }
}
JSON
}
write_json "$OUT/cufile_compat.json" true false false
write_json "$OUT/cufile_compat_poll.json" true false true
write_json "$OUT/cufile_force_compat.json" true true false
write_json "$OUT/cufile_nocompat.json" false false false
: > "$OUT/gds_probe_matrix.txt"
probe() {  # $1 label, then env assignments
  local label=$1; shift
  for dir in "$PROBE_DISK" "$PROBE_SHM"; do
    local res
    res=$(env "$@" "$T" iobench --probe --gds auto --path "$dir" --json 2>&1)
    echo "$res" > "$OUT/probe_${label}_$(basename "$(dirname "$dir")")_$(basename "$dir").json"
    local line
    line=$(printf '%s' "$res" | python3 "$OUT/summarize.py" probe 2>&1)
    printf '%-28s %-24s %s\n' "$label" "$dir" "$line" | tee -a "$OUT/gds_probe_matrix.txt"
  done
}
probe default
probe env_force_compat CUFILE_FORCE_COMPAT_MODE=true
probe json_compat CUFILE_ENV_PATH_JSON="$OUT/cufile_compat.json"
probe json_compat_poll CUFILE_ENV_PATH_JSON="$OUT/cufile_compat_poll.json"
probe json_force_compat CUFILE_ENV_PATH_JSON="$OUT/cufile_force_compat.json"
probe json_force_compat+env CUFILE_ENV_PATH_JSON="$OUT/cufile_force_compat.json" CUFILE_FORCE_COMPAT_MODE=true
probe json_nocompat CUFILE_ENV_PATH_JSON="$OUT/cufile_nocompat.json"
rmdir "$PROBE_DISK" "$PROBE_SHM" 2>/dev/null
"$T" iobench --probe --gds auto --path "$DISK_DIR" --path "$SHM_DIR" | tee "$OUT/probe.txt"

step "host tier (pinned arena) vs raw pinned cudaMemcpy"
"$T" iobench --tier host --size "$SIZE" --repeat "$REPEAT" --device cuda --queue-depth 1 4 --json > "$OUT/host_cuda.json"
"$T" iobench --tier host --size "$SIZE" --repeat "$REPEAT" --device cuda --queue-depth 1 4
"$T" iobench --tier host --size 1GiB --repeat 2 --device cuda --verify | tail -3

step "file tier on the disk, host (pinned) buffers: request size x queue depth"
"$T" iobench --path "$DISK_DIR" --size "$SIZE" --repeat "$REPEAT" --request 1MiB 16MiB --queue-depth 1 8 --json > "$OUT/file_disk_cpu.json"
python3 "$OUT/summarize.py" results "$OUT/file_disk_cpu.json"

step "file tier on the disk, device buffers (bounce ring), io_uring and threads"
"$T" iobench --path "$DISK_DIR" --size "$SIZE" --repeat "$REPEAT" --request 16MiB --queue-depth 8 --device cuda --json > "$OUT/file_disk_cuda_uring.json"
"$T" iobench --path "$DISK_DIR" --size "$SIZE" --repeat "$REPEAT" --request 16MiB --queue-depth 8 --device cuda
"$T" iobench --path "$DISK_DIR" --size "$SIZE" --repeat "$REPEAT" --request 16MiB --queue-depth 8 --device cuda --engine threads | tail -2
"$T" iobench --path "$DISK_DIR" --size 1GiB --repeat 1 --request 16MiB --queue-depth 8 --device cuda --verify --checksums | tail -2

step "file tier with GDS auto (falls back unless cuFile works)"
"$T" iobench --path "$DISK_DIR" --size 1GiB --repeat 2 --request 16MiB --device cuda --gds auto | tee "$OUT/file_disk_gds_auto.txt"

step "file tier on /dev/shm (tmpfs) and striped over disk + shm"
"$T" iobench --path "$SHM_DIR" --size "$SIZE" --repeat "$REPEAT" --request 16MiB --queue-depth 8 --device cuda --json > "$OUT/file_shm_cuda.json"
"$T" iobench --path "$SHM_DIR" --size "$SIZE" --repeat "$REPEAT" --request 16MiB --queue-depth 8 --device cuda
"$T" iobench --path "$DISK_DIR" --path "$SHM_DIR" --sweep-paths --size "$SIZE" --repeat "$REPEAT" --request 16MiB --queue-depth 8 --json > "$OUT/file_striped.json"
"$T" iobench --path "$DISK_DIR" --path "$SHM_DIR" --sweep-paths --size "$SIZE" --repeat "$REPEAT" --request 16MiB --queue-depth 8

step "leftovers (must be none)"
ls -d "$DISK_DIR"/teraio-iobench-* "$SHM_DIR"/teraio-iobench-* 2>/dev/null || echo "none"
echo "== done; results in $OUT"
