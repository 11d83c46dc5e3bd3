// fireline tokenize TOKENIZER_OR_MODEL TEXT : prints the token ids of TEXT as JSON, so that they
// can be compared with Hugging Face tokenizers or another engine; --decode 1,2,3 goes the other
// way and prints the text exactly (no newline added).
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "text/tokenizer/tokenizer.h"

namespace fl::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  bool have_text = false;
  bool ids = false;
  bool tokens = false;
  std::string decode;
  bool have_decode = false;
  bool add_special_tokens = true;
  bool skip_special_tokens = false;
};

void run_tokenize(const TokenizeOptions& opt) {
  if (opt.have_decode && opt.have_text) fail("give either TEXT or --decode, not both");
  if (!opt.have_decode && !opt.have_text) fail("give the TEXT to encode (- reads stdin), or --decode IDS");
  if (opt.ids && opt.tokens) fail("--ids and --tokens are alternatives");

  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = Tokenizer::load(opt.tokenizer);
  log_debug("loaded {} in {:.0f} ms", opt.tokenizer,
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());

  if (opt.have_decode) {
    const std::string text = tok.decode(parse_token_ids(opt.decode, "--decode"), opt.skip_special_tokens);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }

  std::string text = opt.text;
  if (text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (std::cin.bad()) fail("cannot read the text from stdin");
  }
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text, opt.add_special_tokens);
  log_debug("encoded {} bytes into {} tokens in {:.1f} ms", text.size(), ids.size(),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count());
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    if (opt.tokens)
      out += fmt::format("{{\"id\": {}, \"token\": {}}}", ids[i], nlohmann::json(tok.id_to_token(ids[i]).value_or("")).dump());
    else
      out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

std::vector<int32_t> parse_token_ids(const std::string& list, const char* option) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  };
  std::string_view rest = trim(list);
  if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') rest = trim(rest.substr(1, rest.size() - 2));
  std::vector<int32_t> ids;
  if (rest.empty()) return ids;
  for (;;) {  // every comma is followed by an item: "1,,2" and "1," are errors
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    int64_t value = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 0 ||
        value > std::numeric_limits<int32_t>::max())
      fail("{}: {:?} is not a token id (give comma-separated whole numbers from 0)", option, std::string(item));
    ids.push_back(static_cast<int32_t>(value));
    if (comma == std::string_view::npos) return ids;
    rest.remove_prefix(comma + 1);
  }
}

void add_tokenize_command(CLI::App& app) {
  auto opt = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text to token ids (JSON), or decode ids to text");
  cmd->add_option("tokenizer", opt->tokenizer,
                  "A tokenizer.json file, a model directory containing one, or a .fire / GGUF file (its embedded "
                  "tokenizer.json, else its tokenizer.ggml.* metadata)")
      ->required();
  cmd->add_option("text", opt->text, "Text to encode; - reads it from stdin")
      ->each([opt](const std::string&) { opt->have_text = true; });
  cmd->add_flag("--ids", opt->ids, "Print the ids as a JSON array (the default)");
  cmd->add_flag("--tokens", opt->tokens, "Print [{\"id\": ..., \"token\": ...}, ...] instead of bare ids");
  cmd->add_option("--decode", opt->decode, "Comma-separated ids to decode, e.g. 2,9259,1902; prints the text exactly")
      ->each([opt](const std::string&) { opt->have_decode = true; });
  cmd->add_flag("--add-special-tokens,!--no-add-special-tokens", opt->add_special_tokens,
                "Apply the tokenizer's post-processor, e.g. Gemma's leading <bos> (default: on, as in HF)");
  cmd->add_flag("--skip-special-tokens", opt->skip_special_tokens, "With --decode: leave special tokens out");
  cmd->callback([opt] { run_tokenize(*opt); });
}

}  // namespace fl::cli
