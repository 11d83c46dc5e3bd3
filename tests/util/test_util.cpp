#include "util/test_util.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

namespace fl::test {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "fireline-test-XXXXXX").string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

StTensor st_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  StTensor t{name, "F32", std::move(shape), {}};
  t.bytes.resize(values.size() * 4);
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

std::string safetensors_from_header(const nlohmann::json& header, const std::string& data) {
  std::string h = header.dump();
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

std::string safetensors_bytes(const std::vector<StTensor>& tensors, nlohmann::json* header_out) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const StTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  if (header_out) *header_out = header;
  return safetensors_from_header(header, data);
}

// The environment may point elsewhere: the GPU machine runs binaries built here from another path.
std::string fixtures_dir() {
  const char* env = std::getenv("FIRELINE_FIXTURES_DIR");
  return env && *env ? env : FIRELINE_FIXTURES_DIR;
}

}  // namespace fl::test
