// `pull` against a loopback HTTP server in this process: a normal download, a dropped connection
// resumed with Range, a wrong checksum, a server that ignores Range, 416 answers, 404, redirects,
// files that are not models, size disagreements and a second pull of the same name at once.
// After every failure the store must hold no model under the final name.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "store/loopback_server.h"
#include "store/pull.h"
#include "store/store_test_util.h"

namespace fl {
namespace {

namespace fs = std::filesystem;
using test::Route;

class PullTest : public ::testing::Test {
 protected:
  test::TempDir home_;
  ModelStore store_{home_.path() / "models"};
  test::LoopbackServer server_;
  const std::string& model_ = test::fixture_fire_bytes();
  const std::string sha_ = test::fixture_fire_sha256();
  const ModelName name_ = parse_model_name("gemma4:tiny");

  PullRequest request(const std::string& path, const std::string& sha256 = "") const {
    return PullRequest{server_.url(path), name_.str(), sha256.empty() ? sha_ : sha256, ""};
  }
  PullResult pull(const PullRequest& r, PullProgress progress = {}) {
    PullOptions options;
    options.progress = std::move(progress);
    options.timeouts.connect_seconds = 5;
    options.timeouts.read_seconds = 5;
    return pull_model(store_, r, options);
  }
  std::string pull_error(const PullRequest& r) {
    try {
      pull(r);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  void expect_installed() {
    ASSERT_TRUE(fs::exists(store_.model_path(name_)));
    EXPECT_TRUE(read_text_file(store_.model_path(name_).string()) == model_) << "installed bytes differ";
    EXPECT_FALSE(fs::exists(store_.partial_path(name_)));
    EXPECT_FALSE(fs::exists(store_.partial_source_path(name_)));
    std::optional<ModelManifest> m = store_.read_manifest(name_);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->sha256, sha_);
    EXPECT_EQ(m->size, model_.size());
  }
  void expect_nothing_installed() {
    EXPECT_FALSE(fs::exists(store_.model_path(name_)));
    EXPECT_FALSE(fs::exists(store_.manifest_path(name_)));
    EXPECT_TRUE(store_.list().empty());
  }
  // A registry listing gemma4:tiny at /m.fire with `size` bytes and the model's sha256.
  std::string registry_json(uint64_t size) const {
    return nlohmann::json{{"gemma4:tiny", {{"url", server_.url("/m.fire")}, {"size", size}, {"sha256", sha_}}}}.dump();
  }
  uint64_t partial_size() const {
    std::error_code ec;
    const uint64_t n = fs::file_size(store_.partial_path(name_), ec);
    return ec ? 0 : n;
  }
  // A pull from a connection that drops at `at`: fails, keeping `at` bytes for a resume.
  void pull_dropped_at(const std::string& path, size_t at) {
    server_.set_route(path, Route::dropping_at(model_, at));
    const std::string message = pull_error(request(path));
    EXPECT_NE(message.find("run the same `fireline pull` again to resume"), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format("stopped after {} of {} bytes", at, model_.size())), std::string::npos)
        << message;
    expect_nothing_installed();
    EXPECT_EQ(partial_size(), at);
  }
};

TEST_F(PullTest, DownloadsVerifiesAndInstallsWithAManifestAndProgress) {
  ASSERT_GT(model_.size(), 100000u);
  server_.set_route("/m.fire", Route::file(model_));
  uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  const PullResult r = pull(request("/m.fire"), [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
  });
  EXPECT_FALSE(r.already_present);
  EXPECT_EQ(r.resumed_from, 0u);
  EXPECT_EQ(r.size, model_.size());
  EXPECT_EQ(r.sha256, sha_);
  EXPECT_EQ(r.path, store_.model_path(name_).string());
  EXPECT_GT(calls, 1);
  EXPECT_EQ(last_done, model_.size());
  EXPECT_EQ(last_total, model_.size());
  expect_installed();
  EXPECT_EQ(store_.read_manifest(name_)->url, server_.url("/m.fire"));
  EXPECT_EQ(server_.ranges("/m.fire"), std::vector<std::string>{""});
  const std::vector<StoredModel> listed = store_.list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].architecture, "gemma4");
}

TEST_F(PullTest, WithoutAnExpectedChecksumTheComputedOneIsRecorded) {
  server_.set_route("/m.fire", Route::file(model_));
  const PullResult r = pull(PullRequest{server_.url("/m.fire"), "", "", ""});
  EXPECT_EQ(r.name.str(), "m:latest");
  EXPECT_EQ(r.sha256, sha_);
  EXPECT_EQ(store_.read_manifest(r.name)->sha256, sha_);
}

TEST_F(PullTest, ADroppedConnectionIsResumedWithARangeRequest) {
  const size_t half = model_.size() / 2 + 1234;
  pull_dropped_at("/m.fire", half);
  server_.set_route("/m.fire", Route::file(model_));
  const PullResult r = pull(request("/m.fire"));
  EXPECT_EQ(r.resumed_from, half);
  expect_installed();
  const std::vector<std::string> ranges = server_.ranges("/m.fire");
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], "");
  EXPECT_EQ(ranges[1], fmt::format("bytes={}-", half));
}

TEST_F(PullTest, SeveralDropsResumeEachTimeFromWhereTheyStopped) {
  pull_dropped_at("/m.fire", 1000);
  pull_dropped_at("/m.fire", 70000);
  server_.set_route("/m.fire", Route::file(model_));
  EXPECT_EQ(pull(request("/m.fire")).resumed_from, 70000u);
  expect_installed();
  EXPECT_EQ(server_.ranges("/m.fire"), (std::vector<std::string>{"", "bytes=1000-", "bytes=70000-"}));
}

TEST_F(PullTest, AWrongChecksumInstallsNothingAndRemovesThePartialFile) {
  std::string wrong = model_;
  wrong[wrong.size() / 2] ^= 0x01;
  server_.set_route("/m.fire", Route::file(wrong));
  const std::string message = pull_error(request("/m.fire"));
  EXPECT_NE(message.find("sha256 mismatch for gemma4:tiny"), std::string::npos) << message;
  EXPECT_NE(message.find("expected " + sha_), std::string::npos) << message;
  EXPECT_NE(message.find("nothing was installed"), std::string::npos) << message;
  expect_nothing_installed();
  EXPECT_FALSE(fs::exists(store_.partial_path(name_)));
  EXPECT_FALSE(fs::exists(store_.partial_source_path(name_)));
}

TEST_F(PullTest, AWrongChecksumAfterAResumeAlsoInstallsNothing) {
  pull_dropped_at("/m.fire", 50000);
  std::string wrong = model_;
  wrong[wrong.size() - 10] ^= 0x40;  // in the part the resume fetches
  server_.set_route("/m.fire", Route::file(wrong));
  EXPECT_NE(pull_error(request("/m.fire")).find("sha256 mismatch"), std::string::npos);
  expect_nothing_installed();
  EXPECT_FALSE(fs::exists(store_.partial_path(name_)));
}

TEST_F(PullTest, AServerThatIgnoresRangeIsReadFromTheStart) {
  pull_dropped_at("/m.fire", 40000);
  server_.set_route("/m.fire", Route::ignoring_range(model_));
  const PullResult r = pull(request("/m.fire"));
  EXPECT_EQ(r.resumed_from, 0u);
  expect_installed();
  EXPECT_EQ(server_.ranges("/m.fire"), (std::vector<std::string>{"", "bytes=40000-"}));
}

TEST_F(PullTest, A206ForAnotherRangeThanAskedStartsOver) {
  pull_dropped_at("/m.fire", 40000);
  server_.set_route("/m.fire", Route::with_wrong_range(model_));
  EXPECT_EQ(pull(request("/m.fire")).resumed_from, 0u);
  expect_installed();
  EXPECT_EQ(server_.ranges("/m.fire"), (std::vector<std::string>{"", "bytes=40000-", ""}));
}

TEST_F(PullTest, A416ForAWholePartialFileInstallsItWithoutDownloadingAgain) {
  pull_dropped_at("/m.fire", 1000);
  // As if the earlier pull had received every byte and then stopped before installing.
  test::write_file(store_.partial_path(name_).string(), model_);
  server_.set_route("/m.fire", Route::file(model_));
  const PullResult r = pull(request("/m.fire"));
  EXPECT_EQ(r.resumed_from, model_.size());
  expect_installed();
  EXPECT_EQ(server_.ranges("/m.fire").back(), fmt::format("bytes={}-", model_.size()));
}

TEST_F(PullTest, A416ForAPartialFileLongerThanTheModelStartsOver) {
  pull_dropped_at("/m.fire", 1000);
  test::write_file(store_.partial_path(name_).string(), model_ + "trailing junk");
  server_.set_route("/m.fire", Route::file(model_));
  EXPECT_EQ(pull(request("/m.fire")).resumed_from, 0u);
  expect_installed();
  const std::vector<std::string> ranges = server_.ranges("/m.fire");
  EXPECT_EQ(ranges[ranges.size() - 2], fmt::format("bytes={}-", model_.size() + 13));
  EXPECT_EQ(ranges.back(), "");
}

TEST_F(PullTest, APartialFileFromAnotherUrlIsNotResumed) {
  pull_dropped_at("/old.fire", 30000);
  server_.set_route("/m.fire", Route::file(model_));
  EXPECT_EQ(pull(request("/m.fire")).resumed_from, 0u);
  expect_installed();
  EXPECT_EQ(server_.ranges("/m.fire"), std::vector<std::string>{""});
}

TEST_F(PullTest, NotFoundIsAClearErrorAndLeavesNothingBehind) {
  server_.set_route("/gone.fire", Route::not_found());
  const std::string message = pull_error(request("/gone.fire"));
  EXPECT_NE(message.find("cannot download " + server_.url("/gone.fire") + ": HTTP 404 Not Found"), std::string::npos)
      << message;
  expect_nothing_installed();
  EXPECT_FALSE(fs::exists(store_.partial_path(name_)));
  EXPECT_FALSE(fs::exists(store_.partial_source_path(name_)));
  EXPECT_FALSE(fs::exists(store_.family_dir(name_)));  // no empty folder left either
}

TEST_F(PullTest, RedirectsAreFollowed) {
  server_.set_route("/m.fire", Route::file(model_));
  server_.set_route("/latest", Route::redirect("/m.fire"));
  pull(request("/latest"));
  expect_installed();
  EXPECT_EQ(server_.ranges("/latest").size(), 1u);
  EXPECT_EQ(server_.ranges("/m.fire").size(), 1u);
}

TEST_F(PullTest, AFileThatIsNotAModelIsNotInstalled) {
  const std::string junk(5000, 'j');
  server_.set_route("/junk.fire", Route::file(junk));
  const std::string message = pull_error(PullRequest{server_.url("/junk.fire"), name_.str(), "", ""});
  EXPECT_NE(message.find("is not a model fireline can open"), std::string::npos) << message;
  EXPECT_NE(message.find("nothing was installed"), std::string::npos) << message;
  expect_nothing_installed();
  EXPECT_FALSE(fs::exists(store_.partial_path(name_)));
}

TEST_F(PullTest, ARegistryEntryIsPulledByNameAndASecondPullDownloadsNothing) {
  server_.set_route("/m.fire", Route::file(model_));
  const std::string registry = home_.file("registry.json");
  test::write_file(registry, registry_json(model_.size()));
  const PullResult first = pull(PullRequest{"gemma4:tiny", "", "", registry});
  EXPECT_FALSE(first.already_present);
  expect_installed();
  const PullResult second = pull(PullRequest{"gemma4:tiny", "", "", registry});
  EXPECT_TRUE(second.already_present);
  EXPECT_EQ(second.sha256, sha_);
  EXPECT_EQ(server_.ranges("/m.fire").size(), 1u);
}

TEST_F(PullTest, ARegistryServedOverHttpWorksToo) {
  server_.set_route("/m.fire", Route::file(model_));
  const nlohmann::json registry = {
      {"gemma4:tiny", {{"url", server_.url("/m.fire")}, {"size", model_.size()}, {"sha256", sha_}}}};
  server_.set_route("/registry.json", Route::file(registry.dump()));
  pull(PullRequest{"gemma4:tiny", "", "", server_.url("/registry.json")});
  expect_installed();
  server_.set_route("/missing.json", Route::not_found());
  const std::string message = pull_error(PullRequest{"gemma4:tiny", "", "", server_.url("/missing.json")});
  EXPECT_NE(message.find("HTTP 404 Not Found"), std::string::npos) << message;
}

TEST_F(PullTest, ASizeDisagreementWithTheRegistryStopsBeforeDownloading) {
  server_.set_route("/m.fire", Route::file(model_));
  const std::string registry = home_.file("registry.json");
  test::write_file(registry, registry_json(model_.size() + 1));
  const std::string message = pull_error(PullRequest{"gemma4:tiny", "", "", registry});
  EXPECT_NE(message.find(fmt::format("is {} bytes, but gemma4:tiny should be {} bytes", model_.size(), model_.size() + 1)),
            std::string::npos)
      << message;
  expect_nothing_installed();
  EXPECT_FALSE(fs::exists(store_.partial_path(name_)));
}

TEST_F(PullTest, AnExistingModelIsReplacedOnlyByAVerifiedDownload) {
  server_.set_route("/m.fire", Route::file(model_));
  pull(request("/m.fire"));
  std::string wrong = model_;
  wrong[100] ^= 0x01;
  server_.set_route("/m.fire", Route::file(wrong));
  // A different expected checksum forces a download; it fails and the old model stays.
  const std::string other_sha = sha256_hex(wrong.substr(1));
  EXPECT_NE(pull_error(request("/m.fire", other_sha)).find("sha256 mismatch"), std::string::npos);
  expect_installed();
}

TEST_F(PullTest, ASecondPullOfTheSameNameAtOnceIsRefused) {
  server_.set_route("/m.fire", Route::file(model_));
  store_.ensure_family_dir(name_);
  const int fd = ::open(store_.partial_path(name_).c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string message = pull_error(request("/m.fire"));
  ::close(fd);
  EXPECT_NE(message.find("another `fireline pull` of gemma4:tiny is running"), std::string::npos) << message;
  expect_nothing_installed();
  pull(request("/m.fire"));  // the lock is gone with its holder
  expect_installed();
}

TEST_F(PullTest, ARefusedConnectionIsAClearError) {
  std::string url;
  {
    test::LoopbackServer closed;  // a port that was just free
    url = closed.url("/m.fire");
  }
  const std::string message = pull_error(PullRequest{url, name_.str(), sha_, ""});
  EXPECT_NE(message.find("cannot download " + url + ": Connection error"), std::string::npos) << message;
  expect_nothing_installed();
  EXPECT_FALSE(fs::exists(store_.partial_path(name_)));
}

}  // namespace
}  // namespace fl
