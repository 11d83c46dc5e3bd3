// The serve battery against the fake-engine server: its counters on answers whose faults are
// known (the fake engine echoes, so it "knows" only what the prompt contains), and the command.
#include "server/battery.h"

#include <gtest/gtest.h>

#include "server_test_util.h"
#include "util/run_command.h"
#include "util/test_util.h"

namespace fl::test {
namespace {

TEST(ServeBattery, AttractorDetector) {
  std::string loop;
  for (int i = 0; i < 30; ++i) loop += "again and again ";
  EXPECT_TRUE(server::is_attractor(loop));
  EXPECT_TRUE(server::is_attractor(std::string(200, 'x') + " " + [] {
    std::string s;
    for (int i = 0; i < 40; ++i) s += "the cat sat on the mat ";
    return s;
  }()));
  EXPECT_FALSE(server::is_attractor("BANANA"));
  EXPECT_FALSE(server::is_attractor(""));
  EXPECT_FALSE(
      server::is_attractor("The lighthouse keeper climbed down to the rocks at dawn, where a small wooden "
                           "box sat wedged between two stones. Inside lay a letter addressed to him, dated "
                           "forty years earlier, in his own handwriting."));
  // A looping tail after a normal start is still a loop.
  std::string tail = "First I will explain the plan in a few clear steps before answering. ";
  for (int i = 0; i < 60; ++i) tail += "wait, ";
  EXPECT_TRUE(server::is_attractor(tail));
}

TEST(ServeBattery, DefaultCasesAgainstTheEchoEngine) {
  server::FakeEngineConfig fake;
  fake.context_length = 200000;  // the haystack is ~25 KB, and the fake counts bytes
  TestServer s({}, fake);
  server::BatteryOptions options;
  options.url = "http://127.0.0.1:" + std::to_string(s.port()) + "/v1";
  const auto cases = server::default_battery_cases(3000);
  ASSERT_EQ(cases.size(), 7u);
  const auto rows = server::run_battery(options, cases);
  ASSERT_EQ(rows.size(), 14u);  // every case with thinking off, then on
  int thinking_rows = 0;
  for (const auto& r : rows) {
    SCOPED_TRACE(r.name + (r.thinking ? " (thinking)" : ""));
    thinking_rows += r.thinking;
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.finish_reason, "stop");
    EXPECT_FALSE(r.runaway);
    EXPECT_FALSE(r.empty);
    EXPECT_FALSE(r.attractor);
    EXPECT_GT(r.completion_tokens, 0);
    // An echo contains the answer only when the prompt does.
    const bool echo_knows = r.name == "instruction" || r.name == "needle" || r.name == "prose";
    EXPECT_EQ(r.retrieval_miss, !echo_knows);
  }
  EXPECT_EQ(thinking_rows, 7);
  // The recall case really sent its first answer back as history: the echo of turn 2 is scored.
  for (const auto& r : rows) {
    if (r.name == "recall") {
      EXPECT_EQ(r.answer, "You said: What is my favourite colour? Answer in one word.");
    }
  }
}

TEST(ServeBattery, CommandCountsFaultsAndExitsNonZero) {
  TestServer s;
  TempDir dir;
  write_file(dir.file("cases.json"), R"([
    {"name": "loop", "prompt": "[[long]]"},
    {"name": "silent", "prompt": "[[empty]]"},
    {"name": "stuck", "prompt": "[[repeat]]"},
    {"name": "fruit", "turns": ["remember kiwi", "which fruit? kiwi"], "expect": ["KIWI"]},
    {"name": "missing", "prompt": "nothing here", "expect": "mango"}
  ])");
  const std::string cmd = shell_quote(fireline_binary()) + " battery http://127.0.0.1:" + std::to_string(s.port()) +
                          " --thinking off --max-tokens 100 --prompts " + shell_quote(dir.file("cases.json"));
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("turns=5 runaway=1 empty=1 attractor=2 retrieval_miss=1 errors=0"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("4 of 5 rows failed"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("fruit"), std::string::npos);

  // Counting only retrieval misses, on the cases that have none, passes.
  write_file(dir.file("good.json"),
             R"([{"name": "fruit", "prompt": "kiwi", "expect": ["kiwi"]}, {"name": "loop", "prompt": "[[long]]"}])");
  auto ok = run_command(shell_quote(fireline_binary()) + " battery http://127.0.0.1:" + std::to_string(s.port()) +
                        " --max-tokens 32 --count retrieval_miss --prompts " + shell_quote(dir.file("good.json")));
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("turns=4 runaway=2"), std::string::npos) << ok.out;

  // Requests that fail are errors, whatever is counted.
  auto too_long = run_command(shell_quote(fireline_binary()) + " battery http://127.0.0.1:" + std::to_string(s.port()) +
                              " --thinking off --count retrieval_miss --needle-words 3000");
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.out.find("ERROR: HTTP 400"), std::string::npos) << too_long.out;

  auto unreachable = run_command(shell_quote(fireline_binary()) + " battery http://127.0.0.1:1");
  EXPECT_EQ(unreachable.exit_code, 1);
  EXPECT_NE(unreachable.err.find("cannot reach"), std::string::npos) << unreachable.err;
}

}  // namespace
}  // namespace fl::test
