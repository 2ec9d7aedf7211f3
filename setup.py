# Builds the teraio Python package and its native extension teraio._C. The extension is a target of
# the project's CMake build (teraio_python, src/torch/CMakeLists.txt): build_ext configures CMake's
# Python configuration (-DTERAIO_PYTHON=ON: the module and the libraries it links, against the torch
# of this Python; no fmt, CLI11 or GLPK needed) in build-py/cmake-cpu or build-py/cmake-cuda, builds
# it (MAX_JOBS parallel jobs, default: all cores) and copies the module where setuptools expects it
# (pybackend/teraio_cmake.py has the commands). The build directory is kept, so a rebuild compiles
# only what changed. Needs CMake 3.25+, a C++20 compiler, simdjson and liburing (Debian:
# libsimdjson-dev liburing-dev, or their headers on CPATH and libraries on LIBRARY_PATH).
# TERAIO_CUDA=1/0 forces CUDA support on/off; by default it is on when torch sees a GPU at build
# time and a CUDA toolkit is found.
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

import torch
from torch.utils.cpp_extension import CUDA_HOME

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "pybackend"))
import teraio_cmake  # noqa: E402

with open(os.path.join(ROOT, "VERSION")) as f:
    VERSION = f.readline().strip()  # the one place the version is written (CMake reads it too)


def use_cuda() -> bool:
    want = os.environ.get("TERAIO_CUDA", "auto")
    if want == "auto":
        return torch.version.cuda is not None and CUDA_HOME is not None and torch.cuda.is_available()
    if want not in ("0", "1"):
        sys.exit(f"setup.py: TERAIO_CUDA={want}: use 1, 0 or auto")
    return want == "1"


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        cuda = use_cuda()
        build = teraio_cmake.build_dir(ROOT, cuda)
        jobs = int(os.environ["MAX_JOBS"]) if os.environ.get("MAX_JOBS") else os.cpu_count()
        try:
            teraio_cmake.forget_moved(build, ROOT)
            torch_dir = os.path.dirname(torch.__file__)
            for step, cmd in (("configure", teraio_cmake.configure_command(ROOT, build, sys.executable, torch_dir,
                                                                           cuda, CUDA_HOME)),
                              ("build", teraio_cmake.build_command(build, jobs))):
                print(" ".join(cmd), flush=True)
                if subprocess.call(cmd) != 0:
                    sys.exit(f"setup.py: CMake {step} of teraio._C failed (see above; build directory {build})")
            built = teraio_cmake.module_file(build)
        except teraio_cmake.CMakeBuildError as e:
            sys.exit(f"setup.py: {e}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)


setup(
    name="teraio",
    version=VERSION,
    description="Lifetime-aware tensor offloading for PyTorch training",
    package_dir={"": "python"},
    packages=["teraio", "teraio.integrations"],
    ext_modules=[Extension("teraio._C", sources=[])],  # built by CMake (CMakeBuild)
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    options={"build": {"build_base": "build-py"}},
)
