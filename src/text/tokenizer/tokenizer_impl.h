#pragma once
// The parts of a loaded tokenizer, shared by the encoder/decoder (tokenizer.cpp), the
// tokenizer.json loader (tokenizer_json.cpp), the GGUF metadata loader (tokenizer_gguf.cpp) and the
// streaming detokenizer.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/bpe.h"
#include "text/tokenizer/decoder.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/tokenizer.h"

namespace fl {

// One post-processor template for a single sequence: the sequence itself (kSequence) and runs of
// special-token ids around it. A tokenizer may chain several (HF's Sequence post-processor).
struct PostTemplate {
  static constexpr int32_t kSequence = -1;
  std::vector<int32_t> items;  // ids, with kSequence where the encoded text goes
};

struct Tokenizer::Impl {
  std::string source;  // names the file in messages
  std::shared_ptr<const Vocab> vocab;
  std::unique_ptr<BpeModel> model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  AddedVocabulary added;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index into added.tokens()
  std::vector<PostTemplate> post_processors;
  Decoder decoder;
  std::optional<int32_t> bos_id, eos_id;
  int32_t vocab_end = 0;

  // The token string decode uses for an id (added tokens first, as HF does), or nullopt.
  std::optional<std::string_view> token(int32_t id) const;
  bool is_special(int32_t id) const;
};

}  // namespace fl
