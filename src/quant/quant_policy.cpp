#include "quant/quant_policy.h"

#include <fnmatch.h>

#include "core/error.h"

namespace fl {
namespace {

constexpr std::pair<std::string_view, QuantPreset> kPresets[] = {
    {"hf4", QuantPreset::hf4}, {"hf6", QuantPreset::hf6}, {"q8", QuantPreset::q8},
    {"bf16", QuantPreset::bf16}, {"f16", QuantPreset::f16}, {"f32", QuantPreset::f32},
};

// Formats an override may name directly (the weight formats; not i32/i64/u8).
constexpr DType kWeightFormats[] = {DType::f32,       DType::f16,       DType::bf16,     DType::q8_0,
                                    DType::hfq4_g256, DType::hfq4_g128, DType::hfq6_g256};

std::optional<DType> weight_format_from_name(std::string_view name) {
  for (DType d : kWeightFormats)
    if (dtype_name(d) == name) return d;
  return std::nullopt;
}

DType preset_weight_format(QuantPreset preset, int64_t k) {
  switch (preset) {
    case QuantPreset::hf4: return k % 256 == 0 ? DType::hfq4_g256 : DType::hfq4_g128;
    case QuantPreset::hf6: return k % 256 == 0 ? DType::hfq6_g256 : DType::hfq4_g128;
    case QuantPreset::q8: return DType::q8_0;
    case QuantPreset::bf16: return DType::bf16;
    case QuantPreset::f16: return DType::f16;
    case QuantPreset::f32: return DType::f32;
  }
  FL_ASSERT(false);
}

}  // namespace

std::optional<QuantPreset> parse_quant_preset(std::string_view name) {
  for (auto& [n, p] : kPresets)
    if (n == name) return p;
  return std::nullopt;
}

std::string_view quant_preset_name(QuantPreset preset) {
  for (auto& [n, p] : kPresets)
    if (p == preset) return n;
  FL_ASSERT(false);
}

bool is_quant_format_name(std::string_view format) {
  return parse_quant_preset(format).has_value() || weight_format_from_name(format).has_value();
}

DType resolve_quant_format(std::string_view format, int64_t k) {
  if (auto preset = parse_quant_preset(format)) return preset_weight_format(*preset, k);
  if (auto dtype = weight_format_from_name(format)) return *dtype;
  fail("'{}' is not a weight format (hf4, hf6, q8, bf16, f16, f32, q8_0, hfq4_g256, hfq4_g128, hfq6_g256)", format);
}

QuantOverride parse_quant_override(std::string_view spec) {
  const size_t eq = spec.rfind('=');
  if (eq == std::string_view::npos) fail("--override '{}' is not PATTERN=FORMAT", spec);
  QuantOverride o{std::string(spec.substr(0, eq)), std::string(spec.substr(eq + 1))};
  if (o.pattern.empty()) fail("--override '{}' has an empty pattern", spec);
  if (!is_quant_format_name(o.format))
    fail("--override '{}': '{}' is not a weight format (hf4, hf6, q8, bf16, f16, f32, q8_0, hfq4_g256, hfq4_g128, "
         "hfq6_g256)",
         spec, o.format);
  return o;
}

bool is_embedding_tensor(std::string_view name) {
  return name.ends_with("embed_tokens.weight") || name.ends_with("embed_tokens_per_layer.weight");
}

bool is_small_filter_tensor(std::string_view name) { return name.ends_with("conv1d.weight"); }

bool glob_match(std::string_view pattern, std::string_view name) {
  return ::fnmatch(std::string(pattern).c_str(), std::string(name).c_str(), 0) == 0;
}

DType preset_tensor_format(QuantPreset preset, std::string_view name, std::span<const int64_t> shape) {
  const bool weight = shape.size() == 2 || shape.size() == 3;
  if (!weight || is_small_filter_tensor(name)) return DType::f32;
  if (is_embedding_tensor(name) && (preset == QuantPreset::hf4 || preset == QuantPreset::hf6)) return DType::q8_0;
  return preset_weight_format(preset, shape.back());
}

FormatChoice choose_tensor_format(const QuantPolicy& policy, std::string_view name, std::span<const int64_t> shape) {
  const int64_t k = shape.empty() ? 1 : shape.back();
  for (int i = static_cast<int>(policy.overrides.size()) - 1; i >= 0; --i) {
    const QuantOverride& o = policy.overrides[i];
    if (glob_match(o.pattern, name)) return {resolve_quant_format(o.format, k), i};
  }
  return {preset_tensor_format(policy.preset, name, shape), -1};
}

}  // namespace fl
