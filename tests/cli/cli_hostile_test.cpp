// Hostile and unusual input to the fireline binary: output that cannot be written, JSON nested
// deeper than any stack, an API key or a host given as an empty string, integers in other bases. Each must be one clear error
// line and a non-zero status, never a crash or a silent success.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "util/run_command.h"
#include "util/test_util.h"

namespace fl {
namespace {

test::CommandResult fireline(const std::string& args) { return test::run_command(test::fireline_binary() + " " + args); }
std::string q(const std::string& s) { return test::shell_quote(s); }

void expect_clean_failure(const test::CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << "stdout: " << r.out;
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  EXPECT_EQ(r.err.rfind("fireline: error: ", 0), 0u) << "stderr: " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err << "\nexpected to mention: " << needle;
}

// A full disk (/dev/full) or a closed stdout loses the answer: that is a failure, not status 0.
TEST(CliHostile, OutputThatCannotBeWrittenIsAFailure) {
  const std::string run = "-q run --raw --temperature 0 --max-tokens 2 'hello there' </dev/null";
  EXPECT_EQ(fireline(run + " >/dev/null").exit_code, 0);
  expect_clean_failure(fireline(run + " >/dev/full"), "cannot write the output to stdout");
  expect_clean_failure(fireline(run + " --json >/dev/full"), "cannot write the output to stdout");
  auto closed = fireline(run + " >&-");
  EXPECT_EQ(closed.exit_code, 1) << closed.err;
  EXPECT_NE(closed.err.find("cannot write the output to stdout"), std::string::npos) << closed.err;
}

// Copying a parsed value recurses: a --messages, --tools or --vars file nested 100000 levels deep
// crashed `template` (a stack overflow) before the depth was checked. A NUL byte in one was read
// as the end of the file.
TEST(CliHostile, TemplateRefusesJsonNestedTooDeeplyOrHoldingNul) {
  test::TempDir dir;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  test::write_file(dir.file("deep.json"), deep);
  test::write_file(dir.file("deep_body.json"), "{\"messages\": " + deep + "}");
  test::write_file(dir.file("deep_vars.json"), "{\"x\": " + deep + "}");
  test::write_file(dir.file("msgs.json"), R"([{"role": "user", "content": "Hi!"}])");
  test::write_file(dir.file("t.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}");
  const std::string tmpl = "template " + q(dir.file("t.jinja"));
  expect_clean_failure(fireline(tmpl + " --messages " + q(dir.file("deep.json"))), "more than 512 levels deep");
  expect_clean_failure(fireline(tmpl + " --messages " + q(dir.file("deep_body.json"))), "more than 512 levels deep");
  expect_clean_failure(fireline(tmpl + " --messages " + q(dir.file("msgs.json")) + " --tools " + q(dir.file("deep.json"))),
                       "--tools file");
  expect_clean_failure(fireline(tmpl + " --messages " + q(dir.file("msgs.json")) + " --vars " +
                                q(dir.file("deep_vars.json"))),
                       "--vars file");
  // A NUL byte would end the parser's reading: the rest of the file dropped unread.
  test::write_file(dir.file("nul.json"), std::string(R"([{"role": "user", "content": "Hi!"}])") + '\0' + "]]]");
  expect_clean_failure(fireline(tmpl + " --messages " + q(dir.file("nul.json"))), "holds a NUL byte (at byte 36)");
  // Nesting a template may meet stays fine.
  const std::string nested = std::string(100, '[') + std::string(100, ']');
  test::write_file(dir.file("nested.json"), R"([{"role": "user", "content": "Hi!", "x": )" + nested + "}]");
  auto ok = fireline(tmpl + " --messages " + q(dir.file("nested.json")));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "Hi!");
}

// verify on a file that is no model at all says so (it once blamed a Hugging Face directory).
TEST(CliHostile, VerifyNamesWhatTheFileIsNot) {
  test::TempDir dir;
  test::write_file(dir.file("empty.fire"), "");
  test::write_file(dir.file("config.json"), R"({"model_type": "gemma4"})");
  for (const char* name : {"empty.fire", "config.json"})
    expect_clean_failure(fireline("verify " + q(dir.file(name))), "not a .fire file");
  expect_clean_failure(fireline("verify " + q(dir.path().string())), "Hugging Face directory");
}

// `--api-key "$KEY"` with KEY unset must not start a server that anyone can use.
TEST(CliHostile, ServeRefusesAnEmptyApiKey) {
  expect_clean_failure(fireline("serve --fake-engine --port 0 --api-key ''"), "--api-key is empty");
  expect_clean_failure(fireline("serve --fake-engine --port 0 --api-key-file ''"), "--api-key-file is empty");
  expect_clean_failure(fireline("serve --fake-engine --port 0 --api-key k --api-key-file ''"), "not both");
}

// `--host "$HOST"` with HOST unset must not listen on every interface under an empty name.
TEST(CliHostile, ServeRefusesAnEmptyHost) {
  expect_clean_failure(fireline("serve --fake-engine --port 0 --host ''"), "--host is empty");
}

// Integer options are decimal: CLI11 alone read "010" as 8 and "0x10" as 16 (a --max-tokens or
// --ctx meaning something other than what was typed); a plain value, a sign and 0 still work.
TEST(CliHostile, IntegerOptionsAreDecimal) {
  for (const char* value : {"010", "0x10", "0b11", "1e3", "' 7'", "12abc"}) {
    SCOPED_TRACE(value);
    auto r = fireline(std::string("-q run --raw --temperature 0 --max-tokens ") + value + " 'hello there' </dev/null");
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_LT(r.exit_code, 128) << r.err;
    EXPECT_NE(r.err.find("--max-tokens"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  auto octal = fireline("-q run --raw --temperature 0 --ctx 0100 'hello there' </dev/null");
  EXPECT_NE(octal.err.find("'0100' is not a decimal integer"), std::string::npos) << octal.err;
  auto root = fireline("--threads 010 list");
  EXPECT_NE(root.err.find("'010' is not a decimal integer"), std::string::npos) << root.err;
  for (const char* value : {"2", "+2", "0"}) {
    SCOPED_TRACE(value);
    auto r = fireline(std::string("-q run --raw --temperature 0 --max-tokens ") + value + " 'hello there' </dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
}

}  // namespace
}  // namespace fl
