#pragma once
// JSON mode (`response_format: {"type": "json_object"}`): generation may only write text that is
// a prefix of one JSON object (RFC 8259), and may only end once the object is complete. With a
// compiled JSON Schema (json_schema.h: `"type": "json_schema"`) the object must also be one the
// schema accepts: every byte is checked against the node its value must satisfy (types, enum
// texts, property names, required properties, item counts), so a prefix that no accepted
// object continues is refused as soon as it is written.
//
// JsonPrefix is the incremental check: a pushdown automaton fed byte by byte, cheap to copy, so
// that a candidate token is tried on a copy and kept only when every byte of its text is
// accepted. Strings take any byte >= 0x20 except an unescaped quote or backslash (UTF-8 is not
// checked, as JSON parsers read bytes); whitespace is allowed wherever RFC 8259 allows it, but at
// most kMaxWhitespaceRun bytes in a row, so a model cannot stall in blank space forever.
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/json_schema.h"

namespace fl {

class Sampler;

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxWhitespaceRun = 16;

  JsonPrefix() = default;
  // With a schema (which must outlive this and its copies): only objects it accepts.
  explicit JsonPrefix(const JsonSchema* schema);

  // False (and the state is then unspecified) when the byte cannot continue a JSON object.
  bool feed(char c);
  bool feed(std::string_view text);
  // The bytes so far are one whole object (trailing whitespace allowed).
  bool complete() const { return done_; }

 private:
  enum class Expect : uint8_t {
    document,      // nothing yet: only '{' (after whitespace)
    key_or_close,  // after '{'
    key,           // after ',' in an object
    colon,
    value,
    value_or_close,  // after '['
    comma_or_close,
    string,
    string_escape,
    string_hex,
    number,
    literal,
  };
  enum class Number : uint8_t { minus, zero, integer, dot, fraction, exp, exp_sign, exp_digits };

  bool value_start(char c);
  bool after_value(char c);  // the byte after a number or literal ended
  void end_value();          // a value (or key) just ended
  static bool whitespace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  // ---- the schema's side (all true without one) ----
  const JsonSchemaNode& node(int32_t i) const { return schema_->node(i); }
  bool schema_value_start(char c);  // the node value_node_ takes this value; containers pushed
  bool schema_value_byte(char c);   // a byte of a scalar value (enum texts narrowed)
  bool schema_value_end();          // a scalar value ended: it is one whole enum text
  bool schema_key_start();          // '"' opens a key: some key may still be written
  bool schema_key_byte(char c);
  bool schema_key_end();          // the key names a property (or other keys are allowed)
  bool schema_close(bool array);  // '}' or ']': required properties present, minItems met
  bool schema_comma(bool array);  // another item or key may follow
  bool keys_left() const;         // an unwritten property, or other keys allowed

  struct Frame {
    int32_t node = 0;
    uint64_t seen = 0;  // object: properties written
    int64_t items = 0;  // array: items begun
  };

  Expect expect_ = Expect::document;
  bool string_is_key_ = false;
  Number number_ = Number::zero;
  uint8_t hex_left_ = 0;
  const char* literal_ = nullptr;  // the rest of true / false / null still to come
  uint8_t whitespace_run_ = 0;
  bool done_ = false;
  uint8_t depth_ = 0;
  uint64_t is_array_ = 0;  // bit d: container at depth d + 1 is an array

  const JsonSchema* schema_ = nullptr;
  std::array<Frame, kMaxDepth> frames_{};  // the open containers' nodes, frames_[depth_ - 1] innermost
  int32_t value_node_ = 0;                 // the node the next value must satisfy
  bool integer_only_ = false;              // the number being written may have no fraction or exponent
  uint64_t enum_left_ = 0;                 // enum texts the scalar being written still matches (bits)
  uint32_t enum_pos_ = 0;                  // its bytes so far
  bool enum_active_ = false;
  uint64_t keys_left_ = 0;     // unwritten property names the key being written still matches
  uint64_t keys_written_ = 0;  // and written ones (matching one is a repeated key: refused)
  uint32_t key_pos_ = 0;
};

// JSON mode's draw: a token whose text (texts[id], decoded alone; "" for special tokens) keeps
// `json` a prefix of the object, or an end-of-sequence id once the object is complete; -1 when
// none can.
int32_t sample_json(Sampler& sampler, std::span<const float> logits, const JsonPrefix& json,
                    const std::function<bool(int32_t)>& is_eos, const std::vector<std::string>& texts);

// One token from `logits` that `allowed` accepts: the sampler's choice when allowed, else its
// next choice with the refused tokens removed (a few tries), else a scan of the whole vocabulary.
// Returns -1 when no token is allowed. The sampler's state advances as for an ordinary sample.
int32_t sample_allowed(Sampler& sampler, std::span<const float> logits, const std::function<bool(int32_t)>& allowed);

}  // namespace fl
