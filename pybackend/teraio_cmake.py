"""How setup.py builds the extension teraio._C with CMake (stdlib only; tests/pybuild uses it too).

The extension is a target of the project's CMake build (src/torch/CMakeLists.txt, teraio_python),
configured with -DTERAIO_PYTHON=ON: the module and the libraries it links, against the torch of
the Python that runs setup.py, and nothing that needs fmt, CLI11 or GLPK (the GPU machine has none
of them and no package registry). The build directory is kept between builds (build-py/cmake-cpu or
build-py/cmake-cuda), so a second `pip install .` compiles only what changed.
"""
from __future__ import annotations

import glob
import os
import shutil
import sysconfig


class CMakeBuildError(RuntimeError):
    pass


def _tool(name: str) -> str | None:
    """`name` on PATH, else the one of its PyPI package (`pip install cmake`/`ninja`), if any."""
    found = shutil.which(name)
    if found:
        return found
    try:
        mod = __import__(name)
    except ImportError:
        return None
    for attr in ("CMAKE_BIN_DIR", "BIN_DIR"):
        path = os.path.join(getattr(mod, attr, ""), name)
        if os.path.isfile(path):
            return path
    return None


def cmake() -> str:
    path = _tool("cmake")
    if path is None:
        raise CMakeBuildError("cmake not found: install CMake 3.25 or newer (Debian: cmake, "
                              "scripts/bootstrap.sh) and build again")
    return path


def build_dir(root: str, cuda: bool) -> str:
    return os.path.join(root, "build-py", "cmake-cuda" if cuda else "cmake-cpu")


def forget_moved(build: str, root: str) -> None:
    """Removes `build` when its CMake cache belongs to another source tree (a moved or copied
    checkout): CMake refuses to configure such a directory."""
    cache = os.path.join(build, "CMakeCache.txt")
    if not os.path.exists(cache):
        return
    with open(cache) as f:
        for line in f:
            if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="):
                if os.path.realpath(line.split("=", 1)[1].strip()) != os.path.realpath(root):
                    shutil.rmtree(build)
                return


def configure_command(root: str, build: str, python: str, torch_dir: str, cuda: bool,
                      cuda_home: str | None = None) -> list[str]:
    """The `cmake` configure command of the Python configuration (Release, like `--preset torch`)."""
    cmd = [cmake(), "-S", root, "-B", build, "-DTERAIO_PYTHON=ON", "-DCMAKE_BUILD_TYPE=Release",
           f"-DPython3_EXECUTABLE={python}", f"-DTERAIO_TORCH_DIR={torch_dir}",
           f"-DTERAIO_CUDA={'ON' if cuda else 'OFF'}"]
    if cuda and cuda_home:
        cmd.append(f"-DCUDAToolkit_ROOT={cuda_home}")
    # The generator is chosen once per build directory (CMake refuses another one later).
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")) and _tool("ninja"):
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"]
    return cmd


def build_command(build: str, jobs: int | None) -> list[str]:
    cmd = [cmake(), "--build", build, "--target", "teraio_python"]
    if jobs:
        cmd += ["-j", str(jobs)]
    return cmd


def module_file(build: str) -> str:
    """The module CMake built (src/torch/CMakeLists.txt puts it in <build>/python/)."""
    want = os.path.join(build, "python", "_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.isfile(want):
        found = glob.glob(os.path.join(build, "python", "_C*.so"))
        raise CMakeBuildError(f"CMake built no {want} (found: {found or 'nothing'})")
    return want
