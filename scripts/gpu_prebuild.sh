#!/usr/bin/env bash
# Builds teraio here for the GPU machine, which has CUDA, CMake and PyTorch but none of the Debian
# libraries teraio uses and no package registry: Release binaries go to build-gpu/bin and the shared
# libraries they need (fmt, simdjson, liburing, GLPK) to build-gpu/lib. Both are carried to the GPU
# machine (glibc and libstdc++ there are newer, so binaries built here run there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
B=${1:-build-gpu-full}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERAIO_BUILD_BENCH=ON >/dev/null
cmake --build "$B" -j"${JOBS:-$(nproc)}"
rm -rf build-gpu && mkdir -p build-gpu/bin build-gpu/lib
for f in "$B"/bin/*; do
  [[ -x "$f" && -f "$f" ]] && strip -o "build-gpu/bin/$(basename "$f")" "$f"
done
for lib in libfmt.so.9 libsimdjson.so.14 liburing.so.2 libglpk.so.40 libbenchmark.so.1debian \
           libamd.so.2 libcolamd.so.2 libsuitesparseconfig.so.5 libgmp.so.10 libltdl.so.7 \
           libcudart.so.13; do
  p=$(ldd "build-gpu/bin/teraio" "build-gpu/bin/storage_gpu_test" 2>/dev/null | awk -v l="$lib" '$1 == l {print $3}' | head -n1 || true)
  if [[ -n "$p" ]]; then cp -L "$p" build-gpu/lib/; fi
done
du -sh build-gpu
