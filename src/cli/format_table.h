#pragma once
// The per-format table that `quantize` and `show` print: tensors, weights, bytes and bits per
// weight for each storage format, and a total row.
#include <string>
#include <vector>

#include "io/quantize_model.h"

namespace fl::cli {

std::string format_table(const std::vector<FormatTotals>& formats);

}  // namespace fl::cli
