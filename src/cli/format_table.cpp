#include "cli/format_table.h"

#include <fmt/format.h>

#include "cli/progress.h"

namespace fl::cli {

std::string format_table(const std::vector<FormatTotals>& formats) {
  auto bits = [](uint64_t bytes, uint64_t elements) {
    return elements ? fmt::format("{:.2f}", 8.0 * static_cast<double>(bytes) / static_cast<double>(elements))
                    : std::string("-");
  };
  std::string out = fmt::format("{:<10} {:>8} {:>14} {:>14} {:>10} {:>11}\n", "format", "tensors", "weights", "bytes",
                                "size", "bits/weight");
  FormatTotals total{DType::f32};
  for (const FormatTotals& f : formats) {
    out += fmt::format("{:<10} {:>8} {:>14} {:>14} {:>10} {:>11}\n", dtype_name(f.dtype), f.tensors, f.elements,
                       f.bytes, human_bytes(f.bytes), bits(f.bytes, f.elements));
    total.tensors += f.tensors;
    total.elements += f.elements;
    total.bytes += f.bytes;
  }
  out += fmt::format("{:<10} {:>8} {:>14} {:>14} {:>10} {:>11}\n", "total", total.tensors, total.elements, total.bytes,
                     human_bytes(total.bytes), bits(total.bytes, total.elements));
  return out;
}

}  // namespace fl::cli
