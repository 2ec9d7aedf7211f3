// teraio's version, "MAJOR.MINOR.PATCH". It is written once, in the VERSION file at the repository
// root: CMake's project version and setup.py's package version are read from it, and CMake compiles
// it into version() for the `teraio` command and the extension teraio._C alike (`teraio --version`,
// `teraio.__version__`; setup.py has CMake build the extension).
#pragma once

namespace teraio {

// Thread-safe; the string is static.
const char* version() noexcept;

}  // namespace teraio
