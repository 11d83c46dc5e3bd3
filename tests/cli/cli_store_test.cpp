// fireline pull / list / rm, and store names in show, run as a user runs them: FIRELINE_HOME points
// at a temporary directory and the models come from a loopback HTTP server in this process.
#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "store/loopback_server.h"
#include "store/store_test_util.h"
#include "util/run_command.h"

namespace fl {
namespace {

namespace fs = std::filesystem;
using test::Route;

class StoreCli : public ::testing::Test {
 protected:
  test::TempDir home_;
  test::LoopbackServer server_;
  const std::string& model_ = test::fixture_fire_bytes();
  const std::string sha_ = test::fixture_fire_sha256();

  test::CommandResult fireline(const std::string& args) {
    return test::run_command("FIRELINE_HOME=" + test::shell_quote(home_.path().string()) + " " +
                             test::fireline_binary() + " " + args);
  }
  fs::path models() const { return home_.path() / "models"; }

  // Exit status 1 and one error line, the last on stderr (`pull` may print progress before it).
  static void expect_clean_failure(const test::CommandResult& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << "stdout: " << r.out;
    const size_t error_at = r.err.find("fireline: error: ");
    ASSERT_NE(error_at, std::string::npos) << "stderr: " << r.err;
    EXPECT_TRUE(error_at == 0 || r.err[error_at - 1] == '\n') << "stderr: " << r.err;
    const std::string error_line = r.err.substr(error_at);
    EXPECT_EQ(std::count(error_line.begin(), error_line.end(), '\n'), 1) << "stderr: " << r.err;
    EXPECT_EQ(error_line.back(), '\n') << "stderr: " << r.err;
    EXPECT_NE(error_line.find(needle), std::string::npos) << "stderr: " << r.err << "\nexpected to mention: " << needle;
  }
  // The whitespace-separated fields of the line of `out` that starts with `first`.
  static std::vector<std::string> row(const std::string& out, const std::string& first) {
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields(line);
      std::vector<std::string> fields_of_line;
      for (std::string f; fields >> f;) fields_of_line.push_back(f);
      if (!fields_of_line.empty() && fields_of_line[0] == first) return fields_of_line;
    }
    return {};
  }
};

TEST_F(StoreCli, PullListShowRmRoundTrip) {
  server_.set_route("/tiny.fire", Route::file(model_));
  auto pulled = fireline("pull " + server_.url("/tiny.fire") + " --name gemma4:tiny --sha256 " + sha_);
  ASSERT_EQ(pulled.exit_code, 0) << pulled.err;
  EXPECT_NE(pulled.out.find("pulled gemma4:tiny ("), std::string::npos) << pulled.out;
  EXPECT_NE(pulled.out.find("sha256 " + sha_ + ", verified"), std::string::npos) << pulled.out;
  EXPECT_NE(pulled.out.find((models() / "gemma4" / "tiny.fire").string()), std::string::npos) << pulled.out;
  EXPECT_TRUE(fs::exists(models() / "gemma4" / "tiny.json"));

  auto listed = fireline("list");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_EQ(row(listed.out, "NAME"), (std::vector<std::string>{"NAME", "SIZE", "FORMAT", "ARCHITECTURE", "MODIFIED"}));
  const std::vector<std::string> r = row(listed.out, "gemma4:tiny");
  ASSERT_GE(r.size(), 6u) << listed.out;
  EXPECT_EQ(r[3], "hf4");
  EXPECT_EQ(r[4], "gemma4");
  EXPECT_EQ(r[5], "just");  // "just now"

  auto json = fireline("list --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["name"], "gemma4:tiny");
  EXPECT_EQ(j[0]["size"], model_.size());
  EXPECT_EQ(j[0]["sha256"], sha_);
  EXPECT_EQ(j[0]["url"], server_.url("/tiny.fire"));
  EXPECT_EQ(j[0]["architecture"], "gemma4");

  auto shown = fireline("show gemma4:tiny");
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("architecture  gemma4"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find((models() / "gemma4" / "tiny.fire").string()), std::string::npos) << shown.out;

  auto removed = fireline("rm gemma4:tiny");
  ASSERT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_EQ(removed.out, "removed gemma4:tiny\n");
  EXPECT_FALSE(fs::exists(models() / "gemma4"));
  auto empty = fireline("list");
  EXPECT_EQ(empty.exit_code, 0);
  EXPECT_NE(empty.out.find("no models in " + models().string()), std::string::npos) << empty.out;

  expect_clean_failure(fireline("rm gemma4:tiny"), "unknown model 'gemma4:tiny'");
  expect_clean_failure(fireline("rm gemma4:tiny"), "see `fireline list`");
  expect_clean_failure(fireline("show gemma4:tiny"),
                       "unknown model 'gemma4:tiny' (see `fireline list`, or `fireline pull`)");
}

TEST_F(StoreCli, ADroppedPullIsResumedByTheNextPull) {
  server_.set_route("/tiny.fire", Route::dropping_at(model_, model_.size() / 2));
  const std::string args = "pull " + server_.url("/tiny.fire") + " --name gemma4:tiny --sha256 " + sha_;
  expect_clean_failure(fireline(args), "run the same `fireline pull` again to resume");
  EXPECT_TRUE(fs::exists(models() / "gemma4" / "tiny.fire.partial"));
  EXPECT_FALSE(fs::exists(models() / "gemma4" / "tiny.fire"));
  server_.set_route("/tiny.fire", Route::file(model_));
  auto resumed = fireline(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find(fmt::format("resuming gemma4:tiny at byte {}", model_.size() / 2)), std::string::npos)
      << resumed.err;
  EXPECT_EQ(server_.ranges("/tiny.fire").back(), fmt::format("bytes={}-", model_.size() / 2));
  EXPECT_FALSE(fs::exists(models() / "gemma4" / "tiny.fire.partial"));
}

TEST_F(StoreCli, AWrongChecksumFailsAndInstallsNothing) {
  std::string wrong = model_;
  wrong[12345] ^= 0x10;
  server_.set_route("/tiny.fire", Route::file(wrong));
  expect_clean_failure(fireline("pull " + server_.url("/tiny.fire") + " --name gemma4:tiny --sha256 " + sha_),
                       "sha256 mismatch for gemma4:tiny");
  EXPECT_FALSE(fs::exists(models() / "gemma4" / "tiny.fire"));
  EXPECT_FALSE(fs::exists(models() / "gemma4" / "tiny.fire.partial"));
  EXPECT_NE(fireline("list").out.find("no models"), std::string::npos);
}

TEST_F(StoreCli, PullByNameUsesTheStoreRegistryOrTheGivenOne) {
  server_.set_route("/tiny.fire", Route::file(model_));
  const std::string registry =
      nlohmann::json{{"gemma4:tiny", {{"url", server_.url("/tiny.fire")}, {"size", model_.size()}, {"sha256", sha_}}}}
          .dump();
  expect_clean_failure(fireline("pull gemma4:tiny"), "not in the registry (built-in, empty)");
  fs::create_directories(models());
  test::write_file((models() / "registry.json").string(), registry);
  auto first = fireline("pull gemma4:tiny");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto again = fireline("pull gemma4:tiny");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("gemma4:tiny is up to date"), std::string::npos) << again.out;
  EXPECT_EQ(server_.ranges("/tiny.fire").size(), 1u);

  const std::string other = home_.file("other.json");
  test::write_file(other, "{\"x\": 1}");
  expect_clean_failure(fireline("pull gemma4:tiny --registry " + other), "registry " + other + ": entry 'x'");
}

TEST_F(StoreCli, BadNamesAndMissingFilesAreOneLineErrors) {
  server_.set_route("/tiny.fire", Route::file(model_));
  server_.set_route("/gone.fire", Route::not_found());
  expect_clean_failure(fireline("pull " + server_.url("/tiny.fire") + " --name ../../etc/evil"),
                       "invalid model name '../../etc/evil'");
  expect_clean_failure(fireline("pull " + server_.url("/gone.fire")), "HTTP 404 Not Found");
  expect_clean_failure(fireline("pull ../x.fire"), "not an http(s) URL, and not a model name");
  expect_clean_failure(fireline("rm ../models"), "invalid model name '../models'");
  expect_clean_failure(fireline("pull " + server_.url("/tiny.fire") + " --sha256 12ab"), "is not a sha256");
  EXPECT_FALSE(fs::exists(home_.path() / "etc"));
  EXPECT_NE(fireline("list").out.find("no models"), std::string::npos);
}

}  // namespace
}  // namespace fl
