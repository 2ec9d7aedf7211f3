#!/usr/bin/env bash
# Collects, into build-gpudeps/ (or the folder given), the headers and shared libraries that
# `pip install .` needs and the GPU machine lacks (it has torch, CUDA, CMake and a compiler, but not
# libsimdjson-dev/liburing-dev/libxxhash-dev). bench/h200_env.sh and bench/torch_gpu.sh put it on
# CPATH, LIBRARY_PATH and LD_LIBRARY_PATH when present (carry it to the GPU machine); CMake's Python
# configuration finds simdjson and liburing there. The ctest python_configure uses it too.
# Usage: scripts/torch_gpu_deps.sh [FOLDER]
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-build-gpudeps}
rm -rf "$D" && mkdir -p "$D/include" "$D/lib"
cp /usr/include/simdjson.h /usr/include/liburing.h /usr/include/xxhash.h "$D/include/"
cp -r /usr/include/liburing "$D/include/"
for lib in libsimdjson.so.14 liburing.so.2; do
  p=$(ldconfig -p | awk -v l="$lib" '$1 == l && !p {print $NF; p = 1}')  # no early exit: SIGPIPE under pipefail
  cp -L "$p" "$D/lib/"
  ln -sf "$lib" "$D/lib/${lib%%.so*}.so"
done
du -sh "$D"
