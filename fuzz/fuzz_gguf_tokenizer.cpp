// Fuzzes the tokenizer builder for GGUF tokenizer metadata (text/tokenizer/tokenizer_gguf.h) with
// metadata of the expected shape but hostile contents: arrays of mismatched lengths or the wrong
// element types, token types and ids out of range, NaN scores, merges that are not two known
// tokens, duplicate tokens, unknown model and pre-tokenizer names. (fuzz_gguf reaches the same
// builder through whole files; this target skips the container so that most inputs get to the
// builder's own checks.) Every input must build a tokenizer that then encodes and decodes, or fail
// with fl::Error; never crash or hang.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_gguf.h"

namespace {

using fl::GgufValue;
using fl::GgufValueType;

// A length near n: usually n, sometimes one off or random.
size_t length_near(FuzzedDataProvider& in, size_t n) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return n + 1;
    case 1: return n > 0 ? n - 1 : 0;
    case 2: return in.ConsumeIntegralInRange<size_t>(0, 80);
    default: return n;
  }
}

GgufValue token_id(FuzzedDataProvider& in, size_t n) {
  const int64_t id = in.ConsumeIntegralInRange<int64_t>(-2, static_cast<int64_t>(n) + 2);
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: return GgufValue::of_i32(static_cast<int32_t>(id));
    case 1: return GgufValue::of_u64(static_cast<uint64_t>(id));
    case 2: return GgufValue::of_string("1");
    default: return GgufValue::of_u32(static_cast<uint32_t>(id));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace key = fl::gguf_tokenizer_key;
  FuzzedDataProvider in(data, size);
  std::vector<fl::GgufMetadataEntry> md;
  auto add = [&](std::string_view k, GgufValue v) {
    if (in.ConsumeIntegralInRange<int>(0, 15) != 0) md.push_back({std::string(k), std::move(v)});  // sometimes missing
  };

  static const char* const kModels[] = {"llama", "gpt2", "gpt2", "llama", "bert", ""};
  static const char* const kPres[] = {"default", "llama-bpe", "qwen2", "gpt-2", "llama3", "falcon"};
  add(key::kModel, in.ConsumeIntegralInRange<int>(0, 20) == 0 ? GgufValue::of_u32(1)
                                                              : GgufValue::of_string(in.PickValueInArray(kModels)));
  add(key::kPre, GgufValue::of_string(in.PickValueInArray(kPres)));

  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 48);
  std::vector<GgufValue> tokens;
  for (size_t i = 0; i < n; ++i) {
    // Short strings over a small alphabet make merges and duplicates likely.
    std::string t = in.ConsumeRandomLengthString(6);
    if (in.ConsumeIntegralInRange<int>(0, 40) == 0)
      tokens.push_back(GgufValue::of_u32(7));
    else
      tokens.push_back(GgufValue::of_string(std::move(t)));
  }
  add(key::kTokens, GgufValue::of_array(GgufValueType::string, std::move(tokens)));

  std::vector<GgufValue> scores, types;
  for (size_t i = 0, m = length_near(in, n); i < m; ++i) scores.push_back(GgufValue::of_f32(in.ConsumeFloatingPoint<float>()));
  for (size_t i = 0, m = length_near(in, n); i < m; ++i)
    types.push_back(GgufValue::of_i32(in.ConsumeBool() ? 1 : in.ConsumeIntegralInRange<int32_t>(-1, 8)));
  add(key::kScores, GgufValue::of_array(GgufValueType::f32, std::move(scores)));
  add(key::kTokenType, GgufValue::of_array(GgufValueType::i32, std::move(types)));

  std::vector<GgufValue> merges;
  for (size_t i = 0, m = in.ConsumeIntegralInRange<size_t>(0, 32); i < m; ++i)
    merges.push_back(GgufValue::of_string(in.ConsumeRandomLengthString(8)));
  add(key::kMerges, GgufValue::of_array(GgufValueType::string, std::move(merges)));

  add(key::kBosId, token_id(in, n));
  add(key::kEosId, token_id(in, n));
  add(key::kUnknownId, token_id(in, n));
  add(key::kAddBos, GgufValue::of_bool(in.ConsumeBool()));
  add(key::kAddEos, GgufValue::of_bool(in.ConsumeBool()));
  add(key::kAddSpacePrefix, GgufValue::of_bool(in.ConsumeBool()));

  const std::string text = in.ConsumeRemainingBytesAsString();
  try {
    const fl::Tokenizer tok = fl::tokenizer_from_gguf_metadata(md, "fuzz");
    const std::vector<int32_t> ids = tok.encode(text);
    fl::StreamingDetokenizer stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    if (streamed != tok.decode(ids)) __builtin_trap();  // the streaming contract
  } catch (const fl::Error&) {
  }
  return 0;
}
