#!/usr/bin/env bash
# Runs every test that needs no GPU: the release build with warnings as errors, the sanitizer builds
# (AddressSanitizer+UBSan for everything, ThreadSanitizer for the threaded storage engine) and the
# format fuzzers for a bounded time. Usage: scripts/test.sh [--quick]  (--quick: release build only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
JOBS=${JOBS:-$(nproc)}
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1

echo "== release build (warnings are errors)"
cmake --preset ci >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build -L cpu --output-on-failure -j"$JOBS"

if ((quick)); then exit 0; fi

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
cmake --preset asan >/dev/null
cmake --build build-asan -j"$JOBS"
ctest --test-dir build-asan -L cpu --output-on-failure -j"$JOBS"

if [[ -d tests/storage ]]; then
  echo "== ThreadSanitizer (storage engine)"
  cmake --preset tsan >/dev/null
  cmake --build build-tsan -j"$JOBS" --target storage_tests
  TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-tsan -L cpu -R '^Storage|^storage' --output-on-failure -j"$JOBS"
fi

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
