#include "runtime/generation_config.h"

#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fl {
namespace {

using nlohmann::json;

int32_t token_id(const json& v, std::string_view source, const char* key) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
    fail("{}: {} must hold non-negative token ids, found {}", source, key, v.dump());
  return v.get<int32_t>();
}

std::vector<int32_t> token_ids(const json& v, std::string_view source, const char* key) {
  std::vector<int32_t> ids;
  if (v.is_array()) {
    for (const auto& e : v) ids.push_back(token_id(e, source, key));
  } else if (!v.is_null()) {
    ids.push_back(token_id(v, source, key));
  }
  return ids;
}

float number(const json& v, std::string_view source, const char* key) {
  if (!v.is_number()) fail("{}: {} must be a number, found {}", source, key, v.dump());
  return v.get<float>();
}

}  // namespace

GenerationDefaults parse_generation_config(std::string_view json_text, const std::vector<int32_t>& fallback_eos,
                                           std::string_view source) {
  GenerationDefaults d;
  d.eos_ids = fallback_eos;
  if (json_text.empty()) return d;
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) fail("{} is not a JSON object", source);

  if (j.contains("eos_token_id")) {
    std::vector<int32_t> eos = token_ids(j["eos_token_id"], source, "eos_token_id");
    if (!eos.empty()) d.eos_ids = std::move(eos);
  }
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null()) d.bos_id = token_id(j["bos_token_id"], source, "bos_token_id");

  SamplingParams& s = d.sampling;
  auto get = [&](const char* key) -> const json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (auto v = get("temperature")) s.temperature = number(*v, source, "temperature");
  if (auto v = get("top_k")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > std::numeric_limits<int>::max())
      fail("{}: top_k must be a non-negative integer, found {}", source, v->dump());
    s.top_k = v->get<int>();
  }
  if (auto v = get("top_p")) s.top_p = number(*v, source, "top_p");
  if (auto v = get("min_p")) s.min_p = number(*v, source, "min_p");
  if (auto v = get("repetition_penalty")) s.repetition_penalty = number(*v, source, "repetition_penalty");
  if (auto v = get("do_sample")) {
    if (!v->is_boolean()) fail("{}: do_sample must be true or false, found {}", source, v->dump());
    if (!v->get<bool>()) s.temperature = 0.0f;  // transformers: do_sample=False is greedy search
  }
  if (auto v = get("suppress_tokens"))
    for (int32_t id : token_ids(*v, source, "suppress_tokens"))
      s.logit_bias.emplace_back(id, -std::numeric_limits<float>::infinity());
  try {
    s.validate();
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
  return d;
}

}  // namespace fl
