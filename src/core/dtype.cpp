#include "core/dtype.h"

#include <array>

#include "core/error.h"

namespace fl {
namespace {
constexpr std::array<DTypeTraits, 10> kTraits = {{
    {"f32", 1, 4, false},
    {"f16", 1, 2, false},
    {"bf16", 1, 2, false},
    {"i32", 1, 4, false},
    {"i64", 1, 8, false},
    {"u8", 1, 1, false},
    {"q8_0", 32, 34, true},
    {"hfq4_g256", 256, 136, true},
    {"hfq4_g128", 128, 72, true},
    {"hfq6_g256", 256, 200, true},
}};
}  // namespace

bool is_known_dtype(DType type) { return static_cast<size_t>(type) < kTraits.size(); }

const DTypeTraits& dtype_traits(DType type) {
  auto index = static_cast<size_t>(type);
  FL_ASSERT(index < kTraits.size());
  return kTraits[index];
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < kTraits.size(); ++i)
    if (kTraits[i].name == name) return static_cast<DType>(i);
  return std::nullopt;
}

}  // namespace fl
