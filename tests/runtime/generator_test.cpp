// The Generator end to end on a random-weight Gemma 4 MoE fixture with a made-up 512-token
// tokenizer (tests/util/tiny_chat_model.h): greedy output equals argmax over Model::forward step
// by step; seeds reproduce; stop strings, max tokens, a full context, EOS ids, the thinking cap,
// cancellation and prefix reuse behave as documented; prompts never carry two BOS tokens.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "util/test_util.h"
#include "util/tiny_chat_model.h"

namespace fl {
namespace {

namespace tiny = test::tiny;
using nlohmann::ordered_json;

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

ordered_json user(const std::string& text) { return ordered_json::array({{{"role", "user"}, {"content", text}}}); }

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    path_ = tiny::make_model_dir(dir_->path() / "tiny");
    source_ = open_model_source(path_).release();
    backend_ = make_backend("cpu").release();
    LoadOptions load;
    load.max_seq = 1024;
    load.max_tokens = 64;
    model_ = load_model(*source_, *backend_, load).release();
    text_ = std::make_shared<const ModelText>(load_model_text(*source_));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    delete source_;
    delete dir_;
  }

  static std::unique_ptr<Generator> generator(int64_t context = 256, int64_t chunk = 64, bool graph = true,
                                              std::shared_ptr<const ModelText> text = nullptr) {
    EngineOptions o;
    o.context = context;
    o.prefill_chunk = chunk;
    o.decode_graph = graph;
    return std::make_unique<Generator>(*model_, text ? text : text_, o);
  }

  // Greedy with a strong repetition penalty. The fixture's random weights tie the LM head to the
  // embedding, so its top logit is almost always the token it was just fed: plain greedy output
  // repeats one token. The penalty (over the last 64 tokens) makes it walk through the vocabulary
  // instead, which gives text with many different tokens, still fully deterministic.
  static constexpr float kPenalty = 10.0f;
  static GenerateRequest greedy(const std::string& prompt, int64_t max_tokens) {
    GenerateRequest r;
    r.prompt.messages = user(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.repetition_penalty = kPenalty;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // The same by hand: one forward over the prompt, then one per token, argmax after dividing
  // (multiplying, when negative) the logits of the last 64 tokens by the penalty. `forced` tokens
  // are fed after the `at`-th generated token, as the thinking cap does.
  static std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int n, int at = -1,
                                        const std::vector<int32_t>& forced = {}, float penalty = kPenalty) {
    auto seq = model_->new_sequence({1024, DType::f32, true});
    std::vector<float> logits = model_->forward(*seq, prompt, LogitsMode::last);
    std::vector<int32_t> window(prompt.end() - std::min<size_t>(prompt.size(), 64), prompt.end());
    auto accept = [&](int32_t t) {
      window.push_back(t);
      if (window.size() > 64) window.erase(window.begin());
    };
    std::vector<int32_t> out;
    while (static_cast<int>(out.size()) < n) {
      std::vector<bool> seen(logits.size(), false);
      for (int32_t w : window)
        if (!seen[w]) {
          seen[w] = true;
          logits[w] = logits[w] > 0 ? logits[w] / penalty : logits[w] * penalty;
        }
      int32_t t = argmax(logits);
      out.push_back(t);
      accept(t);
      logits = model_->forward(*seq, std::span<const int32_t>(&t, 1), LogitsMode::last);
      if (static_cast<int>(out.size()) == at)
        for (int32_t f : forced) {
          out.push_back(f);
          accept(f);
          logits = model_->forward(*seq, std::span<const int32_t>(&f, 1), LogitsMode::last);
        }
    }
    out.resize(n);
    return out;
  }

  static test::TempDir* dir_;
  static std::string path_;
  static ModelSource* source_;
  static Backend* backend_;
  static Model* model_;
  static std::shared_ptr<const ModelText> text_;
};
test::TempDir* GeneratorTest::dir_ = nullptr;
std::string GeneratorTest::path_;
ModelSource* GeneratorTest::source_ = nullptr;
Backend* GeneratorTest::backend_ = nullptr;
Model* GeneratorTest::model_ = nullptr;
std::shared_ptr<const ModelText> GeneratorTest::text_;

TEST_F(GeneratorTest, ModelTextFromTheDirectory) {
  EXPECT_EQ(text_->defaults.eos_ids, (std::vector<int32_t>{tiny::kEos, tiny::kTurnClose, tiny::kToolResponseOpen}));
  EXPECT_EQ(text_->bos_id, tiny::kBos);
  EXPECT_TRUE(text_->tokenizer_adds_bos);
  EXPECT_TRUE(text_->chat_template);
  EXPECT_TRUE(text_->format.reasoning.has_value());
  EXPECT_EQ(text_->format.tool_calls, chat::ToolCallFormat::gemma4);
  EXPECT_EQ(text_->max_context, 1024);
  EXPECT_EQ(text_->defaults.sampling.top_k, 64);
}

TEST_F(GeneratorTest, GreedyEqualsArgmaxOfForwardStepByStep) {
  auto gen = generator();
  GenerateRequest req = greedy("Why is the sky blue?", 40);
  Prompt prompt = gen->prompts().build(req.prompt);
  GenerationResult r = gen->generate(req);
  EXPECT_EQ(r.tokens, reference(prompt.ids, 40));
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_EQ(r.stop_cause, StopCause::max_tokens);
  EXPECT_EQ(r.usage.completion_tokens, 40);
  EXPECT_EQ(r.usage.prompt_tokens, static_cast<int64_t>(prompt.ids.size()));
  EXPECT_GT(r.timings.ttft_s, 0.0);
  EXPECT_EQ(r.timings.decode_steps, 39);  // the 40th token is never fed
  EXPECT_EQ(r.timings.prefill_tokens, r.usage.prompt_tokens);

  // The same again (a fresh generator, and the same one: the sequence is rebuilt), and with
  // Model::forward decoding and tiny prefill chunks instead of the graph.
  EXPECT_EQ(generator()->generate(req).tokens, r.tokens);
  EXPECT_EQ(gen->generate(req).tokens, r.tokens);
  EXPECT_EQ(generator(256, 3, /*graph=*/false)->generate(req).tokens, r.tokens);
  EXPECT_GT(std::set<int32_t>(r.tokens.begin(), r.tokens.end()).size(), 30u);  // not one token repeated

  // Plain greedy (no penalty) is argmax itself.
  req.sampling.repetition_penalty = 1.0f;
  EXPECT_EQ(gen->generate(req).tokens, reference(prompt.ids, 40, -1, {}, 1.0f));
}

TEST_F(GeneratorTest, EventsAddUpToTheResultAndDoneComesLast) {
  auto gen = generator();
  std::string content, reasoning;
  std::vector<GenerationEvent::Kind> kinds;
  const GenerationResult* done = nullptr;
  GenerationResult r = gen->generate(greedy("Tell me a story", 60), [&](const GenerationEvent& e) {
    kinds.push_back(e.kind);
    if (e.kind == GenerationEvent::Kind::content) content += e.text;
    if (e.kind == GenerationEvent::Kind::reasoning) reasoning += e.text;
    if (e.kind == GenerationEvent::Kind::done) done = e.result;
  });
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.back(), GenerationEvent::Kind::done);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), GenerationEvent::Kind::done), 1);
  ASSERT_NE(done, nullptr);
  EXPECT_EQ(content, r.content);
  EXPECT_EQ(reasoning, r.reasoning);
  EXPECT_FALSE(r.content.empty() && r.reasoning.empty());
}

TEST_F(GeneratorTest, SameSeedSameTokensOtherSeedOtherTokens) {
  GenerateRequest req = greedy("Hello", 40);
  req.sampling.temperature = 1.5f;
  req.sampling.seed = 42;
  auto a = generator()->generate(req).tokens;
  auto b = generator()->generate(req).tokens;
  req.sampling.seed = 43;
  auto c = generator()->generate(req).tokens;
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Through the decode graph each next token is sampled by the backend's sample op
  // (append_and_sample); without it, by the host Sampler on the returned logits: the same tokens.
  req.sampling.top_k = 50;
  req.sampling.top_p = 0.9f;
  req.sampling.frequency_penalty = 0.5f;
  EXPECT_EQ(generator(256, 64, true)->generate(req).tokens, generator(256, 64, false)->generate(req).tokens);
}

TEST_F(GeneratorTest, StopStringAcrossTokensEndsTheAnswerAndIsNotEmitted) {
  auto gen = generator();
  GenerateRequest req = greedy("Tell me a story about the sea", 80);
  req.prompt.think = ThinkMode::off;
  // Per-token content pieces of the unstopped run: a stop string made of the end of one piece and
  // the start of the next spans a token boundary.
  std::vector<std::string> pieces;
  GenerationResult full = gen->generate(req, [&](const GenerationEvent& e) {
    if (e.kind == GenerationEvent::Kind::content && !e.text.empty()) pieces.emplace_back(e.text);
  });
  std::string stop;
  for (size_t i = 5; i + 1 < pieces.size() && stop.empty(); ++i)
    if (pieces[i].size() >= 1 && pieces[i + 1].size() >= 1 && (pieces[i].back() & 0x80) == 0 && (pieces[i + 1][0] & 0x80) == 0)
      stop = std::string(1, pieces[i].back()) + pieces[i + 1][0];
  ASSERT_FALSE(stop.empty()) << "no two ASCII-bounded content pieces in: " << full.content;
  const size_t at = full.content.find(stop);
  ASSERT_NE(at, std::string::npos);

  req.stop = {stop, "this stop string never appears"};
  std::string streamed;
  GenerationResult r = gen->generate(req, [&](const GenerationEvent& e) {
    if (e.kind == GenerationEvent::Kind::content) streamed += e.text;
  });
  EXPECT_EQ(r.content, full.content.substr(0, at));
  EXPECT_EQ(streamed, r.content);
  EXPECT_EQ(r.finish_reason, FinishReason::stop);
  EXPECT_EQ(r.stop_cause, StopCause::stop_string);
  EXPECT_EQ(r.stop_string, stop);
  ASSERT_LE(r.tokens.size(), full.tokens.size());
  EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), full.tokens.begin()));
}

TEST_F(GeneratorTest, MaxTokensFinishesWithLength) {
  auto gen = generator();
  GenerationResult r = gen->generate(greedy("Hello", 5));
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_EQ(r.stop_cause, StopCause::max_tokens);
}

TEST_F(GeneratorTest, FullContextFinishesWithLength) {
  GenerateRequest req = greedy("Hello", 0);
  const int64_t prompt_len = static_cast<int64_t>(generator()->prompts().build(req.prompt).ids.size());
  auto gen = generator(prompt_len + 3);
  GenerationResult r = gen->generate(req);
  // Three tokens are fed at the three free positions; the fourth is emitted but finds no room.
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_EQ(r.stop_cause, StopCause::context_full);
  EXPECT_EQ(gen->engine().n_past(), prompt_len + 3);
}

TEST_F(GeneratorTest, PromptLongerThanTheContextNamesBothNumbers) {
  GenerateRequest req = greedy("Tell me a story about the sea and the sky and the moon", 4);
  const size_t n = generator()->prompts().build(req.prompt).ids.size();
  try {
    generator(8)->generate(req);
    FAIL() << "a prompt of " << n << " tokens ran in a context of 8";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(n) + " tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 8"), std::string::npos) << msg;
  }
}

TEST_F(GeneratorTest, EosIdEndsGenerationAndIsNotText) {
  GenerateRequest req = greedy("Hello", 10);
  const int32_t first = generator()->generate(req).tokens.at(0);
  auto text = std::make_shared<ModelText>(*text_);
  text->defaults.eos_ids = {first};
  req.ignore_eos = false;
  GenerationResult r = generator(256, 64, true, text)->generate(req);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{first}));
  EXPECT_EQ(r.finish_reason, FinishReason::stop);
  EXPECT_EQ(r.stop_cause, StopCause::eos_token);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.usage.completion_tokens, 1);
}

TEST_F(GeneratorTest, ThinkingCapForcesTheCloseMarkerAndTheAnswerContinues) {
  auto gen = generator();
  GenerateRequest req = greedy("Why is the sky blue?", 14);
  req.prompt.think = ThinkMode::low;
  req.max_reasoning_tokens = 5;
  Prompt prompt = gen->prompts().build(req.prompt);
  ASSERT_TRUE(prompt.starts_in_reasoning) << prompt.text;
  const std::vector<int32_t> free_run = reference(prompt.ids, 5);
  for (int32_t t : free_run)
    ASSERT_TRUE(t != tiny::kChannelClose && t != tiny::kChannelOpen) << "the fixture closes its thought by itself";

  GenerationResult r = gen->generate(req);
  EXPECT_TRUE(r.reasoning_capped);
  EXPECT_EQ(r.usage.reasoning_tokens, 5);
  ASSERT_GT(r.tokens.size(), 6u);
  EXPECT_EQ(r.tokens[5], tiny::kChannelClose);
  // The forced marker went through the model: what follows is the greedy continuation after it.
  EXPECT_EQ(r.tokens, reference(prompt.ids, 14, 5, {tiny::kChannelClose}));
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_EQ(r.usage.completion_tokens, 14);
  EXPECT_FALSE(r.reasoning.empty());
  EXPECT_EQ(r.reasoning.find("<channel|>"), std::string::npos);
  EXPECT_EQ(r.content.find("<channel|>"), std::string::npos);
}

TEST_F(GeneratorTest, ThinkingOffUsesTheClosedForm) {
  auto gen = generator();
  GenerateRequest req = greedy("Hi", 3);
  req.prompt.think = ThinkMode::off;
  Prompt p = gen->prompts().build(req.prompt);
  EXPECT_FALSE(p.starts_in_reasoning);
  EXPECT_TRUE(p.text.ends_with("<|turn>model\n<|channel>thought\n<channel|>")) << p.text;
  req.prompt.think = ThinkMode::high;
  EXPECT_TRUE(gen->prompts().build(req.prompt).text.ends_with("<|channel>thought\n"));
}

TEST_F(GeneratorTest, CancelBetweenStepsKeepsWhatWasMade) {
  auto gen = generator();
  GenerateRequest req = greedy("Tell me a story", 200);
  const std::vector<int32_t> full = gen->generate(req).tokens;
  std::atomic<bool> cancel{false};
  int events = 0;
  GenerationResult r = gen->generate(
      req,
      [&](const GenerationEvent& e) {
        if (e.kind != GenerationEvent::Kind::done && ++events == 3) cancel = true;
      },
      &cancel);
  EXPECT_EQ(r.finish_reason, FinishReason::cancelled);
  EXPECT_EQ(r.stop_cause, StopCause::cancelled);
  EXPECT_GE(r.tokens.size(), 3u);
  EXPECT_LT(r.tokens.size(), 200u);
  EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), full.begin()));

  cancel = true;  // before the prefill: nothing runs
  GenerationResult none = gen->generate(req, {}, &cancel);
  EXPECT_EQ(none.finish_reason, FinishReason::cancelled);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.timings.prefill_tokens, 0);
}

TEST_F(GeneratorTest, PromptThatExtendsTheSequenceRunsOnlyItsNewTokens) {
  auto gen = generator();
  GenerateRequest req = greedy("unused", 6);
  Prompt first;
  first.ids = text_->tokenizer.encode(" Hello world", true);
  GenerationResult r1 = gen->generate(first, req);
  ASSERT_EQ(r1.tokens.size(), 6u);
  // The sequence holds the prompt and the five fed tokens (the sixth was never fed).
  Prompt second;
  second.ids = first.ids;
  second.ids.insert(second.ids.end(), r1.tokens.begin(), r1.tokens.end() - 1);
  for (int32_t id : text_->tokenizer.encode(" tell me", false)) second.ids.push_back(id);
  GenerationResult r2 = gen->generate(second, req);
  EXPECT_EQ(r2.usage.cached_tokens, static_cast<int64_t>(first.ids.size()) + 5);
  EXPECT_EQ(r2.timings.prefill_tokens, static_cast<int64_t>(second.ids.size()) - r2.usage.cached_tokens);
  EXPECT_EQ(r2.tokens, generator()->generate(second, req).tokens);
  EXPECT_EQ(r2.tokens, reference(second.ids, 6));
}

TEST_F(GeneratorTest, RawPromptGetsTheTokenizersBos) {
  GenerateRequest req = greedy("", 3);
  req.prompt.raw = "Once upon a time";
  Prompt p = generator()->prompts().build(req.prompt);
  EXPECT_EQ(p.ids.front(), tiny::kBos);
  EXPECT_NE(p.ids.at(1), tiny::kBos);
  GenerationResult r = generator()->generate(req);
  EXPECT_EQ(r.tokens, reference(p.ids, 3));
  req.prompt.raw = "";
  EXPECT_THROW(generator()->generate(req), Error);
}

TEST_F(GeneratorTest, ChatPromptHasExactlyOneBos) {
  Prompt p = generator()->prompts().build(greedy("Hi", 1).prompt);
  ASSERT_GE(p.ids.size(), 2u);
  EXPECT_EQ(p.ids[0], tiny::kBos);
  EXPECT_NE(p.ids[1], tiny::kBos);

  // A template that does not write the BOS: it is added once, as the tokenizer would.
  auto text = std::make_shared<ModelText>(*text_);
  text->chat_template = std::make_shared<const chat::ChatTemplate>(
      chat::ChatTemplateSource{"{% for m in messages %}<|turn>user\n{{ m['content'] }}<turn|>\n{% endfor %}<|turn>model\n", "t", {}, {}});
  Prompt q = PromptBuilder(text).build(greedy("Hi", 1).prompt);
  EXPECT_EQ(q.ids[0], tiny::kBos);
  EXPECT_EQ(q.ids[1], tiny::kTurnOpen);
}

TEST_F(GeneratorTest, RealGemma4TemplateRendersOneBosAndBothThinkingForms) {
  const std::string file = std::string(FIRELINE_SHARED_DIR) + "/data/templates/gemma4-31b-jul2026.jinja";
  std::ifstream in(file);
  if (!in) GTEST_SKIP() << "no " << file;
  std::stringstream ss;
  ss << in.rdbuf();
  auto text = std::make_shared<ModelText>(*text_);
  text->chat_template = std::make_shared<const chat::ChatTemplate>(chat::ChatTemplateSource{ss.str(), file, "<bos>", "<eos>"});
  PromptBuilder builder(text);
  PromptRequest req;
  req.messages = user("Hi");
  req.think = ThinkMode::off;
  Prompt off = builder.build(req);
  EXPECT_EQ(off.ids[0], tiny::kBos);
  EXPECT_NE(off.ids[1], tiny::kBos);
  EXPECT_TRUE(off.text.ends_with("<|turn>model\n<|channel>thought\n<channel|>")) << off.text;
  EXPECT_FALSE(off.starts_in_reasoning);
  EXPECT_EQ(off.ids.back(), tiny::kChannelClose);
  req.think = ThinkMode::med;
  Prompt on = builder.build(req);
  EXPECT_NE(on.text.find("<|think|>"), std::string::npos) << on.text;
  EXPECT_TRUE(on.text.ends_with("<|turn>model\n")) << on.text;
  EXPECT_EQ(std::count(on.ids.begin(), on.ids.end(), tiny::kBos), 1);
}

TEST_F(GeneratorTest, ModelWithoutTemplateOrTokenizer) {
  auto text = std::make_shared<ModelText>(*text_);
  text->chat_template.reset();
  try {
    PromptBuilder(text).build(greedy("Hi", 1).prompt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos) << e.what();
  }
  auto bare = open_model_source(test::fixtures_dir() + "/gemma4-moe");
  try {
    load_model_text(*bare);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST_F(GeneratorTest, BadSamplingIsRefused) {
  GenerateRequest req = greedy("Hi", 2);
  req.sampling.top_p = 0.0f;
  EXPECT_THROW(generator()->generate(req), Error);
  req = greedy("Hi", -1);
  EXPECT_THROW(generator()->generate(req), Error);
}

}  // namespace
}  // namespace fl

namespace fl {
namespace {

// With CUDA and a GPU (skipped otherwise): decoding through the captured graph gives exactly the
// tokens of Model::forward decoding (graph replay is byte-identical to eager launches), also
// after the engine starts over at position 0 and when a prompt extends the cached tokens; and the
// tokens are those of the CPU oracle.
TEST(GeneratorCuda, GraphDecodeEqualsForwardDecodeAcrossRestartsAndExtensions) {
  std::unique_ptr<Backend> cuda;
  try {
    cuda = make_backend("cuda");
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  test::TempDir dir;
  const std::string path = test::tiny::make_model_dir(dir.path() / "tiny");
  auto source = open_model_source(path);
  auto text = std::make_shared<const ModelText>(load_model_text(*source));
  auto cpu = make_backend("cpu");
  LoadOptions load;
  load.max_seq = 512;
  load.max_tokens = 64;
  auto cuda_model = load_model(*source, *cuda, load);
  auto cpu_model = load_model(*source, *cpu, load);

  GenerateRequest req;
  req.prompt.messages = user("Why is the sky blue?");
  req.sampling.temperature = 0.0f;
  req.sampling.repetition_penalty = 10.0f;
  req.max_tokens = 48;
  req.ignore_eos = true;
  auto run_turns = [&](Model& model, bool graph, const GenerateRequest& req) {
    EngineOptions o;
    o.context = 512;
    o.prefill_chunk = 16;
    o.decode_graph = graph;
    Generator gen(model, text, o);
    std::vector<std::vector<int32_t>> turns;
    Prompt p = gen.prompts().build(req.prompt);
    turns.push_back(gen.generate(p, req).tokens);
    turns.push_back(gen.generate(p, req).tokens);  // starts over at position 0
    Prompt longer = p;
    longer.ids.insert(longer.ids.end(), turns[0].begin(), turns[0].end() - 1);
    longer.ids.push_back(text->tokenizer.encode(" why", false).at(0));
    GenerationResult extended = gen.generate(longer, req);  // only " why" runs: the rest is cached
    EXPECT_EQ(extended.usage.cached_tokens, static_cast<int64_t>(longer.ids.size()) - 1);
    turns.push_back(extended.tokens);
    return turns;
  };
  auto graph = run_turns(*cuda_model, true, req);
  auto eager = run_turns(*cuda_model, false, req);
  auto oracle = run_turns(*cpu_model, false, req);
  EXPECT_EQ(graph, eager);
  EXPECT_EQ(graph[0], graph[1]);
  EXPECT_EQ(graph, oracle);

  // Sampling with every stage on: with the graph, each token is chosen on the GPU (only its id
  // crosses); eager decode copies the same logits to the host Sampler. The chain is one
  // definition computed bit for bit alike, so the tokens must be identical; the CPU backend's
  // logits differ in the last bits, and its tokens match too unless a draw lands on a boundary.
  GenerateRequest sampled = req;
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_k = 40;
  sampled.sampling.top_p = 0.95f;
  sampled.sampling.min_p = 0.02f;
  sampled.sampling.repetition_penalty = 1.3f;
  sampled.sampling.presence_penalty = 0.2f;
  sampled.sampling.frequency_penalty = 0.1f;
  sampled.sampling.logit_bias = {{5, 2.0f}, {7, -INFINITY}};
  sampled.sampling.seed = 42;
  auto device_sampled = run_turns(*cuda_model, true, sampled);
  auto host_sampled = run_turns(*cuda_model, false, sampled);
  EXPECT_EQ(device_sampled, host_sampled);
  EXPECT_EQ(device_sampled[0], device_sampled[1]);  // the seed restarts with each generation
  EXPECT_EQ(device_sampled, run_turns(*cpu_model, false, sampled));
  for (const auto& turn : device_sampled) EXPECT_EQ(std::count(turn.begin(), turn.end(), 7), 0);  // banned
}

}  // namespace
}  // namespace fl
