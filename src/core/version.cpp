// version(): the VERSION file's text, which the build passes as -DTERAIO_VERSION=MAJOR.MINOR.PATCH
// (a bare number, so that no quotes have to survive the generated command lines).
#include "teraio/version.h"

#ifndef TERAIO_VERSION
#error "TERAIO_VERSION must be defined by the build (CMake reads it from VERSION)"
#endif

#define TERAIO_STRINGIFY_(x) #x
#define TERAIO_STRINGIFY(x) TERAIO_STRINGIFY_(x)

namespace teraio {

const char* version() noexcept { return TERAIO_STRINGIFY(TERAIO_VERSION); }

}  // namespace teraio
