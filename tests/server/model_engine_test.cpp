// ModelEngine (the engine behind `fireline serve`) on the tiny chat models, CPU backend: a task
// gives exactly what the single-sequence Generator gives for the same prompt and sampling,
// whether it runs alone or batched with others joining mid-way; a next turn reuses the slot's
// tokens; stop strings, max_tokens, the thinking budget, cancel and bad tasks behave.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "model/model.h"
#include "runtime/json_prefix.h"
#include "runtime/json_schema.h"
#include "runtime/generator.h"
#include "server/model_engine.h"
#include "util/test_util.h"
#include "util/tiny_chat_model.h"

namespace fl::server {
namespace {

namespace tiny = test::tiny;
using nlohmann::ordered_json;

// What the engine produced for one task.
struct Outcome {
  std::string content, reasoning;
  int tool_calls = 0;
  bool finished = false;
  FinishReason reason = FinishReason::stop;
  Usage usage;
  std::string error;
  std::vector<TokenLogprobOutput> logprobs;
};

// Each test runs on a Gemma 4 MoE and on a Qwen3.5 MoE (hybrid: linear-attention layers carry a
// recurrent state that a reused sequence must reset) fixture, both with the tiny chat tokenizer.
class ModelEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    source_ = open_model_source(tiny::make_model_dir(dir_.path() / "tiny", GetParam()));
    backend_ = make_backend("cpu");
    LoadOptions load;
    load.max_seq = kContext;
    load.max_tokens = 64;
    load.sequences = 4;
    model_ = load_model(*source_, *backend_, load);
    text_ = std::make_shared<const ModelText>(load_model_text(*source_));
  }

  static constexpr int64_t kContext = 256;

  std::unique_ptr<ModelEngine> engine(int parallel, int64_t chunk = 64) {
    ModelEngineConfig c;
    c.model_id = "tiny";
    c.context_length = kContext;
    c.parallel = parallel;
    c.prefill_chunk = chunk;
    return std::make_unique<ModelEngine>(*model_, text_, c);
  }

  // Greedy with a strong repetition penalty, so random weights walk through the vocabulary.
  static SamplingParams greedy() {
    SamplingParams s;
    s.temperature = 0.0f;
    s.repetition_penalty = 10.0f;
    return s;
  }

  Prompt chat_prompt(const std::string& user, ThinkMode think = ThinkMode::off) {
    PromptRequest r;
    r.messages = ordered_json::array({{{"role", "user"}, {"content", user}}});
    r.think = think;
    return PromptBuilder(text_).build(r);
  }

  GenerationTask task(const Prompt& p, int64_t max_tokens, SamplingParams s = greedy()) {
    GenerationTask t;
    t.kind = TaskKind::chat;
    t.prompt_text = p.text;
    t.prompt_tokens = p.ids;
    t.prompt_token_count = static_cast<int64_t>(p.ids.size());
    t.sampling = std::move(s);
    t.max_tokens = max_tokens;
    return t;
  }

  // The single-sequence reference: the Generator on its own sequence.
  GenerationResult reference(const Prompt& p, const GenerationTask& t) {
    EngineOptions o;
    o.context = kContext;
    o.prefill_chunk = 64;
    Generator gen(*model_, text_, o);
    GenerateRequest req;
    req.sampling = t.sampling;
    req.max_tokens = t.max_tokens;
    req.stop = t.stop;
    req.max_reasoning_tokens = t.thinking.budget_tokens;
    return gen.generate(p, req);
  }

  // Steps until every task has finished (at most `max_steps` steps).
  void run(ModelEngine& e, std::map<TaskId, Outcome>& out, int max_steps = 2000) {
    const EmitFn emit = [&](TaskId id, EngineEvent ev) { record(out[id], ev); };
    for (int i = 0; i < max_steps && e.busy(); ++i) e.step(emit);
    ASSERT_FALSE(e.busy()) << "tasks still running after " << max_steps << " steps";
  }

  void record(Outcome& o, const EngineEvent& ev) {
    EXPECT_FALSE(o.finished) << "an event after the finish";
    switch (ev.kind) {
      case EngineEvent::Kind::content: o.content += ev.text; break;
      case EngineEvent::Kind::reasoning: o.reasoning += ev.text; break;
      case EngineEvent::Kind::tool_call: ++o.tool_calls; break;
      case EngineEvent::Kind::logprob: o.logprobs.push_back(ev.logprob); break;
      case EngineEvent::Kind::finish:
        o.finished = true;
        o.reason = ev.finish_reason;
        o.usage = ev.usage;
        o.error = ev.error;
        break;
    }
  }

  void expect_same(const Outcome& got, const GenerationResult& want, const std::string& what) {
    EXPECT_TRUE(got.finished) << what;
    EXPECT_EQ(got.error, "") << what;
    EXPECT_EQ(got.content, want.content) << what;
    EXPECT_EQ(got.reasoning, want.reasoning) << what;
    EXPECT_EQ(got.usage.completion_tokens, want.usage.completion_tokens) << what;
    EXPECT_EQ(got.usage.reasoning_tokens, want.usage.reasoning_tokens) << what;
    EXPECT_EQ(got.usage.prompt_tokens, want.usage.prompt_tokens) << what;
    const FinishReason expected = want.finish_reason == fl::FinishReason::length   ? FinishReason::length
                                  : want.finish_reason == fl::FinishReason::tool_calls ? FinishReason::tool_calls
                                                                                       : FinishReason::stop;
    EXPECT_EQ(got.reason, expected) << what;
  }

  test::TempDir dir_;
  std::unique_ptr<ModelSource> source_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::shared_ptr<const ModelText> text_;
};

TEST_P(ModelEngineTest, OneTaskEqualsTheGenerator) {
  auto e = engine(1);
  EXPECT_EQ(e->info().model_id, "tiny");
  EXPECT_EQ(e->info().context_length, kContext);
  for (const char* q : {"Why is the sky blue?", "Tell me a story about the sea"}) {
    const Prompt p = chat_prompt(q);
    const GenerationTask t = task(p, 30);
    std::map<TaskId, Outcome> out;
    e->start(7, t);
    EXPECT_EQ(e->free_slots(), 0);
    run(*e, out);
    expect_same(out[7], reference(p, t), q);
    EXPECT_GE(out[7].usage.completion_tokens, 10) << q;
    EXPECT_EQ(e->free_slots(), 1);
  }
}

TEST_P(ModelEngineTest, BatchedTasksEqualTasksRunAlone) {
  // Three tasks at once with different prompt lengths and budgets, prefilled 5 tokens per step so
  // that prefill and decode interleave, and a fourth that joins while the others decode.
  auto e = engine(4, /*chunk=*/5);
  const std::vector<std::string> questions = {"Hi", "Why is the sky blue?", "Tell me a long story about the sea",
                                              "What is two plus two?"};
  const std::vector<int64_t> budgets = {25, 40, 18, 30};
  std::vector<Prompt> prompts;
  std::vector<GenerationTask> tasks;
  for (size_t i = 0; i < questions.size(); ++i) {
    prompts.push_back(chat_prompt(questions[i]));
    SamplingParams s = greedy();
    if (i == 3) s.temperature = 0.9f, s.seed = 1234, s.repetition_penalty = 1.0f;  // sampled, seeded
    tasks.push_back(task(prompts[i], budgets[i], s));
  }
  std::map<TaskId, Outcome> out;
  const EmitFn emit = [&](TaskId id, EngineEvent ev) { record(out[id], ev); };
  for (TaskId id = 0; id < 3; ++id) e->start(id, tasks[id]);
  EXPECT_EQ(e->free_slots(), 1);
  for (int i = 0; i < 12; ++i) e->step(emit);
  e->start(3, tasks[3]);
  run(*e, out);
  for (TaskId id = 0; id < 4; ++id) {
    expect_same(out[id], reference(prompts[id], tasks[id]), questions[id]);
    EXPECT_GE(out[id].usage.completion_tokens, 10) << "too short to show batching: " << questions[id];
  }
}

// n choices of one prompt (the server's n > 1): the first task reads the prompt, the others wait
// and copy its sequence and last logits (usage counts their prompt as cached), and every one
// answers exactly as the Generator does alone with its own seed. A leader cancelled half-way
// through the prompt leaves its followers to read the prompt themselves, still exactly.
TEST_P(ModelEngineTest, ChoicesOfOnePromptShareItsPrefill) {
  const Prompt p = chat_prompt("Tell me a long story about the sea and the ships on it");
  ASSERT_GT(p.ids.size(), 20u);
  auto sampled = [&](uint64_t seed) {
    SamplingParams s = greedy();  // (its repetition penalty walks random weights through the vocabulary)
    s.temperature = 0.9f;
    s.seed = seed;
    return task(p, 25, s);
  };
  for (bool cancel_leader : {false, true}) {
    SCOPED_TRACE(cancel_leader ? "leader cancelled" : "leader runs");
    auto e = engine(4, /*chunk=*/5);  // the prompt takes several steps to read
    std::map<TaskId, Outcome> out;
    const EmitFn emit = [&](TaskId id, EngineEvent ev) { record(out[id], ev); };
    for (TaskId id = 0; id < 3; ++id) e->start(id, sampled(100 + id));
    e->step(emit);
    if (cancel_leader) e->cancel(0);
    run(*e, out);
    for (TaskId id = cancel_leader ? 1 : 0; id < 3; ++id) {
      const GenerationTask t = sampled(100 + id);
      expect_same(out[id], reference(p, t), "choice " + std::to_string(id));
    }
    const auto n = static_cast<int64_t>(p.ids.size());
    if (!cancel_leader) {
      EXPECT_EQ(out[0].usage.cached_prompt_tokens, 0);
      EXPECT_EQ(out[1].usage.cached_prompt_tokens, n);
      EXPECT_EQ(out[2].usage.cached_prompt_tokens, n);
      EXPECT_NE(out[1].content, out[2].content) << "the seeds should part the choices";
    } else {  // one follower read the prompt after all, and the other copied it from that one
      EXPECT_EQ(std::min(out[1].usage.cached_prompt_tokens, out[2].usage.cached_prompt_tokens), 0);
      EXPECT_EQ(std::max(out[1].usage.cached_prompt_tokens, out[2].usage.cached_prompt_tokens), n);
    }
  }
}

TEST_P(ModelEngineTest, NextTurnReusesTheSlotsTokens) {
  auto e = engine(2);
  const Prompt first = chat_prompt("Tell me a story");
  std::map<TaskId, Outcome> out;
  e->start(1, task(first, 20));
  run(*e, out);
  ASSERT_EQ(out[1].usage.cached_prompt_tokens, 0);

  // The next prompt holds the first one, the answer's tokens and more: everything the slot fed
  // (the prompt and all generated tokens but the last) is found and not run again.
  const GenerationResult answer = reference(first, task(first, 20));
  Prompt next = first;
  next.ids.insert(next.ids.end(), answer.tokens.begin(), answer.tokens.end());
  const std::vector<int32_t> more = text_->tokenizer.encode(" and then?", false);
  next.ids.insert(next.ids.end(), more.begin(), more.end());
  next.text.clear();
  const GenerationTask t = task(next, 15);
  e->start(2, t);
  run(*e, out);
  EXPECT_EQ(out[2].usage.cached_prompt_tokens, static_cast<int64_t>(first.ids.size() + answer.tokens.size() - 1));
  expect_same(out[2], reference(next, t), "next turn");

  // An unrelated prompt starts over in a slot and still gives the reference answer.
  const Prompt other = chat_prompt("Something else entirely");
  e->start(3, task(other, 15));
  run(*e, out);
  EXPECT_EQ(out[3].usage.cached_prompt_tokens, 0);
  expect_same(out[3], reference(other, task(other, 15)), "unrelated prompt");
}

TEST_P(ModelEngineTest, LogprobsAreTheModelsOwnLogSoftmax) {
  // A task that asks for log-probabilities beside one that does not (the step then samples both
  // on the host): both answer as the Generator does, and the first's entries are log_softmax of
  // the model's logits, recomputed here on a sequence of its own. A logit_bias makes the sampler
  // pick a token the model itself finds unlikely, which the entries must show (they are the
  // model's distribution, not the sampler's).
  auto e = engine(2);
  const Prompt p = chat_prompt("Why is the sky blue?"), other = chat_prompt("Tell me a story");
  const std::vector<int32_t> pushed = text_->tokenizer.encode(" sea", false);
  ASSERT_FALSE(pushed.empty());
  SamplingParams biased = greedy();
  biased.repetition_penalty = 1.0f;
  biased.logit_bias = {{pushed[0], 100.0f}};
  GenerationTask with = task(p, 16, biased);
  with.logprobs = 3;
  const GenerationTask plain = task(other, 16);
  std::map<TaskId, Outcome> out;
  e->start(1, with);
  e->start(2, plain);
  run(*e, out);
  const GenerationResult want = reference(p, with);
  expect_same(out[1], want, "with logprobs");
  expect_same(out[2], reference(other, plain), "beside it");
  EXPECT_TRUE(out[2].logprobs.empty());
  // One entry per sampled token, an ending EOS's included (scorers read the last entry as the
  // sampled token's).
  ASSERT_EQ(out[1].logprobs.size(), want.tokens.size());

  auto seq = model_->new_sequence({kContext, DType::f32, true});
  std::vector<float> logits = model_->forward(*seq, p.ids, LogitsMode::last);
  int not_top = 0;
  for (size_t i = 0; i < out[1].logprobs.size(); ++i) {
    SCOPED_TRACE("token " + std::to_string(i));
    const int32_t token = want.tokens[i];
    double max_logit = -INFINITY, sum = 0.0;
    for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
    for (float l : logits) sum += std::exp(l - max_logit);
    auto logprob = [&](int32_t id) { return logits[static_cast<size_t>(id)] - max_logit - std::log(sum); };
    std::vector<int32_t> order(logits.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int32_t>(k);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });

    const TokenLogprobOutput& got = out[1].logprobs[i];
    EXPECT_NEAR(got.chosen.logprob, logprob(token), 1e-4);
    EXPECT_LE(got.chosen.logprob, 0.0f);
    EXPECT_EQ(got.chosen.bytes, text_->tokenizer.token_bytes(token));
    ASSERT_EQ(got.top.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(got.top[k].logprob, logprob(order[k]), 1e-4) << "alternative " << k;
      EXPECT_EQ(got.top[k].bytes, text_->tokenizer.token_bytes(order[k])) << "alternative " << k;
    }
    EXPECT_EQ(token, pushed[0]);
    if (token != order[0]) ++not_top;
    logits = model_->forward(*seq, std::span<const int32_t>(&token, 1), LogitsMode::last);
  }
  EXPECT_GT(not_top, 0) << "the bias never moved the pick: the test shows nothing about whose distribution it is";
}

TEST_P(ModelEngineTest, EchoScoresEveryPromptToken) {
  // A completion with echo and logprobs: an entry per prompt token (the first without a value),
  // each log_softmax of the logits after the tokens before it, recomputed here token by token;
  // the prompt's text first in the answer. Prefill chunks of 5 so that entries cross chunks. Run
  // twice in one slot: the second run must not reuse the first's tokens (it needs their logits).
  auto e = engine(1, /*chunk=*/5);
  const std::vector<int32_t> prompt = text_->tokenizer.encode("The sea is wide and the sky is blue", false);
  ASSERT_GE(prompt.size(), 8u);
  GenerationTask t;
  t.kind = TaskKind::completion;
  t.prompt_text = "The sea is wide and the sky is blue";
  t.prompt_tokens = prompt;
  t.prompt_token_count = static_cast<int64_t>(prompt.size());
  t.sampling = greedy();
  t.max_tokens = 0;
  t.echo = true;
  t.logprobs = 2;
  auto seq = model_->new_sequence({kContext, DType::f32, true});
  std::vector<std::vector<float>> after;  // logits after prompt token i
  for (int32_t id : prompt) after.push_back(model_->forward(*seq, std::span<const int32_t>(&id, 1), LogitsMode::last));
  for (TaskId run_id : {1, 2}) {
    SCOPED_TRACE("run " + std::to_string(run_id));
    std::map<TaskId, Outcome> out;
    e->start(run_id, t);
    run(*e, out);
    const Outcome& o = out[run_id];
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.reason, FinishReason::length);
    EXPECT_EQ(o.content, t.prompt_text);
    EXPECT_EQ(o.usage.completion_tokens, 0);
    EXPECT_EQ(o.usage.cached_prompt_tokens, 0);
    ASSERT_EQ(o.logprobs.size(), prompt.size());
    EXPECT_FALSE(o.logprobs[0].has_logprob);
    EXPECT_EQ(o.logprobs[0].chosen.bytes, text_->tokenizer.token_bytes(prompt[0]));
    for (size_t i = 1; i < prompt.size(); ++i) {
      const std::vector<float>& l = after[i - 1];
      double m = -INFINITY, sum = 0.0;
      for (float v : l) m = std::max(m, static_cast<double>(v));
      for (float v : l) sum += std::exp(v - m);
      EXPECT_TRUE(o.logprobs[i].has_logprob);
      EXPECT_NEAR(o.logprobs[i].chosen.logprob, l[static_cast<size_t>(prompt[i])] - m - std::log(sum), 1e-4) << i;
      EXPECT_EQ(o.logprobs[i].chosen.bytes, text_->tokenizer.token_bytes(prompt[i])) << i;
      ASSERT_EQ(o.logprobs[i].top.size(), 2u);
      EXPECT_GE(o.logprobs[i].top[0].logprob, o.logprobs[i].chosen.logprob) << i;
    }
  }
  // Scoring with one generated token that is an end-of-sequence (pushed by a bias): its entry is
  // last, as scorers that take "all but the last" entries expect.
  const int32_t eos = text_->defaults.eos_ids.empty() ? -1 : *text_->defaults.eos_ids.begin();
  ASSERT_GE(eos, 0);
  GenerationTask ending = t;
  ending.max_tokens = 1;
  ending.sampling.logit_bias = {{eos, 100.0f}};
  {
    std::map<TaskId, Outcome> o;
    e->start(5, ending);
    run(*e, o);
    ASSERT_EQ(o[5].logprobs.size(), prompt.size() + 1);
    EXPECT_TRUE(o[5].logprobs.back().chosen.special);
    EXPECT_EQ(o[5].logprobs.back().chosen.bytes, text_->tokenizer.token_bytes(eos));
    EXPECT_EQ(o[5].content, t.prompt_text);
  }
  // With an answer after it: the prompt's entries, then one per generated token; the answer as a
  // task without echo gives it.
  t.max_tokens = 6;
  std::map<TaskId, Outcome> out;
  e->start(3, t);
  run(*e, out);
  GenerationTask plain = t;
  plain.echo = false;
  plain.logprobs = -1;
  e->start(4, plain);
  run(*e, out);
  EXPECT_EQ(out[3].content, t.prompt_text + out[4].content);
  EXPECT_EQ(out[3].logprobs.size(), prompt.size() + static_cast<size_t>(out[4].usage.completion_tokens));
}

TEST_P(ModelEngineTest, StopStringsMaxTokensAndTheThinkingBudget) {
  auto e = engine(2);
  std::map<TaskId, Outcome> out;

  // A stop string taken from the middle of an unstopped answer ends it there, unprinted.
  const Prompt p = chat_prompt("Tell me a story about the sea");
  e->start(1, task(p, 40));
  run(*e, out);
  const std::string full = out[1].content;
  ASSERT_GT(full.size(), 20u);
  GenerationTask stopped = task(p, 40);
  stopped.stop = {full.substr(10, 4)};
  e->start(2, stopped);
  run(*e, out);
  EXPECT_EQ(out[2].reason, FinishReason::stop);
  EXPECT_EQ(out[2].content, full.substr(0, full.find(stopped.stop[0])));

  // max_tokens counts every generated token.
  e->start(3, task(p, 5));
  run(*e, out);
  EXPECT_EQ(out[3].reason, FinishReason::length);
  EXPECT_EQ(out[3].usage.completion_tokens, 5);

  // Thinking on: the prompt opens a thought; a budget of 6 closes it and the answer follows.
  const Prompt thinking = chat_prompt("Why is the sky blue?", ThinkMode::low);
  // EOS ids are biased away: random weights would otherwise end the turn inside the thought.
  SamplingParams no_eos = greedy();
  no_eos.logit_bias = {{tiny::kEos, -100.0f}, {tiny::kTurnClose, -100.0f}, {tiny::kToolResponseOpen, -100.0f}};
  GenerationTask budgeted = task(thinking, 30, no_eos);
  budgeted.thinking.enabled = true;
  budgeted.thinking.budget_tokens = 6;
  e->start(4, budgeted);
  run(*e, out);
  EXPECT_FALSE(out[4].reasoning.empty());
  EXPECT_EQ(out[4].usage.reasoning_tokens, 6) << out[4].reasoning;
  EXPECT_EQ(out[4].usage.completion_tokens, 30);  // the forced close marker counts
  EXPECT_FALSE(out[4].content.empty());
  expect_same(out[4], reference(thinking, budgeted), "thinking budget");
}

TEST_P(ModelEngineTest, JsonModeKeepsTheAnswerOneObject) {
  auto e = engine(2);
  std::map<TaskId, Outcome> out;
  const Prompt p = chat_prompt("Answer in JSON");
  // Free: whatever the random model writes is a prefix of one JSON object.
  GenerationTask free_task = task(p, 40);
  free_task.response_format = ResponseFormat::json_object;
  e->start(1, free_task);
  // Pushed to close early: the object completes and the answer ends right there.
  GenerationTask closing = task(p, 40);
  closing.response_format = ResponseFormat::json_object;
  for (int32_t id : text_->tokenizer.encode("}", false)) closing.sampling.logit_bias.push_back({id, 30.0f});
  e->start(2, closing);
  run(*e, out);
  for (TaskId id : {TaskId{1}, TaskId{2}}) {
    JsonPrefix prefix;
    EXPECT_TRUE(prefix.feed(out[id].content)) << out[id].content;
    EXPECT_EQ(out[id].content.find_first_not_of(" \t\r\n"), out[id].content.find('{'))
        << ::testing::PrintToString(out[id].content);
    if (out[id].reason == FinishReason::stop) {
      EXPECT_TRUE(prefix.complete()) << out[id].content;
      EXPECT_TRUE(nlohmann::json::parse(out[id].content).is_object()) << out[id].content;
    }
  }
  EXPECT_EQ(out[2].reason, FinishReason::stop) << out[2].content;
  EXPECT_LT(out[2].usage.completion_tokens, 40);
  EXPECT_GE(out[1].usage.completion_tokens, 5);

  // Without JSON mode the same prompt does not start an object.
  e->start(3, task(p, 10));
  run(*e, out);
  ASSERT_FALSE(out[3].content.empty());
  EXPECT_NE(out[3].content.find_first_not_of(" \t\r\n"), out[3].content.find('{')) << out[3].content;
}

// Rows are sampled in the model (forward_batch_sample) unless a JSON-mode row needs its logits on
// the host, when the whole step takes forward_batch and samples there: a seeded sampled task and a
// greedy one decoding beside a JSON-mode task switch between the two paths from step to step and
// must still produce exactly what they produce alone (each sampler's generator advanced once per
// token on either path).
TEST_P(ModelEngineTest, JsonSchemaShapesTheRandomModelsAnswer) {
  // The random model, held to a schema (enum, integer, a required key, a bounded list): with the
  // closers favoured it finishes one object the schema accepts; free, whatever it writes is a
  // prefix the checker accepts. (The tokenizer's vocabulary gives multi-byte pieces, so this also
  // runs the checker over whole tokens.)
  const nlohmann::json schema = {{"type", "object"},
                                 {"properties",
                                  {{"mood", {{"enum", {"happy", "sad"}}}},
                                   {"n", {{"type", "integer"}}},
                                   {"xs", {{"type", "array"}, {"items", {{"type", "boolean"}}}, {"maxItems", 2}}}}},
                                 {"required", {"mood", "n"}},
                                 {"additionalProperties", false}};
  auto compiled = std::make_shared<const JsonSchema>(JsonSchema::compile(schema));
  auto e = engine(2);
  std::map<TaskId, Outcome> out;
  const Prompt p = chat_prompt("Answer in JSON");
  GenerationTask free_task = task(p, 60);
  free_task.response_format = ResponseFormat::json_schema;
  free_task.json_schema = compiled;
  GenerationTask closing = free_task;
  for (const char* piece : {"}", "\"", ",", "]", "1"}) {
    for (int32_t id : text_->tokenizer.encode(piece, false)) {
      closing.sampling.logit_bias.push_back({id, 8.0f});
    }
  }
  closing.max_tokens = 200;
  e->start(1, free_task);
  e->start(2, closing);
  run(*e, out);
  for (TaskId id : {TaskId{1}, TaskId{2}}) {
    JsonPrefix prefix(compiled.get());
    EXPECT_TRUE(prefix.feed(out[id].content)) << out[id].content;
    if (out[id].reason == FinishReason::stop) {
      EXPECT_TRUE(prefix.complete()) << out[id].content;
    }
  }
  ASSERT_EQ(out[2].reason, FinishReason::stop) << out[2].content;
  const nlohmann::json answer = nlohmann::json::parse(out[2].content);
  EXPECT_TRUE(answer["mood"] == "happy" || answer["mood"] == "sad") << answer;
  EXPECT_TRUE(answer["n"].is_number_integer()) << answer;
  for (const auto& [key, value] : answer.items()) EXPECT_TRUE(key == "mood" || key == "n" || key == "xs") << key;
}

TEST_P(ModelEngineTest, AJsonTaskInTheBatchChangesNoOtherTasksTokens) {
  auto e = engine(3);
  const Prompt story = chat_prompt("Tell me a story"), sky = chat_prompt("Why is the sky blue?");
  SamplingParams seeded = greedy();
  seeded.temperature = 0.8f, seeded.seed = 77, seeded.repetition_penalty = 1.0f, seeded.top_k = 20;
  const GenerationTask sampled = task(story, 30, seeded), plain = task(sky, 24);
  GenerationTask json = task(chat_prompt("Answer in JSON"), 30);
  json.response_format = ResponseFormat::json_object;
  std::map<TaskId, Outcome> out;
  e->start(1, sampled);
  e->start(2, json);
  e->start(3, plain);
  run(*e, out);
  expect_same(out[1], reference(story, sampled), "seeded task beside a JSON task");
  expect_same(out[3], reference(sky, plain), "greedy task beside a JSON task");
  JsonPrefix prefix;
  EXPECT_TRUE(prefix.feed(out[2].content)) << out[2].content;
  EXPECT_GE(out[1].usage.completion_tokens, 10);
}

TEST_P(ModelEngineTest, RequiredToolChoiceStartsTheAnswerWithACall) {
  auto e = engine(3);
  std::map<TaskId, Outcome> out;
  std::map<TaskId, std::vector<std::string>> call_names;
  const EmitFn emit = [&](TaskId id, EngineEvent ev) {
    if (ev.kind == EngineEvent::Kind::tool_call) call_names[id].push_back(ev.tool_call.name);
    record(out[id], ev);
  };
  // The tiny chat model speaks Gemma 4's tool-call syntax.
  ASSERT_EQ(text_->format.tool_calls, chat::ToolCallFormat::gemma4);
  const Prompt p = chat_prompt("What is the weather in Paris?");
  auto with_tools = [&](ToolChoice::Mode mode) {
    GenerationTask t = task(p, 40);  // the forced opening counts: ~30 tokens of the tiny vocabulary
    t.tools.push_back({"get_weather", "", R"({"type":"object","properties":{"city":{"type":"string"}}})"});
    t.tool_choice.mode = mode;
    if (mode == ToolChoice::Mode::named) t.tool_choice.name = "get_weather";
    return t;
  };
  e->start(1, with_tools(ToolChoice::Mode::named));
  e->start(2, with_tools(ToolChoice::Mode::required));
  e->start(3, with_tools(ToolChoice::Mode::automatic));
  for (int i = 0; i < 200 && e->busy(); ++i) e->step(emit);
  ASSERT_FALSE(e->busy());
  // Named: the call to get_weather is open from the first token (random weights rarely close it:
  // an unfinished call comes back as text, as from any model).
  const bool named_call = !call_names[1].empty() && call_names[1][0] == "get_weather";
  EXPECT_TRUE(named_call || out[1].content.rfind("<|tool_call>call:get_weather{", 0) == 0)
      << ::testing::PrintToString(out[1].content) << " reasoning " << ::testing::PrintToString(out[1].reasoning)
      << " calls " << call_names[1].size() << " tokens " << out[1].usage.completion_tokens;
  EXPECT_EQ(out[1].usage.completion_tokens, 40);
  // Required: a call opening, the name left to the model.
  EXPECT_TRUE(!call_names[2].empty() || out[2].content.rfind("<|tool_call>call:", 0) == 0) << out[2].content;
  // Auto: the model's own choice, which for this random model is no call.
  EXPECT_TRUE(call_names[3].empty());
  EXPECT_EQ(out[3].content.find("<|tool_call>"), std::string::npos) << out[3].content;
}

TEST_P(ModelEngineTest, CancelFreesTheSlotAndEmitsNothingMore) {
  auto e = engine(1);
  std::map<TaskId, Outcome> out;
  const EmitFn emit = [&](TaskId id, EngineEvent ev) { record(out[id], ev); };
  const Prompt p = chat_prompt("Tell me a story");
  e->start(1, task(p, 100));
  for (int i = 0; i < 5; ++i) e->step(emit);
  e->cancel(1);
  EXPECT_FALSE(e->busy());
  EXPECT_EQ(e->free_slots(), 1);
  e->cancel(1);   // twice: ignored
  e->cancel(99);  // unknown: ignored
  const std::string before = out[1].content;
  e->step(emit);
  EXPECT_FALSE(out[1].finished);
  EXPECT_EQ(out[1].content, before);

  // The slot serves the next task normally.
  e->start(2, task(p, 12));
  run(*e, out);
  expect_same(out[2], reference(p, task(p, 12)), "after cancel");
}

TEST_P(ModelEngineTest, TasksItCannotRunAreClearErrors) {
  auto e = engine(1);
  const Prompt p = chat_prompt("Hi");
  GenerationTask empty = task(p, 5);
  empty.prompt_tokens.clear();
  EXPECT_ERROR_HAS(e->start(1, empty), "no tokens");
  GenerationTask too_long = task(p, 5);
  too_long.prompt_tokens.assign(kContext, tiny::kBos);
  EXPECT_ERROR_HAS(e->start(1, too_long), "the prompt is 256 tokens but the context holds 256");
  GenerationTask bad_id = task(p, 5);
  bad_id.prompt_tokens.push_back(tiny::kVocab);
  EXPECT_ERROR_HAS(e->start(1, bad_id), "token id 512 is outside the vocabulary");
  GenerationTask bad_bias = task(p, 5);
  bad_bias.sampling.logit_bias = {{100000, 1.0f}};
  EXPECT_ERROR_HAS(e->start(1, bad_bias), "logit_bias names token 100000");
  EXPECT_FALSE(e->busy());
  EXPECT_EQ(e->free_slots(), 1);

  e->start(1, task(p, 3));
  EXPECT_ERROR_HAS(e->start(2, task(p, 3)), "no free sequence");
}

TEST_P(ModelEngineTest, ContextFullEndsWithLength) {
  auto e = engine(1);
  // A prompt a few positions short of the context: generation stops when it is full.
  Prompt p = chat_prompt("Hi");
  while (static_cast<int64_t>(p.ids.size()) < kContext - 4) p.ids.push_back(p.ids.back() == 70 ? 71 : 70);
  std::map<TaskId, Outcome> out;
  e->start(1, task(p, 100));
  run(*e, out);
  EXPECT_EQ(out[1].reason, FinishReason::length);
  EXPECT_EQ(out[1].usage.completion_tokens, 5);  // 4 fed, the 5th sampled at the last position
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelEngineTest, ::testing::Values("gemma4-moe", "qwen35-moe"),
                         [](const auto& info) { return info.param == "gemma4-moe" ? std::string("gemma4") : std::string("qwen35"); });

}  // namespace
}  // namespace fl::server
