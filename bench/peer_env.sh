# Environment for the peer systems of bench/llm_bench.py on the GPU machine (no network).
# `source bench/peer_env.sh` from the repository root, after bench/peer_wheels.sh filled .whl/ on a
# machine with network and .whl was carried over. It
#   1. installs .whl/*.whl (deepspeed built with DS_BUILD_OPS=0, pydantic & co.) into $PEER_SITE
#      (default /tmp/site) and puts it first on PYTHONPATH;
#   2. points the compiler, the linker and the loader at .whl/libaio, for DeepSpeed's async_io op
#      (ZeRO-Infinity's NVMe swapping), which is JIT-compiled at first use:
#        CFLAGS/LDFLAGS   read by op_builder's has_function('io_submit', ('aio',)) test (is_compatible)
#        CPATH/LIBRARY_PATH  read by gcc itself during torch.utils.cpp_extension.load (ninja), whose
#                         command lines carry '-laio' but no -I/-L for libaio
#        LD_LIBRARY_PATH  for the loader when the built async_io .so (NEEDED libaio.so.1) is imported;
#                         it must be set before python starts, hence here
#   3. sets DS_SKIP_CUDA_CHECK=1: DeepSpeed's op builder refuses a CUDA toolkit whose major.minor differs
#      from torch's (13.0 here) unless both are in its table of minor-compatible versions, which has
#      no CUDA 13 row in 0.19.8;
#   4. prints one-line checks. PEER_PREBUILD=1 also JIT-builds cpu_adam and async_io now (about a
#      minute each with 16 cores; cached in $TORCH_EXTENSIONS_DIR), PEER_DS_REPORT=1 runs ds_report.
# Variables: PYTHON (default python3), PEER_SITE, PEER_PREBUILD, PEER_DS_REPORT.
# Written to be sourced (no `set -e`: it would end the calling shell); it returns non-zero on failure.

_peer_env() {
  local py=${PYTHON:-python3}
  local root=$PWD
  local site=${PEER_SITE:-/tmp/site}
  local aio=$root/.whl/libaio
  if ! ls "$root"/.whl/deepspeed-*.whl >/dev/null 2>&1; then
    echo "peer_env: no .whl/deepspeed-*.whl under $root (run bench/peer_wheels.sh where there is network, carry .whl)" >&2
    return 1
  fi
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$root"/.whl/*.whl 2>&1 | grep -v -e "Running pip as the 'root' user" -e "^WARNING: Target directory" || true
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"               # ds_report, deepspeed launcher scripts
  if [[ -f $aio/include/libaio.h ]]; then
    # links may not survive the transfer: make sure libaio.so (for -laio) and the soname exist
    [[ -e $aio/lib/libaio.so ]] || cp "$(ls "$aio"/lib/libaio.so.* | head -1)" "$aio/lib/libaio.so"
    export CFLAGS="-I$aio/include${CFLAGS:+ $CFLAGS}"
    export LDFLAGS="-L$aio/lib${LDFLAGS:+ $LDFLAGS}"
    export CPATH="$aio/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$aio/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$aio/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "peer_env: no $aio/include/libaio.h: async_io (ds-infinity) will not build unless libaio-dev is installed" >&2
  fi
  # async_io links -lcuda: the driver may ship only libcuda.so.1; the toolkit's stub satisfies the link
  local cuda_home=${CUDA_HOME:-/usr/local/cuda}
  if [[ -d $cuda_home/lib64/stubs ]] && ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libcuda\.so '; then
    export LIBRARY_PATH="${LIBRARY_PATH:+$LIBRARY_PATH:}$cuda_home/lib64/stubs"
  fi
  export DS_SKIP_CUDA_CHECK=1
  # DeepSpeed's op builder parses TORCH_CUDA_ARCH_LIST as numbers: the H200 machine's "9.0a" (or a
  # "+PTX" list) fails its JIT build of async_io with "invalid literal for int(): '0a'"; 9.0 builds
  # the same kernels for sm_90 (the ops here have no arch-specific code).
  if [[ ${TORCH_CUDA_ARCH_LIST:-} == *a* ]]; then
    export TORCH_CUDA_ARCH_LIST=$(echo "$TORCH_CUDA_ARCH_LIST" | sed -E 's/([0-9]+\.[0-9]+)a/\1/g')
  fi
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
  "$py" - <<'EOF'
import os, sys
ok = True
def line(name, fn):
    global ok
    try:
        print(f"peer_env: {name:<28} {fn()}")
    except Exception as e:  # one line per check, keep going
        ok = False
        print(f"peer_env: {name:<28} FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
import torch
line("python / torch", lambda: f"{sys.version.split()[0]} / {torch.__version__} cuda={torch.version.cuda} "
     f"available={torch.cuda.is_available()}")
line("setuptools+distutils", lambda: (__import__("setuptools"), __import__("distutils.ccompiler"))[0].__version__)
line("pydantic", lambda: __import__("pydantic").VERSION)
line("deepspeed", lambda: (lambda d: f"{d.__version__} from {os.path.dirname(d.__file__)}")(__import__("deepspeed")))
def acc():
    from deepspeed.accelerator import get_accelerator
    return get_accelerator()._name
line("deepspeed accelerator", acc)
def builder(name):
    from deepspeed.accelerator import get_accelerator
    return get_accelerator().create_op_builder(name)
line("ninja", lambda: (__import__("torch.utils.cpp_extension").utils.cpp_extension.verify_ninja_availability(), "ok")[1])
line("cpu_adam compatible", lambda: builder("CPUAdamBuilder").is_compatible(verbose=True))
line("async_io compatible", lambda: builder("AsyncIOBuilder").is_compatible(verbose=True))
if os.environ.get("PEER_PREBUILD") == "1":
    import time
    for name in ("CPUAdamBuilder", "AsyncIOBuilder"):
        t = time.time()
        line(f"{name} JIT build", lambda: f"{builder(name).load(verbose=False)} in {time.time() - t:.0f} s")
sys.exit(0 if ok else 1)
EOF
  local rc=$?
  if [[ ${PEER_DS_REPORT:-0} == 1 ]]; then "$py" -m deepspeed.env_report; fi
  return $rc
}
_peer_env
