// `fireline run` and `fireline chat` as a user runs them, on the random-weight fixture with a
// made-up tokenizer and chat template (tests/util/tiny_chat_model.h): JSON output, stdin prompts,
// streaming, stop strings, the thinking cap, chat turns and history trimming, Ctrl-C, and one
// clear error line for every kind of bad input. The examples of docs/cli.md are run too.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "util/run_command.h"
#include "util/test_util.h"
#include "util/tiny_chat_model.h"

namespace fl {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

test::CommandResult fireline(const std::string& args) { return test::run_command(test::fireline_binary() + " " + args); }
std::string q(const std::string& s) { return test::shell_quote(s); }

// `args` with `input` on stdin (from a file: run_command appends its own stderr redirection).
test::CommandResult fireline_stdin(const std::string& args, const std::string& input) {
  test::TempDir dir;
  const std::string file = dir.file("stdin");
  test::write_file(file, input);
  return fireline(args + " <" + q(file));
}

void expect_clean_failure(const test::CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << "stdout: " << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  EXPECT_EQ(r.err.rfind("fireline: error: ", 0), 0u) << "stderr: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err << "\nexpected to mention: " << needle;
}

class CliRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    model_ = test::tiny::make_model_dir(dir_->path() / "tiny");
  }
  static void TearDownTestSuite() { delete dir_; }

  // A greedy run's JSON (stdin closed, so nothing waits on it).
  static json run_json(const std::string& args) {
    auto r = fireline("run " + q(model_) + " " + args + " --json </dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out);
  }

  static test::TempDir* dir_;
  static std::string model_;
};
test::TempDir* CliRun::dir_ = nullptr;
std::string CliRun::model_;

TEST_F(CliRun, JsonHasTextUsageTimingsAndFinishReason) {
  json j = run_json(q("Why is the sky blue?") + " --temperature 0 --max-tokens 8 --ignore-eos");
  EXPECT_TRUE(j["text"].is_string());
  EXPECT_TRUE(j["reasoning"].is_string());
  EXPECT_TRUE(j["tool_calls"].is_array());
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 5);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 8);
  for (const char* key : {"ttft_ms", "prefill_ms", "prefill_tok_s", "decode_ms", "decode_tok_s", "total_ms"})
    EXPECT_TRUE(j["timings"][key].is_number()) << key;
  EXPECT_GT(j["timings"]["decode_tok_s"].get<double>(), 0.0);
  EXPECT_TRUE(j["seed"].is_number_unsigned());
}

TEST_F(CliRun, GreedyAndSeededRunsRepeat) {
  const std::string greedy = q("Hello there") + " --temperature 0 --max-tokens 12 --ignore-eos";
  EXPECT_EQ(run_json(greedy)["text"], run_json(greedy)["text"]);
  const std::string seeded = q("Hello there") + " --seed 7 --max-tokens 12 --ignore-eos";
  json a = run_json(seeded), b = run_json(seeded);
  EXPECT_EQ(a["text"], b["text"]);
  EXPECT_EQ(a["seed"], 7);
}

// --tp 2: the model split over two CPU ranks (issue 10) writes what one device writes (greedy;
// the split only reassociates two sums per layer). GPU ranks need one GPU each (--tp 64: more
// than any machine has) and take GPUs 0..N-1 (no index).
TEST_F(CliRun, TensorParallelRanksWriteTheSameGreedyText) {
  const std::string greedy = q("Hello there") + " --temperature 0 --max-tokens 12 --ignore-eos --backend cpu";
  EXPECT_EQ(run_json(greedy + " --tp 2")["text"], run_json(greedy)["text"]);
  expect_clean_failure(fireline("run " + q(model_) + " hi --tp 64 --backend cuda </dev/null"), "needs 64 of them");
  expect_clean_failure(fireline("run " + q(model_) + " hi --tp 2 --backend cuda:1 </dev/null"), "without an index");
  expect_clean_failure(fireline("run " + q(model_) + " hi --ep </dev/null"), "over the ranks of --tp N");
  expect_clean_failure(fireline("run " + q(model_) + " hi --tp 3 </dev/null"), "do not divide into 3");  // it splits
}

// A prompt cut into chunks of 3 tokens (--prefill-chunk) writes what one chunk of 512 writes: the
// chunking changes how the prompt is batched, not what the model computes (greedy, CPU).
TEST_F(CliRun, PrefillChunkChangesNotTheText) {
  const std::string greedy = q("Tell me a long story about the sea and the sky") +
                             " --temperature 0 --max-tokens 12 --ignore-eos --backend cpu";
  const json chunked = run_json(greedy + " --prefill-chunk 3");
  EXPECT_EQ(chunked["text"], run_json(greedy)["text"]);
  EXPECT_GT(chunked["usage"]["prompt_tokens"].get<int>(), 6);  // several chunks
  for (const char* bad : {"0", "70000"}) {                     // the command line's own range check
    const auto r = fireline("run " + q(model_) + " hi --prefill-chunk " + bad + " </dev/null");
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_LT(r.exit_code, 128) << bad;
    EXPECT_NE(r.err.find("--prefill-chunk: Value " + std::string(bad) + " not in range 1 to 65536"), std::string::npos)
        << r.err;
  }
}

// --json-schema: the random model's answer is an object the schema accepts (one with a single
// boolean leaves it no room to wander: it must finish); --json-object: the answer starts an object.
// Schemas it cannot enforce, or cannot read, are errors a user can act on.
TEST_F(CliRun, JsonSchemaHoldsTheAnswer) {
  const std::string schema = (dir_->path() / "ok.json").string();
  {
    std::ofstream out(schema);
    out << R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
               "additionalProperties": false})";
  }
  const json j = run_json(q("Is the sky blue?") + " --temperature 0 --max-tokens 200 --json-schema " + q(schema));
  const json answer = json::parse(j["text"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(answer.is_object()) << j["text"];
  EXPECT_EQ(answer.size(), 1u) << answer;
  EXPECT_TRUE(answer["ok"].is_boolean()) << answer;
  EXPECT_EQ(j["finish_reason"], "stop");
  const std::string text = run_json(q("Hello") + " --temperature 0 --max-tokens 8 --json-object")["text"];
  ASSERT_FALSE(text.empty());  // (EOS is refused until an object is whole: the answer starts one)
  EXPECT_EQ(text.find_first_not_of(" \t\r\n"), text.find('{')) << text;

  const std::string bad = (dir_->path() / "bad.json").string();
  {
    std::ofstream out(bad);
    out << R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})";
  }
  expect_clean_failure(fireline("run " + q(model_) + " hi --json-schema " + q(bad) + " </dev/null"),
                       "schema.properties.n.minimum");
  expect_clean_failure(fireline("run " + q(model_) + " hi --json-schema /nonexistent.json </dev/null"),
                       "cannot read /nonexistent.json");
}

TEST_F(CliRun, PromptFromStdinEqualsPromptArgument) {
  const std::string flags = " --temperature 0 --max-tokens 10 --ignore-eos --json";
  auto piped = fireline_stdin("run " + q(model_) + flags, "Why is the sky blue?\n");
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(json::parse(piped.out)["text"], run_json(q("Why is the sky blue?") + " --temperature 0 --max-tokens 10 --ignore-eos")["text"]);
  expect_clean_failure(fireline("run " + q(model_) + " </dev/null"), "the prompt is empty");
}

TEST_F(CliRun, StreamsTheAnswerToStdoutAndStatsToStderr) {
  const std::string flags = " --temperature 0 --repeat-penalty 10 --max-tokens 16 --ignore-eos --think off";
  json j = run_json(q("Tell me a story") + flags);
  auto r = fireline("run " + q(model_) + " " + q("Tell me a story") + flags + " </dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string text = j["text"];
  ASSERT_FALSE(text.empty());
  if (!text.empty() && text.back() != '\n') text += '\n';
  EXPECT_EQ(r.out, text);
  EXPECT_NE(r.err.find("generated 16 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("| length"), std::string::npos) << r.err;
  // -q: no stats
  auto quiet = fireline("-q run " + q(model_) + " " + q("Tell me a story") + " --temperature 0 --max-tokens 4 --ignore-eos </dev/null");
  EXPECT_EQ(quiet.exit_code, 0);
  EXPECT_EQ(quiet.err, "");
}

TEST_F(CliRun, StopStringIsNotPrinted) {
  // (--repeat-penalty: the random fixture otherwise repeats one token; see tests/runtime/generator_test.cpp)
  const std::string flags = " --temperature 0 --repeat-penalty 10 --max-tokens 60 --ignore-eos --think off";
  json full = run_json(q("Tell me a story") + flags);
  const std::string text = full["text"];
  ASSERT_GE(text.size(), 12u) << text;
  std::string stop;
  for (size_t i = text.size() / 2; i + 2 <= text.size() && stop.empty(); ++i)
    if ((text[i] & 0x80) == 0 && (text[i + 1] & 0x80) == 0 && text[i] != '\'' && text[i + 1] != '\'') stop = text.substr(i, 2);
  ASSERT_FALSE(stop.empty()) << text;
  json j = run_json(q("Tell me a story") + flags + " --stop " + q(stop) + " --stop never-seen");
  EXPECT_EQ(j["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["stop"], stop);
}

TEST_F(CliRun, ThinkingCapIsReported) {
  json j = run_json(q("Why is the sky blue?") + " --temperature 0 --max-tokens 12 --ignore-eos --think low --think-tokens 4");
  EXPECT_EQ(j["usage"]["reasoning_tokens"], 4);
  EXPECT_FALSE(j["reasoning"].get<std::string>().empty());
  expect_clean_failure(fireline("run " + q(model_) + " hi --think lots </dev/null"), "thinking mode 'lots'");
}

TEST_F(CliRun, RawCompletion) {
  json j = run_json("--raw " + q("Once upon a time") + " --temperature 0 --max-tokens 6 --ignore-eos");
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  // The prompt is the tokenizer's encoding of the text, with its BOS (no template around it).
  auto ids = fireline("tokenize " + q(model_) + " " + q("Once upon a time"));
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  EXPECT_EQ(j["usage"]["prompt_tokens"], json::parse(ids.out).size());
  expect_clean_failure(fireline("run " + q(model_) + " --raw --system x " + q("Once upon") + " </dev/null"), "--raw");
}

TEST_F(CliRun, FireFileRunsLikeItsDirectory) {
  const std::string fire = dir_->file("tiny.fire");
  // An output that is a directory is refused before any work (it used to fail at the final rename).
  expect_clean_failure(fireline("quantize " + q(model_) + " -o " + q(dir_->path().string()) + " --format f32"),
                       "is a directory");
  auto quantized = fireline("quantize " + q(model_) + " -o " + q(fire) + " --format f32");
  ASSERT_EQ(quantized.exit_code, 0) << quantized.err;
  auto r = fireline("run " + q(fire) + " " + q("Why is the sky blue?") + " --temperature 0 --max-tokens 10 --ignore-eos --json </dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["text"], run_json(q("Why is the sky blue?") + " --temperature 0 --max-tokens 10 --ignore-eos")["text"]);
}

// With no MODEL, run uses the model built into the executable; it also answers to its name.
TEST_F(CliRun, DefaultModelIsBuiltIn) {
  auto r = fireline("run " + q("Tell me a story.") + " --temperature 0 --max-tokens 12 --ignore-eos --json </dev/null");
  if (r.exit_code != 0 && r.err.find("built without the default model") != std::string::npos)
    GTEST_SKIP() << "built with FIRELINE_EMBED_DEFAULT_MODEL=OFF";
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  for (const char* name : {"fireline-tiny", "embedded:fireline-tiny"}) {
    auto named = fireline(std::string("run ") + name + " " + q("Tell me a story.") +
                          " --temperature 0 --max-tokens 12 --ignore-eos --json </dev/null");
    ASSERT_EQ(named.exit_code, 0) << named.err;
    EXPECT_EQ(json::parse(named.out)["text"], j["text"]) << name;
  }
  // Other commands that take a MODEL take the name too.
  auto logits = fireline("logits fireline-tiny --ids 2,10,11 --top 3");
  ASSERT_EQ(logits.exit_code, 0) << logits.err;
  EXPECT_EQ(json::parse(logits.out)["top"][0].size(), 3u);
  auto shown = fireline("show fireline-tiny --json");
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
}

// `make run`'s main job (scripts/run-default): the built-in model tells a story in English and the
// stats line gives the speeds.
TEST_F(CliRun, MakeRunTellsAStory) {
  const std::string build_dir = std::filesystem::path(test::fireline_binary()).parent_path().string();
  auto r = test::run_command(q(test::fixtures_dir() + "/../../scripts/run-default") + " " + q(build_dir));
  if (r.exit_code != 0 && r.err.find("built without the default model") != std::string::npos)
    GTEST_SKIP() << "built with FIRELINE_EMBED_DEFAULT_MODEL=OFF";
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex("generated [0-9]+ tokens, [0-9.]+ tok/s"))) << r.err;
  // English: most words of the story are common English words.
  int words = 0, common = 0;
  const std::set<std::string> kCommon = {"the", "and", "of", "to", "a", "in", "he", "his", "that", "was",
                                         "unto", "they", "it", "for", "i", "him", "with", "is", "not", "be"};
  std::istringstream in(r.out.substr(r.out.find('\n') + 1));  // after the echoed command
  for (std::string w; in >> w;) {
    std::string lower;
    for (char c : w)
      if (std::isalpha(static_cast<unsigned char>(c))) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.empty()) continue;
    ++words;
    common += kCommon.count(lower) ? 1 : 0;
  }
  EXPECT_GE(words, 20) << r.out;
  EXPECT_GE(common * 5, words) << "fewer than one word in five is a common English word:\n" << r.out;
}

TEST_F(CliRun, ErrorsAUserCanActOn) {
  expect_clean_failure(fireline("run /no/such/model " + q("hi there") + " </dev/null"), "/no/such/model: no such file or directory");
  expect_clean_failure(fireline("run nosuchmodel </dev/null"), "unknown model 'nosuchmodel'");
  // A directory that is not a model, a file that is not a model, a model without a tokenizer.
  const std::string empty_dir = dir_->file("empty");
  fs::create_directories(empty_dir);
  auto r = fireline("run " + q(empty_dir) + " " + q("hi there") + " </dev/null");
  expect_clean_failure(r, "config.json");
  const std::string text_file = dir_->file("notes.txt");
  test::write_file(text_file, "not a model\n");
  r = fireline("run " + q(text_file) + " " + q("hi there") + " </dev/null");
  expect_clean_failure(r, "notes.txt");
  expect_clean_failure(fireline("run " + q(test::fixtures_dir() + "/gemma4-moe") + " hi </dev/null"), "no tokenizer.json");
  // The prompt does not fit the context: both numbers.
  r = fireline("run " + q(model_) + " " + q("Tell me a story about the sea and the sky") + " --ctx 8 </dev/null");
  expect_clean_failure(r, "but the context holds 8");
  EXPECT_TRUE(std::regex_search(r.err, std::regex("the prompt is [0-9]+ tokens"))) << r.err;
  expect_clean_failure(fireline("run " + q(model_) + " hi --kv q4 </dev/null"), "--kv q4");
  expect_clean_failure(fireline("run " + q(model_) + " hi --backend tpu </dev/null"), "unknown backend 'tpu'");
}

TEST_F(CliRun, CtrlCCancelsWithStatsAndStatus130) {
  // A long generation (a large context, EOS ignored), interrupted once its answer is streaming
  // (so the handler is in place however slowly the machine loaded the model). A guard kills it
  // if the interrupt were ignored, so that the test fails instead of hanging.
  const std::string out = dir_->file("cancel.out"), err = dir_->file("cancel.err");
  const std::string cmd = test::fireline_binary() + " run " + q(model_) + " " + q("Tell me a story") +
                          " --ctx 200000 --ignore-eos --temperature 0 --repeat-penalty 10 </dev/null >" + q(out) + " 2>" +
                          q(err) +
                          " & pid=$!; i=0; while [ ! -s " + q(out) +
                          " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; kill -INT $pid;"
                          " (sleep 60; kill -KILL $pid) >/dev/null 2>&1 & guard=$!; wait $pid; rc=$?; kill $guard; echo $rc";
  auto r = test::run_command("sh -c " + q(cmd));
  EXPECT_EQ(r.out, "130\n") << r.err;
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  EXPECT_FALSE(slurp(out).empty());
  const std::string stats = slurp(err);
  EXPECT_NE(stats.find("| cancelled"), std::string::npos) << stats;
  EXPECT_TRUE(std::regex_search(stats, std::regex("generated [0-9]+ tokens, [0-9.]+ tok/s"))) << stats;
}

// ---- chat ----

TEST_F(CliRun, ChatTurnsClearAndExit) {
  auto r = fireline_stdin("chat " + q(model_) + " --temperature 0 --max-tokens 5 --ignore-eos --think off",
                          "Hello there\n/clear\n\nWhy is the sky blue?\n/nonsense\n/exit\nnot read\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto count = [&](const std::string& s) {
    size_t n = 0;
    for (size_t p = r.err.find(s); p != std::string::npos; p = r.err.find(s, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("generated 5 tokens"), 2u) << r.err;
  EXPECT_EQ(count("(conversation cleared)"), 1u) << r.err;
  EXPECT_EQ(count("unknown command /nonsense"), 1u) << r.err;
}

TEST_F(CliRun, ChatSecondTurnSeesTheFirst) {
  // The second answer of a conversation differs from the same question asked alone (the history
  // is in the prompt), and /clear makes it equal again.
  const std::string flags = " --temperature 0 --max-tokens 8 --ignore-eos --think off";
  auto alone = fireline_stdin("chat " + q(model_) + flags, "Why is the sky blue?\n");
  auto second = fireline_stdin("chat " + q(model_) + flags, "Hello there\nWhy is the sky blue?\n");
  auto cleared = fireline_stdin("chat " + q(model_) + flags, "Hello there\n/clear\nWhy is the sky blue?\n");
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  auto prompt_tokens = [](const std::string& err) {
    std::vector<int> n;
    std::regex re("prompt ([0-9]+) tokens");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator(); ++it)
      n.push_back(std::stoi((*it)[1]));
    return n;
  };
  const auto a = prompt_tokens(alone.err), s = prompt_tokens(second.err), c = prompt_tokens(cleared.err);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_GT(s[1], a[0] + 8);  // the first turn and its 8-token answer are in the prompt
  EXPECT_EQ(c[1], a[0]);
}

TEST_F(CliRun, ChatDropsOldTurnsToStayInTheContextAndSurvivesATooLongMessage) {
  std::string long_line;
  for (int i = 0; i < 40; ++i) long_line += "the sky is blue and the sea is green ";
  auto r = fireline_stdin("chat " + q(model_) + " --ctx 64 --temperature 0 --max-tokens 8 --ignore-eos --think off",
                          "Hello there\nTell me a story\nWhy is the sky blue?\nTell me about the moon\n" + long_line +
                              "\nHello again\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("oldest turn"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fireline: error: the prompt is"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("but the context holds 64"), std::string::npos) << r.err;
  std::regex re("prompt ([0-9]+) tokens");
  int turns = 0;
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), re); it != std::sregex_iterator(); ++it) {
    EXPECT_LE(std::stoi((*it)[1]) + 8, 64) << r.err;
    ++turns;
  }
  EXPECT_EQ(turns, 5);  // every turn but the one that cannot fit
}

TEST_F(CliRun, ChatWithoutAModelUsesTheBuiltInOne) {
  auto r = test::run_command("printf 'Tell me a story.\\n' | " + test::fireline_binary() +
                             " chat --temperature 0 --max-tokens 8");
  if (r.exit_code != 0 && r.err.find("built without the default model") != std::string::npos)
    GTEST_SKIP() << "built with FIRELINE_EMBED_DEFAULT_MODEL=OFF";
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_NE(r.err.find("generated "), std::string::npos) << r.err;
  expect_clean_failure(fireline("chat /no/such/model </dev/null"), "/no/such/model: no such file or directory");
  expect_clean_failure(fireline("chat nosuchmodel </dev/null"), "unknown model 'nosuchmodel'");
}

// ---- docs/cli.md ----

// Every `$ fireline run ...` / `$ ... | fireline run ...` / chat example line of docs/cli.md runs
// with the documented model name replaced by the test model; --json examples print JSON.
TEST_F(CliRun, DocumentedExamplesRun) {
  std::ifstream in(test::fixtures_dir() + "/../../docs/cli.md");
  ASSERT_TRUE(in) << "docs/cli.md";
  std::string line;
  int ran = 0;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## run" || line == "## chat";
    if (!in_section || line.rfind("$ ", 0) != 0 || line.find("fireline ") == std::string::npos) continue;
    std::string cmd = line.substr(2);
    for (size_t p; (p = cmd.find("gemma4-26b.fire")) != std::string::npos;) cmd.replace(p, 15, q(model_));
    cmd = std::regex_replace(cmd, std::regex("(^|\\| )fireline "), "$1" + test::fireline_binary() + " ");
    const bool piped = cmd.find('|') != std::string::npos;
    auto r = test::run_command(cmd + (piped ? "" : " </dev/null"));
    EXPECT_EQ(r.exit_code, 0) << line << "\n" << r.err;
    if (line.find("--json") != std::string::npos) {
      EXPECT_NO_THROW(json::parse(r.out)) << line << "\n" << r.out;
    }
    ++ran;
  }
  EXPECT_GE(ran, 5);
}

}  // namespace
}  // namespace fl
