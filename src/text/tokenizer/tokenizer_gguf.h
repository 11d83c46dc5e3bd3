#pragma once
// A Tokenizer built from a GGUF file's tokenizer metadata: the `tokenizer.ggml.*` keys that
// llama.cpp's converter writes, for files that carry no tokenizer.json (docs/tokenizer.md, "GGUF
// tokenizer metadata").
//
//   tokenizer.ggml.model       "gpt2": byte-level BPE with ranked merges (Llama 3, Qwen)
//                              "llama": SentencePiece BPE (Gemma 3, Llama 2): pieces merge by
//                              score, spaces become "▁", bytes without a piece fall back to <0xXX>
//   tokenizer.ggml.pre         the pre-tokenizer, by name (see below)
//   tokenizer.ggml.tokens      string[n]: the token of each id
//   tokenizer.ggml.scores      f32[n]: SentencePiece piece scores (required for "llama")
//   tokenizer.ggml.token_type  i32[n]: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
//                              6 byte (absent: all normal)
//   tokenizer.ggml.merges      string[m]: "left right", rank order (required for "gpt2")
//   tokenizer.ggml.bos_token_id / eos_token_id / unknown_token_id     u32
//   tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix   bool
//
// Control and user-defined tokens are matched in the text before BPE (control tokens count as
// special: decode can skip them), like the added tokens of a tokenizer.json. add_bos_token and
// add_eos_token default to llama.cpp's defaults (BOS on for "llama", off for "gpt2"), as does
// add_space_prefix (on for "llama").
//
// Pre-tokenizers ("gpt2" vocabularies): "llama-bpe" / "llama3" / "llama-v3" (Llama 3's split regex,
// whole words that are tokens skip the merges), "qwen2" (NFC, then Qwen's split regex), "gpt-2"
// (GPT-2's regex). "llama" vocabularies take no pre-tokenizer ("default" or absent). Any other name
// is an error naming the supported ones: guessing a split regex would tokenize silently wrong.
//
// Every malformed value (a wrong type, arrays of different lengths, a token type or id out of
// range, a merge that is not two known tokens) is an fl::Error naming the source and the key.
#include <span>
#include <string_view>

#include "text/tokenizer/tokenizer.h"

namespace fl {

class GgufFile;
struct GgufMetadataEntry;

namespace gguf_tokenizer_key {
inline constexpr std::string_view kModel = "tokenizer.ggml.model";
inline constexpr std::string_view kPre = "tokenizer.ggml.pre";
inline constexpr std::string_view kTokens = "tokenizer.ggml.tokens";
inline constexpr std::string_view kScores = "tokenizer.ggml.scores";
inline constexpr std::string_view kTokenType = "tokenizer.ggml.token_type";
inline constexpr std::string_view kMerges = "tokenizer.ggml.merges";
inline constexpr std::string_view kBosId = "tokenizer.ggml.bos_token_id";
inline constexpr std::string_view kEosId = "tokenizer.ggml.eos_token_id";
inline constexpr std::string_view kUnknownId = "tokenizer.ggml.unknown_token_id";
inline constexpr std::string_view kAddBos = "tokenizer.ggml.add_bos_token";
inline constexpr std::string_view kAddEos = "tokenizer.ggml.add_eos_token";
inline constexpr std::string_view kAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
}  // namespace gguf_tokenizer_key

// GGUF token types (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

// True when the file has tokenizer.ggml.model.
bool has_gguf_tokenizer(const GgufFile& file);
Tokenizer tokenizer_from_gguf(const GgufFile& file);
// The same from metadata entries (a GgufFile's, or ones being written); `source` names them in
// error messages.
Tokenizer tokenizer_from_gguf_metadata(std::span<const GgufMetadataEntry> metadata, std::string_view source);

}  // namespace fl
