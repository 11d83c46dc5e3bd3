#pragma once
// Test helper: converts a tokenizer.json (+ tokenizer_config.json) into GGUF tokenizer metadata
// the way llama.cpp's convert script lays out the keys, and writes metadata as a GGUF file.
#include <string>
#include <vector>

#include "io/gguf.h"

namespace fl::test {

struct ConvertOptions {
  bool sentencepiece = false;
  std::string pre;  // tokenizer.ggml.pre for byte-level vocabularies
};

// The tokenizer.ggml.* keys for the tokenizer in `dir` (tokenizer.json, tokenizer_config.json).
std::vector<GgufMetadataEntry> convert_tokenizer(const std::string& dir, const ConvertOptions& options);

// Writes metadata as a GGUF file with no tensors.
void write_gguf(const std::string& path, const std::vector<GgufMetadataEntry>& metadata);

}  // namespace fl::test
