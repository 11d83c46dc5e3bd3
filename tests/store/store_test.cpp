// The store's configuration, layout, list/remove, manifest and registry parsing, URL handling and
// model-argument resolution (no network: pull_test.cpp covers downloads).
#include <cstdlib>
#include <optional>

#include <gtest/gtest.h>

#include "core/error.h"
#include "store/http_client.h"
#include "store/model_store.h"
#include "store/pull.h"
#include "store/registry.h"
#include "store/store_test_util.h"

namespace fl {
namespace {

namespace fs = std::filesystem;

// Sets (or unsets, with nullopt) an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const std::string kSha = std::string(64, 'a');

// ---- configuration ----

TEST(StoreConfig, FirelineHomeWinsOverHome) {
  test::TempDir dir;
  ScopedEnv home("HOME", "/nonexistent-home");
  ScopedEnv fh("FIRELINE_HOME", dir.path().string());
  const StoreConfig config = store_config_from_environment();
  EXPECT_EQ(config.home, dir.path());
  EXPECT_EQ(config.models_dir(), dir.path() / "models");
  EXPECT_EQ(config.home_from, "FIRELINE_HOME");
  EXPECT_EQ(ModelStore::from_environment().dir(), dir.path() / "models");
}

TEST(StoreConfig, DefaultsToDotFirelineInHomeAndMakesRelativePathsAbsolute) {
  {
    ScopedEnv fh("FIRELINE_HOME", std::nullopt);
    ScopedEnv home("HOME", "/home/someone");
    const StoreConfig config = store_config_from_environment();
    EXPECT_EQ(config.models_dir(), fs::path("/home/someone/.fireline/models"));
    EXPECT_EQ(config.home_from, "HOME");
  }
  {
    ScopedEnv fh("FIRELINE_HOME", "");  // empty counts as unset
    ScopedEnv home("HOME", "/home/other");
    EXPECT_EQ(store_config_from_environment().models_dir(), fs::path("/home/other/.fireline/models"));
  }
  {
    ScopedEnv fh("FIRELINE_HOME", "relative/dir");
    const StoreConfig config = store_config_from_environment();
    EXPECT_TRUE(config.home.is_absolute()) << config.home;
    EXPECT_EQ(config.models_dir(), fs::current_path() / "relative/dir/models");
  }
}

// ---- manifest ----

TEST(Manifest, RoundTripsAndRejectsMalformedText) {
  ModelManifest m{"gemma4:e2b", "http://h/x.fire", kSha, 123, "2025-12-02T21:20:00Z"};
  const ModelManifest back = ModelManifest::parse(m.to_json(), "x.json");
  EXPECT_EQ(back.name, m.name);
  EXPECT_EQ(back.url, m.url);
  EXPECT_EQ(back.sha256, m.sha256);
  EXPECT_EQ(back.size, m.size);
  EXPECT_EQ(back.pulled_at, m.pulled_at);
  EXPECT_ERROR_HAS(ModelManifest::parse("[1]", "x.json"), "x.json: not a model manifest");
  EXPECT_ERROR_HAS(ModelManifest::parse("{\"name\":\"a\"}", "x.json"), "field 'url'");
  EXPECT_ERROR_HAS(ModelManifest::parse(R"({"name":"a","url":"u","sha256":"s","pulled_at":"t","size":-1})", "x.json"),
                   "field 'size'");
  EXPECT_EQ(utc_timestamp(std::chrono::system_clock::from_time_t(0)), "1970-01-01T00:00:00Z");
}

// ---- the store: list, remove, resolve ----

class StoreFixture : public ::testing::Test {
 protected:
  test::TempDir home_;
  ModelStore store_{home_.path() / "models"};

  // Puts the fixture model into the store as `name`, with a manifest unless told otherwise.
  void install(const std::string& text, bool with_manifest = true) {
    const ModelName name = parse_model_name(text);
    store_.ensure_family_dir(name);
    test::write_file(store_.model_path(name).string(), test::fixture_fire_bytes());
    if (with_manifest)
      write_file_atomically(store_.manifest_path(name),
                            ModelManifest{name.str(), "http://example/x.fire", test::fixture_fire_sha256(),
                                          test::fixture_fire_bytes().size(), "2025-12-02T21:20:00Z"}
                                .to_json());
  }
};

TEST_F(StoreFixture, AMissingStoreListsNothing) { EXPECT_TRUE(store_.list().empty()); }

TEST_F(StoreFixture, ListShowsModelsSortedWithMetadataAndSkipsEverythingElse) {
  install("zeta:1");
  install("alpha:latest", /*with_manifest=*/false);
  // Not models: a partial download, a manifest alone, a stray file, folders with invalid names,
  // a .fire whose name is not a valid tag, and the registry.
  const ModelName pending = parse_model_name("beta:1");
  store_.ensure_family_dir(pending);
  test::write_file(store_.partial_path(pending).string(), "partial bytes");
  test::write_file((store_.dir() / "beta" / "x.json").string(), "{}");
  test::write_file((store_.dir() / "beta" / "notes.txt").string(), "hi");
  fs::create_directories(store_.dir() / "UPPER");
  test::write_file((store_.dir() / "UPPER" / "x.fire").string(), test::fixture_fire_bytes());
  test::write_file((store_.dir() / "zeta" / ".hidden.fire").string(), test::fixture_fire_bytes());
  test::write_file(store_.default_registry_path().string(), "{}");
  // A .fire that does not open is listed, with the reason.
  fs::create_directories(store_.dir() / "broken");
  test::write_file((store_.dir() / "broken" / "latest.fire").string(), "not a gguf");

  const std::vector<StoredModel> models = store_.list();
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].name.str(), "alpha:latest");
  EXPECT_EQ(models[1].name.str(), "broken:latest");
  EXPECT_EQ(models[2].name.str(), "zeta:1");
  EXPECT_EQ(models[0].size, test::fixture_fire_bytes().size());
  EXPECT_EQ(models[0].architecture, "gemma4");
  EXPECT_EQ(models[0].format, "hf4");
  EXPECT_FALSE(models[0].manifest.has_value());
  EXPECT_TRUE(models[0].problem.empty()) << models[0].problem;
  EXPECT_FALSE(models[1].problem.empty());
  ASSERT_TRUE(models[2].manifest.has_value());
  EXPECT_EQ(models[2].manifest->sha256, test::fixture_fire_sha256());
}

TEST_F(StoreFixture, RemoveDeletesModelManifestAndPartialAndTheEmptyFamilyFolder) {
  install("gemma4:a");
  install("gemma4:b");
  const ModelName a = parse_model_name("gemma4:a");
  test::write_file(store_.partial_path(a).string(), "x");
  store_.remove(a);
  EXPECT_FALSE(fs::exists(store_.model_path(a)));
  EXPECT_FALSE(fs::exists(store_.manifest_path(a)));
  EXPECT_FALSE(fs::exists(store_.partial_path(a)));
  EXPECT_TRUE(store_.contains(parse_model_name("gemma4:b")));
  store_.remove(parse_model_name("gemma4:b"));
  EXPECT_FALSE(fs::exists(store_.dir() / "gemma4"));
  EXPECT_ERROR_HAS(store_.remove(a), "unknown model 'gemma4:a'");
  EXPECT_ERROR_HAS(store_.remove(a), "see `fireline list`");
}

TEST_F(StoreFixture, ResolveModelArgPrefersPathsThenStoreNames) {
  install("gemma4:e2b");
  install("gemma4:latest");
  const std::string on_disk = home_.file("local.fire");
  test::write_file(on_disk, "x");
  EXPECT_EQ(resolve_model_arg(on_disk, store_), on_disk);
  EXPECT_EQ(resolve_model_arg("gemma4:e2b", store_), store_.model_path(parse_model_name("gemma4:e2b")).string());
  EXPECT_EQ(resolve_model_arg("gemma4", store_), store_.model_path(parse_model_name("gemma4:latest")).string());
  EXPECT_ERROR_HAS(resolve_model_arg("gemma4:nope", store_),
                   "unknown model 'gemma4:nope' (see `fireline list`, or `fireline pull`)");
  EXPECT_ERROR_HAS(resolve_model_arg("./missing.fire", store_), "unknown model './missing.fire'");
  EXPECT_ERROR_HAS(resolve_model_arg("", store_), "unknown model ''");
  // The environment-reading form finds the same store through FIRELINE_HOME.
  ScopedEnv fh("FIRELINE_HOME", home_.path().string());
  EXPECT_EQ(resolve_model_arg("gemma4:e2b"), store_.model_path(parse_model_name("gemma4:e2b")).string());
  EXPECT_ERROR_HAS(resolve_model_arg("Not/A/Name"), "unknown model 'Not/A/Name'");
}

TEST_F(StoreFixture, AFileWhereAFamilyFolderShouldBeIsAClearError) {
  fs::create_directories(store_.dir());
  test::write_file((store_.dir() / "clash").string(), "x");
  EXPECT_ERROR_HAS(store_.ensure_family_dir(parse_model_name("clash:1")), "cannot create the model folder");
}

// ---- registry ----

TEST(Registry, ParsesEntriesAndNormalisesNamesAndDigests) {
  const Registry r = parse_registry(R"({
    "gemma4:e2b": {"url": "https://example.com/e2b.fire", "size": 10, "sha256": ")" + std::string(64, 'A') + R"(",
                   "description": "ignored"},
    "tiny": {"url": "http://127.0.0.1:8080/t.fire?x=1", "size": 0, "sha256": ")" + kSha + R"("}})",
                                    "reg.json");
  ASSERT_EQ(r.entries.size(), 2u);
  const RegistryEntry* e = r.find(parse_model_name("gemma4:e2b"));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->url, "https://example.com/e2b.fire");
  EXPECT_EQ(e->size, 10u);
  EXPECT_EQ(e->sha256, std::string(64, 'a'));
  EXPECT_NE(r.find(parse_model_name("tiny:latest")), nullptr);
  EXPECT_EQ(r.find(parse_model_name("gemma4")), nullptr);
}

TEST(Registry, RejectsMalformedRegistriesNamingTheEntry) {
  auto entry = [](const std::string& body) { return "{\"m:1\": " + body + "}"; };
  const std::string good_sha = "\"sha256\": \"" + kSha + "\"";
  EXPECT_ERROR_HAS(parse_registry("{", "r.json"), "registry r.json: not valid JSON");
  EXPECT_ERROR_HAS(parse_registry("[]", "r.json"), "expected a JSON object");
  EXPECT_ERROR_HAS(parse_registry(R"({"../x": {}})", "r.json"), "entry '../x': invalid model name");
  EXPECT_ERROR_HAS(parse_registry(entry("3"), "r.json"), "entry 'm:1': expected an object");
  EXPECT_ERROR_HAS(parse_registry(entry("{\"size\": 1, " + good_sha + "}"), "r.json"), "'url' is missing");
  EXPECT_ERROR_HAS(parse_registry(entry("{\"url\": \"http://h/x\", " + good_sha + "}"), "r.json"), "'size' is missing");
  EXPECT_ERROR_HAS(parse_registry(entry("{\"url\": \"http://h/x\", \"size\": -5, " + good_sha + "}"), "r.json"),
                   "'size' is missing or not a byte count");
  EXPECT_ERROR_HAS(parse_registry(entry("{\"url\": \"http://h/x\", \"size\": 1}"), "r.json"), "'sha256' is missing");
  EXPECT_ERROR_HAS(parse_registry(entry("{\"url\": \"http://h/x\", \"size\": 1, \"sha256\": \"abc\"}"), "r.json"),
                   "is not a sha256");
  EXPECT_ERROR_HAS(parse_registry(entry("{\"url\": \"file:///etc/passwd\", \"size\": 1, " + good_sha + "}"), "r.json"),
                   "is not an http(s) URL");
  EXPECT_ERROR_HAS(parse_registry(R"({"m": {"url": "http://h/x", "size": 1, "sha256": ")" + kSha +
                                      R"("}, "m:latest": {"url": "http://h/y", "size": 1, "sha256": ")" + kSha + R"("}})",
                                  "r.json"),
                   "listed twice");
  test::TempDir dir;
  EXPECT_ERROR_HAS(load_registry(dir.file("none.json")), "no such file");
}

// ---- URLs ----

TEST(HttpUrl, ParsesTheURLsAPullMeets) {
  HttpUrl u = parse_http_url("https://huggingface.co/org/repo/resolve/main/m.fire?download=true#frag");
  EXPECT_EQ(u.scheme, "https");
  EXPECT_EQ(u.host, "huggingface.co");
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.target, "/org/repo/resolve/main/m.fire?download=true");
  u = parse_http_url("HTTP://127.0.0.1:8080");
  EXPECT_EQ(u.scheme, "http");
  EXPECT_EQ(u.port, 8080);
  EXPECT_EQ(u.target, "/");
  EXPECT_EQ(u.origin(), "http://127.0.0.1:8080");
  u = parse_http_url("http://[::1]:9000/x");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.origin(), "http://[::1]:9000");
  EXPECT_TRUE(is_http_url("https://x"));
  EXPECT_FALSE(is_http_url("ftp://x"));
  EXPECT_FALSE(is_http_url("gemma4:e2b"));
  EXPECT_ERROR_HAS(parse_http_url("ftp://x/y"), "only http and https");
  EXPECT_ERROR_HAS(parse_http_url("http://"), "no host");
  EXPECT_ERROR_HAS(parse_http_url("http://h:0/"), "bad port");
  EXPECT_ERROR_HAS(parse_http_url("http://h:99999/"), "bad port");
  EXPECT_ERROR_HAS(parse_http_url("http://user:pw@h/"), "user names and passwords");
  EXPECT_ERROR_HAS(parse_http_url("http://h/a b"), "spaces and control characters");
}

TEST(HttpUrl, ModelNameFromUrlUsesTheFileName) {
  EXPECT_EQ(model_name_from_url("https://h/x/Gemma-4-E2B.fire?download=1").str(), "gemma-4-e2b:latest");
  EXPECT_EQ(model_name_from_url("http://h/tiny.gguf").str(), "tiny:latest");
  EXPECT_EQ(model_name_from_url("http://h/plain").str(), "plain:latest");
  EXPECT_ERROR_HAS(model_name_from_url("http://h/"), "give one with --name");
  EXPECT_ERROR_HAS(model_name_from_url("http://h/my%20model.fire"), "give one with --name");
}

TEST(PullPlan, ResolvesUrlsAndRegistryNames) {
  test::TempDir home;
  ModelStore store(home.path() / "models");
  PullPlan plan = plan_pull(store, {"http://h/m.fire", "", std::string(64, 'B'), ""});
  EXPECT_EQ(plan.name.str(), "m:latest");
  EXPECT_EQ(plan.sha256, std::string(64, 'b'));
  EXPECT_EQ(plan.expected_size, 0u);
  plan = plan_pull(store, {"http://h/m.fire", "mine:v1", "", ""});
  EXPECT_EQ(plan.name.str(), "mine:v1");
  EXPECT_TRUE(plan.sha256.empty());

  EXPECT_ERROR_HAS(plan_pull(store, {"gemma4:e2b", "", "", ""}), "not in the registry (built-in, empty)");
  EXPECT_ERROR_HAS(plan_pull(store, {"./m.fire", "", "", ""}), "not an http(s) URL, and not a model name");
  EXPECT_ERROR_HAS(plan_pull(store, {"http://h/m.fire", "../up", "", ""}), "invalid model name '../up'");
  EXPECT_ERROR_HAS(plan_pull(store, {"http://h/m.fire", "", "xyz", ""}), "--sha256: 'xyz' is not a sha256");

  // The store's registry.json is the default registry; --registry replaces it.
  fs::create_directories(store.dir());
  test::write_file(store.default_registry_path().string(),
                   R"({"gemma4:e2b": {"url": "http://h/e2b.fire", "size": 7, "sha256": ")" + kSha + "\"}}");
  plan = plan_pull(store, {"gemma4:e2b", "", "", ""});
  EXPECT_EQ(plan.url, "http://h/e2b.fire");
  EXPECT_EQ(plan.expected_size, 7u);
  EXPECT_EQ(plan.sha256, kSha);
  plan = plan_pull(store, {"gemma4:e2b", "local:copy", kSha, ""});
  EXPECT_EQ(plan.name.str(), "local:copy");
  EXPECT_ERROR_HAS(plan_pull(store, {"gemma4:e2b", "", std::string(64, 'c'), ""}), "differs from the registry's");
  const std::string other = home.file("other.json");
  test::write_file(other, "{}");
  EXPECT_ERROR_HAS(plan_pull(store, {"gemma4:e2b", "", "", other}), "not in the registry (" + other + ")");
}

}  // namespace
}  // namespace fl
