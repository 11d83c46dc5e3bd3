// Model names (store/model_name.h): what is accepted, what is rejected and why, and that every
// accepted name maps to files inside its family folder of the store.
#include <gtest/gtest.h>

#include "core/error.h"
#include "store/model_name.h"
#include "store/model_store.h"

namespace fl {
namespace {

std::string rejection(const std::string& text) {
  try {
    parse_model_name(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelName, ParsesFamilyAndTagAndDefaultsTheTagToLatest) {
  EXPECT_EQ(parse_model_name("gemma4:26b-a4b"), (ModelName{"gemma4", "26b-a4b"}));
  EXPECT_EQ(parse_model_name("gemma4"), (ModelName{"gemma4", "latest"}));
  EXPECT_EQ(parse_model_name("qwen3.5:0.8b_q8"), (ModelName{"qwen3.5", "0.8b_q8"}));
  EXPECT_EQ(parse_model_name("9x:1"), (ModelName{"9x", "1"}));
  EXPECT_EQ(parse_model_name("gemma4").str(), "gemma4:latest");
  EXPECT_EQ(parse_model_name(std::string(kMaxModelNameLength - 2, 'a') + ":b").str().size(), kMaxModelNameLength);
}

TEST(ModelName, RejectsEveryPathLikeOrMalformedNameWithTheRuleItBreaks) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "it is empty"},
      {"../etc/passwd", "'/' is not allowed"},
      {"/etc/passwd", "'/' is not allowed"},
      {"gemma4:../../x", "'/' is not allowed"},
      {"a\\b", "'\\' is not allowed"},
      {"..", "'..' is not allowed"},
      {"a..b:c", "'..' is not allowed"},
      {"gemma4:..", "'..' is not allowed"},
      {".hidden", "family (before ':') must start with a lowercase letter or digit"},
      {"-rf", "family (before ':') must start"},
      {"gemma4:.x", "tag (after ':') must start"},
      {"gemma4:-x", "tag (after ':') must start"},
      {":tag", "the family (before ':') is empty"},
      {"gemma4:", "the tag (after ':') is empty"},
      {"a:b:c", "more than one ':'"},
      {"Gemma4", "uppercase letters are not allowed"},
      {"gemma 4", "a space is not allowed"},
      {"gemma4\n", "byte \\x0a is not allowed"},
      {std::string("gem\0ma", 6), "a NUL byte is not allowed"},
      {"mod\xc3\xa8le", "byte \\xc3 is not allowed"},
      {"a*b", "'*' is not allowed"},
      {std::string(kMaxModelNameLength + 1, 'a'), "characters long, the limit is 128"},
  };
  for (const auto& [text, reason] : cases) {
    const std::string message = rejection(text);
    EXPECT_NE(message.find(reason), std::string::npos) << printable_name(text) << " -> " << message;
    EXPECT_EQ(message.rfind("invalid model name '", 0), 0u) << message;
    EXPECT_NE(message.find("e.g. gemma4:26b-a4b"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
    EXPECT_FALSE(try_parse_model_name(text).has_value()) << printable_name(text);
  }
}

TEST(ModelName, PrintableNameEscapesControlBytesAndCutsLongText) {
  EXPECT_EQ(printable_name(std::string("a\0b\n", 4)), "a\\x00b\\x0a");
  EXPECT_EQ(printable_name("a\\b"), "a\\\\b");
  EXPECT_EQ(printable_name(std::string(100, 'x'), 10), "xxxxxxxxxx...");
}

TEST(ModelName, EveryValidNameMapsInsideItsFamilyFolder) {
  const std::filesystem::path root = "/store/models";
  ModelStore store(root);
  for (const char* text : {"gemma4:26b-a4b", "a", "a.b_c-d:e.f_g-h", "x:latest"}) {
    const ModelName name = parse_model_name(text);
    for (const std::filesystem::path& p :
         {store.model_path(name), store.manifest_path(name), store.partial_path(name), store.partial_source_path(name)}) {
      EXPECT_EQ(p.lexically_normal(), p) << p;
      EXPECT_EQ(p.parent_path(), root / name.family) << p;
    }
    EXPECT_EQ(store.model_path(name).filename().string(), name.tag + ".fire");
    EXPECT_EQ(store.manifest_path(name).filename().string(), name.tag + ".json");
  }
  // Different names never share a file, even when a tag looks like another's file name.
  const ModelName a = parse_model_name("f:a"), b = parse_model_name("f:a.fire.partial");
  EXPECT_NE(store.partial_source_path(a), store.manifest_path(b));
  EXPECT_NE(store.partial_path(a), store.model_path(b));
}

}  // namespace
}  // namespace fl
