#include "core/error.h"

namespace fl {

void assert_failed(const char* condition, const char* file, int line) {
  throw Error(fmt::format("internal error: assertion `{}` failed at {}:{}", condition, file, line));
}

}  // namespace fl
