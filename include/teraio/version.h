// teraio's version, "MAJOR.MINOR.PATCH". It is written once, in the VERSION file at the repository
// root: CMake's project version and setup.py's package version are read from it, and both builds
// compile it into version() (`teraio --version`, `teraio.__version__`).
#pragma once

namespace teraio {

// Thread-safe; the string is static.
const char* version() noexcept;

}  // namespace teraio
