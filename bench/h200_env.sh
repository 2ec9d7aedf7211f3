# Sourced by the bench/h200_*.sh scripts on the GPU machine (repo root as working directory).
# Sets the environment every run needs and installs what the machine lacks, once per machine:
# the teraio Python package (built there against its torch; the headers and libraries it lacks come
# from build-gpudeps/, scripts/torch_gpu_deps.sh) and, when .whl/ was carried, the peers' wheels.
export PYTHONUNBUFFERED=1
# The machine's rules: NVLink multicast stays off (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
TORCH_LIB=$($PY -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
if [[ -d build-gpudeps ]]; then
  export CPATH="$PWD/build-gpudeps/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$PWD/build-gpudeps/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$PWD/build-gpudeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# Installs teraio unless this exact source tree was installed already on this machine.
ensure_teraio() {
  local stamp=/tmp/teraio-installed.sha
  local want
  want=$(cat src/*/*.cpp src/*/*.h src/*/CMakeLists.txt CMakeLists.txt cmake/*.cmake VERSION include/teraio/*.h python/teraio/*.py setup.py pybackend/*.py | sha1sum | cut -c1-16)
  if [[ -f $stamp && $(cat $stamp) == "$want" ]] && $PY -c 'import teraio._C' 2>/dev/null; then
    echo "teraio already installed ($want)"
    return 0
  fi
  local t0=$SECONDS
  TERAIO_CUDA=1 MAX_JOBS=${MAX_JOBS:-16} $PY -m pip install --no-build-isolation --no-deps -q . || return 1
  echo "$want" > $stamp
  echo "teraio built and installed in $((SECONDS - t0)) s"
}

# ensure_teraio with its output in LOG; when it fails, the log's last lines, and the script exits.
ensure_teraio_logged() {
  ensure_teraio > "$1" 2>&1 || { tail -20 "$1"; exit 1; }
}

# DeepSpeed and its missing dependencies (bench/peer_wheels.sh), when carried.
ensure_peers() {
  [[ -d .whl ]] || { echo "no .whl/: peers not installed"; return 1; }
  # shellcheck source=bench/peer_env.sh
  source bench/peer_env.sh
}
