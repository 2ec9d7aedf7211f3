"""setup.py's reading of the CMakeLists.txt files (pybackend/teraio_cmake.py) against what CMake
configured (cmake_targets.txt, written by tests/pybuild/CMakeLists.txt): for every teraio_<module>
library, the same source files and the same teraio_* libraries linked. Also: the modules the
extension compiles are those teraio_torch links, and the warning flags are found.
Usage: check_setup_reads_cmake.py ROOT cmake_targets.txt"""
import os
import sys

root, targets = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "pybackend"))
import teraio_cmake as tc  # noqa: E402

failures = []
checked = 0
for line in open(targets):
    if not line.strip():
        continue
    module, sources, libs = line.rstrip("\n").split("|")
    want_src = sorted(os.path.basename(s) for s in sources.split(";") if s)
    got_src = sorted(os.path.basename(s) for s in tc.library_sources(root, module))
    if want_src != got_src:
        failures.append(f"teraio_{module}: CMake compiles {want_src}, setup.py would read {got_src}")
    want_deps = sorted(l[7:] for l in libs.split(";") if l.startswith("teraio_") and l not in tc._NOT_MODULES)
    got_deps = sorted(tc.library_deps(root, module))
    if want_deps != got_deps:
        failures.append(f"teraio_{module}: CMake links {want_deps}, setup.py would read {got_deps}")
    checked += 1

ext = tc.linked_modules(root, "torch")
for m in ("torch", "runtime", "storage", "core"):
    if m not in ext:
        failures.append(f"the extension's modules {ext} lack {m}")
if ext[-1] != "torch" or ext.index("core") > ext.index("storage"):
    failures.append(f"the extension's modules are not in link order: {ext}")
if "-Wall" not in tc.warning_flags(root):
    failures.append(f"teraio_warnings' flags read as {tc.warning_flags(root)}")
if checked < 5:
    failures.append(f"only {checked} teraio_* libraries in {targets}")
for f in failures:
    print("FAIL:", f)
print(f"{checked} libraries checked; extension modules: {' '.join(ext)}")
sys.exit(1 if failures else 0)
