#include "io/quantize_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/sha256.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/fire_file.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/import_source.h"
#include "quant/quant.h"

namespace fl {
namespace {

struct Plan {
  const ImportTensor* input;
  std::vector<int64_t> shape;  // as stored (0-dim inputs become [1])
  DType target;
  bool copy;  // bytes as they are
  size_t index;
};

bool is_integer_type(std::optional<DType> dtype) { return dtype == DType::i32 || dtype == DType::i64; }

std::vector<Plan> plan_tensors(const ImportSource& source, const QuantPolicy& policy, std::vector<std::string>& warnings) {
  std::vector<bool> override_used(policy.overrides.size(), false);
  std::vector<Plan> plans;
  for (const ImportTensor& t : source.tensors()) {
    Plan p{&t, t.shape.empty() ? std::vector<int64_t>{1} : t.shape, DType::f32, false, plans.size()};
    FormatChoice choice = choose_tensor_format(policy, t.name, p.shape);
    if (choice.override_index >= 0) override_used[choice.override_index] = true;
    const bool quantized_input = t.dtype && dtype_traits(*t.dtype).quantized;
    if (is_integer_type(t.dtype)) {
      if (choice.override_index >= 0)
        fail("--override '{}={}' matches '{}', an integer ({}) tensor that cannot be quantized",
             policy.overrides[choice.override_index].pattern, policy.overrides[choice.override_index].format, t.name,
             t.type_name);
      p.target = *t.dtype;
    } else if (choice.override_index < 0 && quantized_input) {
      p.target = *t.dtype;  // already quantized in a fireline format: keep its bytes
    } else {
      p.target = choice.dtype;
      // Inputs in a lossy format (a fireline one, or one fireline only decodes such as Q4_K)
      // quantized again carry the errors of both formats.
      const bool lossy_input = quantized_input || !t.dtype;
      if (lossy_input && p.target != t.dtype && dtype_traits(p.target).quantized)
        warnings.push_back(fmt::format("'{}' re-quantized from {} to {}: the errors of both formats add up", t.name,
                                       t.type_name, dtype_name(p.target)));
    }
    p.copy = t.dtype == p.target;
    if (!p.copy) {
      if (!t.decode_row) fail("{}: tensor '{}' ({}) cannot be decoded", source.path(), t.name, t.type_name);
      if (!has_quant_format(p.target))
        fail("tensor '{}' needs format {}, which this build of fireline cannot write yet (its codec has not landed "
             "in the quant registry); choose another --format or --override",
             t.name, dtype_name(p.target));
    }
    plans.push_back(std::move(p));
  }
  for (size_t i = 0; i < policy.overrides.size(); ++i)
    if (!override_used[i])
      fail("--override '{}={}' matches no tensor", policy.overrides[i].pattern, policy.overrides[i].format);
  return plans;
}

std::string quantizer_json(const ImportSource& source, const QuantPolicy& policy) {
  nlohmann::ordered_json j;
  j["quantizer"] = "fireline";
  j["version"] = kQuantizerVersion;
  j["preset"] = std::string(quant_preset_name(policy.preset));
  j["overrides"] = nlohmann::ordered_json::array();
  for (const QuantOverride& o : policy.overrides) j["overrides"].push_back({{"pattern", o.pattern}, {"format", o.format}});
  j["source_kind"] = source.kind();
  j["source"] = std::filesystem::path(source.path()).lexically_normal().filename().string();
  if (j["source"].get<std::string>().empty())  // a directory given with a trailing slash
    j["source"] = std::filesystem::path(source.path()).lexically_normal().parent_path().filename().string();
  return j.dump();
}

// What a .fire keeps of tokenizer_config.json: the bos/eos tokens (a string, or an AddedToken
// object's content), which tokenizers and chat templates read. The rest (added_tokens_decoder, a
// second copy of the chat template) is large and unused. Empty when there is nothing to keep; a
// config that is not valid JSON is left out with a warning rather than failing the conversion.
std::string reduced_tokenizer_config(const std::string& text, std::vector<std::string>& warnings) {
  if (text.empty()) return {};
  auto config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    warnings.push_back("tokenizer_config.json is not a JSON object; its bos/eos tokens are not kept");
    return {};
  }
  nlohmann::ordered_json kept = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token"}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->is_string())
      kept[key] = *it;
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      kept[key] = (*it)["content"];
    else if (it->is_null())
      kept[key] = nullptr;
  }
  return kept.empty() ? std::string() : kept.dump();
}

// Decodes and encodes rows [row_begin, row_end) of `p` into `out` (rows back to back).
void convert_rows(const Plan& p, int64_t row_begin, int64_t row_end, uint8_t* out, ThreadPool& pool) {
  const ImportTensor& t = *p.input;
  const int64_t k = t.cols();
  const int64_t out_row = row_bytes(p.target, k);
  const QuantFormat& codec = quant_format(p.target);
  pool.parallel_for(row_end - row_begin, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t src_row = row_begin + r;
      t.decode_row(t.data + src_row * t.row_bytes, row.data(), k);
      codec.quantize_row(row.data(), out + r * out_row, k);
    }
  });
}

}  // namespace

QuantizeReport quantize_model(const std::string& input, const std::string& output, const QuantizeOptions& options) {
  std::unique_ptr<ImportSource> source = open_import_source(input, options.hf_config_dir);
  if (std::filesystem::exists(input) && std::filesystem::exists(output) &&
      std::filesystem::equivalent(input, output))
    fail("the output {} is the input; write to another file", output);
  return quantize_model(*source, output, options);
}

QuantizeReport quantize_model(const ImportSource& imported, const std::string& output, const QuantizeOptions& options) {
  // Found now, not by the rename at the end of a run that may take an hour.
  if (std::error_code ec; std::filesystem::is_directory(output, ec))
    fail("the output {} is a directory; name the .fire file to write", output);
  const ImportSource* source = &imported;
  ModelConfig config = parse_hf_config_text(source->hf_config_json(), source->path() + " (config.json)");

  QuantizeReport report;
  report.output_path = output;
  report.source_kind = source->kind();
  std::vector<Plan> plans = plan_tensors(*source, options.policy, report.warnings);
  if (plans.empty()) fail("{}: no tensors to write", source->path());

  GgufWriter layout(kFireAlignment);
  layout.add_metadata(std::string(fire_key::kArchitecture), GgufValue::of_string(config.architecture));
  std::string name = std::filesystem::path(output).stem().string();
  if (!name.empty()) layout.add_metadata(std::string(fire_key::kName), GgufValue::of_string(name));
  layout.add_metadata(std::string(fire_key::kHfConfig), GgufValue::of_string(source->hf_config_json()));
  if (!source->tokenizer_json().empty())
    layout.add_metadata(std::string(fire_key::kTokenizerJson), GgufValue::of_string(source->tokenizer_json()));
  if (std::string kept = reduced_tokenizer_config(source->tokenizer_config_json(), report.warnings); !kept.empty())
    layout.add_metadata(std::string(fire_key::kTokenizerConfig), GgufValue::of_string(std::move(kept)));
  for (const GgufMetadataEntry& e : source->gguf_tokenizer_metadata()) layout.add_metadata(e.key, e.value);
  if (!source->generation_config_json().empty())
    layout.add_metadata(std::string(fire_key::kGenerationConfig),
                        GgufValue::of_string(source->generation_config_json()));
  if (!source->chat_template().empty())
    layout.add_metadata(std::string(fire_key::kChatTemplate), GgufValue::of_string(source->chat_template()));
  layout.add_metadata(std::string(fire_key::kQuantizer), GgufValue::of_string(quantizer_json(*source, options.policy)));
  // A placeholder of the final length, overwritten once the data is hashed.
  layout.add_metadata(std::string(fire_key::kTensorSha256), GgufValue::of_string(std::string(64, '0')));
  for (const Plan& p : plans) layout.add_tensor(p.input->name, gguf_type_id(p.target), p.shape);

  uint64_t total_in = 0;
  for (const Plan& p : plans) total_in += p.input->nbytes;

  ThreadPool& pool = options.pool ? *options.pool : ThreadPool::global();
  const uint64_t slab_bytes = std::max<uint64_t>(1, options.slab_bytes);
  GgufStreamWriter writer(output, layout);
  Sha256 hash;
  std::map<DType, FormatTotals> totals;
  uint64_t done_in = 0;
  std::vector<uint8_t> slab;
  for (const Plan& p : plans) {
    const ImportTensor& t = *p.input;
    const GgufTensorInfo& info = layout.tensor(p.index);
    FormatTotals& total = totals.try_emplace(p.target, FormatTotals{p.target}).first->second;
    total.tensors += 1;
    total.bytes += info.nbytes();
    total.elements += static_cast<uint64_t>(t.numel());
    auto report_progress = [&](uint64_t in_bytes) {
      done_in += in_bytes;
      if (options.progress) options.progress({done_in, total_in, p.index, plans.size(), t.name});
    };

    if (p.copy) {
      FL_ASSERT(t.nbytes == info.nbytes());
      for (uint64_t at = 0; at < t.nbytes; at += slab_bytes) {
        const uint64_t n = std::min(slab_bytes, t.nbytes - at);
        writer.write_tensor_bytes(p.index, t.data + at, n);
        hash.update(t.data + at, n);
        release_mapped_pages(t.data + at, n);
        report_progress(n);
      }
      if (t.nbytes == 0) report_progress(0);
      continue;
    }
    const int64_t rows = t.rows();
    const int64_t out_row = row_bytes(p.target, t.cols());
    const int64_t widest_row = std::max<int64_t>({1, out_row, t.row_bytes});
    const int64_t rows_per_slab = std::max<int64_t>(1, static_cast<int64_t>(slab_bytes) / widest_row);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_slab) {
      const int64_t r1 = std::min(rows, r0 + rows_per_slab);
      slab.resize(static_cast<size_t>((r1 - r0) * out_row));
      convert_rows(p, r0, r1, slab.data(), pool);
      writer.write_tensor_bytes(p.index, slab.data(), slab.size());
      hash.update(slab.data(), slab.size());
      release_mapped_pages(t.data + r0 * t.row_bytes, static_cast<size_t>((r1 - r0) * t.row_bytes));
      report_progress(static_cast<uint64_t>((r1 - r0) * t.row_bytes));
    }
    if (rows == 0) report_progress(0);
  }

  report.tensor_sha256 = hash.hex_digest();
  GgufWriter final_layout = layout;
  final_layout.replace_metadata(fire_key::kTensorSha256, GgufValue::of_string(report.tensor_sha256));
  writer.finish(final_layout);

  report.tensor_count = plans.size();
  report.file_bytes = final_layout.total_size();
  for (auto& [dtype, t] : totals) report.formats.push_back(t);
  return report;
}

}  // namespace fl
