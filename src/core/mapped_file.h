#pragma once
// A read-only memory map of a whole file. Model weights are used in place from the map, so a
// 50 GB checkpoint costs no copy and pages in on demand.
#include <cstddef>
#include <cstdint>
#include <string>

namespace fl {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws fl::Error naming the path on failure
  // Bytes that live elsewhere for the whole run (a model linked into the binary), seen through
  // the same interface; `label` stands in for the path in messages. Nothing is unmapped.
  static MappedFile borrow(const uint8_t* data, size_t size, std::string label);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  bool owned_ = true;  // false for borrowed bytes
};

// Drops the resident pages of [data, data + size) inside a read-only file mapping (the whole pages
// within the range), so a single pass over a file larger than memory keeps its resident set small.
// The bytes stay readable: touching them again reads them back from the file. A hint only; errors
// are ignored.
void release_mapped_pages(const void* data, size_t size);

// Reads a whole (small) file into a string; throws fl::Error naming the path.
std::string read_text_file(const std::string& path);

}  // namespace fl
