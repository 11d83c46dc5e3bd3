#pragma once
// The quantizer's policy: which weight format each tensor of a checkpoint gets (DESIGN §4).
//
//   rank-1 tensors (norms, scales) and anything that is not a 2-D or 3-D weight    F32
//   short convolution taps (*conv1d.weight: [channels, 1, 4] in Qwen3.5)            F32
//   token embeddings (*embed_tokens.weight, *embed_tokens_per_layer.weight; the
//   tied LM head is the embedding)                                                 Q8_0
//   2-D weights and 3-D expert stacks, by preset:
//     hf4 (default)  HFQ4-G256 when K % 256 == 0, else HFQ4-G128
//     hf6            HFQ6-G256 when K % 256 == 0, else HFQ4-G128
//     q8             Q8_0       (embeddings too)
//     bf16 / f16 / f32   that plain type (embeddings too)
//
// K is the innermost (row) extent. Per-tensor overrides `PATTERN=FORMAT` match the full tensor
// name with a shell glob (`*` matches any run of characters, dots included); the last matching
// override wins. FORMAT is a preset name (hf4/hf6 still choose by K) or a format name (q8_0,
// hfq4_g256, hfq4_g128, hfq6_g256, bf16, f16, f32).
//
// Pure functions of names and shapes: no I/O (the pipeline that reads and writes files is
// io/quantize_model.h).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace fl {

// Bumped whenever the bytes the quantizer writes for the same input and policy change.
inline constexpr int kQuantizerVersion = 1;

enum class QuantPreset { hf4, hf6, q8, bf16, f16, f32 };

std::optional<QuantPreset> parse_quant_preset(std::string_view name);
std::string_view quant_preset_name(QuantPreset preset);

struct QuantOverride {
  std::string pattern;
  std::string format;  // a preset name or a DType name with a quant format
};

struct QuantPolicy {
  QuantPreset preset = QuantPreset::hf4;
  std::vector<QuantOverride> overrides;
};

// "PATTERN=FORMAT"; throws fl::Error naming what is wrong (no '=', empty pattern, unknown format).
QuantOverride parse_quant_override(std::string_view spec);

// True when `format` names a preset or a weight format (whether or not its codec has landed).
bool is_quant_format_name(std::string_view format);
// The DType `format` means for rows of k elements (hf4/hf6 choose by k as the presets do).
DType resolve_quant_format(std::string_view format, int64_t k);

bool is_embedding_tensor(std::string_view name);
// Per-channel filters with a handful of taps: a block format would spend a whole block on 4 values.
bool is_small_filter_tensor(std::string_view name);
// Shell-glob match of the whole name (fnmatch without FNM_PATHNAME).
bool glob_match(std::string_view pattern, std::string_view name);

struct FormatChoice {
  DType dtype;
  int override_index = -1;  // the override that decided, or -1 for the preset
};

// `shape` in PyTorch order (outermost first).
FormatChoice choose_tensor_format(const QuantPolicy& policy, std::string_view name, std::span<const int64_t> shape);
// The preset's choice alone (no overrides).
DType preset_tensor_format(QuantPreset preset, std::string_view name, std::span<const int64_t> shape);

}  // namespace fl
