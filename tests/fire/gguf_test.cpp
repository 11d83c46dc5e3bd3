// GGUF reader and writer: a round trip of every metadata type and of row-safe tensors, the
// dimension-order conversion at the boundary, alignment, and one clear fl::Error for every kind of
// malformed file.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/mapped_file.h"
#include "fire/fire_test_util.h"
#include "io/gguf.h"

namespace fl {
namespace {

using test::Bytes;
using test::RawGguf;
using test::RawTensor;

// Expects opening `bytes` as a GGUF file to fail with a message containing `needle`.
void expect_gguf_error(const std::string& bytes, const std::string& needle) {
  test::TempDir dir;
  test::write_file(dir.file("x.gguf"), bytes);
  try {
    GgufFile file(dir.file("x.gguf"));
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << "\nexpected: " << needle;
    EXPECT_NE(std::string(e.what()).find("x.gguf"), std::string::npos) << "the message names the file: " << e.what();
  }
}

GgufValue array_of_u32(std::vector<uint32_t> v) {
  std::vector<GgufValue> items;
  for (uint32_t x : v) items.push_back(GgufValue::of_u32(x));
  return GgufValue::of_array(GgufValueType::u32, std::move(items));
}

TEST(Gguf, RoundTripsMetadataOfEveryTypeAndRowSafeTensors) {
  GgufWriter w(64);
  auto scalar = [](GgufValueType type, int64_t integer) {
    GgufValue v;
    v.type = type;
    v.integer = integer;
    return v;
  };
  w.add_metadata("t.u8", scalar(GgufValueType::u8, 250));
  w.add_metadata("t.i8", scalar(GgufValueType::i8, -7));
  w.add_metadata("t.u16", scalar(GgufValueType::u16, 65000));
  w.add_metadata("t.i16", scalar(GgufValueType::i16, -30000));
  w.add_metadata("t.u32", GgufValue::of_u32(4000000000u));
  w.add_metadata("t.i32", GgufValue::of_i32(-2000000000));
  w.add_metadata("t.u64", GgufValue::of_u64(18000000000000000000ull));
  w.add_metadata("t.i64", GgufValue::of_i64(-9000000000000000000ll));
  w.add_metadata("t.f32", GgufValue::of_f32(1.5f));
  w.add_metadata("t.f64", GgufValue::of_f64(-2.25e100));
  w.add_metadata("t.bool", GgufValue::of_bool(true));
  w.add_metadata("t.string", GgufValue::of_string("héllo\n{\"json\": 1}"));
  w.add_metadata("t.array", array_of_u32({1, 2, 3}));
  w.add_metadata("t.strings", GgufValue::of_array(GgufValueType::string,
                                                  {GgufValue::of_string("a"), GgufValue::of_string("")}));
  w.add_metadata("t.nested", GgufValue::of_array(GgufValueType::array, {array_of_u32({7}), array_of_u32({})}));

  // K = 200 is not a multiple of 128: HFQ4-G128 rows are padded to 2 groups each (row-safe).
  const size_t a = w.add_tensor("a.weight", 0, {3, 5});
  const size_t b = w.add_tensor("b.weight", 8, {2, 64});
  const size_t c = w.add_tensor("c.weight", 1007, {3, 200});
  const size_t d = w.add_tensor("d.experts", 1006, {2, 3, 256});
  EXPECT_EQ(w.tensor(a).nbytes(), 3u * 5 * 4);
  EXPECT_EQ(w.tensor(b).nbytes(), 2u * 2 * 34);
  EXPECT_EQ(w.tensor(c).nbytes(), 3u * 2 * 72);
  EXPECT_EQ(w.tensor(d).nbytes(), 6u * 136);

  std::vector<std::string> payload;
  for (size_t i = 0; i < w.tensor_count(); ++i) {
    std::string bytes(w.tensor(i).nbytes(), '\0');
    for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = static_cast<char>(j * 31 + i * 7);
    payload.push_back(bytes);
  }
  test::TempDir dir;
  const std::string path = dir.file("t.gguf");
  {
    GgufStreamWriter out(path, w);
    for (size_t i = 0; i < w.tensor_count(); ++i) {
      // In uneven pieces, as the quantizer writes slabs.
      const std::string& p = payload[i];
      size_t at = 0;
      for (size_t piece = 1; at < p.size(); piece = piece * 3 + 1) {
        size_t n = std::min(piece, p.size() - at);
        out.write_tensor_bytes(i, p.data() + at, n);
        at += n;
      }
    }
    EXPECT_FALSE(std::filesystem::exists(path)) << "the file appears only when finished";
    out.finish(w);
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".partial"), std::string::npos) << entry.path();

  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.file_size(), w.total_size());
  ASSERT_NE(f.find_metadata("general.alignment"), nullptr);
  EXPECT_EQ(f.find_metadata("general.alignment")->type, GgufValueType::u32);
  EXPECT_EQ(f.find_metadata("general.alignment")->integer, 64);
  EXPECT_EQ(f.find_metadata("t.u8")->integer, 250);
  EXPECT_EQ(f.find_metadata("t.i8")->integer, -7);
  EXPECT_EQ(f.find_metadata("t.u16")->integer, 65000);
  EXPECT_EQ(f.find_metadata("t.i16")->integer, -30000);
  EXPECT_EQ(f.find_metadata("t.u32")->integer, 4000000000ll);
  EXPECT_EQ(f.find_metadata("t.i32")->integer, -2000000000);
  EXPECT_EQ(static_cast<uint64_t>(f.find_metadata("t.u64")->integer), 18000000000000000000ull);
  EXPECT_EQ(f.find_metadata("t.u64")->describe(), "18000000000000000000");
  EXPECT_EQ(f.find_metadata("t.i64")->integer, -9000000000000000000ll);
  EXPECT_EQ(f.find_metadata("t.f32")->real, 1.5);
  EXPECT_EQ(f.find_metadata("t.f64")->real, -2.25e100);
  EXPECT_EQ(f.find_metadata("t.bool")->integer, 1);
  EXPECT_EQ(f.metadata_string("t.string"), "héllo\n{\"json\": 1}");
  EXPECT_EQ(f.metadata_string("absent"), std::nullopt);
  EXPECT_THROW(f.metadata_string("t.u32"), Error);
  const GgufValue* arr = f.find_metadata("t.array");
  ASSERT_EQ(arr->items.size(), 3u);
  EXPECT_EQ(arr->element_type, GgufValueType::u32);
  EXPECT_EQ(arr->items[2].integer, 3);
  EXPECT_EQ(f.find_metadata("t.strings")->items[0].text, "a");
  EXPECT_EQ(f.find_metadata("t.strings")->items[1].text, "");
  const GgufValue* nested = f.find_metadata("t.nested");
  ASSERT_EQ(nested->items.size(), 2u);
  EXPECT_EQ(nested->items[0].items[0].integer, 7);
  EXPECT_TRUE(nested->items[1].items.empty());
  // Metadata keeps the order it was written in (general.alignment first: the writer adds it).
  EXPECT_EQ(f.metadata().front().key, "general.alignment");
  EXPECT_EQ(f.metadata().back().key, "t.nested");

  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[2].name, "c.weight");
  EXPECT_EQ(f.tensors()[2].shape, (std::vector<int64_t>{3, 200}));  // PyTorch order in memory
  EXPECT_EQ(f.tensors()[3].shape, (std::vector<int64_t>{2, 3, 256}));
  for (size_t i = 0; i < 4; ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(t.data_begin % 64, 0u);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.tensor_data(t)), t.nbytes()), payload[i]) << t.name;
  }
  EXPECT_EQ(f.find_tensor("b.weight")->type_id, 8u);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);

  // On disk GGUF lists dims innermost first: ne = {256, 3, 2} for the [2, 3, 256] tensor.
  std::string raw = read_text_file(path);
  Bytes info;
  info.str("d.experts").put<uint32_t>(3).put<uint64_t>(256).put<uint64_t>(3).put<uint64_t>(2).put<uint32_t>(1006);
  EXPECT_NE(raw.find(info.data), std::string::npos);
}

// Two writers of one path (two `quantize` or `synth` runs with the same -o) each write a partial
// file of their own: the one that finishes last wins, whole; neither truncates the other's bytes.
TEST(Gguf, ConcurrentWritersOfOnePathEachProduceAWholeFile) {
  test::TempDir dir;
  const std::string path = dir.file("same.gguf");
  GgufWriter a, b;
  a.add_metadata("who", GgufValue::of_string("a"));
  b.add_metadata("who", GgufValue::of_string("b"));
  const size_t ta = a.add_tensor("t", 0, {64}), tb = b.add_tensor("t", 0, {64});
  std::vector<float> ones(64, 1.0f), twos(64, 2.0f);
  {
    GgufStreamWriter wa(path, a), wb(path, b);  // both open before either writes
    wa.write_tensor_bytes(ta, ones.data(), 64 * 4);
    wb.write_tensor_bytes(tb, twos.data(), 64 * 4);
    wb.finish(b);
    wa.finish(a);  // last to finish
  }
  GgufFile f(path);
  EXPECT_EQ(f.metadata_string("who"), "a");
  float first = 0;
  std::memcpy(&first, f.tensor_data(f.tensors().at(0)), 4);
  EXPECT_EQ(first, 1.0f);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".partial"), std::string::npos) << entry.path();
}

// Ctrl-C (or SIGTERM, SIGHUP) during a long quantize or synth ends the process without running the
// writer's destructor; the handler the writer installs removes the partial file all the same,
// and the process still dies of the signal. (Before, gigabytes were left behind.)
TEST(Gguf, AFatalSignalMidWriteRemovesThePartialFile) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    ::sigaction(sig, nullptr, &current);
    if (current.sa_handler == SIG_IGN) continue;  // ignored here (a background job): nothing to test
    test::TempDir dir;
    const std::string path = dir.file("cut.gguf");
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      GgufWriter w;
      w.add_tensor("t", 0, {64});
      GgufStreamWriter out(path, w);
      std::vector<float> half(32, 1.0f);
      out.write_tensor_bytes(0, half.data(), half.size() * sizeof(float));
      ::raise(sig);
      ::_exit(0);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "signal " << sig << ", status " << status;
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "signal " << sig << " left "
                                                       << std::filesystem::directory_iterator(dir.path())->path();
  }
}

TEST(Gguf, DefaultAlignmentIs32AndNeedsNoKey) {
  GgufWriter w;
  w.add_tensor("x", 0, {1});
  w.add_tensor("y", 0, {3});
  test::TempDir dir;
  {
    GgufStreamWriter out(dir.file("a.gguf"), w);
    float v[3] = {1, 2, 3};
    out.write_tensor_bytes(0, v, 4);
    out.write_tensor_bytes(1, v, 12);
    out.finish(w);
  }
  GgufFile f(dir.file("a.gguf"));
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.find_metadata("general.alignment"), nullptr);
  EXPECT_EQ(f.tensors()[1].offset, 32u);
}

TEST(Gguf, HonoursAnyPowerOfTwoAlignment) {
  RawGguf g;
  g.u32_kv("general.alignment", 256);
  g.alignment = 256;
  g.tensors = {{"a", {4}, 0, 0}, {"b", {2}, 0, 256}};
  g.data = std::string(256 + 8, '\x01');
  test::TempDir dir;
  test::write_file(dir.file("a.gguf"), g.bytes());
  GgufFile f(dir.file("a.gguf"));
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.data_offset() % 256, 0u);
  EXPECT_EQ(f.tensors()[1].data_begin, f.data_offset() + 256);

  g.tensors[1].offset = 32;  // fine at the default alignment, not at 256
  expect_gguf_error(g.bytes(), "data offset 32 is not a multiple of the alignment 256");
}

TEST(Gguf, TensorBytesFollowRowSafePackingForFirelineTypesOnly) {
  EXPECT_EQ(gguf_tensor_bytes(*gguf_type_info(1007), {5, 704}, "t"), 5u * 6 * 72);  // 5.5 groups -> 6
  EXPECT_EQ(gguf_tensor_bytes(*gguf_type_info(1006), {1, 2816}, "t"), 11u * 136);
  EXPECT_EQ(gguf_tensor_bytes(*gguf_type_info(1008), {2, 300}, "t"), 2u * 2 * 200);
  EXPECT_EQ(gguf_tensor_bytes(*gguf_type_info(8), {1, 40}, "t"), 2u * 34);  // fireline Q8_0 rows are row-safe too
  EXPECT_EQ(gguf_tensor_bytes(*gguf_type_info(12), {3, 512}, "t"), 3u * 2 * 144);
  EXPECT_EQ(gguf_tensor_bytes(*gguf_type_info(14), {1, 256}, "t"), 210u);
  EXPECT_EQ(gguf_tensor_bytes(*gguf_type_info(30), {7, 3}, "t"), 42u);
  EXPECT_THROW(gguf_tensor_bytes(*gguf_type_info(12), {3, 100}, "t"), Error);
  EXPECT_EQ(gguf_type_info(4), nullptr);  // removed from ggml
  EXPECT_EQ(gguf_type_id(DType::hfq4_g256), 1006u);
  EXPECT_EQ(gguf_type_id(DType::hfq4_g128), 1007u);
  EXPECT_EQ(gguf_type_id(DType::hfq6_g256), 1008u);
  EXPECT_EQ(gguf_type_id(DType::q8_0), 8u);
  EXPECT_EQ(gguf_type_id(DType::bf16), 30u);
  EXPECT_EQ(gguf_type_id(DType::f16), 1u);
  EXPECT_EQ(gguf_type_id(DType::f32), 0u);
  EXPECT_THROW(gguf_type_id(DType::u8), Error);
}

TEST(Gguf, WriterRejectsWhatItCannotWrite) {
  GgufWriter w;
  w.add_metadata("k", GgufValue::of_u32(1));
  EXPECT_THROW(w.add_metadata("k", GgufValue::of_u32(2)), Error);
  w.add_tensor("t", 0, {2});
  EXPECT_THROW(w.add_tensor("t", 0, {2}), Error);
  EXPECT_THROW(w.add_tensor("u", 999, {2}), Error);
  EXPECT_THROW(w.add_tensor("v", 0, {}), Error);
  EXPECT_THROW(w.add_tensor("w", 0, {1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(w.add_tensor("", 0, {1}), Error);
  EXPECT_THROW(w.add_tensor("q", 12, {1, 100}), Error);  // Q4_K needs K % 256 == 0
}

RawGguf one_tensor_file() {
  RawGguf g;
  g.string_kv("general.architecture", "gemma4");
  g.tensors = {{"w", {4, 2}, 0, 0}};  // f32 [2, 4]
  g.data = std::string(32, '\x02');
  return g;
}

TEST(Gguf, AcceptsTheMinimalFileAndVersion2) {
  test::TempDir dir;
  test::write_file(dir.file("a.gguf"), one_tensor_file().bytes());
  GgufFile f(dir.file("a.gguf"));
  EXPECT_EQ(f.tensors()[0].shape, (std::vector<int64_t>{2, 4}));
  RawGguf v2 = one_tensor_file();
  v2.version = 2;
  test::write_file(dir.file("b.gguf"), v2.bytes());
  EXPECT_EQ(GgufFile(dir.file("b.gguf")).version(), 2u);
  RawGguf empty;
  test::write_file(dir.file("c.gguf"), empty.bytes());
  EXPECT_TRUE(GgufFile(dir.file("c.gguf")).tensors().empty());
}

TEST(Gguf, BadHeadersGiveClearErrors) {
  expect_gguf_error("", "too short for the magic");
  expect_gguf_error("GGU", "too short for the magic");
  RawGguf g = one_tensor_file();
  g.magic = 0x4c4d4747;  // "GGML"
  expect_gguf_error(g.bytes(), "not a GGUF file (magic 'GGML', expected 'GGUF')");
  g = one_tensor_file();
  g.version = 1;
  expect_gguf_error(g.bytes(), "GGUF version 1 is not supported");
  g.version = 0x03000000;
  expect_gguf_error(g.bytes(), "big-endian GGUF is not supported");
  expect_gguf_error(std::string("GGUF\x03\0\0\0", 8), "truncated: tensor count at byte 8");
  g = one_tensor_file();
  g.n_tensors_override = 1ll << 40;
  expect_gguf_error(g.bytes(), "tensors, more than the");
  g = one_tensor_file();
  g.n_metadata = 1ull << 50;
  expect_gguf_error(g.bytes(), "metadata entries, more than the");
}

TEST(Gguf, BadMetadataGivesClearErrors) {
  auto with_kv = [](const std::string& encoded) {
    RawGguf g = one_tensor_file();
    g.raw_kv(encoded);
    return g.bytes();
  };
  Bytes b;
  b.str("k").put<uint32_t>(8).put<uint64_t>(1ull << 40);  // string longer than the file
  expect_gguf_error(with_kv(b.data), "claims 1099511627776 bytes");
  b = {};
  b.str("k").put<uint32_t>(8).put<uint64_t>(5000);
  expect_gguf_error(with_kv(b.data), "truncated");
  b = {};
  b.str("k").put<uint32_t>(13).put<uint32_t>(0);
  expect_gguf_error(with_kv(b.data), "has unknown value type 13");
  b = {};
  b.str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1ull << 60);
  expect_gguf_error(with_kv(b.data), "array of 1152921504606846976 u32 does not fit");
  b = {};
  b.str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(1);
  expect_gguf_error(with_kv(b.data), "unknown array element type 77");
  b = {};
  b.str("k").put<uint32_t>(9);
  for (int i = 0; i < 20; ++i) b.put<uint32_t>(9).put<uint64_t>(1);
  expect_gguf_error(with_kv(b.data), "arrays nested deeper than 8");
  b = {};
  b.str("k").put<uint32_t>(7).put<uint8_t>(2);
  expect_gguf_error(with_kv(b.data), "bool value 2 is neither 0 nor 1");
  b = {};
  b.str("").put<uint32_t>(4).put<uint32_t>(1);
  expect_gguf_error(with_kv(b.data), "has an empty key");
  b = {};
  b.str("general.architecture").put<uint32_t>(4).put<uint32_t>(1);
  expect_gguf_error(with_kv(b.data), "metadata key 'general.architecture' appears twice");

  RawGguf g = one_tensor_file();
  g.u32_kv("general.alignment", 48);
  expect_gguf_error(g.bytes(), "general.alignment 48 is not a power of two");
  g = one_tensor_file();
  g.u32_kv("general.alignment", 0);
  expect_gguf_error(g.bytes(), "general.alignment 0 is not a power of two");
  g = one_tensor_file();
  g.string_kv("general.alignment", "64");
  expect_gguf_error(g.bytes(), "general.alignment is a string, expected u32");
}

TEST(Gguf, BadTensorInfosGiveClearErrors) {
  RawGguf g = one_tensor_file();
  g.tensors[0].type = 77;
  expect_gguf_error(g.bytes(), "tensor 'w' has unknown type id 77");
  g.tensors[0].type = 1009;
  expect_gguf_error(g.bytes(), "tensor 'w' has unknown type id 1009");

  g = one_tensor_file();
  g.tensors[0].ne = {};
  expect_gguf_error(g.bytes(), "tensor 'w' has 0 dimensions");
  g.tensors[0].ne = {1, 1, 1, 1, 1};
  expect_gguf_error(g.bytes(), "tensor 'w' has 5 dimensions");

  g = one_tensor_file();
  g.tensors[0].offset = 64;  // 32 bytes of data at 64 in a 32-byte section
  expect_gguf_error(g.bytes(), "tensor 'w' data [64, 96) lies past the end of the 32-byte data section");
  g.tensors[0].offset = 16;
  expect_gguf_error(g.bytes(), "data offset 16 is not a multiple of the alignment 32");

  g = one_tensor_file();
  g.tensors[0].ne = {4, 3};  // shape says 48 bytes, the file has 32
  expect_gguf_error(g.bytes(), "lies past the end");
  g.tensors[0].ne = {1ull << 40, 1ull << 40};
  expect_gguf_error(g.bytes(), "absurd shape");
  g.tensors[0].ne = {1ull << 63, 1};
  expect_gguf_error(g.bytes(), "absurd dimension");

  g = one_tensor_file();
  g.tensors.push_back({"w", {2}, 0, 32});
  g.data += std::string(32, '\0');
  expect_gguf_error(g.bytes(), "tensor 'w' appears twice");

  g = one_tensor_file();
  g.tensors.push_back({"v", {16}, 0, 0});  // 64 bytes from 0: shares bytes with 'w'
  g.data = std::string(64, '\0');
  expect_gguf_error(g.bytes(), "tensors 'w' and 'v' overlap");

  g = one_tensor_file();
  g.tensors[0] = {"q", {100, 1}, 12, 0};  // Q4_K rows must be whole 256-weight super-blocks
  g.data = std::string(160, '\0');
  expect_gguf_error(g.bytes(), "rows of 100 elements, not a multiple of Q4_K's block of 256");

  g = one_tensor_file();
  g.tensors[0].name = "";
  expect_gguf_error(g.bytes(), "has an empty name");
}

// Every truncation of a valid file must load or fail cleanly, never read out of bounds.
TEST(Gguf, EveryTruncationFailsCleanly) {
  RawGguf g = one_tensor_file();
  g.u32_kv("general.alignment", 64);
  g.alignment = 64;
  Bytes arr;
  arr.str("a").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("xy").str("z");
  g.raw_kv(arr.data);
  const std::string full = g.bytes();
  test::TempDir dir;
  for (size_t n = 0; n < full.size(); ++n) {
    test::write_file(dir.file("t.gguf"), full.substr(0, n));
    try {
      GgufFile f(dir.file("t.gguf"));
      ADD_FAILURE() << "a file cut to " << n << " of " << full.size() << " bytes loaded";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("truncated") != std::string::npos || what.find("too short") != std::string::npos ||
                  what.find("past the end") != std::string::npos || what.find("does not fit") != std::string::npos ||
                  what.find("more than the") != std::string::npos)
          << n << ": " << what;
    }
  }
  test::write_file(dir.file("t.gguf"), full);
  EXPECT_NO_THROW(GgufFile(dir.file("t.gguf")));
}

}  // namespace
}  // namespace fl
