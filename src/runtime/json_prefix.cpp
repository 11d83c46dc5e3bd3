#include "runtime/json_prefix.h"

#include <limits>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

namespace fl {

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
        --depth_;
        end_value();
        return true;
      }
      [[fallthrough]];
    case Expect::key:
      if (c != '"') return false;
      expect_ = Expect::string;
      string_is_key_ = true;
      return true;
    case Expect::colon:
      if (c != ':') return false;
      expect_ = Expect::value;
      return true;
    case Expect::value_or_close:
      if (c == ']') {
        --depth_;
        end_value();
        return true;
      }
      [[fallthrough]];
    case Expect::value: return value_start(c);
    case Expect::comma_or_close: {
      const bool in_array = (is_array_ >> (depth_ - 1)) & 1;
      if (c == ',') {
        expect_ = in_array ? Expect::value : Expect::key;
        return true;
      }
      if (c == (in_array ? ']' : '}')) {
        --depth_;
        end_value();
        return true;
      }
      return false;
    }
    case Expect::string:
      if (c == '"') {
        if (string_is_key_) {
          expect_ = Expect::colon;
        } else {
          end_value();
        }
        return true;
      }
      if (c == '\\') {
        expect_ = Expect::string_escape;
        return true;
      }
      return static_cast<unsigned char>(c) >= 0x20;
    case Expect::string_escape:
      if (c == 'u') {
        expect_ = Expect::string_hex;
        hex_left_ = 4;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        expect_ = Expect::string;
        return true;
      }
      return false;
    case Expect::string_hex: {
      const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (!hex) return false;
      if (--hex_left_ == 0) expect_ = Expect::string;
      return true;
    }
    case Expect::literal:
      if (c != *literal_) return false;
      if (*++literal_ == '\0') end_value();
      return true;
    case Expect::number: {
      const bool digit = c >= '0' && c <= '9';
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
