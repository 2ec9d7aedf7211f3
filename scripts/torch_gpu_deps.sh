#!/usr/bin/env bash
# Collects, into build-gpudeps/, the headers and shared libraries that `pip install .` needs and
# the GPU machine lacks (it has torch, CUDA and a compiler, but not libsimdjson-dev/liburing-dev).
# bench/torch_gpu.sh uses build-gpudeps/ when present (carry it to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
D=build-gpudeps
rm -rf "$D" && mkdir -p "$D/include" "$D/lib"
cp /usr/include/simdjson.h /usr/include/liburing.h /usr/include/xxhash.h "$D/include/"
cp -r /usr/include/liburing "$D/include/"
for lib in libsimdjson.so.14 liburing.so.2; do
  p=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
  cp -L "$p" "$D/lib/"
  ln -sf "$lib" "$D/lib/${lib%%.so*}.so"
done
du -sh "$D"
