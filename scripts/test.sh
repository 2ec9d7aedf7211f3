#!/usr/bin/env bash
# Runs every test that needs no GPU: the release build with warnings as errors, the PyTorch
# integration on CPU (torch 2.11 from PyPI into the project's .venv, `pip install .`, pytest,
# `teraio-train` end to end and the libtorch example), the sanitizer builds (AddressSanitizer+UBSan
# for everything, ThreadSanitizer for the threaded storage and migration engines, the parallel plan
# search and the controller's searches in the background) and the format fuzzers for a bounded
# time. Every python3 it runs, the tests' included, is the .venv's (scripts/venv.sh; PYTHON=...
# overrides).
# Usage: scripts/test.sh [--quick]  (--quick: the release build's tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
source scripts/venv.sh
JOBS=${JOBS:-$(nproc)}
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1

echo "== release build (warnings are errors)"
cmake --preset ci >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build -L cpu --output-on-failure -j"$JOBS"

if ((quick)); then exit 0; fi

echo "== PyTorch integration on CPU (torch 2.11, pip install ., pytest)"
bash scripts/test_python.sh

echo "== teraio-train (libtorch) end to end"
cmake --preset torch -DPython3_EXECUTABLE="$PY" >/dev/null  # build-torch/, shared with train_demo.sh
cmake --build build-torch -j"$JOBS" --target teraio teraio-train
ctest --test-dir build-torch -R '^train_check$' --output-on-failure

echo "== examples/libtorch (a libtorch program under teraio::Session)"
cmake -S examples/libtorch -B build-example -G Ninja -DPython3_EXECUTABLE="$PY" >/dev/null
cmake --build build-example -j"$JOBS"
build-example/train_mlp --steps 4

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
cmake --preset asan >/dev/null
cmake --build build-asan -j"$JOBS"
ctest --test-dir build-asan -L cpu --output-on-failure -j"$JOBS"

echo "== ThreadSanitizer (the threaded storage engine, the migration engine, the parallel plan search, searches in the background)"
cmake --preset tsan >/dev/null
cmake --build build-tsan -j"$JOBS" --target storage_conformance_test storage_unit_test runtime_tests core_tests sim_tests \
  offload_tests
for t in storage_conformance_test storage_unit_test runtime_tests core_tests sim_tests; do
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/bin/$t --gtest_brief=1
done
# The controller's plans made again, searched in and outside the step (the link tests time real
# copies, which TSan slows past their figures: run without it above).
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build-tsan/bin/offload_tests --gtest_brief=1 \
  --gtest_filter='ControllerTest.APlanMadeAgain*:ControllerTest.APlanMadeForTheRecordedHost*'

if [[ -d fuzz ]]; then
  echo "== fuzzing the trace and plan readers (bounded)"
  cmake --preset fuzz >/dev/null
  cmake --build build-fuzz -j"$JOBS" --target fuzz_trace fuzz_plan
  for f in build-fuzz/bin/fuzz_*; do
    name=$(basename "$f")
    corpus=$(mktemp -d)
    cp fuzz/corpus/"${name#fuzz_}"/* "$corpus"/ 2>/dev/null || true
    "$f" -max_total_time="${FUZZ_SECONDS:-60}" -rss_limit_mb=2048 "$corpus" 2>&1 | tail -2
  done
fi
echo "== all tests passed"
