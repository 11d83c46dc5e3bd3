#pragma once
// The quantizer pipeline behind `fireline quantize`: reads any input io/import_source.h accepts,
// picks each tensor's format with the policy (quant/quant_policy.h) and writes a .fire file.
//
// Per tensor:
//   - an --override that matches decides the format;
//   - otherwise a tensor already in a fireline quantized format (Q8_0, HFQ4, HFQ6; e.g. from a
//     hipfire file or a .fire) keeps it and its bytes;
//   - otherwise the preset decides; integer tensors (i32, i64) are copied as they are.
// A tensor whose chosen format equals its input format is copied byte for byte; any other is
// decoded to f32 row by row and encoded with the registry's reference codec, rows in parallel.
//
// Memory: the input is memory-mapped and the output is produced in slabs of rows (at most
// kQuantizeSlabBytes of input or output at a time, and at least one row), each written and hashed
// before the next; the input pages a slab used are released from the mapping once it is done. So
// the resident set is about one slab plus one f32 row per thread, whatever the model's size.
//
// The header is computed before any data is written (every tensor's size is known from its shape
// and format); the sha256 is filled into a fixed-size placeholder at the end. The output appears
// under its name only when complete (written to OUT.partial, renamed at the end).
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "quant/quant_policy.h"

namespace fl {

class ThreadPool;

inline constexpr uint64_t kQuantizeSlabBytes = 64ull << 20;

struct QuantizeProgress {
  uint64_t bytes_done = 0;   // input bytes processed
  uint64_t bytes_total = 0;  // input bytes of all tensors
  size_t tensor_index = 0;   // the tensor being processed (0-based)
  size_t tensor_count = 0;
  std::string_view tensor_name;
};

struct QuantizeOptions {
  QuantPolicy policy;
  std::string hf_config_dir;  // GGUF inputs without embedded config (see open_import_source)
  ThreadPool* pool = nullptr;  // null: ThreadPool::global()
  uint64_t slab_bytes = kQuantizeSlabBytes;  // tests make it small to cover many slabs per tensor
  std::function<void(const QuantizeProgress&)> progress;  // called after every slab
};

struct FormatTotals {
  DType dtype;
  size_t tensors = 0;
  uint64_t bytes = 0;     // bytes in the output
  uint64_t elements = 0;  // weights
};

struct QuantizeReport {
  std::string output_path;
  std::string source_kind;
  size_t tensor_count = 0;
  uint64_t file_bytes = 0;
  std::string tensor_sha256;
  std::vector<FormatTotals> formats;  // ordered by DType
  std::vector<std::string> warnings;  // e.g. tensors re-quantized from a quantized input
};

// Throws fl::Error (naming the input, tensor or option) before writing anything when the input,
// policy or a needed codec is missing; an error while writing removes the partial output.
QuantizeReport quantize_model(const std::string& input, const std::string& output, const QuantizeOptions& options);
// The same from an already opened source (e.g. import_model_source of a synthetic model).
class ImportSource;
QuantizeReport quantize_model(const ImportSource& source, const std::string& output, const QuantizeOptions& options);

}  // namespace fl
