#pragma once
// Reader for hipfire's HFQM container (.hf4 / .hf6 / .hfq; hipfire-system.md §2.7), so that
// `fireline quantize` can import a hipfire model. Layout (little-endian, offsets from the file
// start):
//
//   0x00 "HFQM" | u32 version = 1 | u32 arch_id | u32 n_tensors | u64 metadata_offset
//   | u64 data_offset
//   [metadata_offset ..) a JSON object with no length field (its end is found by matching braces
//                        outside strings), immediately followed by the tensor index:
//     u32 n_tensors, then per tensor: u16 name_len, name, u8 quant_type, u8 n_dims,
//     u32 shape[n_dims] (PyTorch order), u32 group_size, u64 data_size
//   [data_offset ..) the tensors back to back in index order, no alignment.
//
// The metadata JSON carries `config` (HF config.json), `tokenizer` (tokenizer.json as a string),
// `tokenizer_config` (with `chat_template`) and `generation_config`.
//
// hipfire's quant types that share a fireline layout: 1 F16, 2 F32, 16 BF16, 3 Q8F16 (= Q8_0),
// 6 HFQ4-G256, 7 HFQ4-G128, 8 HFQ6-G256. Every other type (the rotated MQ family, Q4K, ...) is
// rejected by name. Quantized tensors must be row-safe (each row its own ceil(K/G) groups); a file
// from before row-safe packing, whose groups run across rows, is rejected with that explanation.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace fl {

struct HfqmTensor {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order
  uint8_t quant_type = 0;      // hipfire's id
  uint32_t group_size = 0;
  DType dtype = DType::f32;    // the fireline type with the same layout
  uint64_t data_begin = 0;     // absolute file offsets
  uint64_t data_end = 0;
  uint64_t nbytes() const { return data_end - data_begin; }
};

class HfqmFile {
 public:
  explicit HfqmFile(const std::string& path);  // maps and validates; throws fl::Error

  const std::string& path() const { return file_.path(); }
  uint32_t arch_id() const { return arch_id_; }
  const nlohmann::json& metadata() const { return metadata_; }
  const std::vector<HfqmTensor>& tensors() const { return tensors_; }
  const uint8_t* tensor_data(const HfqmTensor& t) const { return file_.data() + t.data_begin; }

  // Side files from the metadata (empty strings when absent).
  std::string config_json() const;  // throws when there is no config object
  std::string tokenizer_json() const;
  std::string generation_config_json() const;
  std::string tokenizer_config_json() const;  // the tokenizer_config object, or empty
  std::string chat_template() const;

 private:
  MappedFile file_;
  uint32_t arch_id_ = 0;
  nlohmann::json metadata_;
  std::vector<HfqmTensor> tensors_;
};

// hipfire's name for a quant type id ("MQ4G256", ...), or "type N" when unknown.
std::string hfqm_quant_type_name(uint8_t quant_type);

}  // namespace fl
