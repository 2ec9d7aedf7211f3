"""What CMake builds, read from the CMakeLists.txt files, for setup.py (stdlib only).

setup.py compiles the extension teraio._C with torch.utils.cpp_extension rather than through CMake
(the GPU machine has torch, CUDA and a compiler but not the Debian packages CMake's configure looks
for). So that the two builds cannot drift, setup.py takes from here what CMake is told: the sources
of each `teraio_<module>` library (`add_library(teraio_<module> STATIC a.cpp ...)` in
src/<module>/CMakeLists.txt), the libraries each one links (the `teraio_<module>` names in its
`target_link_libraries`), the definitions of `teraio_torch`, and the warning flags of
`teraio_warnings` (the top-level CMakeLists.txt). A ctest (setup_reads_cmake, tests/pybuild)
checks these against the targets CMake configured.

Only literal file names are understood in those commands (no variables or generator
expressions); anything else raises CMakeReadError naming the file.
"""
from __future__ import annotations

import os
import re

# The interface libraries that are not modules (flags, an imported liburing).
_NOT_MODULES = {"teraio_warnings", "teraio_liburing"}


class CMakeReadError(RuntimeError):
    pass


def _commands(path: str, name: str) -> list[list[str]]:
    """The argument lists of every `name(...)` call in the CMake file `path` (comments dropped)."""
    with open(path) as f:
        text = "\n".join(line.split("#", 1)[0] for line in f)
    return [m.group(1).split() for m in re.finditer(rf"\b{name}\s*\(([^)]*)\)", text)]


def _module_file(root: str, module: str) -> str:
    return os.path.join(root, "src", module, "CMakeLists.txt")


def library_sources(root: str, module: str) -> list[str]:
    """The sources of teraio_<module>, as paths relative to root."""
    path = _module_file(root, module)
    for args in _commands(path, "add_library"):
        if args[:2] == [f"teraio_{module}", "STATIC"]:
            files = args[2:]
            bad = [f for f in files if not re.fullmatch(r"[\w./-]+\.(cpp|cu)", f)]
            if not files or bad:
                raise CMakeReadError(f"{path}: add_library(teraio_{module} STATIC ...) must list "
                                     f"its source files literally (found {bad or 'none'})")
            return [os.path.join("src", module, f) for f in files]
    raise CMakeReadError(f"{path}: no add_library(teraio_{module} STATIC ...) found")


def library_deps(root: str, module: str) -> list[str]:
    """The teraio modules teraio_<module> links (public and private), in the order written."""
    deps: list[str] = []
    for args in _commands(_module_file(root, module), "target_link_libraries"):
        if args and args[0] == f"teraio_{module}":
            for a in args[1:]:
                if a.startswith("teraio_") and a not in _NOT_MODULES and a[7:] not in deps:
                    deps.append(a[7:])
    return deps


def linked_modules(root: str, top: str) -> list[str]:
    """`top` and every module it links, directly or not; each after the modules it links."""
    order: list[str] = []

    def visit(m: str, path: tuple) -> None:
        if m in path:
            raise CMakeReadError(f"module dependency cycle: {' -> '.join(path + (m,))}")
        if m in order:
            return
        for d in library_deps(root, m):
            visit(d, path + (m,))
        order.append(m)

    visit(top, ())
    return order


def compile_definitions(root: str, module: str) -> list[str]:
    """The literal definitions of target_compile_definitions(teraio_<module> PRIVATE|PUBLIC ...)."""
    out: list[str] = []
    for args in _commands(_module_file(root, module), "target_compile_definitions"):
        if args and args[0] == f"teraio_{module}":
            out += [a for a in args[1:] if a not in ("PRIVATE", "PUBLIC", "INTERFACE")]
    return out


def warning_flags(root: str) -> list[str]:
    """The options of teraio_warnings (the top-level CMakeLists.txt), -Werror not among them."""
    path = os.path.join(root, "CMakeLists.txt")
    for args in _commands(path, "target_compile_options"):
        if args[:2] == ["teraio_warnings", "INTERFACE"]:
            return args[2:]
    raise CMakeReadError(f"{path}: no target_compile_options(teraio_warnings INTERFACE ...) found")


if __name__ == "__main__":  # ROOT MODULE...: "module|sources|deps" per module (tests/pybuild)
    import sys

    for m in sys.argv[2:]:
        print(m, ";".join(library_sources(sys.argv[1], m)), ";".join(library_deps(sys.argv[1], m)),
              sep="|")
