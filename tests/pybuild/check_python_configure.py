"""The Python extension's CMake configuration, configured as setup.py configures it (the commands of
pybackend/teraio_cmake.py) on a machine like the GPU machine: no fmt, CLI11, GLPK, nlohmann/json,
GoogleTest or Google Benchmark, no pkg-config, and simdjson and liburing only as headers on CPATH
and libraries on LIBRARY_PATH (scripts/torch_gpu_deps.sh's folder, as bench/h200_env.sh sets them;
the system's copies are hidden from CMake's searches). Checks that it configures and what it would
compile and link: the module teraio._C from python.cpp with CMake's warning flags, fmt header-only
from torch, io_uring on, simdjson and liburing from that folder, libtorch_python; CUDA off with
TERAIO_CUDA=OFF and, where a CUDA toolkit and a CUDA torch are present, on with TERAIO_CUDA=ON.
Usage: check_python_configure.py ROOT WORKDIR. Exit 77 (skipped) when this Python has no torch."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

root, work = sys.argv[1], sys.argv[2]
try:
    import torch
except ImportError:
    print("no torch in", sys.executable, "- skipped")
    sys.exit(77)
sys.path.insert(0, os.path.join(root, "pybackend"))
import teraio_cmake as tc  # noqa: E402

torch_dir = os.path.dirname(torch.__file__)
shutil.rmtree(work, ignore_errors=True)
deps = os.path.join(work, "gpudeps")
subprocess.run(["bash", os.path.join(root, "scripts", "torch_gpu_deps.sh"), deps], check=True,
               stdout=subprocess.DEVNULL)
env = dict(os.environ, CPATH=os.path.join(deps, "include"), LIBRARY_PATH=os.path.join(deps, "lib"))
absent = ["fmt", "CLI11", "simdjson", "PkgConfig", "nlohmann_json", "GTest", "benchmark"]
hidden = ["/usr/include", "/usr/local/include", "/usr/lib", "/usr/lib/x86_64-linux-gnu",
          "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/local/lib"]
emulate = [f"-DCMAKE_DISABLE_FIND_PACKAGE_{p}=ON" for p in absent] + ["-DCMAKE_IGNORE_PATH=" + ";".join(hidden)]

failures = []


def configure(cuda):
    build = os.path.join(work, "cuda" if cuda else "cpu")
    cmd = tc.configure_command(root, build, sys.executable, torch_dir, cuda) + emulate
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        failures.append(f"configure (CUDA {cuda}) failed:\n{r.stdout[-3000:]}")
        return None
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        cache = f.read()
    for var in ("fmt_DIR", "CLI11_DIR", "GLPK_LIBRARY", "GLPK_INCLUDE_DIR", "nlohmann_json_DIR", "GTest_DIR"):
        if f"\n{var}:" in cache:
            failures.append(f"the Python configuration looked for {var}")
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = {os.path.relpath(c["file"], root): c["command"] for c in json.load(f)}
    with open(os.path.join(build, "build.ninja")) as f:
        ninja = f.read()
    return commands, ninja


def expect(what, text, present=(), absent=()):
    for s in present:
        if s not in text:
            failures.append(f"{what}: no `{s}`")
    for s in absent:
        if s in text:
            failures.append(f"{what}: unexpected `{s}`")


suffix = sysconfig.get_config_var("EXT_SUFFIX")
torch_lib = os.path.join(torch_dir, "lib")
got = configure(False)
if got:
    commands, ninja = got
    expect("python.cpp", commands.get("src/torch/python.cpp", ""),
           present=["-DFMT_HEADER_ONLY", "-DTORCH_EXTENSION_NAME=_C", "-DTORCH_API_INCLUDE_EXTENSION_H",
                    f"-isystem {torch_dir}/include", "-Wall", "-Wshadow", "-fvisibility=hidden", "-std=c++20",
                    "-DNDEBUG"],
           absent=["TERAIO_TORCH_CUDA"])
    expect("session.cpp", commands.get("src/torch/session.cpp", ""), absent=["TERAIO_TORCH_CUDA"])
    expect("storage", commands.get("src/storage/file_uring.cpp", ""),
           present=["-DTERAIO_HAVE_LIBURING=1", "-DFMT_HEADER_ONLY"], absent=["TERAIO_HAVE_CUDA"])
    expect("core", commands.get("src/core/version.cpp", ""), present=["-DTERAIO_VERSION="])
    for src in ("src/synth/synth.cpp", "src/exact/exact.cpp", "src/report/report.cpp", "tools/main.cpp"):
        if src in commands:
            failures.append(f"the Python configuration compiles {src}")
    expect("build.ninja", ninja,
           present=[f"python/_C{suffix}", f"{deps}/lib/libsimdjson.so", f"{deps}/lib/liburing.so",
                    f"{torch_lib}/libtorch_python.so", f"{torch_lib}/libtorch_cpu.so"],
           absent=["libc10_cuda.so", "libcudart"])

cuda_home = tc._tool("nvcc")
if cuda_home and os.path.exists(os.path.join(torch_lib, "libc10_cuda.so")):
    got = configure(True)
    if got:
        commands, ninja = got
        expect("session.cpp (CUDA)", commands.get("src/torch/session.cpp", ""), present=["-DTERAIO_TORCH_CUDA=1"])
        expect("cuda_rt.cpp (CUDA)", commands.get("src/storage/cuda_rt.cpp", ""), present=["-DTERAIO_HAVE_CUDA=1"])
        expect("build.ninja (CUDA)", ninja,
               present=[f"{torch_lib}/libc10_cuda.so", f"{torch_lib}/libtorch_cuda.so", "libcudart"])
    print("CUDA variant configured")
else:
    print("no nvcc or no CUDA torch: CUDA variant not configured")

for f in failures:
    print("FAIL:", f)
print("python configuration:", "FAILED" if failures else "ok")
sys.exit(1 if failures else 0)
