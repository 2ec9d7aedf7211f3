# Builds the teraio Python package and its native extension teraio._C against the installed torch
# (torch.utils.cpp_extension). The extension compiles the torch-free teraio libraries it needs
# (core, trace, planner, storage, runtime) together with src/torch, so no CMake build is needed.
# System libraries: simdjson, liburing (Debian: libsimdjson-dev liburing-dev); fmt comes with torch.
# TERAIO_CUDA=1/0 forces CUDA support on/off; by default it is on when torch sees a GPU at build
# time and a CUDA toolkit is found.
import glob
import os

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(ROOT, "VERSION")) as f:
    VERSION = f.readline().strip()  # the one place the version is written (CMake reads it too)
MODULES = ["core", "trace", "planner", "sim", "storage", "runtime", "offload"]


def rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


sources = rel(glob.glob(os.path.join(ROOT, "src/torch/*.cpp")))
for m in MODULES:
    sources += rel(glob.glob(os.path.join(ROOT, "src", m, "*.cpp")))

want_cuda = os.environ.get("TERAIO_CUDA", "auto")
if want_cuda == "auto":
    use_cuda = torch.version.cuda is not None and CUDA_HOME is not None and torch.cuda.is_available()
else:
    use_cuda = want_cuda == "1"

# NDEBUG: RecordFunction::inputs() asserts in debug builds. FMT_HEADER_ONLY: torch ships its own
# fmt headers, which shadow the system ones; header-only use keeps one fmt version in the module.
# TERAIO_HAVE_LIBURING: the file tier's io_uring engine (liburing is linked below); without it every
# Python FileTier fell back to the thread engine.
# TERAIO_VERSION: teraio::version() (src/core/version.cpp), `teraio.__version__`.
define_macros = [("NDEBUG", None), ("FMT_HEADER_ONLY", None), ("TERAIO_HAVE_LIBURING", "1"),
                 ("TERAIO_VERSION", VERSION)]
include_dirs = [os.path.join(ROOT, "include")] + [os.path.join(ROOT, "src", m) for m in MODULES]
libraries = ["simdjson", "uring", "dl"]
library_dirs = []
if use_cuda:
    define_macros += [("TERAIO_TORCH_CUDA", "1"), ("TERAIO_HAVE_CUDA", "1")]
    include_dirs.append(os.path.join(CUDA_HOME, "include"))
    library_dirs.append(os.path.join(CUDA_HOME, "lib64"))
    libraries += ["c10_cuda", "torch_cuda", "cudart"]

ext = CppExtension(
    "teraio._C",
    sources,
    include_dirs=include_dirs,
    define_macros=define_macros,
    libraries=libraries,
    library_dirs=library_dirs,
    extra_compile_args=["-std=c++20", "-O2", "-fvisibility=hidden"],
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
