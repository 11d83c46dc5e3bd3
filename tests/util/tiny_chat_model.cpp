#include "util/tiny_chat_model.h"

#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/test_util.h"

namespace fl::test::tiny {
namespace {

using nlohmann::ordered_json;

const char* const kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's word boundary

// The characters of `s` (UTF-8 aware).
std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace

std::string tokenizer_json() {
  ordered_json vocab = ordered_json::object();
  ordered_json added = ordered_json::array();
  std::map<std::string, int32_t> ids;
  auto add_token = [&](const std::string& token) {
    if (ids.count(token)) return false;
    const int32_t id = static_cast<int32_t>(ids.size());
    ids[token] = id;
    vocab[token] = id;
    return true;
  };
  auto add_special = [&](const std::string& token) {
    added.push_back({{"id", static_cast<int32_t>(ids.size())}, {"content", token}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
    add_token(token);
  };
  for (const char* t : {"<pad>", "<eos>", "<bos>", "<unk>"}) add_special(t);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add_token(name);
  }
  for (const char* t : {"<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>", "<|tool_call>", "<tool_call|>",
                        "<|tool_response>", "<tool_response|>", "<|\"|>", "<|tool>", "<tool|>"})
    add_special(t);
  if (ids.at("<tool|>") != kToolClose) throw std::logic_error("tiny tokenizer: special ids moved");

  std::string singles = std::string(kSpace) + "\n";
  for (char c = 'a'; c <= 'z'; ++c) singles += c;
  for (char c = 'A'; c <= 'Z'; ++c) singles += c;
  for (char c = '0'; c <= '9'; ++c) singles += c;
  singles += ".,!?'\":;-()";
  for (const auto& c : chars_of(singles)) add_token(c);

  // Merges build words left to right ("▁" + "t" -> "▁t", "▁t" + "h" -> "▁th", ...) until the
  // vocabulary has exactly kVocab tokens.
  ordered_json merges = ordered_json::array();
  auto add_word = [&](const std::string& word) {
    std::vector<std::string> cs = chars_of(word);
    std::string cur = cs[0];
    for (size_t i = 1; i < cs.size() && static_cast<int32_t>(ids.size()) < kVocab; ++i) {
      if (add_token(cur + cs[i])) merges.push_back({cur, cs[i]});
      cur += cs[i];
    }
  };
  std::vector<std::string> words;
  for (const char* w : {"the", "and", "to", "of", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
                        "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by",
                        "Hello", "hello", "world", "sky", "blue", "Why", "why", "story", "once", "upon", "time", "there",
                        "lived", "little", "fox", "dog", "cat", "sun", "moon", "star", "light", "day", "night", "tell",
                        "me", "about", "what", "how", "think", "answer", "red", "green", "sea", "tree"})
    words.push_back(std::string(kSpace) + w);
  for (const char* w : {"user", "model", "system", "thought"}) words.push_back(w);
  for (const auto& w : words) add_word(w);
  for (char c = 'a'; c <= 'z' && static_cast<int32_t>(ids.size()) < kVocab; ++c) add_word(std::string(kSpace) + c);
  for (char a = 'a'; a <= 'z' && static_cast<int32_t>(ids.size()) < kVocab; ++a)
    for (char b = 'a'; b <= 'z' && static_cast<int32_t>(ids.size()) < kVocab; ++b) add_word(std::string(1, a) + b);
  if (static_cast<int32_t>(ids.size()) != kVocab) throw std::logic_error("tiny tokenizer: wrong vocabulary size");

  ordered_json bos_piece = {{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}};
  ordered_json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, bos_piece, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {kBos}}, {"tokens", {"<bos>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  return tok.dump(1);
}

std::string generation_config_json() {
  ordered_json j = {{"bos_token_id", kBos},
                    {"do_sample", true},
                    {"eos_token_id", {kEos, kTurnClose, kToolResponseOpen}},
                    {"pad_token_id", kPad},
                    {"temperature", 1.0},
                    {"top_k", 64},
                    {"top_p", 0.95}};
  return j.dump(2);
}

std::string chat_template() {
  return "{{ bos_token }}"
         "{%- for m in messages -%}"
         "{{ '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' + (m['content'] | trim) + '<turn|>\\n' }}"
         "{%- endfor -%}"
         "{%- if add_generation_prompt -%}"
         "{{ '<|turn>model\\n' }}"
         "{%- if enable_thinking -%}{{ '<|channel>thought\\n' }}{%- else -%}{{ '<|channel>thought\\n<channel|>' }}{%- endif -%}"
         "{%- endif -%}";
}

std::string make_model_dir(const std::filesystem::path& dir, const std::string& fixture) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const fs::path src = fs::path(fixtures_dir()) / fixture;
  for (const char* name : {"config.json", "model.safetensors"})
    fs::copy_file(src / name, dir / name, fs::copy_options::overwrite_existing);
  write_file((dir / "tokenizer.json").string(), tokenizer_json());
  write_file((dir / "generation_config.json").string(), generation_config_json());
  write_file((dir / "chat_template.jinja").string(), chat_template());
  return dir.string();
}

}  // namespace fl::test::tiny
