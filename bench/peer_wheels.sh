#!/usr/bin/env bash
# Fetch, on a machine with network, what the GPU machine lacks to run the peer systems of
# bench/llm_bench.py (DeepSpeed and its dependencies, libaio for DeepSpeed's async_io op), into .whl/
# at the repository root (git-ignored). Then carry .whl to the GPU machine and `source bench/peer_env.sh`.
#
# - deepspeed: PyPI ships only an sdist; a wheel is built here with DS_BUILD_OPS=0 (pure Python, no
#   op is precompiled: cpu_adam and async_io are JIT-built with ninja on the GPU machine at first use,
#   into ~/.cache/torch_extensions). Building needs torch importable here (setup.py imports it).
# - its dependencies that the GPU venv lacks, as cp312 manylinux / py3-none-any wheels.
#   typing_extensions is included because pydantic 2.14 needs a recent one and PYTHONPATH puts it
#   ahead of the venv's.
# - libaio (headers + shared library) from the distribution's packages via apt-get download, extracted
#   into .whl/libaio/ with symlinks replaced by copies (links may not survive the transfer).
#   Debian 12 ships libaio1 (soname libaio.so.1, needs only GLIBC_2.4) which runs on Ubuntu 24.04;
#   Ubuntu 24.04's own package is libaio1t64 (soname libaio.so.1t64, same ABI on amd64). Whichever
#   this machine offers is taken.
# Idempotent: the files of these packages are removed before they are fetched again, so .whl/ holds
# exactly one version of each. Usage: bash bench/peer_wheels.sh   (the project's .venv, with torch
# from scripts/install_torch.sh; PYTHON=... to choose another python: scripts/venv.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
W=.whl
DS_VERSION=${DS_VERSION:-0.19.8}
# pinned so that the set is reproducible; pydantic 2.14.4 requires pydantic-core==2.50.5 exactly
PURE=(pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 hjson==3.1.0)
BINARY=(pydantic-core==2.50.5)
mkdir -p "$W"
rm -f "$W"/deepspeed-*.whl "$W"/pydantic-*.whl "$W"/pydantic_core-*.whl "$W"/annotated_types-*.whl \
      "$W"/typing_inspection-*.whl "$W"/typing_extensions-*.whl "$W"/hjson-*.whl
rm -rf "$W/libaio"

echo "== deepspeed $DS_VERSION: wheel built from the sdist, DS_BUILD_OPS=0"
"$PY" -c "import torch" || { echo "torch must be importable by $PY to build the deepspeed wheel:" \
  "run scripts/install_torch.sh --no-teraio" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# setuptools < 70 has no bdist_wheel of its own: borrow the `wheel` package for this build only
if ! "$PY" -c "import setuptools.command.bdist_wheel" 2>/dev/null && ! "$PY" -c "import wheel" 2>/dev/null; then
  "$PY" -m pip install -q --target "$tmp/bw" wheel
  export PYTHONPATH="$tmp/bw${PYTHONPATH:+:$PYTHONPATH}"
fi
# nothing is compiled; DS_BUILD_OPS=0 keeps every op JIT
DS_BUILD_OPS=0 DS_BUILD_STRING="" "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-binary deepspeed \
  "deepspeed==$DS_VERSION" -w "$tmp"
cp "$tmp"/deepspeed-*.whl "$W"/

echo "== dependencies (cp312 manylinux x86_64 / py3-none-any)"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$W" "${PURE[@]}" "${BINARY[@]}"

echo "== libaio"
( cd "$tmp"
  apt-get download libaio-dev 2>/dev/null
  apt-get download libaio1t64 2>/dev/null || apt-get download libaio1 )
mkdir -p "$W/libaio"
for deb in "$tmp"/libaio*.deb; do dpkg -x "$deb" "$tmp/x"; done
cp -L -r "$tmp/x/usr/include" "$W/libaio/"
mkdir -p "$W/libaio/lib"
# copies, not links: libaio.so (for -laio) and the soname the linked op will ask for
cp -L "$tmp"/x/usr/lib/x86_64-linux-gnu/libaio.so* "$W/libaio/lib/"
soname=$(readelf -d "$W/libaio/lib/libaio.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[[ -f "$W/libaio/lib/$soname" ]] || cp "$W/libaio/lib/libaio.so" "$W/libaio/lib/$soname"
ls "$tmp"/libaio*.deb | xargs -n1 basename > "$W/libaio/SOURCE"
echo "soname $soname" >> "$W/libaio/SOURCE"

echo "== .whl/"
ls -la "$W" "$W/libaio/lib"
du -sh "$W"
