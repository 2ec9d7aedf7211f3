# Builds the teraio Python package and its native extension teraio._C against the installed torch
# (torch.utils.cpp_extension). The extension compiles src/torch/python.cpp and the libraries CMake's
# teraio_torch links (src/torch, runtime, storage, planner, sim, trace, core), with the source lists,
# definitions and warning flags read from the CMakeLists.txt files (pybackend/teraio_cmake.py; the
# ctest setup_reads_cmake checks that reading), so no CMake run is needed and the two builds agree.
# System libraries: simdjson, liburing (Debian: libsimdjson-dev liburing-dev); fmt comes with torch.
# TERAIO_CUDA=1/0 forces CUDA support on/off; by default it is on when torch sees a GPU at build
# time and a CUDA toolkit is found.
import os
import sys

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "pybackend"))
import teraio_cmake  # noqa: E402

with open(os.path.join(ROOT, "VERSION")) as f:
    VERSION = f.readline().strip()  # the one place the version is written (CMake reads it too)
MODULES = teraio_cmake.linked_modules(ROOT, "torch")  # each after the ones it links

sources = ["src/torch/python.cpp"]  # the pybind11 module; the rest as CMake builds it
for m in MODULES:
    sources += teraio_cmake.library_sources(ROOT, m)

want_cuda = os.environ.get("TERAIO_CUDA", "auto")
if want_cuda == "auto":
    use_cuda = torch.version.cuda is not None and CUDA_HOME is not None and torch.cuda.is_available()
else:
    use_cuda = want_cuda == "1"

# teraio_torch's definitions in src/torch/CMakeLists.txt, for every source here (the CUDA one is
# decided below): NDEBUG (RecordFunction::inputs() asserts in debug builds) and FMT_HEADER_ONLY
# (torch ships its own fmt headers, which shadow the system ones; header-only use keeps one fmt).
# TERAIO_HAVE_LIBURING: the file tier's io_uring engine (liburing is linked below); without it every
# Python FileTier fell back to the thread engine.
# TERAIO_VERSION: teraio::version() (src/core/version.cpp), `teraio.__version__`.
define_macros = [tuple(d.split("=", 1)) if "=" in d else (d, None)
                 for d in teraio_cmake.compile_definitions(ROOT, "torch") if not d.startswith("TERAIO_")]
define_macros += [("TERAIO_HAVE_LIBURING", "1"), ("TERAIO_VERSION", VERSION)]
include_dirs = [os.path.join(ROOT, "include")] + [os.path.join(ROOT, "src", m) for m in MODULES]
libraries = ["simdjson", "uring", "dl"]
extra_args = ["-std=c++20", "-O2", "-fvisibility=hidden"]
library_dirs = []
if use_cuda:
    define_macros += [("TERAIO_TORCH_CUDA", "1"), ("TERAIO_HAVE_CUDA", "1")]
    include_dirs.append(os.path.join(CUDA_HOME, "include"))
    # cupti.h (src/torch/kernel_timer.cpp) when the toolkit lacks it: the CUDA wheels torch depends
    # on ship it; searched after everything else (-idirafter), so it never shadows the toolkit.
    for wheel in ("cu13", "cuda_cupti"):
        inc = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", wheel, "include")
        if os.path.exists(os.path.join(inc, "cupti.h")):
            extra_args += ["-idirafter", inc]
            break
    library_dirs.append(os.path.join(CUDA_HOME, "lib64"))
    libraries += ["c10_cuda", "torch_cuda", "cudart"]

ext = CppExtension(
    "teraio._C",
    sources,
    include_dirs=include_dirs,
    define_macros=define_macros,
    libraries=libraries,
    library_dirs=library_dirs,
    # CMake's RelWithDebInfo optimisation (without -g) and its warnings (teraio_warnings).
    extra_compile_args=extra_args + teraio_cmake.warning_flags(ROOT),
)

setup(
    name="teraio",
    version=VERSION,
    description="Lifetime-aware tensor offloading for PyTorch training",
    package_dir={"": "python"},
    packages=["teraio", "teraio.integrations"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    options={"build": {"build_base": "build-py"}},
)
