#include "io/gguf.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <limits>

#include "core/error.h"

namespace fl {
namespace {

// ggml's type ids (ggml.h, enum ggml_type) with their block geometry, and fireline's own ids for
// the hipfire formats (1000 + hipfire's QuantType id, DESIGN §4). Ids missing here (removed ggml
// types such as 4/5, or ones fireline has no geometry for) are rejected on read.
constexpr std::array<GgufTypeInfo, 34> kTypes = {{
    {0, "F32", 1, 4, false, DType::f32},
    {1, "F16", 1, 2, false, DType::f16},
    {2, "Q4_0", 32, 18, false, std::nullopt},
    {3, "Q4_1", 32, 20, false, std::nullopt},
    {6, "Q5_0", 32, 22, false, std::nullopt},
    {7, "Q5_1", 32, 24, false, std::nullopt},
    {8, "Q8_0", 32, 34, true, DType::q8_0},  // row-safe in fireline files (ggml needs K % 32 == 0)
    {9, "Q8_1", 32, 36, false, std::nullopt},
    {10, "Q2_K", 256, 84, false, std::nullopt},
    {11, "Q3_K", 256, 110, false, std::nullopt},
    {12, "Q4_K", 256, 144, false, std::nullopt},
    {13, "Q5_K", 256, 176, false, std::nullopt},
    {14, "Q6_K", 256, 210, false, std::nullopt},
    {15, "Q8_K", 256, 292, false, std::nullopt},
    {16, "IQ2_XXS", 256, 66, false, std::nullopt},
    {17, "IQ2_XS", 256, 74, false, std::nullopt},
    {18, "IQ3_XXS", 256, 98, false, std::nullopt},
    {19, "IQ1_S", 256, 50, false, std::nullopt},
    {20, "IQ4_NL", 32, 18, false, std::nullopt},
    {21, "IQ3_S", 256, 110, false, std::nullopt},
    {22, "IQ2_S", 256, 82, false, std::nullopt},
    {23, "IQ4_XS", 256, 136, false, std::nullopt},
    {24, "I8", 1, 1, false, std::nullopt},
    {25, "I16", 1, 2, false, std::nullopt},
    {26, "I32", 1, 4, false, DType::i32},
    {27, "I64", 1, 8, false, DType::i64},
    {28, "F64", 1, 8, false, std::nullopt},
    {29, "IQ1_M", 256, 56, false, std::nullopt},
    {30, "BF16", 1, 2, false, DType::bf16},
    {34, "TQ1_0", 256, 54, false, std::nullopt},
    {35, "TQ2_0", 256, 66, false, std::nullopt},
    {1006, "HFQ4_G256", 256, 136, true, DType::hfq4_g256},
    {1007, "HFQ4_G128", 128, 72, true, DType::hfq4_g128},
    {1008, "HFQ6_G256", 256, 200, true, DType::hfq6_g256},
}};

// Upper bounds that only a corrupt file exceeds; they keep a hostile header from making us
// allocate or loop without end before the file-size checks catch it.
constexpr uint64_t kMaxStringBytes = 1ull << 30;  // a tokenizer.json is tens of MB
constexpr uint64_t kMaxNameBytes = 1ull << 16;    // keys and tensor names

uint64_t scalar_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean:
      return 1;
    case GgufValueType::u16:
    case GgufValueType::i16:
      return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32:
      return 4;
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::f64:
      return 8;
    case GgufValueType::string:
      return 8;  // at least the length field
    case GgufValueType::array:
      return 12;  // at least the element type and count
  }
  return 0;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::f64); }

// Bounds-checked little-endian reads from the mapped header.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      fail("{}: truncated: {} at byte {} needs {} bytes but only {} remain", path_, what, pos_, n, remaining());
  }
  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // the file is little-endian, as is every host we build for
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(std::string_view what, uint64_t max_bytes) {
    const uint64_t at = pos_;
    uint64_t n = read<uint64_t>(what);
    if (n > max_bytes) fail("{}: {} at byte {} claims {} bytes (corrupt length)", path_, what, at, n);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

GgufValue read_value(Cursor& c, GgufValueType type, const std::string& key, int depth, const std::string& path) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::u8: v.integer = c.read<uint8_t>(key); break;
    case GgufValueType::i8: v.integer = c.read<int8_t>(key); break;
    case GgufValueType::u16: v.integer = c.read<uint16_t>(key); break;
    case GgufValueType::i16: v.integer = c.read<int16_t>(key); break;
    case GgufValueType::u32: v.integer = c.read<uint32_t>(key); break;
    case GgufValueType::i32: v.integer = c.read<int32_t>(key); break;
    case GgufValueType::u64: v.integer = static_cast<int64_t>(c.read<uint64_t>(key)); break;
    case GgufValueType::i64: v.integer = c.read<int64_t>(key); break;
    case GgufValueType::f32: v.real = c.read<float>(key); break;
    case GgufValueType::f64: v.real = c.read<double>(key); break;
    case GgufValueType::boolean: {
      const uint64_t at = c.pos();
      uint8_t b = c.read<uint8_t>(key);
      if (b > 1) fail("{}: metadata '{}' at byte {}: bool value {} is neither 0 nor 1", path, key, at, b);
      v.integer = b;
      break;
    }
    case GgufValueType::string: v.text = c.read_string(key, kMaxStringBytes); break;
    case GgufValueType::array: {
      const uint64_t at = c.pos();
      if (depth >= kGgufMaxArrayDepth)
        fail("{}: metadata '{}' at byte {}: arrays nested deeper than {}", path, key, at, kGgufMaxArrayDepth);
      uint32_t element = c.read<uint32_t>(key);
      if (!valid_value_type(element))
        fail("{}: metadata '{}' at byte {}: unknown array element type {}", path, key, at, element);
      uint64_t count = c.read<uint64_t>(key);
      v.element_type = static_cast<GgufValueType>(element);
      // Every element takes at least scalar_size bytes, so a count the file cannot hold is corrupt.
      if (count > c.remaining() / scalar_size(v.element_type))
        fail("{}: metadata '{}' at byte {}: array of {} {} does not fit in the {} bytes left", path, key, at, count,
             gguf_value_type_name(v.element_type), c.remaining());
      v.items.reserve(count);
      for (uint64_t i = 0; i < count; ++i) v.items.push_back(read_value(c, v.element_type, key, depth + 1, path));
      break;
    }
  }
  return v;
}

void append_bytes(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <typename T>
void append(std::string& out, T v) {
  append_bytes(out, &v, sizeof v);
}
void append_string(std::string& out, std::string_view s) {
  append<uint64_t>(out, s.size());
  out.append(s);
}

void append_value(std::string& out, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::u8: append<uint8_t>(out, static_cast<uint8_t>(v.integer)); break;
    case GgufValueType::i8: append<int8_t>(out, static_cast<int8_t>(v.integer)); break;
    case GgufValueType::u16: append<uint16_t>(out, static_cast<uint16_t>(v.integer)); break;
    case GgufValueType::i16: append<int16_t>(out, static_cast<int16_t>(v.integer)); break;
    case GgufValueType::u32: append<uint32_t>(out, static_cast<uint32_t>(v.integer)); break;
    case GgufValueType::i32: append<int32_t>(out, static_cast<int32_t>(v.integer)); break;
    case GgufValueType::u64: append<uint64_t>(out, static_cast<uint64_t>(v.integer)); break;
    case GgufValueType::i64: append<int64_t>(out, v.integer); break;
    case GgufValueType::f32: append<float>(out, static_cast<float>(v.real)); break;
    case GgufValueType::f64: append<double>(out, v.real); break;
    case GgufValueType::boolean: append<uint8_t>(out, v.integer ? 1 : 0); break;
    case GgufValueType::string: append_string(out, v.text); break;
    case GgufValueType::array:
      append<uint32_t>(out, static_cast<uint32_t>(v.element_type));
      append<uint64_t>(out, v.items.size());
      for (const GgufValue& item : v.items) {
        FL_ASSERT(item.type == v.element_type);
        append_value(out, item);
      }
      break;
  }
}

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

// ---- values ----

std::string_view gguf_value_type_name(GgufValueType type) {
  static constexpr std::string_view kNames[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                                "bool", "string", "array", "u64", "i64", "f64"};
  auto index = static_cast<uint32_t>(type);
  return index < std::size(kNames) ? kNames[index] : std::string_view("unknown");
}

GgufValue GgufValue::of_u32(uint32_t v) { GgufValue x; x.type = GgufValueType::u32; x.integer = v; return x; }
GgufValue GgufValue::of_i32(int32_t v) { GgufValue x; x.type = GgufValueType::i32; x.integer = v; return x; }
GgufValue GgufValue::of_u64(uint64_t v) { GgufValue x; x.type = GgufValueType::u64; x.integer = static_cast<int64_t>(v); return x; }
GgufValue GgufValue::of_i64(int64_t v) { GgufValue x; x.type = GgufValueType::i64; x.integer = v; return x; }
GgufValue GgufValue::of_f32(float v) { GgufValue x; x.type = GgufValueType::f32; x.real = v; return x; }
GgufValue GgufValue::of_f64(double v) { GgufValue x; x.type = GgufValueType::f64; x.real = v; return x; }
GgufValue GgufValue::of_bool(bool v) { GgufValue x; x.type = GgufValueType::boolean; x.integer = v; return x; }
GgufValue GgufValue::of_string(std::string v) { GgufValue x; x.type = GgufValueType::string; x.text = std::move(v); return x; }
GgufValue GgufValue::of_array(GgufValueType element_type, std::vector<GgufValue> items) {
  GgufValue x;
  x.type = GgufValueType::array;
  x.element_type = element_type;
  x.items = std::move(items);
  return x;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::u16: case GgufValueType::i16:
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::u64: case GgufValueType::i64:
      return true;
    default:
      return false;
  }
}

std::string GgufValue::describe() const {
  if (type == GgufValueType::u64) return std::to_string(static_cast<uint64_t>(integer));
  if (is_integer()) return std::to_string(integer);
  if (is_float()) return fmt::format("{}", real);
  if (type == GgufValueType::boolean) return integer ? "true" : "false";
  if (type == GgufValueType::string) return text;
  return fmt::format("array of {} {}", items.size(), gguf_value_type_name(element_type));
}

// ---- type ids ----

const GgufTypeInfo* gguf_type_info(uint32_t type_id) {
  for (const GgufTypeInfo& t : kTypes)
    if (t.id == type_id) return &t;
  return nullptr;
}

uint32_t gguf_type_id(DType dtype) {
  for (const GgufTypeInfo& t : kTypes)
    if (t.dtype == dtype) return t.id;
  fail("type {} cannot be stored in a GGUF file", dtype_name(dtype));
}

uint64_t gguf_tensor_bytes(const GgufTypeInfo& type, const std::vector<int64_t>& shape, std::string_view what) {
  if (shape.empty() || shape.size() > static_cast<size_t>(kGgufMaxDims))
    fail("{} has {} dimensions (GGUF holds 1 to {})", what, shape.size(), kGgufMaxDims);
  const uint64_t k = static_cast<uint64_t>(shape.back());
  uint64_t rows = 1;
  constexpr uint64_t kLimit = 1ull << 62;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) fail("{} has a negative dimension {}", what, shape[i]);
    const uint64_t extent = static_cast<uint64_t>(shape[i]);
    if (i + 1 < shape.size()) {
      if (extent > 0 && rows > kLimit / extent) fail("{} has an absurd shape {}", what, shape_string(shape));
      rows *= extent;
    }
  }
  if (k > kLimit) fail("{} has an absurd shape {}", what, shape_string(shape));
  if (!type.row_safe && k % type.block_elems != 0)
    fail("{} has rows of {} elements, not a multiple of {}'s block of {}", what, k, type.name, type.block_elems);
  const uint64_t row_bytes = (k + type.block_elems - 1) / type.block_elems * type.block_bytes;
  if (row_bytes > 0 && rows > kLimit / row_bytes) fail("{} has an absurd shape {}", what, shape_string(shape));
  return row_bytes * rows;
}

// ---- reader ----

GgufFile::GgufFile(const std::string& path) : GgufFile(MappedFile(path)) {}

GgufFile::GgufFile(MappedFile file) : file_(std::move(file)) {
  const std::string& path = file_.path();
  const uint64_t file_size = file_.size();
  Cursor c(file_.data(), file_size, path);
  if (file_size < 4) fail("{}: not a GGUF file ({} bytes, too short for the magic)", path, file_size);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kGgufMagic) {
    char shown[5] = {};
    std::memcpy(shown, file_.data(), 4);
    for (char& ch : shown)
      if (ch && (ch < 32 || ch > 126)) ch = '?';
    fail("{}: not a GGUF file (magic '{}', expected 'GGUF')", path, shown);
  }
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    if (version_ == 0x03000000u || version_ == 0x02000000u)
      fail("{}: big-endian GGUF is not supported", path);
    fail("{}: GGUF version {} is not supported (2 and 3 are)", path, version_);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_metadata = c.read<uint64_t>("metadata count");
  // A metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
  if (n_metadata > c.remaining() / 13)
    fail("{}: truncated or corrupt: the header claims {} metadata entries, more than the {}-byte file can hold", path,
         n_metadata, file_size);
  if (n_tensors > c.remaining() / 32)
    fail("{}: truncated or corrupt: the header claims {} tensors, more than the {}-byte file can hold", path, n_tensors,
         file_size);

  metadata_.reserve(n_metadata);
  for (uint64_t i = 0; i < n_metadata; ++i) {
    const uint64_t at = c.pos();
    std::string key = c.read_string("metadata key", kMaxNameBytes);
    if (key.empty()) fail("{}: metadata entry {} at byte {} has an empty key", path, i, at);
    const uint32_t type = c.read<uint32_t>("metadata value type");
    if (!valid_value_type(type)) fail("{}: metadata '{}' at byte {} has unknown value type {}", path, key, at, type);
    GgufValue value = read_value(c, static_cast<GgufValueType>(type), key, 0, path);
    if (metadata_index_.count(key)) fail("{}: metadata key '{}' appears twice", path, key);
    metadata_index_.emplace(key, metadata_.size());
    metadata_.push_back({std::move(key), std::move(value)});
  }

  if (const GgufValue* a = find_metadata("general.alignment")) {
    if (a->type != GgufValueType::u32)
      fail("{}: general.alignment is a {}, expected u32", path, gguf_value_type_name(a->type));
    const uint64_t alignment = static_cast<uint64_t>(a->integer);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      fail("{}: general.alignment {} is not a power of two", path, alignment);
    alignment_ = alignment;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    GgufTensorInfo info;
    info.name = c.read_string("tensor name", kMaxNameBytes);
    if (info.name.empty()) fail("{}: tensor {} at byte {} has an empty name", path, i, at);
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > static_cast<uint32_t>(kGgufMaxDims))
      fail("{}: tensor '{}' has {} dimensions (GGUF holds 1 to {})", path, info.name, n_dims, kGgufMaxDims);
    info.shape.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t extent = c.read<uint64_t>("tensor dimension");
      if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: tensor '{}' has an absurd dimension {}", path, info.name, extent);
      info.shape[n_dims - 1 - d] = static_cast<int64_t>(extent);  // ne[0] is innermost: reverse
    }
    info.type_id = c.read<uint32_t>("tensor type");
    info.offset = c.read<uint64_t>("tensor offset");
    if (tensor_index_.count(info.name)) fail("{}: tensor '{}' appears twice", path, info.name);
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  data_offset_ = align_up(c.pos(), alignment_);
  if (n_tensors > 0 && data_offset_ > file_size)
    fail("{}: truncated: the data section would start at byte {} but the file has {} bytes", path, data_offset_,
         file_size);
  const uint64_t data_size = data_offset_ <= file_size ? file_size - data_offset_ : 0;

  for (GgufTensorInfo& info : tensors_) {
    const GgufTypeInfo* type = gguf_type_info(info.type_id);
    if (!type) fail("{}: tensor '{}' has unknown type id {}", path, info.name, info.type_id);
    const std::string what = fmt::format("{}: tensor '{}' ({} {})", path, info.name, type->name, shape_string(info.shape));
    const uint64_t nbytes = gguf_tensor_bytes(*type, info.shape, what);
    if (info.offset % alignment_ != 0)
      fail("{}: tensor '{}' data offset {} is not a multiple of the alignment {}", path, info.name, info.offset,
           alignment_);
    if (info.offset > data_size || nbytes > data_size - info.offset)
      fail("{}: tensor '{}' data [{}, {}) lies past the end of the {}-byte data section (truncated file?)", path,
           info.name, info.offset, info.offset + nbytes, data_size);
    info.data_begin = data_offset_ + info.offset;
    info.data_end = info.data_begin + nbytes;
  }

  std::vector<const GgufTensorInfo*> sorted;
  for (const GgufTensorInfo& t : tensors_)
    if (t.data_end > t.data_begin) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->data_begin < sorted[i - 1]->data_end)
      fail("{}: tensors '{}' and '{}' overlap", path, sorted[i - 1]->name, sorted[i]->name);
}

const GgufValue* GgufFile::find_metadata(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

std::optional<std::string> GgufFile::metadata_string(std::string_view key) const {
  const GgufValue* v = find_metadata(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::string)
    fail("{}: metadata '{}' is a {}, expected a string", path(), key, gguf_value_type_name(v->type));
  return v->text;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---- writer ----

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  FL_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= 0xffffffffu);
  if (alignment != kGgufDefaultAlignment)
    add_metadata("general.alignment", GgufValue::of_u32(static_cast<uint32_t>(alignment)));
}

void GgufWriter::add_metadata(std::string key, GgufValue value) {
  for (const GgufMetadataEntry& e : metadata_)
    if (e.key == key) fail("GGUF metadata key '{}' added twice", key);
  metadata_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::replace_metadata(std::string_view key, GgufValue value) {
  for (GgufMetadataEntry& e : metadata_) {
    if (e.key != key) continue;
    std::string before, after;
    append_value(before, e.value);
    append_value(after, value);
    FL_ASSERT(before.size() == after.size() && e.value.type == value.type);
    e.value = std::move(value);
    return;
  }
  FL_ASSERT(false && "replace_metadata: no such key");
}

size_t GgufWriter::add_tensor(std::string name, uint32_t type_id, std::vector<int64_t> shape) {
  const GgufTypeInfo* type = gguf_type_info(type_id);
  if (!type) fail("tensor '{}': unknown GGUF type id {}", name, type_id);
  if (name.empty()) fail("GGUF tensor names must not be empty");
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) fail("tensor '{}' added twice", name);
  GgufTensorInfo info;
  info.name = std::move(name);
  const uint64_t nbytes = gguf_tensor_bytes(*type, shape, fmt::format("tensor '{}'", info.name));
  info.shape = std::move(shape);
  info.type_id = type_id;
  info.offset = data_size_;
  info.data_begin = info.offset;  // relative until the header size is known; see data_offset()
  info.data_end = info.offset + nbytes;
  data_size_ = align_up(info.data_end, alignment_);
  tensors_.push_back(std::move(info));
  return tensors_.size() - 1;
}

std::string GgufWriter::serialize_header() const {
  std::string out;
  append<uint32_t>(out, kGgufMagic);
  append<uint32_t>(out, 3);
  append<uint64_t>(out, tensors_.size());
  append<uint64_t>(out, metadata_.size());
  for (const GgufMetadataEntry& e : metadata_) {
    append_string(out, e.key);
    append<uint32_t>(out, static_cast<uint32_t>(e.value.type));
    append_value(out, e.value);
  }
  for (const GgufTensorInfo& t : tensors_) {
    append_string(out, t.name);
    append<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) append<uint64_t>(out, static_cast<uint64_t>(t.shape[d]));
    append<uint32_t>(out, t.type_id);
    append<uint64_t>(out, t.offset);
  }
  out.resize(align_up(out.size(), alignment_), '\0');
  return out;
}

uint64_t GgufWriter::data_offset() const { return serialize_header().size(); }

// ---- streaming file writer ----

namespace {

// The partial files being written, so that Ctrl-C (or SIGTERM, SIGHUP) removes them too: a
// signal's default action ends the process without running the writers' destructors, and an
// interrupted quantize would leave gigabytes behind under a name nobody looks at. Fixed slots,
// because the handler may only call async-signal-safe functions (unlink, signal, raise).
constexpr int kPartialSlots = 16;
struct PartialSlot {
  // 0: free; 1: claimed, path being written; 2: armed (the handler removes `path`)
  std::atomic<int> state{0};
  char path[4096] = {};
};
PartialSlot g_partials[kPartialSlots];
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

extern "C" void remove_partials_on_signal(int sig) {
  for (PartialSlot& slot : g_partials)
    if (slot.state.load() == 2) ::unlink(slot.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // the status says what ended the process, as without the handler
}

void install_partial_cleanup() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (int sig : kCleanupSignals) {
    struct sigaction current {};
    // Only where the signal would kill the process anyway: an ignored one (nohup, a background
    // job) stays ignored, and a command's own handler (run's Ctrl-C) stays in charge.
    if (::sigaction(sig, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) != 0 ||
        current.sa_handler != SIG_DFL)
      continue;
    struct sigaction action {};
    action.sa_handler = remove_partials_on_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

// A slot for `path`, or -1 when all are taken or the path is too long (then only the destructor
// removes the file, as before).
int register_partial(const std::string& path) {
  install_partial_cleanup();
  if (path.size() >= sizeof(PartialSlot::path)) return -1;
  for (int i = 0; i < kPartialSlots; ++i) {
    int expected = 0;
    if (!g_partials[i].state.compare_exchange_strong(expected, 1)) continue;
    // Armed only once the whole path is in place: a signal in between removes nothing here.
    std::memcpy(g_partials[i].path, path.c_str(), path.size() + 1);
    g_partials[i].state.store(2);
    return i;
  }
  return -1;
}

void unregister_partial(int slot) {
  if (slot >= 0) g_partials[slot].state.store(0);
}

}  // namespace

GgufStreamWriter::GgufStreamWriter(const std::string& path, const GgufWriter& layout) : path_(path), layout_(layout) {
  static std::atomic<uint64_t> writers{0};
  partial_path_ = path + ".partial." + std::to_string(::getpid()) + "." + std::to_string(writers++);
  fd_ = ::open(partial_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create {}: {}", partial_path_, std::strerror(errno));
  partial_slot_ = register_partial(partial_path_);
  std::string header = layout.serialize_header();
  data_offset_ = header.size();
  write_at(0, header.data(), header.size());
}

GgufStreamWriter::~GgufStreamWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(partial_path_.c_str());
  unregister_partial(partial_slot_);
}

void GgufStreamWriter::write_at(uint64_t offset, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write {} at byte {}: {}", partial_path_, offset, std::strerror(errno));
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

void GgufStreamWriter::write_tensor_bytes(size_t index, const void* data, uint64_t size) {
  // Skip over finished empty tensors so that a zero-size tensor needs no call.
  while (next_tensor_ < layout_.tensor_count() && next_tensor_ < index &&
         next_tensor_written_ == layout_.tensor(next_tensor_).nbytes()) {
    ++next_tensor_;
    next_tensor_written_ = 0;
  }
  FL_ASSERT(index == next_tensor_ && index < layout_.tensor_count());
  const GgufTensorInfo& t = layout_.tensor(index);
  FL_ASSERT(size <= t.nbytes() - next_tensor_written_);
  // Padding between tensors is left as a hole, which reads back as zeros.
  write_at(data_offset_ + t.offset + next_tensor_written_, data, size);
  next_tensor_written_ += size;
}

void GgufStreamWriter::finish(const GgufWriter& final_layout) {
  while (next_tensor_ < layout_.tensor_count() && next_tensor_written_ == layout_.tensor(next_tensor_).nbytes()) {
    ++next_tensor_;
    next_tensor_written_ = 0;
  }
  FL_ASSERT(next_tensor_ == layout_.tensor_count());
  std::string header = final_layout.serialize_header();
  FL_ASSERT(header.size() == data_offset_);
  write_at(0, header.data(), header.size());
  if (::ftruncate(fd_, static_cast<off_t>(data_offset_ + final_layout.data_size())) != 0)
    fail("cannot size {}: {}", partial_path_, std::strerror(errno));
  if (::fsync(fd_) != 0) fail("cannot flush {}: {}", partial_path_, std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (std::rename(partial_path_.c_str(), path_.c_str()) != 0)
    fail("cannot rename {} to {}: {}", partial_path_, path_, std::strerror(errno));
  finished_ = true;
}

}  // namespace fl
