#include <gtest/gtest.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "util/test_util.h"

namespace fl {
namespace {

using test::StTensor;
using test::TempDir;

// The error message must mention `needle` (each bad input gets its own clear message).
void expect_error(const std::string& path, const std::string& needle) {
  try {
    SafetensorsFile f(path);
    FAIL() << "no error for " << path << ", expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

TEST(Safetensors, ReadsTensors) {
  TempDir dir;
  test::write_file(dir.file("a.safetensors"),
                   test::safetensors_bytes({test::st_f32("w", {2, 3}, {1, 2, 3, 4, 5, 6}), test::st_f32("b", {3}, {7, 8, 9})}));
  SafetensorsFile f(dir.file("a.safetensors"));
  ASSERT_EQ(f.entries().size(), 2u);
  Tensor w = f.tensor(*f.find("w"));
  EXPECT_EQ(w.describe(), "f32[2, 3]");
  EXPECT_EQ(w.ptr<float>()[4], 5.0f);
  EXPECT_EQ(f.tensor(*f.find("b")).ptr<float>()[2], 9.0f);
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, RejectsBadFiles) {
  TempDir dir;
  std::string good = test::safetensors_bytes({test::st_f32("w", {2, 2}, {1, 2, 3, 4})});

  test::write_file(dir.file("short"), "abc");
  expect_error(dir.file("short"), "shorter than the 8-byte header length");

  test::write_file(dir.file("truncated"), good.substr(0, good.size() - 3));
  expect_error(dir.file("truncated"), "outside the");

  test::write_file(dir.file("header_cut"), good.substr(0, 20));
  expect_error(dir.file("header_cut"), "truncated");

  std::string huge = good;
  huge[7] = 0x7f;  // header length ~ 2^62
  test::write_file(dir.file("huge"), huge);
  expect_error(dir.file("huge"), "implausible safetensors header length");

  test::write_file(dir.file("notjson"), test::safetensors_from_header(nlohmann::json::object(), "") .replace(8, 2, "{x"));
  expect_error(dir.file("notjson"), "not valid JSON");

  nlohmann::json h = {{"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 12}}}}};
  test::write_file(dir.file("size"), test::safetensors_from_header(h, std::string(16, '\0')));
  expect_error(dir.file("size"), "has 12 bytes but F32 x [2,2] needs 16");

  h = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
       {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}};
  test::write_file(dir.file("overlap"), test::safetensors_from_header(h, std::string(12, '\0')));
  expect_error(dir.file("overlap"), "overlap");

  h = {{"w", {{"dtype", "F8_E4M3"}, {"shape", {4}}, {"data_offsets", {0, 4}}}}};
  test::write_file(dir.file("dtype"), test::safetensors_from_header(h, std::string(4, '\0')));
  expect_error(dir.file("dtype"), "unsupported dtype F8_E4M3");

  h = {{"w", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}}};
  test::write_file(dir.file("negative"), test::safetensors_from_header(h, std::string(4, '\0')));
  expect_error(dir.file("negative"), "not a non-negative integer");

  h = {{"w", {{"dtype", "F32"}, {"shape", {1ll << 40, 1ll << 40}}, {"data_offsets", {0, 4}}}}};
  test::write_file(dir.file("absurd"), test::safetensors_from_header(h, std::string(4, '\0')));
  expect_error(dir.file("absurd"), "absurd shape");

  h = {{"w", {{"dtype", "F32"}, {"shape", {1}}}}};
  test::write_file(dir.file("nooffsets"), test::safetensors_from_header(h, std::string(4, '\0')));
  expect_error(dir.file("nooffsets"), "data_offsets");

  test::write_file(dir.file("array"), test::safetensors_from_header(nlohmann::json::array(), ""));
  expect_error(dir.file("array"), "not a JSON object");

  expect_error(dir.file("does-not-exist"), "cannot open");
}

TEST(Safetensors, ShardedIndex) {
  TempDir dir;
  test::write_file(dir.file("s1.safetensors"), test::safetensors_bytes({test::st_f32("a", {1}, {1})}));
  test::write_file(dir.file("s2.safetensors"), test::safetensors_bytes({test::st_f32("b", {1}, {2}), test::st_f32("c", {1}, {3})}));
  nlohmann::json index = {{"weight_map", {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}, {"c", "s2.safetensors"}}}};
  test::write_file(dir.file("model.safetensors.index.json"), index.dump());
  SafetensorsSet set(dir.path().string());
  EXPECT_EQ(set.size(), 3u);
  EXPECT_EQ(set.find("c")->ptr<float>()[0], 3.0f);
  EXPECT_FALSE(set.find("d").has_value());

  index["weight_map"]["d"] = "s1.safetensors";
  test::write_file(dir.file("model.safetensors.index.json"), index.dump());
  try {
    SafetensorsSet bad(dir.path().string());
    FAIL() << "missing tensor not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'d' is listed in the index but missing"), std::string::npos) << e.what();
  }

  index["weight_map"].erase("d");
  index["weight_map"]["e"] = "s3.safetensors";
  test::write_file(dir.file("model.safetensors.index.json"), index.dump());
  EXPECT_THROW(SafetensorsSet(dir.path().string()), Error);

  index["weight_map"]["e"] = "../etc/passwd";
  test::write_file(dir.file("model.safetensors.index.json"), index.dump());
  EXPECT_THROW(SafetensorsSet(dir.path().string()), Error);

  test::write_file(dir.file("model.safetensors.index.json"), "{not json");
  EXPECT_THROW(SafetensorsSet(dir.path().string()), Error);
}

TEST(Safetensors, FiveDimensionalVisionTensorsAreValidatedButLeftOutOfTheSet) {
  // Qwen3.5's released files hold a Conv3d patch embedding [out, in, t, h, w].
  TempDir dir;
  std::vector<float> conv(2 * 3 * 2 * 2 * 2, 0.5f);
  test::write_file(dir.file("model.safetensors"),
                   test::safetensors_bytes({test::st_f32("model.visual.patch_embed.proj.weight", {2, 3, 2, 2, 2}, conv),
                                            test::st_f32("model.language_model.norm.weight", {2}, {1, 2})}));
  SafetensorsFile f(dir.file("model.safetensors"));
  ASSERT_EQ(f.entries().size(), 2u);
  const SafetensorsEntry* e = f.find("model.visual.patch_embed.proj.weight");
  ASSERT_NE(e, nullptr);
  try {
    f.tensor(*e);
    FAIL() << "a 5-D tensor was viewed";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("5 dimensions (at most 4 supported)"), std::string::npos) << err.what();
  }
  SafetensorsSet set(dir.path().string());
  EXPECT_EQ(set.names(), std::vector<std::string>{"model.language_model.norm.weight"});
  EXPECT_FALSE(set.find("model.visual.patch_embed.proj.weight").has_value());
  // its bytes are still checked: a 5-D tensor with too few bytes is an error
  nlohmann::json header;
  std::string bytes = test::safetensors_bytes({test::st_f32("v", {2, 3, 2, 2, 2}, conv)}, &header);
  header["v"]["shape"] = {2, 3, 2, 2, 3};
  test::write_file(dir.file("bad.safetensors"), test::safetensors_from_header(header, bytes.substr(bytes.size() - conv.size() * 4)));
  expect_error(dir.file("bad.safetensors"), "'v' has 192 bytes");
}

}  // namespace
}  // namespace fl
