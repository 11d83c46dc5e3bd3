#pragma once
// A model that can chat, for tests: a committed random-weight fixture (vocabulary 512, no
// tokenizer) plus side files made here: a Gemma-style tokenizer.json of exactly 512 tokens (byte
// fallback, the Gemma 4 chat markers as special tokens at the ids below), a generation_config.json
// whose EOS ids are <eos>, <turn|> and <|tool_response> (as Gemma 4's are 1, 106, 50), and a
// small chat template in Gemma 4's shape. Random weights give gibberish, but deterministic
// gibberish.
//
// The template differs from Gemma 4's in one way, on purpose: with thinking on, the generation
// prompt ends inside an open thought (`<|channel>thought\n`, as Qwen's ends in `<think>\n`), so
// that a random model is certain to be thinking and the thinking cap can be tested. With thinking
// off (or undefined) it ends with the closed empty thought of the 26B/31B templates.
#include <cstdint>
#include <filesystem>
#include <string>

namespace fl::test::tiny {

constexpr int32_t kPad = 0, kEos = 1, kBos = 2, kUnk = 3;
constexpr int32_t kTurnOpen = 260, kTurnClose = 261, kChannelOpen = 262, kChannelClose = 263, kThink = 264;
constexpr int32_t kToolCallOpen = 265, kToolCallClose = 266, kToolResponseOpen = 267, kToolResponseClose = 268;
constexpr int32_t kQuote = 269, kToolOpen = 270, kToolClose = 271;
constexpr int32_t kVocab = 512;

std::string tokenizer_json();
std::string generation_config_json();
std::string chat_template();

// Copies tests/fixtures/<fixture> (config.json, model.safetensors) into `dir` (created if
// needed) and adds the side files. Returns dir as a string.
std::string make_model_dir(const std::filesystem::path& dir, const std::string& fixture = "gemma4-moe");

}  // namespace fl::test::tiny
