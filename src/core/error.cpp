// Out-of-line throw for TERAIO_INTERNAL_ASSERT, so the macro stays small at every call site.
#include "teraio/error.h"

namespace teraio::detail {

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(fmt::format("internal error at {}:{}: {} ({}); please report this bug", file,
                                  line, msg, cond));
}

}  // namespace teraio::detail
