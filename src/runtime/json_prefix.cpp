#include "runtime/json_prefix.h"

#include <limits>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

namespace fl {

JsonPrefix::JsonPrefix(const JsonSchema* schema) : schema_(schema) {
  if (schema_) value_node_ = schema_->root();
}

// ---- the schema's side ----

namespace {

// The JSON types a value starting with `c` can have (0: none).
uint8_t types_starting_with(char c) {
  switch (c) {
    case '{': return kJsonObject;
    case '[': return kJsonArray;
    case '"': return kJsonString;
    case 't':
    case 'f': return kJsonBoolean;
    case 'n': return kJsonNull;
    default: return c == '-' || (c >= '0' && c <= '9') ? kJsonInteger | kJsonNumber : 0;
  }
}

uint64_t low_bits(size_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

}  // namespace

bool JsonPrefix::schema_value_start(char c) {
  if (!schema_) return true;
  int32_t n = value_node_;
  if (depth_ > 0 && ((is_array_ >> (depth_ - 1)) & 1)) {  // an item: the array's node says which
    Frame& f = frames_[depth_ - 1];
    const JsonSchemaNode& array = node(f.node);
    if (array.max_items >= 0 && f.items >= array.max_items) return false;
    ++f.items;
    n = array.items;
  }
  const uint8_t t = types_starting_with(c);
  if (!node(n).alternatives.empty()) {  // anyOf: the alternative of this type
    int32_t chosen = -1;
    for (int32_t a : node(n).alternatives)
      if (node(a).types & t) chosen = a;
    if (chosen < 0) return false;
    n = chosen;
  }
  const JsonSchemaNode& nd = node(n);
  if (!(nd.types & t)) return false;
  integer_only_ = (t & kJsonInteger) && !(nd.types & kJsonNumber);
  if (c == '{' || c == '[') {
    if (depth_ >= kMaxDepth) return false;
    frames_[depth_] = Frame{n, 0, 0};
  }
  enum_active_ = !nd.enum_texts.empty();
  if (!enum_active_) return true;
  value_node_ = n;  // schema_value_byte reads the texts from it
  enum_left_ = low_bits(nd.enum_texts.size());
  enum_pos_ = 0;
  return schema_value_byte(c);
}

bool JsonPrefix::schema_value_byte(char c) {
  if (!enum_active_) return true;
  const std::vector<std::string>& texts = node(value_node_).enum_texts;
  for (size_t i = 0; i < texts.size(); ++i)
    if (((enum_left_ >> i) & 1) && (texts[i].size() <= enum_pos_ || texts[i][enum_pos_] != c))
      enum_left_ &= ~(uint64_t{1} << i);
  ++enum_pos_;
  return enum_left_ != 0;
}

bool JsonPrefix::schema_value_end() {
  if (!enum_active_) return true;
  enum_active_ = false;
  const std::vector<std::string>& texts = node(value_node_).enum_texts;
  for (size_t i = 0; i < texts.size(); ++i)
    if (((enum_left_ >> i) & 1) && texts[i].size() == enum_pos_) return true;
  return false;
}

bool JsonPrefix::keys_left() const {
  const Frame& f = frames_[depth_ - 1];
  const JsonSchemaNode& object = node(f.node);
  return object.additional >= 0 || (low_bits(object.property_keys.size()) & ~f.seen) != 0;
}

bool JsonPrefix::schema_key_start() {
  if (!schema_) return true;
  const Frame& f = frames_[depth_ - 1];
  keys_left_ = low_bits(node(f.node).property_keys.size()) & ~f.seen;
  keys_written_ = f.seen;
  key_pos_ = 0;
  return keys_left();
}

bool JsonPrefix::schema_key_byte(char c) {
  if (!schema_) return true;
  const JsonSchemaNode& object = node(frames_[depth_ - 1].node);
  for (size_t i = 0; i < object.property_keys.size(); ++i) {
    const std::string& key = object.property_keys[i];
    if (key.size() <= key_pos_ || key[key_pos_] != c) {
      keys_left_ &= ~(uint64_t{1} << i);
      keys_written_ &= ~(uint64_t{1} << i);
    }
  }
  ++key_pos_;
  return keys_left_ != 0 || object.additional >= 0;
}

bool JsonPrefix::schema_key_end() {
  if (!schema_) return true;
  Frame& f = frames_[depth_ - 1];
  const JsonSchemaNode& object = node(f.node);
  for (size_t i = 0; i < object.property_keys.size(); ++i)
    if (((keys_left_ >> i) & 1) && object.property_keys[i].size() == key_pos_) {
      f.seen |= uint64_t{1} << i;
      value_node_ = object.property_nodes[i];
      return true;
    }
  for (size_t i = 0; i < object.property_keys.size(); ++i)  // a property written a second time
    if (((keys_written_ >> i) & 1) && object.property_keys[i].size() == key_pos_) return false;
  if (object.additional < 0) return false;
  value_node_ = object.additional;
  return true;
}

bool JsonPrefix::schema_close(bool array) {
  if (!schema_) return true;
  const Frame& f = frames_[depth_ - 1];
  const JsonSchemaNode& nd = node(f.node);
  return array ? f.items >= nd.min_items : (nd.required & ~f.seen) == 0;
}

bool JsonPrefix::schema_comma(bool array) {
  if (!schema_) return true;
  if (!array) return keys_left();
  const Frame& f = frames_[depth_ - 1];
  const JsonSchemaNode& nd = node(f.node);
  return nd.max_items < 0 || f.items < nd.max_items;
}

// ---- the syntax ----

bool JsonPrefix::feed(std::string_view text) {
  for (char c : text)
    if (!feed(c)) return false;
  return true;
}

void JsonPrefix::end_value() {
  if (depth_ == 0) {
    done_ = true;
    expect_ = Expect::comma_or_close;  // only whitespace may follow (checked in feed)
    return;
  }
  expect_ = Expect::comma_or_close;
}

bool JsonPrefix::value_start(char c) {
  if (!schema_value_start(c)) return false;
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= kMaxDepth) return false;
      if (c == '[') is_array_ |= uint64_t{1} << depth_;
      else is_array_ &= ~(uint64_t{1} << depth_);
      ++depth_;
      expect_ = c == '{' ? Expect::key_or_close : Expect::value_or_close;
      return true;
    case '"':
      expect_ = Expect::string;
      string_is_key_ = false;
      return true;
    case '-': expect_ = Expect::number, number_ = Number::minus; return true;
    case '0': expect_ = Expect::number, number_ = Number::zero; return true;
    case 't': expect_ = Expect::literal, literal_ = "rue"; return true;
    case 'f': expect_ = Expect::literal, literal_ = "alse"; return true;
    case 'n': expect_ = Expect::literal, literal_ = "ull"; return true;
    default:
      if (c >= '1' && c <= '9') {
        expect_ = Expect::number, number_ = Number::integer;
        return true;
      }
      return false;
  }
}

// A number or literal ended at `c` (which is not part of it): the value is over, and `c` is read
// as what follows a value.
bool JsonPrefix::after_value(char c) {
  if (!schema_value_end()) return false;
  end_value();
  return feed(c);
}

bool JsonPrefix::feed(char c) {
  // Whitespace between tokens (never inside strings, numbers or literals), in bounded runs.
  const bool between_tokens = expect_ != Expect::string && expect_ != Expect::string_escape &&
                              expect_ != Expect::string_hex && expect_ != Expect::literal &&
                              expect_ != Expect::number;
  if (between_tokens && whitespace(c)) return ++whitespace_run_ <= kMaxWhitespaceRun;
  if (between_tokens) whitespace_run_ = 0;
  if (done_) return false;  // only whitespace after the object

  switch (expect_) {
    case Expect::document:
      if (c != '{') return false;
      return value_start(c);
    case Expect::key_or_close:
      if (c == '}') {
        if (!schema_close(false)) return false;
        --depth_;
        end_value();
        return true;
      }
      [[fallthrough]];
    case Expect::key:
      if (c != '"' || !schema_key_start()) return false;
      expect_ = Expect::string;
      string_is_key_ = true;
      return true;
    case Expect::colon:
      if (c != ':') return false;
      expect_ = Expect::value;
      return true;
    case Expect::value_or_close:
      if (c == ']') {
        if (!schema_close(true)) return false;
        --depth_;
        end_value();
        return true;
      }
      [[fallthrough]];
    case Expect::value: return value_start(c);
    case Expect::comma_or_close: {
      const bool in_array = (is_array_ >> (depth_ - 1)) & 1;
      if (c == ',') {
        if (!schema_comma(in_array)) return false;
        expect_ = in_array ? Expect::value : Expect::key;
        return true;
      }
      if (c == (in_array ? ']' : '}')) {
        if (!schema_close(in_array)) return false;
        --depth_;
        end_value();
        return true;
      }
      return false;
    }
    case Expect::string: {
      // A key's bytes narrow the property names it can be; a value's, the enum texts.
      auto accept = [&](char b) { return string_is_key_ ? schema_key_byte(b) : schema_value_byte(b); };
      if (c == '"') {
        if (string_is_key_) {
          if (!schema_key_end()) return false;
          expect_ = Expect::colon;
        } else {
          if (!schema_value_byte(c) || !schema_value_end()) return false;
          end_value();
        }
        return true;
      }
      if (c == '\\') {
        expect_ = Expect::string_escape;
        return accept(c);
      }
      return static_cast<unsigned char>(c) >= 0x20 && accept(c);
    }
    case Expect::string_escape:
      // Keys under a schema take only \" and \\: each name has one spelling (property names have
      // no control characters, json_schema.h), so an escape cannot write a property again unseen.
      if (schema_ && string_is_key_ && c != '"' && c != '\\') return false;
      if (c == 'u') {
        expect_ = Expect::string_hex;
        hex_left_ = 4;
        return string_is_key_ ? schema_key_byte(c) : schema_value_byte(c);
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        expect_ = Expect::string;
        return string_is_key_ ? schema_key_byte(c) : schema_value_byte(c);
      }
      return false;
    case Expect::string_hex: {
      const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (!hex) return false;
      if (--hex_left_ == 0) expect_ = Expect::string;
      return string_is_key_ ? schema_key_byte(c) : schema_value_byte(c);
    }
    case Expect::literal:
      if (c != *literal_ || !schema_value_byte(c)) return false;
      if (*++literal_ == '\0') {
        if (!schema_value_end()) return false;
        end_value();
      }
      return true;
    case Expect::number: {
      const bool digit = c >= '0' && c <= '9';
      // (an integer-only node: no fraction, no exponent)
      if (integer_only_ && (c == '.' || c == 'e' || c == 'E')) return false;
      if (digit || c == '.' || c == 'e' || c == 'E' || ((c == '+' || c == '-') && number_ == Number::exp))
        if (!schema_value_byte(c)) return false;
      switch (number_) {
        case Number::minus:
          if (c == '0') return number_ = Number::zero, true;
          if (digit) return number_ = Number::integer, true;
          return false;
        case Number::zero:
        case Number::integer:
          if (digit && number_ == Number::integer) return true;
          if (c == '.') return number_ = Number::dot, true;
          if (c == 'e' || c == 'E') return number_ = Number::exp, true;
          if (digit) return false;  // a leading zero is followed by no digit
          return after_value(c);
        case Number::dot:
          return digit ? (number_ = Number::fraction, true) : false;
        case Number::fraction:
          if (digit) return true;
          if (c == 'e' || c == 'E') return number_ = Number::exp, true;
          return after_value(c);
        case Number::exp:
          if (c == '+' || c == '-') return number_ = Number::exp_sign, true;
          return digit ? (number_ = Number::exp_digits, true) : false;
        case Number::exp_sign:
          return digit ? (number_ = Number::exp_digits, true) : false;
        case Number::exp_digits:
          if (digit) return true;
          return after_value(c);
      }
      return false;
    }
  }
  return false;
}

int32_t sample_json(Sampler& sampler, std::span<const float> logits, const JsonPrefix& json,
                    const std::function<bool(int32_t)>& is_eos, const std::vector<std::string>& texts) {
  return sample_allowed(sampler, logits, [&](int32_t t) {
    if (is_eos(t)) return json.complete();
    if (t < 0 || static_cast<size_t>(t) >= texts.size() || texts[static_cast<size_t>(t)].empty()) return false;
    JsonPrefix trial = json;
    return trial.feed(texts[static_cast<size_t>(t)]);
  });
}

int32_t sample_allowed(Sampler& sampler, std::span<const float> logits, const std::function<bool(int32_t)>& allowed) {
  constexpr int kTries = 16;
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  std::vector<float> masked(logits.begin(), logits.end());
  for (int i = 0; i < kTries; ++i) {
    int32_t t = -1;
    try {
      t = sampler.sample(masked);
    } catch (const Error&) {
      break;  // everything the sampler would consider is refused: scan the vocabulary
    }
    if (allowed(t)) return t;
    masked[static_cast<size_t>(t)] = kBanned;
  }
  bool any = false;
  for (size_t t = 0; t < masked.size(); ++t) {
    if (masked[t] == kBanned) continue;
    if (allowed(static_cast<int32_t>(t))) {
      any = true;
    } else {
      masked[t] = kBanned;
    }
  }
  if (!any) return -1;
  try {
    return sampler.sample(masked);
  } catch (const Error&) {
    // top-k / top-p kept only refused tokens; the allowed ones are all that is left
    for (size_t t = 0; t < masked.size(); ++t)
      if (masked[t] != kBanned) return static_cast<int32_t>(t);
    return -1;
  }
}

}  // namespace fl
