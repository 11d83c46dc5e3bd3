#include "gguf_tokenizer_convert.h"

#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "core/mapped_file.h"
#include "text/tokenizer/tokenizer_gguf.h"

namespace fl::test {

namespace key = gguf_tokenizer_key;
using simdjson::dom::element;

// ---- the converter: tokenizer.json (+ tokenizer_config.json) -> tokenizer.ggml.* ----
//
// As llama.cpp's convert_hf_to_gguf.py lays the keys out:
//   byte-level BPE ("gpt2"): tokens (vocabulary, then added tokens; holes as "[PAD<id>]" of type
//     unused), token_type (added tokens: special -> control, others -> user-defined), merges as
//     "a b" strings, the pre-tokenizer by name; no scores.
//   SentencePiece ("llama"): tokens, token_type (<0xXX> -> byte), and scores. A tokenizer.json
//     holds ranked merges, not SentencePiece scores, so the score of a piece is minus the rank of
//     the first merge that makes it (Hugging Face derived those merges from the scores in the same
//     order); no merges.
// bos/eos ids come from tokenizer_config.json, add_bos/add_eos from the post-processor template.
std::vector<GgufMetadataEntry> convert_tokenizer(const std::string& dir, const ConvertOptions& opt) {
  simdjson::dom::parser parser;
  const simdjson::padded_string text(read_text_file(dir + "/tokenizer.json"));
  const element root = parser.parse(text);
  const element model = root["model"];

  std::map<int64_t, std::pair<std::string, GgufTokenType>> by_id;
  std::map<std::string, int64_t> id_of;
  for (auto field : model["vocab"].get_object()) {
    const int64_t id = field.value.get_int64();
    std::string token(field.key);
    GgufTokenType type = GgufTokenType::normal;
    if (opt.sentencepiece && token.size() == 6 && token.starts_with("<0x") && token.back() == '>')
      type = GgufTokenType::byte;
    id_of[token] = id;
    by_id[id] = {std::move(token), type};
  }
  for (element added : root["added_tokens"].get_array()) {
    const int64_t id = added["id"].get_int64();
    std::string content(std::string_view(added["content"].get_string()));
    const bool special = added["special"].get_bool();
    id_of[content] = id;
    by_id[id] = {std::move(content), special ? GgufTokenType::control : GgufTokenType::user_defined};
  }
  const int64_t n = by_id.rbegin()->first + 1;

  std::vector<GgufValue> tokens, types;
  for (int64_t id = 0; id < n; ++id) {
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      tokens.push_back(GgufValue::of_string(fmt::format("[PAD{}]", id)));
      types.push_back(GgufValue::of_i32(static_cast<int32_t>(GgufTokenType::unused)));
    } else {
      tokens.push_back(GgufValue::of_string(it->second.first));
      types.push_back(GgufValue::of_i32(static_cast<int32_t>(it->second.second)));
    }
  }

  std::vector<std::string> merges;
  for (element m : model["merges"].get_array()) {
    std::string_view s;
    if (m.get_string().get(s) == simdjson::SUCCESS) {
      merges.emplace_back(s);
    } else {
      simdjson::dom::array pair = m.get_array();
      merges.push_back(std::string(std::string_view(pair.at(0).get_string())) + " " +
                       std::string(std::string_view(pair.at(1).get_string())));
    }
  }

  std::vector<GgufMetadataEntry> md;
  auto add = [&](std::string_view k, GgufValue v) { md.push_back({std::string(k), std::move(v)}); };
  add(key::kModel, GgufValue::of_string(opt.sentencepiece ? "llama" : "gpt2"));
  add(key::kPre, GgufValue::of_string(opt.sentencepiece ? "default" : opt.pre));
  add(key::kTokens, GgufValue::of_array(GgufValueType::string, std::move(tokens)));
  if (opt.sentencepiece) {
    std::vector<float> score(static_cast<size_t>(n), -static_cast<float>(merges.size() + 1));
    std::vector<bool> made(static_cast<size_t>(n), false);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string& m = merges[rank];
      const size_t space = m.find(' ');
      const int64_t id = id_of.at(m.substr(0, space) + m.substr(space + 1));
      if (!made[id]) score[id] = -static_cast<float>(rank), made[id] = true;
    }
    std::vector<GgufValue> scores;
    for (float s : score) scores.push_back(GgufValue::of_f32(s));
    add(key::kScores, GgufValue::of_array(GgufValueType::f32, std::move(scores)));
  }
  add(key::kTokenType, GgufValue::of_array(GgufValueType::i32, std::move(types)));
  if (!opt.sentencepiece) {
    std::vector<GgufValue> items;
    for (std::string& m : merges) items.push_back(GgufValue::of_string(std::move(m)));
    add(key::kMerges, GgufValue::of_array(GgufValueType::string, std::move(items)));
  }
  std::string_view unk;
  if (model["unk_token"].get_string().get(unk) == simdjson::SUCCESS)
    add(key::kUnknownId, GgufValue::of_u32(static_cast<uint32_t>(id_of.at(std::string(unk)))));

  const auto config = nlohmann::json::parse(read_text_file(dir + "/tokenizer_config.json"));
  for (auto [name, k] : {std::pair{"bos_token", key::kBosId}, std::pair{"eos_token", key::kEosId}}) {
    if (!config.contains(name) || config[name].is_null()) continue;
    const auto& v = config[name];
    const std::string content = v.is_string() ? v.get<std::string>() : v.at("content").get<std::string>();
    add(k, GgufValue::of_u32(static_cast<uint32_t>(id_of.at(content))));
  }
  // TemplateProcessing [special, $A, special]: which ends get a token.
  bool add_bos = false, add_eos = false;
  element post;
  std::string_view post_type;
  if (root["post_processor"].get(post) == simdjson::SUCCESS && !post.is_null() &&
      post["type"].get_string().get(post_type) == simdjson::SUCCESS && post_type == "TemplateProcessing") {
    simdjson::dom::array single = post["single"].get_array();
    add_bos = single.at(0)["SpecialToken"].error() == simdjson::SUCCESS;
    add_eos = single.size() > 1 && single.at(single.size() - 1)["SpecialToken"].error() == simdjson::SUCCESS;
  }
  add(key::kAddBos, GgufValue::of_bool(add_bos));
  add(key::kAddEos, GgufValue::of_bool(add_eos));
  if (opt.sentencepiece) {
    // A Prepend("▁") normalizer is SentencePiece's add_dummy_prefix.
    const std::string normalizer = simdjson::to_string(root["normalizer"]);
    add(key::kAddSpacePrefix, GgufValue::of_bool(normalizer.find("Prepend") != std::string::npos));
  }
  return md;
}

// Writes metadata as a GGUF file with no tensors.
void write_gguf(const std::string& path, const std::vector<GgufMetadataEntry>& metadata) {
  GgufWriter layout;
  for (const GgufMetadataEntry& e : metadata) layout.add_metadata(e.key, e.value);
  GgufStreamWriter writer(path, layout);
  writer.finish(layout);
}

}  // namespace fl::test
