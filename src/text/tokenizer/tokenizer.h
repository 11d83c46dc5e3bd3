#pragma once
// Text <-> token ids, exactly as Hugging Face tokenizers does it for the models fireline runs:
// byte-level BPE (Qwen, Llama 3) and SentencePiece-style BPE with byte fallback (Gemma), loaded
// from tokenizer.json. See docs/tokenizer.md for what is supported and how edge cases behave
// (invalid UTF-8 input becomes U+FFFD; unknown ids are skipped when decoding).
//
// A Tokenizer is immutable after loading and cheap to copy (it shares its tables); encode and
// decode may be called from several threads at once.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fl {

class Tokenizer {
 public:
  // A tokenizer.json file, or a model directory containing one. When a tokenizer_config.json sits
  // next to it, its bos_token / eos_token name the BOS and EOS ids. A GGUF file (a .fire, or one
  // with tokenizer.ggml.* metadata) gives the tokenizer it carries (model_tokenizer.h).
  static Tokenizer load(const std::string& path);
  // tokenizer.json text (and optionally tokenizer_config.json text). `source` names the origin in
  // error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json = {},
                             std::string_view source = "tokenizer.json");

  // Added and special tokens in the text are recognised (as HF does by default);
  // add_special_tokens applies the post-processor (e.g. Gemma's leading <bos>).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids without a token are skipped (as HF does).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // The raw bytes this id adds to decoded text in the middle of an output (a part of a UTF-8
  // character for a byte token; a special token's own text); empty for an id without a token.
  std::string token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  // One more than the largest id (the size an embedding table needs at least).
  int32_t vocab_size() const;

  // BOS / EOS as tokenizer_config.json declares them (nullopt when not declared).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  // For loaders and the streaming detokenizer (tokenizer_impl.h defines Impl).
  struct Impl;
  const Impl& impl() const { return *impl_; }
  static Tokenizer from_impl(std::shared_ptr<const Impl> impl) { return Tokenizer(std::move(impl)); }

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns ids into text as they arrive. The concatenation of everything push() and finish() return
// equals tokenizer.decode(all ids) exactly; text is released as soon as no later token can change
// it, so a UTF-8 character is never split and byte-fallback runs are released whole.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // The text that this id completes (often empty while a character is unfinished).
  std::string push(int32_t id);
  // Everything still held back; the stream is then empty and can be reused.
  std::string finish();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<int32_t> window_;  // ids since the last cut
  bool at_start_ = true;         // the window begins the output
};

}  // namespace fl
