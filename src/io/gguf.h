#pragma once
// GGUF (versions 2 and 3, little-endian): reader and writer.
//
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_metadata
//   n_metadata x (string key, u32 value type, value)      strings are u64 length + bytes
//   n_tensors  x (string name, u32 n_dims, u64 ne[n_dims], u32 type id, u64 offset)
//   zero padding to `general.alignment` (default 32), then the data section; each tensor's
//   offset is relative to the data section and a multiple of the alignment.
//
// Dimension order. GGUF lists dims innermost first (ne[0] is the row length K); fireline keeps
// PyTorch order everywhere else (outermost first). The conversion happens here and only here:
// GgufTensorInfo::shape and GgufWriter::add_tensor take PyTorch order, and the bytes are the same
// row-major layout either way.
//
// The reader maps the file and validates everything before handing out a byte: magic, version,
// counts against the file size, every string and array inside the file, value types, the
// alignment, tensor dims and type ids, each tensor's byte size = row bytes x rows, its data inside
// the file and aligned, unique names and no two tensors sharing bytes. A violation is an fl::Error
// naming the file, the byte offset or the tensor, and what is wrong.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace fl {

enum class GgufValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

std::string_view gguf_value_type_name(GgufValueType type);

// One metadata value. Integers are kept in `integer` (signed types sign-extended, u64 as its bit
// pattern), floats in `real`, strings in `text`; an array has its element type and items.
struct GgufValue {
  GgufValueType type = GgufValueType::u32;
  int64_t integer = 0;
  double real = 0.0;
  std::string text;
  GgufValueType element_type = GgufValueType::u8;  // arrays only
  std::vector<GgufValue> items;                    // arrays only

  static GgufValue of_u32(uint32_t v);
  static GgufValue of_i32(int32_t v);
  static GgufValue of_u64(uint64_t v);
  static GgufValue of_i64(int64_t v);
  static GgufValue of_f32(float v);
  static GgufValue of_f64(double v);
  static GgufValue of_bool(bool v);
  static GgufValue of_string(std::string v);
  static GgufValue of_array(GgufValueType element_type, std::vector<GgufValue> items);

  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::f32 || type == GgufValueType::f64; }
  std::string describe() const;  // short, for `show`: the value, or "array of N u32"
};

struct GgufMetadataEntry {
  std::string key;
  GgufValue value;
};

// What fireline knows about a tensor type id: the ggml ids, and fireline's own (1000 + hipfire id).
struct GgufTypeInfo {
  uint32_t id;
  std::string_view name;  // "F32", "Q4_K", "HFQ4_G256", ...
  int32_t block_elems;
  int32_t block_bytes;
  // fireline formats pack rows row-safe (a partial tail block); ggml types need K % block == 0.
  bool row_safe;
  std::optional<DType> dtype;  // the fireline DType with this exact layout, if any
};

const GgufTypeInfo* gguf_type_info(uint32_t type_id);  // nullptr for ids fireline does not know
uint32_t gguf_type_id(DType dtype);                     // throws for DTypes GGUF cannot hold (u8)

// Bytes of a tensor of this type with PyTorch-order `shape`; throws (naming `what`) when K does
// not fit the type's blocks or the size overflows.
uint64_t gguf_tensor_bytes(const GgufTypeInfo& type, const std::vector<int64_t>& shape, std::string_view what);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order (outermost first)
  uint32_t type_id = 0;
  uint64_t offset = 0;      // relative to the data section, as stored
  uint64_t data_begin = 0;  // absolute file offsets of the tensor's bytes
  uint64_t data_end = 0;
  uint64_t nbytes() const { return data_end - data_begin; }
};

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kGgufDefaultAlignment = 32;
constexpr int kGgufMaxDims = 4;
constexpr int kGgufMaxArrayDepth = 8;  // nesting of arrays of arrays we accept

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // maps and validates
  explicit GgufFile(MappedFile file);          // validates bytes already in memory

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section
  uint64_t file_size() const { return file_.size(); }

  const std::vector<GgufMetadataEntry>& metadata() const { return metadata_; }
  const GgufValue* find_metadata(std::string_view key) const;
  // The string at `key`; nullopt when absent; an fl::Error when present with another type.
  std::optional<std::string> metadata_string(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const uint8_t* tensor_data(const GgufTensorInfo& info) const { return file_.data() + info.data_begin; }

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufMetadataEntry> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF header; the caller then writes the tensor bytes in the order they were added
// (GgufStreamWriter does both). Tensors are laid out back to back, each padded to the alignment.
class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = kGgufDefaultAlignment);  // records general.alignment when not 32

  void add_metadata(std::string key, GgufValue value);  // keys must be unique
  // Adds a tensor (shape in PyTorch order) and returns its index.
  size_t add_tensor(std::string name, uint32_t type_id, std::vector<int64_t> shape);
  // Replaces a metadata value by one that serialises to the same number of bytes (used to fill in
  // a checksum after the data is written without moving the data).
  void replace_metadata(std::string_view key, GgufValue value);

  uint64_t alignment() const { return alignment_; }
  size_t tensor_count() const { return tensors_.size(); }
  const GgufTensorInfo& tensor(size_t index) const { return tensors_[index]; }
  uint64_t data_offset() const;  // header bytes including the padding
  uint64_t data_size() const { return data_size_; }  // the data section, each tensor padded
  uint64_t total_size() const { return data_offset() + data_size_; }  // the whole file
  std::string serialize_header() const;  // exactly data_offset() bytes

 private:
  uint64_t alignment_;
  std::vector<GgufMetadataEntry> metadata_;
  std::vector<GgufTensorInfo> tensors_;  // offset relative to the data section
  uint64_t data_size_ = 0;               // data section bytes so far (padded)
};

// Writes a GGUF file to `path` + ".partial.<pid>.<n>" (a name of its own: two writers of one path
// must not truncate each other's bytes) and renames it into place on finish(), so that an
// interrupted run never leaves a file that looks complete; of concurrent writers the last to
// finish wins, each file whole. Tensors must be written in order.
class GgufStreamWriter {
 public:
  GgufStreamWriter(const std::string& path, const GgufWriter& layout);
  ~GgufStreamWriter();  // removes the partial file unless finish() succeeded
  GgufStreamWriter(const GgufStreamWriter&) = delete;
  GgufStreamWriter& operator=(const GgufStreamWriter&) = delete;

  // Appends bytes to tensor `index`. Tensors are written in order, each completely before the
  // next, in as many pieces as the caller likes.
  void write_tensor_bytes(size_t index, const void* data, uint64_t size);
  // Rewrites the header (its size must not change), flushes, and renames the file into place.
  void finish(const GgufWriter& final_layout);

 private:
  void write_at(uint64_t offset, const void* data, size_t size);
  std::string path_;
  std::string partial_path_;
  const GgufWriter& layout_;
  int fd_ = -1;
  uint64_t data_offset_ = 0;
  size_t next_tensor_ = 0;
  uint64_t next_tensor_written_ = 0;  // bytes of tensor next_tensor_ written so far
  bool finished_ = false;
  int partial_slot_ = -1;  // where a fatal signal's handler finds partial_path_ (gguf.cpp)
};

}  // namespace fl
